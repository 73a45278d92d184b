package keyrow

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// HeaderName is the request header that carries the idempotency key.
const HeaderName = "Idempotency-Key"

// MaxKeyLength is the longest key ParseKey accepts, in characters. It is
// Stripe's limit, so a key a client already generates for Stripe fits.
const MaxKeyLength = 255

var (
	// ErrKeyMissing is returned by ParseKey when the Idempotency-Key header is
	// absent, empty or only whitespace.
	ErrKeyMissing = errors.New("Idempotency-Key header is missing")

	// ErrKeyInvalid is returned, wrapped, by ParseKey when the header is present
	// but does not hold a valid key. The wrapping error's message names the
	// problem and its position and is written for the client developer who
	// sent the request, so it can be returned verbatim in a 400 response.
	ErrKeyInvalid = errors.New("Idempotency-Key header is invalid")
)

// ParseKey parses an Idempotency-Key header value in both forms real clients
// send: a bare token, as Stripe's clients send it
// (Idempotency-Key: 8e03978e-40d5-43e8-bc93-6894a57f9324), and an RFC 8941
// sf-string, as draft-ietf-httpapi-idempotency-key-header specifies
// (Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"). Both spellings
// of one key return the same key.
//
// Spaces and tabs around the value are ignored. A bare key is 1 to
// MaxKeyLength visible ASCII characters (0x21-0x7E); a value that starts with
// a double quote is always the quoted form. A quoted key may also contain
// spaces, as RFC 8941 allows, and escapes only \" and \\; its length is
// counted after unescaping. Structured-field parameters after the closing
// quote ("abc";p=1) are rejected rather than ignored, so that two headers
// that differ only in them are never taken for the same key.
//
// A comma outside quotes separates list values (RFC 9110 section 5.3), so
// "a, b" is two keys and is refused, like two header lines; a bare key
// cannot contain a comma, and a key with a comma must be quoted ("a,b").
//
// An empty or whitespace-only value returns ErrKeyMissing; any other invalid
// value returns an error wrapping ErrKeyInvalid. Positions in error messages
// count characters of the value from 1, after surrounding whitespace is
// removed. ParseKey does not allocate unless the quoted key contains escapes.
func ParseKey(header string) (string, error) {
	return parseKey(header, headerCarrier)
}

// headerCarrier names the key's carrier in the errors of ParseKey.
const headerCarrier = HeaderName + " header"

// KeyFrom returns the idempotency key that values carry, values being every
// value of one carrier as its transport delivers them: the lines of an HTTP
// header, the entries of gRPC or Connect metadata, or the value of a
// request field. It is the one reading of a key for every transport: each
// value is read as ParseKey reads a header (surrounding spaces and tabs
// ignored, a bare or a quoted key, a comma outside quotes separating two
// keys), and more than one value is refused as several keys, as
// several header lines are.
//
// carrier names where the key travels, as the transport's user knows it
// ("Idempotency-Key header", "idempotency-key metadata", "request field");
// it opens every error message, which is written for the client developer
// and can be returned verbatim. No value, or only empty or whitespace-only
// ones, returns an error wrapping ErrKeyMissing; any other invalid input
// an error wrapping ErrKeyInvalid.
func KeyFrom(carrier string, values ...string) (string, error) {
	switch len(values) {
	case 0:
		return parseKey("", carrier)
	case 1:
		return parseKey(values[0], carrier)
	}
	return "", &keyError{carrier: carrier, kind: ErrKeyInvalid,
		detail: fmt.Sprintf("the request carries %d values; send exactly one key", len(values))}
}

// keyError is an error of KeyFrom or ParseKey: its message names the carrier
// and the problem, and it wraps ErrKeyMissing or ErrKeyInvalid.
type keyError struct {
	carrier string
	kind    error
	detail  string
}

func (e *keyError) Error() string {
	if e.kind == ErrKeyMissing {
		return e.carrier + " is missing"
	}
	return e.carrier + " is invalid: " + e.detail
}

func (e *keyError) Unwrap() error { return e.kind }

// parseKey is ParseKey for a value of carrier.
func parseKey(value, carrier string) (string, error) {
	v := strings.Trim(value, " \t")
	if v == "" {
		if carrier == headerCarrier {
			return "", ErrKeyMissing
		}
		return "", &keyError{carrier: carrier, kind: ErrKeyMissing}
	}
	key := v
	if v[0] == '"' {
		var problem string
		if key, problem = parseQuoted(v); problem != "" {
			return "", invalidKey(carrier, problem)
		}
	} else {
		for i := 0; i < len(v); i++ {
			if c := v[i]; c < 0x21 || c > 0x7e {
				return "", invalidKey(carrier, invalidChar(v, i))
			}
			if v[i] == ',' {
				return "", invalidKey(carrier, severalKeys)
			}
		}
	}
	if len(key) > MaxKeyLength {
		return "", invalidKey(carrier, fmt.Sprintf("key is %d characters long; the maximum is %d", len(key), MaxKeyLength))
	}
	return key, nil
}

// parseQuoted parses v, which starts with a double quote, as an RFC 8941
// sf-string (section 4.2.5) that must make up the whole value. It returns
// the key, or what is wrong with v.
func parseQuoted(v string) (key, problem string) {
	var b strings.Builder
	escaped := false
	start := 1 // v[start:i] is unescaped text not yet copied to b
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			if i+1 == len(v) {
				return "", unterminated
			}
			if n := v[i+1]; n != '"' && n != '\\' {
				return "", fmt.Sprintf(`invalid escape at position %d: a backslash may only be followed by " or \, not %s`, i+1, describe(v[i+1:]))
			}
			escaped = true
			b.WriteString(v[start:i])
			start = i + 1
			i++
		case c == '"':
			if rest := strings.TrimLeft(v[i+1:], " \t"); rest != "" {
				pos := len(v) - len(rest) + 1
				if rest[0] == ',' {
					return "", severalKeys
				}
				if rest[0] == ';' {
					return "", fmt.Sprintf("unexpected %s at position %d: parameters after the quoted key are not supported", describe(rest), pos)
				}
				return "", fmt.Sprintf("unexpected %s at position %d after the closing quote", describe(rest), pos)
			}
			key := v[1:i]
			if escaped {
				b.WriteString(v[start:i])
				key = b.String()
			}
			if key == "" {
				return "", fmt.Sprintf("quoted key is empty; keys are 1-%d characters", MaxKeyLength)
			}
			return key, ""
		case c < 0x20 || c > 0x7e:
			return "", invalidChar(v, i)
		}
	}
	return "", unterminated
}

// severalKeys reports a value that holds a list. HTTP lets a field's values
// be sent on several lines or joined by commas on one (RFC 9110 section
// 5.3), and both mean the same, so a comma outside quotes is read as a list
// separator and refused like several values are.
const severalKeys = "it holds more than one key (a comma separates values); send exactly one key, and quote a key that contains a comma"

// CheckKey returns an error wrapping ErrKeyInvalid unless key can be stored:
// 1 to MaxKeyLength characters of valid UTF-8 without NUL. ParseKey's keys
// always pass; it is for keys that reach a run by other ways than the header.
func CheckKey(key string) error {
	if err := checkText(key, MaxKeyLength); err != nil {
		return fmt.Errorf("%w: key %s", ErrKeyInvalid, err)
	}
	return nil
}

const unterminated = `quoted key has no closing quote; a key that starts with " must end with "`

func invalidChar(v string, i int) string {
	return fmt.Sprintf("invalid %s at position %d; keys are 1-%d visible ASCII characters", describe(v[i:]), i+1, MaxKeyLength)
}

func invalidKey(carrier, problem string) error {
	if carrier == headerCarrier {
		// ErrKeyInvalid's own text names the header.
		return fmt.Errorf("%w: %s", ErrKeyInvalid, problem)
	}
	return &keyError{carrier: carrier, kind: ErrKeyInvalid, detail: problem}
}

// describe names the first character of s for an error message. Header
// values are raw bytes, so it falls back to the byte when s is not UTF-8.
func describe(s string) string {
	r, size := utf8.DecodeRuneInString(s)
	switch {
	case r == utf8.RuneError && size <= 1:
		return fmt.Sprintf("byte 0x%02X", s[0])
	case r > 0x20 && r < 0x7f:
		return fmt.Sprintf("character %q", r)
	default:
		return fmt.Sprintf("character %#U", r)
	}
}
