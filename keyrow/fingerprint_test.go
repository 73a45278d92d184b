package keyrow_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/big"
	"strings"
	"testing"

	"github.com/atomicphase/atomicphase/keyrow"
)

func TestCanonicalForm(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want string
	}{
		{"keys sorted", `{"b":1,"a":2,"c":3}`, `{"a":2,"b":1,"c":3}`},
		{"keys sorted by bytes of the unescaped key", `{"é":1,"z":2,"\u0041":3,"aa":4,"a":5}`, `{"A":3,"a":5,"aa":4,"z":2,"é":1}`},
		{"nested objects sorted, arrays kept in order", `{"z":[3,{"y":1,"x":2},1],"a":{"d":null,"c":true}}`, `{"a":{"c":true,"d":null},"z":[3,{"x":2,"y":1},1]}`},
		{"whitespace removed", " {\n\t\"a\" : [ 1 , 2 ] ,\r\n \"b\" : { } } \n", `{"a":[1,2],"b":{}}`},
		{"empty containers", `[{},[],""]`, `[{},[],""]`},
		{"literals", `[true,false,null]`, `[true,false,null]`},
		{"top-level scalar", `"x"`, `"x"`},
		{"unneeded escapes removed", `"\u0061\/\u00e9\u2028<>&"`, "\"a/é\u2028<>&\""},
		{"required escapes kept short", "\"\\\"\\\\\\b\\f\\n\\r\\t\"", `"\"\\\b\f\n\r\t"`},
		{"other control characters as \\u00xx", `"\u0000\u001F\u007f"`, "\"\\u0000\\u001f\x7f\""},
		{"surrogate pair decoded", `"\ud83d\ude00"`, `"😀"`},
		{"U+FFFD kept", `["\ufffd","` + "\ufffd" + `"]`, "[\"\ufffd\",\"\ufffd\"]"},
		{"integer", `2000`, `2000`},
		{"negative integer", `-42`, `-42`},
		{"one spelled many ways", `[1,1.0,1e0,1E0,10E-1,100e-2,0.1e1,1.000,1e+0,0.001e3]`, `[1,1,1,1,1,1,1,1,1,1]`},
		{"zero spelled many ways", `[0,-0,0.0,-0.0,0e10,-0E-5,0.000e+99]`, `[0,0,0,0,0,0,0]`},
		{"large integer not rounded", `12345678901234567890123`, `12345678901234567890123`},
		{"large integer with fraction zeros", `12345678901234567890123.000`, `12345678901234567890123`},
		{"float64 cannot tell these apart", `[9007199254740993,0.1000000000000000000001]`, `[9007199254740993,0.1000000000000000000001]`},
		{"fraction", `[12.50,-0.5,0.5e0,1.25E1]`, `[12.5,-0.5,0.5,12.5]`},
		{"small fractions plain", `[0.001,1e-6,0.0000015]`, `[0.001,0.000001,0.0000015]`},
		{"tiny fractions scientific", `[1e-7,0.00000015,-123e-20]`, `[1e-7,1.5e-7,-1.23e-18]`},
		{"up to 21 trailing zeros plain", `[1e21,25e20,1E2]`, `[1000000000000000000000,2500000000000000000000,100]`},
		{"more trailing zeros scientific", `[1e22,12.5e30,-1000000000000000000000000]`, `[1e22,1.25e31,-1e24]`},
		{"huge exponents exact", `[1e999999999999999999999,10e999999999999999999999,-0.5e-999999999999999999999]`, `[1e999999999999999999999,1e1000000000000000000000,-5e-1000000000000000000000]`},
		{"exponent with leading zeros", `[1e0000000000000000000000000005,1e-000000000000000000000000007]`, `[100000,1e-7]`},
		{"zero with huge exponent", `0e999999999999999999999`, `0`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := keyrow.Canonical([]byte(tt.in))
			if err != nil {
				t.Fatalf("Canonical(%s) error: %v", tt.in, err)
			}
			if string(got) != tt.want {
				t.Fatalf("Canonical(%s)\n got: %s\nwant: %s", tt.in, got, tt.want)
			}
			again, err := keyrow.Canonical(got)
			if err != nil || !bytes.Equal(again, got) {
				t.Fatalf("Canonical(%s) = %s, %v; want it unchanged", got, again, err)
			}
		})
	}
}

func TestCanonicalRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in string
		msg      string // checked when set
	}{
		{"empty", ``, "keyrow: params are empty; want a JSON value"},
		{"whitespace only", " \n", "keyrow: params are empty; want a JSON value"},
		{"duplicate key", `{"a":1,"a":1}`, `keyrow: params repeat the object key "a"; its meaning would depend on the JSON parser`},
		{"duplicate key after unescaping", `{"a":1,"b":2,"\u0061":3}`, `keyrow: params repeat the object key "a"; its meaning would depend on the JSON parser`},
		{"duplicate key nested", `[{"x":{"k":1,"k":2}}]`, `keyrow: params repeat the object key "k"; its meaning would depend on the JSON parser`},
		{"trailing value", `{} {}`, "keyrow: params are not valid JSON: unexpected data after the value at offset 3"},
		{"trailing number", `1 2`, "keyrow: params are not valid JSON: unexpected data after the value at offset 2"},
		{"trailing garbage", `{"a":1}x`, "keyrow: params are not valid JSON: unexpected data after the value at offset 7"},
		{"trailing bracket", `[1]]`, "keyrow: params are not valid JSON: unexpected data after the value at offset 3"},
		{"invalid UTF-8", "\"\xff\"", "keyrow: params are not valid UTF-8"},
		{"invalid UTF-8 outside strings", "[1]\xff", "keyrow: params are not valid UTF-8"},
		{"lone high surrogate", `"\ud800"`, `keyrow: params contain an unpaired UTF-16 surrogate \ud800`},
		{"lone low surrogate", `{"\uDC00":1}`, `keyrow: params contain an unpaired UTF-16 surrogate \udc00`},
		{"high surrogate before a non-surrogate", `["ok","\ud800\u0041"]`, `keyrow: params contain an unpaired UTF-16 surrogate \ud800`},
		{"two high surrogates", `"\ud800\ud800\udc00"`, `keyrow: params contain an unpaired UTF-16 surrogate \ud800`},
		{"surrogate after an escaped backslash", `"\\\ud800"`, `keyrow: params contain an unpaired UTF-16 surrogate \ud800`},
		{"too deep", strings.Repeat("[", 10001) + strings.Repeat("]", 10001), "keyrow: params nest deeper than 10000 levels"},
		{"unterminated object", `{"a":1`, "keyrow: params are not valid JSON: unexpected end of input; want a comma or a closing brace"},
		{"unterminated string", `"abc`, "keyrow: params are not valid JSON: unexpected end of input; want a closing quote"},
		{"trailing comma in array", `[1,]`, "keyrow: params are not valid JSON: unexpected ']' at offset 3; want a value"},
		{"trailing comma in object", `{"a":1,}`, "keyrow: params are not valid JSON: unexpected '}' at offset 7; want an object key"},
		{"missing comma", `[1 2]`, "keyrow: params are not valid JSON: unexpected '2' at offset 3; want a comma or a closing bracket"},
		{"missing colon", `{"a" 1}`, "keyrow: params are not valid JSON: unexpected '1' at offset 5; want a colon"},
		{"non-string key", `{1:2}`, ""},
		{"single quotes", `{'a':1}`, ""},
		{"bare word", `nul`, `keyrow: params are not valid JSON: unexpected end of input; want "null"`},
		{"leading plus", `+1`, ""},
		{"leading zero", `01`, ""},
		{"no fraction digits", `1.`, "keyrow: params are not valid JSON: unexpected end of input; want a digit"},
		{"NaN", `NaN`, ""},
		{"raw control character in string", "\"a\nb\"", `keyrow: params are not valid JSON: unexpected '\n' at offset 2; want a closing quote; control characters in strings must be escaped`},
		{"invalid escape", `"\x41"`, "keyrow: params are not valid JSON: unexpected 'x' at offset 2; want an escape"},
		{"closing bracket alone", `]`, ""},
		{"value after key without colon", `{"a"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := keyrow.Canonical([]byte(tt.in))
			if err == nil {
				t.Fatalf("Canonical(%.40q) = %s, want error", tt.in, got)
			}
			if tt.msg != "" && err.Error() != tt.msg {
				t.Fatalf("Canonical(%.40q) error\n got: %v\nwant: %s", tt.in, err, tt.msg)
			}
			if _, ferr := keyrow.Fingerprint("w", []byte(tt.in)); ferr == nil || ferr.Error() != err.Error() {
				t.Fatalf("Fingerprint error %v, want Canonical's %v", ferr, err)
			}
		})
	}
}

func TestCanonicalAcceptsMaximumNesting(t *testing.T) {
	t.Parallel()
	in := strings.Repeat("[", 10000) + strings.Repeat("]", 10000)
	got, err := keyrow.Canonical([]byte(in))
	if err != nil || string(got) != in {
		t.Fatalf("Canonical of 10000 nested arrays: %.20s..., %v", got, err)
	}
}

func TestFingerprintEqualForSameMeaning(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, a, b string
	}{
		{"key order", `{"amount":2000,"currency":"usd"}`, `{"currency":"usd","amount":2000}`},
		{"whitespace", `{"amount":2000,"currency":"usd"}`, "{ \"amount\" : 2000 ,\n\t\"currency\" : \"usd\" }\n"},
		{"number spelling", `{"amount":2000}`, `{"amount":2e3}`},
		{"decimal spelling", `{"lat":37.7700}`, `{"lat":3777e-2}`},
		{"negative zero", `{"x":-0}`, `{"x":0.0}`},
		{"string escaping", `{"name":"Zoë <z@x>"}`, `{"n\u0061me":"Zo\u00eb \u003cz@x\u003e"}`},
		{"nested objects in arrays", `{"rides":[{"b":1,"a":[1.0,{"y":2,"x":1}]}]}`, `{"rides":[{"a":[1,{"x":1,"y":2}],"b":10e-1}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fa := mustFingerprint(t, "create_ride", tt.a)
			fb := mustFingerprint(t, "create_ride", tt.b)
			if fa != fb {
				t.Fatalf("fingerprints differ for %s and %s", tt.a, tt.b)
			}
		})
	}
}

func TestFingerprintDiffersForDifferentMeaning(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name              string
		workflowA, paramA string
		workflowB, paramB string
	}{
		{"different value", "charge", `{"amount":2000}`, "charge", `{"amount":2001}`},
		{"nearby decimals", "charge", `{"amount":0.1}`, "charge", `{"amount":0.10000000000000001}`},
		{"large integers float64 would merge", "charge", `9007199254740992`, "charge", `9007199254740993`},
		{"different workflow", "charge", `{"amount":2000}`, "refund", `{"amount":2000}`},
		{"string and number", "charge", `{"amount":"1"}`, "charge", `{"amount":1}`},
		{"array order", "charge", `[1,2]`, "charge", `[2,1]`},
		{"missing key and null", "charge", `{}`, "charge", `{"a":null}`},
		{"false and null", "charge", `false`, "charge", `null`},
		{"empty array and empty object", "charge", `[]`, "charge", `{}`},
		{"key case", "charge", `{"a":1}`, "charge", `{"A":1}`},
		{"nested value", "charge", `{"a":{"b":[1,{"c":2}]}}`, "charge", `{"a":{"b":[1,{"c":3}]}}`},
		{"U+FFFD and a different character", "charge", `"\ufffd"`, "charge", `"\ufffe"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fa := mustFingerprint(t, tt.workflowA, tt.paramA)
			fb := mustFingerprint(t, tt.workflowB, tt.paramB)
			if fa == fb {
				t.Fatalf("fingerprints equal for %q %s and %q %s", tt.workflowA, tt.paramA, tt.workflowB, tt.paramB)
			}
		})
	}
}

// TestFingerprintIsStable pins the v1 hash input: stored fingerprints must
// keep matching retries across releases.
func TestFingerprintIsStable(t *testing.T) {
	t.Parallel()
	params := `{"origin_lon":-122.4194,"origin_lat":37.7749,"amount":2000}`
	canonical := `{"amount":2000,"origin_lat":37.7749,"origin_lon":-122.4194}`
	want := sha256.Sum256([]byte("atomicphase/fingerprint/v1\x00create_ride\x00" + canonical))

	got := mustFingerprint(t, "create_ride", params)
	if got != want {
		t.Fatalf("Fingerprint = %x, want %x", got, want)
	}
}

func mustFingerprint(t *testing.T, workflow, params string) [32]byte {
	t.Helper()
	fp, err := keyrow.Fingerprint(workflow, []byte(params))
	if err != nil {
		t.Fatalf("Fingerprint(%q, %s) error: %v", workflow, params, err)
	}
	return fp
}

func FuzzCanonical(f *testing.F) {
	for _, seed := range []string{
		`{"amount":2000,"currency":"usd","metadata":{"order":"42"}}`,
		`{"b":[1,2,{"d":1.50,"c":-0}],"a":"\u00e9\n"}`,
		`[1,1.0,1e0,10E-1,100e-2,0,-0,0.0,12345678901234567890123]`,
		`[1e21,1e22,1e-6,1e-7,0.000001,-1.5e-300]`,
		`1e999999999999999999999`,
		`"\ud83d\ude00\ud800"`,
		`"\\\ud800"`,
		`{"a":1,"\u0061":2}`,
		`{"a":1}x`,
		" [ true , false , null ] ",
		`[[[[[]]]]]`,
		"\"\xff\"",
		`{"a":`,
		``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := keyrow.Canonical(in)
		if err != nil {
			if json.Valid(in) && strings.HasPrefix(err.Error(), "keyrow: params are not valid JSON") {
				t.Fatalf("Canonical(%q) reports a syntax error %v for valid JSON", in, err)
			}
			return
		}
		if !json.Valid(in) {
			t.Fatalf("Canonical(%q) = %s, but the input is not valid JSON", in, out)
		}
		if !json.Valid(out) {
			t.Fatalf("Canonical(%q) = %q, not valid JSON", in, out)
		}
		again, err := keyrow.Canonical(out)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("Canonical(%s) = %s, %v; want it unchanged", out, again, err)
		}
		if !sameJSON(t, decodeJSON(t, in), decodeJSON(t, out)) {
			t.Fatalf("Canonical(%q) = %s changes the meaning", in, out)
		}

		var indented bytes.Buffer
		if err := json.Indent(&indented, in, "\n", "\t "); err != nil {
			t.Fatal(err)
		}
		if got, err := keyrow.Canonical(indented.Bytes()); err != nil || !bytes.Equal(got, out) {
			t.Fatalf("Canonical of the indented input = %s, %v; want %s", got, err, out)
		}

		// encoding/json re-encodes with its own key order and escaping.
		reencoded, err := json.Marshal(decodeJSON(t, in))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := keyrow.Canonical(reencoded); err != nil || !bytes.Equal(got, out) {
			t.Fatalf("Canonical of %s = %s, %v; want %s", reencoded, got, err, out)
		}
	})
}

func decodeJSON(t *testing.T, b []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decoding %q: %v", b, err)
	}
	return v
}

// sameJSON reports whether a and b, decoded with UseNumber, hold the same
// values, comparing numbers exactly. Numbers with exponents beyond ±9999,
// too large to expand cheaply, are taken as equal.
func sameJSON(t *testing.T, a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, v := range a {
			w, ok := b[k]
			if !ok || !sameJSON(t, v, w) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !sameJSON(t, a[i], b[i]) {
				return false
			}
		}
		return true
	case json.Number:
		b, ok := b.(json.Number)
		if !ok {
			return false
		}
		if hugeExponent(a) || hugeExponent(b) {
			return true
		}
		x, okx := new(big.Rat).SetString(string(a))
		y, oky := new(big.Rat).SetString(string(b))
		if !okx || !oky {
			t.Fatalf("big.Rat cannot parse %s or %s", a, b)
		}
		return x.Cmp(y) == 0
	default:
		return a == b
	}
}

func hugeExponent(n json.Number) bool {
	i := strings.IndexAny(string(n), "eE")
	return i >= 0 && len(strings.TrimLeft(string(n[i+1:]), "+-0")) > 4
}

func ExampleFingerprint() {
	first, _ := keyrow.Fingerprint("create_ride", []byte(`{"origin_lat": 37.7749, "amount": 2000}`))
	retry, _ := keyrow.Fingerprint("create_ride", []byte(`{"amount":2e3,"origin_lat":37.77490}`))
	changed, _ := keyrow.Fingerprint("create_ride", []byte(`{"amount":2500,"origin_lat":37.7749}`))
	fmt.Println("retry matches:", first == retry)
	fmt.Println("changed params match:", first == changed)

	canonical, _ := keyrow.Canonical([]byte(`{"origin_lat": 37.7749, "amount": 2e3}`))
	fmt.Println(string(canonical))
	// Output:
	// retry matches: true
	// changed params match: false
	// {"amount":2000,"origin_lat":37.7749}
}

// BenchmarkFingerprint measures the fingerprint of a small request, which
// every run computes before its acquire.
func BenchmarkFingerprint(b *testing.B) {
	params := []byte(`{"item":"rocket ride","amount":1200,"metadata":{"rider":"r_42","note":"caf\u00e9"}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := keyrow.Fingerprint("orders", params); err != nil {
			b.Fatal(err)
		}
	}
}
