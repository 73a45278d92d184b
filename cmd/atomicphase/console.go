package main

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/atomicphase/atomicphase/console"
	"github.com/atomicphase/atomicphase/phase"
)

// consoleTokenEnv names the environment variable that may hold the
// console's sign-in token.
const consoleTokenEnv = "ATOMICPHASE_CONSOLE_TOKEN"

func defineConsole(fs *flag.FlagSet) action {
	listen := fs.String("listen", "127.0.0.1:8080", "the `address` to serve on; keep it on localhost unless a proxy adds TLS and authentication")
	readOnly := fs.Bool("read-only", false, "serve the pages without any action")
	noAuth := fs.Bool("no-auth", false, "let anyone who reaches the address in, without a token")
	return func(ctx context.Context, s *session, _ []string) error {
		token := os.Getenv(consoleTokenEnv)
		if *noAuth && token != "" {
			return usagef("-no-auth and $%s contradict each other", consoleTokenEnv)
		}
		c, err := s.client(ctx, phase.Config{})
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return err
		}
		addr := ln.Addr().(*net.TCPAddr)
		// Browsers send a host's cookies to every port of it: the names
		// carry the port, so that two consoles on one host keep their
		// own.
		cookies := "atomicphase_console_" + strconv.Itoa(addr.Port)
		cfg := console.Config{Client: c, ReadOnly: *readOnly, CSRFCookie: cookies + "_csrf",
			Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}
		var sessions *signIns
		if *noAuth {
			cfg.Authorizer = console.AuthorizerFunc(func(*http.Request) (console.Principal, error) {
				return console.Principal{Name: s.actor, Access: console.Act}, nil
			})
		} else {
			if token == "" {
				token = secret(24)
			}
			sessions = &signIns{token: token, cookie: cookies + "_session", live: map[string]time.Time{}}
			cfg.Authorizer = sessions.authorizer(s.actor)
		}
		h, err := console.New(cfg)
		if err != nil {
			_ = ln.Close()
			return err
		}
		if sessions != nil {
			h = sessions.front(h)
		}
		h = onlyHosts(h, *listen, addr)
		fmt.Fprintf(s.stdout, "serving the console on http://%s/\n", ln.Addr())
		if !*noAuth && os.Getenv(consoleTokenEnv) == "" {
			fmt.Fprintf(s.stdout, "sign in with the token %s (set $%s to choose your own)\n", token, consoleTokenEnv)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}

// secret returns n random bytes, base64url-encoded.
func secret(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// onlyHosts answers 421 Misdirected Request to a request whose Host names
// something other than the address the console listens on: a page on
// another name that resolves to this address (DNS rebinding) shares no
// origin with the console, but without this check its script could read
// the console's pages and post its forms, whatever the mode. The console
// answers to the port it listens on, under the host written in -listen,
// the localhost names, and the IP addresses that reach it: the listen
// address itself, any loopback address when it is a loopback one, and
// any address when it listens on all of them. A DNS name other than
// localhost is served only when -listen names it.
func onlyHosts(next http.Handler, listen string, addr *net.TCPAddr) http.Handler {
	listenHost, _, _ := net.SplitHostPort(listen)
	listenHost = strings.ToLower(strings.TrimSuffix(listenHost, "."))
	served := func(hostport string) bool {
		host, port, err := net.SplitHostPort(hostport)
		if err != nil || port != strconv.Itoa(addr.Port) {
			return false
		}
		host = strings.ToLower(strings.TrimSuffix(host, "."))
		if host == "localhost" || strings.HasSuffix(host, ".localhost") || (host != "" && host == listenHost) {
			return true
		}
		ip := net.ParseIP(host)
		return ip != nil && (addr.IP.IsUnspecified() || ip.Equal(addr.IP) || (addr.IP.IsLoopback() && ip.IsLoopback()))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		console.SetSecurityHeaders(w.Header())
		if !served(r.Host) {
			http.Error(w, "This console does not serve the host "+strconv.Quote(r.Host)+
				"; open it at the address 'atomicphase console' printed.", http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// sessionTTL is how long a sign-in lasts: an on-call shift.
const sessionTTL = 12 * time.Hour

// maxSignIn is the largest sign-in form read.
const maxSignIn = 4 << 10

// signIns lets in the requests that carry the token as an "Authorization:
// Bearer" header, or the cookie of a sign-in made with it. The cookie
// holds a random session, never the token: browsers send a host's
// cookies to every port of it, so any web server on the host receives
// it, and what it receives must not outlive this process nor open
// another console. A session lasts sessionTTL and ends with the process.
type signIns struct {
	token  string
	cookie string
	mu     sync.Mutex
	live   map[string]time.Time // session → when it ends
}

// start records a new session and returns it.
func (s *signIns) start() string {
	id := secret(32)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for id, end := range s.live {
		if now.After(end) {
			delete(s.live, id)
		}
	}
	s.live[id] = now.Add(sessionTTL)
	return id
}

// signedIn reports whether r carries the token or a live session.
func (s *signIns) signedIn(r *http.Request) bool {
	if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return subtle.ConstantTimeCompare([]byte(bearer), []byte(s.token)) == 1
	}
	ck, err := r.Cookie(s.cookie)
	if err != nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	end, ok := s.live[ck.Value]
	return ok && time.Now().Before(end)
}

func (s *signIns) authorizer(actor string) console.Authorizer {
	return console.AuthorizerFunc(func(r *http.Request) (console.Principal, error) {
		if !s.signedIn(r) {
			return console.Principal{}, errors.New("not signed in")
		}
		return console.Principal{Name: actor, Access: console.Act}, nil
	})
}

var signInPage = template.Must(template.New("signin").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sign in · atomicphase</title>
<link rel="stylesheet" href="static/style.css"></head>
<body><main><h1>atomicphase console</h1>
{{if .}}<p class="error" role="alert">{{.}}</p>{{end}}
<form method="post" action="signin" class="action">
<label>Token, as 'atomicphase console' printed it <input type="password" name="token" autocomplete="off" required autofocus></label>
<button type="submit">Sign in</button>
</form></main></body></html>`))

// front puts a sign-in page in front of the console: a page request not
// signed in is sent to it, and the page starts a session once the token
// given matches.
func (s *signIns) front(next http.Handler) http.Handler {
	protect := http.NewCrossOriginProtection()
	show := func(w http.ResponseWriter, status int, msg string) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(status)
		_ = signInPage.Execute(w, msg)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/signin" && r.Method == http.MethodPost:
			if protect.Check(r) != nil {
				show(w, http.StatusForbidden, "Cross-origin sign-in refused.")
				return
			}
			r.Body = http.MaxBytesReader(w, r.Body, maxSignIn)
			if err := r.ParseForm(); err != nil {
				if tooLarge := new(http.MaxBytesError); errors.As(err, &tooLarge) {
					show(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("The form is larger than sign-in accepts (%d KiB).", maxSignIn>>10))
					return
				}
				show(w, http.StatusBadRequest, "The form could not be read.")
				return
			}
			if subtle.ConstantTimeCompare([]byte(r.PostFormValue("token")), []byte(s.token)) != 1 {
				show(w, http.StatusUnauthorized, "That is not the token.")
				return
			}
			http.SetCookie(w, &http.Cookie{Name: s.cookie, Value: s.start(), Path: "/", MaxAge: int(sessionTTL / time.Second),
				HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
			http.Redirect(w, r, "./", http.StatusSeeOther)
		case r.URL.Path == "/signin":
			show(w, http.StatusOK, "")
		case r.Method == http.MethodGet && !strings.HasPrefix(r.URL.Path, "/static/") && !s.signedIn(r):
			http.Redirect(w, r, "/signin", http.StatusSeeOther)
		default:
			// The console refuses what is not signed in.
			next.ServeHTTP(w, r)
		}
	})
}
