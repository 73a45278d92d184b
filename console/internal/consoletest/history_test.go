package consoletest_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/atomicphase/atomicphase/console/internal/consoletest"
)

// seedHistory records the status history of the last hour as completers
// would have, minute by minute from 59 minutes ago to a minute ago, but
// for 30 to 34 minutes ago, which no completer recorded: payments with
// keys piling up stuck and then draining, refunds with none for the first
// half hour.
func seedHistory(t *testing.T, f *consoletest.Fixture) {
	t.Helper()
	_, err := f.Pool.Exec(context.Background(), `
INSERT INTO atomicphase_status_history (minute, workflow, status, keys)
SELECT date_trunc('minute', now()) - make_interval(mins => m), w, s,
       CASE w WHEN 'payments' THEN
           CASE s WHEN 'in_flight' THEN 2 + m % 3 WHEN 'waiting' THEN m % 4
                  WHEN 'stuck' THEN greatest(0, 12 - abs(m - 20)) WHEN 'unknown' THEN CASE WHEN m < 40 THEN 2 ELSE 0 END
                  ELSE CASE WHEN m < 25 THEN 1 ELSE 0 END END
       ELSE CASE WHEN m < 30 AND s = 'waiting' THEN 1 + m % 2 ELSE 0 END END
FROM generate_series(1, 59) AS m,
     unnest(ARRAY['payments', 'refunds']) AS w,
     unnest(ARRAY['in_flight', 'waiting', 'stuck', 'unknown', 'dead']) AS s
WHERE m NOT BETWEEN 30 AND 34`)
	if err != nil {
		t.Fatal(err)
	}
}

func TestTheOverviewDrawsUnfinishedKeysByStatePerWorkflow(t *testing.T) {
	t.Parallel()
	f, srv, ctx := setup(t)
	seedHistory(t, f)
	// One real completer pass records the current minute of payments.
	before, err := f.Client.CountsByWorkflow(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Client.Complete(context.Background()); err != nil {
		t.Fatal(err)
	}
	signIn(t, ctx, srv, "alice")
	for _, width := range []int64{1280, 390} {
		run(t, ctx, "overview", chromedp.EmulateViewport(width, 844), chromedp.Navigate(srv.URL+"/console/"),
			chromedp.WaitVisible(css(`svg.status-chart`)), chromedp.ScrollIntoView(css(`figure.status`)),
			screenshot(fmt.Sprintf("console-status-history-%d", width)))
		if over := get(t, ctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth`)); over > int(width) {
			t.Errorf("the overview is %d px wide in a %d px window", over, width)
		}
	}
	charts := get(t, ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("figure.status")]
		.map(f => f.querySelector("figcaption").innerText + ":" + f.querySelectorAll("g.minute").length)`))
	// 54 seeded minutes each, and the pass's minute for payments.
	if !slices.Equal(charts, []string{"payments:55", "refunds:54"}) {
		t.Fatalf("the status charts are %q; want payments with 55 recorded minutes, refunds with 54", charts)
	}
	last := get(t, ctx, chromedp.Evaluate[string](`document.querySelector("figure.status")
		.querySelector("g.minute:last-of-type title").textContent.split(" UTC: ")[1]`))
	p := before["payments"]
	want := fmt.Sprintf("%d in flight, %d waiting, %d stuck, %d unknown, %d dead", p.InFlight, p.Waiting, p.Stuck, p.Unknown, p.Dead)
	if last != want {
		t.Errorf("the pass's minute reads %q; want the counts before the pass, %q", last, want)
	}
	// Each bar is as tall as its count: the stuck peak, 12 keys of 20
	// minutes ago, against the chart's top of 20.
	heights := get(t, ctx, chromedp.Evaluate[[]float64](`[...document.querySelector("figure.status")
		.querySelectorAll("rect.bar.stuck")].map(r => r.height.baseVal.value)`))
	if len(heights) == 0 || slices.Max(heights) < 40 {
		t.Errorf("the stuck bars are %v units high; want the peak of 12 at least 40 of the chart's 100", heights)
	}
	noScriptRan(t, ctx, "overview")
}

func TestTheOverviewShowsTheBacklogAndHowFastItDrains(t *testing.T) {
	t.Parallel()
	f, srv, ctx := setup(t)
	// The completers counted 1000 unfinished keys 40 seconds ago, 400 20
	// seconds ago and 390 just now: the rate runs from the newest count at
	// least DrainSpan old to the keys counted now.
	if _, err := f.Pool.Exec(context.Background(), `
INSERT INTO atomicphase_backlog_samples (slot, at, keys)
SELECT to_timestamp(floor(extract(epoch FROM now() - ago) / 5) * 5), now() - ago, keys
FROM (VALUES (interval '40 seconds', 1000), (interval '20 seconds', 400), (interval '2 seconds', 390)) AS s(ago, keys)`); err != nil {
		t.Fatal(err)
	}
	want, err := f.Client.Backlog(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !want.Measured || want.Over < 20*time.Second || want.Over >= 30*time.Second ||
		want.PerSecond != float64(400-want.Unfinished)/want.Over.Seconds() || want.Stuck == 0 {
		t.Fatalf("the client's backlog is %+v; want 400 keys less those unfinished now over the last 20 seconds", want)
	}
	signIn(t, ctx, srv, "alice")
	run(t, ctx, "overview", chromedp.Navigate(srv.URL+"/console/"), chromedp.WaitVisible(css(`.card.backlog`)),
		screenshot("console-overview-backlog"))
	card := get(t, ctx, chromedp.Evaluate[[]string](`(c => [c.querySelector(".n").textContent, c.querySelector(".rate").textContent,
		new URL(c.querySelector("a").href).search, c.querySelector("a").textContent])(document.querySelector(".card.backlog"))`))
	text := fmt.Sprintf("%d stuck and %d waiting: the completer's backlog", want.Stuck, want.Waiting)
	if card[0] != fmt.Sprint(want.Stuck) || card[2] != "?state=stuck" || strings.Join(strings.Fields(card[3]), " ") != text {
		t.Errorf("the backlog card reads %q; want %q linking to the stuck ones", card, text)
	}
	// The page counted a moment after the client did: its span may be a
	// second longer.
	// The keys not due yet are said with when they come due.
	due := ""
	if want.NotDue > 0 {
		due = fmt.Sprintf(`; %d come due in [0-9ms]+( to [0-9ms]+)?`, want.NotDue)
	}
	rate := fmt.Sprintf(`^draining \d+\.\d a second over the last 2\ds, empty in about [0-9ms]+%s; %d in flight$`, due, want.Unfinished-want.Keys())
	if !regexp.MustCompile(rate).MatchString(card[1]) {
		t.Errorf("the backlog card's rate reads %q; want it draining as %q does", card[1], want.Rate())
	}
	noScriptRan(t, ctx, "overview")
}
