package fakeapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// MaxKeyLength is the longest Idempotency-Key accepted, as on Stripe.
const MaxKeyLength = 255

// KeyRetention is how long a stored response answers for its key. A key
// whose response is older is new again, as on Stripe, which prunes keys
// after 24 hours.
const KeyRetention = 24 * time.Hour

// Execution is the part of an API request that changes something, which
// Execute runs at most once per idempotency key.
type Execution struct {
	// Params are the request's parameters in a canonical encoding: the same
	// for the same parameters in whatever order the client sent them. With
	// the method and path they tell a retry from a key reused for another
	// request.
	Params []byte
	// Run makes the request's change in tx and returns the answer. key is
	// the request's Idempotency-Key, or empty. Whatever Run does commits
	// together with the stored answer, or not at all; an error answers 500
	// and leaves the key free.
	Run func(ctx context.Context, tx pgx.Tx, key string) (Response, error)
	// Committed, when set, is called once Run's change has committed and
	// before the client is answered, so that counts of what was made are
	// up to date by the time the client can ask for them.
	Committed func()
}

// Execute answers a request that changes something, by the rules of the
// package doc's Idempotency section. With an Idempotency-Key it runs in one
// transaction that holds the key's lock, finds no stored response for it,
// runs e and stores the answer: a crash at any point leaves both e's change
// and its stored answer, or neither.
func (s *Server) Execute(w http.ResponseWriter, r *http.Request, c Call, e Execution) {
	ctx := r.Context()
	key, bad := s.idempotencyKey(r.Header.Get("Idempotency-Key"))
	if bad != nil {
		Write(w, *bad)
		return
	}
	fp := fingerprint(r.Method, r.URL.Path, e.Params)
	log := s.logger.With(slog.String("request_id", c.RequestID), slog.String("key", key))

	tx, err := s.db.Begin(ctx)
	if err != nil {
		s.fail(w, log, err)
		return
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit

	if key != "" {
		w.Header().Set("Idempotency-Key", key)
		held, err := s.lockKey(ctx, tx, c.Caller, key)
		if err != nil {
			s.fail(w, log, err)
			return
		}
		if !held {
			s.counts.conflicts.Add(1)
			Write(w, keyInUse(key))
			return
		}
	}
	// The delay is spent holding the key, as a slow API would, so that
	// concurrent requests with the key meet the 409.
	if err := s.Delay(ctx); err != nil {
		return // the client has gone; nothing was executed or stored
	}
	if key != "" {
		stored, err := s.loadResult(ctx, tx, c.Caller, key)
		if err != nil {
			s.fail(w, log, err)
			return
		}
		if stored != nil {
			if !bytes.Equal(stored.fingerprint, fp) {
				Write(w, keyMismatch(key))
				return
			}
			s.counts.replays.Add(1)
			w.Header().Set("Idempotent-Replayed", "true")
			w.Header().Set("Original-Request", stored.requestID)
			Write(w, stored.response)
			return
		}
		w.Header().Set("Original-Request", c.RequestID)
	}

	f := s.faults.draw()
	if f == failBefore {
		s.counts.faults.Add(1)
		log.Info(s.cfg.Name + ": injected failure before " + s.cfg.Action)
		Write(w, ServerError)
		return
	}
	res, err := e.Run(ctx, tx, key)
	if err != nil {
		s.fail(w, log, err)
		return
	}
	if key != "" {
		if err := s.storeResult(ctx, tx, c.Caller, key, result{fingerprint: fp, requestID: c.RequestID, response: res}); err != nil {
			s.fail(w, log, err)
			return
		}
	}
	if err := tx.Commit(ctx); err != nil {
		s.fail(w, log, err)
		return
	}
	if e.Committed != nil {
		e.Committed()
	}
	if f == dropAfter {
		s.counts.faults.Add(1)
		log.Info(s.cfg.Name+": injected connection drop after "+s.cfg.Action, slog.Int("status", res.Status))
		drop(w, res)
		return
	}
	Write(w, res)
}

// idempotencyKey returns the key an Idempotency-Key header carries, or the
// 400 to answer when Stripe would refuse it (or when the Server requires a
// key and there is none).
func (s *Server) idempotencyKey(header string) (string, *Response) {
	key := strings.TrimSpace(header)
	if len(key) > MaxKeyLength {
		return "", InvalidParam("", "", fmt.Sprintf("Idempotency-Key must be at most %d characters long.", MaxKeyLength))
	}
	if key == "" && s.cfg.RequireKey {
		return "", InvalidParam("", "parameter_missing", "This request needs an Idempotency-Key header.")
	}
	return key, nil
}

// fingerprint identifies a request, so that a key reused for a different
// request is caught.
func fingerprint(method, path string, params []byte) []byte {
	h := sha256.New()
	h.Write([]byte(method + " " + path + "\n"))
	h.Write(params)
	return h.Sum(nil)
}

// KeysSchema returns the SQL that creates the table where the Servers named
// name keep their idempotency keys, name_idempotency_keys. Applying it more
// than once is harmless.
func KeysSchema(name string) string {
	return fmt.Sprintf(keysSchemaSQL, pgx.Identifier{keysTable(name)}.Sanitize())
}

func keysTable(name string) string { return name + "_idempotency_keys" }

// keysSchemaSQL holds one row per (API key, Idempotency-Key) whose request
// began executing: the response it produced, replayed byte for byte to later
// requests with the same key and the same fingerprint. api_key is empty for
// a Server without Config.Authenticate.
const keysSchemaSQL = `
CREATE TABLE IF NOT EXISTS %s (
    api_key         text        NOT NULL,
    idempotency_key text        NOT NULL CHECK (char_length(idempotency_key) BETWEEN 1 AND 255),
    fingerprint     bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    request_id      text        NOT NULL,
    status          integer     NOT NULL CHECK (status BETWEEN 100 AND 599),
    body            bytea       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),

    PRIMARY KEY (api_key, idempotency_key)
);
`

// keyStatements are the statements on one Server's table of keys.
type keyStatements struct {
	table       string // unquoted, for the lock
	load, store string
}

func newKeyStatements(name string) keyStatements {
	table := keysTable(name)
	quoted := pgx.Identifier{table}.Sanitize()
	return keyStatements{
		table: table,
		load:  fmt.Sprintf(loadResultSQL, quoted),
		store: fmt.Sprintf(storeResultSQL, quoted),
	}
}

// lockKeySQL takes a key's lock without waiting. The lock is
// transaction-scoped: it is released when the request's transaction commits
// or rolls back, and by Postgres when a crashed process's connection goes,
// so no key is left "in use" for ever. Postgres releases it only after the
// commit is visible, so the next holder always sees the stored result. The
// first half of the two-key lock is the hash of the table's name, which
// keeps fakes sharing a database apart; API key and idempotency key are
// joined by a newline, which neither can contain (both travel in HTTP
// headers). Two keys whose hashes collide cost no more than a spurious 409
// while both execute.
const lockKeySQL = `SELECT pg_try_advisory_xact_lock(hashtext($1), hashtext($2 || E'\n' || $3))`

// lockKey takes the lock on an idempotency key for tx and reports whether
// it got it; false means another request with the key is executing.
func (s *Server) lockKey(ctx context.Context, tx pgx.Tx, apiKey, key string) (bool, error) {
	var held bool
	if err := tx.QueryRow(ctx, lockKeySQL, s.keys.table, apiKey, key).Scan(&held); err != nil {
		return false, fmt.Errorf("lock idempotency key: %w", err)
	}
	return held, nil
}

// result is what an idempotency key stores: the response of the request
// that executed under it, and what that request was.
type result struct {
	fingerprint []byte
	requestID   string
	response    Response
}

const loadResultSQL = `
SELECT fingerprint, request_id, status, body FROM %s
WHERE api_key = $1 AND idempotency_key = $2
  AND created_at > now() - make_interval(secs => $3)`

// loadResult returns the live result stored for key, or nil if there is
// none. The caller holds the key's lock, so no result can appear for it
// until the caller's transaction ends.
func (s *Server) loadResult(ctx context.Context, tx pgx.Tx, apiKey, key string) (*result, error) {
	var r result
	err := tx.QueryRow(ctx, s.keys.load, apiKey, key, KeyRetention.Seconds()).
		Scan(&r.fingerprint, &r.requestID, &r.response.Status, &r.response.Body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load idempotent result: %w", err)
	}
	return &r, nil
}

// storeResultSQL writes a key's result. The conflict arm is reached only by
// a key whose stored result outlived KeyRetention: the caller holds the
// key's lock and found no live result.
const storeResultSQL = `
INSERT INTO %s (api_key, idempotency_key, fingerprint, request_id, status, body)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (api_key, idempotency_key) DO UPDATE
SET fingerprint = excluded.fingerprint, request_id = excluded.request_id,
    status = excluded.status, body = excluded.body, created_at = now()`

// storeResult stores r for key in tx, the transaction that executed the
// request, so the result and the request's change commit together.
func (s *Server) storeResult(ctx context.Context, tx pgx.Tx, apiKey, key string, r result) error {
	_, err := tx.Exec(ctx, s.keys.store, apiKey, key, r.fingerprint, r.requestID, r.response.Status, r.response.Body)
	if err != nil {
		return fmt.Errorf("store idempotent result: %w", err)
	}
	return nil
}

// keyInUse is Stripe's answer to a request whose key another request is
// executing under. Nothing is stored for it.
func keyInUse(key string) Response {
	return ErrorResponse(http.StatusConflict, Error{
		Type: "idempotency_error",
		Code: "idempotency_key_in_use",
		Message: "There is currently another in-progress request using this Idempotent Key (that probably means " +
			"you submitted twice, and the other request is still going through): " + key + ". Please try again later.",
	})
}

// keyMismatch is Stripe's answer to a key reused with other parameters.
func keyMismatch(key string) Response {
	return ErrorResponse(http.StatusBadRequest, Error{
		Type: "idempotency_error",
		Message: "Keys for idempotent requests can only be used with the same parameters they were first used with. " +
			"Try using a key other than '" + key + "' if you meant to execute a different request.",
	})
}
