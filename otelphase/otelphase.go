package otelphase

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// scope names the tracer and meter, as OpenTelemetry recommends: the
// instrumenting package's import path.
const scope = "github.com/atomicphase/atomicphase/otelphase"

// Span names.
const (
	SpanRun       = "atomicphase.run"
	SpanPhase     = "atomicphase.phase"
	SpanCall      = "atomicphase.call"
	SpanReconcile = "atomicphase.reconcile"
	SpanPass      = "atomicphase.completer.pass"
)

// Attribute keys of spans and metrics.
const (
	AttrWorkflow      = attribute.Key("atomicphase.workflow")
	AttrPhase         = attribute.Key("atomicphase.phase")
	AttrRecoveryPoint = attribute.Key("atomicphase.recovery_point")
	AttrOutcome       = attribute.Key("atomicphase.outcome")
	AttrAttempt       = attribute.Key("atomicphase.attempt")
	AttrCompleter     = attribute.Key("atomicphase.completer")
	AttrStatus        = attribute.Key("atomicphase.status")
	AttrDownstreamKey = attribute.Key("atomicphase.downstream_key")
	AttrTenant        = attribute.Key("atomicphase.tenant")
	AttrKey           = attribute.Key("atomicphase.key")
	AttrState         = attribute.Key("atomicphase.state")
	AttrClaimed       = attribute.Key("atomicphase.claimed")
	AttrCompleted     = attribute.Key("atomicphase.completed")
	AttrFailed        = attribute.Key("atomicphase.failed")
	AttrDead          = attribute.Key("atomicphase.dead")
	// AttrErrorType is OpenTelemetry's error.type: the kind of a run's,
	// phase's or call's error (see the package documentation).
	AttrErrorType = attribute.Key("error.type")
)

// DefaultCountsInterval is the shortest time between two reads of the key
// counts behind the keys gauge. The read scans the keys table, which takes
// about a second at a million keys.
const DefaultCountsInterval = 30 * time.Second

// Config configures a Hook. Zero values mean the default.
type Config struct {
	// TracerProvider makes the spans. Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider makes the metrics. Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// KeyAttributes adds the tenant and the idempotency key to run spans.
	// Tenants are often customer accounts or emails, so they are left out
	// by default. Metrics never carry them.
	KeyAttributes bool
	// CountsInterval is the shortest time between two reads of the key
	// counts for the keys gauge (see ObserveKeys): Client.Counts scans the
	// keys table, so a collection sooner reports the previous read.
	// Defaults to DefaultCountsInterval.
	CountsInterval time.Duration
}

// Hook is a phase.Hook that wraps runs, phases, foreign calls and
// completer passes in spans, and records their metrics. It is safe for
// concurrent use; one serves a whole client.
type Hook struct {
	phase.HookDefaults
	cfg    Config
	tracer trace.Tracer
	meter  metric.Meter

	runs     metric.Int64Counter
	replays  metric.Int64Counter
	refused  metric.Int64Counter
	duration metric.Float64Histogram
}

var _ interface {
	phase.RunWrapper
	phase.PhaseWrapper
	phase.CallWrapper
	phase.PassWrapper
} = (*Hook)(nil)

// New returns a Hook configured by cfg; nil means all defaults.
func New(cfg *Config) (*Hook, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.CountsInterval < 0 {
		return nil, errors.New("otelphase: Config.CountsInterval must not be negative")
	}
	if c.CountsInterval == 0 {
		c.CountsInterval = DefaultCountsInterval
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	m := &Hook{cfg: c, tracer: c.TracerProvider.Tracer(scope), meter: c.MeterProvider.Meter(scope)}
	var errs [4]error
	m.runs, errs[0] = m.meter.Int64Counter("atomicphase.runs", metric.WithUnit("{run}"),
		metric.WithDescription("Runs of idempotency keys, by workflow and outcome."))
	m.replays, errs[1] = m.meter.Int64Counter("atomicphase.replays", metric.WithUnit("{run}"),
		metric.WithDescription("Runs that replayed a finished key's stored response."))
	m.refused, errs[2] = m.meter.Int64Counter("atomicphase.refused", metric.WithUnit("{run}"),
		metric.WithDescription("Runs refused because another run held the key or the key was on hold."))
	m.duration, errs[3] = m.meter.Float64Histogram("atomicphase.phase.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of a phase, its foreign call and commit included."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("otelphase: %w", err)
	}
	return m, nil
}

// WrapRun traces a run as an atomicphase.run span and counts it by outcome.
func (m *Hook) WrapRun(ctx context.Context, run *phase.RunInfo, next func(context.Context) (*phase.Outcome, error)) (*phase.Outcome, error) {
	attrs := []attribute.KeyValue{AttrWorkflow.String(run.Workflow)}
	if m.cfg.KeyAttributes {
		attrs = append(attrs, AttrTenant.String(run.Tenant), AttrKey.String(run.Key))
	}
	ctx, span := m.tracer.Start(ctx, SpanRun, trace.WithAttributes(attrs...))
	defer span.End()
	out, err := next(ctx)

	outcome := AttrOutcome.String(outcomeName(out, err))
	metricAttrs := []attribute.KeyValue{AttrWorkflow.String(run.Workflow), outcome, AttrCompleter.Bool(run.ByCompleter)}
	if err != nil {
		metricAttrs = append(metricAttrs, AttrErrorType.String(errorType(err)))
	}
	if span.IsRecording() {
		// The workflow is on the span since its start.
		spanAttrs := metricAttrs[1:len(metricAttrs):len(metricAttrs)]
		if run.RecoveryPoint != "" {
			spanAttrs = append(spanAttrs, AttrRecoveryPoint.String(run.RecoveryPoint))
		}
		if run.Attempt > 0 {
			spanAttrs = append(spanAttrs, AttrAttempt.Int(run.Attempt))
		}
		if out != nil && out.Response != nil {
			spanAttrs = append(spanAttrs, AttrStatus.Int(out.Response.Status))
		}
		span.SetAttributes(spanAttrs...)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
	m.runs.Add(ctx, 1, metric.WithAttributes(metricAttrs...))
	if out != nil {
		switch out.Kind {
		case phase.OutcomeReplayed:
			m.replays.Add(ctx, 1, metric.WithAttributes(AttrWorkflow.String(run.Workflow)))
		case phase.OutcomeInFlight, phase.OutcomeOnHold:
			m.refused.Add(ctx, 1, metric.WithAttributes(AttrWorkflow.String(run.Workflow), outcome))
		}
	}
	return out, err
}

// WrapPhase traces a phase as an atomicphase.phase span and records its
// duration.
func (m *Hook) WrapPhase(ctx context.Context, p *phase.PhaseInfo, next func(context.Context) error) error {
	attrs := []attribute.KeyValue{AttrWorkflow.String(p.Workflow), AttrPhase.String(p.Phase)}
	ctx, span := m.tracer.Start(ctx, SpanPhase, trace.WithAttributes(attrs...))
	defer span.End()
	start := time.Now()
	err := next(ctx)
	if err != nil {
		kind := AttrErrorType.String(errorType(err))
		attrs = append(attrs, kind)
		span.SetAttributes(kind)
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	m.duration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attrs...))
	return err
}

// WrapCall traces a foreign call as an atomicphase.call span (a reconcile
// function as an atomicphase.reconcile span) carrying its downstream key.
func (m *Hook) WrapCall(ctx context.Context, p *phase.PhaseInfo, next func(context.Context) error) error {
	name := SpanCall
	if p.Reconcile {
		name = SpanReconcile
	}
	ctx, span := m.tracer.Start(ctx, name, trace.WithAttributes(AttrWorkflow.String(p.Workflow),
		AttrPhase.String(p.Phase), AttrDownstreamKey.String(p.DownstreamKey)))
	defer span.End()
	err := next(ctx)
	if err != nil {
		span.SetAttributes(AttrErrorType.String(errorType(err)))
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

// WrapPass traces a completer pass as an atomicphase.completer.pass span; the
// runs it resumes are its children.
func (m *Hook) WrapPass(ctx context.Context, next func(context.Context) (recovery.PassResult, error)) (recovery.PassResult, error) {
	ctx, span := m.tracer.Start(ctx, SpanPass)
	defer span.End()
	res, err := next(ctx)
	span.SetAttributes(AttrClaimed.Int(res.Claimed), AttrCompleted.Int(res.Completed),
		AttrFailed.Int(res.Failed), AttrDead.Int(res.Dead))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return res, err
}

// outcomeName names how a run ended: the atomicphase.outcome attribute,
// the phase.OutcomeKind itself, or "error".
func outcomeName(out *phase.Outcome, err error) string {
	if err != nil || out == nil {
		return "error"
	}
	return string(out.Kind)
}

// errorType names the kind of a run's or phase's error: the error.type
// attribute.
func errorType(err error) string {
	var pe *phase.PanicError
	switch {
	case errors.Is(err, phase.ErrCrash):
		return "crash"
	case errors.Is(err, keyrow.ErrLeaseLost):
		return "lease_lost"
	case errors.Is(err, phase.ErrOutcomeUnknown):
		return "outcome_unknown"
	case errors.As(err, &pe):
		return "panic"
	case errors.Is(err, phase.ErrRunTimeout):
		return "timeout"
	case errors.Is(err, phase.ErrStopped):
		// Before ErrUnavailable: a run cut short by Stop is both.
		return "stopped"
	case errors.Is(err, phase.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, phase.ErrNotRegistered):
		return "not_registered"
	case errors.Is(err, phase.ErrInvalidRequest), errors.Is(err, keyrow.ErrInvalidTenant),
		errors.Is(err, keyrow.ErrKeyMissing), errors.Is(err, keyrow.ErrKeyInvalid):
		return "invalid_request"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "failed"
}

// ObserveKeys registers the atomicphase.keys gauge: how many of c's keys
// are in each keyrow.Status (finished, in_flight, waiting, stuck, unknown,
// dead), read with c.Counts at most once per Config.CountsInterval. The
// counts are the database's, not the process's: register the gauge in one
// process per database, once. Call Unregister on the result when c is
// stopped.
func (m *Hook) ObserveKeys(c *phase.Client) (metric.Registration, error) {
	gauge, err := m.meter.Int64ObservableGauge("atomicphase.keys", metric.WithUnit("{key}"),
		metric.WithDescription("Idempotency keys by state; stuck keys are idle past the completer's StuckAfter."))
	if err != nil {
		return nil, fmt.Errorf("otelphase: %w", err)
	}
	counts := &cachedCounts{read: c.Counts, every: m.cfg.CountsInterval}
	reg, err := m.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		n, err := counts.get(ctx)
		if err != nil {
			return err
		}
		for _, s := range keyrow.Statuses() {
			o.ObserveInt64(gauge, int64(n.Of(s)), metric.WithAttributes(AttrState.String(string(s))))
		}
		return nil
	}, gauge)
	if err != nil {
		return nil, fmt.Errorf("otelphase: %w", err)
	}
	return reg, nil
}

// cachedCounts reads the key counts at most once per interval; readers
// that collect at once share one read.
type cachedCounts struct {
	read  func(context.Context) (keyrow.Counts, error)
	every time.Duration

	mu     sync.Mutex
	last   keyrow.Counts
	readAt time.Time
}

func (c *cachedCounts) get(ctx context.Context) (keyrow.Counts, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.readAt.IsZero() && time.Since(c.readAt) < c.every {
		return c.last, nil
	}
	n, err := c.read(ctx)
	if err != nil {
		return keyrow.Counts{}, fmt.Errorf("otelphase: read key counts: %w", err)
	}
	c.last, c.readAt = n, time.Now()
	return n, nil
}
