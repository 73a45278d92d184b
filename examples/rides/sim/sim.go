// Package sim is the rides client simulator: riders who double-click,
// lose their connection and retry with the same Idempotency-Key, as real
// clients do.
package sim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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
	// to the completer (default 15s).
	GiveUpAfter time.Duration
	// Progress, when set, receives a live progress line.
	Progress io.Writer
	// Client sends the requests (default: a client with a 10s timeout).
	Client *http.Client
	// Observe, when set, is called with every answer a rider gets, from
	// the riders' goroutines at once; dropped connections get none.
	Observe func(Answer)
}

// Answer is one HTTP answer to a ride request.
type Answer struct {
	// API is the base URL the request went to.
	API string
	// Key, Rider and Form are the request: its Idempotency-Key, its
	// Authorization and its form-encoded body.
	Key, Rider, Form string
	// Sent is when the request was sent; Received, when its answer's body
	// was read.
	Sent, Received time.Time
	Status         int
	Body           string
	// Replayed is true when the answer carried Idempotent-Replayed: true.
	Replayed bool
}

// Stats counts what the riders saw.
type Stats struct {
	Rides        int64 `json:"rides"`
	Requests     int64 `json:"requests"`
	Created      int64 `json:"created"`
	Replayed     int64 `json:"replayed"`
	Conflicts    int64 `json:"conflicts"`
	Declined     int64 `json:"declined"`
	Failed       int64 `json:"failed"`
	Unavailable  int64 `json:"unavailable"`
	ServerErrors int64 `json:"server_errors"`
	Dropped      int64 `json:"dropped"`
	Abandoned    int64 `json:"abandoned"`
	// Inconsistent counts keys that were answered two different final
	// responses; it must be zero.
	Inconsistent int64 `json:"inconsistent"`
}

type counters struct {
	rides, requests, created, replayed, conflicts, declined, failed,
	unavailable, serverErrors, dropped, abandoned, inconsistent atomic.Int64
}

func (c *counters) stats() Stats {
	return Stats{Rides: c.rides.Load(), Requests: c.requests.Load(), Created: c.created.Load(),
		Replayed: c.replayed.Load(), Conflicts: c.conflicts.Load(), Declined: c.declined.Load(),
		Failed: c.failed.Load(), Unavailable: c.unavailable.Load(), ServerErrors: c.serverErrors.Load(),
		Dropped: c.dropped.Load(), Abandoned: c.abandoned.Load(), Inconsistent: c.inconsistent.Load()}
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
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	s := &simulation{cfg: cfg, answers: map[string]string{}}
	stopProgress := s.progress()
	defer stopProgress()

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
	return s.c.stats(), nil
}

type simulation struct {
	cfg Config
	c   counters

	mu      sync.Mutex
	answers map[string]string // key → first final answer
}

// ride requests one ride, as one or several concurrent identical requests
// under one key, each retrying until it gets a final answer.
func (s *simulation) ride(ctx context.Context) {
	s.c.rides.Add(1)
	key := newKey()
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
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.GiveUpAfter)
	defer cancel()
	var wg sync.WaitGroup
	for range copies {
		wg.Go(func() { s.request(rctx, key, rider, body) })
	}
	wg.Wait()
}

// request sends one copy of a ride and retries it, with the same key, until
// a final answer.
func (s *simulation) request(ctx context.Context, key, rider, body string) {
	pause := 50 * time.Millisecond
	for {
		status, answer, replayed, err := s.send(ctx, key, rider, body)
		if ctx.Err() != nil {
			s.c.abandoned.Add(1)
			return
		}
		wait := pause
		switch {
		case err != nil:
			s.c.dropped.Add(1)
		case status == http.StatusCreated || status == http.StatusPaymentRequired || status == http.StatusBadGateway:
			s.final(key, status, answer, replayed)
			return
		case status == http.StatusConflict:
			s.c.conflicts.Add(1)
		case status == http.StatusServiceUnavailable:
			s.c.unavailable.Add(1)
		case status >= 500:
			s.c.serverErrors.Add(1)
		default:
			// A 4xx other than those is a bug in the simulator or server.
			s.c.failed.Add(1)
			s.c.inconsistent.Add(1)
			return
		}
		select {
		case <-ctx.Done():
			s.c.abandoned.Add(1)
			return
		case <-time.After(wait/2 + mrand.N(wait)):
		}
		pause = min(2*pause, time.Second)
	}
}

func (s *simulation) final(key string, status int, answer string, replayed bool) {
	if replayed {
		s.c.replayed.Add(1)
	}
	switch status {
	case http.StatusCreated:
		if !replayed {
			s.c.created.Add(1)
		}
	case http.StatusPaymentRequired:
		if !replayed {
			s.c.declined.Add(1)
		}
	default:
		if !replayed {
			s.c.failed.Add(1)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	got := strconv.Itoa(status) + " " + answer
	if first, ok := s.answers[key]; !ok {
		s.answers[key] = got
	} else if first != got {
		s.c.inconsistent.Add(1)
	}
}

func (s *simulation) send(ctx context.Context, key, rider, body string) (status int, answer string, replayed bool, err error) {
	s.c.requests.Add(1)
	if mrand.Float64() < s.cfg.DropRate {
		// The rider's connection drops before the answer arrives.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(mrand.IntN(30))*time.Millisecond)
		defer cancel()
	}
	api := s.cfg.APIURLs[mrand.IntN(len(s.cfg.APIURLs))]
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(api, "/")+"/rides", strings.NewReader(body))
	if err != nil {
		return 0, "", false, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", rider)
	req.Header.Set("Idempotency-Key", key)
	sent := time.Now()
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		return 0, "", false, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", false, err
	}
	replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	if s.cfg.Observe != nil {
		s.cfg.Observe(Answer{API: api, Key: key, Rider: rider, Form: body, Sent: sent, Received: time.Now(),
			Status: resp.StatusCode, Body: string(b), Replayed: replayed})
	}
	return resp.StatusCode, string(b), replayed, nil
}

// progress prints a live line every quarter second until stopped.
func (s *simulation) progress() (stop func()) {
	if s.cfg.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				fmt.Fprintln(s.cfg.Progress)
				return
			case <-t.C:
				st := s.c.stats()
				fmt.Fprintf(s.cfg.Progress, "\rrides %d  requests %d  created %d  replayed %d  409s %d  declined %d  503s %d  dropped %d ",
					st.Rides, st.Requests, st.Created, st.Replayed, st.Conflicts, st.Declined, st.Unavailable, st.Dropped)
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

func newKey() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}
