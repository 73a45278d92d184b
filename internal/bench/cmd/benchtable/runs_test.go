package main

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/internal/bench"
)

// results returns one run's measurements in which the library's kind k at
// c clients served lib requests and its baseline base, in one round of a
// second each.
func results(k bench.Kind, c int, lib, base int) []*measured {
	bk, _ := k.Baseline()
	return []*measured{
		{kind: k, concurrency: c, rounds: []bench.Result{{Elapsed: time.Second, Latencies: make([]time.Duration, lib)}}},
		{kind: bk, concurrency: c, rounds: []bench.Result{{Elapsed: time.Second, Latencies: make([]time.Duration, base)}}},
	}
}

func TestRatiosGiveTheMedianOfTheRunsAndTheirSpread(t *testing.T) {
	t.Parallel()
	var r ratios
	// Three runs of one cell with ratios 1.1, 1.3 and 1.2; a second cell
	// of another kind of the same group with 1.0 and 1.0.
	for _, lib := range []int{110, 130, 120} {
		r.add("fast", results(bench.LibraryRun, 8, lib, 100))
	}
	for range 2 {
		r.add("fast", results(bench.LibraryRides, 8, 100, 100))
	}
	got := r.byCell[ratioKey{"fast", bench.LibraryRun, 8}]
	if len(got) != 3 || math.Abs(median(got)-1.2) > 1e-9 {
		t.Fatalf("ratios %v, median %v; want three with median 1.2", got, median(got))
	}
	if r.byCell[ratioKey{"fast", bench.BaselineRun, 8}] != nil {
		t.Fatal("a baseline kind has ratios of its own")
	}
	// Pooled: the first cell's squared deviations of the logarithms over
	// its 2 degrees of freedom, the second cell's none over 1.
	var mean, ss float64
	for _, x := range []float64{1.1, 1.3, 1.2} {
		mean += math.Log(x) / 3
	}
	for _, x := range []float64{1.1, 1.3, 1.2} {
		ss += (math.Log(x) - mean) * (math.Log(x) - mean)
	}
	sd, df := r.spread(phaseKinds...)
	if df != 3 || math.Abs(sd-math.Sqrt(ss/3)) > 1e-9 {
		t.Fatalf("spread = %v with %d degrees of freedom; want %v with 3", sd, df, math.Sqrt(ss/3))
	}
	if _, df := r.spread(shortKinds...); df != 0 {
		t.Fatalf("replay and 409, never measured, have %d degrees of freedom", df)
	}

	var out bytes.Buffer
	r.print(&out, 3)
	for _, want := range []string{
		"| library 3-phase | — | 1.20 (1.10–1.30) | — |",
		"| library rides | — | 1.00 (1.00–1.00) | — |",
		"3 degrees of freedom",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "replay and 409:") {
		t.Errorf("summary gives a spread for replay and 409, never measured:\n%s", out.String())
	}
}

func TestMedianOfAnEvenNumberIsTheMeanOfTheMiddleTwo(t *testing.T) {
	t.Parallel()
	if got := median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Fatalf("median = %v, want 2.5", got)
	}
	if got := median([]float64{3, 1, 2}); got != 2 {
		t.Fatalf("median = %v, want 2", got)
	}
}

func TestT975MatchesTheTable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		df   int
		want float64
	}{{3, 3.182}, {6, 2.447}, {10, 2.228}, {36, 2.028}, {1000, 1.962}} {
		tolerance := 0.002
		if c.df < 6 {
			tolerance = 0.03
		}
		if got := t975(c.df); math.Abs(got-c.want) > tolerance {
			t.Errorf("t975(%d) = %.3f, want %.3f", c.df, got, c.want)
		}
	}
}

// TestTheCommitFunctionsOfCitusAreTheAdvanceAndTheFinish: on Citus the
// library's advance and finish are calls of atomicphase_advance_from and
// atomicphase_finish_from, which the per-statement table counts as the advance
// and the finish, beside the baseline's plain UPDATEs, not as others.
func TestTheCommitFunctionsOfCitusAreTheAdvanceAndTheFinish(t *testing.T) {
	for query, want := range map[string]string{
		"SELECT atomicphase_advance_from($1, $2, $3, $4, $5, $6, $7) IS NULL":        "advance: fenced / plain",
		"SELECT atomicphase_finish_from($1, $2, $3, $4, $5, $6, $7, $8) IS NULL":     "finish: fenced / plain",
		"UPDATE baseline_keys SET recovery_point = $2 WHERE id = $1 AND tenant = $3": "advance: fenced / plain",
	} {
		if got := role(query); got != want {
			t.Errorf("role(%q) = %q, want %q", query, got, want)
		}
	}
}
