package otelphase_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/atomicphase/atomicphase/internal/oteltest"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/otelphase"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type order struct {
	Item string `json:"item"`
}

type env struct {
	c        *phase.Client
	w        *phase.Workflow[order, string]
	mw       *otelphase.Hook
	spans    *tracetest.InMemoryExporter
	reader   *sdkmetric.ManualReader
	tracer   trace.Tracer
	failDone atomic.Bool
	// block, when set, holds the foreign call until it is closed; entered
	// is signalled when the call starts.
	block   chan struct{}
	entered chan struct{}
	// downstream is the downstream key the last call sent.
	downstream atomic.Value
}

// setup returns a client running a three-phase orders workflow through an
// otelphase middleware that records into an in-memory exporter and a
// manual reader. The phases start spans of their own from the context they
// are given, as instrumented SQL and HTTP clients would.
func setup(t *testing.T, cfg otelphase.Config) *env {
	t.Helper()
	e := &env{spans: tracetest.NewInMemoryExporter(), reader: sdkmetric.NewManualReader()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(e.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	e.tracer = tp.Tracer("test")
	cfg.TracerProvider, cfg.MeterProvider = tp, mp
	mw, err := otelphase.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.mw = mw
	e.w, err = phase.NewWorkflow("orders",
		phase.Local("created", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, string]) (phase.Result, error) {
			_, span := e.tracer.Start(ctx, "app.insert")
			defer span.End()
			_, err := tx.Exec(ctx, `SELECT 1`)
			return phase.Next(), err
		}),
		phase.Foreign("charged",
			func(ctx context.Context, in *phase.Input[order, string]) (string, error) {
				_, span := e.tracer.Start(ctx, "provider.charge")
				defer span.End()
				e.downstream.Store(in.DownstreamKey())
				if e.block != nil {
					e.entered <- struct{}{}
					<-e.block
				}
				return "ch_1", nil
			},
			func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, string], id string) (phase.Result, error) {
				in.State = id
				return phase.Next(), nil
			}),
		phase.Local("done", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, string]) (phase.Result, error) {
			if e.failDone.Load() {
				return phase.Result{}, errors.New("receipt printer on fire")
			}
			return phase.JSON(http.StatusCreated, in.State), nil
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	e.c, err = phase.NewClient(pgtest.Pool(t), &phase.Config{
		Logger:    quiet,
		Hooks:     []phase.Hook{mw},
		Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1},
	}, e.w)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

var treeKeys = []attribute.Key{otelphase.AttrTenant, otelphase.AttrKey, otelphase.AttrPhase, otelphase.AttrOutcome,
	otelphase.AttrRecoveryPoint, otelphase.AttrCompleter, otelphase.AttrStatus, otelphase.AttrDownstreamKey,
	otelphase.AttrErrorType, otelphase.AttrClaimed, otelphase.AttrCompleted, otelphase.AttrFailed}

func (e *env) tree() string {
	defer e.spans.Reset()
	return oteltest.Tree(e.spans.GetSpans(), treeKeys...)
}

func TestRunIsASpanTreeUnderTheCallersSpan(t *testing.T) {
	t.Parallel()
	e := setup(t, otelphase.Config{})
	ctx, request := e.tracer.Start(context.Background(), "request")
	out, err := e.w.Run(ctx, e.c, "rider@example.com", "k1", order{Item: "ride"})
	request.End()
	if err != nil || out.Kind != phase.OutcomeNew {
		t.Fatalf("run: %v, %v", out, err)
	}
	dk := e.downstream.Load().(string)
	want := `request
  atomicphase.run atomicphase.outcome=new atomicphase.recovery_point=started atomicphase.completer=false atomicphase.status=201
    atomicphase.phase atomicphase.phase=created
      app.insert
    atomicphase.phase atomicphase.phase=charged
      atomicphase.call atomicphase.phase=charged atomicphase.downstream_key=` + dk + `
        provider.charge
    atomicphase.phase atomicphase.phase=done
`
	if got := e.tree(); got != want {
		t.Errorf("spans:\n%s\nwant:\n%s", got, want)
	}
	if !strings.HasSuffix(dk, "-charged") {
		t.Errorf("downstream key %q is not the charged phase's", dk)
	}

	// A replay is a run span alone: no phase runs.
	if _, err := e.w.Run(context.Background(), e.c, "rider@example.com", "k1", order{Item: "ride"}); err != nil {
		t.Fatal(err)
	}
	want = "atomicphase.run atomicphase.outcome=replayed atomicphase.recovery_point=finished atomicphase.completer=false atomicphase.status=201\n"
	if got := e.tree(); got != want {
		t.Errorf("replay spans:\n%s\nwant:\n%s", got, want)
	}
}

func TestTenantAndKeyAreOnRunSpansOnlyWhenAskedFor(t *testing.T) {
	t.Parallel()
	e := setup(t, otelphase.Config{KeyAttributes: true})
	if _, err := e.w.Run(context.Background(), e.c, "rider@example.com", "k1", order{Item: "ride"}); err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(e.tree(), "\n")
	want := "atomicphase.run atomicphase.tenant=rider@example.com atomicphase.key=k1 atomicphase.outcome=new atomicphase.recovery_point=started atomicphase.completer=false atomicphase.status=201"
	if first != want {
		t.Errorf("run span:\n%s\nwant:\n%s", first, want)
	}
}

func TestFailedRunAndTheCompleterPassThatFinishesIt(t *testing.T) {
	t.Parallel()
	e := setup(t, otelphase.Config{})
	ctx := context.Background()
	e.failDone.Store(true)
	if _, err := e.w.Run(ctx, e.c, "rider@example.com", "k1", order{Item: "ride"}); err == nil {
		t.Fatal("the run whose last phase fails succeeded")
	}
	dk := e.downstream.Load().(string)
	want := `atomicphase.run atomicphase.outcome=error atomicphase.recovery_point=started atomicphase.completer=false error.type=failed error
  atomicphase.phase atomicphase.phase=created
    app.insert
  atomicphase.phase atomicphase.phase=charged
    atomicphase.call atomicphase.phase=charged atomicphase.downstream_key=` + dk + `
      provider.charge
  atomicphase.phase atomicphase.phase=done error.type=failed error
`
	if got := e.tree(); got != want {
		t.Errorf("failed run spans:\n%s\nwant:\n%s", got, want)
	}

	e.failDone.Store(false)
	if res, err := e.c.Complete(ctx); err != nil || res.Completed != 1 {
		t.Fatalf("complete: %+v, %v", res, err)
	}
	want = `atomicphase.completer.pass atomicphase.claimed=1 atomicphase.completed=1 atomicphase.failed=0
  atomicphase.run atomicphase.outcome=resumed atomicphase.recovery_point=charged atomicphase.completer=true atomicphase.status=201
    atomicphase.phase atomicphase.phase=done
atomicphase.completer.pass atomicphase.claimed=0 atomicphase.completed=0 atomicphase.failed=0
`
	if got := e.tree(); got != want {
		t.Errorf("completer spans:\n%s\nwant:\n%s", got, want)
	}
}

func TestMetricsCountRunsByOutcomeReplaysConflictsAndPhaseDurations(t *testing.T) {
	t.Parallel()
	e := setup(t, otelphase.Config{})
	ctx := context.Background()
	ride := order{Item: "ride"}
	run := func(key string, req order, want phase.OutcomeKind) {
		t.Helper()
		out, err := e.w.Run(ctx, e.c, "rider@example.com", key, req)
		if err != nil || out.Kind != want {
			t.Fatalf("run %s: %v, %v; want %v", key, out, err, want)
		}
	}
	run("k1", ride, phase.OutcomeNew)
	run("k1", ride, phase.OutcomeReplayed)
	run("k1", ride, phase.OutcomeReplayed)
	run("k1", order{Item: "boat"}, phase.OutcomeMismatch)

	// A second request while the first is in its call is refused.
	e.block, e.entered = make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := e.w.Run(ctx, e.c, "rider@example.com", "k2", ride)
		done <- err
	}()
	<-e.entered
	run("k2", ride, phase.OutcomeInFlight)
	close(e.block)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e.block = nil
	e.failDone.Store(true)
	if _, err := e.w.Run(ctx, e.c, "rider@example.com", "k3", ride); err == nil {
		t.Fatal("the run whose last phase fails succeeded")
	}

	var rm metricdata.ResourceMetrics
	if err := e.reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	assertSums(t, rm, "atomicphase.runs", map[string]int64{
		"atomicphase.completer=false,atomicphase.outcome=new,atomicphase.workflow=orders":                     2,
		"atomicphase.completer=false,atomicphase.outcome=replayed,atomicphase.workflow=orders":                2,
		"atomicphase.completer=false,atomicphase.outcome=mismatch,atomicphase.workflow=orders":                1,
		"atomicphase.completer=false,atomicphase.outcome=in_flight,atomicphase.workflow=orders":               1,
		"atomicphase.completer=false,atomicphase.outcome=error,atomicphase.workflow=orders,error.type=failed": 1,
	})
	assertSums(t, rm, "atomicphase.replays", map[string]int64{"atomicphase.workflow=orders": 2})
	assertSums(t, rm, "atomicphase.refused", map[string]int64{"atomicphase.outcome=in_flight,atomicphase.workflow=orders": 1})
	assertHistogramCounts(t, rm, "atomicphase.phase.duration", map[string]uint64{
		"atomicphase.phase=created,atomicphase.workflow=orders":                3,
		"atomicphase.phase=charged,atomicphase.workflow=orders":                3,
		"atomicphase.phase=done,atomicphase.workflow=orders":                   2,
		"atomicphase.phase=done,atomicphase.workflow=orders,error.type=failed": 1,
	})
}

func TestKeysGaugeReadsCountsAtMostOncePerInterval(t *testing.T) {
	t.Parallel()
	e := setup(t, otelphase.Config{CountsInterval: time.Hour})
	ctx := context.Background()
	reg, err := e.mw.ObserveKeys(e.c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.w.Run(ctx, e.c, "rider@example.com", "k1", order{Item: "ride"}); err != nil {
		t.Fatal(err)
	}
	e.failDone.Store(true)
	if _, err := e.w.Run(ctx, e.c, "rider@example.com", "k2", order{Item: "ride"}); err == nil {
		t.Fatal("the run whose last phase fails succeeded")
	}
	want := map[string]int64{
		"atomicphase.state=finished": 1, "atomicphase.state=in_flight": 0, "atomicphase.state=waiting": 0,
		"atomicphase.state=stuck": 1, "atomicphase.state=unknown": 0, "atomicphase.state=dead": 0,
	}
	var rm metricdata.ResourceMetrics
	if err := e.reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	assertGauge(t, rm, "atomicphase.keys", want)

	// A third key changes the table, not the gauge, within the interval.
	e.failDone.Store(false)
	if _, err := e.w.Run(ctx, e.c, "rider@example.com", "k3", order{Item: "ride"}); err != nil {
		t.Fatal(err)
	}
	if err := e.reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	assertGauge(t, rm, "atomicphase.keys", want)
	counts, err := e.c.Counts(ctx)
	if err != nil || counts.Finished != 2 {
		t.Fatalf("counts: %+v, %v; want 2 finished", counts, err)
	}

	if err := reg.Unregister(); err != nil {
		t.Fatal(err)
	}
	if err := e.reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	if m := find(rm, "atomicphase.keys"); m != nil {
		t.Errorf("keys gauge still reported after Unregister: %+v", m.Data)
	}
}

func TestNewRefusesANegativeCountsInterval(t *testing.T) {
	t.Parallel()
	if _, err := otelphase.New(&otelphase.Config{CountsInterval: -time.Second}); err == nil {
		t.Fatal("New accepted a negative CountsInterval")
	}
}

func find(rm metricdata.ResourceMetrics, name string) *metricdata.Metrics {
	for _, sm := range rm.ScopeMetrics {
		for i, m := range sm.Metrics {
			if m.Name == name {
				return &sm.Metrics[i]
			}
		}
	}
	return nil
}

func key(s attribute.Set) string { return s.Encoded(attribute.DefaultEncoder()) }

func assertSums(t *testing.T, rm metricdata.ResourceMetrics, name string, want map[string]int64) {
	t.Helper()
	got := map[string]int64{}
	if m := find(rm, name); m != nil {
		for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
			got[key(dp.Attributes)] = dp.Value
		}
	}
	assertEqual(t, name, got, want)
}

func assertGauge(t *testing.T, rm metricdata.ResourceMetrics, name string, want map[string]int64) {
	t.Helper()
	got := map[string]int64{}
	if m := find(rm, name); m != nil {
		for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
			got[key(dp.Attributes)] = dp.Value
		}
	}
	assertEqual(t, name, got, want)
}

func assertHistogramCounts(t *testing.T, rm metricdata.ResourceMetrics, name string, want map[string]uint64) {
	t.Helper()
	got := map[string]uint64{}
	if m := find(rm, name); m != nil {
		for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
			got[key(dp.Attributes)] = dp.Count
			if dp.Sum <= 0 {
				t.Errorf("%s %s: durations sum to %v", name, key(dp.Attributes), dp.Sum)
			}
		}
	}
	assertEqual(t, name, got, want)
}

func assertEqual[V comparable](t *testing.T, name string, got, want map[string]V) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: got %v, want %v", name, got, want)
		return
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %v, want %v", name, got, want)
			return
		}
	}
}
