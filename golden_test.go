package atomicphase_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// The golden files pin the derivations that keys in flight depend on. They
// have no update switch on purpose: see derivationChanged.
const (
	goldenFingerprints   = "testdata/golden-fingerprints.json"
	goldenDownstreamKeys = "testdata/golden-downstream-keys.json"
	goldenDefinitions    = "testdata/golden-definitions.json"
)

// derivationChanged is the failure of a vector whose recomputed value is no
// longer the pinned one.
const derivationChanged = `%s: vector %q: got %s, the file pins %s.
%s
Do not edit the file to match: what it pins may change only by adding a new
generation beside the old one, whose vectors stay. See "Derivations" in
docs/compatibility.md.`

// Why each derivation must not change under keys in flight.
const (
	whyFingerprint = `Keys in flight store this fingerprint. Changed, a retry of such a key no longer
matches it and is refused as a reused key: a client that then retries under a new
key is charged again. And a retry whose key row was lost in a failover derives its
downstream keys from the new fingerprint, so the provider sees a new key and
charges a second time. A new generation gets its own domain string
(atomicphase/fingerprint/v3), and the runner keeps trying the older ones for keys
stored with them, as it tries keyrow.Fingerprint today.`
	whyDownstreamKey = `A phase sends this key with its foreign call; a run that resumes a key after a
deploy sends it again. Changed while keys are in flight, the provider sees a new
key and makes a second charge. The derivation has one generation; a second
would have to be recorded on each key and chosen by it.`
	whyDefinition = `Keys in flight record the definition they started under, and only a process
that runs that definition resumes them. Changed, every unfinished key is left to
a definition no process runs: clients get 503 and the completer skips them until
each is adopted by hand. A new generation gets its own domain string
(atomicphase/definition/v2) and must also be adopted from the old one.`
)

// bytesVector is bytes written in a golden file, as text or, when not
// valid UTF-8, in hex.
type bytesVector struct {
	Text string `json:"text,omitempty"`
	Hex  string `json:"hex,omitempty"`
}

func (b bytesVector) bytes(t *testing.T) []byte {
	t.Helper()
	if b.Hex == "" {
		return []byte(b.Text)
	}
	raw, err := hex.DecodeString(b.Hex)
	if err != nil {
		t.Fatalf("hex %q: %v", b.Hex, err)
	}
	return raw
}

// goldenVector is what every vector has besides its inputs: its name, the
// value it derives (empty for an input the derivation must reject), and
// the name of an earlier vector that must derive the same value, to show
// which spellings of a request are one request.
type goldenVector struct {
	Name   string `json:"name"`
	Want   string `json:"want"`
	SameAs string `json:"same_as,omitempty"`
	Reject bool   `json:"reject,omitempty"`
}

type fingerprintFile struct {
	About string `json:"about"`
	// V1 is the first generation, keyrow.Fingerprint: the workflow name
	// and the canonical JSON of the server's encoding of the request.
	V1 []v1Vector `json:"v1"`
	// V2 is the second, keyrow.RequestFingerprint: the request as its
	// client sent it.
	V2 []v2Vector `json:"v2"`
	// HTTP is the second generation as phase.Handler takes it from an HTTP
	// request: which parts of the request it covers, headers included.
	HTTP []httpVector `json:"http"`
}

type v1Vector struct {
	goldenVector
	Workflow  string      `json:"workflow"`
	Params    bytesVector `json:"params"`
	Canonical string      `json:"canonical,omitempty"`
}

type v2Vector struct {
	goldenVector
	Target    string      `json:"target"`
	MediaType string      `json:"media_type"`
	Body      bytesVector `json:"body"`
}

type httpVector struct {
	goldenVector
	Target string            `json:"target"`
	Header map[string]string `json:"header"`
	Body   bytesVector       `json:"body"`
}

type downstreamKeyFile struct {
	About         string             `json:"about"`
	DefaultPrefix string             `json:"default_prefix"`
	Vectors       []downstreamVector `json:"vectors"`
}

type downstreamVector struct {
	goldenVector
	Prefix      string `json:"prefix"`
	Tenant      string `json:"tenant"`
	Key         string `json:"key"`
	Fingerprint string `json:"fingerprint"`
	Phase       string `json:"phase"`
}

type definitionFile struct {
	About   string             `json:"about"`
	Vectors []definitionVector `json:"vectors"`
}

type definitionVector struct {
	goldenVector
	Workflow string        `json:"workflow"`
	Phases   []goldenPhase `json:"phases"`
}

// goldenPhase declares a phase of a definition vector.
type goldenPhase struct {
	Name       string `json:"name"`
	Foreign    bool   `json:"foreign,omitempty"`
	Repeatable bool   `json:"repeatable,omitempty"`
	Reconciled bool   `json:"reconciled,omitempty"`
	When       bool   `json:"when,omitempty"`
	Formerly   string `json:"formerly,omitempty"`
	Isolation  string `json:"isolation,omitempty"`
}

// readGolden decodes file, which may hold no field F does not.
func readGolden[F any](t *testing.T, file string) F {
	t.Helper()
	var f F
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return f
}

// vectorOf is a golden vector of any derivation.
type vectorOf interface{ vector() goldenVector }

func (v goldenVector) vector() goldenVector { return v }

// checkGolden derives each of vectors, at least min of them, and compares
// what they derive with what file pins.
func checkGolden[V vectorOf](t *testing.T, file, why string, min int, vectors []V, derive func(V) (string, error)) {
	t.Helper()
	if len(vectors) < min {
		t.Fatalf("%s: a list has %d vectors, fewer than %d: the file lost some", file, len(vectors), min)
	}
	c := &goldenCheck{t: t, file: file, why: why, got: map[string]string{}, vector: map[string]goldenVector{}}
	for _, v := range vectors {
		got, err := derive(v)
		c.check(v.vector(), got, err)
	}
	c.distinct()
}

// goldenCheck compares what each vector derived with what its file pins.
type goldenCheck struct {
	t      *testing.T
	file   string
	why    string
	got    map[string]string
	vector map[string]goldenVector
	order  []string
}

// check records that vector v derived got, or failed with err.
func (c *goldenCheck) check(v goldenVector, got string, err error) {
	t := c.t
	t.Helper()
	if _, dup := c.vector[v.Name]; dup || v.Name == "" {
		t.Errorf("%s: vector name %q is empty or used twice", c.file, v.Name)
	}
	c.vector[v.Name] = v
	c.order = append(c.order, v.Name)
	switch {
	case v.Reject && err == nil:
		t.Errorf(derivationChanged, c.file, v.Name, got, "that the input is rejected", c.why)
	case v.Reject:
		return
	case err != nil:
		t.Errorf(derivationChanged, c.file, v.Name, "the error "+err.Error(), v.Want, c.why)
	case v.Want == "":
		t.Errorf("%s: vector %q pins no value; it derives %s: check it, then write it in", c.file, v.Name, got)
	case got != v.Want:
		t.Errorf(derivationChanged, c.file, v.Name, got, v.Want, c.why)
	}
	c.got[v.Name] = got
}

// distinct fails unless two vectors derive the same value exactly when
// one names the other in same_as: spellings meant as one request are one,
// and every other pair stays apart.
func (c *goldenCheck) distinct() {
	t := c.t
	t.Helper()
	first := map[string]string{}
	for _, name := range c.order {
		v, got := c.vector[name], c.got[name]
		if got == "" {
			continue
		}
		if v.SameAs != "" {
			if want, ok := c.got[v.SameAs]; !ok || want != got {
				t.Errorf("%s: vector %q derives %s, and must derive what %q does (%s)", c.file, name, got, v.SameAs, want)
			}
			continue
		}
		if other, dup := first[got]; dup {
			t.Errorf("%s: vectors %q and %q derive the same %s without same_as: two requests would be taken for one", c.file, other, name, got)
		}
		first[got] = name
	}
}

func TestFingerprintsOfBothGenerationsMatchTheGoldenFile(t *testing.T) {
	t.Parallel()
	f := readGolden[fingerprintFile](t, goldenFingerprints)
	t.Run("v1", func(t *testing.T) {
		checkGolden(t, goldenFingerprints, whyFingerprint, 10, f.V1, func(v v1Vector) (string, error) {
			params := v.Params.bytes(t)
			if canonical, err := keyrow.Canonical(params); err == nil && v.Canonical != "" && string(canonical) != v.Canonical {
				t.Errorf("%s: v1 vector %q: canonical form %s, the file pins %s", goldenFingerprints, v.Name, canonical, v.Canonical)
			}
			fp, err := keyrow.Fingerprint(v.Workflow, params)
			return hex.EncodeToString(fp[:]), err
		})
	})
	t.Run("v2", func(t *testing.T) {
		checkGolden(t, goldenFingerprints, whyFingerprint, 10, f.V2, func(v v2Vector) (string, error) {
			fp, err := keyrow.RequestFingerprint(v.Target, v.MediaType, v.Body.bytes(t))
			return hex.EncodeToString(fp[:]), err
		})
	})
}

func TestFingerprintsOfHTTPRequestsMatchTheGoldenFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	w, err := phase.NewWorkflow("golden", phase.Local("answer",
		func(context.Context, pgx.Tx, *phase.Input[struct{}, struct{}]) (phase.Result, error) {
			return phase.Respond(http.StatusCreated, nil, nil), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(db, &phase.Config{Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}, w)
	if err != nil {
		t.Fatal(err)
	}
	h, err := phase.Handler(c, w, phase.HTTPConfig[struct{}]{
		Tenant: func(*http.Request) (string, error) { return "acme", nil },
		// The fingerprint covers the body as sent, whatever Decode makes of it.
		Decode: func(*http.Request) (struct{}, error) { return struct{}{}, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	f := readGolden[fingerprintFile](t, goldenFingerprints)
	keys := 0
	checkGolden(t, goldenFingerprints, whyFingerprint, 5, f.HTTP, func(v httpVector) (string, error) {
		keys++
		key := fmt.Sprintf("golden-%d", keys)
		r := httptest.NewRequest(http.MethodPost, v.Target, strings.NewReader(string(v.Body.bytes(t))))
		for name, value := range v.Header {
			r.Header.Set(name, value)
		}
		r.Header.Set(keyrow.HeaderName, key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		var fp []byte
		err := db.QueryRow(ctx, "SELECT request_fingerprint FROM idempotency_keys WHERE tenant = 'acme' AND idempotency_key = $1", key).Scan(&fp)
		if err != nil {
			return "", fmt.Errorf("answered %d %s, and stored no key (%w)", rec.Code, strings.TrimSpace(rec.Body.String()), err)
		}
		return hex.EncodeToString(fp), nil
	})
}

func TestDownstreamKeysMatchTheGoldenFile(t *testing.T) {
	t.Parallel()
	f := readGolden[downstreamKeyFile](t, goldenDownstreamKeys)
	if f.DefaultPrefix != phase.DefaultDownstreamKeyPrefix {
		t.Errorf(derivationChanged, goldenDownstreamKeys, "default_prefix", phase.DefaultDownstreamKeyPrefix, f.DefaultPrefix, whyDownstreamKey)
	}
	checkGolden(t, goldenDownstreamKeys, whyDownstreamKey, 8, f.Vectors, func(v downstreamVector) (string, error) {
		fp, err := hex.DecodeString(v.Fingerprint)
		if err != nil {
			t.Fatalf("vector %q: fingerprint: %v", v.Name, err)
		}
		return keyrow.DownstreamKey(v.Prefix, v.Tenant, v.Key, fp, v.Phase), nil
	})
}

func TestWorkflowDefinitionsMatchTheGoldenFile(t *testing.T) {
	t.Parallel()
	f := readGolden[definitionFile](t, goldenDefinitions)
	checkGolden(t, goldenDefinitions, whyDefinition, 8, f.Vectors, func(v definitionVector) (string, error) {
		phases := make([]phase.Phase[struct{}, struct{}], len(v.Phases))
		for i, p := range v.Phases {
			phases[i] = goldenPhaseOf(t, p)
		}
		w, err := phase.NewWorkflow(v.Workflow, phases...)
		if err != nil {
			return "", err
		}
		return w.Definition(), nil
	})
}

// goldenPhaseOf declares the phase p describes; the definition depends on
// none of its functions' code.
func goldenPhaseOf(t *testing.T, p goldenPhase) phase.Phase[struct{}, struct{}] {
	t.Helper()
	type in = phase.Input[struct{}, struct{}]
	var ph phase.Phase[struct{}, struct{}]
	record := func(context.Context, pgx.Tx, *in, string) (phase.Result, error) { return phase.Next(), nil }
	if p.Foreign {
		ph = phase.Foreign(p.Name, func(context.Context, *in) (string, error) { return "", nil }, record)
		if p.Reconciled {
			ph = phase.Reconciled(ph, func(context.Context, *in) (string, phase.Verdict, error) { return "", phase.Pending, nil }, record)
		}
		if p.Repeatable {
			ph = ph.Repeatable()
		}
	} else {
		ph = phase.Local(p.Name, func(context.Context, pgx.Tx, *in) (phase.Result, error) { return phase.Next(), nil })
	}
	if p.When {
		ph = ph.When(func(*in) bool { return true })
	}
	if p.Formerly != "" {
		ph = ph.Formerly(p.Formerly)
	}
	switch p.Isolation {
	case "":
	case "serializable":
		ph = ph.Isolation(pgx.Serializable)
	case "repeatable read":
		ph = ph.Isolation(pgx.RepeatableRead)
	default:
		t.Fatalf("phase %q: isolation %q; want serializable or repeatable read", p.Name, p.Isolation)
	}
	return ph
}
