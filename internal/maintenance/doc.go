// Package maintenance holds the machinery of package recovery that only a
// phase.Client runs: the completer, which claims and resumes stuck keys, and
// the reaper, which answers abandoned keys and deletes finished ones past
// retention. Users configure both through recovery's CompleterConfig and
// ReaperConfig (phase.Config.Completer and Reaper) and run them through the
// client's Start, Stop, Complete and Reap; what they do is told in package
// recovery's documentation.
package maintenance
