package console_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/console"
	"github.com/atomicphase/atomicphase/console/internal/consoletest"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// browser is an HTTP client signed in to the fixture's console as user.
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
}

func open(t *testing.T, h http.Handler, user string) *browser {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	b := &browser{t: t, base: srv.URL, c: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	if user != "" {
		b.get("/as?user=" + user)
	}
	return b
}

func (b *browser) do(req *http.Request) (int, string, http.Header) {
	b.t.Helper()
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	return resp.StatusCode, string(body), resp.Header
}

func (b *browser) get(path string) (int, string, http.Header) {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodGet, b.base+path, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	return b.do(req)
}

func (b *browser) post(path string, form url.Values) (int, string) {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	code, body, _ := b.do(req)
	return code, body
}

var (
	csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	seenField = regexp.MustCompile(`name="seen" value="([^"]+)"`)
)

// seen returns what the key's page puts in its forms of what it showed.
func (b *browser) seen(tenant, key string) string {
	b.t.Helper()
	_, body, _ := b.get("/console/key?" + url.Values{"tenant": {tenant}, "key": {key}}.Encode())
	m := seenField.FindStringSubmatch(body)
	if m == nil {
		b.t.Fatal("the key's page has no form that says what it showed")
	}
	return m[1]
}

// csrf returns the token the key's page puts in its forms: the one in its
// cookie, which a page without forms (a reader's) sets too.
func (b *browser) csrf(tenant, key string) string {
	b.t.Helper()
	_, body, _ := b.get("/console/key?" + url.Values{"tenant": {tenant}, "key": {key}}.Encode())
	u, err := url.Parse(b.base + "/console/")
	if err != nil {
		b.t.Fatal(err)
	}
	for _, c := range b.c.Jar.Cookies(u) {
		if c.Name != "atomicphase_console_csrf" {
			continue
		}
		if m := csrfField.FindStringSubmatch(body); m != nil && m[1] != c.Value {
			b.t.Fatalf("the forms carry %q, the cookie %q", m[1], c.Value)
		}
		return c.Value
	}
	b.t.Fatal("the key's page set no CSRF cookie")
	return ""
}

func TestEveryPageNeedsAUserTheAuthorizerLetsIn(t *testing.T) {
	t.Parallel()
	f := consoletest.New(t)
	h := f.Handler(t, false)
	for _, path := range []string{"/console/", "/console/keys", "/console/key?tenant=acme&key=order-1", "/console/audit"} {
		for user, want := range map[string]int{"": http.StatusForbidden, "mallory": http.StatusForbidden, "bob": http.StatusOK, "alice": http.StatusOK} {
			code, body, header := open(t, h, user).get(path)
			if code != want {
				t.Errorf("GET %s as %q = %d, want %d", path, user, code, want)
			}
			if csp := header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe") {
				t.Errorf("GET %s: Content-Security-Policy %q", path, csp)
			}
			if want == http.StatusForbidden && strings.Contains(body, "order-1") {
				t.Errorf("GET %s as %q refused but showed a key", path, user)
			}
		}
	}
	if _, err := console.New(console.Config{Client: f.Client}); err == nil {
		t.Error("New without an Authorizer succeeded, want an error")
	}
}

func TestAnActionNeedsTheCSRFTokenActAccessAndAWritableConsole(t *testing.T) {
	t.Parallel()
	f := consoletest.New(t)
	ctx := context.Background()
	form := url.Values{"tenant": {"acme"}, "key": {"order-in-flight"}, "confirm": {"yes"}}
	leased := func() bool {
		row, err := f.Client.Inspect(ctx, "acme", "order-in-flight")
		if err != nil {
			t.Fatal(err)
		}
		return row.LeaseExpiresAt != nil
	}

	alice := open(t, f.Handler(t, false), "alice")
	token := alice.csrf("acme", "order-in-flight")
	if code, _ := alice.post("/console/unlock", form); code != http.StatusForbidden || !leased() {
		t.Fatalf("unlock without the CSRF token = %d, leased %v; want 403 and the lease kept", code, leased())
	}
	forged := url.Values{"csrf": {strings.Repeat("A", 43)}}
	for k, v := range form {
		forged[k] = v
	}
	if code, _ := alice.post("/console/unlock", forged); code != http.StatusForbidden || !leased() {
		t.Fatalf("unlock with another token = %d; want 403", code)
	}

	bob := open(t, f.Handler(t, false), "bob")
	withToken := func(token string) url.Values {
		v := url.Values{"csrf": {token}}
		for k, vals := range form {
			v[k] = vals
		}
		return v
	}
	if code, _ := bob.post("/console/unlock", withToken(bob.csrf("acme", "order-in-flight"))); code != http.StatusForbidden || !leased() {
		t.Fatalf("unlock by a reader = %d; want 403", code)
	}
	readOnly := open(t, f.Handler(t, true), "alice")
	if code, _ := readOnly.post("/console/unlock", withToken(readOnly.csrf("acme", "order-2"))); code != http.StatusForbidden || !leased() {
		t.Fatalf("unlock on a read-only console = %d; want 403", code)
	}
	if _, body, _ := readOnly.get("/console/key?tenant=acme&key=order-in-flight"); strings.Contains(body, `action="unlock"`) {
		t.Fatal("the read-only console offers an unlock")
	}

	fresh := withToken(token)
	fresh.Set("seen", alice.seen("acme", "order-in-flight"))
	if code, _ := alice.post("/console/unlock", fresh); code != http.StatusSeeOther || leased() {
		t.Fatalf("unlock with the token = %d, leased %v; want 303 and the lease freed", code, leased())
	}
	entries, err := f.Client.Audit(ctx, keyrow.AuditFilter{Limit: 10})
	if err != nil || len(entries) != 1 || entries[0].Actor != "alice" || entries[0].Action != keyrow.ActionUnlock {
		t.Fatalf("audit = %+v, %v; want alice's unlock alone", entries, err)
	}
}

func TestHostileStoredValuesAreEscapedOnEveryPage(t *testing.T) {
	t.Parallel()
	f := consoletest.New(t)
	alice := open(t, f.Handler(t, false), "alice")
	pages := []string{"/console/", "/console/keys", "/console/keys?state=unknown", "/console/keys?tenant=" + url.QueryEscape(consoletest.HostileTenant)}
	for _, tk := range [][2]string{{consoletest.HostileTenant, "order-h1"}, {"acme", consoletest.HostileKey}, {"acme", consoletest.HostileURLKey}} {
		pages = append(pages, "/console/key?"+url.Values{"tenant": {tk[0]}, "key": {tk[1]}}.Encode())
	}
	for _, p := range pages {
		code, body, _ := alice.get(p)
		if code != http.StatusOK {
			t.Fatalf("GET %s = %d", p, code)
		}
		for _, raw := range []string{"<script>window", "<img src=x", `href="javascript:`, "</pre><script>"} {
			if strings.Contains(body, raw) {
				t.Errorf("GET %s: the page holds %q unescaped", p, raw)
			}
		}
	}
}

func TestResolvingAsHappenedFromTheKeyPageFinishesTheKey(t *testing.T) {
	t.Parallel()
	f := consoletest.New(t)
	alice := open(t, f.Handler(t, false), "alice")
	form := url.Values{"csrf": {alice.csrf("acme", f.UnknownKey)}, "tenant": {"acme"}, "key": {f.UnknownKey},
		"at": {"order_created"}, "outcome": {"happened"}, "confirm": {"yes"}, "seen": {alice.seen("acme", f.UnknownKey)}}

	form.Set("output", `{"chargeid":"ch_typo"}`)
	if code, body := alice.post("/console/resolve", form); code != http.StatusUnprocessableEntity || !strings.Contains(body, "unknown field") {
		t.Fatalf("resolve with a misspelt field = %d; want 422 naming the field", code)
	}
	form.Set("output", `{"charge_id":"ch_from_dashboard"}`)
	if code, _ := alice.post("/console/resolve", form); code != http.StatusSeeOther {
		t.Fatalf("resolve = %d, want 303", code)
	}
	row, err := f.Client.Inspect(context.Background(), "acme", f.UnknownKey)
	if err != nil {
		t.Fatal(err)
	}
	if row.RecoveryPoint != keyrow.Finished || !strings.Contains(string(row.ResponseBody), "ch_from_dashboard") {
		t.Fatalf("after resolving: %s %s; want finished with the operator's charge", row.RecoveryPoint, row.ResponseBody)
	}
}

// An Unlock form loaded while the key's lease had expired is submitted
// after a new run took a ten-minute lease.
func TestAnUnlockFormFromBeforeANewLeaseIsRefusedAndTheLeaseKept(t *testing.T) {
	t.Parallel()
	f := consoletest.New(t)
	ctx := context.Background()
	if _, err := f.Pool.Exec(ctx, `UPDATE idempotency_keys SET lock_expires_at = now() - interval '1 minute'
		WHERE tenant = 'acme' AND idempotency_key = 'order-in-flight'`); err != nil {
		t.Fatal(err)
	}
	alice := open(t, f.Handler(t, false), "alice")
	form := url.Values{"csrf": {alice.csrf("acme", "order-in-flight")}, "tenant": {"acme"}, "key": {"order-in-flight"},
		"confirm": {"yes"}, "seen": {alice.seen("acme", "order-in-flight")}}
	if run, err := store.ClaimKey(ctx, f.Pool, "acme", "order-in-flight", 10*time.Minute); err != nil || run == nil {
		t.Fatalf("the new run's claim = %+v, %v", run, err)
	}
	taken, err := f.Client.Inspect(ctx, "acme", "order-in-flight")
	if err != nil {
		t.Fatal(err)
	}
	kept := func() bool {
		row, err := f.Client.Inspect(ctx, "acme", "order-in-flight")
		if err != nil {
			t.Fatal(err)
		}
		return row.LeaseLeft >= 9*time.Minute && row.LeaseTakenAt.Equal(*taken.LeaseTakenAt)
	}

	code, body := alice.post("/console/unlock", form)
	if code != http.StatusConflict || !strings.Contains(body, "took the lease again") || !kept() {
		t.Fatalf("stale unlock = %d, lease kept %v; want 409 saying a run took the lease, and the lease kept:\n%s", code, kept(), body)
	}
	entries, err := f.Client.Audit(ctx, keyrow.AuditFilter{Limit: 10})
	if err != nil || len(entries) != 1 || entries[0].Actor != "alice" || entries[0].Action != keyrow.ActionUnlock || entries[0].Refused == "" {
		t.Fatalf("audit = %+v, %v; want alice's unlock, refused", entries, err)
	}
	form.Del("seen")
	if code, _ := alice.post("/console/unlock", form); code != http.StatusBadRequest || !kept() {
		t.Fatalf("unlock without what the page showed = %d, lease kept %v; want 400 and the lease kept", code, kept())
	}
}

// Two operators load the page of one unknown key; one records that the
// charge happened, then the other that it did not.
func TestASecondResolutionFromAnOlderPageIsRefusedWith409(t *testing.T) {
	t.Parallel()
	f := consoletest.New(t)
	ctx := context.Background()
	h := f.Handler(t, false)
	alice, carol := open(t, h, "alice"), open(t, h, "alice")
	form := func(b *browser, outcome string) url.Values {
		return url.Values{"csrf": {b.csrf("acme", f.UnknownKey)}, "tenant": {"acme"}, "key": {f.UnknownKey},
			"at": {"order_created"}, "outcome": {outcome}, "confirm": {"yes"}, "seen": {b.seen("acme", f.UnknownKey)}}
	}
	happened, notHappened := form(alice, "happened"), form(carol, "not_happened")
	happened.Set("output", `{"charge_id":"ch_from_dashboard"}`)

	if code, _ := alice.post("/console/resolve", happened); code != http.StatusSeeOther {
		t.Fatalf("first resolve = %d, want 303", code)
	}
	code, body := carol.post("/console/resolve", notHappened)
	if code != http.StatusConflict || !strings.Contains(body, "changed since your page showed it") {
		t.Fatalf("second resolve = %d; want 409 saying what changed:\n%s", code, body)
	}
	row, err := f.Client.Inspect(ctx, "acme", f.UnknownKey)
	if err != nil || row.RecoveryPoint != keyrow.Finished || !strings.Contains(string(row.ResponseBody), "ch_from_dashboard") {
		t.Fatalf("key = %+v, %v; want finished with the first resolution's charge", row, err)
	}
	entries, err := f.Client.Audit(ctx, keyrow.AuditFilter{Limit: 10})
	if err != nil || len(entries) != 2 || entries[0].Refused == "" || entries[1].Refused != "" {
		t.Fatalf("audit = %+v, %v; want the resolution, then the refused one", entries, err)
	}
	var given struct {
		Happened bool `json:"happened"`
	}
	if err := json.Unmarshal(entries[0].Detail, &given); err != nil || given.Happened {
		t.Fatalf("refused entry's detail %s: want the not-happened resolution it was given", entries[0].Detail)
	}
}

func TestAnOversizedFormIsRefusedWith413AndSaysSo(t *testing.T) {
	t.Parallel()
	f := consoletest.New(t)
	alice := open(t, f.Handler(t, false), "alice")
	form := url.Values{"csrf": {alice.csrf("acme", "order-in-flight")}, "tenant": {"acme"}, "key": {"order-in-flight"},
		"confirm": {"yes"}, "seen": {alice.seen("acme", "order-in-flight")}, "output": {strings.Repeat("x", 2<<20)}}
	code, body := alice.post("/console/unlock", form)
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(body, "larger than the console accepts") || strings.Contains(body, "security token") {
		t.Fatalf("a 2 MiB form = %d:\n%s\nwant 413 saying the form is too large", code, body)
	}
	if row, err := f.Client.Inspect(context.Background(), "acme", "order-in-flight"); err != nil || row.LeaseExpiresAt == nil {
		t.Fatalf("the refused form freed the lease: %+v, %v", row, err)
	}
}
