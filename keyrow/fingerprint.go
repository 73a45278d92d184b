package keyrow

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/atomicphase/atomicphase/internal/canonjson"
)

// fingerprintDomain and requestDomain keep fingerprints apart from every
// other SHA-256 of the same bytes and version what they hash: a change to
// Canonical or to what a fingerprint covers needs a new version, because
// stored fingerprints would stop matching retries.
const (
	fingerprintDomain = "atomicphase/fingerprint/v1\x00"
	requestDomain     = "atomicphase/fingerprint/v2\x00"
)

// Fingerprint returns the SHA-256 fingerprint of a request to workflow with
// JSON params, as keys stored before definitions were recorded hold it (see
// RequestFingerprint for the one new keys get). Requests that mean the same give equal fingerprints regardless
// of object key order, insignificant whitespace, string escaping or number
// spelling (1, 1.0, 1e0 and 10E-1 are one number; -0 and 0 are equal);
// requests that differ in any value, in array order or in the type of a value
// ("1" and 1) give different ones. The workflow name is part of the
// fingerprint, so a key reused for another workflow mismatches even with the
// same params.
//
// Fingerprint accepts exactly the params Canonical accepts and returns its
// error otherwise.
//
// Its params are the server's encoding of the decoded request, so a change
// to the request type changes it; the library still computes it, for a
// retry of a key stored with it, so such keys keep their replay after an
// upgrade made no change to the request type.
func Fingerprint(workflow string, params []byte) ([32]byte, error) {
	buf := make([]byte, 0, len(fingerprintDomain)+len(workflow)+1+len(params))
	buf = append(buf, fingerprintDomain...)
	buf = append(buf, workflow...)
	// Canonical JSON escapes every control character, so it never contains a
	// NUL: the last NUL ends the workflow name even when the name contains
	// one, and no two (workflow, params) pairs hash the same bytes.
	buf = append(buf, 0)
	buf, err := canonjson.Append(buf, params)
	if err != nil {
		return [32]byte{}, err
	}
	return sha256.Sum256(buf), nil
}

// RequestFingerprint returns the SHA-256 fingerprint of a request as its
// client sent it: target, the path and query it was sent to (empty for a
// request that did not come over HTTP), and its body of the given media
// type. The server's types play no part in it, so a deploy that adds a field
// to the request type, or renames the workflow, leaves the fingerprints of
// retries unchanged.
//
// The body is taken in a canonical form where its media type has one: a
// JSON body (application/json or any +json type) as Canonical gives it, so
// whitespace, key order and number spelling do not count; a form body
// (application/x-www-form-urlencoded) with its fields sorted by name, each
// field's values in their order; any other body byte for byte. The query is
// canonical the way a form is. A JSON body that Canonical rejects is an
// error, returned as Canonical returns it; so is a form or query that does
// not parse.
func RequestFingerprint(target, mediaType string, body []byte) ([32]byte, error) {
	path, query, _ := strings.Cut(target, "?")
	buf := make([]byte, 0, len(requestDomain)+len(target)+len(body)+8)
	buf = append(buf, requestDomain...)
	buf = append(buf, path...)
	buf = append(buf, 0)
	buf, err := appendForm(buf, query)
	if err != nil {
		return [32]byte{}, fmt.Errorf("keyrow: query: %w", err)
	}
	buf = append(buf, 0)
	switch {
	case mediaType == "application/json" || strings.HasSuffix(mediaType, "+json"):
		buf = append(buf, 'j')
		buf, err = canonjson.Append(buf, body)
	case mediaType == "application/x-www-form-urlencoded":
		buf = append(buf, 'f')
		buf, err = appendForm(buf, string(body))
		if err != nil {
			err = fmt.Errorf("keyrow: form body: %w", err)
		}
	default:
		buf = append(buf, 'b')
		buf = append(buf, body...)
	}
	if err != nil {
		return [32]byte{}, err
	}
	return sha256.Sum256(buf), nil
}

// appendForm appends a canonical form of a URL-encoded form or query: its
// fields sorted by name, each unescaped name followed by a NUL (which it may
// not hold) and its count of values, each value preceded by its length, so
// no two forms collide.
func appendForm(dst []byte, form string) ([]byte, error) {
	if form == "" {
		return dst, nil
	}
	values, err := url.ParseQuery(form)
	if err != nil {
		return nil, err
	}
	for _, name := range slices.Sorted(maps.Keys(values)) {
		if strings.IndexByte(name, 0) >= 0 {
			return nil, errors.New("a field name holds a NUL character")
		}
		dst = append(append(dst, name...), 0)
		dst = strconv.AppendInt(dst, int64(len(values[name])), 10)
		dst = append(dst, 0)
		for _, v := range values[name] {
			dst = strconv.AppendInt(dst, int64(len(v)), 10)
			dst = append(append(dst, ':'), v...)
		}
	}
	return dst, nil
}

// Canonical returns the canonical JSON form of params that Fingerprint
// hashes: two JSON texts with the same meaning have byte-identical canonical
// forms, and the canonical form of a canonical form is itself.
//
// The form has no insignificant whitespace; object members sorted by key in
// byte order of the unescaped UTF-8 key; arrays in their original order;
// strings escaped only where JSON requires it (", \, and control characters,
// using \b \f \n \r \t where they exist and \u00xx otherwise); and numbers
// written from their exact decimal value, never rounded through float64, in
// plain digits (2000, 12.5, 0.0000015) unless that takes more than 21
// trailing zeros or more than 5 zeros after the decimal point, and otherwise
// in scientific notation with a lowercase e and no plus sign (1e22, 1.5e-7).
// Zero is always 0.
//
// Canonical rejects, with an error that says why: input that is not a single
// JSON value (including trailing data), invalid UTF-8 and unpaired UTF-16
// surrogate escapes such as "\ud800" (RFC 7493 forbids both, and decoding
// would replace them with U+FFFD, so distinct inputs would collide), objects
// with a repeated key (after unescaping), whose meaning differs between JSON
// parsers, and nesting deeper than 10000 levels.
func Canonical(params []byte) ([]byte, error) {
	return canonjson.Append(make([]byte, 0, len(params)), params)
}

// DownstreamKey returns the idempotency key a run sends with the foreign call
// of phase: prefix, then a hash of the tenant, the key and the request's
// fingerprint, then the phase. Every run of the same request under the same
// key derives the same downstream key, in any process, and different keys,
// tenants, requests or phases derive different ones.
//
// It depends on nothing the database generates, so it survives the loss of
// the key row itself: after a failover to an asynchronous standby that had
// not received the row, a retry creates a new row and still sends the same
// downstream key, and a provider that honours idempotency keys answers with
// the first call's result instead of acting twice. The other side of that
// choice: a client that reuses a key for the same request after the key's
// retention has passed gets the first call's result from a provider that
// still remembers its key (Stripe keeps keys for 24 hours), where a row-based
// key would have made a second call. Reusing a key for a different request
// derives a different downstream key.
//
// A provider that checks a call's parameters against its key, as Stripe
// does, replays only a call with the same parameters: for a retry after the
// loss of the row to find the first call's result, the parameters must come
// from the request too, not from rows the run wrote, such as a generated ID.
func DownstreamKey(prefix, tenant, key string, fingerprint []byte, phase string) string {
	h := sha256.New()
	for _, s := range []string{tenant, key} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	h.Write(fingerprint)
	sum := h.Sum(nil)
	return prefix + "-" + hex.EncodeToString(sum[:16]) + "-" + phase
}
