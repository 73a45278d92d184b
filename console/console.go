package console

import (
	"cmp"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"

	"github.com/atomicphase/atomicphase/phase"
)

// Access is what a person may do in the console.
type Access int

// The levels of access. The zero Access lets nobody in.
const (
	// Read lets a person see every page.
	Read Access = iota + 1
	// Act lets a person also unlock, retry and resolve keys.
	Act
)

// Principal is the person behind a request, as the Authorizer names them.
type Principal struct {
	// Name is recorded in the audit of every action they take.
	Name   string
	Access Access
}

// Authorizer tells who makes a request and what they may do. An error, or
// a Principal without Access, refuses the request with 403 Forbidden; the
// error's text is not shown.
type Authorizer interface {
	Authorize(r *http.Request) (Principal, error)
}

// AuthorizerFunc adapts a function to Authorizer.
type AuthorizerFunc func(r *http.Request) (Principal, error)

// Authorize calls f.
func (f AuthorizerFunc) Authorize(r *http.Request) (Principal, error) { return f(r) }

// TokenCookie is the cookie Token reads. Browsers send a host's cookies
// to every port of it: an application that serves two consoles on one host
// name with Token gives each its own host name.
const TokenCookie = "atomicphase_console_token"

// Token returns an Authorizer that lets in, as name with Act access, the
// requests that carry token in the TokenCookie cookie or as an
// "Authorization: Bearer" header, and refuses the others. An empty token
// refuses every request.
func Token(token, name string) Authorizer {
	return AuthorizerFunc(func(r *http.Request) (Principal, error) {
		given := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		if c, err := r.Cookie(TokenCookie); err == nil {
			given = c.Value
		}
		if token == "" || subtle.ConstantTimeCompare([]byte(given), []byte(token)) != 1 {
			return Principal{}, errors.New("console: no valid token")
		}
		return Principal{Name: name, Access: Act}, nil
	})
}

// Config configures the console.
type Config struct {
	// Client is the application's client (or one with no workflows, as the
	// command line's). With the workflows registered, a key's page lists
	// its phases and downstream keys, and a resolution's output is checked
	// against the phase's output type and the key run at once. Required.
	Client *phase.Client
	// Authorizer lets requests in. Required: there is no anonymous access
	// unless the application supplies an Authorizer that allows it.
	Authorizer Authorizer
	// ReadOnly removes every action, whatever a person's Access.
	ReadOnly bool
	// Logger receives the console's errors. Defaults to slog.Default().
	Logger *slog.Logger
	// CSRFCookie names the cookie that holds the token every form echoes.
	// Browsers send a host's cookies to every port of it, so consoles
	// served on one host name by different ports each need a name of
	// their own. Defaults to "atomicphase_console_csrf".
	CSRFCookie string
}

// DefaultCSRFCookie is the name of Config.CSRFCookie when it is empty.
const DefaultCSRFCookie = "atomicphase_console_csrf"

// maxForm is the largest form an action accepts.
const maxForm = 1 << 20

//go:embed templates static
var files embed.FS

// SetSecurityHeaders sets the headers that every response of the console
// carries: a Content-Security-Policy that allows the console's own script
// and style files and nothing else (no inline script or style, no other
// origin, no framing, forms posting only to the console), nosniff, no
// framing, no referrer and no caching. A page served in front of the
// console, as a sign-in page, sets them too.
func SetSecurityHeaders(h http.Header) {
	for k, v := range securityHeaders {
		h.Set(k, v)
	}
}

var securityHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
	"X-Content-Type-Options": "nosniff",
	"X-Frame-Options":        "DENY",
	"Referrer-Policy":        "no-referrer",
	"Cache-Control":          "no-store",
}

// console serves the pages.
type console struct {
	cfg   Config
	pages map[string]*template.Template
}

// New returns the console's handler. Mount it at a path of its own, with
// the prefix stripped (http.StripPrefix): its links are relative, so it
// works under any prefix that ends in a slash.
func New(cfg Config) (http.Handler, error) {
	if cfg.Client == nil {
		return nil, errors.New("console: Config.Client is required")
	}
	if cfg.Authorizer == nil {
		return nil, errors.New("console: Config.Authorizer is required; the console has no anonymous access")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.CSRFCookie = cmp.Or(cfg.CSRFCookie, DefaultCSRFCookie)
	c := &console{cfg: cfg, pages: map[string]*template.Template{}}
	for _, name := range []string{"overview", "keys", "key", "bulk", "audit", "error"} {
		t, err := template.New("layout.html").Funcs(funcs).Funcs(template.FuncMap{"state": cfg.Client.StatusOf}).ParseFS(files, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: %w", err)
		}
		c.pages[name] = t
	}
	static, err := fs.Sub(files, "static")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.Handle("GET /{$}", c.reader(c.overview))
	mux.Handle("GET /keys", c.reader(c.keys))
	mux.Handle("GET /key", c.reader(c.key))
	mux.Handle("GET /bulk", c.reader(c.bulkPreview))
	mux.Handle("GET /audit", c.reader(c.audit))
	mux.Handle("POST /unlock", c.actor(c.unlock))
	mux.Handle("POST /retry", c.actor(c.retry))
	mux.Handle("POST /resolve", c.actor(c.resolve))
	mux.Handle("POST /bulk", c.actor(c.bulk))
	protect := http.NewCrossOriginProtection()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		SetSecurityHeaders(w.Header())
		if err := protect.Check(r); err != nil {
			c.fail(w, r, nil, http.StatusForbidden, "Cross-origin requests are refused.")
			return
		}
		mux.ServeHTTP(w, r)
	}), nil
}

// request is one authorized request.
type request struct {
	who  Principal
	csrf string
}

type handler func(w http.ResponseWriter, r *http.Request, rq *request)

// authorize lets a request in when the Authorizer allows at least need.
func (c *console) authorize(w http.ResponseWriter, r *http.Request, need Access) (*request, bool) {
	who, err := c.cfg.Authorizer.Authorize(r)
	if err != nil || who.Access < need || who.Access > Act {
		status := http.StatusForbidden
		msg := "You are not allowed to see this console."
		if err == nil && who.Access >= Read {
			msg = "You may look but not act."
		}
		if c.cfg.ReadOnly && err == nil && who.Access >= Read {
			msg = "This console is read-only."
		}
		c.fail(w, r, nil, status, msg)
		return nil, false
	}
	rq := &request{who: who}
	if ck, err := r.Cookie(c.cfg.CSRFCookie); err == nil && len(ck.Value) == 43 {
		rq.csrf = ck.Value
	} else {
		var b [32]byte
		_, _ = rand.Read(b[:])
		rq.csrf = base64.RawURLEncoding.EncodeToString(b[:])
		http.SetCookie(w, &http.Cookie{Name: c.cfg.CSRFCookie, Value: rq.csrf, Path: "/", HttpOnly: true,
			Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	}
	return rq, true
}

// reader serves a page to anyone the Authorizer lets read.
func (c *console) reader(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rq, ok := c.authorize(w, r, Read); ok {
			h(w, r, rq)
		}
	})
}

// actor serves an action to those who may act, unless the console is
// read-only, once the form's CSRF token matches the cookie's.
func (c *console) actor(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		need := Act
		if c.cfg.ReadOnly {
			need = Act + 1
		}
		rq, ok := c.authorize(w, r, need)
		if !ok {
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxForm)
		if err := r.ParseForm(); err != nil {
			if tooLarge := new(http.MaxBytesError); errors.As(err, &tooLarge) {
				c.fail(w, r, rq, http.StatusRequestEntityTooLarge, fmt.Sprintf(
					"The form is larger than the console accepts (%d KiB); nothing changed.", maxForm>>10))
				return
			}
			c.fail(w, r, rq, http.StatusBadRequest, "The form could not be read; nothing changed.")
			return
		}
		form := r.PostFormValue("csrf")
		ck, err := r.Cookie(c.cfg.CSRFCookie)
		if err != nil || form == "" || subtle.ConstantTimeCompare([]byte(form), []byte(ck.Value)) != 1 {
			c.fail(w, r, rq, http.StatusForbidden, "The form's security token is missing or stale; reload the page and try again.")
			return
		}
		h(w, r, rq)
	})
}

// view is what every page template gets.
type view struct {
	Title    string
	Who      Principal
	CanAct   bool
	ReadOnly bool
	CSRF     string
	Flash    string
	Error    string
	Data     any
}

func (c *console) render(w http.ResponseWriter, r *http.Request, rq *request, status int, name, title string, data any, errMsg string) {
	v := view{Title: title, Data: data, Error: errMsg, ReadOnly: c.cfg.ReadOnly, Flash: flashes[r.URL.Query().Get("done")]}
	if rq != nil {
		v.Who, v.CSRF = rq.who, rq.csrf
		v.CanAct = rq.who.Access >= Act && !c.cfg.ReadOnly
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := c.pages[name].Execute(w, v); err != nil {
		c.cfg.Logger.Error("console: rendering a page failed", "page", name, "err", err)
	}
}

// fail answers with an error page; msg is the console's own text.
func (c *console) fail(w http.ResponseWriter, r *http.Request, rq *request, status int, msg string) {
	c.render(w, r, rq, status, "error", http.StatusText(status), nil, msg)
}

// flashes are the messages an action's redirect may show, by the value of
// its done parameter, so that no text from the request reaches the page.
var flashes = map[string]string{
	"unlocked":   "The lease was freed: the next request or the completer resumes the key now.",
	"unheld":     "The key had no lease; nothing changed.",
	"retried":    "The key is off hold and waiting to run again.",
	"resolved":   "The resolution is recorded.",
	"bulk":       "The bulk action is done; the audit lists every key it changed.",
	"bulk-empty": "No key matched any more; nothing changed.",
}
