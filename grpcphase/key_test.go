package grpcphase_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/atomicphase/atomicphase/grpcphase"
	"github.com/atomicphase/atomicphase/grpcphase/internal/paytest"
	"github.com/atomicphase/atomicphase/internal/keytable"
	"github.com/atomicphase/atomicphase/protophase"
)

// TestAFieldKeyAndTheClientInterceptorWorkTogether is the combination
// docs/grpc.md's example makes: the server reads the key from the
// request_id field, the caller sets request_id and no metadata, through
// the client interceptor. The call runs once under request_id; its retry
// is replayed.
func TestAFieldKeyAndTheClientInterceptorWorkTogether(t *testing.T) {
	t.Parallel()
	e := setup(t, options{key: paytest.RequestID})
	conn := dial(t, e.addr, grpcphase.ClientConfig{Key: func(req any) string { return paytest.RequestID(req.(*structpb.Struct)) }})
	ctx := metadata.AppendToOutgoingContext(context.Background(), paytest.TenantMetadata, "acme")
	for i := range 2 {
		var header metadata.MD
		err := conn.Invoke(ctx, paytest.Charge, paytest.Request(700, "rid-7"), new(structpb.Struct), grpc.Header(&header))
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if replayed := grpcphase.Replayed(header); replayed != (i == 1) {
			t.Errorf("call %d replayed %v", i, replayed)
		}
	}
	if n := e.effects(t); n != 1 {
		t.Errorf("the provider saw %d downstream keys, want 1", n)
	}
	e.charged(t, 1)
}

// TestGRPCReadsTheSharedTableOfKeys sends every value of the table that all
// transports read, as metadata entries and, where it is one value, as the
// request's key field: an accepted key runs once under the table's key, a
// refused one answers INVALID_ARGUMENT naming where the key travels.
func TestGRPCReadsTheSharedTableOfKeys(t *testing.T) {
	t.Parallel()
	e := setup(t, options{key: paytest.RequestID})
	ctx := context.Background()
	keys := map[string]bool{}
	fieldRuns := 0
	for i, c := range keytable.Cases() {
		for _, inField := range []bool{false, true} {
			if inField && len(c.Values) != 1 {
				continue
			}
			name := fmt.Sprintf("%s (field %v)", c.Name, inField)
			amount := int64(1000 + i)
			if c.Verdict == "" {
				amount = int64(len(c.Key)) // one key, one message
			}
			// A field's spelling is part of the message, so each spelling
			// of a key in a field runs under a tenant of its own.
			tenant := "acme"
			pairs := []string{paytest.TenantMetadata, tenant}
			field := ""
			if inField {
				tenant = fmt.Sprintf("field-%d", i)
				pairs = []string{paytest.TenantMetadata, tenant}
				field = c.Values[0]
			} else {
				for _, v := range c.Values {
					pairs = append(pairs, protophase.DefaultKeyMetadata, v)
				}
			}
			cctx := metadata.AppendToOutgoingContext(ctx, pairs...)
			var header metadata.MD
			err := e.raw.Invoke(cctx, paytest.Charge, paytest.Request(amount, field), new(structpb.Struct), grpc.Header(&header))
			switch c.Verdict {
			case "":
				if err != nil {
					t.Errorf("%s: %v; want the answer", name, err)
					continue
				}
				var stored int
				if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE tenant = $1 AND idempotency_key = $2`, tenant, c.Key).Scan(&stored); err != nil || stored != 1 {
					t.Errorf("%s: %d keys %q stored (%v); want 1", name, stored, c.Key, err)
				}
				if inField {
					fieldRuns++
					continue
				}
				if grpcphase.Replayed(header) != keys[c.Key] {
					t.Errorf("%s: replayed %v; want a replay only for a key seen before", name, grpcphase.Replayed(header))
				}
				keys[c.Key] = true
			default:
				st := status.Convert(err)
				where := "idempotency-key metadata is "
				if inField {
					where = "the request's key field is "
				}
				if c.Verdict == keytable.Missing && inField {
					where = "idempotency-key metadata is missing"
				}
				if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), where) {
					t.Errorf("%s: %v; want INVALID_ARGUMENT naming %q", name, err, where)
				}
				reason, _ := details(err)
				if want := map[string]string{keytable.Missing: protophase.ReasonMissingKey, keytable.Invalid: protophase.ReasonInvalidKey}[c.Verdict]; reason != want {
					t.Errorf("%s: reason %s; want %s", name, reason, want)
				}
			}
		}
	}
	if n := e.effects(t); n != len(keys)+fieldRuns {
		t.Errorf("the provider saw %d downstream keys; want one per accepted key and tenant, %d", n, len(keys)+fieldRuns)
	}
}
