package phasetest_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase/phasetest"
)

func TestIgnoreFieldsNamesEveryDifferenceByItsPath(t *testing.T) {
	t.Parallel()
	json := http.Header{"Content-Type": {"application/json"}}
	resp := func(status int, body string) *keyrow.Response {
		return &keyrow.Response{Status: status, Header: json, Body: []byte(body)}
	}
	crashFree := resp(201, `{"order_id":7,"amount":2000,"items":[{"id":"a","price":20},{"id":"b","price":5}],"note":null}`)
	for _, tc := range []struct {
		name      string
		ignore    []string
		recovered *keyrow.Response
		want      []string // each must appear in the error; none means no error
	}{
		{"same answer, other key order and spacing", []string{"order_id", "items.id"},
			resp(201, `{ "amount": 2000, "order_id": 7, "note": null, "items": [{"price":20,"id":"a"},{"price":5,"id":"b"}] }`), nil},
		{"ids made per key", []string{"order_id", "items.id"},
			resp(201, `{"order_id":8,"amount":2000,"items":[{"id":"x","price":20},{"id":"y","price":5}],"note":null}`), nil},
		{"id not ignored", nil,
			resp(201, `{"order_id":8,"amount":2000,"items":[{"id":"a","price":20},{"id":"b","price":5}],"note":null}`),
			[]string{"body field order_id: crash-free 7, recovered 8"}},
		{"a value inside an array", []string{"order_id", "items.id"},
			resp(201, `{"order_id":8,"amount":2000,"items":[{"id":"x","price":20},{"id":"y","price":6}],"note":null}`),
			[]string{"body field items[1].price: crash-free 5, recovered 6"}},
		{"an ignored id that came back null", []string{"order_id"},
			resp(201, `{"order_id":null,"amount":2000,"items":[{"id":"a","price":20},{"id":"b","price":5}],"note":null}`),
			[]string{"body field order_id (ignored): crash-free a number, recovered null"}},
		{"fields missing and added", []string{"order_id"},
			resp(201, `{"order_id":7,"items":[{"id":"a","price":20},{"id":"b","price":5}],"note":null,"resumed":true}`),
			[]string{"body field amount: missing from the recovered response", "body field resumed: not in the crash-free response"}},
		{"an element more", []string{"order_id"},
			resp(201, `{"order_id":7,"amount":2000,"items":[{"id":"a","price":20},{"id":"b","price":5},{"id":"c","price":1}],"note":null}`),
			[]string{"body field items: crash-free has 2 elements, recovered 3"}},
		{"status and header", []string{"order_id"},
			&keyrow.Response{Status: 500, Header: http.Header{"Content-Type": {"text/plain"}}, Body: crashFree.Body},
			[]string{"status: crash-free 201, recovered 500", `header Content-Type: crash-free ["application/json"], recovered ["text/plain"]`}},
		{"a body that is not JSON", nil, resp(201, `order placed`), []string{"body: crash-free"}},
	} {
		err := phasetest.IgnoreFields(tc.ignore...)(crashFree, tc.recovered)
		switch {
		case len(tc.want) == 0 && err != nil:
			t.Errorf("%s: %v, want no difference", tc.name, err)
		case len(tc.want) > 0 && err == nil:
			t.Errorf("%s: no difference found, want %q", tc.name, tc.want)
		}
		for _, w := range tc.want {
			if err != nil && !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want it to say %q", tc.name, err, w)
			}
		}
	}
}
