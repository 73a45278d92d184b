package store

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"unicode/utf8"
)

// nulEscape is what a NUL character in text from outside the library (an
// error of a phase or a provider, an operator's name or resolution) is
// stored as: the two characters \0. Bytes that are not UTF-8 are stored as
// U+FFFD, the Unicode replacement character, one for each run of them.
const nulEscape = `\0`

// storableText returns s as a text column can hold it. Postgres refuses a
// NUL character and bytes that are not UTF-8 (SQLSTATE 22021) in text, and
// the statement with them fails; for a diagnostic such as a run's last
// error that would fail the statement that frees the lease. Every column
// written from text the library did not check itself goes through it, so
// such text is stored escaped and never refused.
func storableText(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", nulEscape)
}

// storableJSON returns the JSON document js as a jsonb column can hold it,
// each of its strings and object keys made storable as storableText makes
// text. jsonb refuses what text does, and also the escapes \u0000 and a
// lone surrogate (\ud800) that JSON itself allows (SQLSTATE 22P05, 22P02);
// encoding/json writes a NUL as \u0000, and passes a json.RawMessage
// through as it is. A document with none of these is returned as it is;
// the others are decoded and encoded again, which keeps their numbers as
// written.
func storableJSON(js []byte) ([]byte, error) {
	if utf8.Valid(js) && !refusedEscape.Match(js) {
		return js, nil
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	// Decoding already replaced what is not UTF-8, and each lone
	// surrogate, with U+FFFD; what remains is the NUL.
	return json.Marshal(storableValue(v))
}

// refusedEscape matches the \u escapes that jsonb may refuse: a NUL, and
// any UTF-16 surrogate (D800 to DFFF), refused unless half of a valid pair.
// It also matches a valid pair, and such text after an escaped backslash
// ("\\u0000"), which only costs the decoding that finds them harmless.
var refusedEscape = regexp.MustCompile(`\\u(0000|[dD][89a-fA-F])`)

// storableValue returns a decoded JSON value with storableText applied to
// each of its strings and object keys.
func storableValue(v any) any {
	switch v := v.(type) {
	case string:
		return storableText(v)
	case []any:
		for i := range v {
			v[i] = storableValue(v[i])
		}
		return v
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[storableText(k)] = storableValue(e)
		}
		return m
	}
	return v
}
