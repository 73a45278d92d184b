package phase_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/atomicphase/atomicphase/internal/keytable"
	"github.com/atomicphase/atomicphase/phase"
)

// TestTheHTTPHandlerReadsTheSharedTableOfKeys sends every value of the table
// that all transports read, as header lines over a real connection: an
// accepted key runs once under the table's key, a refused one answers 400
// with the problem type of its verdict and runs nothing.
func TestTheHTTPHandlerReadsTheSharedTableOfKeys(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := httptest.NewServer(e.handler(t))
	t.Cleanup(srv.Close)
	seen := map[string]bool{}
	for i, c := range keytable.Cases() {
		// Spellings of one key carry one body: the second is a retry.
		body := fmt.Sprintf(`{"item":%q,"amount":%d}`, c.Key, 100+i)
		if c.Verdict == "" {
			body = fmt.Sprintf(`{"item":%q,"amount":1}`, c.Key)
		}
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "acme")
		for _, v := range c.Values {
			req.Header.Add("Idempotency-Key", v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch c.Verdict {
		case "":
			if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") == "true" && !seen[c.Key] {
				t.Errorf("%s: %d %s; want 201", c.Name, resp.StatusCode, answer)
				continue
			}
			var stored int
			if err := e.db.QueryRow(context.Background(),
				`SELECT count(*) FROM idempotency_keys WHERE idempotency_key = $1`, c.Key).Scan(&stored); err != nil {
				t.Fatal(err)
			}
			seen[c.Key] = true
			if stored != 1 {
				t.Errorf("%s: %d keys stored as %q; want 1", c.Name, stored, c.Key)
			}
		default:
			problem := phase.ProblemInvalidKey
			if c.Verdict == keytable.Missing {
				problem = phase.ProblemMissingKey
			}
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(answer), phase.ProblemTypePrefix+problem) {
				t.Errorf("%s: %d %s; want 400 of type %s", c.Name, resp.StatusCode, answer, problem)
			}
			if !strings.Contains(string(answer), "Idempotency-Key header is ") {
				t.Errorf("%s: the refusal %s does not name the Idempotency-Key header", c.Name, answer)
			}
		}
	}
	e.pay.mu.Lock()
	defer e.pay.mu.Unlock()
	if len(e.pay.calls) != countAccepted() {
		t.Errorf("the provider was called under %d downstream keys; want one per accepted key, %d", len(e.pay.calls), countAccepted())
	}
	for key, n := range e.pay.calls {
		if n != 1 {
			t.Errorf("downstream key %s was sent %d times; want 1", key, n)
		}
	}
}

// countAccepted counts the distinct keys of the table's accepted values.
func countAccepted() int {
	keys := map[string]bool{}
	for _, c := range keytable.Cases() {
		if c.Verdict == "" {
			keys[c.Key] = true
		}
	}
	return len(keys)
}
