package keyrow_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/atomicphase/atomicphase/internal/keytable"
	"github.com/atomicphase/atomicphase/keyrow"
)

func TestParseKeyAcceptsBareAndQuotedForms(t *testing.T) {
	t.Parallel()
	const uuid = "8e03978e-40d5-43e8-bc93-6894a57f9324"
	long := strings.Repeat("k", keyrow.MaxKeyLength)
	tests := []struct {
		name, header, want string
	}{
		{"bare uuid as Stripe clients send it", uuid, uuid},
		{"quoted uuid as the IETF draft specifies", `"` + uuid + `"`, uuid},
		{"surrounding spaces and tabs ignored", " \t" + uuid + "\t ", uuid},
		{"spaces around a quoted key ignored", `  "` + uuid + `"  `, uuid},
		{"single character", "a", "a"},
		{"bare key of maximum length", long, long},
		{"quoted key of maximum length", `"` + long + `"`, long},
		{"bare key with every visible ASCII punctuation but the comma", `!#$%&'()*+-./:;<=>?@[\]^_{|}~` + "`", `!#$%&'()*+-./:;<=>?@[\]^_{|}~` + "`"},
		{"quoted key with a comma", `"a,b"`, "a,b"},
		{"bare key containing a quote after the first character", `ab"c`, `ab"c`},
		{"quoted key keeps inner spaces", `" a b "`, " a b "},
		{"quoted single space", `" "`, " "},
		{"escaped quote", `"a\"b"`, `a"b`},
		{"escaped backslash", `"a\\b"`, `a\b`},
		{"only escapes", `"\\\""`, `\"`},
		{"escapes do not count toward the length", `"` + strings.Repeat(`\\`, keyrow.MaxKeyLength) + `"`, strings.Repeat(`\`, keyrow.MaxKeyLength)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := keyrow.ParseKey(tt.header)
			if err != nil {
				t.Fatalf("ParseKey(%q) error: %v", tt.header, err)
			}
			if got != tt.want {
				t.Fatalf("ParseKey(%q) = %q, want %q", tt.header, got, tt.want)
			}
		})
	}
}

func TestParseKeyRejectsInvalidValues(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, header string
		want         error
		msg          string
	}{
		{"absent header", "", keyrow.ErrKeyMissing,
			"Idempotency-Key header is missing"},
		{"whitespace only", " \t ", keyrow.ErrKeyMissing,
			"Idempotency-Key header is missing"},
		{"bare key too long", strings.Repeat("k", 256), keyrow.ErrKeyInvalid,
			"Idempotency-Key header is invalid: key is 256 characters long; the maximum is 255"},
		{"quoted key too long after unescaping", `"` + strings.Repeat(`\"`, 300) + `"`, keyrow.ErrKeyInvalid,
			"Idempotency-Key header is invalid: key is 300 characters long; the maximum is 255"},
		{"empty quoted string", `""`, keyrow.ErrKeyInvalid,
			"Idempotency-Key header is invalid: quoted key is empty; keys are 1-255 characters"},
		{"non-ASCII character in bare key", "café", keyrow.ErrKeyInvalid,
			"Idempotency-Key header is invalid: invalid character U+00E9 'é' at position 4; keys are 1-255 visible ASCII characters"},
		{"non-ASCII character in quoted key", `"café"`, keyrow.ErrKeyInvalid,
			"Idempotency-Key header is invalid: invalid character U+00E9 'é' at position 5; keys are 1-255 visible ASCII characters"},
		{"byte that is not UTF-8", "ab\xffc", keyrow.ErrKeyInvalid,
			"Idempotency-Key header is invalid: invalid byte 0xFF at position 3; keys are 1-255 visible ASCII characters"},
		{"space inside bare key", "ab cd", keyrow.ErrKeyInvalid,
			"Idempotency-Key header is invalid: invalid character U+0020 ' ' at position 3; keys are 1-255 visible ASCII characters"},
		{"two keys joined with a comma", "abc, def", keyrow.ErrKeyInvalid,
			`Idempotency-Key header is invalid: it holds more than one key (a comma separates values); send exactly one key, and quote a key that contains a comma`},
		{"two keys joined with a bare comma", "abc,def", keyrow.ErrKeyInvalid,
			`Idempotency-Key header is invalid: it holds more than one key (a comma separates values); send exactly one key, and quote a key that contains a comma`},
		{"tab inside quoted key", "\"a\tb\"", keyrow.ErrKeyInvalid,
			"Idempotency-Key header is invalid: invalid character U+0009 at position 3; keys are 1-255 visible ASCII characters"},
		{"DEL in bare key", "a\x7f", keyrow.ErrKeyInvalid,
			"Idempotency-Key header is invalid: invalid character U+007F at position 2; keys are 1-255 visible ASCII characters"},
		{"NUL in bare key", "a\x00b", keyrow.ErrKeyInvalid,
			"Idempotency-Key header is invalid: invalid character U+0000 at position 2; keys are 1-255 visible ASCII characters"},
		{"lone opening quote", `"`, keyrow.ErrKeyInvalid,
			`Idempotency-Key header is invalid: quoted key has no closing quote; a key that starts with " must end with "`},
		{"unterminated quoted string", `"abc`, keyrow.ErrKeyInvalid,
			`Idempotency-Key header is invalid: quoted key has no closing quote; a key that starts with " must end with "`},
		{"closing quote escaped", `"abc\"`, keyrow.ErrKeyInvalid,
			`Idempotency-Key header is invalid: quoted key has no closing quote; a key that starts with " must end with "`},
		{"backslash at the end", `"abc\`, keyrow.ErrKeyInvalid,
			`Idempotency-Key header is invalid: quoted key has no closing quote; a key that starts with " must end with "`},
		{"escape other than quote or backslash", `"a\nb"`, keyrow.ErrKeyInvalid,
			`Idempotency-Key header is invalid: invalid escape at position 3: a backslash may only be followed by " or \, not character 'n'`},
		{"escaped non-ASCII character", `"a\é"`, keyrow.ErrKeyInvalid,
			`Idempotency-Key header is invalid: invalid escape at position 3: a backslash may only be followed by " or \, not character U+00E9 'é'`},
		{"structured-field parameters", `"abc";foo=1`, keyrow.ErrKeyInvalid,
			`Idempotency-Key header is invalid: unexpected character ';' at position 6: parameters after the quoted key are not supported`},
		{"second quoted key", `"abc", "def"`, keyrow.ErrKeyInvalid,
			`Idempotency-Key header is invalid: it holds more than one key (a comma separates values); send exactly one key, and quote a key that contains a comma`},
		{"text after whitespace after the closing quote", `"abc" x`, keyrow.ErrKeyInvalid,
			`Idempotency-Key header is invalid: unexpected character 'x' at position 7 after the closing quote`},
		{"quote in the middle of a quoted key", `"ab"cd"`, keyrow.ErrKeyInvalid,
			`Idempotency-Key header is invalid: unexpected character 'c' at position 5 after the closing quote`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := keyrow.ParseKey(tt.header)
			if err == nil {
				t.Fatalf("ParseKey(%q) = %q, want error", tt.header, got)
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("ParseKey(%q) error %v, want errors.Is %v", tt.header, err, tt.want)
			}
			other := keyrow.ErrKeyInvalid
			if tt.want == keyrow.ErrKeyInvalid {
				other = keyrow.ErrKeyMissing
			}
			if errors.Is(err, other) {
				t.Fatalf("ParseKey(%q) error %v also matches %v", tt.header, err, other)
			}
			if err.Error() != tt.msg {
				t.Fatalf("ParseKey(%q) error message\n got: %s\nwant: %s", tt.header, err, tt.msg)
			}
		})
	}
}

// quoteKey writes key as an RFC 8941 sf-string, the way a conforming client
// serializes it.
func quoteKey(key string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(key) + `"`
}

func FuzzParseKey(f *testing.F) {
	for _, seed := range []string{
		"8e03978e-40d5-43e8-bc93-6894a57f9324",
		`"8e03978e-40d5-43e8-bc93-6894a57f9324"`,
		" \tabc\t ",
		`" a b "`,
		`"a\"b\\c"`,
		`""`,
		`"`,
		`"abc\`,
		`"abc";foo=1`,
		`"a", "b"`,
		`ab"c`,
		"café",
		"a\xff",
		"\"a\x00\"",
		strings.Repeat("k", 255),
		strings.Repeat("k", 256),
		`"` + strings.Repeat(`\\`, 256) + `"`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, header string) {
		key, err := keyrow.ParseKey(header)
		trimmed := strings.Trim(header, " \t")
		if err != nil {
			missing, invalid := errors.Is(err, keyrow.ErrKeyMissing), errors.Is(err, keyrow.ErrKeyInvalid)
			if missing == invalid {
				t.Fatalf("ParseKey(%q) error %v: want exactly one of ErrKeyMissing and ErrKeyInvalid", header, err)
			}
			if missing != (trimmed == "") {
				t.Fatalf("ParseKey(%q) error %v, but the trimmed value is %q", header, err, trimmed)
			}
		} else {
			if len(key) < 1 || len(key) > keyrow.MaxKeyLength {
				t.Fatalf("ParseKey(%q) = %q: length %d outside 1-%d", header, key, len(key), keyrow.MaxKeyLength)
			}
			for i := 0; i < len(key); i++ {
				if key[i] < 0x20 || key[i] > 0x7e {
					t.Fatalf("ParseKey(%q) = %q: byte 0x%02X at %d is not printable ASCII", header, key, key[i], i)
				}
			}
			if !strings.HasPrefix(trimmed, `"`) && (key != trimmed || strings.Contains(key, ",")) {
				t.Fatalf("ParseKey(%q) = %q: a bare key must come back unchanged", header, key)
			}
			if again, err := keyrow.ParseKey(quoteKey(key)); err != nil || again != key {
				t.Fatalf("ParseKey(%q) = %q, %v after quoting the key %q", quoteKey(key), again, err, key)
			}
			if again, err := keyrow.ParseKey("\t " + header + " \t"); err != nil || again != key {
				t.Fatalf("ParseKey with extra whitespace = %q, %v; want %q", again, err, key)
			}
		}

		// Any key a conforming client can send quoted must round-trip.
		printable := len(header) >= 1 && len(header) <= keyrow.MaxKeyLength
		for i := 0; printable && i < len(header); i++ {
			printable = header[i] >= 0x20 && header[i] <= 0x7e
		}
		if printable {
			if got, err := keyrow.ParseKey(quoteKey(header)); err != nil || got != header {
				t.Fatalf("ParseKey(%q) = %q, %v; want %q", quoteKey(header), got, err, header)
			}
		}
	})
}

func ExampleParseKey() {
	for _, header := range []string{
		"8e03978e-40d5-43e8-bc93-6894a57f9324",
		`"8e03978e-40d5-43e8-bc93-6894a57f9324"`,
		"",
		`"abc";foo=1`,
	} {
		key, err := keyrow.ParseKey(header)
		if err != nil {
			// The message is written for the client's developer.
			fmt.Println("400:", err)
			continue
		}
		fmt.Println("key:", key)
	}
	// Output:
	// key: 8e03978e-40d5-43e8-bc93-6894a57f9324
	// key: 8e03978e-40d5-43e8-bc93-6894a57f9324
	// 400: Idempotency-Key header is missing
	// 400: Idempotency-Key header is invalid: unexpected character ';' at position 6: parameters after the quoted key are not supported
}

func TestKeyFromReadsTheSharedTableOfKeys(t *testing.T) {
	t.Parallel()
	for _, c := range keytable.Cases() {
		t.Run(c.Name, func(t *testing.T) {
			key, err := keyrow.KeyFrom("idempotency-key metadata", c.Values...)
			switch c.Verdict {
			case "":
				if err != nil || key != c.Key {
					t.Fatalf("KeyFrom(%q) = %q, %v; want %q", c.Values, key, err, c.Key)
				}
			case keytable.Missing:
				if !errors.Is(err, keyrow.ErrKeyMissing) {
					t.Fatalf("KeyFrom(%q) = %q, %v; want ErrKeyMissing", c.Values, key, err)
				}
			case keytable.Invalid:
				if !errors.Is(err, keyrow.ErrKeyInvalid) || errors.Is(err, keyrow.ErrKeyMissing) {
					t.Fatalf("KeyFrom(%q) = %q, %v; want ErrKeyInvalid", c.Values, key, err)
				}
			}
			if err != nil && !strings.HasPrefix(err.Error(), "idempotency-key metadata is ") {
				t.Fatalf("KeyFrom(%q)'s error %q does not name the carrier", c.Values, err)
			}
		})
	}
}

func TestParseKeyKeepsItsSentinelsForTheHeader(t *testing.T) {
	t.Parallel()
	if _, err := keyrow.ParseKey("  "); err != keyrow.ErrKeyMissing {
		t.Fatalf("ParseKey of spaces = %v; want ErrKeyMissing itself", err)
	}
	_, err := keyrow.KeyFrom(keyrow.HeaderName+" header", "a", "b")
	if want := "Idempotency-Key header is invalid: the request carries 2 values; send exactly one key"; err == nil || err.Error() != want {
		t.Fatalf("two header lines: %v; want %q", err, want)
	}
}
