package grpcphase_test

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/atomicphase/atomicphase/grpcphase/internal/paytest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase/phasetest"
	"github.com/atomicphase/atomicphase/protophase"
)

// TestTheServedWorkflowConvergesFromEveryCrashAndPair runs the crash and
// pair matrices on the workflow the interceptor serves, with the request
// the interceptor builds (the method and the message): every recovery
// stores the crash-free answer, a Reply message, with one charge row and
// one provider call per key. The interceptor adds nothing between the
// call and Workflow.Run but the key, the tenant and this request;
// TestACrashBehindTheInterceptorIsResumedByTheClientsRetry crashes runs
// behind it.
func TestTheServedWorkflowConvergesFromEveryCrashAndPair(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	ctx := context.Background()
	cfg := phasetest.Config[protophase.Request[*structpb.Struct], paytest.State]{
		Client: e.client, Workflow: e.workflow, DB: e.pool, WithCompleter: true,
		Request: func(string) protophase.Request[*structpb.Struct] {
			return protophase.Request[*structpb.Struct]{Method: paytest.Charge, Message: paytest.Request(500, "")}
		},
		Compare: sameChargeAnswer,
		Check: func(t testing.TB, s phasetest.Scenario) {
			var rows, charged int
			if err := e.pool.QueryRow(ctx, `SELECT count(*), count(charge_id) FROM charges WHERE key_id = $1`, s.ID).Scan(&rows, &charged); err != nil {
				t.Fatal(err)
			}
			if s.Hold == "" && (rows != 1 || charged != 1) {
				t.Errorf("%s: %d charge rows, %d charged; want one", s.Name, rows, charged)
			}
			if s.Response != nil {
				if _, st, err := protophase.Answer[*structpb.Struct](s.Response); err != nil || st != nil {
					t.Errorf("%s: the stored answer is not a reply: %v %v", s.Name, st, err)
				}
			}
		},
	}
	phasetest.CrashMatrix(t, cfg)
	crashed := e.effects(t)
	phasetest.PairMatrix(t, cfg)
	// A first run taken over after its last check of its lease may still
	// send its call, which the taker (reconciling it, or finding it not
	// yet made) may send too: at most twice under one downstream key, as
	// PairMatrix documents. No key may see a third.
	for k, n := range e.provider.Calls() {
		if n > 2 {
			t.Errorf("the provider was called %d times under downstream key %s", n, k)
		}
	}
	t.Logf("crash matrix: %d downstream keys, each called once", crashed)
}

// sameChargeAnswer compares two stored answers as Charge replies, but for
// the charge id, which the provider makes per downstream key, and so per
// scenario.
func sameChargeAnswer(crashFree, recovered *keyrow.Response) error {
	a, _, err := protophase.Answer[*structpb.Struct](crashFree)
	if err != nil {
		return err
	}
	b, _, err := protophase.Answer[*structpb.Struct](recovered)
	if err != nil {
		return err
	}
	if b.GetFields()["charge_id"].GetStringValue() == "" {
		return fmt.Errorf("recovered answer %v has no charge id", b)
	}
	delete(a.Fields, "charge_id")
	delete(b.Fields, "charge_id")
	if !proto.Equal(a, b) || crashFree.Status != recovered.Status {
		return fmt.Errorf("recovered %d %v, crash-free %d %v", recovered.Status, b, crashFree.Status, a)
	}
	return nil
}
