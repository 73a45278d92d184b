package otelphase_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/otelphase"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// providers are the ways a benchmark exports: not at all (OpenTelemetry's
// no-op providers, what an application that never sets one gets), or
// through the SDK, every span sampled and batched to an exporter that
// drops them, metrics aggregated for a reader.
func providers(b *testing.B) map[string]otelphase.Config {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	return map[string]otelphase.Config{
		"noop": {TracerProvider: tracenoop.NewTracerProvider(), MeterProvider: metricnoop.NewMeterProvider()},
		"sdk":  {TracerProvider: tp, MeterProvider: mp},
	}
}

// BenchmarkHook measures what the hook adds to a run of three
// phases, one with a foreign call, without the run itself: the CPU cost of
// its five spans and its metrics.
func BenchmarkHook(b *testing.B) {
	for _, name := range []string{"noop", "sdk"} {
		b.Run(name, func(b *testing.B) {
			cfg := providers(b)[name]
			mw, err := otelphase.New(&cfg)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			run := &phase.RunInfo{Workflow: "orders", Tenant: "acme", Key: "k", RecoveryPoint: "started", Attempt: 1}
			phases := []*phase.PhaseInfo{{Workflow: "orders", Phase: "created"},
				{Workflow: "orders", Phase: "charged", DownstreamKey: "atomicphase-0123456789abcdef0123456789abcdef-charged"},
				{Workflow: "orders", Phase: "done"}}
			out := &phase.Outcome{Kind: phase.OutcomeNew}
			nothing := func(context.Context) error { return nil }
			b.ReportAllocs()
			for b.Loop() {
				_, _ = mw.WrapRun(ctx, run, func(ctx context.Context) (*phase.Outcome, error) {
					for _, p := range phases {
						_ = mw.WrapPhase(ctx, p, func(ctx context.Context) error {
							if p.DownstreamKey != "" {
								return mw.WrapCall(ctx, p, nothing)
							}
							return nil
						})
					}
					return out, nil
				})
			}
		})
	}
}

var benchKeys atomic.Int64

// BenchmarkRun runs new keys of a three-phase workflow, one with a foreign
// call that returns at once, against Postgres: without hooks, and
// through otelphase with each of the providers.
func BenchmarkRun(b *testing.B) {
	pool := pgtest.Pool(b)
	w, err := phase.NewWorkflow("orders",
		phase.Local("created", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, string]) (phase.Result, error) {
			_, err := tx.Exec(ctx, `SELECT 1`)
			return phase.Next(), err
		}),
		phase.Foreign("charged",
			func(ctx context.Context, in *phase.Input[order, string]) (string, error) { return "ch_1", nil },
			func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, string], id string) (phase.Result, error) {
				in.State = id
				return phase.Next(), nil
			}),
		phase.Local("done", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, string]) (phase.Result, error) {
			return phase.JSON(http.StatusCreated, in.State), nil
		}),
	)
	if err != nil {
		b.Fatal(err)
	}
	configs := providers(b)
	for _, name := range []string{"none", "noop", "sdk"} {
		b.Run(name, func(b *testing.B) {
			cfg := phase.Config{Logger: quiet, Completer: recovery.CompleterConfig{Interval: -1}}
			if name != "none" {
				c := configs[name]
				mw, err := otelphase.New(&c)
				if err != nil {
					b.Fatal(err)
				}
				cfg.Hooks = []phase.Hook{mw}
			}
			c, err := phase.NewClient(pool, &cfg, w)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				// Every key is new, however often the benchmark runs.
				out, err := w.Run(ctx, c, "acme", fmt.Sprintf("%s-%d", name, benchKeys.Add(1)), order{Item: "ride"})
				if err != nil || out.Kind != phase.OutcomeNew {
					b.Fatalf("run: %v, %v", out, err)
				}
			}
		})
	}
}
