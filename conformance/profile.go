package conformance

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/atomicphase/atomicphase/phase"
)

// Profile is the policy an endpoint follows where the IETF draft, Stripe and
// this library's handler disagree. Every profile checks the same guarantees
// (one execution per key, byte-identical replays, a refused bad key); a
// profile decides only how the answers are spelled.
type Profile struct {
	// Name names the profile in reports.
	Name string
	// ReplayHeader is the response header that marks a replay, with the
	// value "true".
	ReplayHeader string
	// MismatchStatus answers a key reused with another request once the
	// first has finished.
	MismatchStatus int
	// InFlightMismatchStatuses are the answers accepted for a key reused
	// with another request while the first is still in flight.
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

// Profiles returns the built-in profiles, IETF, Stripe and AtomicPhase.
func Profiles() []Profile { return []Profile{IETF(), Stripe(), AtomicPhase()} }

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

// validate reports a profile that cannot judge an answer.
func (p Profile) validate() error {
	switch {
	case p.ReplayHeader == "":
		return fmt.Errorf("conformance: profile %q has no ReplayHeader", p.Name)
	case p.MismatchStatus < 400 || p.MismatchStatus > 499:
		return fmt.Errorf("conformance: profile %q: MismatchStatus %d is not a 4xx", p.Name, p.MismatchStatus)
	}
	return nil
}

// inFlightMismatch reports whether status answers a key in flight with
// another payload under p; the status of a finished key is accepted too,
// since the first request may have finished by the time the other arrived.
func (p Profile) inFlightMismatch(status int) bool {
	return status == p.MismatchStatus || slices.Contains(p.InFlightMismatchStatuses, status)
}

// accepted lists the statuses inFlightMismatch accepts.
func (p Profile) accepted() []int {
	s := append([]int{p.MismatchStatus}, p.InFlightMismatchStatuses...)
	slices.Sort(s)
	return slices.Compact(s)
}
