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
	v := strings.Trim(header, " \t")
	if v == "" {
		return "", ErrKeyMissing
	}
	key := v
	if v[0] == '"' {
		var err error
		if key, err = parseQuoted(v); err != nil {
			return "", err
		}
	} else {
		for i := 0; i < len(v); i++ {
			if c := v[i]; c < 0x21 || c > 0x7e {
				return "", invalidChar(v, i)
			}
			if v[i] == ',' {
				return "", errSeveralKeys
			}
		}
	}
	if len(key) > MaxKeyLength {
		return "", invalidKey("key is %d characters long; the maximum is %d", len(key), MaxKeyLength)
	}
	return key, nil
}

// parseQuoted parses v, which starts with a double quote, as an RFC 8941
// sf-string (section 4.2.5) that must make up the whole value.
func parseQuoted(v string) (string, error) {
	var b strings.Builder
	escaped := false
	start := 1 // v[start:i] is unescaped text not yet copied to b
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			if i+1 == len(v) {
				return "", errUnterminated
			}
			if n := v[i+1]; n != '"' && n != '\\' {
				return "", invalidKey(`invalid escape at position %d: a backslash may only be followed by " or \, not %s`, i+1, describe(v[i+1:]))
			}
			escaped = true
			b.WriteString(v[start:i])
			start = i + 1
			i++
		case c == '"':
			if rest := strings.TrimLeft(v[i+1:], " \t"); rest != "" {
				pos := len(v) - len(rest) + 1
				if rest[0] == ',' {
					return "", errSeveralKeys
				}
				if rest[0] == ';' {
					return "", invalidKey("unexpected %s at position %d: parameters after the quoted key are not supported", describe(rest), pos)
				}
				return "", invalidKey("unexpected %s at position %d after the closing quote", describe(rest), pos)
			}
			key := v[1:i]
			if escaped {
				b.WriteString(v[start:i])
				key = b.String()
			}
			if key == "" {
				return "", invalidKey("quoted key is empty; keys are 1-%d characters", MaxKeyLength)
			}
			return key, nil
		case c < 0x20 || c > 0x7e:
			return "", invalidChar(v, i)
		}
	}
	return "", errUnterminated
}

// errSeveralKeys reports a value that holds a list. HTTP lets a field's
// values be sent on several lines or joined by commas on one (RFC 9110
// section 5.3), and both mean the same, so a comma outside quotes is read as
// a list separator and refused like several header lines are.
var errSeveralKeys = invalidKey("the request has more than one Idempotency-Key (a comma separates values of one header); send exactly one key, and quote a key that contains a comma")

// CheckKey returns an error wrapping ErrKeyInvalid unless key can be stored:
// 1 to MaxKeyLength characters of valid UTF-8 without NUL. ParseKey's keys
// always pass; it is for keys that reach a run by other ways than the header.
func CheckKey(key string) error {
	if err := checkText(key, MaxKeyLength); err != nil {
		return fmt.Errorf("%w: key %s", ErrKeyInvalid, err)
	}
	return nil
}

var errUnterminated = invalidKey(`quoted key has no closing quote; a key that starts with " must end with "`)

func invalidChar(v string, i int) error {
	return invalidKey("invalid %s at position %d; keys are 1-%d visible ASCII characters", describe(v[i:]), i+1, MaxKeyLength)
}

func invalidKey(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrKeyInvalid}, args...)...)
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
