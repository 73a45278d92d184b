// Package fakeapitest is the test plumbing of the fakes built on fakeapi: a
// fake served over real HTTP on a database of its own, and raw requests to
// it.
package fakeapitest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
)

// Serve migrates a new database for t alone (see pgtest.Pool) with migrate,
// builds a fake on it with newFake, and serves the fake on an
// httptest.Server until t ends. It returns the fake, the database and the
// server's URL.
func Serve[F http.Handler](t testing.TB, migrate func(context.Context, *pgxpool.Pool) error, newFake func(*pgxpool.Pool) F) (fake F, db *pgxpool.Pool, url string) {
	t.Helper()
	db = pgtest.Pool(t)
	if err := migrate(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	fake = newFake(db)
	hs := httptest.NewServer(fake)
	t.Cleanup(hs.Close)
	return fake, db, hs.URL
}

// Do sends a request on a connection of its own and returns the response,
// whose body it has read and closed, and the body. It fails t when no
// response comes.
func Do(t testing.TB, method, url string, header http.Header, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	// A connection of its own, because net/http resends a request whose
	// reused connection dropped before the answer, which would hide the
	// drop from the test.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, b
}

// Count returns the sum of the named counts that the fake served at
// baseURL answers on GET /_stats: a conformance check's count of
// executions, for example.
func Count(ctx context.Context, baseURL string, names ...string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/_stats", nil)
	if err != nil {
		return 0, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	var stats map[string]int64
	if err := json.NewDecoder(res.Body).Decode(&stats); err != nil {
		return 0, fmt.Errorf("GET %s/_stats: %w", baseURL, err)
	}
	var n int64
	for _, name := range names {
		n += stats[name]
	}
	return n, nil
}
