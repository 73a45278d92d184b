package phasetest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/atomicphase/atomicphase/keyrow"
)

// CompareFunc reports how a recovered response differs from the crash-free
// one, or returns nil when they are the same answer. The matrices print its
// error, so it should name what differs.
type CompareFunc func(crashFree, recovered *keyrow.Response) error

// maxDifferences caps the differences one comparison reports.
const maxDifferences = 10

// IgnoreFields returns a CompareFunc that requires the same status, the same
// headers and the same body, except for the values of the named JSON fields,
// which differ from key to key: generated ids, timestamps. An ignored field
// must still be present in both bodies, with a value of the same JSON type
// (an id that came back null is a difference).
//
// A path names an object member from the top of the body, with dots between
// levels: "order_id", "ride.id". Arrays are crossed without naming an index:
// "items.id" is the id of every element of items.
//
// Bodies that are both JSON are compared as JSON values, so key order and
// spacing do not matter, and each difference is reported with the field's
// path, such as `body field items[1].price: crash-free 20, recovered 25`.
// Other bodies must be byte-identical. IgnoreFields() with no paths is the
// matrices' default.
func IgnoreFields(paths ...string) CompareFunc {
	ignored := make(map[string]bool, len(paths))
	for _, p := range paths {
		ignored[p] = true
	}
	return func(crashFree, recovered *keyrow.Response) error {
		d := &differ{ignored: ignored}
		if crashFree.Status != recovered.Status {
			d.add("status: crash-free %d, recovered %d", crashFree.Status, recovered.Status)
		}
		names := slices.Sorted(maps.Keys(crashFree.Header))
		for _, name := range slices.Sorted(maps.Keys(recovered.Header)) {
			if _, ok := crashFree.Header[name]; !ok {
				names = append(names, name)
			}
		}
		for _, name := range names {
			if a, b := crashFree.Header[name], recovered.Header[name]; !slices.Equal(a, b) {
				d.add("header %s: crash-free %q, recovered %q", name, a, b)
			}
		}
		a, errA := decodeJSON(crashFree.Body)
		b, errB := decodeJSON(recovered.Body)
		switch {
		case errA == nil && errB == nil:
			d.value("", "", a, b)
		case !bytes.Equal(crashFree.Body, recovered.Body):
			d.add("body: crash-free %q, recovered %q", clip(crashFree.Body), clip(recovered.Body))
		}
		return d.err()
	}
}

// differ collects the differences between two responses.
type differ struct {
	ignored map[string]bool
	found   []string
	more    int
}

func (d *differ) add(format string, args ...any) {
	if len(d.found) == maxDifferences {
		d.more++
		return
	}
	d.found = append(d.found, fmt.Sprintf(format, args...))
}

func (d *differ) err() error {
	if len(d.found) == 0 {
		return nil
	}
	if d.more > 0 {
		d.found = append(d.found, fmt.Sprintf("and %d more differences", d.more))
	}
	return errors.New(strings.Join(d.found, "; "))
}

// value compares two decoded JSON values found at shown (a path with array
// indexes, for messages), whose path without indexes is path.
func (d *differ) value(shown, path string, a, b any) {
	if path != "" && d.ignored[path] {
		if kind(a) != kind(b) {
			d.add("%s (ignored): crash-free %s, recovered %s", where(shown), kind(a), kind(b))
		}
		return
	}
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok {
			break
		}
		names := slices.Sorted(maps.Keys(a))
		for _, name := range slices.Sorted(maps.Keys(b)) {
			if _, ok := a[name]; !ok {
				names = append(names, name)
			}
		}
		for _, name := range names {
			subShown, subPath := join(shown, name), join(path, name)
			av, inA := a[name]
			bv, inB := b[name]
			switch {
			case !inB:
				d.add("%s: missing from the recovered response", where(subShown))
			case !inA:
				d.add("%s: not in the crash-free response", where(subShown))
			default:
				d.value(subShown, subPath, av, bv)
			}
		}
		return
	case []any:
		b, ok := b.([]any)
		if !ok {
			break
		}
		if len(a) != len(b) {
			d.add("%s: crash-free has %d elements, recovered %d", where(shown), len(a), len(b))
		}
		for i := range min(len(a), len(b)) {
			d.value(fmt.Sprintf("%s[%d]", shown, i), path, a[i], b[i])
		}
		return
	}
	if !reflect.DeepEqual(a, b) {
		d.add("%s: crash-free %s, recovered %s", where(shown), encode(a), encode(b))
	}
}

func decodeJSON(body []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("more than one JSON value")
	}
	return v, nil
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func where(shown string) string {
	if shown == "" {
		return "body"
	}
	return "body field " + shown
}

func kind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	}
	return "an object"
}

func encode(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(clip(b))
}

// clip shortens a body for a message.
func clip(b []byte) []byte {
	const limit = 200
	if len(b) <= limit {
		return b
	}
	return append(b[:limit:limit], "..."...)
}
