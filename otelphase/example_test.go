package otelphase_test

import (
	"context"
	"fmt"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/otelphase"
	"github.com/atomicphase/atomicphase/phase"
)

func ExampleNew() {
	ctx := context.Background()
	dsn, drop, err := pgtest.NewDatabase(ctx, "example") // your application's database
	if err != nil {
		log.Fatal(err)
	}
	defer drop()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// Your application's providers, exporting over OTLP; here, in memory.
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))

	mw, err := otelphase.New(&otelphase.Config{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		log.Fatal(err)
	}
	greet, err := phase.NewWorkflow("greet",
		phase.Foreign("sent",
			func(ctx context.Context, in *phase.Input[string, string]) (string, error) {
				return "hello " + in.Req, nil // a call to another service, with run.DownstreamKey()
			},
			func(ctx context.Context, tx pgx.Tx, in *phase.Input[string, string], greeting string) (phase.Result, error) {
				return phase.JSON(http.StatusOK, greeting), nil
			}),
	)
	if err != nil {
		log.Fatal(err)
	}
	c, err := phase.NewClient(pool, &phase.Config{Hooks: []phase.Hook{mw}}, greet)
	if err != nil {
		log.Fatal(err)
	}
	keys, err := mw.ObserveKeys(c) // the atomicphase.keys gauge
	if err != nil {
		log.Fatal(err)
	}
	defer keys.Unregister()

	if _, err := greet.Run(ctx, c, "acme", "key-1", "world"); err != nil {
		log.Fatal(err)
	}
	for _, s := range spans.GetSpans() { // in the order they ended
		fmt.Println(s.Name)
	}
	// Output:
	// atomicphase.call
	// atomicphase.phase
	// atomicphase.run
}
