package fakestripe

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// Faults is a Server's plan of failures. Only charge requests about to
// execute draw from it: requests rejected by validation, refused with 409 or
// answered from a stored result never consume a fault. Counts are drawn
// before rates, and a failure before the charge before a drop after it, so
// FailBeforeCharge 1 with TimeoutAfterCharge 1 fails one request and drops
// the next.
type Faults struct {
	// FailBeforeCharge is how many of the next charge requests are answered
	// 500 api_error without executing. Nothing is stored under their
	// idempotency key, because nothing ran, so a retry with the key executes.
	// (Stripe stores a 500 raised once execution began; these stand for a
	// failure in front of execution, such as an overloaded API host.)
	FailBeforeCharge int
	// TimeoutAfterCharge is how many of the next charge requests execute in
	// full, committing the charge (or the decline) and its stored result,
	// and then lose their connection without an answer, so the client sees a
	// network error. A retry with the key replays the stored result.
	TimeoutAfterCharge int
	// FailBeforeChargeRate is the probability, from 0 to 1, that a charge
	// request no count claims fails as FailBeforeCharge describes.
	FailBeforeChargeRate float64
	// TimeoutAfterChargeRate is the probability, from 0 to 1, that a charge
	// request no count or failure claims is dropped as TimeoutAfterCharge
	// describes.
	TimeoutAfterChargeRate float64
	// Delay is added to every authenticated API request. A charge request
	// spends it holding its idempotency key, so concurrent requests with
	// the key are refused with 409 meanwhile.
	Delay time.Duration
}

// fault is what a charge request drew from the plan.
type fault int

const (
	noFault fault = iota
	failBeforeCharge
	dropAfterCharge
)

// faultPlan is the Faults a Server draws from, shared by its requests.
type faultPlan struct {
	mu sync.Mutex
	f  Faults
}

func (p *faultPlan) draw() fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.f.FailBeforeCharge > 0:
		p.f.FailBeforeCharge--
		return failBeforeCharge
	case p.f.TimeoutAfterCharge > 0:
		p.f.TimeoutAfterCharge--
		return dropAfterCharge
	case rand.Float64() < p.f.FailBeforeChargeRate:
		return failBeforeCharge
	case rand.Float64() < p.f.TimeoutAfterChargeRate:
		return dropAfterCharge
	}
	return noFault
}

func (p *faultPlan) delay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.f.Delay
}

func (p *faultPlan) update(change func(*Faults)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	change(&p.f)
}

// Faults returns the faults still planned.
func (s *Server) Faults() Faults {
	var f Faults
	s.faults.update(func(planned *Faults) { f = *planned })
	return f
}

// FailBeforeCharge makes the next n charge requests fail before executing
// (see Faults.FailBeforeCharge), replacing any count still pending. n <= 0
// cancels the count.
func (s *Server) FailBeforeCharge(n int) {
	s.faults.update(func(f *Faults) { f.FailBeforeCharge = max(n, 0) })
}

// TimeoutAfterCharge makes the next n charge requests lose their connection
// after executing (see Faults.TimeoutAfterCharge), replacing any count still
// pending. n <= 0 cancels the count.
func (s *Server) TimeoutAfterCharge(n int) {
	s.faults.update(func(f *Faults) { f.TimeoutAfterCharge = max(n, 0) })
}

// SetDelay sets the latency added to every API request; d <= 0 removes it.
func (s *Server) SetDelay(d time.Duration) {
	s.faults.update(func(f *Faults) { f.Delay = max(d, 0) })
}

// SetRates sets the probabilities of a failure before and a drop after the
// charge for requests no count claims. It returns an error, and changes
// nothing, unless both are between 0 and 1.
func (s *Server) SetRates(failBefore, timeoutAfter float64) error {
	if err := checkRates(failBefore, timeoutAfter); err != nil {
		return fmt.Errorf("fakestripe: %w", err)
	}
	s.faults.update(func(f *Faults) {
		f.FailBeforeChargeRate, f.TimeoutAfterChargeRate = failBefore, timeoutAfter
	})
	return nil
}

func checkRates(rates ...float64) error {
	for _, r := range rates {
		// Written so that NaN fails too.
		if !(r >= 0 && r <= 1) {
			return fmt.Errorf("fault rate %v is not between 0 and 1", r)
		}
	}
	return nil
}

// faultsJSON is Faults on the wire of /_faults. In a POST, absent fields
// leave their fault as it is.
type faultsJSON struct {
	FailBeforeCharge       *int     `json:"fail_before_charge,omitempty"`
	TimeoutAfterCharge     *int     `json:"timeout_after_charge,omitempty"`
	FailBeforeChargeRate   *float64 `json:"fail_before_charge_rate,omitempty"`
	TimeoutAfterChargeRate *float64 `json:"timeout_after_charge_rate,omitempty"`
	DelayMS                *int64   `json:"delay_ms,omitempty"`
}

func (s *Server) writeFaults(w http.ResponseWriter) {
	f := s.Faults()
	delayMS := f.Delay.Milliseconds()
	writeResponse(w, jsonResponse(http.StatusOK, faultsJSON{
		FailBeforeCharge:       &f.FailBeforeCharge,
		TimeoutAfterCharge:     &f.TimeoutAfterCharge,
		FailBeforeChargeRate:   &f.FailBeforeChargeRate,
		TimeoutAfterChargeRate: &f.TimeoutAfterChargeRate,
		DelayMS:                &delayMS,
	}))
}

// getFaults serves GET /_faults: the faults still planned.
func (s *Server) getFaults(w http.ResponseWriter, _ *http.Request) {
	s.writeFaults(w)
}

// postFaults serves POST /_faults: it sets the faults the JSON body names,
// all or none, and answers with the resulting plan.
func (s *Server) postFaults(w http.ResponseWriter, r *http.Request) {
	var in faultsJSON
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	err := dec.Decode(&in)
	if err == nil {
		err = in.check()
	}
	if err != nil {
		writeResponse(w, *invalidParam("", "", "Invalid fault plan: "+err.Error()))
		return
	}
	s.faults.update(func(f *Faults) {
		if in.FailBeforeCharge != nil {
			f.FailBeforeCharge = *in.FailBeforeCharge
		}
		if in.TimeoutAfterCharge != nil {
			f.TimeoutAfterCharge = *in.TimeoutAfterCharge
		}
		if in.FailBeforeChargeRate != nil {
			f.FailBeforeChargeRate = *in.FailBeforeChargeRate
		}
		if in.TimeoutAfterChargeRate != nil {
			f.TimeoutAfterChargeRate = *in.TimeoutAfterChargeRate
		}
		if in.DelayMS != nil {
			f.Delay = time.Duration(*in.DelayMS) * time.Millisecond
		}
	})
	s.logger.Info("fakestripe: fault plan changed", slog.Any("faults", s.Faults()))
	s.writeFaults(w)
}

func (in faultsJSON) check() error {
	switch {
	case in.FailBeforeCharge != nil && *in.FailBeforeCharge < 0:
		return errors.New("fail_before_charge is negative")
	case in.TimeoutAfterCharge != nil && *in.TimeoutAfterCharge < 0:
		return errors.New("timeout_after_charge is negative")
	case in.DelayMS != nil && *in.DelayMS < 0:
		return errors.New("delay_ms is negative")
	}
	for _, r := range []*float64{in.FailBeforeChargeRate, in.TimeoutAfterChargeRate} {
		if r != nil {
			if err := checkRates(*r); err != nil {
				return err
			}
		}
	}
	return nil
}

// drop closes the client's connection without an answer, as a network
// failure after the charge would.
func drop(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// HTTP/2 connections cannot be hijacked; aborting the handler
		// resets the stream, which the client sees the same way.
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}
