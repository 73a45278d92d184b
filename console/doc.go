// Package console is a web console for operators of an atomicphase
// database: an http.Handler the application mounts behind its own
// authentication, or that 'atomicphase console' serves for a database URL.
//
// # Pages
//
// The overview counts each workflow's keys by state, with the age of the
// oldest unfinished key and the keys of the last hour, and draws the last
// hour's keys started, finished and put on hold per minute and, for each
// workflow, its unfinished keys by state at each minute, from the status
// history the completer records once a minute (phase.Client.History); the key list
// filters by state, workflow, tenant, key prefix and age, a page at a time;
// a key's page shows its request as stored, its state, the workflow's
// phases (which it passed, the downstream key of each foreign one), its
// lease, attempts, failures, last error, timestamps, stored response and
// audit. Its actions (unlock, retry, resolve an unknown outcome as
// happened with the call's output or as not happened, and bulk retry or
// unlock of a filtered list with a count first) each need an explicit
// confirmation and are recorded in the audit, which has a page too.
//
// # Stale pages
//
// A key's action forms carry the key as the page showed it (its recovery
// point, hold, lease and pending resolution), and an action applies only
// while the key is still like that: a form from a page loaded before
// another operator resolved the key, or before a new run took its lease,
// is answered 409 with the key as it is now and what changed, and the
// refusal is audited.
//
// # Security
//
// Nobody gets in by default: Config.Authorizer, which the application
// supplies, names the person behind each request and says whether they may
// only read or also act. Every state change is a POST that must carry the
// console's CSRF token (a random value in a SameSite=Strict cookie, echoed
// in the form) and pass Go's cross-origin protection. Every page is
// rendered by html/template, which escapes every stored value for the
// place it appears in (request bodies, keys and tenants are written by
// clients), under a Content-Security-Policy that allows only the console's
// own script and style files: no inline script, no framing, forms posting
// only to the console. Text that clients wrote is isolated in <bdi>, with
// the characters that are invisible or reorder text written out (U+202E
// as \u202E), so that no name can pass for another. A form over 1 MiB is
// answered 413. Config.ReadOnly removes every action.
package console
