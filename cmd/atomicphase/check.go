package main

import (
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
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/atomicphase/atomicphase/conformance"
)

// checkSummary is check's line in the usage.
const checkSummary = "prove an Idempotency-Key endpoint from the outside (no database)"

const checkDetail = `Usage: atomicphase check [flags] URL

Send URL the requests of retrying clients, dropped connections and storms
of concurrent clients, and judge its answers by the Idempotency-Key
contract of -profile. The request flags are curl's, so that the request a
client already sends can be pasted: -X, -H, -d.

The check creates real resources (each successful scenario executes the
request at least once): point it at a test tenant, never at production
credentials. It sends about 60 requests, 20 of them at once, one scenario
at a time, and gives up on each after -request-timeout.

Scenarios (docs/conformance.md explains each):
%s
Exit status:
  0  every scenario passed, or was skipped with the reason printed
  1  a scenario failed, or the check could not run
  2  usage error

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
	fs.Var(&headers, "H", "request header `'Name: value'`, repeatable (credentials, Content-Type)")
	fs.Var(&body, "d", "request `BODY` the endpoint accepts, or @file")
	fs.Var(&body2, "d2", "another valid request `BODY`, for a reused key; made from -d when absent (the last digit\nof its first number changed, printed before the table)")
	fs.Var(&headers2, "H2", "a second caller's header `'Name: value'`, repeatable, replacing -H's of that name;\nwithout it the scoping scenario is skipped")
	fs.Var(&failBody, "d500", "a request `BODY` the endpoint answers with a 5xx; without it the server-error scenario is skipped")
	profile := fs.String("profile", "atomicphase", "the endpoint's policy: `ietf`, stripe or atomicphase")
	jsonOut := fs.Bool("json", false, "print the report as JSON")
	effects := fs.String("effects", "", "`URL` whose GET answers how many times the endpoint executed: a number, or a JSON\nobject whose field is named after '#' (http://127.0.0.1:9090/_stats#charges)")
	restart := fs.String("restart", "", "shell `COMMAND` that restarts the server and returns once it serves; without it\nthe restart scenario is skipped")
	storm := fs.Int("storm", conformance.DefaultStorm, "`N` identical requests sent at once")
	requestTimeout := fs.Duration("request-timeout", conformance.DefaultRequestTimeout, "bound on each request")
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
		fmt.Fprintf(stderr, "atomicphase check: "+format+"\n\n", a...)
		usage(stderr)
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
	h := headers.h
	if h.Get("Content-Type") == "" {
		// As curl -d sends it.
		if h == nil {
			h = http.Header{}
		}
		h.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	cfg := conformance.Config{
		URL: positional[0], Method: *method, Header: h, Body: body.b, OtherCaller: headers2.h,
		Profile: p, Storm: *storm, RequestTimeout: *requestTimeout,
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
	}
	if *restart != "" {
		cfg.Restart = func(ctx context.Context) error {
			cmd := exec.CommandContext(ctx, "sh", "-c", *restart)
			cmd.Stdout, cmd.Stderr = stderr, stderr
			return cmd.Run()
		}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
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
		printReport(stdout, rep, cfg.Method)
	}
	if rep.Failed() {
		return exitError
	}
	return exitOK
}

// printReport prints rep as a table, one scenario a line.
func printReport(w io.Writer, rep *conformance.Report, method string) {
	fmt.Fprintf(w, "%s %s, profile %s\nother request: %s\n\n", method, rep.Target, rep.Profile, rep.OtherBody)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tVERDICT\tSENT\tGOT\tWHY")
	passed, skipped, failed := 0, 0, 0
	for _, r := range rep.Results {
		switch r.Verdict {
		case conformance.Pass:
			passed++
		case conformance.Skip:
			skipped++
		default:
			failed++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Scenario, r.Verdict, cut(r.Sent, 70), cut(r.Got, 90), r.Why)
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%d passed, %d skipped, %d failed\n", passed, skipped, failed)
}

func cut(s string, n int) string {
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
		if field == "" {
			return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(b, &fields); err != nil {
			return 0, fmt.Errorf("GET %s: not a JSON object: %w", u, err)
		}
		for k, v := range fields {
			if strings.EqualFold(k, field) {
				return strconv.ParseInt(string(v), 10, 64)
			}
		}
		return 0, fmt.Errorf("GET %s has no field %q", u, field)
	}, nil
}
