package phase

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/atomicphase/atomicphase/keyrow"
)

// DefaultMaxResponseBytes is the largest response body a key stores by
// default (see StoreConfig.MaxResponseBytes).
const DefaultMaxResponseBytes = 1 << 20

// DefaultReplayHeaders returns the response headers a key stores and a
// replay sends by default: those that describe the resource and its
// representation, the same for every caller. Every other header of a
// response reaches only the caller that ran the request.
func DefaultReplayHeaders() []string {
	return []string{
		"Cache-Control", "Content-Disposition", "Content-Encoding", "Content-Language",
		"Content-Location", "Content-Type", "ETag", "Expires", "Last-Modified", "Link",
		"Location", "Vary",
	}
}

// neverReplayed are the headers no key stores or replays, whatever a
// workflow allows: credentials and cookies belong to the caller that got
// them, hop-by-hop headers to one connection, Date and Content-Length to one
// transmission (a replay sends its own), and the replay marker to the
// replay.
var neverReplayed = headerSet(
	"Set-Cookie", "Set-Cookie2", "Cookie", "Authorization", "Proxy-Authorization", "Proxy-Authenticate",
	"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Te", "Trailer", "Upgrade",
	"Date", "Content-Length", ReplayedHeader,
)

func headerSet(names ...string) map[string]bool {
	set := make(map[string]bool, len(names))
	for _, n := range names {
		set[http.CanonicalHeaderKey(n)] = true
	}
	return set
}

// StoreConfig says what a workflow's keys keep: for how long, which response
// headers, and how large a body. Zero values mean the default.
type StoreConfig struct {
	// Retention is how long a finished key is kept and replayed. It is
	// recorded on each key when the key is created, so that a reaper in any
	// process, whatever its own configuration, deletes the key only once
	// this retention has passed. Defaults to the client's
	// Config.Reaper.Retention (recovery.DefaultRetention, 24 hours). A
	// retry that arrives after its key was deleted runs as a new request.
	Retention time.Duration
	// MaxResponseBytes is the largest response body stored. A larger
	// response still reaches the caller that ran the request; its retries
	// get a 500 problem of type urn:atomicphase:problem:response-not-stored
	// that says the request was processed and with which status. Defaults
	// to DefaultMaxResponseBytes; -1 means no limit.
	MaxResponseBytes int
	// ReplayHeaders are stored and replayed in addition to
	// DefaultReplayHeaders. Set-Cookie, Authorization, hop-by-hop headers,
	// Date and Content-Length are never stored and cannot be added.
	ReplayHeaders []string
	// DropHeaders are removed from DefaultReplayHeaders.
	DropHeaders []string
}

// storePolicy is a workflow's StoreConfig, resolved.
type storePolicy struct {
	retention time.Duration // zero: the client's
	maxBody   int           // negative: no limit
	headers   map[string]bool
}

func defaultStorePolicy() storePolicy {
	return storePolicy{maxBody: DefaultMaxResponseBytes, headers: headerSet(DefaultReplayHeaders()...)}
}

// StoreResponses sets what w's keys keep (see StoreConfig). Call it before
// NewClient. It returns an error for a negative retention or body limit,
// or for a header that is never stored.
func (w *Workflow[Req, State]) StoreResponses(cfg StoreConfig) error {
	if cfg.Retention < 0 || cfg.MaxResponseBytes < -1 {
		return errors.New("phase: StoreConfig.Retention and MaxResponseBytes must not be negative (except -1 where documented)")
	}
	p := defaultStorePolicy()
	p.retention = cfg.Retention
	switch {
	case cfg.MaxResponseBytes > 0:
		p.maxBody = cfg.MaxResponseBytes
	case cfg.MaxResponseBytes < 0:
		p.maxBody = -1
	}
	for _, h := range cfg.ReplayHeaders {
		h = http.CanonicalHeaderKey(h)
		if neverReplayed[h] {
			return fmt.Errorf("phase: StoreConfig.ReplayHeaders: %s is never stored or replayed", h)
		}
		p.headers[h] = true
	}
	for _, h := range cfg.DropHeaders {
		delete(p.headers, http.CanonicalHeaderKey(h))
	}
	w.store = p
	return nil
}

// replayHeader returns the part of h that w's keys store and replay: only
// the allowed headers, never one of neverReplayed. It serves both when a
// response is stored and when one is replayed, so that a row stored by a
// release that kept every header replays no more than one stored now.
func (p *storePolicy) replayHeader(h http.Header) http.Header {
	if p.keepsAll(h) {
		// Nothing to drop (most often a lone Content-Type): h is only
		// encoded or written, never changed, so it need not be copied.
		return h
	}
	var kept http.Header
	for k, v := range h {
		ck := http.CanonicalHeaderKey(k)
		if !p.headers[ck] || neverReplayed[ck] {
			continue
		}
		if kept == nil {
			kept = make(http.Header, len(h))
		}
		kept[ck] = slices.Clone(v)
	}
	return kept
}

// keepsAll reports whether replayHeader keeps every header of h as it is.
func (p *storePolicy) keepsAll(h http.Header) bool {
	for k := range h {
		if !p.headers[k] || neverReplayed[k] || http.CanonicalHeaderKey(k) != k {
			return false
		}
	}
	return true
}

// stored is what a key stores of resp: its status and body with the
// replayed headers, or, for a body over the limit, a problem that says the
// request was processed.
func (p *storePolicy) stored(resp keyrow.Response) keyrow.Response {
	if p.maxBody >= 0 && len(resp.Body) > p.maxBody {
		body, _ := json.Marshal(problem{Type: problemType + "response-not-stored", Title: "Response not stored",
			Status: http.StatusInternalServerError,
			Detail: fmt.Sprintf("this request was processed and answered with status %d, but its response of %d bytes was larger than the %d bytes kept for retries; do not send it again, read the result instead",
				resp.Status, len(resp.Body), p.maxBody)})
		return keyrow.Response{Status: http.StatusInternalServerError,
			Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: append(body, '\n')}
	}
	resp.Header = p.replayHeader(resp.Header)
	return resp
}

// replayed is the response a retry gets from a stored one: the same status
// and body, with only the headers the policy replays.
func (p *storePolicy) replayed(resp *keyrow.Response) *keyrow.Response {
	if resp == nil {
		return nil
	}
	out := *resp
	out.Header = p.replayHeader(resp.Header)
	return &out
}
