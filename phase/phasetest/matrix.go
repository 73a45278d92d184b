// Package phasetest proves, in a workflow author's own tests, that a workflow
// converges whatever point a run crashes at.
//
// CrashMatrix runs the workflow once to discover its fault points, then for
// each point crashes a fresh key there exactly as a killed process would
// (transaction rolled back, lease not freed), recovers it the way production
// does (a client retry, and the completer when one is configured), and checks
// that the final response equals the crash-free one and that the author's
// invariants hold (for example: exactly one charge per key).
//
// No test sleeps out a lease: the crashed holder's lease is freed with
// Client.Unlock, which is what its expiry would do.
package phasetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"testing"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// Recovery names a way a crashed key is brought to its end.
type Recovery string

// The recoveries CrashMatrix exercises.
const (
	// ByRetry: the client sends the same request with the same key again.
	ByRetry Recovery = "retry"
	// ByCompleter: no client comes back; the completer finishes the key.
	ByCompleter Recovery = "completer"
)

// Config describes the workflow under test.
type Config[Req, State any] struct {
	// Client runs the workflow, which must be registered with it.
	Client   *phase.Client
	Workflow *phase.Workflow[Req, State]
	// Tenant owns the keys the matrix uses (default "phasetest").
	Tenant string
	// Request returns the request for the scenario whose key is key. Each
	// scenario uses a fresh key, so its effects can be told apart.
	Request func(key string) Req
	// WithCompleter also recovers every point without a client, by the
	// client's completer (Client.Complete).
	WithCompleter bool
	// Equal compares a recovered response with the crash-free one (default:
	// same status and byte-identical body). Set it when responses carry
	// per-key values such as generated ids.
	Equal func(crashFree, recovered *keyrow.Response) bool
	// Check is called once each scenario has converged, with its key and
	// final response, to assert the author's invariants.
	Check func(t testing.TB, key string, resp *keyrow.Response)
}

// Points runs the workflow once, crash-free, under key and returns the
// fault points it passed, in order, with its response.
func Points[Req, State any](t testing.TB, cfg Config[Req, State], key string) ([]phase.Point, *keyrow.Response) {
	t.Helper()
	var rec phase.Recorder
	out, err := cfg.Workflow.Run(phase.WithInjector(context.Background(), &rec), cfg.Client, tenant(cfg), key, cfg.Request(key))
	if err != nil {
		t.Fatalf("crash-free run: %v", err)
	}
	if out.Kind != phase.OutcomeNew || out.Response == nil {
		t.Fatalf("crash-free run: outcome %v without a response; want a new key run to its end", out.Kind)
	}
	points := rec.Points()
	if len(points) == 0 {
		t.Fatal("crash-free run passed no fault points")
	}
	return points, out.Response
}

// CrashMatrix crashes the workflow at every fault point and checks that
// every recovery converges to the crash-free response with the invariants
// intact. Each point and recovery is a subtest named after them.
func CrashMatrix[Req, State any](t *testing.T, cfg Config[Req, State]) {
	t.Helper()
	ctx := context.Background()
	// Keys are unique to this call, so the matrix can run again on the same
	// database (another test, -count=2).
	prefix := uniquePrefix()
	points, crashFree := Points(t, cfg, prefix+"crash-free")
	if cfg.Check != nil {
		cfg.Check(t, prefix+"crash-free", crashFree)
	}
	recoveries := []Recovery{ByRetry}
	if cfg.WithCompleter {
		recoveries = append(recoveries, ByCompleter)
	}
	for i, at := range points {
		for _, how := range recoveries {
			t.Run(fmt.Sprintf("%s/%s", at, how), func(t *testing.T) {
				key := fmt.Sprintf("%scrash-%02d-%s-%s", prefix, i, at.Stage, how)
				resp := crashAndRecover(ctx, t, cfg, key, at, how)
				if !equal(cfg, crashFree, resp) {
					t.Fatalf("recovered response %d %q differs from crash-free %d %q",
						resp.Status, resp.Body, crashFree.Status, crashFree.Body)
				}
				// Every later retry replays the same bytes.
				again := run(ctx, t, cfg, key)
				if again.Kind != phase.OutcomeReplay || again.Response.Status != resp.Status || !bytes.Equal(again.Response.Body, resp.Body) {
					t.Fatalf("retry after recovery: %v %d %q, want a replay of %d %q",
						again.Kind, again.Response.Status, again.Response.Body, resp.Status, resp.Body)
				}
				if cfg.Check != nil {
					cfg.Check(t, key, resp)
				}
			})
		}
	}
}

func crashAndRecover[Req, State any](ctx context.Context, t *testing.T, cfg Config[Req, State], key string, at phase.Point, how Recovery) *keyrow.Response {
	t.Helper()
	_, err := cfg.Workflow.Run(phase.WithInjector(ctx, phase.CrashAt(at)), cfg.Client, tenant(cfg), key, cfg.Request(key))
	if !errors.Is(err, phase.ErrCrash) {
		t.Fatalf("run with a crash at %s: err = %v, want the injected crash", at, err)
	}
	// A killed process's lease would expire after its TTL; free it now.
	if _, err := cfg.Client.Unlock(ctx, tenant(cfg), key); err != nil {
		t.Fatal(err)
	}
	if how == ByCompleter {
		if _, err := cfg.Client.Complete(ctx); err != nil {
			t.Fatalf("completer: %v", err)
		}
		out := run(ctx, t, cfg, key)
		if out.Kind != phase.OutcomeReplay {
			t.Fatalf("after the completer, the key is %v, want finished (replay)", out.Kind)
		}
		return out.Response
	}
	out := run(ctx, t, cfg, key)
	if out.Response == nil {
		t.Fatalf("retry after crash at %s: outcome %v without a response", at, out.Kind)
	}
	return out.Response
}

func run[Req, State any](ctx context.Context, t *testing.T, cfg Config[Req, State], key string) *phase.Outcome {
	t.Helper()
	out, err := cfg.Workflow.Run(ctx, cfg.Client, tenant(cfg), key, cfg.Request(key))
	if err != nil {
		t.Fatalf("retry of %s: %v", key, err)
	}
	return out
}

func equal[Req, State any](cfg Config[Req, State], a, b *keyrow.Response) bool {
	if cfg.Equal != nil {
		return cfg.Equal(a, b)
	}
	return a.Status == b.Status && bytes.Equal(a.Body, b.Body) && sameHeader(a.Header, b.Header)
}

func sameHeader(a, b http.Header) bool {
	return maps.EqualFunc(a, b, slices.Equal[[]string])
}

// uniquePrefix starts the keys of one matrix run.
func uniquePrefix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:]) + "-"
}

func tenant[Req, State any](cfg Config[Req, State]) string {
	if cfg.Tenant == "" {
		return "phasetest"
	}
	return cfg.Tenant
}
