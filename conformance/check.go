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
	// Skip: the scenario could not run or judge, for the reason in
	// Result.Why (an optional input was not given, the endpoint answered
	// too fast to be caught in flight, a restart could not land on an
	// execution in flight). A skip is not a failure, nor a pass.
	Skip Verdict = "skip"
	// Differs: nothing unsafe was seen, but an answer is spelled otherwise
	// than the profile says (which 4xx a refusal uses, the problem type,
	// the replay marker's name, strict key syntax). It fails the check
	// only when Config.Strict is set.
	Differs Verdict = "differs"
)

// Finding is one thing a scenario saw that the profile does not allow.
type Finding struct {
	// Verdict is Fail for what is unsafe, or what kept the scenario from
	// judging the endpoint (the request the scenario builds on failed);
	// Differs for an answer spelled otherwise than the profile says; Skip
	// for why the scenario did not run.
	Verdict Verdict `json:"verdict"`
	// Why says what was seen, and where the check infers, what it infers.
	Why string `json:"why"`
}

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
	// Why says why it failed, differs or was skipped: every finding, joined
	// by "; ". Empty when it passed.
	Why string `json:"why,omitempty"`
	// Findings lists every finding, each with its kind.
	Findings []Finding `json:"findings,omitempty"`
	// Answers lists each request the scenario sent and what came back,
	// field by field: every request of a storm included.
	Answers []Answer `json:"answers,omitempty"`
	// Executions is how many times the endpoint executed during the
	// scenario by the Executions count; nil when it was not counted.
	Executions *int64 `json:"executions,omitempty"`
}

// Answer is one request a scenario sent and what came back.
type Answer struct {
	// Sent describes the request, as Result.Sent does.
	Sent string `json:"sent"`
	// Status is the answer's HTTP status, 0 when none came.
	Status int `json:"status"`
	// Body is the answer's body, whole; its length when it is not UTF-8.
	Body string `json:"body"`
	// Replayed names the replay marker the answer carried, whichever
	// spelling, or is empty when it carried none.
	Replayed string `json:"replayed,omitempty"`
	// RetryAfter is the answer's Retry-After header, if any.
	RetryAfter string `json:"retry_after,omitempty"`
	// Error says why no answer came.
	Error string `json:"error,omitempty"`
}

// Totals counts a report's scenarios by verdict.
type Totals struct {
	Passed  int `json:"passed"`
	Differs int `json:"differs"`
	Skipped int `json:"skipped"`
	Failed  int `json:"failed"`
}

// Report is the outcome of a check.
type Report struct {
	// Target is the URL checked.
	Target string `json:"target"`
	// Profile names the profile the answers were judged by.
	Profile string `json:"profile"`
	// OtherBody says how the second request was made, or why there is none.
	OtherBody string `json:"other_body"`
	// Strict is Config.Strict: a Differs verdict fails the check.
	Strict bool `json:"strict"`
	// Results holds one Result per scenario, in the order of Scenarios.
	Results []Result `json:"results"`
	// Totals counts Results by verdict.
	Totals Totals `json:"totals"`
}

// total counts r's results by verdict into r.Totals.
func (r *Report) total() {
	r.Totals = Totals{}
	for _, res := range r.Results {
		switch res.Verdict {
		case Pass:
			r.Totals.Passed++
		case Differs:
			r.Totals.Differs++
		case Skip:
			r.Totals.Skipped++
		case Fail:
			r.Totals.Failed++
		}
	}
}

// Failed reports whether a scenario failed, or, with Strict, differs from
// the profile.
func (r *Report) Failed() bool {
	for _, res := range r.Results {
		if res.Verdict == Fail || (r.Strict && res.Verdict == Differs) {
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
	rep.total()
	return rep, nil
}

// Test runs every scenario against the endpoint cfg names as a subtest of
// t, named for the scenario: a failed scenario fails its subtest with what
// was sent, what came back and why; one that differs from the profile logs
// the same, and fails its subtest with cfg.Strict; a skipped one skips it
// with the reason. An invalid cfg fails t.
func Test(t *testing.T, cfg Config) {
	t.Helper()
	rep := &Report{}
	err := each(t.Context(), cfg, rep, func(s Scenario, run func() Result) {
		t.Run(s.Name, func(t *testing.T) {
			res := run()
			switch res.Verdict {
			case Fail:
				t.Errorf("%s (%s)\nsent: %s\ngot:  %s", res.Why, res.Source, res.Sent, res.Got)
			case Differs:
				report := t.Logf
				if cfg.Strict {
					report = t.Errorf
				}
				report("differs from profile %s: %s (%s)\nsent: %s\ngot:  %s", rep.Profile, res.Why, res.Source, res.Sent, res.Got)
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

// each runs the scenarios against cfg's endpoint one at a time through do,
// once cfg is valid and its Executions count can be read.
func each(ctx context.Context, cfg Config, rep *Report, do func(s Scenario, run func() Result)) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	if cfg.Executions != nil {
		// Read once before any scenario, so that a count that cannot be
		// read stops the check with one error, not one per scenario.
		if _, err := cfg.Executions(ctx); err != nil {
			return fmt.Errorf("conformance: the Executions count cannot be read: %w", err)
		}
	}
	target := cfg.URL
	if cfg.Handler != nil {
		srv := httptest.NewServer(cfg.Handler)
		defer srv.Close()
		target = srv.URL + cfg.URL
	}
	c := newChecker(cfg, target)
	defer c.client.CloseIdleConnections()
	if c.other == nil {
		// The scenarios that reuse a key with another request are the only
		// ones that see an endpoint without a fingerprint: a check without
		// them must not pass.
		return fmt.Errorf("conformance: no other request to reuse a key with: %s", c.otherNote)
	}
	rep.Target, rep.Profile, rep.OtherBody, rep.Strict = target, cfg.Profile.Name, c.otherNote, cfg.Strict
	for _, s := range scenarios {
		do(s, func() Result {
			o := &outcome{res: Result{Scenario: s.Name, Source: s.Source, Verdict: Pass}, profile: cfg.Profile}
			if ctx.Err() != nil {
				o.skip("the check was stopped: %v", context.Cause(ctx))
				return o.result()
			}
			s.run(ctx, c, o)
			if ctx.Err() != nil {
				// What the scenario saw once its requests were cut is the
				// cut, not the endpoint.
				o.findings = nil
				o.fail("the check was stopped during the scenario, before it could judge: %v", context.Cause(ctx))
			}
			return o.result()
		})
	}
	return nil
}

// outcome collects a scenario's verdict and what it shows of its requests.
type outcome struct {
	res      Result
	profile  Profile
	sent     []string
	got      []string
	findings []Finding
}

// show adds exchanges to what the result shows.
func (o *outcome) show(xs ...*exchange) {
	for _, x := range xs {
		o.sent = append(o.sent, x.what)
		o.got = append(o.got, x.got())
	}
	o.answer(xs...)
}

// answer adds exchanges to the result's Answers only, for a scenario that
// summarises them in a note.
func (o *outcome) answer(xs ...*exchange) {
	for _, x := range xs {
		a := Answer{Sent: x.what, Status: x.status, Body: shown(x.resp), Replayed: x.marker()}
		if x.err != nil {
			a.Error = x.err.Error()
		} else {
			a.RetryAfter = x.header.Get("Retry-After")
		}
		o.res.Answers = append(o.res.Answers, a)
	}
}

// note adds a line to what was sent and what came back, for a scenario
// that summarises many requests.
func (o *outcome) note(sent, got string) {
	o.sent = append(o.sent, sent)
	o.got = append(o.got, got)
}

// find records a finding once.
func (o *outcome) find(v Verdict, format string, args ...any) {
	f := Finding{Verdict: v, Why: fmt.Sprintf(format, args...)}
	if !slices.Contains(o.findings, f) {
		o.findings = append(o.findings, f)
	}
}

// fail records what is unsafe, or what kept the scenario from judging.
func (o *outcome) fail(format string, args ...any) { o.find(Fail, format, args...) }

// differ records an answer spelled otherwise than the profile says.
func (o *outcome) differ(format string, args ...any) { o.find(Differs, format, args...) }

// skip records why the scenario did not run, or could not judge.
func (o *outcome) skip(format string, args ...any) { o.find(Skip, format, args...) }

func (o *outcome) failed() bool { return o.has(Fail) }

func (o *outcome) has(v Verdict) bool {
	return slices.ContainsFunc(o.findings, func(f Finding) bool { return f.Verdict == v })
}

func isEmpty(s string) bool { return s == "" }

// result returns the scenario's result: it fails on any failure, else
// differs on any difference, else is skipped on any reason to skip.
func (o *outcome) result() Result {
	for _, v := range []Verdict{Fail, Differs, Skip} {
		if o.has(v) {
			o.res.Verdict = v
			break
		}
	}
	o.res.Sent = strings.Join(slices.DeleteFunc(o.sent, isEmpty), "; ")
	o.res.Got = strings.Join(slices.DeleteFunc(o.got, isEmpty), "; ")
	// Failures first, then differences, then reasons to skip.
	slices.SortStableFunc(o.findings, func(a, b Finding) int { return rank(a.Verdict) - rank(b.Verdict) })
	why := make([]string, len(o.findings))
	for i, f := range o.findings {
		why[i] = f.Why
	}
	o.res.Why = strings.Join(why, "; ")
	o.res.Findings = o.findings
	return o.res
}

func rank(v Verdict) int { return slices.Index([]Verdict{Fail, Differs, Skip}, v) }
