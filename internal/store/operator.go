package store

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/georgysavva/scany/v2/pgxscan"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/keyrow"
)

// args numbers a statement's parameters as conditions are added to it.
type args []any

// add appends v and returns its placeholder.
func (a *args) add(v any) string {
	*a = append(*a, v)
	return "$" + strconv.Itoa(len(*a))
}

// unfinished reports whether state is one of the unfinished states, whose
// keys a listing reads without reading finished keys (see filterWhere).
func unfinished(state keyrow.Status) bool {
	return state != keyrow.StatusFinished && slices.Contains(keyrow.Statuses(), state)
}

// byIdle reports whether f's listing runs on last_run_at, idle longest
// first, rather than on the id.
func byIdle(f keyrow.ListFilter) bool {
	return f.Sort == keyrow.SortIdle || (f.Sort == "" && unfinished(f.Status))
}

// filterWhere returns the conditions that select f's keys, without its
// cursor. The conditions of the unfinished states read only the keys that
// may be unfinished (runnable keys: see routed) or the partial index
// idempotency_keys_held (keys on hold), so a listing reads only those few
// rows however many finished keys the table holds.
func filterWhere(f keyrow.ListFilter, a *args) ([]string, error) {
	if f.Limit < 0 || f.StuckAfter < 0 || f.OlderThan < 0 || f.NewerThan < 0 {
		return nil, errors.New("Limit, StuckAfter, OlderThan and NewerThan must not be negative")
	}
	const free = `(lock_expires_at IS NULL OR lock_expires_at <= now())`
	var w []string
	switch f.Status {
	case "":
	case keyrow.StatusFinished:
		w = append(w, `finished_at IS NOT NULL`)
	case keyrow.StatusInFlight:
		w = append(w, `finished_at IS NULL AND hold IS NULL AND lock_expires_at > now()`+unfinishedMark)
	case keyrow.StatusWaiting:
		w = append(w, `finished_at IS NULL AND hold IS NULL AND `+free+` AND last_run_at > now() - `+a.add(f.StuckAfter)+`::interval`+unfinishedMark)
	case keyrow.StatusStuck:
		w = append(w, `finished_at IS NULL AND hold IS NULL AND `+free+` AND last_run_at <= now() - `+a.add(f.StuckAfter)+`::interval`+unfinishedMark)
	case keyrow.StatusUnknown, keyrow.StatusDead:
		w = append(w, `hold = '`+string(f.Status)+`'`)
	default:
		return nil, fmt.Errorf("unknown state %q", f.Status)
	}
	if f.Workflow != "" {
		w = append(w, `workflow = `+a.add(f.Workflow))
	}
	if f.Tenant != "" {
		w = append(w, `tenant = `+a.add(f.Tenant))
	}
	if f.KeyPrefix != "" {
		w = append(w, `starts_with(idempotency_key, `+a.add(f.KeyPrefix)+`)`)
	}
	if f.OlderThan > 0 {
		w = append(w, `created_at <= now() - `+a.add(f.OlderThan)+`::interval`)
	}
	if f.NewerThan > 0 {
		w = append(w, `created_at >= now() - `+a.add(f.NewerThan)+`::interval`)
	}
	return w, nil
}

// listSQL builds the statement of a listing page: f's conditions, its
// cursor, and one row more than the page, which tells whether another
// page follows.
//
// Listings of unfinished states page on (last_run_at, id), sorting the few
// keys that may be unfinished; the rest page on the id, newest first,
// through the primary key, whose UUIDv7s sort by creation time. Either
// way a page reads about as many index entries as it returns, however deep
// in the listing it starts, with no OFFSET to skip.
func listSQL(f keyrow.ListFilter, limit int) (string, args, error) {
	var a args
	w, err := filterWhere(f, &a)
	if err != nil {
		return "", nil, err
	}
	switch f.Sort {
	case "", keyrow.SortNewest, keyrow.SortOldest:
	case keyrow.SortIdle:
		if !unfinished(f.Status) {
			// Only the unfinished keys are few enough to sort by
			// last_run_at; on every key it would be a sort of the
			// whole table.
			return "", nil, errors.New("sorting by idle time needs an unfinished state")
		}
	default:
		return "", nil, fmt.Errorf("unknown sort %q", f.Sort)
	}
	idle := byIdle(f)
	order, after := `id DESC`, `<`
	switch {
	case idle:
		order = `last_run_at, id`
	case f.Sort == keyrow.SortOldest:
		order, after = `id`, `>`
	}
	if f.After != "" {
		at, id, err := parseCursor(f.After, idle)
		if err != nil {
			return "", nil, err
		}
		if idle {
			// The plain bound is what the index can range-scan on.
			t, i := a.add(at), a.add(id)
			w = append(w, `last_run_at >= `+t+` AND (last_run_at, id) > (`+t+`, `+i+`)`)
		} else {
			w = append(w, `id `+after+` `+a.add(id))
		}
	}
	sql := `SELECT ` + keyInfoColumns + `
FROM idempotency_keys`
	if len(w) > 0 {
		sql += `
WHERE ` + strings.Join(w, `
  AND `)
	}
	sql += `
ORDER BY ` + order + `
LIMIT ` + a.add(limit+1)
	return sql, a, nil
}

// cursor returns the Next of a page ending with row.
func cursor(row *keyrow.Row, byIdle bool) string {
	if byIdle {
		return strconv.FormatInt(row.LastRunAt.UnixMicro(), 10) + "_" + row.ID.String()
	}
	return row.ID.String()
}

func parseCursor(s string, byIdle bool) (time.Time, [16]byte, error) {
	var at time.Time
	rest := s
	if byIdle {
		micros, id, ok := strings.Cut(s, "_")
		n, err := strconv.ParseInt(micros, 10, 64)
		if !ok || err != nil {
			return at, uuid.Nil, fmt.Errorf("invalid cursor %q for this listing", s)
		}
		at, rest = time.UnixMicro(n), id
	}
	id, err := uuid.Parse(rest)
	if err != nil {
		return at, uuid.Nil, fmt.Errorf("invalid cursor %q for this listing", s)
	}
	return at, id, nil
}

// List returns one page of the keys f selects: those idle longest first
// for the unfinished states, newest first otherwise. Like Inspect, it is a
// plain read.
func List(ctx context.Context, q Querier, f keyrow.ListFilter) (keyrow.Page, error) {
	limit := cmp.Or(f.Limit, keyrow.DefaultListLimit)
	sql, a, err := listSQL(f, limit)
	if err == nil {
		sql, err = routedFor(ctx, q, sql)
	}
	if err != nil {
		return keyrow.Page{}, fmt.Errorf("store: list: %w", err)
	}
	page := keyrow.Page{Keys: []keyrow.Row{}}
	if err := pgxscan.Select(ctx, q, &page.Keys, sql, a...); err != nil {
		return keyrow.Page{}, fmt.Errorf("store: list: %w", err)
	}
	if len(page.Keys) > limit {
		page.Keys = page.Keys[:limit]
		page.Next = cursor(&page.Keys[limit-1], byIdle(f))
	}
	return page, nil
}

// CountMatching counts the keys f selects (its cursor and limit aside),
// stopping at upTo: a count that reaches it means "upTo or more", so that
// counting a broad filter never reads a large table whole.
func CountMatching(ctx context.Context, q Querier, f keyrow.ListFilter, upTo int) (int, error) {
	var a args
	w, err := filterWhere(f, &a)
	if err != nil {
		return 0, fmt.Errorf("store: count matching: %w", err)
	}
	sql := `SELECT count(*) FROM (SELECT 1 FROM idempotency_keys`
	if len(w) > 0 {
		sql += ` WHERE ` + strings.Join(w, ` AND `)
	}
	sql += ` LIMIT ` + a.add(upTo) + `) AS matching`
	if sql, err = routedFor(ctx, q, sql); err != nil {
		return 0, fmt.Errorf("store: count matching: %w", err)
	}
	var n int
	if err := q.QueryRow(ctx, sql, a...).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count matching: %w", err)
	}
	return n, nil
}

// exactCountPages is the table size, in pages, up to which Count counts
// finished keys exactly: 32 MiB of 8 KiB pages, read in milliseconds.
// Beyond it, the count is estimated from the planner's statistics.
const exactCountPages = 4096

// tableSizeSQL is the table's estimated rows per page and its current size
// in pages: the planner's own way of estimating a table's rows (reltuples
// / relpages scaled to the current size), which stays close between the
// ANALYZE runs of autovacuum. reltuples is -1 before the first one.
const tableSizeSQL = `
SELECT CASE WHEN c.relpages > 0 AND c.reltuples >= 0 THEN c.reltuples / c.relpages END AS per_page,
       pg_relation_size(c.oid) / current_setting('block_size')::int AS pages
FROM pg_class c
WHERE c.oid = 'idempotency_keys'::regclass`

// countUnfinishedSQL counts the unfinished keys of each workflow by state.
// Each half reads only keys that may be unfinished (the runnable keys: see
// routed; the keys on hold: their partial index), never a finished key.
const countUnfinishedSQL = `
SELECT workflow, 0 AS finished,
       count(*) FILTER (WHERE lock_expires_at > now()) AS in_flight,
       count(*) FILTER (WHERE (lock_expires_at IS NULL OR lock_expires_at <= now())
                          AND last_run_at > now() - $1::interval) AS waiting,
       count(*) FILTER (WHERE (lock_expires_at IS NULL OR lock_expires_at <= now())
                          AND last_run_at <= now() - $1::interval) AS stuck,
       0 AS unknown, 0 AS dead
FROM idempotency_keys
WHERE finished_at IS NULL AND hold IS NULL{unfinished}
GROUP BY workflow
UNION ALL
SELECT workflow, 0, 0, 0, 0, count(*) FILTER (WHERE hold = 'unknown'), count(*) FILTER (WHERE hold = 'dead')
FROM idempotency_keys
WHERE hold IS NOT NULL
GROUP BY workflow`

// countAllSQL is countUnfinishedSQL that also counts the finished keys by
// workflow, reading every one: for small tables only. One statement sees
// one snapshot, so a key that finishes meanwhile is counted once, and
// the counts add up to the keys there were.
const countAllSQL = countUnfinishedSQL + `
UNION ALL
SELECT workflow, count(*), 0, 0, 0, 0, 0 FROM idempotency_keys WHERE finished_at IS NOT NULL GROUP BY workflow`

// countDistributedSQL counts the keys of each workflow by state on a key
// table distributed with Citus, in one scan of the table with no UNION:
// Citus sends it to each shard as one query, read in one snapshot of that
// shard, and adds up the shards' counts. Each key lives in one shard, so a
// key that finishes, or goes on hold, meanwhile is counted once. Citus
// would run each part of a UNION ALL as a query of its own, one after the
// other, and a key that moved between two of them would be counted twice,
// or not at all. (A finished key has no hold.)
const countDistributedSQL = `
SELECT workflow,
       count(*) FILTER (WHERE finished_at IS NOT NULL) AS finished,
       count(*) FILTER (WHERE finished_at IS NULL AND hold IS NULL AND lock_expires_at > now()) AS in_flight,
       count(*) FILTER (WHERE finished_at IS NULL AND hold IS NULL AND (lock_expires_at IS NULL OR lock_expires_at <= now())
                          AND last_run_at > now() - $1::interval) AS waiting,
       count(*) FILTER (WHERE finished_at IS NULL AND hold IS NULL AND (lock_expires_at IS NULL OR lock_expires_at <= now())
                          AND last_run_at <= now() - $1::interval) AS stuck,
       count(*) FILTER (WHERE hold = 'unknown') AS unknown,
       count(*) FILTER (WHERE hold = 'dead') AS dead
FROM idempotency_keys`

// countAllDistributedSQL is countAllSQL on Citus: countDistributedSQL over
// every key.
const countAllDistributedSQL = countDistributedSQL + `
GROUP BY workflow`

// countUnfinishedDistributedSQL is countUnfinishedSQL on Citus:
// countDistributedSQL over the keys of the index of unfinished keys and of
// the index of keys on hold, which each shard reads together (a BitmapOr
// of the two), never a finished key.
const countUnfinishedDistributedSQL = countDistributedSQL + `
WHERE (finished_at IS NULL AND hold IS NULL) OR hold IS NOT NULL
GROUP BY workflow`

// workflowShareSQL is the share of the table's rows each common workflow
// has, from the statistics ANALYZE keeps. It finds the table's statistics
// by the schema and name of the table the statement reaches, which need
// not be in the first schema of the search_path (or on it at all, see
// Schema).
const workflowShareSQL = `
SELECT v.workflow, v.share
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname AND s.attname = 'workflow',
     unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS v(workflow, share)
WHERE c.oid = 'idempotency_keys'::regclass`

// CountByWorkflow returns the keys of each workflow by state, a key
// counting as stuck once idle for stuckAfter. The unfinished states are
// counted exactly, without reading finished keys. Finished keys are
// counted exactly in a table of up to exactCountPages pages; in a larger
// one they are estimated from the table's statistics (its estimated rows,
// each workflow's share of them, less its unfinished keys), so that the
// count costs the same at ten million keys as at ten thousand. On a key
// table distributed with Citus the statistics are each shard's, read on
// its node.
func CountByWorkflow(ctx context.Context, q Querier, stuckAfter time.Duration) (map[string]keyrow.Counts, error) {
	distributed, err := IsDistributed(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("store: count: %w", err)
	}
	size, err := readTableSize(ctx, q, distributed)
	if err != nil {
		return nil, fmt.Errorf("store: count: %w", err)
	}
	// Without statistics (the table was never analyzed) there is nothing
	// to estimate from; autovacuum analyzes a table soon after it grows.
	exact := size.pages <= size.exactPages || !size.analyzed
	sql := countUnfinishedSQL
	switch {
	case exact && distributed:
		sql = countAllDistributedSQL
	case distributed:
		sql = countUnfinishedDistributedSQL
	case exact:
		sql = countAllSQL
	}
	sql, err = routed(ctx, q, sql, distributed)
	if err != nil {
		return nil, fmt.Errorf("store: count: %w", err)
	}
	counts := map[string]keyrow.Counts{}
	rows, err := q.Query(ctx, sql, stuckAfter)
	if err != nil {
		return nil, fmt.Errorf("store: count: %w", err)
	}
	var (
		workflow string
		c        keyrow.Counts
	)
	_, err = pgx.ForEachRow(rows, []any{&workflow, &c.Finished, &c.InFlight, &c.Waiting, &c.Stuck, &c.Unknown, &c.Dead}, func() error {
		counts[workflow] = counts[workflow].Add(c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: count: %w", err)
	}
	if exact {
		return counts, nil
	}
	byWorkflow := size.byWorkflow
	if byWorkflow == nil {
		if byWorkflow, err = workflowRows(ctx, q, size.rows); err != nil {
			return nil, fmt.Errorf("store: count: %w", err)
		}
	}
	for workflow, rows := range byWorkflow {
		sum := counts[workflow]
		sum.Finished = max(int(rows)-sum.Unfinished(), 0)
		counts[workflow] = sum
	}
	for w, c := range counts {
		c.FinishedEstimated = true
		counts[w] = c
	}
	return counts, nil
}

// tableSize is what the statistics say of the key table's size.
type tableSize struct {
	// pages is the table's size in pages now, and rows its estimated rows.
	pages int64
	rows  float64
	// exactPages is the size up to which its keys are counted rather
	// than estimated: exactCountPages, or as much on each shard.
	exactPages int64
	// analyzed is whether the statistics estimate the rows at all.
	analyzed bool
	// byWorkflow are the estimated rows of each common workflow, when read
	// with the size (on Citus); nil otherwise.
	byWorkflow map[string]float64
}

// readTableSize reads the key table's size and estimated rows: on one
// Postgres from its catalog, on Citus from each shard's.
func readTableSize(ctx context.Context, q Querier, distributed bool) (tableSize, error) {
	if distributed {
		return readShardSizes(ctx, q)
	}
	var perPage *float64
	size := tableSize{exactPages: exactCountPages}
	if err := q.QueryRow(ctx, tableSizeSQL).Scan(&perPage, &size.pages); err != nil {
		return tableSize{}, err
	}
	if perPage != nil {
		size.rows, size.analyzed = *perPage*float64(size.pages), true
	}
	return size, nil
}

// workflowRows returns the estimated rows of each common workflow of a
// table of rows rows, from its statistics.
func workflowRows(ctx context.Context, q Querier, rows float64) (map[string]float64, error) {
	r, err := q.Query(ctx, workflowShareSQL)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	var (
		workflow string
		share    float64
	)
	_, err = pgx.ForEachRow(r, []any{&workflow, &share}, func() error {
		out[workflow] = share * rows
		return nil
	})
	return out, err
}

// shardSizesSQL is tableSizeSQL and workflowShareSQL for each shard of a
// key table distributed with Citus, run on the shard's node, where its
// rows and statistics are: a coordinator holds neither. Citus puts each
// shard's name in place of %s.
const shardSizesSQL = `
SELECT success, result FROM run_command_on_shards('idempotency_keys', $$
SELECT json_build_object(
    'per_page', CASE WHEN c.relpages > 0 AND c.reltuples >= 0 THEN c.reltuples / c.relpages END,
    'pages', pg_relation_size(c.oid) / current_setting('block_size')::int,
    'shares', (SELECT json_object_agg(v.workflow, v.share)
               FROM pg_namespace n
               JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname AND s.attname = 'workflow',
                    unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS v(workflow, share)
               WHERE n.oid = c.relnamespace))
FROM pg_class c
WHERE c.oid = '%s'::regclass$$)`

// distributedPagesSQL is the size in pages of a key table distributed
// with Citus, over its shards, and how many shards it has: a millisecond,
// where shardSizesSQL opens a connection to each shard's node, a few
// milliseconds each.
const distributedPagesSQL = `
SELECT citus_relation_size('idempotency_keys') / current_setting('block_size')::int,
       (SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'idempotency_keys'::regclass)`

// readShardSizes is readTableSize on Citus, where the shards are counted
// in parallel, each on its node: it counts every key up to
// exactCountPages a shard, and reads each shard's statistics only for a
// larger table. A shard not yet analyzed (too few rows for autovacuum to
// have analyzed it) is taken to hold rows and workflows as the analyzed
// ones do, page for page; with no shard analyzed, nothing is estimated.
// Where the statistics cannot be read (a role that may not call
// run_command_on_shards, a node that refuses the role's connection), the
// keys are counted, as in a smaller table: slower, never wrong.
func readShardSizes(ctx context.Context, q Querier) (tableSize, error) {
	var pages, shards int64
	if err := q.QueryRow(ctx, distributedPagesSQL).Scan(&pages, &shards); err != nil {
		return tableSize{}, err
	}
	exactPages := exactCountPages * max(shards, 1)
	if pages > exactPages {
		if size, err := readShardStatistics(ctx, q, exactPages); err == nil || ctx.Err() != nil {
			return size, err
		}
	}
	return tableSize{pages: pages, exactPages: exactPages}, nil
}

// readShardStatistics reads the size and statistics of each shard of the
// key table on its node, for readShardSizes.
func readShardStatistics(ctx context.Context, q Querier, exactPages int64) (tableSize, error) {
	rows, err := q.Query(ctx, shardSizesSQL)
	if err != nil {
		return tableSize{}, err
	}
	var (
		success bool
		result  string
		size    = tableSize{exactPages: exactPages, byWorkflow: map[string]float64{}}
		// analyzedPages and analyzedRows are those of the analyzed shards.
		analyzedPages int64
		analyzedRows  float64
	)
	_, err = pgx.ForEachRow(rows, []any{&success, &result}, func() error {
		if !success {
			return fmt.Errorf("a shard's size: %s", result)
		}
		var shard struct {
			PerPage *float64           `json:"per_page"`
			Pages   int64              `json:"pages"`
			Shares  map[string]float64 `json:"shares"`
		}
		if err := json.Unmarshal([]byte(result), &shard); err != nil {
			return fmt.Errorf("a shard's size %q: %w", result, err)
		}
		size.pages += shard.Pages
		if shard.PerPage == nil {
			return nil
		}
		rows := *shard.PerPage * float64(shard.Pages)
		analyzedPages += shard.Pages
		analyzedRows += rows
		for workflow, share := range shard.Shares {
			size.byWorkflow[workflow] += share * rows
		}
		return nil
	})
	if err != nil || analyzedPages == 0 {
		return tableSize{pages: size.pages, exactPages: exactPages}, err
	}
	scale := float64(size.pages) / float64(analyzedPages)
	size.rows, size.analyzed = analyzedRows*scale, true
	for workflow := range size.byWorkflow {
		size.byWorkflow[workflow] *= scale
	}
	return size, nil
}

// Count returns how many keys are in each state, a key counting as stuck
// once idle for stuckAfter, counted as CountByWorkflow counts them.
func Count(ctx context.Context, q Querier, stuckAfter time.Duration) (keyrow.Counts, error) {
	byWorkflow, err := CountByWorkflow(ctx, q, stuckAfter)
	if err != nil {
		return keyrow.Counts{}, err
	}
	var total keyrow.Counts
	for _, c := range byWorkflow {
		total = total.Add(c)
	}
	return total, nil
}

// activitySQL reads the age of the oldest runnable unfinished key, from
// the partial index's rows, and the keys first seen in the last hour. The
// library writes UUIDv7 ids, which begin with their creation time in
// milliseconds, so the last hour's keys are a range of the primary key,
// counted from the index alone: the lower bound is the UUID of the hour's
// first millisecond with every other bit zero.
const activitySQL = `
SELECT (SELECT now() - min(created_at) FROM idempotency_keys WHERE finished_at IS NULL AND hold IS NULL{unfinished}),
       (SELECT count(*) FROM idempotency_keys
        WHERE id >= (SELECT (substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-0000-0000-000000000000')::uuid
                     FROM lpad(to_hex((extract(epoch FROM now() - interval '1 hour') * 1000)::bigint), 12, '0') AS h))`

// Activity returns how long the oldest runnable unfinished key has gone
// without finishing (zero when there is none) and how many keys were first
// seen in the last hour.
func Activity(ctx context.Context, q Querier) (oldest time.Duration, lastHour int, err error) {
	var age *time.Duration
	sql, err := routedFor(ctx, q, activitySQL)
	if err != nil {
		return 0, 0, fmt.Errorf("store: activity: %w", err)
	}
	if err := q.QueryRow(ctx, sql).Scan(&age, &lastHour); err != nil {
		return 0, 0, fmt.Errorf("store: activity: %w", err)
	}
	if age != nil {
		oldest = *age
	}
	return oldest, lastHour, nil
}

// actorKey carries the actor of operator actions in a context.
type actorKey struct{}

// WithActor returns ctx naming who performs the operator actions made
// with it, for the audit.
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

// Actor returns the actor ctx names, "unnamed" when it names none.
func Actor(ctx context.Context) string {
	if a, _ := ctx.Value(actorKey{}).(string); a != "" {
		return a
	}
	return "unnamed"
}

// snapshot is the part of a key row the audit keeps before and after an
// action, of the row called t in the statement.
func snapshot(t string) string {
	return strings.NewReplacer("t.", t+".").Replace(`jsonb_build_object(
        'recovery_point', t.recovery_point, 'hold', t.hold, 'locked_at', t.locked_at,
        'lock_expires_at', t.lock_expires_at, 'last_run_at', t.last_run_at, 'attempts', t.attempts,
        'failures', t.failures, 'last_error', t.last_error, 'resolution', t.resolution)`)
}

// action is an operator's change to the keys that match where: the
// assignments set, made only to rows for which where still holds once
// locked, at most limit of them.
type action struct {
	name   string
	set    string
	where  []string
	a      args
	detail any
	limit  int
	// bulk skips rows that a run holds locked rather than waiting for
	// them; a single key's action waits.
	bulk bool
}

// act applies the action in one statement, which also writes one audit
// row per key changed, and returns how many keys it changed. The rows are
// locked FOR NO KEY UPDATE, as the completer's claim locks them, and their
// conditions checked again on the locked version: an action never changes
// a key that left the state it acts on meanwhile (READ COMMITTED re-checks
// the UPDATE's conditions against the newest row version).
func act(ctx context.Context, q Querier, x action) (int, error) {
	detail, err := json.Marshal(x.detail)
	if err == nil {
		detail, err = storableJSON(detail)
	}
	if err != nil {
		return 0, fmt.Errorf("store: %s: %w", x.name, err)
	}
	distributed, err := IsDistributed(ctx, q)
	if err != nil {
		return 0, fmt.Errorf("store: %s: %w", x.name, err)
	}
	if distributed {
		return actDistributed(ctx, q, x, detail)
	}
	return actStatement(ctx, q, x, detail, false)
}

// actStatement is act's one statement. The audit's snapshot of the changed
// row is built outside RETURNING, where Citus refuses functions.
//
// Every action may make a key due sooner (a revived key, a freed lease):
// each changed key that is unfinished is due at once in the watch, so
// that the completer's next claim looks at it. A key the walk has yet to
// pass gets its row there already, which the walk leaves. A key table
// distributed with Citus (distributed true) has no watch.
func actStatement(ctx context.Context, q Querier, x action, detail []byte, distributed bool) (int, error) {
	a := x.a
	where := strings.Join(x.where, " AND ")
	scan, err := routed(ctx, q, where, distributed)
	if err != nil {
		return 0, fmt.Errorf("store: %s: %w", x.name, err)
	}
	skip := ""
	if x.bulk {
		skip = " SKIP LOCKED"
	}
	sql := `
WITH target AS (
    SELECT id, ` + snapshot("t") + ` AS before
    FROM idempotency_keys t
    WHERE ` + scan + `
    ORDER BY id
    LIMIT ` + a.add(x.limit) + `
    FOR NO KEY UPDATE` + skip + `
), changed AS (
    UPDATE idempotency_keys k
    SET ` + x.set + `
    FROM target
    WHERE k.id = target.id AND ` + stripped(where) + `
    RETURNING k.id, k.tenant, k.idempotency_key, target.before, k.recovery_point, k.hold, k.locked_at,
        k.lock_expires_at, k.last_run_at, k.attempts, k.failures, k.last_error, k.resolution,
        k.finished_at, k.created_at, k.workflow, k.definition
` + watchChanged(distributed) + `
)
INSERT INTO atomicphase_audit (actor, action, tenant, idempotency_key, before, after, detail)
SELECT ` + a.add(storableText(Actor(ctx))) + `::text, ` + a.add(x.name) + `::text, tenant, idempotency_key, before, ` + snapshot("changed") + `, ` + a.add(detail) + `::jsonb
FROM changed`
	tag, err := q.Exec(ctx, sql, a...)
	if err != nil {
		return 0, fmt.Errorf("store: %s: %w", x.name, err)
	}
	return int(tag.RowsAffected()), nil
}

// watchChanged is the part of actStatement's statement that makes the
// unfinished keys it changed due at once in the watch, on a single
// Postgres.
func watchChanged(distributed bool) string {
	if distributed {
		return ""
	}
	return `), watched AS (
    INSERT INTO atomicphase_watch (id, due_at, created_at, workflow, definition)
    SELECT id, now(), created_at, workflow, definition FROM changed WHERE finished_at IS NULL
    ON CONFLICT (id) DO UPDATE SET due_at = least(atomicphase_watch.due_at, excluded.due_at)`
}

// seenWhere returns the conditions that hold while the key is as seen:
// the same recovery point, hold, lease (attempts, which every lease taken
// adds to, and its taken-at time) and pending resolution. Resolutions
// compare as jsonb values, so key order and spacing do not matter.
func seenWhere(seen keyrow.Seen, a *args) ([]string, error) {
	var lockedAt, resolution any
	if seen.LeaseTakenAt != nil {
		lockedAt = *seen.LeaseTakenAt
	}
	if seen.Resolution != nil {
		enc, err := json.Marshal(seen.Resolution)
		if err != nil {
			return nil, err
		}
		resolution = string(enc)
	}
	return []string{
		`recovery_point = ` + a.add(seen.RecoveryPoint),
		`coalesce(hold, '') = ` + a.add(string(seen.Hold)),
		`attempts = ` + a.add(seen.Attempts),
		`locked_at IS NOT DISTINCT FROM ` + a.add(lockedAt) + `::timestamptz`,
		`resolution IS NOT DISTINCT FROM ` + a.add(resolution) + `::jsonb`,
	}, nil
}

// keyAction is an operator action on one key: the action, what the
// operator saw of the key (nil when nothing was given), and the test of
// whether a key is in the state the action applies to, with the error
// that says it is not.
type keyAction struct {
	action
	seen       *keyrow.Seen
	inState    func(now *keyrow.Row) bool
	notInState error
}

// seenDetail is the audit's detail of an action given what was seen.
type seenDetail struct {
	Seen *keyrow.Seen `json:"seen,omitempty"`
}

// refusedAuditSQL audits a refused action with the key's fields as they
// are, before and after alike, since nothing changed.
var refusedAuditSQL = `
INSERT INTO atomicphase_audit (actor, action, tenant, idempotency_key, before, after, detail, refused)
SELECT $1::text, $2::text, tenant, idempotency_key, ` + snapshot("t") + `, ` + snapshot("t") + `, $3::jsonb, $4::text
FROM idempotency_keys t
WHERE tenant = $5 AND idempotency_key = $6`

// actOnKey applies x to the tenant's key, only while the key is as
// x.seen saw it when that is set. When it changed nothing, it returns
// keyrow.ErrNotFound for a missing key; otherwise it audits the refusal,
// with why, and returns x.notInState when the key is as seen but not in
// the action's state, and a *keyrow.ChangedError when the key changed.
func actOnKey(ctx context.Context, q Querier, x keyAction, tenant, key string) error {
	if unstorable(tenant, key) {
		return keyrow.ErrNotFound
	}
	if x.seen != nil {
		w, err := seenWhere(*x.seen, &x.a)
		if err != nil {
			return fmt.Errorf("store: %s: %w", x.name, err)
		}
		x.where = append(x.where, w...)
	}
	x.where = append(x.where, `tenant = `+x.a.add(tenant), `idempotency_key = `+x.a.add(key))
	x.limit = 1
	n, err := act(ctx, q, x.action)
	if err != nil || n == 1 {
		return err
	}
	// Nothing changed, so this read only explains the refusal: a key that
	// changes again meanwhile makes the explanation newer, never the
	// refusal wrong.
	now, err := Inspect(ctx, q, tenant, key)
	if err != nil {
		return err
	}
	refusal := x.refusal(now)
	detail, err := json.Marshal(x.detail)
	if err != nil {
		return fmt.Errorf("store: %s: %w", x.name, err)
	}
	why := strings.TrimPrefix(refusal.Error(), "keyrow: ")
	var changed *keyrow.ChangedError
	if errors.As(refusal, &changed) {
		why = changed.Reason()
	}
	if _, err := q.Exec(ctx, refusedAuditSQL, Actor(ctx), x.name, detail, why, tenant, key); err != nil {
		return fmt.Errorf("store: %s: audit the refusal: %w", x.name, err)
	}
	return refusal
}

// refusal returns why x changed nothing on the key that is now as now.
func (x keyAction) refusal(now *keyrow.Row) error {
	var changes []string
	switch {
	case x.seen != nil:
		changes = x.seen.Changes(now)
	case now.Resolution != nil:
		changes = []string{"a resolution is pending (" + now.Resolution.String() + "); name it to replace or drop it"}
	}
	var state error
	if !x.inState(now) {
		state = x.notInState
	}
	switch {
	case len(changes) > 0:
		return keyrow.NewChangedError(x.name, x.seen, now, changes, state)
	case state != nil:
		return state
	default:
		// The key was not as seen when the action was applied, and is
		// again now.
		return keyrow.NewChangedError(x.name, x.seen, now, []string{"the key changed while the action was applied"}, nil)
	}
}

// The assignments and conditions of each action.
const (
	unlockSet   = `locked_at = NULL, lock_expires_at = NULL, lock_token = NULL`
	unlockWhere = `lock_token IS NOT NULL AND finished_at IS NULL`
	// retrySet moves last_run_at to now because the reaper closes
	// runnable keys idle for the whole retention as abandoned: a key that
	// sat dead for days would otherwise race the completer to the
	// reaper's next run.
	//
	// A dead key keeps a pending call (a run that was cut short making a
	// call not safe to repeat, then held by an operator): the resumed run
	// reconciles it. Retrying an unknown key is the operator's word that
	// the call did not happen, or may happen twice.
	retrySet   = `hold = NULL, failures = 0, call_pending = CASE WHEN hold = 'dead' THEN call_pending END, last_run_at = now(), resolution = NULL`
	retryWhere = `hold IS NOT NULL`
	// holdSet parks a key as dead and clears its lease, so that a holder
	// still running is fenced out at its next write and cannot take the
	// key off hold by committing a phase.
	holdSet   = `hold = 'dead', ` + unlockSet
	holdWhere = `hold IS NULL AND finished_at IS NULL`
	// unresolvedWhere keeps an action given nothing seen from replacing or
	// dropping a pending resolution its operator may not know of.
	unresolvedWhere = `resolution IS NULL`
)

// Unlock frees the lease on an unfinished key regardless of who holds it,
// keeping its recovery point, so the next request or the completer resumes it
// at once. It is the operator's escape hatch for a key whose holder is known
// to be dead, and the way tests get past a crashed holder without waiting
// out the TTL. A holder that is still running is fenced out by the cleared
// token and stops at its next write.
//
// Given seen, it frees the lease only while the key is as seen, above all
// while the lease is the one seen (no run took it since); otherwise it
// frees nothing and returns a *keyrow.ChangedError. Given nil, it frees
// whatever lease the key has. It reports whether a lease was freed, and
// audits the change, or the refusal, under the actor of ctx.
func Unlock(ctx context.Context, q Querier, tenant, key string, seen *keyrow.Seen) (bool, error) {
	x := keyAction{
		action:     action{name: keyrow.ActionUnlock, set: unlockSet, where: []string{unlockWhere}, detail: seenDetail{seen}},
		seen:       seen,
		inState:    func(now *keyrow.Row) bool { return now.LeaseTakenAt != nil && now.FinishedAt == nil },
		notInState: keyrow.ErrNoLease,
	}
	err := actOnKey(ctx, q, x, tenant, key)
	if errors.Is(err, keyrow.ErrNotFound) || (errors.Is(err, keyrow.ErrNoLease) && !errors.Is(err, keyrow.ErrChanged)) {
		return false, nil
	}
	return err == nil, err
}

// Retry makes a key on hold runnable again, keeping its recovery point,
// state and last error: the next client request resumes it at once, and the
// completer once the key has been idle for its StuckAfter. The completer then
// allows the key its full MaxAttempts of failures again.
//
// Retrying a dead key is always safe. Retrying an unknown key is the
// operator's word that the uncertain foreign call did not happen, or may
// happen twice: the resumed run repeats it instead of reconciling it. A
// resolution pending on the key is dropped, but only when seen names it:
// given nil, Retry refuses a key with a pending resolution.
//
// Given seen, it retries the key only while it is as seen; otherwise it
// changes nothing and returns a *keyrow.ChangedError. Retry leaves a lease
// alone. It waits for a concurrent writer (a run releasing the key, Bury)
// and checks the hold on the row version that writer committed. It returns
// ErrNotFound when there is no such key and ErrNotHeld when the key is not
// on hold, and audits the change, or the refusal, under the actor of ctx.
func Retry(ctx context.Context, q Querier, tenant, key string, seen *keyrow.Seen) error {
	x := keyAction{
		action:     action{name: keyrow.ActionRetry, set: retrySet, where: []string{retryWhere}, detail: seenDetail{seen}},
		seen:       seen,
		inState:    func(now *keyrow.Row) bool { return now.Hold != "" },
		notInState: keyrow.ErrNotHeld,
	}
	if seen == nil {
		x.where = append(x.where, unresolvedWhere)
	}
	return actOnKey(ctx, q, x, tenant, key)
}

// Hold puts an unfinished key on hold as dead, keeping its recovery point,
// state and pending call: neither the completer nor a request runs it
// again until Retry takes it off hold. It is the operator's stop for a key
// whose run fails in a way the completer cannot count, such as one that
// crashes its process, and for one that must wait for a fix. A lease on the
// key is cleared, so a holder still running is fenced out at its next
// write (see Unlock).
//
// Given seen, it holds the key only while it is as seen; otherwise it
// changes nothing and returns a *keyrow.ChangedError. It returns
// ErrNotFound when there is no such key and ErrNotRunnable when the key is
// finished or already on hold, and audits the change, or the refusal,
// under the actor of ctx.
func Hold(ctx context.Context, q Querier, tenant, key string, seen *keyrow.Seen) error {
	x := keyAction{
		action:     action{name: keyrow.ActionHold, set: holdSet, where: []string{holdWhere}, detail: seenDetail{seen}},
		seen:       seen,
		inState:    func(now *keyrow.Row) bool { return now.Hold == "" && now.FinishedAt == nil },
		notInState: keyrow.ErrNotRunnable,
	}
	return actOnKey(ctx, q, x, tenant, key)
}

// resolveDetail is the audit's detail of a resolution.
type resolveDetail struct {
	keyrow.Resolution
	seenDetail
}

// Resolve records r on the tenant's key, which must be held as unknown at
// r.RecoveryPoint with no live lease: the check and the write are one
// statement. Given seen, r is recorded only while the key is as seen, and
// replaces a pending resolution only when seen names it; given nil, only
// while no resolution is pending. Otherwise nothing is recorded and the
// error is a *keyrow.ChangedError, or keyrow.ErrNotUnknown for a key that
// is as seen but not held as unknown there. Of two resolutions made from
// the same view of the key, one is recorded and the other refused. The
// completer's backoff on the key is reset. The change, or the refusal, is
// audited under the actor of ctx. A NUL in the output's strings, which
// jsonb cannot hold, is stored as \0, and bytes that are not UTF-8 as
// U+FFFD (see storableJSON): the record function reads them so.
func Resolve(ctx context.Context, q Querier, tenant, key string, r keyrow.Resolution, seen *keyrow.Seen) error {
	if r.Happened && len(r.Output) == 0 {
		return errors.New("store: resolve: a call that happened needs its output")
	}
	if !r.Happened {
		r.Output = nil
	}
	enc, err := json.Marshal(r)
	if err == nil {
		enc, err = storableJSON(enc)
	}
	if err != nil {
		return fmt.Errorf("store: resolve: %w", err)
	}
	x := keyAction{
		action: action{name: keyrow.ActionResolve, detail: resolveDetail{r, seenDetail{seen}}},
		seen:   seen,
		inState: func(now *keyrow.Row) bool {
			return now.Hold == keyrow.HoldUnknown && now.FinishedAt == nil && now.LeaseLeft == 0 && now.RecoveryPoint == r.RecoveryPoint
		},
		notInState: keyrow.ErrNotUnknown,
	}
	x.set = `resolution = ` + x.a.add(enc) + `::jsonb, failures = 0`
	x.where = []string{`hold = 'unknown' AND finished_at IS NULL AND (lock_expires_at IS NULL OR lock_expires_at <= now())`,
		`recovery_point = ` + x.a.add(r.RecoveryPoint)}
	if seen == nil {
		x.where = append(x.where, unresolvedWhere)
	}
	return actOnKey(ctx, q, x, tenant, key)
}

// BulkLimit is the most keys one bulk action changes.
const BulkLimit = 1000

// Bulk names a bulk action.
type Bulk string

// The bulk actions.
const (
	// BulkRetry retries dead keys, and unknown keys when confirmed.
	BulkRetry Bulk = keyrow.ActionRetry
	// BulkUnlock frees the leases of unfinished keys.
	BulkUnlock Bulk = keyrow.ActionUnlock
)

// bulkAction is the action b on the keys f selects. Retrying includes keys
// held as unknown only with confirmUnknown.
func bulkAction(b Bulk, f keyrow.ListFilter, confirmUnknown bool) (action, error) {
	if f.After != "" {
		return action{}, errors.New("a bulk action takes no cursor")
	}
	x := action{name: string(b), bulk: true, limit: cmp.Or(f.Limit, BulkLimit), detail: map[string]any{"filter": f}}
	if x.limit > BulkLimit {
		return action{}, fmt.Errorf("at most %d keys at once", BulkLimit)
	}
	w, err := filterWhere(f, &x.a)
	if err != nil {
		return action{}, err
	}
	switch b {
	case BulkRetry:
		x.set = retrySet
		x.where = append(w, retryWhere)
		if !confirmUnknown {
			x.where = append(x.where, `hold = 'dead'`)
		}
	case BulkUnlock:
		x.set, x.where = unlockSet, append(w, unlockWhere)
	default:
		return action{}, fmt.Errorf("unknown bulk action %q", b)
	}
	return x, nil
}

// BulkPreview counts the keys that BulkAct with the same arguments would
// change if it ran now (at most f.Limit, or BulkLimit), changing nothing.
func BulkPreview(ctx context.Context, q Querier, b Bulk, f keyrow.ListFilter, confirmUnknown bool) (int, error) {
	x, err := bulkAction(b, f, confirmUnknown)
	if err != nil {
		return 0, fmt.Errorf("store: preview %s: %w", b, err)
	}
	sql := `SELECT count(*) FROM (SELECT 1 FROM idempotency_keys WHERE ` + strings.Join(x.where, " AND ") +
		` LIMIT ` + x.a.add(x.limit) + `) AS matching`
	if sql, err = routedFor(ctx, q, sql); err != nil {
		return 0, fmt.Errorf("store: preview %s: %w", b, err)
	}
	var n int
	if err := q.QueryRow(ctx, sql, x.a...).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: preview %s: %w", b, err)
	}
	return n, nil
}

// BulkAct applies b to the keys f selects (at most f.Limit, or
// BulkLimit), each as the single-key action would, skipping keys that a
// run holds locked at that moment, and returns how many it changed. Every
// key changed is audited under the actor of ctx, with the filter.
func BulkAct(ctx context.Context, q Querier, b Bulk, f keyrow.ListFilter, confirmUnknown bool) (int, error) {
	x, err := bulkAction(b, f, confirmUnknown)
	if err != nil {
		return 0, fmt.Errorf("store: %s: %w", b, err)
	}
	return act(ctx, q, x)
}

// takeResolutionSQL clears the key's resolution and returns it, for the
// holder identified by the token; no row when there is none or the lease is
// no longer the holder's.
const takeResolutionSQL = `
WITH taken AS (
    SELECT id, resolution FROM idempotency_keys
    WHERE id = $1 AND lock_token = $2 AND finished_at IS NULL AND resolution IS NOT NULL
    FOR NO KEY UPDATE
)
UPDATE idempotency_keys k SET resolution = NULL
FROM taken
WHERE k.id = taken.id AND k.lock_token = $2
RETURNING taken.resolution`

// TakeResolution returns the operator's resolution recorded on the key the
// caller holds, and clears it, so it is acted on once; nil when there is
// none.
func TakeResolution(ctx context.Context, q Querier, h Holder) (*keyrow.Resolution, error) {
	if h.Distributed {
		return takeResolutionDistributed(ctx, q, h)
	}
	var r keyrow.Resolution
	err := q.QueryRow(ctx, takeResolutionSQL, uuidArg(h.ID), uuidArg(h.Token)).Scan(&r)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: take resolution: %w", err)
	}
	return &r, nil
}

// On a distributed key table Citus refuses takeResolutionSQL's row lock
// in a CTE, so the resolution is read, then cleared only if it is still
// the one read (compare-and-set on the holder's row): of two runs, or a run
// and an operator replacing the resolution, one clears what it read, and
// a resolution is acted on once. Both statements are on Citus's fast path.
const (
	readResolutionDistributedSQL = `
SELECT resolution FROM idempotency_keys
WHERE id = $1 AND lock_token = $2 AND finished_at IS NULL AND resolution IS NOT NULL AND tenant = $3`
	clearResolutionDistributedSQL = `
UPDATE idempotency_keys SET resolution = NULL
WHERE id = $1 AND lock_token = $2 AND finished_at IS NULL AND resolution = $3::jsonb AND tenant = $4`
)

// takeResolutionDistributed is TakeResolution on a distributed key table.
func takeResolutionDistributed(ctx context.Context, q Querier, h Holder) (*keyrow.Resolution, error) {
	for {
		var raw []byte
		err := q.QueryRow(ctx, readResolutionDistributedSQL, uuidArg(h.ID), uuidArg(h.Token), h.Tenant).Scan(&raw)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("store: take resolution: %w", err)
		}
		tag, err := q.Exec(ctx, clearResolutionDistributedSQL, uuidArg(h.ID), uuidArg(h.Token), raw, h.Tenant)
		if err != nil {
			return nil, fmt.Errorf("store: take resolution: %w", err)
		}
		if tag.RowsAffected() == 0 {
			// Replaced or taken since the read: read again.
			continue
		}
		var r keyrow.Resolution
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, fmt.Errorf("store: take resolution: %w", err)
		}
		return &r, nil
	}
}

// claimKeySQL takes the lease on one unfinished key, runnable or held as
// unknown, whose lease is free or expired, as claimSQL takes due keys. The
// token ($4) comes from the caller: a distributed table refuses a volatile
// function in an UPDATE.
const claimKeySQL = `
UPDATE idempotency_keys k
SET locked_at = now(), lock_expires_at = now() + $3::interval, lock_token = $4,
    last_run_at = now(), attempts = k.attempts + 1
WHERE tenant = $1 AND idempotency_key = $2 AND finished_at IS NULL
  AND (hold IS NULL OR hold = 'unknown')
  AND (lock_expires_at IS NULL OR lock_expires_at <= now())
RETURNING ` + claimedColumns

// ClaimKey takes the lease on the tenant's key, as the completer's claim
// does, so that it can be run at once; nil when the key is finished, dead,
// missing or held by a live lease.
func ClaimKey(ctx context.Context, q Querier, tenant, key string, ttl time.Duration) (*Row, error) {
	var rows []*Row
	sent := time.Now()
	if err := pgxscan.Select(ctx, q, &rows, claimKeySQL, tenant, key, ttl, uuidArg(uuid.New())); err != nil {
		return nil, fmt.Errorf("store: claim key: %w", err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	rows[0].TakenAt = sent
	return rows[0], nil
}

// Fingerprint returns the stored request fingerprint of the tenant's key,
// from which its downstream keys derive (keyrow.DownstreamKey).
func Fingerprint(ctx context.Context, q Querier, tenant, key string) ([]byte, error) {
	var fp []byte
	err := q.QueryRow(ctx, `SELECT request_fingerprint FROM idempotency_keys WHERE tenant = $1 AND idempotency_key = $2`,
		tenant, key).Scan(&fp)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, keyrow.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: fingerprint: %w", err)
	}
	return fp, nil
}

// Audit returns the audit entries f selects, newest first.
func Audit(ctx context.Context, q Querier, f keyrow.AuditFilter) ([]keyrow.AuditEntry, error) {
	var (
		a args
		w = []string{"true"}
	)
	// Each condition has an index that ends in the id, so a page walks
	// one index backwards from Before: atomicphase_audit_key for a key or
	// a tenant, atomicphase_audit_actor and atomicphase_audit_action.
	switch {
	case f.Key != "":
		w = append(w, `tenant = `+a.add(f.Tenant), `idempotency_key = `+a.add(f.Key))
	case f.Tenant != "":
		w = append(w, `tenant = `+a.add(f.Tenant))
	}
	if f.Actor != "" {
		w = append(w, `actor = `+a.add(f.Actor))
	}
	if f.Action != "" {
		w = append(w, `action = `+a.add(f.Action))
	}
	if f.Before > 0 {
		w = append(w, `id < `+a.add(f.Before))
	}
	sql := `SELECT id, at, actor, action, tenant, idempotency_key AS key, before, after, detail,
    coalesce(refused, '') AS refused
FROM atomicphase_audit WHERE ` + strings.Join(w, " AND ") + ` ORDER BY id DESC LIMIT ` + a.add(cmp.Or(f.Limit, keyrow.DefaultListLimit))
	entries := []keyrow.AuditEntry{}
	if err := pgxscan.Select(ctx, q, &entries, sql, a...); err != nil {
		return nil, fmt.Errorf("store: audit: %w", err)
	}
	return entries, nil
}

// minutesSQL counts, for each minute since $1 ago, the keys first seen,
// finished, and put on hold for an operator (dead or unknown) in it, each
// through an index that holds only the rows of the window: the primary
// key's UUIDv7 range for the keys first seen (as activitySQL), the
// reaper's index on (workflow, finished_at) for the workflows $2 names,
// and the held keys' index on (hold, last_run_at), a held key's last run
// being the one that put it on hold.
const minutesSQL = `
WITH since AS (SELECT date_trunc('minute', now()) - $1::interval AS at)
SELECT 'started', date_trunc('minute', k.created_at), count(*)
FROM idempotency_keys k, since
WHERE k.id >= (SELECT (substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-0000-0000-000000000000')::uuid
               FROM lpad(to_hex((extract(epoch FROM since.at) * 1000)::bigint), 12, '0') AS h)
  AND k.created_at >= since.at
GROUP BY 2
UNION ALL
SELECT 'finished', date_trunc('minute', k.finished_at), count(*)
FROM idempotency_keys k, since
WHERE k.workflow = ANY($2) AND k.finished_at >= since.at
GROUP BY 2
UNION ALL
SELECT 'held', date_trunc('minute', k.last_run_at), count(*)
FROM idempotency_keys k, since
WHERE k.hold IS NOT NULL AND k.last_run_at >= since.at
GROUP BY 2`

// Minute is what happened to the keys in one minute.
type Minute struct {
	At                      time.Time
	Started, Finished, Held int
}

// Minutes returns, oldest first, one Minute for each minute of the last
// window (the current minute included), counting the finished keys of
// workflows only.
func Minutes(ctx context.Context, q Querier, window time.Duration, workflows []string) ([]Minute, error) {
	var now time.Time
	if err := q.QueryRow(ctx, `SELECT date_trunc('minute', now())`).Scan(&now); err != nil {
		return nil, fmt.Errorf("store: minutes: %w", err)
	}
	n := int(window / time.Minute)
	out := make([]Minute, n+1)
	for i := range out {
		out[i].At = now.Add(time.Duration(i-n) * time.Minute)
	}
	rows, err := q.Query(ctx, minutesSQL, window, workflows)
	if err != nil {
		return nil, fmt.Errorf("store: minutes: %w", err)
	}
	var (
		series string
		at     time.Time
		count  int
	)
	_, err = pgx.ForEachRow(rows, []any{&series, &at, &count}, func() error {
		i := n - int(now.Sub(at)/time.Minute)
		if i < 0 || i > n {
			return nil
		}
		switch series {
		case "started":
			out[i].Started = count
		case "finished":
			out[i].Finished = count
		case "held":
			out[i].Held = count
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: minutes: %w", err)
	}
	return out, nil
}
