// Package sim is the rides client simulator: riders who double-click and
// lose their connection, and whose app retries each ride with the same
// Idempotency-Key through package caller, as real clients do.
package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atomicphase/atomicphase/caller"
	"github.com/atomicphase/atomicphase/examples/internal/exampleprog"
)

// Config configures a simulation. Zero values mean the default.
type Config struct {
	// APIURL is the rides API's base URL. Required unless APIURLs is set.
	APIURL string
	// APIURLs are the base URLs of several rides API processes sharing one
	// database. When set, each attempt goes to one picked at random, so the
	// copies and retries of a ride land on different processes.
	APIURLs []string
	// Rides caps the rides requested (default: unlimited within Duration).
	Rides int
	// Duration bounds the run (default 20s when Rides is zero).
	Duration time.Duration
	// Concurrency is how many riders act at once (default 8).
	Concurrency int
	// Riders are the emails riders use; the first is picked most often
	// (default user@example.com and declined@example.com).
	Riders []string
	// DuplicateRate is the share of rides sent as several concurrent
	// identical requests (default 0.2).
	DuplicateRate float64
	// DropRate is the share of attempts whose connection the client drops
	// before the answer arrives (default 0.05).
	DropRate float64
	// GiveUpAfter is how long a rider retries one ride before leaving it
	// to the completer (default 15s): the caller's elapsed budget.
	GiveUpAfter time.Duration
	// Progress, when set, receives a live progress line.
	Progress io.Writer
	// Transport sends each attempt (default: a transport of the
	// simulation's own); each attempt is bounded by 10s.
	Transport http.RoundTripper
	// Observe, when set, is called with the final answer of every ride
	// request, from the riders' goroutines at once; requests given up on
	// get none.
	Observe func(Answer)
}

// Answer is the final answer to a ride request.
type Answer struct {
	// API is the base URL the answering attempt went to.
	API string
	// Key, Rider and Form are the request: its Idempotency-Key, its
	// Authorization and its form-encoded body.
	Key, Rider, Form string
	// Sent is when the answering attempt was sent; Received, when its
	// answer's body was read.
	Sent, Received time.Time
	Status         int
	Body           string
	// Replayed is true when the answer carried Idempotent-Replayed: true.
	Replayed bool
}

// Stats counts what the riders saw. Every ride ends in exactly one of
// Created, Declined, PaymentFailed, Abandoned and Rejected, so they add up
// to Rides; every attempt in exactly one of Answered, Replayed, Conflicts,
// Unavailable, ServerErrors, Dropped, Lost and Unexpected, so they add up to
// Requests.
type Stats struct {
	// Rides is the rides requested, each under a key of its own.
	Rides int64 `json:"rides"`
	// Created, Declined and PaymentFailed count the rides whose final
	// answer was 201, 402 or 502 (stored, so that the caller's retry of a
	// 502 gets it replayed), whichever request of the ride got it and
	// whether it was replayed.
	Created       int64 `json:"created"`
	Declined      int64 `json:"declined"`
	PaymentFailed int64 `json:"payment_failed"`
	// Abandoned counts the rides that got no final answer before their
	// rider gave up (Config.GiveUpAfter): the caller returned its
	// UnknownOutcomeError. The completer finishes them.
	Abandoned int64 `json:"abandoned"`
	// Rejected counts the rides answered another 4xx: a bug in the
	// simulator or the server.
	Rejected int64 `json:"rejected"`

	// Requests is the attempts sent, retries and duplicates included.
	Requests int64 `json:"requests"`
	// Answered is the final answers made by the request's own run;
	// Replayed the final answers replayed from the key.
	Answered int64 `json:"answered"`
	Replayed int64 `json:"replayed"`
	// Conflicts (409), Unavailable (503) and ServerErrors (other 5xx,
	// including the first 502 of a ride whose payment failed) were
	// retried with the same key.
	Conflicts    int64 `json:"conflicts"`
	Unavailable  int64 `json:"unavailable"`
	ServerErrors int64 `json:"server_errors"`
	// Dropped is the requests whose rider dropped the connection on
	// purpose (Config.DropRate); Lost the requests that got no answer
	// otherwise: the server closed the connection (a crash), the request
	// timed out, or the rider gave up waiting. Both were retried.
	Dropped int64 `json:"dropped"`
	Lost    int64 `json:"lost"`
	// Unexpected is the requests answered another 4xx.
	Unexpected int64 `json:"unexpected"`

	// Inconsistent counts keys that were answered two different final
	// responses, and rides that were Rejected; it must be zero.
	Inconsistent int64 `json:"inconsistent"`
	// AbandonedKeys are the Idempotency-Keys of the Abandoned rides.
	AbandonedKeys []string `json:"abandoned_keys,omitempty"`
}

type counters struct {
	rides, created, declined, paymentFailed, abandoned, rejected,
	requests, answered, replayed, conflicts, unavailable, serverErrors,
	dropped, lost, unexpected, inconsistent atomic.Int64
}

func (c *counters) stats() Stats {
	return Stats{Rides: c.rides.Load(), Created: c.created.Load(), Declined: c.declined.Load(),
		PaymentFailed: c.paymentFailed.Load(), Abandoned: c.abandoned.Load(), Rejected: c.rejected.Load(),
		Requests: c.requests.Load(), Answered: c.answered.Load(), Replayed: c.replayed.Load(),
		Conflicts: c.conflicts.Load(), Unavailable: c.unavailable.Load(), ServerErrors: c.serverErrors.Load(),
		Dropped: c.dropped.Load(), Lost: c.lost.Load(), Unexpected: c.unexpected.Load(),
		Inconsistent: c.inconsistent.Load()}
}

// Run simulates riders until Duration passes or Rides are requested, and
// returns what they saw.
func Run(ctx context.Context, cfg Config) (Stats, error) {
	if len(cfg.APIURLs) == 0 {
		if cfg.APIURL == "" {
			return Stats{}, errors.New("sim: Config.APIURL or APIURLs is required")
		}
		cfg.APIURLs = []string{cfg.APIURL}
	}
	if cfg.Rides == 0 && cfg.Duration == 0 {
		cfg.Duration = 20 * time.Second
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 8
	}
	if len(cfg.Riders) == 0 {
		cfg.Riders = []string{"user@example.com", "declined@example.com"}
	}
	if cfg.DuplicateRate == 0 {
		cfg.DuplicateRate = 0.2
	}
	if cfg.DropRate == 0 {
		cfg.DropRate = 0.05
	}
	if cfg.GiveUpAfter == 0 {
		cfg.GiveUpAfter = 15 * time.Second
	}
	if cfg.Transport == nil {
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		cfg.Transport = tr
	}
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	s := &simulation{cfg: cfg, answers: map[string]string{}}
	var err error
	s.caller, err = caller.New(caller.Config{
		Transport:   &rider{sim: s},
		MaxElapsed:  cfg.GiveUpAfter,
		MaxAttempts: math.MaxInt32, // the rider gives up by time
		BaseDelay:   50 * time.Millisecond,
		MaxDelay:    time.Second,
		Observe:     s.count,
	})
	if err != nil {
		return Stats{}, err
	}
	if cfg.Progress != nil {
		stop := exampleprog.Progress(cfg.Progress, s.progressLine)
		defer stop()
	}

	var (
		wg     sync.WaitGroup
		issued atomic.Int64
	)
	for range cfg.Concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				if cfg.Rides > 0 && issued.Add(1) > int64(cfg.Rides) {
					return
				}
				s.ride(ctx)
			}
		})
	}
	wg.Wait()
	st := s.c.stats()
	s.mu.Lock()
	st.AbandonedKeys = s.abandoned
	s.mu.Unlock()
	return st, nil
}

type simulation struct {
	cfg    Config
	caller *caller.Client
	c      counters

	mu        sync.Mutex
	answers   map[string]string // key → first final answer
	abandoned []string          // keys of the rides given up on
}

// ride requests one ride, as one or several concurrent identical requests
// under one key, each retrying until it gets a final answer, and counts how
// the ride ended.
func (s *simulation) ride(ctx context.Context) {
	s.c.rides.Add(1)
	key, err := caller.NewKey()
	if err != nil {
		panic(err) // crypto/rand never fails
	}
	rider := s.cfg.Riders[0]
	if len(s.cfg.Riders) > 1 && mrand.Float64() < 0.1 {
		rider = s.cfg.Riders[1+mrand.IntN(len(s.cfg.Riders)-1)]
	}
	form := url.Values{}
	for _, f := range []struct {
		name  string
		limit float64
	}{{"origin_lat", 90}, {"origin_lon", 180}, {"target_lat", 90}, {"target_lon", 180}} {
		form.Set(f.name, strconv.FormatFloat((mrand.Float64()*2-1)*f.limit, 'f', 6, 64))
	}
	body := form.Encode()
	copies := 1
	if mrand.Float64() < s.cfg.DuplicateRate {
		copies = 2 + mrand.IntN(3)
	}
	// Requests keep going after the simulation's end until they have an
	// answer or give up, so no ride is cut off half-sent.
	rctx := context.WithoutCancel(ctx)
	statuses := make([]int, copies)
	var wg sync.WaitGroup
	for i := range copies {
		wg.Go(func() { statuses[i] = s.request(rctx, key, rider, body) })
	}
	wg.Wait()
	// The copies' final answers are equal, or Inconsistent counts them;
	// the ride ended as the first final answer says.
	final, rejected := 0, false
	for _, st := range statuses {
		switch {
		case final == 0 && isFinal(st):
			final = st
		case st > 0 && !isFinal(st):
			rejected = true
		}
	}
	switch {
	case final == http.StatusCreated:
		s.c.created.Add(1)
	case final == http.StatusPaymentRequired:
		s.c.declined.Add(1)
	case final == http.StatusBadGateway:
		s.c.paymentFailed.Add(1)
	case rejected:
		s.c.rejected.Add(1)
		s.c.inconsistent.Add(1)
	default:
		s.c.abandoned.Add(1)
		s.mu.Lock()
		s.abandoned = append(s.abandoned, key)
		s.mu.Unlock()
	}
}

// isFinal reports the statuses a rides key stores: created, declined, or
// the payment refused.
func isFinal(status int) bool {
	return status == http.StatusCreated || status == http.StatusPaymentRequired || status == http.StatusBadGateway
}

// request sends one copy of a ride through the caller, which retries it
// with the same key until a final answer, and returns its status: 0 when
// the rider gave up first.
func (s *simulation) request(ctx context.Context, key, rider, body string) int {
	at := &attempt{}
	req, err := http.NewRequestWithContext(context.WithValue(ctx, attemptKey{}, at), http.MethodPost,
		strings.TrimRight(s.cfg.APIURLs[0], "/")+"/rides", strings.NewReader(body))
	if err != nil {
		panic(err) // the URL was checked by Run
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", rider)
	req.Header.Set(caller.KeyHeader, key)
	res, err := s.caller.Do(req)
	if err != nil {
		// An UnknownOutcomeError: the rider gave up; the completer
		// finishes the ride.
		return 0
	}
	b, _ := io.ReadAll(res.Body) // buffered by the rider's transport
	_ = res.Body.Close()
	if isFinal(res.StatusCode) {
		s.final(key, res.StatusCode, string(b))
	}
	if s.cfg.Observe != nil {
		s.cfg.Observe(Answer{API: at.api, Key: key, Rider: rider, Form: body, Sent: at.sent, Received: time.Now(),
			Status: res.StatusCode, Body: string(b), Replayed: res.Replayed})
	}
	return res.StatusCode
}

// count counts one attempt of a ride request.
func (s *simulation) count(a caller.Attempt) {
	s.c.requests.Add(1)
	switch {
	case errors.Is(a.Err, errDropped):
		s.c.dropped.Add(1)
	case a.Err != nil:
		s.c.lost.Add(1)
	case isFinal(a.Status) && !a.Retry:
		if a.Replayed {
			s.c.replayed.Add(1)
		} else {
			s.c.answered.Add(1)
		}
	case a.Status == http.StatusConflict:
		s.c.conflicts.Add(1)
	case a.Status == http.StatusServiceUnavailable:
		s.c.unavailable.Add(1)
	case a.Status >= 500:
		s.c.serverErrors.Add(1)
	default:
		// Another 4xx is a bug in the simulator or the server.
		s.c.unexpected.Add(1)
	}
}

// errDropped is the error of an attempt whose rider dropped the connection
// on purpose.
var errDropped = errors.New("the rider dropped the connection")

// attempt is where the rider's transport notes the API and the time of a
// request's latest attempt.
type attempt struct {
	api  string
	sent time.Time
}

type attemptKey struct{}

// rider is the transport under the caller: it sends each attempt to an API
// process picked at random, drops some attempts' connections before their
// answer (Config.DropRate), and reads each answer whole within the
// attempt's 10 seconds.
type rider struct{ sim *simulation }

func (r *rider) RoundTrip(req *http.Request) (*http.Response, error) {
	api := r.sim.cfg.APIURLs[mrand.IntN(len(r.sim.cfg.APIURLs))]
	u, err := url.Parse(strings.TrimRight(api, "/") + req.URL.Path)
	if err != nil {
		return nil, err
	}
	timeout, drop := 10*time.Second, mrand.Float64() < r.sim.cfg.DropRate
	if drop {
		// The rider's connection drops before the answer arrives.
		timeout = time.Duration(mrand.IntN(30)) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(req.Context(), timeout)
	defer cancel()
	out := req.Clone(ctx)
	out.URL, out.Host = u, ""
	if at, ok := req.Context().Value(attemptKey{}).(*attempt); ok {
		at.api, at.sent = api, time.Now()
	}
	resp, err := r.sim.cfg.Transport.RoundTrip(out)
	if err == nil {
		var b []byte
		b, err = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(b))
	}
	if err != nil {
		// The rider dropped it when the drop's deadline, not the
		// request's, ended the attempt.
		if drop && ctx.Err() != nil && req.Context().Err() == nil {
			return nil, fmt.Errorf("%w: %w", errDropped, err)
		}
		return nil, err
	}
	return resp, nil
}

// final records a key's final answer, and counts the key as inconsistent
// when it differs from an earlier one.
func (s *simulation) final(key string, status int, answer string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	got := strconv.Itoa(status) + " " + answer
	if first, ok := s.answers[key]; !ok {
		s.answers[key] = got
	} else if first != got {
		s.c.inconsistent.Add(1)
	}
}

// progressLine is the live line of the simulation: at most 79 columns
// for the numbers of a long run.
func (s *simulation) progressLine() string {
	st := s.c.stats()
	return fmt.Sprintf("rides %d: %d created, %d declined | requests %d: %d 409s, %d unanswered",
		st.Rides, st.Created, st.Declined, st.Requests, st.Conflicts, st.Dropped+st.Lost)
}
