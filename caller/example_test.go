package caller_test

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"

	"github.com/atomicphase/atomicphase/caller"
)

func ExampleClient_Do() {
	// An endpoint that charges once per key, and whose first answer is lost
	// on the way back, as a broken connection loses it.
	var (
		mu      sync.Mutex
		charged = map[string]bool{}
	)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		replay := charged[key]
		charged[key] = true
		mu.Unlock()
		if !replay {
			conn, _, _ := http.NewResponseController(w).Hijack()
			conn.Close()
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"charge":"ch_1"}`)
	}))
	defer api.Close()
	transport := &http.Transport{}
	defer transport.CloseIdleConnections()

	c, err := caller.New(caller.Config{Transport: transport})
	if err != nil {
		log.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, api.URL+"/charges", strings.NewReader(`{"amount":2000}`))
	if err != nil {
		log.Fatal(err)
	}
	res, err := c.Do(req)
	var unknown *caller.UnknownOutcomeError
	if errors.As(err, &unknown) {
		log.Fatalf("outcome unknown: retry later with key %s", unknown.Key)
	} else if err != nil {
		log.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	mu.Lock()
	defer mu.Unlock()
	fmt.Println(res.StatusCode, string(body), "attempts:", res.Attempts, "replayed:", res.Replayed, "charges:", len(charged))
	// Output: 201 {"charge":"ch_1"} attempts: 2 replayed: true charges: 1
}
