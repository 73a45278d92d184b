package conformance

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"strings"
)

// OtherBody returns a request that differs from body in one value, for the
// scenarios that reuse a key with another request, and says how it was
// made. It changes the last digit of the first number in body (up by one,
// or down from 9), so that the other request stays as valid as the first:
// a JSON number, or the value of a form field (application/x-www-form-urlencoded).
// Without a number it appends "2" to the first JSON string value or form
// value. It returns nil, and why, for a body it cannot read that way.
func OtherBody(body []byte, contentType string) ([]byte, string) {
	mt, _, _ := mime.ParseMediaType(contentType)
	switch {
	case len(bytes.TrimSpace(body)) == 0:
		return nil, "the request has no body to change; pass another request (-d2)"
	case json.Valid(body) && (mt == "" || mt == "application/json" || strings.HasSuffix(mt, "+json")):
		return otherJSON(body)
	case mt == "" || mt == "application/x-www-form-urlencoded":
		return otherForm(body)
	}
	return nil, fmt.Sprintf("cannot make another request from a body of type %s; pass one (-d2)", mt)
}

// otherJSON changes the first number of a JSON document, or else its first
// string value, in place: the rest of the bytes are kept as sent.
func otherJSON(body []byte) ([]byte, string) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var firstString [2]int64
	found := false
	var path []string // object keys and array markers down to the token
	expectKey := []bool{}
	for {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			break
		}
		end := dec.InputOffset()
		inObject := len(expectKey) > 0 && expectKey[len(expectKey)-1]
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				expectKey = append(expectKey, true)
			case '[':
				expectKey = append(expectKey, false)
			default:
				expectKey = expectKey[:len(expectKey)-1]
			}
			continue
		case string:
			if inObject && isKeyPosition(body, end) {
				path = append(path[:0], v)
				continue
			}
			if !found {
				found, firstString = true, [2]int64{start, end}
			}
		case json.Number:
			// start is where the previous token ended: skip the separator.
			s := bytes.TrimLeft(body[start:end], " \t\r\n,:")
			from := end - int64(len(s))
			changed := changeLastDigit(string(s))
			return splice(body, from, end, changed), fmt.Sprintf("made from the request by changing %s from %s to %s; pass -d2 to choose", name(path), s, changed)
		}
	}
	if !found {
		return nil, "the JSON request has no number or string value to change; pass another request (-d2)"
	}
	// The string value ends with its closing quote.
	return splice(body, firstString[1]-1, firstString[1]-1, "2"), fmt.Sprintf("made from the request by appending 2 to the first string value (%s); pass -d2 to choose", name(path))
}

// isKeyPosition reports whether the string token that ends at end is an
// object key, which a colon follows.
func isKeyPosition(body []byte, end int64) bool {
	rest := bytes.TrimLeft(body[end:], " \t\r\n")
	return len(rest) > 0 && rest[0] == ':'
}

func name(path []string) string {
	if len(path) == 0 {
		return "the first value"
	}
	return fmt.Sprintf("%q", path[0])
}

// otherForm changes the first numeric form value, or else appends 2 to the
// first value.
func otherForm(body []byte) ([]byte, string) {
	pairs := strings.Split(string(body), "&")
	for _, numeric := range []bool{true, false} {
		for i, p := range pairs {
			k, v, ok := strings.Cut(p, "=")
			if !ok || (numeric && !isNumber(v)) {
				continue
			}
			nv := v + "2"
			if numeric {
				nv = changeLastDigit(v)
			}
			pairs[i] = k + "=" + nv
			return []byte(strings.Join(pairs, "&")), fmt.Sprintf("made from the request by changing %s from %q to %q; pass -d2 to choose", k, v, nv)
		}
	}
	return nil, "cannot make another request from this body; pass one (-d2)"
}

func isNumber(s string) bool {
	return s != "" && json.Valid([]byte(s)) && strings.IndexFunc(s, func(r rune) bool { return r == '"' || r == '[' || r == '{' || r == 't' || r == 'f' || r == 'n' }) < 0
}

// changeLastDigit changes the last digit of a number: up by one, or 9 to 8,
// so that the number keeps its magnitude and stays in any range it was in.
func changeLastDigit(s string) string {
	b := []byte(s)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] >= '0' && b[i] <= '9' {
			if b[i] == '9' {
				b[i] = '8'
			} else {
				b[i]++
			}
			break
		}
	}
	return string(b)
}

func splice(body []byte, from, to int64, with string) []byte {
	out := make([]byte, 0, len(body)+len(with))
	out = append(out, body[:from]...)
	out = append(out, with...)
	return append(out, body[to:]...)
}
