package payoutprovider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"time"

	"github.com/atomicphase/atomicphase/examples/internal/fakeapi"
)

// maxAnswerBytes caps the answer the client reads.
const maxAnswerBytes = 64 << 10

// DefaultTimeout bounds one payout request when NewClient is given no
// http.Client.
const DefaultTimeout = 10 * time.Second

// ErrOutcomeUnknown is returned, wrapped, when a payout request was sent but
// no answer was read (a timeout, a dropped connection) or the provider
// answered 5xx: the payout may have been made. Repeating the request with
// the same Idempotency-Key makes it at most once and tells which.
var ErrOutcomeUnknown = errors.New("payoutprovider: the payout may or may not have been made")

// Error is an error answer of the API.
type Error struct {
	// Status is the HTTP status.
	Status int
	// Type and Code classify the error (idempotency_error,
	// idempotency_key_in_use, ...).
	Type    string
	Code    string
	Message string
}

func (e *Error) Error() string {
	if e.Code != "" {
		return fmt.Sprintf("payoutprovider: %d %s (%s): %s", e.Status, e.Type, e.Code, e.Message)
	}
	return fmt.Sprintf("payoutprovider: %d %s: %s", e.Status, e.Type, e.Message)
}

// Client calls a payout provider's API.
type Client struct {
	baseURL string
	http    *http.Client
}

// NewClient returns a client for the provider at baseURL (such as
// "http://localhost:8081"). A nil httpClient means one with DefaultTimeout.
func NewClient(baseURL string, httpClient *http.Client) *Client {
	if httpClient == nil {
		httpClient = &http.Client{Timeout: DefaultTimeout}
	}
	return &Client{baseURL: strings.TrimSuffix(baseURL, "/"), http: httpClient}
}

// CreatePayout asks for the payout p under the idempotency key key, and
// returns the payout made, whose Status may be StatusFailed when the
// destination refused it. The same key with the same p always yields the
// same payout, however often it is sent.
//
// Errors: ErrOutcomeUnknown (wrapped) when the request was sent and may
// have taken effect; *Error for any other error answer (409 while another
// request with the key executes, 400 for a key reused with other
// parameters); other errors when the request was never sent.
func (c *Client) CreatePayout(ctx context.Context, key string, p PayoutParams) (Payout, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return Payout{}, fmt.Errorf("payoutprovider: encode payout: %w", err)
	}
	// Whether the request reached the wire decides what a transport error
	// means: before it, nothing can have happened; after it, anything can.
	var wrote atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				wrote.Store(true)
			}
		},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+"/v1/payouts", bytes.NewReader(body))
	if err != nil {
		return Payout{}, fmt.Errorf("payoutprovider: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.http.Do(req)
	if err != nil {
		if wrote.Load() {
			return Payout{}, fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
		}
		return Payout{}, fmt.Errorf("payoutprovider: create payout: %w", err)
	}
	defer resp.Body.Close()
	payload, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return Payout{}, fmt.Errorf("%w: reading the answer: %w", ErrOutcomeUnknown, err)
	}
	if resp.StatusCode != http.StatusOK {
		apiErr := decodeError(resp.StatusCode, payload)
		if resp.StatusCode >= 500 {
			return Payout{}, fmt.Errorf("%w: %w", ErrOutcomeUnknown, apiErr)
		}
		return Payout{}, apiErr
	}
	var payout Payout
	if err := json.Unmarshal(payload, &payout); err != nil || payout.ID == "" {
		return Payout{}, fmt.Errorf("%w: unreadable payout in a 200 answer: %q", ErrOutcomeUnknown, payload)
	}
	return payout, nil
}

func decodeError(status int, body []byte) *Error {
	var e struct{ Error fakeapi.Error }
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Type == "" {
		return &Error{Status: status, Type: "unreadable_error", Message: string(body)}
	}
	return &Error{Status: status, Type: e.Error.Type, Code: e.Error.Code, Message: e.Error.Message}
}
