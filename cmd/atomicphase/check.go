package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/atomicphase/atomicphase/conformance"
)

// checkSummary is check's line in the usage.
const checkSummary = "prove an Idempotency-Key endpoint from the outside (no database)"

const checkDetail = `Usage: atomicphase check [flags] URL

Send URL the requests of retrying clients, dropped connections and storms
of concurrent clients, and judge its answers. What is unsafe fails in every
profile: a second execution, a replay that differs from the first answer,
an execution without a key, a reused key with another body executed or
given the first answer, an answer lost across a restart, one caller's key
answering another, a missing or absurd Retry-After. An answer spelled
otherwise than -profile says (the status of a refusal, the problem type,
the replay marker's name, strict key syntax) is reported as "differs", and
fails only with -strict. The default profile, generic, is passed by any
safe endpoint. The request flags are curl's, so that the request a client
already sends can be pasted: -X, -H, -d.

The check creates real resources (each successful scenario executes the
request at least once): point it at a test tenant, never at production
credentials. It sends about 60 requests, 20 of them at once, one scenario
at a time, and gives up on each after -request-timeout.

Scenarios (docs/conformance.md explains each):
%s
Exit status:
  0  no scenario failed: each passed, differs from the profile (without
     -strict) or was skipped with the reason printed
  1  a scenario failed (or differs, with -strict), or the check could not run
  2  usage error, -effects unreadable, or no other body can be made (-d2)

Flags:
`

// headerFlag collects repeated -H 'Name: value' flags.
type headerFlag struct{ h http.Header }

func (f *headerFlag) String() string { return "" }

func (f *headerFlag) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	name = strings.TrimSpace(name)
	if !ok || name == "" || strings.ContainsAny(name, " \t") {
		return fmt.Errorf("header %q is not 'Name: value'", v)
	}
	if f.h == nil {
		f.h = http.Header{}
	}
	f.h.Add(name, strings.TrimSpace(value))
	return nil
}

// bodyFlag is a request body, given inline or as @file, as curl's -d.
type bodyFlag struct {
	b   []byte
	set bool
}

func (f *bodyFlag) String() string { return "" }

func (f *bodyFlag) Set(v string) error {
	f.set = true
	if name, ok := strings.CutPrefix(v, "@"); ok {
		b, err := os.ReadFile(name)
		if err != nil {
			return err
		}
		// curl -d drops the newlines of a file.
		f.b = []byte(strings.NewReplacer("\r", "", "\n", "").Replace(string(b)))
		return nil
	}
	f.b = []byte(v)
	return nil
}

// runCheck runs atomicphase check with args and returns the exit status.
func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("atomicphase check", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var (
		headers, headers2     headerFlag
		body, body2, failBody bodyFlag
	)
	method := fs.String("X", "POST", "request `METHOD`")
	fs.Var(&headers, "H", "request header `'Name: value'`, repeatable (credentials, Content-Type); without a\nContent-Type, application/json for a JSON body, else application/x-www-form-urlencoded")
	fs.Var(&body, "d", "request `BODY` the endpoint accepts, or @file")
	fs.Var(&body2, "d2", "another valid request `BODY`, for a reused key; made from -d when absent (the last digit\nof its first number changed, printed before the table)")
	fs.Var(&headers2, "H2", "a second caller's header `'Name: value'`, repeatable, replacing -H's of that name;\nwithout it the scoping scenario is skipped")
	fs.Var(&failBody, "d500", "a request `BODY` the endpoint answers with a 5xx; without it the server-error scenario is skipped")
	profile := fs.String("profile", "generic", "the policy answers are compared with: `generic`, ietf, stripe or atomicphase")
	strict := fs.Bool("strict", false, "fail on an answer that differs from -profile, not only on an unsafe one")
	jsonOut := fs.Bool("json", false, "print the report as JSON, every body whole")
	effects := fs.String("effects", "", "`URL` whose GET answers how many times the endpoint executed: a number, or a JSON\nobject whose field is named after '#' (http://127.0.0.1:9090/_stats#charges)")
	restart := fs.String("restart", "", "shell `COMMAND` that restarts the server and returns once it serves, run once an\nexecution is in flight; the server must be seen to go away (its connections closed), else\nthe scenario is not exercised; without it the restart scenario is skipped, and without\n-effects it cannot pass")
	storm := fs.Int("storm", conformance.DefaultStorm, "`N` identical requests sent at once, 2 to 1000")
	requestTimeout := fs.Duration("request-timeout", conformance.DefaultRequestTimeout, "bound on each request")
	settleTimeout := fs.Duration("settle-timeout", conformance.DefaultSettleTimeout, "bound on retrying a key in flight (409, 429, 503); a longer Retry-After\nfrom the endpoint extends it")
	timeout := fs.Duration("timeout", 5*time.Minute, "bound on the whole check")

	usage := func(w io.Writer) {
		var s strings.Builder
		for _, sc := range conformance.Scenarios() {
			fmt.Fprintf(&s, "  %-19s %s\n", sc.Name, sc.Checks)
		}
		fmt.Fprintf(w, checkDetail, s.String())
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	fail := func(format string, a ...any) int {
		// The package's errors name it; the command's name is enough.
		msg := strings.ReplaceAll(fmt.Sprintf(format, a...), "conformance: ", "")
		fmt.Fprintf(stderr, "atomicphase check: %s\nRun 'atomicphase check -h' for the flags.\n", msg)
		return exitUsage
	}
	// The URL may come anywhere among the flags, as with curl.
	var positional []string
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			usage(stdout)
			return exitOK
		}
		if err != nil {
			return fail("%v", err)
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(positional) != 1 {
		return fail("want one URL, got %d", len(positional))
	}
	p, err := conformance.ProfileNamed(*profile)
	if err != nil {
		return fail("%v", err)
	}
	if !body.set {
		return fail("-d is required: the body of a request the endpoint accepts")
	}
	if *storm < 2 || *storm > 1000 {
		return fail("-storm %d: send 2 to 1000 requests at once", *storm)
	}
	h := headers.h
	if h == nil {
		h = http.Header{}
	}
	if h.Get("Content-Type") == "" {
		// As curl -d sends it, unless the body is JSON: a JSON body sent
		// as a form is not the request the user meant, and no other body
		// can be made from it.
		h.Set("Content-Type", defaultContentType(body.b))
	}
	cfg := conformance.Config{
		URL: positional[0], Method: *method, Header: h, Body: body.b, OtherCaller: headers2.h,
		Profile: p, Strict: *strict, Storm: *storm, RequestTimeout: *requestTimeout, SettleTimeout: *settleTimeout,
	}
	if body2.set {
		cfg.OtherBody = body2.b
	}
	if failBody.set {
		cfg.FailBody = failBody.b
	}
	if *effects != "" {
		if cfg.Executions, err = effectsProbe(*effects, *requestTimeout); err != nil {
			return fail("-effects: %v", err)
		}
		// Read once now, so that a wrong URL or field is one usage error
		// rather than a failure of every scenario.
		if _, err := cfg.Executions(ctx); err != nil {
			return fail("-effects: %v", err)
		}
	}
	if *restart != "" {
		cfg.Restart = func(ctx context.Context) error {
			var out tail
			cmd := exec.CommandContext(ctx, "sh", "-c", *restart)
			// One writer for both, so that exec copies them on one pipe.
			both := io.MultiWriter(stderr, &out)
			cmd.Stdout, cmd.Stderr = both, both
			if err := cmd.Run(); err != nil {
				if s := out.String(); s != "" {
					return fmt.Errorf("-restart %q: %w: %s", *restart, err, s)
				}
				return fmt.Errorf("-restart %q: %w", *restart, err)
			}
			return nil
		}
	}
	ctx, cancel := context.WithTimeoutCause(ctx, *timeout, fmt.Errorf("the check's -timeout %s ran out", *timeout))
	defer cancel()
	rep, err := conformance.Check(ctx, cfg)
	if err != nil {
		return fail("%v", err)
	}
	if *jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "atomicphase check: %v\n", err)
			return exitError
		}
	} else {
		printReport(stdout, rep, cfg.Method, h.Get("Content-Type"))
	}
	if rep.Failed() {
		return exitError
	}
	return exitOK
}

// tailBytes is how much of a failed -restart command's output its error
// shows.
const tailBytes = 400

// tail keeps the last tailBytes written to it.
type tail struct{ b []byte }

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > tailBytes {
		t.b = t.b[len(t.b)-tailBytes:]
	}
	return len(p), nil
}

// String returns what was kept, on one line.
func (t *tail) String() string { return strings.Join(strings.Fields(string(t.b)), " ") }

// defaultContentType is the Content-Type a body is sent with when -H sets
// none.
func defaultContentType(body []byte) string {
	if b := bytes.TrimSpace(body); len(b) > 0 && (b[0] == '{' || b[0] == '[') && json.Valid(b) {
		return "application/json"
	}
	return "application/x-www-form-urlencoded"
}

// Widths of the report, which keeps every line within reportWidth
// columns: the table's lines are cut, the others wrapped.
const (
	reportWidth   = 100
	scenarioWidth = 20
	verdictWidth  = 9
	gotWidth      = reportWidth - scenarioWidth - verdictWidth
	detailWidth   = 240
)

// printReport prints rep as a table, one scenario a line, then what each
// scenario that did not pass sent, got and found.
func printReport(w io.Writer, rep *conformance.Report, method, contentType string) {
	mode := ""
	if rep.Strict {
		mode = ", strict"
	}
	wrap(w, "", "  ", fmt.Sprintf("%s %s (Content-Type %s), profile %s%s", method, rep.Target, contentType, rep.Profile, mode))
	wrap(w, "other request: ", "  ", rep.OtherBody)
	fmt.Fprintf(w, "\n%-*s%-*s%s\n", scenarioWidth, "SCENARIO", verdictWidth, "VERDICT", "GOT")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "%-*s%-*s%s\n", scenarioWidth, r.Scenario, verdictWidth, r.Verdict, cut(r.Got, gotWidth))
	}
	t := rep.Totals
	fmt.Fprintf(w, "\n%d passed, %d differ from the profile, %d skipped, %d failed\n", t.Passed, t.Differs, t.Skipped, t.Failed)
	for _, r := range rep.Results {
		if r.Verdict == conformance.Pass {
			continue
		}
		fmt.Fprintln(w)
		wrap(w, "", "  ", fmt.Sprintf("%s: %s (%s)", r.Scenario, r.Verdict, r.Source))
		if r.Sent != "" {
			wrap(w, "  sent: ", "        ", cut(r.Sent, detailWidth))
		}
		if r.Got != "" {
			wrap(w, "  got:  ", "        ", cut(r.Got, detailWidth))
		}
		for _, f := range r.Findings {
			first := "  " + string(f.Verdict) + ": "
			wrap(w, first, strings.Repeat(" ", len(first)), f.Why)
		}
	}
}

// wrap prints first and s on lines of at most reportWidth columns, the
// lines after the first starting with indent; a word wider than a line
// (a long URL) is broken where the line ends.
func wrap(w io.Writer, first, indent, s string) {
	line := []rune(first)
	blank := true // nothing of s on the line yet
	for _, word := range strings.Fields(s) {
		r := []rune(word)
		if !blank && len(line)+1+len(r) > reportWidth {
			fmt.Fprintln(w, string(line))
			line, blank = []rune(indent), true
		}
		if !blank {
			line = append(line, ' ')
		}
		for len(line)+len(r) > reportWidth {
			n := reportWidth - len(line)
			fmt.Fprintln(w, string(append(line, r[:n]...)))
			line, r = []rune(indent), r[n:]
		}
		line, blank = append(line, r...), false
	}
	fmt.Fprintln(w, string(line))
}

// cut shows s on one line, cut to n characters.
func cut(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// effectsProbe returns a function that reads the execution count from
// raw: a URL answering a number, or a JSON object whose field is named by
// the URL's fragment.
func effectsProbe(raw string, timeout time.Duration) (func(context.Context) (int64, error), error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("%q is not an http or https URL", raw)
	}
	field := u.Fragment
	u.Fragment = ""
	client := &http.Client{Timeout: timeout}
	return func(ctx context.Context) (int64, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return 0, err
		}
		res, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		if err != nil {
			return 0, err
		}
		if res.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("GET %s answered %d", u, res.StatusCode)
		}
		return readCount(u.String(), b, field)
	}, nil
}

// readCount reads an execution count from body, the answer of GET u: a
// number, or with field a JSON object's integer field of that name.
func readCount(u string, body []byte, field string) (int64, error) {
	text := strings.TrimSpace(string(body))
	var fields map[string]json.RawMessage
	isObject := json.Unmarshal(body, &fields) == nil
	if field == "" {
		if isObject {
			return 0, fmt.Errorf("GET %s answered a JSON object; name the field after '#' (%s#FIELD): its fields are %s", u, u, names(fields))
		}
		n, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("GET %s answered %q, not a number", u, cut(text, 60))
		}
		return n, nil
	}
	if !isObject {
		return 0, fmt.Errorf("GET %s answered %q, not a JSON object with a field %q", u, cut(text, 60), field)
	}
	for k, v := range fields {
		if strings.EqualFold(k, field) {
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("GET %s: field %q is %s, not an integer", u, k, cut(string(v), 60))
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("GET %s has no field %q; its fields are %s", u, field, names(fields))
}

// names lists an object's field names, sorted.
func names(fields map[string]json.RawMessage) string {
	out := make([]string, 0, len(fields))
	for k := range fields {
		out = append(out, k)
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}
