// Package refusal carries the reason a request was refused, from where the
// refusal is decided to the counter of refusals by reason: the device
// plugin's allocations and the DRA driver's claims.
package refusal

import (
	"errors"

	"google.golang.org/grpc/status"
)

// Error is a refusal: the error answered, with its reason.
type Error struct {
	Reason string
	Err    error
}

// New returns err refused for reason.
func New(reason string, err error) error { return &Error{Reason: reason, Err: err} }

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// GRPCStatus is the status of the error wrapped, so that a gRPC caller (the
// kubelet) gets its code and message unchanged.
func (e *Error) GRPCStatus() *status.Status {
	s, _ := status.FromError(e.Err)
	return s
}

// Reason is the reason err was refused for, or fallback when err carries
// none (the refusing component's own failure).
func Reason(err error, fallback string) string {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Reason
	}
	return fallback
}
