package fakeapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Faults is a Server's plan of failures for the requests that Execute.
// Counts are drawn before rates, and a failure before execution before a
// drop after it, so FailBefore 1 with TimeoutAfter 1 fails one request and
// drops the next.
type Faults struct {
	// FailBefore is how many of the next requests are answered 500
	// api_error without executing. Nothing is stored under their key,
	// because nothing ran, so a retry with the key executes.
	FailBefore int
	// TimeoutAfter is how many of the next requests execute in full,
	// committing their change and its stored answer, and then lose their
	// connection after the answer's status line, so the client sees a
	// network error, whether or not its connection was a reused keep-alive
	// one (see drop). A retry with the key replays the stored answer.
	TimeoutAfter int
	// FailBeforeRate is the probability, from 0 to 1, that a request no
	// count claims fails as FailBefore describes.
	FailBeforeRate float64
	// TimeoutAfterRate is the probability, from 0 to 1, that a request no
	// count or failure claims is dropped as TimeoutAfter describes.
	TimeoutAfterRate float64
	// Delay is added to every API request that waits for it (see
	// Server.Delay). A request that executes spends it holding its key, so
	// concurrent requests with the key are refused with 409 meanwhile.
	Delay time.Duration
}

// check reports what makes f an impossible plan, naming the fields as
// /_faults does for action.
func (f Faults) check(action string) error {
	switch {
	case f.FailBefore < 0:
		return fmt.Errorf("fail_before_%s is negative", action)
	case f.TimeoutAfter < 0:
		return fmt.Errorf("timeout_after_%s is negative", action)
	case f.Delay < 0:
		return errors.New("delay_ms is negative")
	}
	for _, r := range []float64{f.FailBeforeRate, f.TimeoutAfterRate} {
		// Written so that NaN fails too.
		if !(r >= 0 && r <= 1) {
			return fmt.Errorf("fault rate %v is not between 0 and 1", r)
		}
	}
	return nil
}

// fault is what a request drew from the plan.
type fault int

const (
	noFault fault = iota
	failBefore
	dropAfter
)

// plan is the Faults a Server draws from, shared by its requests.
type plan struct {
	mu sync.Mutex
	f  Faults
}

func (p *plan) draw() fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.f.FailBefore > 0:
		p.f.FailBefore--
		return failBefore
	case p.f.TimeoutAfter > 0:
		p.f.TimeoutAfter--
		return dropAfter
	case rand.Float64() < p.f.FailBeforeRate:
		return failBefore
	case rand.Float64() < p.f.TimeoutAfterRate:
		return dropAfter
	}
	return noFault
}

// Faults returns the faults still planned.
func (s *Server) Faults() Faults {
	s.faults.mu.Lock()
	defer s.faults.mu.Unlock()
	return s.faults.f
}

// ChangeFaults applies change to a copy of the plan and puts the copy in
// its place, as one step with respect to other changes and to the requests
// drawing faults, so that a change to one field never undoes a count drawn
// meanwhile. When change fails, or leaves a negative count or delay or a
// rate outside 0 to 1, nothing changes and the error says why. It returns
// the plan in force afterwards.
func (s *Server) ChangeFaults(change func(*Faults) error) (Faults, error) {
	s.faults.mu.Lock()
	defer s.faults.mu.Unlock()
	f := s.faults.f
	err := change(&f)
	if err == nil {
		err = f.check(s.cfg.Action)
	}
	if err != nil {
		return s.faults.f, err
	}
	s.faults.f = f
	return f, nil
}

// SetFaults replaces the plan with f. It returns an error, and changes
// nothing, when a count or the delay is negative or a rate is not between 0
// and 1.
func (s *Server) SetFaults(f Faults) error {
	_, err := s.ChangeFaults(func(plan *Faults) error { *plan = f; return nil })
	if err != nil {
		return fmt.Errorf("%s: %w", s.cfg.Name, err)
	}
	return nil
}

// Delay waits for the planned delay, or until ctx ends, when it returns
// ctx's error. A request that does not Execute calls it once, where a slow
// API would be slow; Execute calls it while holding the key.
func (s *Server) Delay(ctx context.Context) error {
	d := s.Faults().Delay
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// jsonField is a field of a JSON object: its name, and a value that
// encoding/json writes (and, when it is a pointer, reads).
type jsonField struct {
	name  string
	value any
}

// wireFields are f's fields as /_faults names them, in the order GET
// answers them.
func (s *Server) wireFields(f *Faults) []jsonField {
	a := s.cfg.Action
	return []jsonField{
		{"fail_before_" + a, &f.FailBefore},
		{"timeout_after_" + a, &f.TimeoutAfter},
		{"fail_before_" + a + "_rate", &f.FailBeforeRate},
		{"timeout_after_" + a + "_rate", &f.TimeoutAfterRate},
		{"delay_ms", (*milliseconds)(&f.Delay)},
	}
}

// jsonObject renders as a JSON object whose members come in the order of
// its fields.
type jsonObject []jsonField

func (fields jsonObject) MarshalJSON() ([]byte, error) {
	b := []byte{'{'}
	for i, f := range fields {
		if i > 0 {
			b = append(b, ',')
		}
		name, err := json.Marshal(f.name)
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(f.value)
		if err != nil {
			return nil, err
		}
		b = append(append(append(b, name...), ':'), v...)
	}
	return append(b, '}'), nil
}

// milliseconds is a Duration on the wire, as a whole number of
// milliseconds.
type milliseconds time.Duration

func (d milliseconds) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).Milliseconds())
}

func (d *milliseconds) UnmarshalJSON(b []byte) error {
	var ms int64
	if err := json.Unmarshal(b, &ms); err != nil {
		return err
	}
	*d = milliseconds(time.Duration(ms) * time.Millisecond)
	return nil
}

// getFaults serves GET /_faults: the faults still planned.
func (s *Server) getFaults(w http.ResponseWriter, _ *http.Request) {
	f := s.Faults()
	Write(w, JSON(http.StatusOK, jsonObject(s.wireFields(&f))))
}

// postFaults serves POST /_faults: it sets the faults the JSON object
// names, all or none, leaves the others alone, and answers with the
// resulting plan.
func (s *Server) postFaults(w http.ResponseWriter, r *http.Request) {
	var in map[string]json.RawMessage
	err := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodyBytes)).Decode(&in)
	var f Faults
	if err == nil {
		f, err = s.ChangeFaults(func(f *Faults) error { return s.setWireFields(f, in) })
	}
	if err != nil {
		Write(w, *InvalidParam("", "", "Invalid fault plan: "+err.Error()))
		return
	}
	s.logger.Info(s.cfg.Name+": fault plan changed", slog.Any("faults", f))
	Write(w, JSON(http.StatusOK, jsonObject(s.wireFields(&f))))
}

// setWireFields sets the fields of f that in names. A null leaves its field
// alone, like an absent one; a name /_faults does not know is an error.
func (s *Server) setWireFields(f *Faults, in map[string]json.RawMessage) error {
	fields := s.wireFields(f)
	for _, name := range slices.Sorted(maps.Keys(in)) {
		i := slices.IndexFunc(fields, func(f jsonField) bool { return f.name == name })
		if i < 0 {
			return fmt.Errorf("json: unknown field %q", name)
		}
		if string(in[name]) == "null" {
			continue
		}
		if err := json.Unmarshal(in[name], fields[i].value); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

// drop sends the status line of res and closes the client's connection,
// as a network failure while the answer was on its way would: the client
// sees a network error. The status line makes the failure reach the caller
// every time. Go's net/http client resends a request that carries an
// Idempotency-Key by itself, without telling its caller, when a reused
// keep-alive connection closes before any byte of the answer arrives; a
// drop with no answer at all would then be seen by the server twice and by
// the caller never.
func drop(w http.ResponseWriter, res Response) {
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// HTTP/2 connections cannot be hijacked; aborting the handler
		// resets the stream, which the client sees the same way.
		panic(http.ErrAbortHandler)
	}
	fmt.Fprintf(buf, "HTTP/1.1 %03d %s\r\n", res.Status, http.StatusText(res.Status))
	_ = buf.Flush()
	_ = conn.Close()
}
