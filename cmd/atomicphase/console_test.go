package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/atomicphase/atomicphase/internal/browser"
)

// served is a running 'atomicphase console'.
type served struct {
	url   string // http://127.0.0.1:PORT/
	port  string
	token string // empty with -no-auth
}

// serveConsole runs 'atomicphase console' with args on a free port of
// 127.0.0.1 until the test ends.
func serveConsole(t *testing.T, dsn string, args ...string) served {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	out, w := io.Pipe()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var stderr strings.Builder
		code := run(ctx, append([]string{"console", "-database-url", dsn, "-listen", "127.0.0.1:0"}, args...), w, &stderr, func(string) string { return "" })
		w.CloseWithError(io.EOF)
		if code != exitOK {
			t.Errorf("atomicphase console = %d:\n%s", code, stderr.String())
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	lines := bufio.NewScanner(out)
	var s served
	for s.url == "" || (s.token == "" && !strings.Contains(strings.Join(args, " "), "-no-auth")) {
		if !lines.Scan() {
			t.Fatalf("atomicphase console printed no address and token: %v", lines.Err())
		}
		if m := regexp.MustCompile(`on (http://127\.0\.0\.1:(\d+)/)`).FindStringSubmatch(lines.Text()); m != nil {
			s.url, s.port = m[1], m[2]
		}
		if m := regexp.MustCompile(`the token (\S+)`).FindStringSubmatch(lines.Text()); m != nil {
			s.token = m[1]
		}
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return s
}

// get sends a GET to the console with the headers given (Host among
// them), following no redirect.
func (s served) get(t *testing.T, path string, header http.Header) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.url+strings.TrimPrefix(path, "/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if h := header.Get("Host"); h != "" {
		req.Host = h
	}
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp
}

func TestTheConsoleRefusesAHostItDoesNotServeInEveryMode(t *testing.T) {
	t.Parallel()
	dsn, _ := setup(t)
	for _, mode := range [][]string{{"-no-auth"}, {}, {"-read-only"}} {
		s := serveConsole(t, dsn, mode...)
		auth := http.Header{}
		if s.token != "" {
			auth.Set("Authorization", "Bearer "+s.token)
		}
		for host, want := range map[string]int{
			"rebind.example:" + s.port:   http.StatusMisdirectedRequest,
			"127.0.0.1.nip.io:" + s.port: http.StatusMisdirectedRequest,
			"127.0.0.1:1":                http.StatusMisdirectedRequest,
			"localhost":                  http.StatusMisdirectedRequest,
			"127.0.0.1:" + s.port:        http.StatusOK,
			"localhost:" + s.port:        http.StatusOK,
			"[::1]:" + s.port:            http.StatusOK,
		} {
			h := auth.Clone()
			h.Set("Host", host)
			if resp := s.get(t, "/keys", h); resp.StatusCode != want {
				t.Errorf("console %q: GET /keys with Host %q = %d, want %d", mode, host, resp.StatusCode, want)
			}
		}
	}
}

func TestEveryPageOfTheConsoleCarriesTheSecurityHeaders(t *testing.T) {
	t.Parallel()
	dsn, _ := setup(t)
	s := serveConsole(t, dsn)
	bearer := http.Header{"Authorization": {"Bearer " + s.token}}
	for _, c := range []struct {
		path   string
		header http.Header
		want   int
	}{
		{"/signin", nil, http.StatusOK},
		{"/keys", nil, http.StatusSeeOther},
		{"/keys", bearer, http.StatusOK},
		{"/", bearer, http.StatusOK},
		{"/keys", http.Header{"Authorization": {"Bearer wrong"}}, http.StatusSeeOther},
		{"/keys", http.Header{"Host": {"rebind.example:" + s.port}}, http.StatusMisdirectedRequest},
	} {
		resp := s.get(t, c.path, c.header)
		if resp.StatusCode != c.want {
			t.Errorf("GET %s = %d, want %d", c.path, resp.StatusCode, c.want)
		}
		for name, want := range map[string]string{"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
			"Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"} {
			if got := resp.Header.Get(name); got != want {
				t.Errorf("GET %s (%d): %s = %q, want %q", c.path, resp.StatusCode, name, got, want)
			}
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("GET %s: Content-Security-Policy %q", c.path, csp)
		}
	}

	big := url.Values{"token": {strings.Repeat("x", 2<<20)}}.Encode()
	req, err := http.NewRequest(http.MethodPost, s.url+"signin", strings.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(body), "larger than sign-in accepts") {
		t.Errorf("a 2 MiB sign-in = %d:\n%s\nwant 413 saying so", resp.StatusCode, body)
	}
}

// An operator signs in to two consoles on one host, then visits another
// web server on it: the server receives no token, and each console keeps
// its sign-in.
func TestTheConsolesCookiesGiveAnotherPortNoTokenAndNoSignOut(t *testing.T) {
	t.Parallel()
	dsn, _ := setup(t)
	a, b := serveConsole(t, dsn), serveConsole(t, dsn)
	var (
		mu       sync.Mutex
		received []string
	)
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		received = append(received, r.Header.Get("Cookie"))
		mu.Unlock()
		_, _ = io.WriteString(w, "<!doctype html><title>another server</title><p>another server</p>")
	}))
	t.Cleanup(other.Close)
	ctx := browser.Start(t, 1280, 800)

	signIn := func(s served) {
		t.Helper()
		err := chromedp.Do(ctx,
			chromedp.Navigate(s.url+"keys"),
			chromedp.WaitVisible(chromedp.CSS(`input[name=token]`)),
			chromedp.SendKeys(chromedp.CSS(`input[name=token]`), s.token),
			chromedp.Submit(chromedp.CSS(`input[name=token]`)),
			chromedp.WaitVisible(chromedp.CSS(`table.counts`)))
		if err != nil {
			t.Fatalf("sign in at %s: %v", s.url, err)
		}
	}
	signIn(a)
	signIn(b)
	if err := chromedp.Do(ctx, chromedp.Navigate(other.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`p`))); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	cookies := strings.Join(received, "; ")
	mu.Unlock()
	if cookies == "" {
		t.Log("the other server received no cookie")
	}
	for _, s := range []served{a, b} {
		if strings.Contains(cookies, s.token) {
			t.Errorf("the server on another port received the token of the console on port %s: %q", s.port, cookies)
		}
		if !strings.Contains(cookies, "atomicphase_console_"+s.port+"_session=") {
			t.Errorf("the cookies %q have no session of the console on port %s: the check above saw nothing", cookies, s.port)
		}
	}

	// Signing in at b did not sign a out: a still serves its pages.
	if err := chromedp.Do(ctx, chromedp.Navigate(a.url+"keys"), chromedp.WaitVisible(chromedp.CSS(`main h1`))); err != nil {
		t.Fatal(err)
	}
	page, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(page, "/keys") {
		t.Fatalf("after signing in at port %s, the console on port %s sent the browser to %s", b.port, a.port, page)
	}
}

// A page on another name that resolves to the console's address (DNS
// rebinding, here by Chromium's resolver rules) gets a refusal, not the
// console.
func TestAPageOnARebindingNameGetsNoConsole(t *testing.T) {
	t.Parallel()
	dsn, _ := setup(t)
	s := serveConsole(t, dsn, "-no-auth")
	ctx := browser.Start(t, 1280, 800, chromedp.Flag("host-resolver-rules", "MAP rebind.example 127.0.0.1"))
	err := chromedp.Do(ctx,
		chromedp.Navigate("http://rebind.example:"+s.port+"/keys"),
		chromedp.WaitReady(chromedp.CSS(`body`)),
		browser.Screenshot("console-rebinding-refused"))
	if err != nil {
		t.Fatal(err)
	}
	text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`body`)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "does not serve the host") || strings.Contains(text, "Keys") {
		t.Fatalf("the rebinding name shows:\n%s\nwant a refusal", text)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(s.url+"keys"), chromedp.WaitVisible(chromedp.CSS(`table.keys`))); err != nil {
		t.Fatalf("the console's own address: %v", err)
	}
}
