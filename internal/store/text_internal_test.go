package store

import (
	"context"
	"testing"

	"github.com/atomicphase/atomicphase/internal/pgtest"
)

// Postgres takes whatever storableText and storableJSON return, and what
// they change is only what it would refuse.
func TestStorableTextAndJSONAreAcceptedAsTheyRead(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	ctx := context.Background()
	for _, tc := range []struct{ in, want string }{
		{"plain", "plain"},
		{"a\x00b", `a\0b`},
		{"a\xff\xfeb\xc3", "a\uFFFDb\uFFFD"},
	} {
		var got string
		if err := db.QueryRow(ctx, `SELECT $1::text`, storableText(tc.in)).Scan(&got); err != nil || got != tc.want {
			t.Errorf("text %q: stored %q (%v), want %q", tc.in, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ name, in, want string }{
		{"unchanged", `{"a":[1,"x",null,true]}`, `{"a":[1,"x",null,true]}`},
		{"NUL in a value", `{"a":"x\u0000y"}`, `{"a":"x\\0y"}`},
		{"NUL in a key", `{"k\u0000":1}`, `{"k\\0":1}`},
		{"escaped backslash before u0000 is text", `{"a":"\\u0000","b":"\u0000"}`, `{"a":"\\u0000","b":"\\0"}`},
		{"not UTF-8", "[\"a\xffb\"]", "[\"a\uFFFDb\"]"},
		{"lone surrogate", `["\ud800x"]`, "[\"\uFFFDx\"]"},
		{"surrogate pair", `["\ud83d\ude00","\u0000"]`, "[\"\U0001F600\",\"\\\\0\"]"},
		{"numbers as written", `{"n":123456789012345678901234567890.5,"s":"\u0000"}`, `{"n":123456789012345678901234567890.5,"s":"\\0"}`},
	} {
		out, err := storableJSON([]byte(tc.in))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		var same bool
		if err := db.QueryRow(ctx, `SELECT $1::jsonb = $2::jsonb`, string(out), tc.want).Scan(&same); err != nil || !same {
			t.Errorf("%s: %s became %s (%v), want %s", tc.name, tc.in, out, err, tc.want)
		}
	}
}
