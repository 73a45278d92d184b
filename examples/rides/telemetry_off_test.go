//go:build !otel

package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/examples/internal/exampleprog/exampleprogtest"
	"github.com/atomicphase/atomicphase/internal/pgtest"
)

// Without the otel build tag, a command asked to export telemetry fails
// saying how to build with the exporters, instead of serving without them.
func TestTelemetryWithoutTheOtelTagNamesTheTag(t *testing.T) {
	t.Setenv(otlpEndpointEnv, "http://127.0.0.1:4318")
	dsn := pgtest.DSN(t)
	for _, args := range [][]string{
		{"serve", "-addr", exampleprogtest.FreeAddr(t), "-database-url", dsn, "-stripe-url", "http://127.0.0.1:1"},
		{"-duration", "1s", "-database-url", dsn},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var out bytes.Buffer
		code := program.Run(ctx, args, &out, &out)
		cancel()
		if code != 1 || !strings.Contains(out.String(), "-tags otel") {
			t.Errorf("rides %s exited %d, want 1 with a message naming -tags otel:\n%s", strings.Join(args, " "), code, out.String())
		}
	}
}
