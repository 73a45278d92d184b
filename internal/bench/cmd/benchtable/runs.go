package main

import (
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/atomicphase/atomicphase/internal/bench"
)

// ratios collects the all-rounds throughput ratio, library over baseline,
// of every run of the comparison, by configuration, library kind and
// number of clients, in the order the runs were made.
type ratios struct {
	configs []string
	byCell  map[ratioKey][]float64
}

type ratioKey struct {
	config      string
	kind        bench.Kind
	concurrency int
}

// add records the ratios of one run on config.
func (r *ratios) add(config string, all []*measured) {
	if r.byCell == nil {
		r.byCell = map[ratioKey][]float64{}
	}
	if !slices.Contains(r.configs, config) {
		r.configs = append(r.configs, config)
	}
	for _, m := range all {
		bk, ok := m.kind.Baseline()
		if !ok {
			continue
		}
		for _, b := range all {
			if b.kind == bk && b.concurrency == m.concurrency {
				k := ratioKey{config, m.kind, m.concurrency}
				r.byCell[k] = append(r.byCell[k], allRounds(m.rounds, b.rounds))
			}
		}
	}
}

// allRounds is the library's throughput over the baseline's for all rounds
// together.
func allRounds(lib, base []bench.Result) float64 {
	return bench.Merge(lib...).PerSecond() / bench.Merge(base...).PerSecond()
}

// spread is how far the all-rounds ratio of one run strays from run to run:
// the standard deviation of its logarithm within each cell, pooled over
// the cells of kinds, and its degrees of freedom.
func (r *ratios) spread(kinds ...bench.Kind) (sd float64, df int) {
	var ss float64
	for k, v := range r.byCell {
		if !slices.Contains(kinds, k.kind) || len(v) < 2 {
			continue
		}
		var mean float64
		for _, x := range v {
			mean += math.Log(x)
		}
		mean /= float64(len(v))
		for _, x := range v {
			ss += (math.Log(x) - mean) * (math.Log(x) - mean)
		}
		df += len(v) - 1
	}
	if df == 0 {
		return 0, 0
	}
	return math.Sqrt(ss / float64(df)), df
}

// median returns the median of v, which must not be empty.
func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// phaseKinds are the library's requests that run phases, and shortKinds
// those answered by acquire alone; their ratios stray from run to run by
// different amounts, so each group gets its own spread.
var (
	phaseKinds = []bench.Kind{bench.LibraryRun, bench.LibraryRides}
	shortKinds = []bench.Kind{bench.LibraryReplay, bench.LibraryConflict}
)

// print writes, per configuration, the median of the runs' all-rounds
// ratios with their lowest and highest, then how far a further run may
// land from the median: a 95 % prediction interval for one more run, from
// the pooled standard deviation and Student's t for its degrees of freedom.
func (r *ratios) print(w io.Writer, runs int) {
	fmt.Fprintf(w, "### %d runs\n\n", runs)
	for _, config := range r.configs {
		fmt.Fprintf(w, "%s: library throughput ÷ baseline's, all rounds, median of the %d runs (lowest–highest):\n\n", config, runs)
		fmt.Fprintln(w, "| request | 1 client | 8 clients | 32 clients |")
		fmt.Fprintln(w, "|---|---:|---:|---:|")
		for _, k := range append(slices.Clone(phaseKinds), shortKinds...) {
			fmt.Fprintf(w, "| %s |", k)
			for _, c := range bench.Concurrencies {
				v := r.byCell[ratioKey{config, k, c}]
				if len(v) == 0 {
					fmt.Fprint(w, " — |")
					continue
				}
				fmt.Fprintf(w, " %.2f (%.2f–%.2f) |", median(v), slices.Min(v), slices.Max(v))
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w)
	}
	for _, g := range []struct {
		name  string
		kinds []bench.Kind
	}{{"the requests that run phases", phaseKinds}, {"replay and 409", shortKinds}} {
		sd, df := r.spread(g.kinds...)
		if df == 0 {
			continue
		}
		within := t975(df) * sd * math.Sqrt(1+1/float64(runs))
		fmt.Fprintf(w, "Run to run, %s: the ratio's logarithm strays by %.3f (standard deviation pooled over their cells, %d degrees of freedom); a further run lands within ±%.0f %% of the median about 19 times in 20.\n\n",
			g.name, sd, df, 100*within)
	}
}

// t975 is the 97.5th percentile of Student's t distribution with df
// degrees of freedom, by the first three terms of its expansion around the
// normal's 1.96: within 0.03 of the exact value from 3 degrees of freedom
// on, within 0.002 from 6.
func t975(df int) float64 {
	const z = 1.959964
	n := float64(df)
	return z + (math.Pow(z, 3)+z)/(4*n) +
		(5*math.Pow(z, 5)+16*math.Pow(z, 3)+3*z)/(96*n*n) +
		(3*math.Pow(z, 7)+19*math.Pow(z, 5)+17*math.Pow(z, 3)-15*z)/(384*n*n*n)
}
