package keyrow

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// fingerprintDomain keeps fingerprints apart from every other SHA-256 of the
// same bytes and versions the canonical form: a change to Canonical needs a
// new version, because stored fingerprints would stop matching retries.
const fingerprintDomain = "atomicphase/fingerprint/v1\x00"

// maxNesting is the deepest array and object nesting Canonical accepts, the
// same limit encoding/json applies, so that hostile input cannot exhaust the
// stack.
const maxNesting = 10000

// Fingerprint returns the SHA-256 fingerprint of a request to workflow with
// JSON params. Requests that mean the same give equal fingerprints regardless
// of object key order, insignificant whitespace, string escaping or number
// spelling (1, 1.0, 1e0 and 10E-1 are one number; -0 and 0 are equal);
// requests that differ in any value, in array order or in the type of a value
// ("1" and 1) give different ones. The workflow name is part of the
// fingerprint, so a key reused for another workflow mismatches even with the
// same params.
//
// Fingerprint accepts exactly the params Canonical accepts and returns its
// error otherwise.
func Fingerprint(workflow string, params []byte) ([32]byte, error) {
	buf := make([]byte, 0, len(fingerprintDomain)+len(workflow)+1+len(params))
	buf = append(buf, fingerprintDomain...)
	buf = append(buf, workflow...)
	// Canonical JSON escapes every control character, so it never contains a
	// NUL: the last NUL ends the workflow name even when the name contains
	// one, and no two (workflow, params) pairs hash the same bytes.
	buf = append(buf, 0)
	buf, err := appendCanonical(buf, params)
	if err != nil {
		return [32]byte{}, err
	}
	return sha256.Sum256(buf), nil
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
	return appendCanonical(make([]byte, 0, len(params)), params)
}

// appendCanonical appends the canonical form of params to dst.
func appendCanonical(dst, params []byte) ([]byte, error) {
	if !utf8.Valid(params) {
		return nil, errors.New("keyrow: params are not valid UTF-8")
	}
	c := canonicalizer{src: params, dec: json.NewDecoder(bytes.NewReader(params)), out: dst}
	c.dec.UseNumber()
	tok, off, err := c.next()
	if err == io.EOF {
		return nil, errors.New("keyrow: params are empty; want a JSON value")
	}
	if err != nil {
		return nil, syntaxError(err)
	}
	if err := c.value(tok, off, 0); err != nil {
		return nil, err
	}
	off = c.dec.InputOffset()
	if _, err := c.dec.Token(); err != io.EOF {
		for off < int64(len(params)) && isSpace(params[off]) {
			off++
		}
		return nil, fmt.Errorf("keyrow: params are not valid JSON: unexpected data after the value at offset %d", off)
	}
	return c.out, nil
}

// canonicalizer writes the canonical form of the tokens read from dec to out.
type canonicalizer struct {
	src     []byte
	dec     *json.Decoder
	out     []byte
	scratch []byte // reused to reorder object members
}

// member locates one object member, written as "key":value, in out.
type member struct {
	key        string
	start, end int
}

// next returns the next token and the input offset where the search for it
// began, which lies before the token and after the previous one.
func (c *canonicalizer) next() (json.Token, int64, error) {
	off := c.dec.InputOffset()
	tok, err := c.dec.Token()
	return tok, off, err
}

func (c *canonicalizer) value(tok json.Token, off int64, depth int) error {
	switch t := tok.(type) {
	case json.Delim:
		if depth >= maxNesting {
			return fmt.Errorf("keyrow: params nest deeper than %d levels", maxNesting)
		}
		switch t {
		case '{':
			return c.object(depth + 1)
		case '[':
			return c.array(depth + 1)
		}
		return fmt.Errorf("keyrow: params are not valid JSON: unexpected %q", rune(t))
	case string:
		if err := c.checkSurrogates(t, off); err != nil {
			return err
		}
		c.out = appendString(c.out, t)
	case json.Number:
		var err error
		if c.out, err = appendNumber(c.out, string(t)); err != nil {
			return err
		}
	case bool:
		c.out = strconv.AppendBool(c.out, t)
	case nil:
		c.out = append(c.out, "null"...)
	default:
		return fmt.Errorf("keyrow: unexpected JSON token %v", tok)
	}
	return nil
}

// array is called after the opening bracket. The decoder only returns a
// closing bracket where one is allowed, so tokens need no further grammar
// checks here or in object.
func (c *canonicalizer) array(depth int) error {
	c.out = append(c.out, '[')
	for n := 0; ; n++ {
		tok, off, err := c.next()
		if err != nil {
			return syntaxError(err)
		}
		if tok == json.Delim(']') {
			break
		}
		if n > 0 {
			c.out = append(c.out, ',')
		}
		if err := c.value(tok, off, depth); err != nil {
			return err
		}
	}
	c.out = append(c.out, ']')
	return nil
}

// object is called after the opening brace. Members are written in input
// order, then rewritten in key order unless they already are in it.
func (c *canonicalizer) object(depth int) error {
	c.out = append(c.out, '{')
	start := len(c.out)
	var members []member
	for {
		tok, off, err := c.next()
		if err != nil {
			return syntaxError(err)
		}
		if tok == json.Delim('}') {
			break
		}
		key, ok := tok.(string)
		if !ok {
			return fmt.Errorf("keyrow: unexpected JSON token %v where an object key belongs", tok)
		}
		if err := c.checkSurrogates(key, off); err != nil {
			return err
		}
		if len(members) > 0 {
			c.out = append(c.out, ',')
		}
		m := member{key: key, start: len(c.out)}
		c.out = appendString(c.out, key)
		c.out = append(c.out, ':')
		if tok, off, err = c.next(); err != nil {
			return syntaxError(err)
		}
		if err := c.value(tok, off, depth); err != nil {
			return err
		}
		m.end = len(c.out)
		members = append(members, m)
	}
	byKey := func(a, b member) int { return strings.Compare(a.key, b.key) }
	sorted := slices.IsSortedFunc(members, byKey)
	if !sorted {
		slices.SortFunc(members, byKey)
	}
	for i := 1; i < len(members); i++ {
		if members[i].key == members[i-1].key {
			return fmt.Errorf("keyrow: params repeat the object key %q; its meaning would depend on the JSON parser", members[i].key)
		}
	}
	if !sorted {
		// Nested objects are complete by now, so one scratch buffer serves
		// every level.
		c.scratch = append(c.scratch[:0], c.out[start:]...)
		c.out = c.out[:start]
		for i, m := range members {
			if i > 0 {
				c.out = append(c.out, ',')
			}
			c.out = append(c.out, c.scratch[m.start-start:m.end-start]...)
		}
	}
	c.out = append(c.out, '}')
	return nil
}

// checkSurrogates rejects a string whose literal, found in the input between
// off and the decoder's offset, escapes an unpaired UTF-16 surrogate.
// encoding/json decodes such an escape to U+FFFD, so the literal is only read
// when s contains U+FFFD.
func (c *canonicalizer) checkSurrogates(s string, off int64) error {
	if !strings.ContainsRune(s, utf8.RuneError) {
		return nil
	}
	lit := c.src[off:c.dec.InputOffset()]
	// Only whitespace, a comma or a colon precede the literal's opening quote.
	lit = lit[bytes.IndexByte(lit, '"')+1:]
	for i := 0; i < len(lit); i++ {
		if lit[i] != '\\' {
			continue
		}
		i++
		if i >= len(lit) || lit[i] != 'u' {
			continue
		}
		r := hexRune(lit[i+1:])
		i += 4
		switch {
		case r >= 0xd800 && r < 0xdc00:
			if len(lit) > i+6 && lit[i+1] == '\\' && lit[i+2] == 'u' {
				if lo := hexRune(lit[i+3:]); lo >= 0xdc00 && lo < 0xe000 {
					i += 6
					continue
				}
			}
			return fmt.Errorf(`keyrow: params contain an unpaired UTF-16 surrogate \u%04x`, r)
		case r >= 0xdc00 && r < 0xe000:
			return fmt.Errorf(`keyrow: params contain an unpaired UTF-16 surrogate \u%04x`, r)
		}
	}
	return nil
}

// hexRune decodes the four hex digits that start b, or returns -1.
func hexRune(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// appendString appends s as a JSON string, escaping only what JSON requires.
// s is valid UTF-8 because the input was.
func appendString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\b':
			dst = append(dst, `\b`...)
		case '\f':
			dst = append(dst, `\f`...)
		case '\n':
			dst = append(dst, `\n`...)
		case '\r':
			dst = append(dst, `\r`...)
		case '\t':
			dst = append(dst, `\t`...)
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

const (
	// maxTrailingZeros is the most zeros an integer is written with before
	// scientific notation takes over, so 1e21 stays plain and 1e22 does not.
	maxTrailingZeros = 21
	// maxLeadingZeros is the most zeros after the decimal point before the
	// first significant digit, so 0.000001 stays plain and 1e-7 does not.
	maxLeadingZeros = 5
	// maxSmallExponent bounds exponents handled in int64; adding the digit
	// count of any real input to it cannot overflow.
	maxSmallExponent = 1e15
)

// appendNumber appends the canonical spelling of num, a number literal the
// decoder has validated. The value is sign × digits × 10^exp with digits free
// of leading and trailing zeros, which is unique for every nonzero number.
func appendNumber(dst []byte, num string) ([]byte, error) {
	neg := strings.HasPrefix(num, "-")
	num = strings.TrimPrefix(num, "-")
	mant, expText := num, "0"
	if i := strings.IndexAny(num, "eE"); i >= 0 {
		mant, expText = num[:i], num[i+1:]
	}
	intPart, frac := mant, ""
	if i := strings.IndexByte(mant, '.'); i >= 0 {
		intPart, frac = mant[:i], mant[i+1:]
	}
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return append(dst, '0'), nil
	}
	trimmed := strings.TrimRight(digits, "0")
	shift := len(digits) - len(trimmed) - len(frac) // added to the written exponent
	digits = trimmed
	if neg {
		dst = append(dst, '-')
	}

	e, err := strconv.ParseInt(expText, 10, 64)
	if err != nil || e > maxSmallExponent || e < -maxSmallExponent {
		// Far beyond the plain forms: only the exponent needs exact
		// arithmetic.
		x, ok := new(big.Int).SetString(expText, 10)
		if !ok {
			return nil, fmt.Errorf("keyrow: params contain an invalid number %q", num)
		}
		x.Add(x, big.NewInt(int64(shift+len(digits)-1)))
		return x.Append(appendMantissa(dst, digits), 10), nil
	}
	exp := e + int64(shift)
	point := int64(len(digits)) + exp // digits before the decimal point
	switch {
	case exp >= 0 && exp <= maxTrailingZeros:
		dst = append(dst, digits...)
		for range exp {
			dst = append(dst, '0')
		}
	case exp < 0 && point > 0:
		dst = append(dst, digits[:point]...)
		dst = append(dst, '.')
		dst = append(dst, digits[point:]...)
	case exp < 0 && point >= -maxLeadingZeros:
		dst = append(dst, '0', '.')
		for range -point {
			dst = append(dst, '0')
		}
		dst = append(dst, digits...)
	default:
		dst = strconv.AppendInt(appendMantissa(dst, digits), point-1, 10)
	}
	return dst, nil
}

// appendMantissa appends digits as d.ddd followed by the exponent marker.
func appendMantissa(dst []byte, digits string) []byte {
	dst = append(dst, digits[0])
	if len(digits) > 1 {
		dst = append(dst, '.')
		dst = append(dst, digits[1:]...)
	}
	return append(dst, 'e')
}

func syntaxError(err error) error {
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("keyrow: params are not valid JSON: %w", err)
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r'
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
