// Package grpcphase serves atomicphase workflows over gRPC: a unary server
// interceptor that runs a registered workflow for a method under the
// call's idempotency key, and a client interceptor that keeps one key
// across retries and honours the server's retry delays.
//
// # Server
//
// Declare the workflow over protophase.Request[M], M being the method's
// request message, end it with protophase.Reply (the response message) or
// protophase.Fail (a final error status, stored and replayed like a
// response), register it with the client, and hand it to a Server:
//
//	s, err := grpcphase.NewServer(client, grpcphase.Config{Tenant: tenantOf})
//	err = grpcphase.Handle[*pb.ChargeRequest, *pb.ChargeResponse](s, "/pay.Payments/Charge", w, grpcphase.MethodConfig[*pb.ChargeRequest]{})
//	srv := grpc.NewServer(grpc.UnaryInterceptor(s.UnaryInterceptor()), grpc.StreamInterceptor(s.StreamInterceptor()))
//
// The key comes from the idempotency-key metadata, or from a request field
// (MethodConfig.Key, the AIP-155 way). The first call runs the workflow; a
// retry gets the stored answer, identical, with idempotency-replayed: true
// in its header metadata; a call while the key is in flight gets ABORTED
// with a RetryInfo delay; a key reused with another message gets
// FAILED_PRECONDITION; a store outage UNAVAILABLE with a RetryInfo delay.
// protophase.Refuse is the whole table; docs/grpc.md explains each code.
//
// # Streams
//
// Only unary methods run under keys. StreamInterceptor refuses, with
// UNIMPLEMENTED, a stream to a registered method or one that carries a key.
//
// # Client
//
// UnaryClientInterceptor sends every keyed call under one key (the call's
// own metadata, else its request_id field, else a new UUIDv7) and retries
// it under that key, as package caller does for HTTP: a call ends with the
// answer, a refusal that proves nothing ran, or an *UnknownOutcomeError
// that names the key, whatever ends it (a deadline, a cancel, the budget,
// a lost connection).
package grpcphase
