package phasetest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// UpgradeMatrix proves a deploy safe for the keys in flight across it: it
// runs the old definition (from) to every fault point it passes, crashes
// there, and recovers the key under the new one (to), by a retry and, with
// to.WithCompleter, by to's completer. Each recovery must converge to the
// answer to gives crash-free (to.Compare), with to.Check's invariants
// (one effect per call) intact. Each point and recovery is a subtest.
//
// from and to run on one database, each with its own client, as the old
// and the new process of a rolling deploy do. to's client must run from's
// definition: register the old workflow beside the new one (the old keys
// drain on the old code), or have the new one adopt it (phase.Workflow.Adopt).
// A key the new client cannot run fails its scenario, naming the outcome.
//
// The matrix sends requests with phase.Workflow.Run, whose fingerprint is
// the JSON encoding of the request: from.Request and to.Request must encode
// the same for each key. (Over HTTP, the fingerprint is the request as the
// client sent it, whatever either type makes of it.)
func UpgradeMatrix[FromReq, FromState, Req, State any](t *testing.T, from Config[FromReq, FromState], to Config[Req, State]) {
	t.Helper()
	if from.Client == nil || from.Workflow == nil || from.Request == nil {
		t.Fatal("phasetest: UpgradeMatrix needs from.Client, from.Workflow and from.Request")
	}
	m := newMatrix(t, to)
	oldPoints, _ := Points(t, from, m.key("old-crash-free"))
	recoveries := []Recovery{ByRetry}
	if to.WithCompleter {
		recoveries = append(recoveries, ByCompleter)
	}
	seen := map[phase.Point]bool{}
	for i, at := range oldPoints {
		if seen[at] {
			continue
		}
		seen[at] = true
		for _, how := range recoveries {
			m.scenario(t, fmt.Sprintf("%s/%s", at, how), fmt.Sprintf("upgrade-%02d-%s-%s", i, at.Stage, how), func(t *testing.T, key string) {
				ctx := m.context(t)
				crashing, _ := m.ledger(key).watch(ctx, byClient, from.Workflow.Phases(), phase.CrashAt(at))
				_, err := from.Workflow.Run(crashing, from.Client, m.tenant, key, from.Request(key))
				if !errors.Is(err, phase.ErrCrash) {
					t.Fatalf("old definition's run with a crash at %s: err = %v, want the injected crash", at, err)
				}
				m.unlock(ctx, t, key)
				var answers []*keyrow.Response
				if how == ByCompleter {
					m.complete(ctx, t, key)
				} else if a := m.retry(ctx, t, key); a != nil {
					answers = append(answers, a)
				}
				m.settled(ctx, t, key, answers...)
			})
		}
	}
}
