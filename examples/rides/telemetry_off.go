//go:build !otel

package main

import (
	"context"
	"fmt"
	"net/http"
	"os"

	"github.com/atomicphase/atomicphase/phase"
)

// otlpEndpointEnv would turn telemetry on in a build with the tag otel (see
// telemetry.go).
const otlpEndpointEnv = "OTEL_EXPORTER_OTLP_ENDPOINT"

// telemetry is the build without OpenTelemetry's SDK and exporters: it
// exports nothing, and every method passes its argument through.
type telemetry struct{}

// startTelemetry refuses OTEL_EXPORTER_OTLP_ENDPOINT, which this build
// could only ignore, and says how to build with the exporters.
func startTelemetry(context.Context, string) (*telemetry, error) {
	if os.Getenv(otlpEndpointEnv) != "" {
		return nil, fmt.Errorf("%s is set, but this build has no OpenTelemetry exporters: "+
			"build or run it with -tags otel (go run -tags otel ./examples/rides), or unset %[1]s", otlpEndpointEnv)
	}
	return &telemetry{}, nil
}

func (*telemetry) hooks() []phase.Hook                 { return nil }
func (*telemetry) handler(h http.Handler) http.Handler { return h }
func (*telemetry) httpClient() *http.Client            { return nil }
func (*telemetry) observeKeys(*phase.Client) error     { return nil }
func (*telemetry) shutdown() error                     { return nil }
