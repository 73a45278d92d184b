package payoutprovider

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// Faults is a Server's plan of failures. Only payout requests about to
// execute draw from it: requests rejected by validation, refused with 409 or
// answered from a stored result never consume a fault. Counts are drawn
// before rates, and a failure before the payout before a drop after it.
type Faults struct {
	// FailBeforePayout is how many of the next payout requests are answered
	// 500 without executing. Nothing is stored under their key, so a retry
	// with the key executes.
	FailBeforePayout int
	// TimeoutAfterPayout is how many of the next payout requests execute in
	// full, committing the payout and its stored result, and then lose their
	// connection without an answer. A retry with the key replays the result.
	TimeoutAfterPayout int
	// FailBeforePayoutRate is the probability, from 0 to 1, that a payout
	// request no count claims fails as FailBeforePayout describes.
	FailBeforePayoutRate float64
	// TimeoutAfterPayoutRate is the probability, from 0 to 1, that a payout
	// request no count or failure claims is dropped as TimeoutAfterPayout
	// describes.
	TimeoutAfterPayoutRate float64
	// Delay is added to every API request. A payout request spends it
	// holding its key, so concurrent requests with the key get 409.
	Delay time.Duration
}

func (f Faults) check() error {
	switch {
	case f.FailBeforePayout < 0 || f.TimeoutAfterPayout < 0:
		return errors.New("fault counts must not be negative")
	case f.Delay < 0:
		return errors.New("delay must not be negative")
	}
	for _, r := range []float64{f.FailBeforePayoutRate, f.TimeoutAfterPayoutRate} {
		// Written so that NaN fails too.
		if !(r >= 0 && r <= 1) {
			return fmt.Errorf("fault rate %v is not between 0 and 1", r)
		}
	}
	return nil
}

// fault is what a payout request drew from the plan.
type fault int

const (
	noFault fault = iota
	failBeforePayout
	dropAfterPayout
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
	case p.f.FailBeforePayout > 0:
		p.f.FailBeforePayout--
		return failBeforePayout
	case p.f.TimeoutAfterPayout > 0:
		p.f.TimeoutAfterPayout--
		return dropAfterPayout
	case rand.Float64() < p.f.FailBeforePayoutRate:
		return failBeforePayout
	case rand.Float64() < p.f.TimeoutAfterPayoutRate:
		return dropAfterPayout
	}
	return noFault
}

func (p *faultPlan) delay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.f.Delay
}

// Faults returns the faults still planned.
func (s *Server) Faults() Faults {
	s.faults.mu.Lock()
	defer s.faults.mu.Unlock()
	return s.faults.f
}

// SetFaults replaces the plan with f. It returns an error, and changes
// nothing, when a count or the delay is negative or a rate is not between 0
// and 1.
func (s *Server) SetFaults(f Faults) error {
	if err := f.check(); err != nil {
		return fmt.Errorf("payoutprovider: %w", err)
	}
	s.faults.mu.Lock()
	defer s.faults.mu.Unlock()
	s.faults.f = f
	return nil
}

// faultsJSON is Faults on the wire of /_faults, with the delay in
// milliseconds.
type faultsJSON struct {
	FailBeforePayout       int     `json:"fail_before_payout"`
	TimeoutAfterPayout     int     `json:"timeout_after_payout"`
	FailBeforePayoutRate   float64 `json:"fail_before_payout_rate"`
	TimeoutAfterPayoutRate float64 `json:"timeout_after_payout_rate"`
	DelayMS                int64   `json:"delay_ms"`
}

func wireFaults(f Faults) faultsJSON {
	return faultsJSON{
		FailBeforePayout: f.FailBeforePayout, TimeoutAfterPayout: f.TimeoutAfterPayout,
		FailBeforePayoutRate: f.FailBeforePayoutRate, TimeoutAfterPayoutRate: f.TimeoutAfterPayoutRate,
		DelayMS: f.Delay.Milliseconds(),
	}
}

func (in faultsJSON) faults() Faults {
	return Faults{
		FailBeforePayout: in.FailBeforePayout, TimeoutAfterPayout: in.TimeoutAfterPayout,
		FailBeforePayoutRate: in.FailBeforePayoutRate, TimeoutAfterPayoutRate: in.TimeoutAfterPayoutRate,
		Delay: time.Duration(in.DelayMS) * time.Millisecond,
	}
}

// getFaults serves GET /_faults: the faults still planned.
func (s *Server) getFaults(w http.ResponseWriter, _ *http.Request) {
	writeResponse(w, jsonResponse(http.StatusOK, wireFaults(s.Faults())))
}

// postFaults serves POST /_faults: fields present in the JSON body replace
// their fault and absent ones keep it, all or none; the answer is the
// resulting plan.
func (s *Server) postFaults(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeResponse(w, *invalidParam("", "invalid fault plan: "+err.Error()))
		return
	}
	s.faults.mu.Lock()
	// Decoding over the current plan is what keeps absent fields as they
	// are; the lock makes the read, change and write one step.
	in := wireFaults(s.faults.f)
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err = dec.Decode(&in)
	f := in.faults()
	if err == nil {
		err = f.check()
	}
	if err == nil {
		s.faults.f = f
	}
	s.faults.mu.Unlock()
	if err != nil {
		writeResponse(w, *invalidParam("", "invalid fault plan: "+err.Error()))
		return
	}
	s.logger.Info("payoutprovider: fault plan changed", slog.Any("faults", f))
	writeResponse(w, jsonResponse(http.StatusOK, wireFaults(f)))
}
