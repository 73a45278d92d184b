package ride

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/phase"
)

// tenant identifies the rider by the email in Authorization, as the
// original does. This is a demo: a real service authenticates the caller.
//
// What the client sent is checked before the lookup, so that the lookup
// can fail only for the server's reasons: Postgres refuses text that is not
// UTF-8, and such a header would otherwise read as an outage that no retry
// can end.
func tenant(pool *pgxpool.Pool) func(r *http.Request) (string, error) {
	return func(r *http.Request) (string, error) {
		email := strings.TrimSpace(r.Header.Get("Authorization"))
		if email == "" {
			return "", errors.New("send the rider's email in the Authorization header")
		}
		if !utf8.ValidString(email) || strings.ContainsRune(email, 0) {
			return "", &phase.RequestError{Status: http.StatusBadRequest,
				Detail: "the Authorization header must be the rider's email, in UTF-8 without NUL"}
		}
		var id int64
		err := pool.QueryRow(r.Context(), `SELECT id FROM users WHERE email = $1`, email).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", fmt.Errorf("no rider with email %q", email)
		}
		if err != nil {
			return "", fmt.Errorf("look up the rider: %w: %w", phase.ErrUnavailable, err)
		}
		return email, nil
	}
}

var coordinates = []struct {
	field    string
	limit    float64
	assignTo func(*Request) *float64
}{
	{"origin_lat", 90, func(r *Request) *float64 { return &r.OriginLat }},
	{"origin_lon", 180, func(r *Request) *float64 { return &r.OriginLon }},
	{"target_lat", 90, func(r *Request) *float64 { return &r.TargetLat }},
	{"target_lon", 180, func(r *Request) *float64 { return &r.TargetLon }},
}

// decode reads the four coordinates from form fields, as the original
// takes them, or from a JSON object, and checks each is a number in range.
func decode(r *http.Request) (Request, error) {
	var req Request
	values := map[string]string{}
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct == "application/json" {
		var body map[string]json.RawMessage
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			return req, fmt.Errorf("request body is not a JSON object: %w", err)
		}
		for k, v := range body {
			values[k] = strings.Trim(string(v), `"`)
		}
	} else {
		if err := r.ParseForm(); err != nil {
			return req, fmt.Errorf("request body is not a form: %w", err)
		}
		for _, c := range coordinates {
			if r.PostForm.Has(c.field) {
				values[c.field] = r.PostForm.Get(c.field)
			}
		}
	}
	for _, c := range coordinates {
		raw, ok := values[c.field]
		if !ok || raw == "" {
			return req, phase.Invalid(c.field, "is required")
		}
		v, err := strconv.ParseFloat(raw, 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			return req, phase.Invalid(c.field, fmt.Sprintf("must be a number, got %q", raw))
		}
		if math.Abs(v) > c.limit {
			return req, phase.Invalid(c.field, fmt.Sprintf("must be between %v and %v", -c.limit, c.limit))
		}
		*c.assignTo(&req) = v
	}
	return req, nil
}
