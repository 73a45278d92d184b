package ride_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/atomicphase/atomicphase/examples/rides/ride"
	"github.com/atomicphase/atomicphase/internal/oteltest"
	"github.com/atomicphase/atomicphase/otelphase"
	"github.com/atomicphase/atomicphase/phase"
)

// sqlTracer is a pgx tracer that makes every statement a span named by its
// first words, as an OpenTelemetry pgx tracer would, batched statements
// included: the runner sends a phase's first statement in one batch with
// its BEGIN.
type sqlTracer struct{ tracer trace.Tracer }

type sqlSpanKey struct{}

func spanName(sql string) string {
	words := strings.Fields(sql)
	return "sql " + strings.Join(words[:min(3, len(words))], " ")
}

func (s sqlTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	ctx, span := s.tracer.Start(ctx, spanName(data.SQL))
	return context.WithValue(ctx, sqlSpanKey{}, span)
}

func (s sqlTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if span, ok := ctx.Value(sqlSpanKey{}).(trace.Span); ok {
		span.End()
	}
}

func (s sqlTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (s sqlTracer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	_, span := s.tracer.Start(ctx, spanName(data.SQL))
	span.End()
}

func (s sqlTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func TestOneRideIsOneTraceFromRequestToStripe(t *testing.T) {
	t.Parallel()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	mw, err := otelphase.New(&otelphase.Config{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	otelOpts := []otelhttp.Option{otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagation.TraceContext{})}
	e := setupWith(t, 10, &configurer{
		pool:      func(c *pgxpool.Config) { c.ConnConfig.Tracer = sqlTracer{tp.Tracer("sql")} },
		transport: func(rt http.RoundTripper) http.RoundTripper { return otelhttp.NewTransport(rt, otelOpts...) },
		app:       func(c *ride.Config) { c.Client.Hooks = []phase.Hook{mw} },
		stripe:    func(h http.Handler) http.Handler { return otelhttp.NewHandler(h, "stripe", otelOpts...) },
	})
	e.api = otelhttp.NewHandler(e.api, "rides", otelOpts...)
	spans.Reset()

	if rec := e.post("ride-1", ride.UserEmail, ridePayload); rec.Code != http.StatusCreated {
		t.Fatalf("ride: %d %s", rec.Code, rec.Body)
	}
	var downstream string
	err = e.pool.QueryRow(context.Background(), `SELECT idempotency_key FROM fakestripe_charges`).Scan(&downstream)
	if err != nil {
		t.Fatal(err)
	}

	// The library's own statements and the fake Stripe's are left out:
	// the tree shows the workflow's statements, each under its phase.
	var shown tracetest.SpanStubs
	for _, s := range spans.GetSpans() {
		if !strings.HasPrefix(s.Name, "sql ") || workflowSQL[s.Name] {
			shown = append(shown, s)
		}
	}
	want := `POST /rides
  atomicphase.run atomicphase.outcome=new atomicphase.status=201
    atomicphase.phase atomicphase.phase=ride_created
      sql INSERT INTO rides
      sql INSERT INTO audit_records
    atomicphase.phase atomicphase.phase=charge_created
      atomicphase.call atomicphase.phase=charge_created atomicphase.downstream_key=` + downstream + `
        HTTP POST
          POST /v1/charges
      sql UPDATE rides SET
    atomicphase.phase atomicphase.phase=receipt_queued
      sql -- name: JobInsertFastMany
`
	got := oteltest.Tree(shown, otelphase.AttrPhase, otelphase.AttrOutcome, otelphase.AttrDownstreamKey, otelphase.AttrStatus)
	if got != want {
		t.Errorf("spans of one ride:\n%s\nwant:\n%s\nall spans:\n%s", got, want, oteltest.Tree(spans.GetSpans()))
	}
	if !strings.HasSuffix(downstream, "-charge_created") {
		t.Errorf("Stripe got idempotency key %q, not the charge phase's downstream key", downstream)
	}
}

// workflowSQL names the spans of the rides workflow's own statements (and
// River's job insert in the last phase).
var workflowSQL = map[string]bool{
	"sql INSERT INTO rides":          true,
	"sql INSERT INTO audit_records":  true,
	"sql UPDATE rides SET":           true,
	"sql -- name: JobInsertFastMany": true,
}
