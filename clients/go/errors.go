package baton

import (
	"errors"
	"fmt"
)

// Sentinel errors, for errors.Is. Every error a call returns is one of
// them, a *RefusedError, or the context's own error (context.Canceled,
// context.DeadlineExceeded) when the caller's context ended first.
var (
	// ErrTimeout: the key was not granted within the wait (the server
	// answered T). Nothing was granted, so nothing needs cleaning up.
	ErrTimeout = errors.New("baton: timed out: the key was not granted within the wait")
	// ErrLost: the grant no longer holds its key (a release or a keep was
	// answered not-held, or its lease ran out by the client's clock before
	// a keep got through).
	ErrLost = errors.New("baton: the grant was lost")
	// ErrUnavailable: no server answered, after every attempt the rules
	// allow (every connection tried, redirects followed, retries spent).
	// Trying again later may succeed.
	ErrUnavailable = errors.New("baton: unavailable")
	// ErrClosed: the client was closed, or the grant was already released.
	ErrClosed = errors.New("baton: closed")
	// ErrBadArgument: the library refused the call before sending anything
	// (a bad key, lease, limit, value, secret or address).
	ErrBadArgument = errors.New("baton: bad argument")
)

// RefusedError is a refusal by the server: an E answer, or a secret the
// server did not accept. Reason is the server's reason word exactly, such
// as "limit-mismatch", "bad-lease", "lease-too-long", "too-many-watches",
// "bad-auth" or "auth-required".
type RefusedError struct {
	// Reason is the server's reason word.
	Reason string
}

// Error tells the reason word.
func (e *RefusedError) Error() string {
	return "baton: refused by the server: " + e.Reason
}

// detailed is a sentinel error with the detail of one occurrence; it
// unwraps to the sentinel.
type detailed struct {
	kind error
	why  string
}

// Error is the sentinel's text and the detail.
func (e *detailed) Error() string { return e.kind.Error() + ": " + e.why }

// Unwrap is the sentinel.
func (e *detailed) Unwrap() error { return e.kind }

func unavailable(format string, args ...any) error {
	return &detailed{ErrUnavailable, fmt.Sprintf(format, args...)}
}

func badArgument(format string, args ...any) error {
	return &detailed{ErrBadArgument, fmt.Sprintf(format, args...)}
}

func lost(why string) error {
	return &detailed{ErrLost, why}
}

// isUnreachable: the error says no server answered (the call may be tried
// again later), as opposed to an answer.
func isUnreachable(err error) bool {
	return errors.Is(err, ErrUnavailable)
}
