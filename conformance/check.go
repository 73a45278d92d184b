package conformance

import (
	"context"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// Verdict is how a scenario ended.
type Verdict string

// The verdicts of a scenario.
const (
	// Pass: the endpoint behaved as the scenario requires.
	Pass Verdict = "pass"
	// Fail: it did not; Result.Why says how.
	Fail Verdict = "fail"
	// Skip: the scenario could not run, for the reason in Result.Why (an
	// optional input was not given, or the endpoint answered too fast to
	// be caught in flight). A skip is not a failure.
	Skip Verdict = "skip"
)

// Result is the outcome of one scenario.
type Result struct {
	// Scenario is the scenario's name, as in Scenarios.
	Scenario string `json:"scenario"`
	// Source is the standard or article the scenario comes from.
	Source string `json:"source"`
	// Verdict is how it ended.
	Verdict Verdict `json:"verdict"`
	// Sent describes the requests, Got the answers.
	Sent string `json:"sent"`
	Got  string `json:"got"`
	// Why says why it failed or was skipped; empty when it passed.
	Why string `json:"why,omitempty"`
}

// Report is the outcome of a check.
type Report struct {
	// Target is the URL checked.
	Target string `json:"target"`
	// Profile names the profile the answers were judged by.
	Profile string `json:"profile"`
	// OtherBody says how the second request was made, or why there is none.
	OtherBody string `json:"other_body"`
	// Results holds one Result per scenario, in the order of Scenarios.
	Results []Result `json:"results"`
}

// Failed reports whether a scenario failed.
func (r *Report) Failed() bool {
	for _, res := range r.Results {
		if res.Verdict == Fail {
			return true
		}
	}
	return false
}

// Scenario is one check of the Idempotency-Key contract.
type Scenario struct {
	// Name names it in reports and subtests.
	Name string
	// Source is the standard or article it comes from.
	Source string
	// Checks says what it sends and what it requires, in a sentence.
	Checks string
	run    func(ctx context.Context, c *checker, r *outcome)
}

// Scenarios returns every scenario, in the order a check runs them. Each
// sends requests under keys of its own; they run one at a time, so that
// an Executions count belongs to one scenario.
func Scenarios() []Scenario {
	out := make([]Scenario, len(scenarios))
	copy(out, scenarios)
	return out
}

// Check runs every scenario against the endpoint cfg names and returns
// their results. It returns an error only for an invalid cfg, or when the
// check's own loopback servers cannot start; a scenario's failure is in
// its Result. Each request is bounded by cfg.RequestTimeout, and ctx bounds
// the whole check.
func Check(ctx context.Context, cfg Config) (*Report, error) {
	rep := &Report{}
	err := each(ctx, cfg, rep, func(s Scenario, run func() Result) {
		rep.Results = append(rep.Results, run())
	})
	if err != nil {
		return nil, err
	}
	return rep, nil
}

// Test runs every scenario against the endpoint cfg names as a subtest of
// t, named for the scenario: a failed scenario fails its subtest with what
// was sent, what came back and why; a skipped one skips it with the reason.
// An invalid cfg fails t.
func Test(t *testing.T, cfg Config) {
	t.Helper()
	rep := &Report{}
	err := each(t.Context(), cfg, rep, func(s Scenario, run func() Result) {
		t.Run(s.Name, func(t *testing.T) {
			res := run()
			switch res.Verdict {
			case Fail:
				t.Errorf("%s (%s)\nsent: %s\ngot:  %s", res.Why, res.Source, res.Sent, res.Got)
			case Skip:
				t.Skip(res.Why)
			default:
				t.Logf("sent: %s\ngot:  %s", res.Sent, res.Got)
			}
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// each runs the scenarios against cfg's endpoint one at a time through do.
func each(ctx context.Context, cfg Config, rep *Report, do func(s Scenario, run func() Result)) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	target := cfg.URL
	if cfg.Handler != nil {
		srv := httptest.NewServer(cfg.Handler)
		defer srv.Close()
		target = srv.URL + cfg.URL
	}
	c := newChecker(cfg, target)
	defer c.client.CloseIdleConnections()
	rep.Target, rep.Profile, rep.OtherBody = target, cfg.Profile.Name, c.otherNote
	for _, s := range scenarios {
		do(s, func() Result {
			o := &outcome{res: Result{Scenario: s.Name, Source: s.Source, Verdict: Pass}, profile: cfg.Profile}
			if ctx.Err() != nil {
				o.skip("the check was stopped: %v", context.Cause(ctx))
			} else {
				s.run(ctx, c, o)
			}
			return o.result()
		})
	}
	return nil
}

// outcome collects a scenario's verdict and what it shows of its requests.
type outcome struct {
	res     Result
	profile Profile
	sent    []string
	got     []string
	why     []string
}

// show adds exchanges to what the result shows.
func (o *outcome) show(xs ...*exchange) {
	for _, x := range xs {
		o.sent = append(o.sent, x.what)
		o.got = append(o.got, x.got(o.profile.ReplayHeader))
	}
}

// note adds a line to what was sent and what came back, for a scenario
// that summarises many requests.
func (o *outcome) note(sent, got string) {
	o.sent = append(o.sent, sent)
	o.got = append(o.got, got)
}

// fail records a failure; every reason is kept.
func (o *outcome) fail(format string, args ...any) {
	o.res.Verdict = Fail
	if why := fmt.Sprintf(format, args...); !slices.Contains(o.why, why) {
		o.why = append(o.why, why)
	}
}

// skip ends the scenario as skipped, unless it already failed.
func (o *outcome) skip(format string, args ...any) {
	if o.res.Verdict != Fail {
		o.res.Verdict = Skip
		o.why = []string{fmt.Sprintf(format, args...)}
	}
}

func (o *outcome) failed() bool { return o.res.Verdict == Fail }

func isEmpty(s string) bool { return s == "" }

func (o *outcome) result() Result {
	o.res.Sent = strings.Join(slices.DeleteFunc(o.sent, isEmpty), "; ")
	o.res.Got = strings.Join(slices.DeleteFunc(o.got, isEmpty), "; ")
	o.res.Why = strings.Join(o.why, "; ")
	return o.res
}
