package store

import (
	"context"
	"fmt"

	"github.com/georgysavva/scany/v2/pgxscan"

	"github.com/atomicphase/atomicphase/keyrow"
)

// countDefinitionsSQL counts the unfinished keys of each workflow
// definition on a single Postgres. Its first half reads only the keys
// that may be unfinished (the watch and the keys the walk has yet to
// pass: see routed), its second the partial index idempotency_keys_held
// (a finished key has no hold), so it reads no finished key however many
// the table holds.
const countDefinitionsSQL = `
SELECT workflow, definition, count(*) AS unfinished, sum(held) AS held, min(created_at) AS oldest
FROM (
    SELECT workflow, definition, 0 AS held, created_at FROM idempotency_keys
    WHERE finished_at IS NULL AND hold IS NULL{unfinished}
    UNION ALL
    SELECT workflow, definition, 1, created_at FROM idempotency_keys
    WHERE hold IS NOT NULL
) AS keys
GROUP BY workflow, definition
ORDER BY workflow, definition`

// countDefinitionsDistributedSQL is countDefinitionsSQL on Citus, in one
// scan of each shard (see countDistributedSQL): a key that goes on hold
// meanwhile is counted once.
const countDefinitionsDistributedSQL = `
SELECT workflow, definition, count(*) AS unfinished, count(*) FILTER (WHERE hold IS NOT NULL) AS held,
       min(created_at) AS oldest
FROM idempotency_keys
WHERE (finished_at IS NULL AND hold IS NULL) OR hold IS NOT NULL
GROUP BY workflow, definition
ORDER BY workflow, definition`

// CountDefinitions returns how many unfinished keys each workflow
// definition has.
func CountDefinitions(ctx context.Context, q Querier) ([]keyrow.DefinitionCount, error) {
	counts := []keyrow.DefinitionCount{}
	distributed, err := IsDistributed(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("store: count definitions: %w", err)
	}
	sql := countDefinitionsDistributedSQL
	if !distributed {
		sql, err = routed(ctx, q, countDefinitionsSQL, false)
	}
	if err != nil {
		return nil, fmt.Errorf("store: count definitions: %w", err)
	}
	if err := pgxscan.Select(ctx, q, &counts, sql); err != nil {
		return nil, fmt.Errorf("store: count definitions: %w", err)
	}
	return counts, nil
}
