package phase

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/lockttl"
)

// listenerKey carries a function that a run calls with each of its events,
// after the client's observers.
type listenerKey struct{}

func withListener(ctx context.Context, f func(keyrow.Event)) context.Context {
	return context.WithValue(ctx, listenerKey{}, f)
}

// checkAccept validates HTTPConfig's accept mode against w.
func (w *Workflow[Req, State]) checkAccept(after string, location func(*http.Request, string) string) error {
	if after == "" {
		return nil
	}
	if _, ok := w.index[after]; !ok {
		return fmt.Errorf("phase: HTTPConfig.AcceptAfter names %q, which is not a phase of workflow %q", after, w.name)
	}
	if w.index[after] == len(w.phases)-1 {
		return fmt.Errorf("phase: HTTPConfig.AcceptAfter names %q, the last phase of workflow %q, which answers itself", after, w.name)
	}
	if location == nil {
		return errors.New("phase: HTTPConfig.StatusLocation is required with AcceptAfter")
	}
	return nil
}

// accepted reports whether recovery point rp is at or after the phase
// named after, so that the key's request has been accepted.
func (w *Workflow[Req, State]) accepted(after, rp string) bool {
	if after == "" {
		return false
	}
	if rp == keyrow.Finished {
		return true
	}
	i, ok := w.index[rp]
	return ok && i >= w.index[after]
}

// runAccepting runs the request, whose fingerprint as sent is fp, and returns as soon as the phase named
// cfg.AcceptAfter has committed (or the run resumed after it), with
// accepted set, leaving the run to finish the remaining phases in the
// background; or when the run ends first, with its outcome.
func (h *handler[Req, State]) runAccepting(ctx context.Context, tenant, key string, req Req, fp *[32]byte) (out *Outcome, err error, accepted bool) {
	if h.cfg.AcceptAfter == "" {
		out, err = h.w.runAs(ctx, h.c, tenant, key, req, fp)
		return out, err, false
	}
	acceptedCh := make(chan struct{})
	var once sync.Once
	ctx = withListener(ctx, func(ev keyrow.Event) {
		if (ev.Kind == keyrow.EventPhaseCommitted || ev.Kind == keyrow.EventResumed) && ev.RecoveryPoint != keyrow.Finished &&
			h.w.accepted(h.cfg.AcceptAfter, ev.RecoveryPoint) {
			once.Do(func() { close(acceptedCh) })
		}
	})
	type result struct {
		out *Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := h.w.runAs(ctx, h.c, tenant, key, req, fp)
		if err != nil && !errors.Is(err, ErrCrash) {
			select {
			case <-acceptedCh:
				// Nobody waits for this run any more: the key stays
				// unfinished after its last committed phase, for a retry
				// or the completer to finish.
				h.c.cfg.Logger.Warn("an accepted request failed in the background; the completer will resume it",
					"workflow", h.w.name, "tenant", tenant, "key", key, "err", err)
			default:
			}
		}
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		return r.out, r.err, false
	case <-acceptedCh:
		return nil, nil, true
	}
}

// acceptedStatus is the body of a 202 answer and of the status of an
// unfinished key.
type acceptedStatus struct {
	// Status is "processing", or "on_hold" for a key waiting on a
	// reconciliation or an operator.
	Status        string `json:"status"`
	RecoveryPoint string `json:"recovery_point"`
	Hold          string `json:"hold,omitempty"`
}

// writeAccepted answers 202 Accepted with the status location, when there
// is one, and Retry-After: the lease's time left, within lockttl.RetryAfter's
// bounds.
func writeAccepted(rw http.ResponseWriter, location string, st acceptedStatus, retryAfter time.Duration) {
	body, _ := json.Marshal(st) // strings always encode
	if location != "" {
		rw.Header().Set("Location", location)
	}
	rw.Header().Set("Content-Type", "application/json")
	rw.Header().Set("Retry-After", strconv.Itoa(int(lockttl.RetryAfter(retryAfter)/time.Second)))
	rw.WriteHeader(http.StatusAccepted)
	_, _ = rw.Write(append(body, '\n'))
}

// inProgress answers a request whose key another run holds: 202 again when
// the key was accepted, else 409.
func (h *handler[Req, State]) inProgress(rw http.ResponseWriter, r *http.Request, tenant, key string, out *Outcome) {
	if h.cfg.AcceptAfter != "" {
		row, err := h.c.Inspect(r.Context(), tenant, key)
		if err == nil && row.Workflow == h.w.name && h.w.accepted(h.cfg.AcceptAfter, row.RecoveryPoint) {
			writeAccepted(rw, h.cfg.StatusLocation(r, key), acceptedStatus{Status: "processing", RecoveryPoint: row.RecoveryPoint}, out.RetryAfter)
			return
		}
	}
	WriteProblem(rw, http.StatusConflict, ProblemInProgress, "Request in progress",
		"another request with this Idempotency-Key is still being processed; retry after the time in Retry-After", out.RetryAfter)
}

// StatusConfig configures StatusHandler. Zero values mean the
// documented default.
type StatusConfig struct {
	// Tenant returns whose key the request asks about, from its
	// authentication, as HTTPConfig.Tenant does, and its errors are answered
	// as Handler answers them: 401 with its message, or the status of a
	// *RequestError; 503 with Retry-After for an error wrapping
	// ErrUnavailable (the user store is down, say). Required.
	Tenant func(r *http.Request) (string, error)
	// Key returns the key asked about. Defaults to the path value "key"
	// (a route such as GET /rides/status/{key}), or else the
	// Idempotency-Key header.
	Key func(r *http.Request) (string, error)
}

// StatusHandler returns an http.Handler through which c tells a caller of
// w where the request under its key stands, for the 202 Accepted answers
// of a Handler with HTTPConfig.AcceptAfter: once the key is finished, its stored
// response, as a replay (Idempotent-Replayed: true); until then 202 with a
// JSON body ({"status": "processing" or "on_hold", "recovery_point": ...})
// and Retry-After; 404 when the tenant has no such key of this workflow;
// 503 with Retry-After when the key store, or the store behind the Tenant
// function, is unavailable, so that a poller waits and asks again instead
// of giving up as for a refused tenant (401).
// Like the Handler, it only ever shows a tenant its own keys.
func StatusHandler[Req, State any](c *Client, w *Workflow[Req, State], cfg StatusConfig) (http.Handler, error) {
	if err := c.registered(w); err != nil {
		return nil, err
	}
	if cfg.Tenant == nil {
		return nil, errors.New("phase: StatusConfig.Tenant is required")
	}
	if cfg.Key == nil {
		cfg.Key = func(r *http.Request) (string, error) {
			if k := r.PathValue("key"); k != "" {
				return k, nil
			}
			return keyrow.KeyFrom(keyrow.HeaderName+" header", r.Header.Values(keyrow.HeaderName)...)
		}
	}
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			rw.Header().Set("Allow", "GET, HEAD")
			WriteProblem(rw, http.StatusMethodNotAllowed, "method-not-allowed", "Method not allowed",
				fmt.Sprintf("the status of a request is read with GET, not %s", r.Method), 0)
			return
		}
		tenant, ok := tenantOf(rw, r, cfg.Tenant, c.cfg.Logger, w.name)
		if !ok {
			return
		}
		key, err := cfg.Key(r)
		if err != nil {
			WriteProblem(rw, http.StatusBadRequest, ProblemInvalidKey, "Invalid Idempotency-Key", err.Error(), 0)
			return
		}
		row, err := c.Inspect(r.Context(), tenant, key)
		switch {
		case errors.Is(err, keyrow.ErrNotFound) || (err == nil && row.Workflow != w.name):
			WriteProblem(rw, http.StatusNotFound, "unknown-idempotency-key", "Unknown Idempotency-Key",
				"no request of this endpoint was made with this Idempotency-Key, or it was deleted after its retention", 0)
			return
		case err != nil:
			WriteProblem(rw, http.StatusServiceUnavailable, ProblemStoreUnavailable, "Service unavailable",
				"the idempotency key store is unavailable; retry", time.Second)
			return
		}
		if row.ResponseStatus != nil {
			writeStored(rw, w.store.replayed(&keyrow.Response{Status: *row.ResponseStatus, Header: row.ResponseHeader, Body: row.ResponseBody}), true)
			return
		}
		st := acceptedStatus{Status: "processing", RecoveryPoint: row.RecoveryPoint}
		if row.Hold != "" {
			st.Status, st.Hold = "on_hold", string(row.Hold)
		}
		writeAccepted(rw, "", st, row.LeaseLeft)
	}), nil
}
