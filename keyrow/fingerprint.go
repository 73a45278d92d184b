package keyrow

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// fingerprintDomain and requestDomain keep fingerprints apart from every
// other SHA-256 of the same bytes and version what they hash: a change to
// Canonical or to what a fingerprint covers needs a new version, because
// stored fingerprints would stop matching retries.
const (
	fingerprintDomain = "atomicphase/fingerprint/v1\x00"
	requestDomain     = "atomicphase/fingerprint/v2\x00"
)

// maxNesting is the deepest array and object nesting Canonical accepts, the
// same limit encoding/json applies, so that hostile input cannot exhaust the
// stack.
const maxNesting = 10000

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
	buf, err := appendCanonical(buf, params)
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
		buf, err = appendCanonical(buf, body)
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
	return appendCanonical(make([]byte, 0, len(params)), params)
}

// appendCanonical appends the canonical form of params to dst.
func appendCanonical(dst, params []byte) ([]byte, error) {
	if !utf8.Valid(params) {
		return nil, errors.New("keyrow: params are not valid UTF-8")
	}
	c := canonicalizer{src: params, out: dst}
	c.skipSpace()
	if c.pos == len(params) {
		return nil, errors.New("keyrow: params are empty; want a JSON value")
	}
	if err := c.value(0); err != nil {
		return nil, err
	}
	c.skipSpace()
	if c.pos < len(params) {
		return nil, fmt.Errorf("keyrow: params are not valid JSON: unexpected data after the value at offset %d", c.pos)
	}
	return c.out, nil
}

// canonicalizer reads one JSON value from src, checking its grammar as RFC
// 8259 states it, and writes its canonical form to out. It reads the input
// once, and allocates only for objects of more than eight members, keys
// that contain escapes and number literals.
type canonicalizer struct {
	src     []byte
	pos     int // the next byte of src to read
	out     []byte
	scratch []byte // reused to reorder object members
	text    []byte // reused for the unescaped text of a string value
}

// member locates one object member, written as "key":value, in out.
type member struct {
	key        []byte // unescaped
	start, end int
}

func (c *canonicalizer) skipSpace() {
	for c.pos < len(c.src) && isSpace(c.src[c.pos]) {
		c.pos++
	}
}

// syntaxError reports what was found at the current position instead of
// what the grammar allows there.
func (c *canonicalizer) syntaxError(want string) error {
	if c.pos >= len(c.src) {
		return fmt.Errorf("keyrow: params are not valid JSON: unexpected end of input; want %s", want)
	}
	r, _ := utf8.DecodeRune(c.src[c.pos:])
	return fmt.Errorf("keyrow: params are not valid JSON: unexpected %q at offset %d; want %s", r, c.pos, want)
}

// value reads the value that starts at the current position, which is not
// a space, at nesting depth depth.
func (c *canonicalizer) value(depth int) error {
	if c.pos >= len(c.src) {
		return c.syntaxError("a value")
	}
	switch b := c.src[c.pos]; {
	case b == '{' || b == '[':
		if depth >= maxNesting {
			return fmt.Errorf("keyrow: params nest deeper than %d levels", maxNesting)
		}
		c.pos++
		if b == '{' {
			return c.object(depth + 1)
		}
		return c.array(depth + 1)
	case b == '"':
		text, err := c.string(false)
		if err != nil {
			return err
		}
		c.out = appendString(c.out, text)
	case b == '-' || '0' <= b && b <= '9':
		return c.number()
	case b == 't':
		return c.literal("true")
	case b == 'f':
		return c.literal("false")
	case b == 'n':
		return c.literal("null")
	default:
		return c.syntaxError("a value")
	}
	return nil
}

func (c *canonicalizer) literal(word string) error {
	for i := range len(word) {
		if c.pos >= len(c.src) || c.src[c.pos] != word[i] {
			return c.syntaxError(strconv.Quote(word))
		}
		c.pos++
	}
	c.out = append(c.out, word...)
	return nil
}

// consume reads b when it is the next byte, and reports whether it was.
func (c *canonicalizer) consume(b byte) bool {
	if c.pos < len(c.src) && c.src[c.pos] == b {
		c.pos++
		return true
	}
	return false
}

// array is called after the opening bracket.
func (c *canonicalizer) array(depth int) error {
	c.out = append(c.out, '[')
	c.skipSpace()
	for n := 0; !c.consume(']'); n++ {
		if n > 0 {
			if !c.consume(',') {
				return c.syntaxError("a comma or a closing bracket")
			}
			c.out = append(c.out, ',')
			c.skipSpace()
		}
		if err := c.value(depth); err != nil {
			return err
		}
		c.skipSpace()
	}
	c.out = append(c.out, ']')
	return nil
}

// object is called after the opening brace. Members are written in input
// order, then rewritten in key order unless they already are in it.
func (c *canonicalizer) object(depth int) error {
	c.out = append(c.out, '{')
	start := len(c.out)
	var small [8]member
	members := small[:0]
	c.skipSpace()
	for !c.consume('}') {
		if len(members) > 0 {
			if !c.consume(',') {
				return c.syntaxError("a comma or a closing brace")
			}
			c.skipSpace()
		}
		if c.pos >= len(c.src) || c.src[c.pos] != '"' {
			return c.syntaxError("an object key")
		}
		key, err := c.string(true)
		if err != nil {
			return err
		}
		if len(members) > 0 {
			c.out = append(c.out, ',')
		}
		m := member{key: key, start: len(c.out)}
		c.out = appendString(c.out, key)
		c.out = append(c.out, ':')
		c.skipSpace()
		if !c.consume(':') {
			return c.syntaxError("a colon")
		}
		c.skipSpace()
		if err := c.value(depth); err != nil {
			return err
		}
		m.end = len(c.out)
		members = append(members, m)
		c.skipSpace()
	}
	byKey := func(a, b member) int { return bytes.Compare(a.key, b.key) }
	sorted := slices.IsSortedFunc(members, byKey)
	if !sorted {
		slices.SortFunc(members, byKey)
	}
	for i := 1; i < len(members); i++ {
		if bytes.Equal(members[i].key, members[i-1].key) {
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

// string reads the string literal at the current position and returns its
// unescaped text: the input itself when the literal has no escapes, else
// text that stays valid until the next call, or, for a key, which must
// outlive the object's other members, a copy of its own. The input is valid
// UTF-8, so the text is too once no escape is an unpaired surrogate.
func (c *canonicalizer) string(key bool) ([]byte, error) {
	c.pos++ // the opening quote
	start := c.pos
	for c.pos < len(c.src) {
		switch b := c.src[c.pos]; {
		case b == '"':
			c.pos++
			return c.src[start : c.pos-1], nil
		case b == '\\':
			return c.escapedString(start, key)
		case b < 0x20:
			return nil, c.syntaxError("a closing quote; control characters in strings must be escaped")
		}
		c.pos++
	}
	return nil, c.syntaxError("a closing quote")
}

// escapedString continues string at the first backslash of a literal whose
// text began at start.
func (c *canonicalizer) escapedString(start int, key bool) ([]byte, error) {
	text := append(c.text[:0], c.src[start:c.pos]...)
	for c.pos < len(c.src) {
		b := c.src[c.pos]
		switch {
		case b == '"':
			c.pos++
			if key {
				return bytes.Clone(text), nil
			}
			c.text = text
			return text, nil
		case b < 0x20:
			return nil, c.syntaxError("a closing quote; control characters in strings must be escaped")
		case b != '\\':
			text = append(text, b)
			c.pos++
			continue
		}
		c.pos++ // the backslash
		if c.pos >= len(c.src) {
			return nil, c.syntaxError("an escape")
		}
		switch e := c.src[c.pos]; e {
		case '"', '\\', '/':
			text = append(text, e)
		case 'b':
			text = append(text, '\b')
		case 'f':
			text = append(text, '\f')
		case 'n':
			text = append(text, '\n')
		case 'r':
			text = append(text, '\r')
		case 't':
			text = append(text, '\t')
		case 'u':
			r := hexRune(c.src[c.pos+1:])
			if r < 0 {
				return nil, c.syntaxError("four hex digits after \\u")
			}
			c.pos += 4
			switch {
			case r >= 0xd800 && r < 0xdc00:
				rest := c.src[c.pos+1:]
				lo := rune(-1)
				if len(rest) >= 6 && rest[0] == '\\' && rest[1] == 'u' {
					lo = hexRune(rest[2:])
				}
				if lo < 0xdc00 || lo >= 0xe000 {
					return nil, fmt.Errorf(`keyrow: params contain an unpaired UTF-16 surrogate \u%04x`, r)
				}
				c.pos += 6
				r = 0x10000 + (r-0xd800)<<10 + (lo - 0xdc00)
			case r >= 0xdc00 && r < 0xe000:
				return nil, fmt.Errorf(`keyrow: params contain an unpaired UTF-16 surrogate \u%04x`, r)
			}
			text = utf8.AppendRune(text, r)
		default:
			return nil, c.syntaxError("an escape")
		}
		c.pos++
	}
	return nil, c.syntaxError("a closing quote")
}

// number reads the number literal at the current position, checking the
// grammar -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, and writes its
// canonical spelling.
func (c *canonicalizer) number() error {
	start := c.pos
	c.consume('-')
	if !c.consume('0') && !c.digits() {
		return c.syntaxError("a digit")
	}
	if c.consume('.') && !c.digits() {
		return c.syntaxError("a digit")
	}
	if c.consume('e') || c.consume('E') {
		if !c.consume('+') {
			c.consume('-')
		}
		if !c.digits() {
			return c.syntaxError("a digit")
		}
	}
	var err error
	c.out, err = appendNumber(c.out, string(c.src[start:c.pos]))
	return err
}

// digits reads one or more decimal digits and reports whether there were any.
func (c *canonicalizer) digits() bool {
	start := c.pos
	for c.pos < len(c.src) && '0' <= c.src[c.pos] && c.src[c.pos] <= '9' {
		c.pos++
	}
	return c.pos > start
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
func appendString[T string | []byte](dst []byte, s T) []byte {
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

// appendNumber appends the canonical spelling of num, a number literal
// whose grammar canonicalizer.number has checked. The value is sign × digits × 10^exp with digits free
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
