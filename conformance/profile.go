package conformance

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/atomicphase/atomicphase/phase"
)

// Profile is the policy an endpoint follows where the IETF draft, Stripe and
// this library's handler disagree. Every profile checks the same
// guarantees, and an answer that breaks one fails in every profile: a second
// execution, a replay that differs from the first answer, an execution
// without a key, a key reused with another request executed or given the
// first answer, an answer lost across a restart, one caller's key answering
// another, a missing or absurd Retry-After on an answer a client retries. A
// profile decides only how the answers are spelled; an answer spelled
// otherwise is a [Differs] verdict, which fails the check only when
// [Config.Strict] is set.
type Profile struct {
	// Name names the profile in reports.
	Name string
	// ReplayHeader is the response header that marks a replay, with the
	// value "true". Empty accepts either spelling in use,
	// Idempotent-Replayed (Stripe, phase.Handler) or Idempotency-Replayed
	// (idemlease, go-idempotency, idempo).
	ReplayHeader string
	// MismatchStatus answers a key reused with another request once the
	// first has finished. Zero accepts 400, 409 or 422, the statuses the
	// peers use.
	MismatchStatus int
	// InFlightMismatchStatuses are the answers accepted for a key reused
	// with another request while the first is still in flight, beside
	// MismatchStatus. With neither set, 400, 409 and 422 are.
	InFlightMismatchStatuses []int
	// Problems requires the errors the scenarios check (a refused key, a
	// reused key, a key in flight) to be application/problem+json
	// (RFC 9457).
	Problems bool
	// ProblemTypes, when set, are the exact problem type URIs expected.
	ProblemTypes ProblemTypes
	// ReplaysServerErrors allows a 5xx to be stored and replayed as the
	// key's final answer, as Stripe does.
	ReplaysServerErrors bool
	// OpaqueKeys takes a key as opaque characters: a key that is not an
	// RFC 8941 sf-string, longer than 255 characters or sent on two lines
	// may be accepted, provided it then works as a key (its retry is
	// replayed, and a longer key is not cut to match another). Without it
	// such a key must be refused with 400.
	OpaqueKeys bool
}

// ProblemTypes are the RFC 9457 type URIs of the problems a profile
// expects; an empty one is not checked.
type ProblemTypes struct {
	// MissingKey is the type of the 400 for a missing or empty key.
	MissingKey string
	// InvalidKey is the type of the 400 for a malformed, too long or
	// repeated key.
	InvalidKey string
	// KeyReused is the type of the answer to a key reused with another
	// request.
	KeyReused string
	// InProgress is the type of the 409 for a key in flight.
	InProgress string
}

// Generic returns the profile any safe endpoint passes, the default: either
// replay marker, 400, 409 or 422 for a key reused with another request,
// whether or not the first is still in flight, errors in any format, a 5xx
// kept as final or not, and keys taken as opaque characters. A key that is
// missing or empty must still be refused (400), since a request without a
// key is not protected.
func Generic() Profile {
	return Profile{Name: "generic", ReplaysServerErrors: true, OpaqueKeys: true}
}

// IETF returns the profile of draft-ietf-httpapi-idempotency-key-header-07:
// 422 for a reused key, 409 or 422 for one in flight with another payload,
// problem details on errors, no 5xx kept as final. The draft defines no
// replay marker; the profile expects Idempotency-Replayed, the name its
// implementations (idemlease, go-idempotency, idempo) use.
func IETF() Profile {
	return Profile{
		Name:                     "ietf",
		ReplayHeader:             "Idempotency-Replayed",
		MismatchStatus:           http.StatusUnprocessableEntity,
		InFlightMismatchStatuses: []int{http.StatusConflict, http.StatusUnprocessableEntity},
		Problems:                 true,
	}
}

// Stripe returns the profile of Stripe's API: Idempotent-Replayed marks
// replays, a reused key answers 400 (idempotency_error), a key in flight
// with another payload 400 or 409, and a stored 5xx may be replayed as the
// key's final answer. Errors need not be problem details.
func Stripe() Profile {
	return Profile{
		Name:                     "stripe",
		ReplayHeader:             "Idempotent-Replayed",
		MismatchStatus:           http.StatusBadRequest,
		InFlightMismatchStatuses: []int{http.StatusBadRequest, http.StatusConflict},
		ReplaysServerErrors:      true,
	}
}

// AtomicPhase returns the profile of phase.Handler with its defaults, made
// from the constants the handler writes: phase.ReplayedHeader marks
// replays, a reused key answers phase.DefaultMismatchStatus whether or not
// the first request is still in flight, every error is a problem of a
// phase.ProblemTypePrefix type, and a 5xx is never kept as final.
func AtomicPhase() Profile {
	return Profile{
		Name:                     "atomicphase",
		ReplayHeader:             phase.ReplayedHeader,
		MismatchStatus:           phase.DefaultMismatchStatus,
		InFlightMismatchStatuses: []int{phase.DefaultMismatchStatus},
		Problems:                 true,
		ProblemTypes: ProblemTypes{
			MissingKey: phase.ProblemTypePrefix + phase.ProblemMissingKey,
			InvalidKey: phase.ProblemTypePrefix + phase.ProblemInvalidKey,
			KeyReused:  phase.ProblemTypePrefix + phase.ProblemKeyReused,
			InProgress: phase.ProblemTypePrefix + phase.ProblemInProgress,
		},
	}
}

// Profiles returns the built-in profiles: Generic, the default, then IETF,
// Stripe and AtomicPhase.
func Profiles() []Profile { return []Profile{Generic(), IETF(), Stripe(), AtomicPhase()} }

// ProfileNamed returns the built-in profile called name.
func ProfileNamed(name string) (Profile, error) {
	var names []string
	for _, p := range Profiles() {
		if p.Name == name {
			return p, nil
		}
		names = append(names, p.Name)
	}
	return Profile{}, fmt.Errorf("conformance: no profile %q; the profiles are %s", name, strings.Join(names, ", "))
}

// isZero reports a Profile nobody set, which means Generic.
func (p Profile) isZero() bool {
	return p.Name == "" && p.ReplayHeader == "" && p.MismatchStatus == 0 && p.InFlightMismatchStatuses == nil &&
		!p.Problems && p.ProblemTypes == (ProblemTypes{}) && !p.ReplaysServerErrors && !p.OpaqueKeys
}

// validate reports a profile that cannot judge an answer.
func (p Profile) validate() error {
	if p.MismatchStatus != 0 && (p.MismatchStatus < 400 || p.MismatchStatus > 499) {
		return fmt.Errorf("conformance: profile %q: MismatchStatus %d is not a 4xx", p.Name, p.MismatchStatus)
	}
	return nil
}

// peerMismatchStatuses are the statuses peers answer a reused key with.
var peerMismatchStatuses = []int{http.StatusBadRequest, http.StatusConflict, http.StatusUnprocessableEntity}

// markers returns the replay headers p accepts.
func (p Profile) markers() []string {
	if p.ReplayHeader == "" {
		return replayHeaders
	}
	return []string{p.ReplayHeader}
}

// marker names the replay header p expects, for a verdict.
func (p Profile) marker() string { return strings.Join(p.markers(), " or ") }

// mismatch lists the statuses p accepts for a key reused with another
// request once the first has finished.
func (p Profile) mismatch() []int {
	if p.MismatchStatus == 0 {
		return peerMismatchStatuses
	}
	return []int{p.MismatchStatus}
}

// inFlightMismatch reports whether status answers a key in flight with
// another payload under p; the status of a finished key is accepted too,
// since the first request may have finished by the time the other arrived.
func (p Profile) inFlightMismatch(status int) bool {
	return slices.Contains(p.accepted(), status)
}

// accepted lists the statuses inFlightMismatch accepts.
func (p Profile) accepted() []int {
	s := append(slices.Clone(p.mismatch()), p.InFlightMismatchStatuses...)
	slices.Sort(s)
	return slices.Compact(s)
}

// statuses spells a list of statuses for a verdict: "400, 409 or 422".
func statuses(s []int) string {
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = strconv.Itoa(v)
	}
	if len(parts) < 2 {
		return strings.Join(parts, "")
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " or " + parts[len(parts)-1]
}
