package exampleprog_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/atomicphase/atomicphase/examples/internal/exampleprog"
	"github.com/atomicphase/atomicphase/phase"
)

// exchange writes raw to a server at base and reads its answer.
func exchange(t *testing.T, base, raw string) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The server may answer before it has read everything, as it does for
	// oversized headers: write and read side by side.
	go func() { _, _ = io.WriteString(conn, raw) }()
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer to %.40q: %v", raw, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(body)
}

func TestProblemsAnswersWhatNetHTTPRefusesAsProblems(t *testing.T) {
	t.Parallel()
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		phase.WriteProblem(w, http.StatusNotFound, "not-found", "Not found", "nothing here", 0)
	})
	problems, stop, err := exampleprog.Listen("127.0.0.1:0", exampleprog.Problems(api))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	plain, stopPlain, err := exampleprog.Listen("127.0.0.1:0", api)
	if err != nil {
		t.Fatal(err)
	}
	defer stopPlain()

	huge := "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", http.DefaultMaxHeaderBytes+8192) + "\r\n\r\n"
	for _, tc := range []struct {
		name, raw string
		status    int
		detail    string
	}{
		{"oversized headers", huge, http.StatusRequestHeaderFieldsTooLarge, "exceed"},
		{"not HTTP", "HELLO\r\n\r\n", http.StatusBadRequest, "HTTP"},
		{"no Host", "GET / HTTP/1.1\r\n\r\n", http.StatusBadRequest, "missing required Host header"},
		{"unknown transfer encoding", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", http.StatusNotImplemented, "Transfer-Encoding"},
		{"HTTP/3", "GET / HTTP/3.0\r\nHost: x\r\n\r\n", http.StatusHTTPVersionNotSupported, "unsupported protocol version"},
		{"a handler's answer", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusNotFound, "nothing here"},
	} {
		res, body := exchange(t, problems, tc.raw)
		var p struct {
			Type   string `json:"type"`
			Status int    `json:"status"`
			Detail string `json:"detail"`
		}
		if res.StatusCode != tc.status || res.Header.Get("Content-Type") != "application/problem+json" ||
			json.Unmarshal([]byte(body), &p) != nil || p.Status != tc.status || !strings.Contains(p.Detail, tc.detail) {
			t.Errorf("%s: %d %s %q, want a %d problem saying %q", tc.name, res.StatusCode, res.Header.Get("Content-Type"), body, tc.status, tc.detail)
		}
	}
	// Without Problems, net/http answers in its own words.
	if res, _ := exchange(t, plain, huge); res.StatusCode != http.StatusRequestHeaderFieldsTooLarge || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/plain") {
		t.Errorf("plain server: %d %s, want net/http's text/plain 431", res.StatusCode, res.Header.Get("Content-Type"))
	}
}
