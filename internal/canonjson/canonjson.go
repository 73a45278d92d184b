// Package canonjson writes the canonical form of a JSON text that keyrow's
// fingerprints hash: keyrow.Canonical documents the form and what it
// rejects, and the golden fingerprints (golden_test.go at the module root)
// hold it byte for byte. Its errors speak as keyrow's, since keyrow returns
// them to its callers unwrapped.
package canonjson

import (
	"bytes"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// maxNesting is the deepest array and object nesting Append accepts, the
// same limit encoding/json applies, so that hostile input cannot exhaust the
// stack.
const maxNesting = 10000

// Append appends the canonical form of params to dst, or returns an error
// that says why params have none (see keyrow.Canonical).
func Append(dst, params []byte) ([]byte, error) {
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
