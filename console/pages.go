package console

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// states in the order the pages show them.
var states = keyrow.Statuses()

var funcs = template.FuncMap{
	"shown":        shown,
	"ago":          ago,
	"since":        since,
	"chart":        chart,
	"statusCharts": statusCharts,
	"sorts":        func() any { return sorts },
	"diff":         diff,
	"written":      written,
	"tenantQuery": func(tenant string) template.URL {
		return template.URL(url.Values{"tenant": {tenant}}.Encode())
	},
	"auditQuery": func(tenant, key string) template.URL {
		return template.URL(url.Values{"tenant": {tenant}, "key": {key}}.Encode())
	},
	"dur":    round,
	"pretty": pretty,
	"body":   body,
	"keyURL": keyURL,
	"states": func() []keyrow.Status { return states },
	"label":  label,
	"count":  count,
	"listURL": func(state keyrow.Status, workflow string) template.URL {
		return listURL(keyrow.ListFilter{Status: state, Workflow: workflow})
	},
}

// ago shows when t was, as a duration and in UTC; the script adds the
// reader's own time beside it. A nil time shows as a dash.
func ago(t any) template.HTML {
	at, ok := when(t)
	if !ok {
		return "—"
	}
	return template.HTML(fmt.Sprintf(`%s ago <time class="at" datetime="%s">%s</time>`,
		round(time.Since(at)), at.UTC().Format(time.RFC3339), at.UTC().Format(utcLayout)))
}

// since shows when t was as a duration alone, for the tables: the UTC
// time, and the reader's own once the script ran, are its tooltip.
func since(t any) template.HTML {
	at, ok := when(t)
	if !ok {
		return "—"
	}
	return template.HTML(fmt.Sprintf(`<time datetime="%s" title="%s">%s ago</time>`,
		at.UTC().Format(time.RFC3339), at.UTC().Format(utcLayout), round(time.Since(at))))
}

const utcLayout = "2006-01-02 15:04:05 UTC"

func when(t any) (time.Time, bool) {
	switch v := t.(type) {
	case time.Time:
		return v, true
	case *time.Time:
		if v != nil {
			return *v, true
		}
	}
	return time.Time{}, false
}

// shown renders text a client or a person wrote (a tenant, a key, a
// stored body, an error) for reading: isolated in a <bdi>, so that
// right-to-left text in it cannot reorder the page around it, and with
// every character that is invisible or changes the direction of what
// follows (U+202E, zero-width spaces, control characters) written out as
// \u202E in a marked span, so that "acme\u202Egpj.exe" cannot pass for
// another name. Tabs and line feeds stay, for the bodies shown in <pre>.
func shown(s string) template.HTML {
	var b strings.Builder
	b.WriteString("<bdi>")
	start := 0
	for i, r := range s {
		if !hidden(r) {
			continue
		}
		b.WriteString(template.HTMLEscapeString(s[start:i]))
		fmt.Fprintf(&b, `<span class="ctl">\u%04X</span>`, r)
		start = i + utf8.RuneLen(r)
	}
	b.WriteString(template.HTMLEscapeString(s[start:]))
	b.WriteString("</bdi>")
	return template.HTML(b.String())
}

// written is s as shown writes it, for plain text such as a page's title.
func written(s string) string {
	var b strings.Builder
	for _, r := range s {
		if hidden(r) {
			fmt.Fprintf(&b, `\u%04X`, r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// hidden reports whether r shows as nothing, or changes the direction of
// the text after it, rather than as a glyph of its own.
func hidden(r rune) bool {
	switch {
	case r == '\t' || r == '\n':
		return false
	case unicode.IsControl(r), unicode.Is(unicode.Cf, r), unicode.Is(unicode.Zl, r), unicode.Is(unicode.Zp, r):
		return true
	}
	return false
}

func round(d time.Duration) string {
	switch {
	case d >= time.Hour:
		return d.Round(time.Minute).String()
	case d >= time.Second:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Millisecond).String()
}

// pretty indents JSON for reading; html/template escapes the result.
func pretty(raw json.RawMessage) string {
	var b bytes.Buffer
	if len(raw) == 0 {
		return "—"
	}
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return string(raw)
	}
	return b.String()
}

// body shows a stored response body as text, or base64 when it is not.
func body(b []byte) string {
	if utf8.Valid(b) {
		return pretty(b)
	}
	return fmt.Sprintf("(%d bytes, not text; base64) %s", len(b), base64.StdEncoding.EncodeToString(b))
}

func count(c keyrow.Counts, s keyrow.Status) int { return c.Of(s) }

// label is a status as the pages write it: "in flight".
func label(s keyrow.Status) string { return strings.ReplaceAll(string(s), "_", " ") }

// keyURL is the relative address of a key's page. Its parts are
// percent-encoded, so it is safe as a template.URL whatever the key holds.
func keyURL(tenant, key string) template.URL {
	return template.URL("key?" + url.Values{"tenant": {tenant}, "key": {key}}.Encode())
}

func filterValues(f keyrow.ListFilter) url.Values {
	v := url.Values{}
	set := func(name, value string) {
		if value != "" {
			v.Set(name, value)
		}
	}
	set("state", string(f.Status))
	set("workflow", f.Workflow)
	set("tenant", f.Tenant)
	set("prefix", f.KeyPrefix)
	if f.OlderThan > 0 {
		v.Set("older", f.OlderThan.String())
	}
	if f.NewerThan > 0 {
		v.Set("newer", f.NewerThan.String())
	}
	set("sort", string(f.Sort))
	set("after", f.After)
	return v
}

func listURL(f keyrow.ListFilter) template.URL {
	return template.URL("keys?" + filterValues(f).Encode())
}

// parseFilter reads a key filter from a query or a form.
func parseFilter(v url.Values) (keyrow.ListFilter, error) {
	f := keyrow.ListFilter{Status: keyrow.Status(v.Get("state")), Workflow: v.Get("workflow"), Tenant: v.Get("tenant"),
		KeyPrefix: v.Get("prefix"), Sort: keyrow.Sort(v.Get("sort")), After: v.Get("after")}
	if f.Status != "" && !slices.Contains(states, f.Status) {
		return f, errors.New("unknown state")
	}
	if !slices.Contains([]keyrow.Sort{"", keyrow.SortNewest, keyrow.SortOldest, keyrow.SortIdle}, f.Sort) {
		return f, errors.New("unknown order")
	}
	if f.Sort == keyrow.SortIdle && (f.Status == "" || f.Status == keyrow.StatusFinished) {
		return f, errors.New("idle longest first needs an unfinished state: choose one, or another order")
	}
	for name, d := range map[string]*time.Duration{"older": &f.OlderThan, "newer": &f.NewerThan} {
		if s := v.Get(name); s != "" {
			var err error
			if *d, err = time.ParseDuration(s); err != nil || *d < 0 {
				return f, fmt.Errorf("%s than: write a duration such as 90s, 15m or 2h", name)
			}
		}
	}
	return f, nil
}

type overviewData struct {
	Workflows []workflowCounts
	// Definitions counts the unfinished keys of each workflow definition.
	Definitions []keyrow.DefinitionCount
	Total       keyrow.Counts
	phase.Overview
}

type workflowCounts struct {
	Name string
	keyrow.Counts
}

func (c *console) overview(w http.ResponseWriter, r *http.Request, rq *request) {
	o, err := c.cfg.Client.Overview(r.Context())
	if err != nil {
		c.storeFailed(w, r, rq, err)
		return
	}
	defs, err := c.cfg.Client.Definitions(r.Context())
	if err != nil {
		c.storeFailed(w, r, rq, err)
		return
	}
	d := overviewData{Overview: *o, Definitions: defs}
	for name, n := range o.Workflows {
		d.Workflows = append(d.Workflows, workflowCounts{name, n})
		d.Total = d.Total.Add(n)
	}
	slices.SortFunc(d.Workflows, func(a, b workflowCounts) int { return strings.Compare(a.Name, b.Name) })
	c.render(w, r, rq, http.StatusOK, "overview", "Overview", d, "")
}

type keysData struct {
	Filter keyrow.ListFilter
	Older  string
	Newer  string
	Keys   []keyrow.Row
	// Total counts the keys the filter selects, up to countLimit.
	Total     int
	TotalMore bool
	Next      template.URL
	First     template.URL
	Paged     bool
	// Filtered is set when any filter is; Clear lists every key.
	Filtered bool
	// Bulk links preview the bulk actions on the filter.
	RetryURL, UnlockURL template.URL
}

// countLimit is where the key list stops counting: beyond it the list
// says "more than".
const countLimit = 10000

// sorts are the orders the key list offers, by the value of its sort
// parameter.
var sorts = []struct {
	Value keyrow.Sort
	Label string
}{{"", "default"}, {keyrow.SortNewest, "newest first"},
	{keyrow.SortOldest, "oldest first"}, {keyrow.SortIdle, "idle longest first"}}

func (c *console) keys(w http.ResponseWriter, r *http.Request, rq *request) {
	f, err := parseFilter(r.URL.Query())
	d := keysData{Filter: f, Older: r.URL.Query().Get("older"), Newer: r.URL.Query().Get("newer")}
	all := f
	all.After, all.Sort = "", ""
	d.Filtered = len(filterValues(all)) > 0
	if err != nil {
		c.render(w, r, rq, http.StatusBadRequest, "keys", "Keys", d, err.Error())
		return
	}
	page, err := c.cfg.Client.List(r.Context(), f)
	if err != nil {
		c.storeFailed(w, r, rq, err)
		return
	}
	if d.Total, err = c.cfg.Client.CountMatching(r.Context(), f, countLimit+1); err != nil {
		c.storeFailed(w, r, rq, err)
		return
	}
	d.Total, d.TotalMore = min(d.Total, countLimit), d.Total > countLimit
	d.Keys = page.Keys
	first := f
	first.After = ""
	d.First, d.Paged = listURL(first), f.After != ""
	if page.Next != "" {
		next := f
		next.After = page.Next
		d.Next = listURL(next)
	}
	for _, a := range []struct {
		action string
		url    *template.URL
	}{{keyrow.ActionRetry, &d.RetryURL}, {keyrow.ActionUnlock, &d.UnlockURL}} {
		v := filterValues(all)
		v.Set("action", a.action)
		*a.url = template.URL("bulk?" + v.Encode())
	}
	c.render(w, r, rq, http.StatusOK, "keys", "Keys", d, "")
}

type keyData struct {
	*phase.KeyDetail
	// KeyState is where the key stands; State is its workflow's state.
	KeyState keyrow.Status
	// Awaiting is the phase whose outcome an unknown key awaits, when the
	// workflow is registered.
	Awaiting string
}

func (c *console) key(w http.ResponseWriter, r *http.Request, rq *request) {
	c.showKey(w, r, rq, r.URL.Query().Get("tenant"), r.URL.Query().Get("key"), http.StatusOK, "")
}

func (c *console) showKey(w http.ResponseWriter, r *http.Request, rq *request, tenant, key string, code int, errMsg string) {
	d, err := c.cfg.Client.Describe(r.Context(), tenant, key)
	if errors.Is(err, keyrow.ErrNotFound) {
		c.fail(w, r, rq, http.StatusNotFound, "There is no such key.")
		return
	}
	if err != nil {
		c.storeFailed(w, r, rq, err)
		return
	}
	kd := keyData{KeyDetail: d, KeyState: c.cfg.Client.StatusOf(&d.Row)}
	for _, p := range d.Phases {
		if !p.Passed {
			if p.Foreign && kd.Awaiting == "" {
				kd.Awaiting = p.Name
			}
			if !p.Foreign {
				break
			}
		}
	}
	c.render(w, r, rq, code, "key", "Key "+written(key)+" of "+written(tenant), kd, errMsg)
}

// confirmed reports whether the form's confirmation box was ticked.
func confirmed(r *http.Request) bool { return r.PostFormValue("confirm") == "yes" }

// done redirects to the key's page with a flash message.
func done(w http.ResponseWriter, tenant, key, flash string) {
	seeOther(w, string(keyURL(tenant, key))+"&done="+flash)
}

// seeOther redirects to a page of the console. The address stays
// relative, for the browser to resolve against the console's own:
// http.Redirect would resolve it against the path after the mount's
// prefix was stripped.
func seeOther(w http.ResponseWriter, rel string) {
	w.Header().Set("Location", rel)
	w.WriteHeader(http.StatusSeeOther)
}

// seen reads what the page showed of the key, which every action's form
// carries; without it, an action could undo what another operator did
// after the page was loaded.
func (c *console) seen(w http.ResponseWriter, r *http.Request, rq *request, tenant, key string) (keyrow.Seen, bool) {
	seen, err := keyrow.ParseSeen(r.PostFormValue("seen"))
	if err != nil {
		c.showKey(w, r, rq, tenant, key, http.StatusBadRequest, "The form does not say what its page showed of the key; nothing changed. Look at the key again.")
		return seen, false
	}
	return seen, true
}

// actionFailed answers an action that changed nothing: 409 with what
// changed since the page was loaded, 404 for a missing key.
func (c *console) actionFailed(w http.ResponseWriter, r *http.Request, rq *request, tenant, key string, err error) {
	var changed *keyrow.ChangedError
	switch {
	case errors.As(err, &changed):
		c.showKey(w, r, rq, tenant, key, http.StatusConflict,
			"Nothing changed: the key changed since your page showed it ("+strings.Join(changed.Changes, "; ")+"). This page shows it as it is now; look again before you act.")
	case errors.Is(err, keyrow.ErrNotFound):
		c.fail(w, r, rq, http.StatusNotFound, "There is no such key.")
	default:
		c.storeFailed(w, r, rq, err)
	}
}

func (c *console) unlock(w http.ResponseWriter, r *http.Request, rq *request) {
	tenant, key := r.PostFormValue("tenant"), r.PostFormValue("key")
	if !confirmed(r) {
		c.showKey(w, r, rq, tenant, key, http.StatusBadRequest, "Tick the box to confirm the unlock.")
		return
	}
	seen, ok := c.seen(w, r, rq, tenant, key)
	if !ok {
		return
	}
	freed, err := c.cfg.Client.Unlock(phase.WithActor(r.Context(), rq.who.Name), tenant, key, seen)
	if err != nil {
		c.actionFailed(w, r, rq, tenant, key, err)
		return
	}
	done(w, tenant, key, map[bool]string{true: "unlocked", false: "unheld"}[freed])
}

func (c *console) retry(w http.ResponseWriter, r *http.Request, rq *request) {
	tenant, key := r.PostFormValue("tenant"), r.PostFormValue("key")
	if !confirmed(r) {
		c.showKey(w, r, rq, tenant, key, http.StatusBadRequest, "Tick the box to confirm the retry.")
		return
	}
	seen, ok := c.seen(w, r, rq, tenant, key)
	if !ok {
		return
	}
	// The retry applies only while the key is held as the page showed it,
	// so the hold the page showed is the one to confirm.
	if seen.Hold == keyrow.HoldUnknown && r.PostFormValue("confirm_unknown") != "yes" {
		c.showKey(w, r, rq, tenant, key, http.StatusBadRequest,
			"This key's last call may have happened: retrying makes it again. Resolve it instead, or confirm that repeating it is safe.")
		return
	}
	err := c.cfg.Client.Retry(phase.WithActor(r.Context(), rq.who.Name), tenant, key, seen)
	switch {
	case errors.Is(err, keyrow.ErrNotHeld) && !errors.Is(err, keyrow.ErrChanged):
		c.showKey(w, r, rq, tenant, key, http.StatusConflict, "The key is not on hold; nothing changed.")
	case err != nil:
		c.actionFailed(w, r, rq, tenant, key, err)
	default:
		done(w, tenant, key, "retried")
	}
}

func (c *console) resolve(w http.ResponseWriter, r *http.Request, rq *request) {
	tenant, key := r.PostFormValue("tenant"), r.PostFormValue("key")
	res := keyrow.Resolution{RecoveryPoint: r.PostFormValue("at")}
	switch r.PostFormValue("outcome") {
	case "happened":
		res.Happened = true
		res.Output = json.RawMessage(r.PostFormValue("output"))
		if !json.Valid(res.Output) {
			c.showKey(w, r, rq, tenant, key, http.StatusUnprocessableEntity, "The output is not valid JSON.")
			return
		}
	case "not_happened":
	default:
		c.showKey(w, r, rq, tenant, key, http.StatusBadRequest, "Say whether the call happened.")
		return
	}
	if !confirmed(r) {
		c.showKey(w, r, rq, tenant, key, http.StatusBadRequest, "Tick the box to confirm that you checked with the provider.")
		return
	}
	seen, ok := c.seen(w, r, rq, tenant, key)
	if !ok {
		return
	}
	_, err := c.cfg.Client.Resolve(phase.WithActor(r.Context(), rq.who.Name), tenant, key, res, seen)
	switch {
	case errors.Is(err, phase.ErrInvalidResolution):
		c.showKey(w, r, rq, tenant, key, http.StatusUnprocessableEntity, "Nothing recorded: "+err.Error())
	case errors.Is(err, keyrow.ErrNotUnknown) && !errors.Is(err, keyrow.ErrChanged):
		c.showKey(w, r, rq, tenant, key, http.StatusConflict,
			"Nothing recorded: the key is not held as unknown at that recovery point, or a run holds it. Look again.")
	case err != nil:
		c.actionFailed(w, r, rq, tenant, key, err)
	default:
		done(w, tenant, key, "resolved")
	}
}

type bulkData struct {
	Action  string
	Filter  keyrow.ListFilter
	Fields  url.Values
	Count   int
	Unknown bool
	Back    template.URL
}

// bulkRequest reads a bulk action and its filter from a query or a form.
func bulkRequest(v url.Values) (bulkData, error) {
	d := bulkData{Action: v.Get("action"), Unknown: v.Get("confirm_unknown") == "yes"}
	if d.Action != keyrow.ActionRetry && d.Action != keyrow.ActionUnlock {
		return d, errors.New("unknown bulk action")
	}
	if d.Unknown && d.Action != keyrow.ActionRetry {
		return d, errors.New("only a retry can include unknown keys")
	}
	f, err := parseFilter(v)
	if err != nil {
		return d, err
	}
	f.After = ""
	d.Filter, d.Fields, d.Back = f, filterValues(f), listURL(f)
	return d, nil
}

func (c *console) bulkPreview(w http.ResponseWriter, r *http.Request, rq *request) {
	d, err := bulkRequest(r.URL.Query())
	if err != nil {
		c.fail(w, r, rq, http.StatusBadRequest, err.Error())
		return
	}
	if d.Count, err = c.cfg.Client.BulkPreview(r.Context(), d.Action, d.Filter, d.Unknown); err != nil {
		c.storeFailed(w, r, rq, err)
		return
	}
	c.render(w, r, rq, http.StatusOK, "bulk", "Bulk "+d.Action, d, "")
}

func (c *console) bulk(w http.ResponseWriter, r *http.Request, rq *request) {
	d, err := bulkRequest(r.PostForm)
	if err != nil {
		c.fail(w, r, rq, http.StatusBadRequest, err.Error())
		return
	}
	if !confirmed(r) {
		c.fail(w, r, rq, http.StatusBadRequest, "Tick the box to confirm the bulk action.")
		return
	}
	n, err := c.cfg.Client.Bulk(phase.WithActor(r.Context(), rq.who.Name), d.Action, d.Filter, d.Unknown)
	if err != nil {
		c.storeFailed(w, r, rq, err)
		return
	}
	flash := "bulk"
	if n == 0 {
		flash = "bulk-empty"
	}
	seeOther(w, "audit?done="+flash)
}

type auditData struct {
	Filter   keyrow.AuditFilter
	Entries  []keyrow.AuditEntry
	Next     template.URL
	Filtered bool
	Actions  []string
}

func (c *console) audit(w http.ResponseWriter, r *http.Request, rq *request) {
	q := r.URL.Query()
	f := keyrow.AuditFilter{Tenant: q.Get("tenant"), Key: q.Get("key"), Actor: q.Get("actor"), Action: q.Get("action"),
		Limit: keyrow.DefaultListLimit}
	f.Before, _ = strconv.ParseInt(q.Get("before"), 10, 64)
	f.Before = max(f.Before, 0)
	d := auditData{Filter: f, Actions: []string{keyrow.ActionUnlock, keyrow.ActionRetry, keyrow.ActionResolve, keyrow.ActionHold}}
	d.Filtered = f.Tenant != "" || f.Key != "" || f.Actor != "" || f.Action != ""
	if f.Key != "" && f.Tenant == "" {
		c.render(w, r, rq, http.StatusBadRequest, "audit", "Audit", d, "A key is named within its tenant: give the tenant too.")
		return
	}
	entries, err := c.cfg.Client.Audit(r.Context(), f)
	if err != nil {
		c.storeFailed(w, r, rq, err)
		return
	}
	d.Entries = entries
	if len(entries) == f.Limit {
		v := url.Values{}
		for name, value := range map[string]string{"tenant": f.Tenant, "key": f.Key, "actor": f.Actor, "action": f.Action} {
			if value != "" {
				v.Set(name, value)
			}
		}
		v.Set("before", strconv.FormatInt(entries[f.Limit-1].ID, 10))
		d.Next = template.URL("audit?" + v.Encode())
	}
	c.render(w, r, rq, http.StatusOK, "audit", "Audit", d, "")
}

// change is one field of a key, before and after an action.
type change struct {
	Field, Before, After string
}

// changes are the fields of a key that an audited action saw, before
// and after it: those it changed, and those it left as they were.
type changes struct {
	Changed, Same []change
}

// diff lines up the fields of an audit entry's before and after by name;
// a snapshot that is not a JSON object shows as one field.
func diff(before, after json.RawMessage) changes {
	var b, a map[string]json.RawMessage
	if json.Unmarshal(before, &b) != nil || json.Unmarshal(after, &a) != nil {
		c := change{Field: "key", Before: compact(before), After: compact(after)}
		if bytes.Equal(before, after) {
			return changes{Same: []change{c}}
		}
		return changes{Changed: []change{c}}
	}
	var out changes
	names := map[string]bool{}
	for name := range b {
		names[name] = true
	}
	for name := range a {
		names[name] = true
	}
	for _, name := range slices.Sorted(maps.Keys(names)) {
		c := change{Field: name, Before: compact(b[name]), After: compact(a[name])}
		if c.Before == c.After {
			out.Same = append(out.Same, c)
		} else {
			out.Changed = append(out.Changed, c)
		}
	}
	return out
}

// compact writes a JSON value on one line; null shows as a dash.
func compact(v json.RawMessage) string {
	var b bytes.Buffer
	if len(v) == 0 {
		return "—"
	}
	if json.Compact(&b, v) != nil {
		return string(v)
	}
	var text string
	switch {
	case b.String() == "null":
		return "—"
	case json.Unmarshal(b.Bytes(), &text) == nil:
		return text
	}
	return b.String()
}

// storeFailed logs an error of the store and answers 503: its text may
// hold stored values, so it is not shown.
func (c *console) storeFailed(w http.ResponseWriter, r *http.Request, rq *request, err error) {
	c.cfg.Logger.Error("console: the store failed", "path", r.URL.Path, "err", err)
	c.fail(w, r, rq, http.StatusServiceUnavailable, "The database did not answer; the error is in the application's log.")
}
