package caller_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/atomicphase/atomicphase/caller"
)

// The client's overhead per request, against a plain http.Client sending
// the same keyed POST, on a replay-heavy load: the server answers every
// request with a stored 201, as it answers the retries of finished keys.
// Compare the two benchmarks' ns/op and allocs/op:
//
//	go test -run '^$' -bench 'Replay' -benchmem ./caller
func BenchmarkReplayPlainHTTPClient(b *testing.B) {
	srv, tr := replayServer(b)
	hc := &http.Client{Transport: tr}
	key, _ := caller.NewKey()
	b.ReportAllocs()
	for b.Loop() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":500}`))
		req.Header.Set(caller.KeyHeader, key)
		res, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		consume(b, res)
	}
}

func BenchmarkReplayCaller(b *testing.B) {
	srv, tr := replayServer(b)
	c, err := caller.New(caller.Config{Transport: tr})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":500}`))
		res, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		if !res.Replayed {
			b.Fatal("not a replay")
		}
		consume(b, res.Response)
	}
}

func replayServer(b *testing.B) (*httptest.Server, *http.Transport) {
	body := []byte(`{"order_id":1,"charge_id":"ch_1"}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(caller.ReplayedHeader, "true")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	}))
	b.Cleanup(srv.Close)
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	b.Cleanup(tr.CloseIdleConnections)
	return srv, tr
}

func consume(b *testing.B, res *http.Response) {
	if _, err := io.Copy(io.Discard, res.Body); err != nil {
		b.Fatal(err)
	}
	_ = res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		b.Fatalf("status %d", res.StatusCode)
	}
}

// The client's own cost, without the network: the same requests over a
// transport that answers a stored 201 in process.
func BenchmarkReplayOverheadPlain(b *testing.B) {
	tr := cannedReplay{}
	key, _ := caller.NewKey()
	b.ReportAllocs()
	for b.Loop() {
		req, _ := http.NewRequest(http.MethodPost, "http://api.test/orders", strings.NewReader(`{"amount":500}`))
		req.Header.Set(caller.KeyHeader, key)
		res, err := tr.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		consume(b, res)
	}
}

func BenchmarkReplayOverheadCaller(b *testing.B) {
	c, err := caller.New(caller.Config{Transport: cannedReplay{}})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		req, _ := http.NewRequest(http.MethodPost, "http://api.test/orders", strings.NewReader(`{"amount":500}`))
		res, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		consume(b, res.Response)
	}
}

// cannedReplay answers every request with a replayed 201 in process.
type cannedReplay struct{}

func (cannedReplay) RoundTrip(req *http.Request) (*http.Response, error) {
	_, _ = io.Copy(io.Discard, req.Body)
	_ = req.Body.Close()
	return &http.Response{StatusCode: http.StatusCreated, Request: req,
		Header: http.Header{caller.ReplayedHeader: {"true"}, "Content-Type": {"application/json"}},
		Body:   io.NopCloser(strings.NewReader(`{"order_id":1,"charge_id":"ch_1"}`))}, nil
}
