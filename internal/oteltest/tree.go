// Package oteltest shows recorded OpenTelemetry spans as a tree, for tests
// that assert which span is whose parent.
package oteltest

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// Tree renders spans as an indented tree, one span a line, children under
// their parent in the order they started. A line holds the span's name,
// then the value of each of keys it carries as key=value, then "error" when
// its status is Error. Spans whose parent is not among spans are roots.
func Tree(spans tracetest.SpanStubs, keys ...attribute.Key) string {
	byParent := map[trace.SpanID][]tracetest.SpanStub{}
	ids := map[trace.SpanID]bool{}
	for _, s := range spans {
		ids[s.SpanContext.SpanID()] = true
	}
	for _, s := range spans {
		parent := s.Parent.SpanID()
		if !ids[parent] {
			parent = trace.SpanID{}
		}
		byParent[parent] = append(byParent[parent], s)
	}
	for _, children := range byParent {
		slices.SortStableFunc(children, func(a, b tracetest.SpanStub) int { return cmp.Compare(a.StartTime.UnixNano(), b.StartTime.UnixNano()) })
	}
	var b strings.Builder
	var walk func(parent trace.SpanID, depth int)
	walk = func(parent trace.SpanID, depth int) {
		for _, s := range byParent[parent] {
			b.WriteString(strings.Repeat("  ", depth))
			b.WriteString(s.Name)
			for _, k := range keys {
				for _, a := range s.Attributes {
					if a.Key == k {
						fmt.Fprintf(&b, " %s=%s", k, a.Value.Emit())
					}
				}
			}
			if s.Status.Code == codes.Error {
				b.WriteString(" error")
			}
			b.WriteString("\n")
			walk(s.SpanContext.SpanID(), depth+1)
		}
	}
	walk(trace.SpanID{}, 0)
	return b.String()
}
