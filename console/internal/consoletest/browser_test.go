package consoletest_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/atomicphase/atomicphase/console/internal/consoletest"
	browserpkg "github.com/atomicphase/atomicphase/internal/browser"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// browser starts headless Chromium at a laptop's width.
func browser(t *testing.T) context.Context { return browserpkg.Start(t, 1280, 800) }

// screenshot saves the page as name.png when asked to (see
// browserpkg.Screenshot).
func screenshot(name string) chromedp.Action[chromedp.Void] { return browserpkg.Screenshot(name) }

// run runs the steps and fails the test on an error.
func run(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// get runs one action that returns a value and fails the test on an error.
func get[T any](t *testing.T, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// text returns the text of the first element sel selects.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	return get(t, ctx, chromedp.Text(chromedp.CSS(sel)))
}

// noScriptRan asserts that no hostile payload set window.pwned.
func noScriptRan(t *testing.T, ctx context.Context, where string) {
	t.Helper()
	pwned := get(t, ctx, chromedp.Evaluate[string](`String(window.pwned)`))
	if pwned != "undefined" {
		t.Fatalf("%s: a stored payload ran (window.pwned = %q)", where, pwned)
	}
}

// css selects by a CSS selector.
func css(sel string) chromedp.CSS { return chromedp.CSS(sel) }

// setup serves the console over a new fixture and starts a browser.
func setup(t *testing.T) (*consoletest.Fixture, *httptest.Server, context.Context) {
	t.Helper()
	f := consoletest.New(t)
	srv := httptest.NewServer(f.Handler(t, false))
	t.Cleanup(srv.Close)
	return f, srv, browser(t)
}

// signIn signs the browser in to the fixture's console as user.
func signIn(t *testing.T, ctx context.Context, srv *httptest.Server, user string) {
	t.Helper()
	run(t, ctx, "sign in as "+user, chromedp.Navigate(srv.URL+"/as?user="+user), chromedp.WaitVisible(css(`main h1`)))
}

func TestOperatorFindsAnUnknownOutcomeAndResolvesIt(t *testing.T) {
	t.Parallel()
	f, srv, ctx := setup(t)

	run(t, ctx, "overview",
		chromedp.Navigate(srv.URL+"/as?user=alice"),
		chromedp.WaitVisible(css(`table.counts`)),
		screenshot("console-overview"))
	overview := text(t, ctx, "main")
	for _, want := range []string{"payments", "unknown outcomes", "dead", "keys in the last hour"} {
		if !strings.Contains(overview, want) {
			t.Errorf("the overview does not show %q:\n%s", want, overview)
		}
	}
	noScriptRan(t, ctx, "overview")

	// Filter the list down to acme's unknown outcomes.
	run(t, ctx, "filter",
		chromedp.Navigate(srv.URL+"/console/keys"),
		chromedp.WaitVisible(css(`form.filter`)),
		chromedp.SetValue(css(`select[name=state]`), "unknown"),
		chromedp.SendKeys(css(`input[name=tenant]`), "acme"),
		chromedp.Click(css(`form.filter button`)),
		chromedp.WaitVisible(css(`form.filter input[name=tenant][value=acme]`)),
		screenshot("console-keys"))
	rows := text(t, ctx, "table.keys tbody")
	if !strings.Contains(rows, f.UnknownKey) || strings.Contains(rows, "order-1") || strings.Contains(rows, "globex") {
		t.Fatalf("the unknown keys of acme are:\n%s\nwant %s and no other", rows, f.UnknownKey)
	}
	noScriptRan(t, ctx, "key list")

	// Open the key, say the charge happened, and see it finish.
	run(t, ctx, "open the key",
		chromedp.Click(css(`a[href*="`+f.UnknownKey+`"]`)),
		chromedp.WaitVisible(css(`#resolve-happened`)))
	detail := text(t, ctx, "main")
	for _, want := range []string{"order_created", "charged", "downstream key", "timed out", `"amount": 1200`} {
		if !strings.Contains(detail, want) {
			t.Errorf("the key's page does not show %q:\n%s", want, detail)
		}
	}
	run(t, ctx, "resolve",
		chromedp.SendKeys(css(`#resolve-happened textarea[name=output]`), `{"charge_id":"ch_from_the_dashboard"}`),
		chromedp.Click(css(`#resolve-happened input[name=confirm]`)),
		screenshot("console-resolve"),
		chromedp.Click(css(`#resolve-happened button`)),
		chromedp.WaitVisible(css(`p.flash`)),
		screenshot("console-resolved"))
	flash, status, detail := text(t, ctx, "p.flash"), text(t, ctx, "h1 .st"), text(t, ctx, "main")
	if status != "finished" || !strings.Contains(flash, "resolution is recorded") || !strings.Contains(detail, "ch_from_the_dashboard") {
		t.Fatalf("after resolving: status %q, flash %q; page:\n%s", status, flash, detail)
	}
	if !strings.Contains(detail, "alice") || !strings.Contains(detail, "resolve") {
		t.Errorf("the key's audit does not show alice's resolution:\n%s", detail)
	}
	row, err := f.Client.Inspect(context.Background(), "acme", f.UnknownKey)
	if err != nil || row.RecoveryPoint != keyrow.Finished {
		t.Fatalf("stored key: %+v, %v; want finished", row, err)
	}
}

func TestTheBrowserCannotActWithoutTheTokenOrAccess(t *testing.T) {
	t.Parallel()
	f, srv, ctx := setup(t)
	keyPage := srv.URL + "/console/key?" + url.Values{"tenant": {"acme"}, "key": {"order-in-flight"}}.Encode()

	// The console's own page posts the unlock form without its token.
	run(t, ctx, "alice's key page",
		chromedp.Navigate(srv.URL+"/as?user=alice"),
		chromedp.Navigate(keyPage),
		chromedp.WaitVisible(css(`form[action="unlock"]`)))
	status := get(t, ctx, chromedp.Evaluate[int](`fetch("unlock", {method: "POST",
		body: new URLSearchParams({tenant: "acme", key: "order-in-flight", confirm: "yes"})}).then(r => r.status)`,
		chromedp.EvalAwaitPromise))
	if status != 403 {
		t.Fatalf("POST without the CSRF token = %d, want 403", status)
	}
	if row, err := f.Client.Inspect(context.Background(), "acme", "order-in-flight"); err != nil || row.LeaseExpiresAt == nil {
		t.Fatalf("the refused POST freed the lease: %+v, %v", row, err)
	}

	run(t, ctx, "reader",
		chromedp.Navigate(srv.URL+"/as?user=bob"),
		chromedp.Navigate(keyPage),
		chromedp.WaitVisible(css(`dl.facts`)))
	if page := text(t, ctx, "main"); strings.Contains(page, "Actions") || !strings.Contains(page, "order-in-flight") {
		t.Fatalf("a reader's key page:\n%s\nwant the key without actions", page)
	}
	run(t, ctx, "stranger",
		chromedp.Navigate(srv.URL+"/as?user=mallory"),
		chromedp.Navigate(keyPage),
		chromedp.WaitVisible(css(`main h1`)))
	if page := text(t, ctx, "main"); !strings.Contains(page, "not allowed") || strings.Contains(page, "order-in-flight") {
		t.Fatalf("a stranger's page:\n%s\nwant a refusal", page)
	}
}

func TestHostileKeysTenantsAndBodiesRenderInert(t *testing.T) {
	t.Parallel()
	_, srv, ctx := setup(t)
	run(t, ctx, "key list",
		chromedp.Navigate(srv.URL+"/as?user=alice"),
		chromedp.WaitVisible(css(`table.counts`)),
		chromedp.Navigate(srv.URL+"/console/keys"),
		chromedp.WaitVisible(css(`table.keys`)))
	list := text(t, ctx, "table.keys")
	for _, want := range []string{consoletest.HostileTenant, consoletest.HostileKey, consoletest.HostileURLKey} {
		if !strings.Contains(list, want) {
			t.Errorf("the list does not show %q as text", want)
		}
	}
	for _, h := range get(t, ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("a")].map(a => a.href)`)) {
		if !strings.HasPrefix(h, srv.URL+"/") {
			t.Errorf("a link leaves the console: %q", h)
		}
	}
	noScriptRan(t, ctx, "key list")

	for _, tk := range [][2]string{{consoletest.HostileTenant, "order-h1"}, {"acme", consoletest.HostileKey}, {"acme", consoletest.HostileURLKey}} {
		run(t, ctx, "hostile key",
			chromedp.Navigate(srv.URL+"/console/key?"+url.Values{"tenant": {tk[0]}, "key": {tk[1]}}.Encode()),
			chromedp.WaitVisible(css(`dl.facts`)))
		page := text(t, ctx, "main")
		elements := get(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("main img, main script, main a[href^=javascript]").length`))
		if elements != 0 || !strings.Contains(page, `</pre><script>window.pwned=`) || !strings.Contains(page, tk[1]) {
			t.Errorf("key %q: %d images, scripts or script links in the page; the body and key shown as text: %v %v",
				tk[1], elements, strings.Contains(page, `</pre><script>window.pwned=`), strings.Contains(page, tk[1]))
		}
		noScriptRan(t, ctx, "key "+tk[1])
	}
	run(t, ctx, "screenshot", screenshot("console-hostile"))
}

// Two tabs show one unknown key; the charge is recorded as happened in the
// first, then as not happened in the second, from the page it still shows.
func TestAResolutionFromAPageThatMissedAnotherIsRefused(t *testing.T) {
	t.Parallel()
	f, srv, ctx := setup(t)
	keyPage := srv.URL + "/console/key?" + url.Values{"tenant": {"acme"}, "key": {f.UnknownKey}}.Encode()
	second, cancel := chromedp.NewContext(ctx)
	t.Cleanup(cancel)
	run(t, ctx, "sign in", chromedp.Navigate(srv.URL+"/as?user=alice"))
	for _, tab := range []context.Context{ctx, second} {
		run(t, tab, "open the key", chromedp.Navigate(keyPage), chromedp.WaitVisible(css(`#resolve-not-happened`)))
	}

	run(t, ctx, "resolve as happened",
		chromedp.SendKeys(css(`#resolve-happened textarea[name=output]`), `{"charge_id":"ch_first"}`),
		chromedp.Click(css(`#resolve-happened input[name=confirm]`)),
		chromedp.Click(css(`#resolve-happened button`)),
		chromedp.WaitVisible(css(`p.flash`)))
	run(t, second, "resolve as not happened from the older page",
		chromedp.Click(css(`#resolve-not-happened input[name=confirm]`)),
		chromedp.Click(css(`#resolve-not-happened button`)),
		chromedp.WaitVisible(css(`p.error`)),
		screenshot("console-resolve-conflict"))
	if msg, status := text(t, second, "p.error"), text(t, second, "h1 .st"); !strings.Contains(msg, "changed since your page showed it") ||
		status != "finished" {
		t.Fatalf("the second tab shows %q, status %q; want what changed, and the key as it is now", msg, status)
	}
	if audit := text(t, second, "table.audit"); !strings.Contains(audit, "refused") {
		t.Fatalf("the key's audit does not show the refusal:\n%s", audit)
	}
	row, err := f.Client.Inspect(context.Background(), "acme", f.UnknownKey)
	if err != nil || !strings.Contains(string(row.ResponseBody), "ch_first") {
		t.Fatalf("stored key: %+v, %v; want finished with the first resolution", row, err)
	}
}

// A right-to-left override in a tenant would show "acme\u202Egpj.exe" as
// "acmeexe.jpg": the pages write the control out and isolate the text.
func TestADirectionOverrideInATenantShowsAsWritten(t *testing.T) {
	t.Parallel()
	_, srv, ctx := setup(t)
	signIn(t, ctx, srv, "alice")
	run(t, ctx, "key list", chromedp.Navigate(srv.URL+"/console/keys?"+url.Values{"tenant": {consoletest.HostileBidiTenant}}.Encode()),
		chromedp.WaitVisible(css(`table.keys`)))
	const want = `acme\u202Egpj.exe`
	for _, page := range []string{"list", "key"} {
		if page == "key" {
			run(t, ctx, "key page",
				chromedp.Click(css(`a[href*="order-bidi"]`)),
				chromedp.WaitVisible(css(`dl.facts`)),
				screenshot("console-bidi"))
		}
		shown := get(t, ctx, chromedp.Evaluate[string](`document.querySelector("main").innerText`))
		if strings.ContainsRune(shown, '\u202E') || !strings.Contains(shown, want) {
			t.Errorf("the %s page shows the tenant as %q; want %q written out, and no override obeyed", page, shown, want)
		}
		isolated := get(t, ctx, chromedp.Evaluate[bool](`[...document.querySelectorAll("main .ctl")].every(el =>
			getComputedStyle(el.closest("bdi")).unicodeBidi === "isolate")`))
		controls := get(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("main .ctl").length`))
		if !isolated || controls == 0 {
			t.Errorf("the %s page marks %d controls, isolated %v", page, controls, isolated)
		}
	}
	if body := text(t, ctx, "main"); !strings.Contains(body, `\u202Eevil`) {
		t.Errorf("the stored request's override is not written out:\n%s", body)
	}
}

// The list as an operator reads it at 3 a.m.: how many, in which order,
// one line a key, the states named as the overview names them.
func TestTheListCountsSortsAndKeepsEachKeyOnOneLine(t *testing.T) {
	t.Parallel()
	f, srv, ctx := setup(t)
	long := "phase charged: " + strings.Repeat("the provider answered 503 Service Unavailable and a page of HTML; ", 12)
	if _, err := f.Pool.Exec(context.Background(), `UPDATE idempotency_keys SET last_error = $1 WHERE idempotency_key = 'order-dead'`, long); err != nil {
		t.Fatal(err)
	}
	signIn(t, ctx, srv, "alice")
	run(t, ctx, "the acme keys, oldest first",
		chromedp.Navigate(srv.URL+"/console/keys?tenant=acme&sort=oldest"),
		chromedp.WaitVisible(css(`table.keys`)),
		screenshot("console-keys-sorted"))
	total, rows := text(t, ctx, "p.total"), get(t, ctx, chromedp.Evaluate[[]string](
		`[...document.querySelectorAll("table.keys tbody tr")].map(tr => tr.cells[1].innerText)`))
	if !strings.Contains(total, "8 keys match") || len(rows) != 8 || rows[0] != "order-1" || rows[7] != "order-in-flight" {
		t.Fatalf("acme's keys oldest first: %q, rows %q; want 8, from order-1 to order-in-flight", total, rows)
	}
	states := get(t, ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("table.keys .st")].map(s => s.innerText)`))
	for _, s := range states {
		if !slices.Contains([]string{"finished", "in flight", "waiting", "stuck", "unknown", "dead"}, s) {
			t.Errorf("the list names a state %q, which the filter and the overview do not", s)
		}
	}
	if !slices.Contains(states, "stuck") || !slices.Contains(states, "dead") {
		t.Errorf("the list's states %q lack the stuck and the dead key", states)
	}
	// One line a key, the long error whole in its tooltip.
	heights := get(t, ctx, chromedp.Evaluate[[]float64](`[...document.querySelectorAll("table.keys tbody tr")].map(tr => tr.getBoundingClientRect().height)`))
	if slices.Max(heights) > 2*slices.Min(heights) || slices.Max(heights) > 48 {
		t.Errorf("row heights %v: a long error makes its row tall", heights)
	}
	if title := get(t, ctx, chromedp.Evaluate[string](`[...document.querySelectorAll("table.keys td.err")].map(td => td.title).find(t => t.length > 500) || ""`)); title != long {
		t.Errorf("the long error's tooltip is %q, want the whole error", title)
	}
	tips := get(t, ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("table.keys time")].map(el => el.title)`))
	if len(tips) != 8 || !strings.Contains(tips[0], "UTC") || !strings.Contains(tips[0], "your time:") {
		t.Errorf("the last-run tooltips are %q; want UTC and the reader's time", tips)
	}
	if n := get(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("a.clear").length`)); n != 1 {
		t.Errorf("a filtered list has %d clear-filters links, want 1", n)
	}

	run(t, ctx, "a filter nothing matches",
		chromedp.Navigate(srv.URL+"/console/keys?tenant=nobody"),
		chromedp.WaitVisible(css(`table.keys`)))
	if total, bulk := text(t, ctx, "p.total"), get(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("p.bulk a").length`)); !strings.Contains(total, "0 keys match") || bulk != 0 {
		t.Errorf("a filter that matches nothing: %q, %d bulk links; want 0 keys and no bulk link", total, bulk)
	}
}

// The key page says where it is, whose key it is, and what was stored.
func TestTheKeyPageHasItsTrailTenantHeadersAndLocalTimes(t *testing.T) {
	t.Parallel()
	_, srv, ctx := setup(t)
	signIn(t, ctx, srv, "alice")
	run(t, ctx, "a finished key",
		chromedp.Navigate(srv.URL+"/console/key?tenant=acme&key=order-1"),
		chromedp.WaitVisible(css(`nav.crumbs`)),
		screenshot("console-key-finished"))
	crumbs, heading, page := text(t, ctx, "nav.crumbs"), text(t, ctx, "main h1"), text(t, ctx, "main")
	if crumbs != "Overview › Keys › payments › tenant acme › order-1" || !strings.Contains(heading, "of tenant acme") {
		t.Errorf("trail %q, heading %q", crumbs, heading)
	}
	if !strings.Contains(page, "Content-Type") || !strings.Contains(page, "application/json") {
		t.Errorf("the stored response's headers are not shown:\n%s", page)
	}
	if n := get(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("dl.facts time.at + span.local").length`)); n != 3 {
		t.Errorf("%d of the created, last run and finished times show the reader's time, want 3", n)
	}
	run(t, ctx, "the trail back to the tenant's keys",
		chromedp.Click(css(`nav.crumbs a[href^="keys?tenant"]`)),
		chromedp.WaitVisible(css(`table.keys`)))
	if rows := text(t, ctx, "table.keys tbody"); !strings.Contains(rows, "order-2") || strings.Contains(rows, "globex") {
		t.Errorf("the trail's tenant link lists:\n%s", rows)
	}
	run(t, ctx, "a dead key",
		chromedp.Navigate(srv.URL+"/console/key?tenant=acme&key=order-dead"),
		chromedp.WaitVisible(css(`form#retry h3`)))
}

// The audit shows what an action changed, field by field, and filters by
// key, actor and action.
func TestTheAuditShowsEachChangeAndFilters(t *testing.T) {
	t.Parallel()
	f, srv, ctx := setup(t)
	ctx2 := phase.WithActor(context.Background(), "carol")
	if err := f.Client.Retry(ctx2, "acme", "order-dead"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Client.Unlock(phase.WithActor(context.Background(), "alice"), "acme", "order-in-flight"); err != nil {
		t.Fatal(err)
	}
	signIn(t, ctx, srv, "alice")
	run(t, ctx, "the audit", chromedp.Navigate(srv.URL+"/console/audit"), chromedp.WaitVisible(css(`table.audit`)),
		screenshot("console-audit"))
	changed := get(t, ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("table.audit > tbody > tr")].map(tr =>
		[...tr.querySelectorAll("td.change > table.diff th")].map(th => th.innerText.trim()).join(","))`))
	if len(changed) != 2 || !strings.Contains(changed[0], "● lock_expires_at") || !strings.Contains(changed[1], "● hold") {
		t.Fatalf("the changed fields marked are %q; want the unlock's lease, then the retry's hold", changed)
	}
	right := get(t, ctx, chromedp.Evaluate[float64](`Math.max(...[...document.querySelectorAll("table.audit td.given")].map(td => td.getBoundingClientRect().right))`))
	if right > 1280 {
		t.Errorf("the given column ends at %.0f px, off a 1280-pixel screen", right)
	}
	for query, want := range map[string][]string{
		"actor=carol":                     {"order-dead"},
		"action=unlock":                   {"order-in-flight"},
		"tenant=acme&key=order-dead":      {"order-dead"},
		"actor=alice&action=retry":        nil,
		"tenant=globex":                   nil,
		"tenant=acme&action=retry":        {"order-dead"},
		"tenant=acme&key=order-in-flight": {"order-in-flight"},
	} {
		run(t, ctx, "filter "+query, chromedp.Navigate(srv.URL+"/console/audit?"+query), chromedp.WaitVisible(css(`table.audit`)))
		got := get(t, ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("table.audit > tbody > tr td.key")].map(td => td.innerText.split(" / ")[1])`))
		if !slices.Equal(got, want) {
			t.Errorf("audit?%s lists %q, want %q", query, got, want)
		}
	}
}

// seedHour spreads 90 keys over the last hour: each first seen in a
// minute of it, two in three finished a minute later, every ninth held
// as dead.
func seedHour(t *testing.T, f *consoletest.Fixture) {
	t.Helper()
	ctx := context.Background()
	for i := range 90 {
		params := []byte(`{"item":"lamp","amount":1}`)
		fp, err := keyrow.Fingerprint("payments", params)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := store.Acquire(ctx, f.Pool, store.Request{Tenant: "seed", Key: fmt.Sprintf("seed-%02d", i), Workflow: "payments",
			Fingerprint: fp, Params: params, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	for _, sql := range []string{
		`UPDATE idempotency_keys SET created_at = now() - make_interval(mins => (substr(idempotency_key, 6)::int * 7) % 58 + 1),
		        lock_token = NULL, lock_expires_at = NULL, locked_at = NULL WHERE tenant = 'seed'`,
		`UPDATE idempotency_keys SET last_run_at = created_at WHERE tenant = 'seed'`,
		`UPDATE idempotency_keys SET finished_at = created_at + interval '1 minute', recovery_point = 'finished',
		        response_status = 201, response_body = '{}' WHERE tenant = 'seed' AND substr(idempotency_key, 6)::int % 3 <> 0`,
		`UPDATE idempotency_keys SET hold = 'dead', last_error = 'provider unavailable'
		  WHERE tenant = 'seed' AND substr(idempotency_key, 6)::int % 9 = 0`,
	} {
		if _, err := f.Pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTheOverviewDrawsTheLastHourPerMinute(t *testing.T) {
	t.Parallel()
	f, srv, ctx := setup(t)
	seedHour(t, f)
	signIn(t, ctx, srv, "alice")
	run(t, ctx, "overview", chromedp.Navigate(srv.URL+"/console/"), chromedp.WaitVisible(css(`svg.chart`)),
		screenshot("console-overview-chart"))
	lines := get(t, ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("svg.chart polyline")].map(p => p.classList[1] + ":" + p.points.length)`))
	if !slices.Equal(lines, []string{"started:61", "finished:61", "held:61"}) {
		t.Fatalf("the chart's lines are %q; want started, finished and held, a point a minute", lines)
	}
	sum := func(series string) int {
		return get(t, ctx, chromedp.Evaluate[int](`[...document.querySelectorAll("svg.chart circle.`+series+` title")]
			.map(el => parseInt(el.textContent.split(": ")[1])).reduce((a, b) => a + b, 0)`))
	}
	// The fixture's own keys are first seen now and its finished ones
	// finish now: five finished, ten started, three held (two unknown,
	// one dead), besides the seeded hour.
	if started, finished, held := sum("started"), sum("finished"), sum("held"); started != 90+11 || finished != 60+5 || held != 10+3 {
		t.Errorf("the chart counts %d started, %d finished, %d held; want 101, 65 and 13", started, finished, held)
	}
}

// Every page at a laptop's width and at a phone's: nothing runs off the
// side of the page (wide tables scroll in their own box).
func TestEveryPageFitsALaptopAndAPhone(t *testing.T) {
	t.Parallel()
	f, srv, ctx := setup(t)
	seedHour(t, f)
	if err := f.Client.Retry(phase.WithActor(context.Background(), "carol"), "acme", "order-dead"); err != nil {
		t.Fatal(err)
	}
	signIn(t, ctx, srv, "alice")
	pages := map[string]string{
		"overview": "/console/",
		"keys":     "/console/keys?tenant=acme",
		"key":      "/console/key?" + url.Values{"tenant": {"acme"}, "key": {f.UnknownKey}}.Encode(),
		"audit":    "/console/audit",
	}
	for _, width := range []int64{1280, 390} {
		for _, name := range []string{"overview", "keys", "key", "audit"} {
			run(t, ctx, name, chromedp.EmulateViewport(width, 844), chromedp.Navigate(srv.URL+pages[name]),
				chromedp.WaitVisible(css(`main h1`)), screenshot(fmt.Sprintf("console-%s-%d", name, width)))
			if over := get(t, ctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth`)); over > int(width) {
				t.Errorf("the %s page is %d px wide in a %d px window", name, over, width)
			}
		}
	}
}
