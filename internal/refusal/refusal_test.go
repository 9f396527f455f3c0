package refusal

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestReason(t *testing.T) {
	base := status.Error(codes.InvalidArgument, "no such device")
	err := fmt.Errorf("allocate: %w", New("unknown_gpu", base))
	if got := Reason(err, "internal"); got != "unknown_gpu" {
		t.Errorf("Reason of a wrapped refusal = %q, want unknown_gpu", got)
	}
	if got := Reason(errors.New("boom"), "internal"); got != "internal" {
		t.Errorf("Reason of a plain error = %q, want the fallback", got)
	}
	if !errors.Is(err, base) || err.Error() != "allocate: "+base.Error() {
		t.Errorf("the refusal hides its error: %v", err)
	}
	if s := status.Convert(New("unknown_gpu", base)); s.Code() != codes.InvalidArgument || s.Message() != "no such device" {
		t.Errorf("gRPC status %v %q, want the wrapped error's", s.Code(), s.Message())
	}
}
