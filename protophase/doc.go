// Package protophase is what grpcphase and connectphase share: the request
// type of a workflow served over an RPC ([Request]), the way a workflow
// answers with a protobuf message or an error status ([Reply], [Fail]), how
// a stored answer is read back ([Answer]), and the one table that maps a run
// that gave no answer to a status code ([Refuse]).
//
// A workflow served by either transport is declared over Request[M], M
// being the method's request message:
//
//	w, err := phase.NewWorkflow("charge",
//		phase.Foreign("charged", charge, record).Repeatable(),
//		phase.Local("answered", func(ctx context.Context, tx pgx.Tx, in *phase.Input[protophase.Request[*pb.ChargeRequest], state]) (phase.Result, error) {
//			return protophase.Reply(&pb.ChargeResponse{ChargeId: in.State.ChargeID}), nil
//		}))
//
// See docs/grpc.md for the contract: the metadata, the codes and why each
// was chosen.
package protophase
