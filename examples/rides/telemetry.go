//go:build otel

package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/atomicphase/atomicphase/otelphase"
	"github.com/atomicphase/atomicphase/phase"
)

// otlpEndpointEnv turns telemetry on: the OTLP/HTTP endpoint of a
// collector, such as http://localhost:4318. The exporters also read the
// other OTEL_EXPORTER_OTLP_* variables (headers, TLS, timeouts), and the
// resource OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES. The exporters
// are compiled in only with the build tag otel (go run -tags otel), because
// they and their gRPC and protobuf dependencies double the modules and the
// time of a first build.
const otlpEndpointEnv = "OTEL_EXPORTER_OTLP_ENDPOINT"

// telemetry exports the API's traces and metrics over OTLP/HTTP. The zero
// telemetry, what startTelemetry returns without an endpoint, exports
// nothing and costs nothing: every method passes its argument through.
type telemetry struct {
	tp  *sdktrace.TracerProvider
	mp  *sdkmetric.MeterProvider
	mw  *otelphase.Hook
	reg metric.Registration
	// propagators carry the trace to the Stripe API in traceparent
	// headers, and pick up a caller's.
	propagators propagation.TextMapPropagator
}

// startTelemetry starts exporting when OTEL_EXPORTER_OTLP_ENDPOINT is set.
func startTelemetry(ctx context.Context, service string) (*telemetry, error) {
	if os.Getenv(otlpEndpointEnv) == "" {
		return &telemetry{}, nil
	}
	res, err := resource.New(ctx, resource.WithAttributes(semconv.ServiceName(service)),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	spans, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	metrics, err := otlpmetrichttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	t := &telemetry{
		tp:          sdktrace.NewTracerProvider(sdktrace.WithBatcher(spans), sdktrace.WithResource(res)),
		mp:          sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(metrics)), sdkmetric.WithResource(res)),
		propagators: propagation.TraceContext{},
	}
	if t.mw, err = otelphase.New(&otelphase.Config{TracerProvider: t.tp, MeterProvider: t.mp}); err != nil {
		return nil, errors.Join(err, t.shutdown())
	}
	return t, nil
}

// on reports whether telemetry is exported.
func (t *telemetry) on() bool { return t.tp != nil }

// hooks returns the hooks that trace the phase client's steps.
func (t *telemetry) hooks() []phase.Hook {
	if !t.on() {
		return nil
	}
	return []phase.Hook{t.mw}
}

// handler traces the requests h serves: each run's span is a child of its
// request's.
func (t *telemetry) handler(h http.Handler) http.Handler {
	if !t.on() {
		return h
	}
	return otelhttp.NewHandler(h, "rides", otelhttp.WithTracerProvider(t.tp), otelhttp.WithMeterProvider(t.mp),
		otelhttp.WithPropagators(t.propagators))
}

// httpClient returns a client for Stripe whose requests are spans under the
// charge phase's call, or nil for ride.NewStripeClient's default client.
func (t *telemetry) httpClient() *http.Client {
	if !t.on() {
		return nil
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: otelhttp.NewTransport(http.DefaultTransport,
		otelhttp.WithTracerProvider(t.tp), otelhttp.WithMeterProvider(t.mp), otelhttp.WithPropagators(t.propagators))}
}

// observeKeys reports c's keys by state in the atomicphase.keys gauge.
func (t *telemetry) observeKeys(c *phase.Client) error {
	if !t.on() {
		return nil
	}
	var err error
	t.reg, err = t.mw.ObserveKeys(c)
	return err
}

// shutdown flushes what is left to export.
func (t *telemetry) shutdown() error {
	if !t.on() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The meter's last collection, in its Shutdown, still reads the keys
	// gauge.
	errs := []error{t.tp.Shutdown(ctx), t.mp.Shutdown(ctx)}
	if t.reg != nil {
		errs = append(errs, t.reg.Unregister())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	return nil
}
