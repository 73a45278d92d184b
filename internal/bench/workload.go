package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// Order is the request both implementations serve.
type Order struct {
	Item   string `json:"item"`
	Amount int    `json:"amount"`
}

// orderState is what the library commits with each phase.
type orderState struct {
	OrderID  int64  `json:"order_id"`
	ChargeID string `json:"charge_id,omitempty"`
}

// receipt is the 201 response body.
type receipt struct {
	OrderID int64  `json:"order_id"`
	Item    string `json:"item"`
	Amount  int    `json:"amount"`
}

// tenants is how many tenants the benchmark's keys are spread over, so
// that on Citus every worker holds some of them, as a service's accounts
// would be spread.
const tenants = 64

// tenantOf returns the tenant that owns key: one of tenants, chosen by a
// hash of the key, the same for the library and the baseline.
func tenantOf(key string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return "tenant-" + strconv.Itoa(int(h.Sum32()%tenants))
}

// order is the request every benchmark sends, so replays and conflicts
// match the stored fingerprint.
var order = Order{Item: "rocket ride", Amount: 2000}

// schemaSQL creates the tables the workflow writes and the baseline's keys
// table. The library's idempotency_keys comes from atomicphase.Migrate.
// Every table has a tenant column and every statement of either side names
// the tenant, so that on Citus (see distributeSQL) each statement runs on
// the one shard of the request's tenant; on a single Postgres the tenant is
// a filter on a row the primary key finds.
//
// baseline_keys is the reference implementation's table (rocket-rides-atomic)
// with a text tenant in place of its user_id, so that both key tables are
// looked up by the same (text, text) unique index.
const schemaSQL = `
CREATE TABLE IF NOT EXISTS orders (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at   timestamptz NOT NULL DEFAULT now(),
    tenant       text        NOT NULL,
    ikey         text        NOT NULL,
    item         text        NOT NULL,
    amount       integer     NOT NULL,
    status       text        NOT NULL DEFAULT 'created',
    confirmed_at timestamptz,
    charge_id    text
);

CREATE TABLE IF NOT EXISTS audit_records (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now(),
    tenant      text        NOT NULL,
    action      text        NOT NULL,
    resource_id bigint      NOT NULL,
    data        jsonb       NOT NULL
);

CREATE TABLE IF NOT EXISTS baseline_keys (
    id              bigserial   PRIMARY KEY,
    created_at      timestamptz NOT NULL DEFAULT now(),
    tenant          text        NOT NULL,
    idempotency_key text        NOT NULL CHECK (char_length(idempotency_key) <= 255),
    last_run_at     timestamptz NOT NULL DEFAULT now(),
    locked_at       timestamptz DEFAULT now(),
    request_method  text        NOT NULL CHECK (char_length(request_method) <= 10),
    request_params  jsonb       NOT NULL,
    request_path    text        NOT NULL CHECK (char_length(request_path) <= 100),
    response_code   integer,
    response_body   jsonb,
    recovery_point  text        NOT NULL CHECK (char_length(recovery_point) <= 50)
);

CREATE UNIQUE INDEX IF NOT EXISTS baseline_keys_tenant_idempotency_key
    ON baseline_keys (tenant, idempotency_key);`

// distributeSQL distributes the workflow's tables and the baseline's keys
// on a Citus coordinator by tenant, co-located with the library's
// idempotency_keys (see atomicphase.Distribute), after re-keying each by
// (tenant, id): Citus requires the distribution column in every unique
// constraint.
const distributeSQL = `
ALTER TABLE orders DROP CONSTRAINT orders_pkey, ADD PRIMARY KEY (tenant, id);
SELECT create_distributed_table('orders', 'tenant', colocate_with => 'idempotency_keys');
ALTER TABLE audit_records DROP CONSTRAINT audit_records_pkey, ADD PRIMARY KEY (tenant, id);
SELECT create_distributed_table('audit_records', 'tenant', colocate_with => 'idempotency_keys');
ALTER TABLE baseline_keys DROP CONSTRAINT baseline_keys_pkey, ADD PRIMARY KEY (tenant, id);
SELECT create_distributed_table('baseline_keys', 'tenant', colocate_with => 'idempotency_keys');`

// The workflow's own statements, one per phase. The library workflow and
// the baseline run exactly these, so the two differ only in how they keep
// the key row.

func createOrder(ctx context.Context, tx pgx.Tx, tenant, key string, req Order) (int64, error) {
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO orders (tenant, ikey, item, amount) VALUES ($1, $2, $3, $4) RETURNING id`,
		tenant, key, req.Item, req.Amount).Scan(&id)
	return id, err
}

func confirmOrder(ctx context.Context, tx pgx.Tx, tenant string, id int64) error {
	_, err := tx.Exec(ctx, `UPDATE orders SET status = 'confirmed', confirmed_at = now() WHERE tenant = $1 AND id = $2`, tenant, id)
	return err
}

func auditOrder(ctx context.Context, tx pgx.Tx, tenant string, id int64, req Order) error {
	data, err := json.Marshal(req)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO audit_records (tenant, action, resource_id, data) VALUES ($1, 'order.created', $2, $3)`,
		tenant, id, data)
	return err
}

// chargeOrder makes the rides-shaped workflow's foreign call: a POST to the
// charge stub under key, the downstream idempotency key. It returns the
// charge id.
func (e *Env) chargeOrder(ctx context.Context, key string, id int64) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.stub.URL+"/charges",
		strings.NewReader(`{"amount":`+strconv.Itoa(order.Amount)+`,"order":`+strconv.FormatInt(id, 10)+`}`))
	if err != nil {
		return "", err
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.http.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var c struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK || c.ID == "" {
		return "", fmt.Errorf("bench: charge stub answered %s", resp.Status)
	}
	return c.ID, nil
}

func recordCharge(ctx context.Context, tx pgx.Tx, tenant string, id int64, chargeID string) error {
	_, err := tx.Exec(ctx, `UPDATE orders SET charge_id = $3 WHERE tenant = $1 AND id = $2`, tenant, id, chargeID)
	return err
}

// charges is what the charge stub does besides answering: how long each
// charge takes, and, while counting, how many charges came with each
// idempotency key.
type charges struct {
	took atomic.Int64 // a time.Duration
	mu   sync.Mutex
	sent map[string]int // nil while not counting
}

// count starts counting the charges of each key afresh.
func (c *charges) count() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent = map[string]int{}
}

// counted returns the charges counted per key, and stops counting.
func (c *charges) counted() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	sent := c.sent
	c.sent = nil
	return sent
}

// chargeStub is the provider the rides-shaped workflow calls: it answers
// every charge with an id derived from its idempotency key, as a provider
// that honours the key would, after c's delay.
func chargeStub(c *charges) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		key := r.Header.Get("Idempotency-Key")
		c.mu.Lock()
		if c.sent != nil {
			c.sent[key]++
		}
		c.mu.Unlock()
		if d := time.Duration(c.took.Load()); d > 0 {
			time.Sleep(d)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"ch_`+strconv.Itoa(len(key))+`","status":"succeeded"}`)
	}))
}

// userStatements is how many statements of its own each phase runs.
const userStatements = 1

// phases is how many phases the workflows have.
const phases = 3

// newWorkflow declares the library's three local phases: create the order,
// confirm it, write the audit record and answer 201.
func newWorkflow() (*phase.Workflow[Order, orderState], error) {
	return phase.NewWorkflow("orders",
		phase.Local("order_created", func(ctx context.Context, tx pgx.Tx, in *phase.Input[Order, orderState]) (phase.Result, error) {
			id, err := createOrder(ctx, tx, in.Tenant, in.Key, in.Req)
			in.State.OrderID = id
			return phase.Next(), err
		}),
		phase.Local("order_confirmed", func(ctx context.Context, tx pgx.Tx, in *phase.Input[Order, orderState]) (phase.Result, error) {
			return phase.Next(), confirmOrder(ctx, tx, in.Tenant, in.State.OrderID)
		}),
		phase.Local("audited", func(ctx context.Context, tx pgx.Tx, in *phase.Input[Order, orderState]) (phase.Result, error) {
			if err := auditOrder(ctx, tx, in.Tenant, in.State.OrderID, in.Req); err != nil {
				return phase.Result{}, err
			}
			return phase.JSON(http.StatusCreated, receipt{in.State.OrderID, in.Req.Item, in.Req.Amount}), nil
		}),
	)
}

// newRidesWorkflow declares the rides-shaped workflow, as the rides example
// is shaped: create the order; charge it with one foreign call to the stub,
// outside any transaction, and record the charge; write the audit record and
// answer 201.
func (e *Env) newRidesWorkflow() (*phase.Workflow[Order, orderState], error) {
	return phase.NewWorkflow("rides",
		phase.Local("order_created", func(ctx context.Context, tx pgx.Tx, in *phase.Input[Order, orderState]) (phase.Result, error) {
			id, err := createOrder(ctx, tx, in.Tenant, in.Key, in.Req)
			in.State.OrderID = id
			return phase.Next(), err
		}),
		phase.Foreign("charged",
			func(ctx context.Context, in *phase.Input[Order, orderState]) (string, error) {
				return e.chargeOrder(ctx, in.DownstreamKey(), in.State.OrderID)
			},
			func(ctx context.Context, tx pgx.Tx, in *phase.Input[Order, orderState], chargeID string) (phase.Result, error) {
				in.State.ChargeID = chargeID
				return phase.Next(), recordCharge(ctx, tx, in.Tenant, in.State.OrderID, chargeID)
			}).Repeatable(),
		phase.Local("audited", func(ctx context.Context, tx pgx.Tx, in *phase.Input[Order, orderState]) (phase.Result, error) {
			if err := auditOrder(ctx, tx, in.Tenant, in.State.OrderID, in.Req); err != nil {
				return phase.Result{}, err
			}
			return phase.JSON(http.StatusCreated, receipt{in.State.OrderID, in.Req.Item, in.Req.Amount}), nil
		}),
	)
}

// runLibrary sends one request through the library and checks that it
// ended as want.
func (e *Env) runLibrary(ctx context.Context, w *phase.Workflow[Order, orderState], key string, want phase.OutcomeKind) error {
	return e.runLibraryOn(ctx, e.client, w, key, want)
}

// runLibraryOn is runLibrary through client c.
func (e *Env) runLibraryOn(ctx context.Context, c *phase.Client, w *phase.Workflow[Order, orderState], key string, want phase.OutcomeKind) error {
	out, err := w.Run(ctx, c, tenantOf(key), key, order)
	if err != nil {
		return err
	}
	if out.Kind != want {
		return fmt.Errorf("bench: key %s: library outcome %v, want %v", key, out.Kind, want)
	}
	return nil
}

// The baseline's statements, as the reference writes them: the key is
// upserted and locked in one statement; each phase then runs BEGIN, its own
// statements, an UPDATE of the recovery point and COMMIT, one round trip
// each; the last phase stores the response in that UPDATE. There is no
// fencing token and no phase state: the reference re-reads what it needs.
// Every statement names the tenant, as the library's do, but for those
// that find the key row by its id (baselineKeySQL).
const (
	// baselineAcquireSQL is the reference's upsert. The WHERE leaves a
	// finished key alone (the reference's "unless the request is already
	// finished"), so a replay does not lock it; then no row comes back, and
	// baselineLookupSQL tells a replay from a conflict or a mismatch. The
	// time is the inserted row's (excluded.locked_at), which is now(), and
	// the lock's age a difference of two times: Citus refuses now() after
	// ON CONFLICT, and any function that is not immutable, as adding an
	// interval to a timestamptz is not.
	baselineAcquireSQL = `
INSERT INTO baseline_keys AS k
    (tenant, idempotency_key, request_method, request_path, request_params, recovery_point, locked_at, last_run_at)
VALUES ($1, $2, 'POST', '/orders', $3, 'started', now(), now())
ON CONFLICT (tenant, idempotency_key) DO UPDATE
    SET locked_at = excluded.locked_at, last_run_at = excluded.locked_at
    WHERE k.recovery_point <> 'finished'
      AND k.request_params = excluded.request_params
      AND (k.locked_at IS NULL OR excluded.locked_at - k.locked_at > interval '90 seconds')
RETURNING id, recovery_point`

	baselineLookupSQL = `
SELECT recovery_point, request_params = $3, response_code, response_body
FROM baseline_keys
WHERE tenant = $1 AND idempotency_key = $2`

	// baselineOrderSQL finds the order of a resumed key, as the reference
	// finds the ride of a key it recovers.
	baselineOrderSQL = `SELECT id FROM orders WHERE tenant = $1 AND ikey = $2`
)

// The baseline's statements about the key row it holds, which find it by
// its id ($1), as the reference's do, and on Citus by its tenant too (see
// Env.baselineKey). Naming the tenant on a single Postgres would let a
// generic plan made while the table is new find the row by the tenant
// alone, through the (tenant, idempotency_key) index, and read every key
// of the tenant each time (as the library's statements avoid: see
// internal/store's keySQL).
var (
	baselineAdvanceSQL = baselineKeySQL(`UPDATE baseline_keys SET recovery_point = $2 WHERE id = $1`)

	baselineFinishSQL = baselineKeySQL(`
UPDATE baseline_keys
SET recovery_point = 'finished', locked_at = NULL, response_code = $2, response_body = $3
WHERE id = $1`)

	baselineUnlockSQL = baselineKeySQL(`UPDATE baseline_keys SET locked_at = NULL WHERE id = $1`)
)

// keyStatement is a baseline statement about a key row in its two forms:
// for a single Postgres, and for Citus, where the WHERE also names the
// tenant, the statement's last parameter.
type keyStatement struct{ plain, distributed string }

// baselineKeySQL returns the two forms of sql, a statement that ends with
// its WHERE and names the row's id as $1: the Citus form takes the tenant
// as one parameter more.
func baselineKeySQL(sql string) keyStatement {
	n := strings.Count(sql, "$") + 1
	return keyStatement{plain: sql, distributed: sql + " AND tenant = $" + strconv.Itoa(n)}
}

// baselineKey returns the statement s and its arguments (the row's id
// first) for the server at hand.
func (e *Env) baselineKey(s keyStatement, tenant string, args ...any) (string, []any) {
	if e.distributed {
		return s.distributed, append(args, tenant)
	}
	return s.plain, args
}

// runBaseline serves one request with hand-written pgx following the
// reference, and returns its status. rides selects the rides-shaped
// request, whose second phase charges the order.
func (e *Env) runBaseline(ctx context.Context, key string, rides bool) (int, error) {
	params, err := json.Marshal(order)
	if err != nil {
		return 0, err
	}
	tenant := tenantOf(key)
	var (
		id    int64
		point string
	)
	err = e.Pool.QueryRow(ctx, baselineAcquireSQL, tenant, key, params).Scan(&id, &point)
	if errors.Is(err, pgx.ErrNoRows) {
		var (
			same bool
			code *int32
			body []byte
		)
		if err := e.Pool.QueryRow(ctx, baselineLookupSQL, tenant, key, params).Scan(&point, &same, &code, &body); err != nil {
			return 0, err
		}
		switch {
		case !same:
			return http.StatusUnprocessableEntity, nil
		case point == keyrow.Finished:
			return int(*code), nil
		default:
			return http.StatusConflict, nil
		}
	}
	if err != nil {
		return 0, err
	}
	status, err := e.baselinePhases(ctx, id, key, point, rides)
	if err != nil {
		// As the reference does: free the key at once for the next retry.
		sql, args := e.baselineKey(baselineUnlockSQL, tenant, id)
		_, _ = e.Pool.Exec(context.WithoutCancel(ctx), sql, args...)
		return 0, err
	}
	return status, nil
}

// baselinePhases runs the phases after point, as the reference's loop over
// recovery points does. In the rides-shaped request the second phase makes
// the charge inside its transaction, as the reference does, with the
// reference's downstream key (its prefix and the key row's id).
func (e *Env) baselinePhases(ctx context.Context, id int64, key, point string, rides bool) (int, error) {
	tenant := tenantOf(key)
	var orderID int64
	for {
		switch point {
		case keyrow.Started:
			err := e.baselinePhase(ctx, func(tx pgx.Tx) (err error) {
				orderID, err = createOrder(ctx, tx, tenant, key, order)
				return err
			}, baselineAdvanceSQL, tenant, id, "order_created")
			if err != nil {
				return 0, err
			}
			point = "order_created"
		case "order_created":
			if orderID == 0 {
				if err := e.Pool.QueryRow(ctx, baselineOrderSQL, tenant, key).Scan(&orderID); err != nil {
					return 0, err
				}
			}
			err := e.baselinePhase(ctx, func(tx pgx.Tx) error {
				if !rides {
					return confirmOrder(ctx, tx, tenant, orderID)
				}
				chargeID, err := e.chargeOrder(ctx, "rocket-rides-atomic-"+strconv.FormatInt(id, 10), orderID)
				if err != nil {
					return err
				}
				return recordCharge(ctx, tx, tenant, orderID, chargeID)
			}, baselineAdvanceSQL, tenant, id, "order_confirmed")
			if err != nil {
				return 0, err
			}
			point = "order_confirmed"
		case "order_confirmed":
			if orderID == 0 {
				if err := e.Pool.QueryRow(ctx, baselineOrderSQL, tenant, key).Scan(&orderID); err != nil {
					return 0, err
				}
			}
			body, err := json.Marshal(receipt{orderID, order.Item, order.Amount})
			if err != nil {
				return 0, err
			}
			err = e.baselinePhase(ctx, func(tx pgx.Tx) error {
				return auditOrder(ctx, tx, tenant, orderID, order)
			}, baselineFinishSQL, tenant, id, http.StatusCreated, append(body, '\n'))
			if err != nil {
				return 0, err
			}
			return http.StatusCreated, nil
		default:
			return 0, fmt.Errorf("bench: baseline key %s at unknown recovery point %q", key, point)
		}
	}
}

// baselinePhase is the reference's atomic_phase: BEGIN, the phase's
// statements, the key update, COMMIT, each its own round trip.
func (e *Env) baselinePhase(ctx context.Context, work func(pgx.Tx) error, key keyStatement, tenant string, args ...any) error {
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if err := work(tx); err != nil {
		return err
	}
	keySQL, args := e.baselineKey(key, tenant, args...)
	if _, err := tx.Exec(ctx, keySQL, args...); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
