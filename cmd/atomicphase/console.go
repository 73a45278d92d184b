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
	"strings"
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
		var auth console.Authorizer
		if *noAuth {
			auth = console.AuthorizerFunc(func(*http.Request) (console.Principal, error) {
				return console.Principal{Name: s.actor, Access: console.Act}, nil
			})
		} else {
			if token == "" {
				var b [24]byte
				_, _ = rand.Read(b[:])
				token = base64.RawURLEncoding.EncodeToString(b[:])
			}
			auth = console.Token(token, s.actor)
		}
		h, err := console.New(console.Config{Client: c, Authorizer: auth, ReadOnly: *readOnly,
			Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
		if err != nil {
			return err
		}
		if !*noAuth {
			h = signIn(h, token)
		}
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return err
		}
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

var signInPage = template.Must(template.New("signin").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sign in · atomicphase</title>
<link rel="stylesheet" href="static/style.css"></head>
<body><main><h1>atomicphase console</h1>
{{if .}}<p class="error">{{.}}</p>{{end}}
<form method="post" action="signin" class="action">
<label>Token, as 'atomicphase console' printed it <input type="password" name="token" autocomplete="off" required autofocus></label>
<button type="submit">Sign in</button>
</form></main></body></html>`))

// signIn puts a sign-in page in front of the console: a request without
// the token's cookie is sent to it, and the page sets the cookie once the
// token given matches.
func signIn(next http.Handler, token string) http.Handler {
	protect := http.NewCrossOriginProtection()
	show := func(w http.ResponseWriter, status int, msg string) {
		w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; form-action 'self'; frame-ancestors 'none'")
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
			if subtle.ConstantTimeCompare([]byte(r.PostFormValue("token")), []byte(token)) != 1 {
				show(w, http.StatusUnauthorized, "That is not the token.")
				return
			}
			http.SetCookie(w, &http.Cookie{Name: console.TokenCookie, Value: token, Path: "/", HttpOnly: true,
				Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
			http.Redirect(w, r, "./", http.StatusSeeOther)
		case r.URL.Path == "/signin" || strings.HasPrefix(r.URL.Path, "/static/"):
			if r.URL.Path == "/signin" {
				show(w, http.StatusOK, "")
				return
			}
			next.ServeHTTP(w, r)
		default:
			if ck, err := r.Cookie(console.TokenCookie); err != nil || subtle.ConstantTimeCompare([]byte(ck.Value), []byte(token)) != 1 {
				if r.Method == http.MethodGet {
					http.Redirect(w, r, "/signin", http.StatusSeeOther)
					return
				}
			}
			next.ServeHTTP(w, r)
		}
	})
}
