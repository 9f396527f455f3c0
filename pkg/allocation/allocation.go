package allocation

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
)

// KeySize is the length of the allocation key in bytes.
const KeySize = 32

// MaxSize bounds an annotation value. The largest valid allocation
// (limits.MaxLimitsGPUs GPUs, the longest UUIDs, the largest numbers) encodes to
// under 4.3 KiB.
const MaxSize = 8 << 10

// MaxMinor is the largest device minor number Linux can represent (20 bits).
const MaxMinor = 1<<20 - 1

// Key is the secret shared by the device plugin, which signs allocations,
// and the NRI plugin and runtime wrapper, which verify them.
type Key [KeySize]byte

// ErrRejected is wrapped by every error Verify and CheckGPUs (and the replay
// check of internal/bindings)
// return for an allocation that must not be honoured. Their messages start
// with "allocation rejected: " and go on to name the reason.
var ErrRejected = errors.New("allocation rejected")

// The reasons an allocation is rejected (Contract 2). Each is also
// errors.Is(err, ErrRejected).
var (
	ErrMalformed  error = &reason{"malformed"}
	ErrBadMAC     error = &reason{"bad MAC"}
	ErrVersion    error = &reason{"unknown version"}
	ErrUnknownGPU error = &reason{"unknown GPU"}
	ErrReplay     error = &reason{"allocation ID bound to another pod"}
)

// reason is a sentinel rejection reason.
type reason struct{ name string }

func (r *reason) Error() string { return ErrRejected.Error() + ": " + r.name }
func (r *reason) Unwrap() error { return ErrRejected }

// rejection is one rejected allocation: a reason and the message that
// details it, optionally with the underlying error.
type rejection struct {
	reason error
	msg    string // after "allocation rejected: "
	cause  error
}

func (e *rejection) Error() string { return ErrRejected.Error() + ": " + e.msg }

func (e *rejection) Unwrap() []error {
	if e.cause == nil {
		return []error{e.reason}
	}
	return []error{e.reason, e.cause}
}

func malformed(format string, args ...any) error {
	return &rejection{reason: ErrMalformed, msg: "malformed: " + fmt.Sprintf(format, args...)}
}

func malformedCause(cause error, format string, args ...any) error {
	return &rejection{reason: ErrMalformed, msg: "malformed: " + fmt.Sprintf(format, args...) + ": " + cause.Error(), cause: cause}
}

// NewID returns a fresh allocation ID: 128 random bits as 32
// lower-case hex characters.
func NewID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("allocation ID: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// Sign returns the annotation value for a:
// base64url(payload) "." base64url(HMAC-SHA256(key, payload)), unpadded, where
// payload is a's JSON encoding. a must pass the checks Verify makes (its V
// must be Version), so that the device plugin learns of a bad
// allocation when it makes it, not when a container fails to start.
func Sign(key Key, a *Allocation) (string, error) {
	if a == nil {
		return "", errors.New("sign allocation: nil allocation")
	}
	if a.V != Version {
		return "", fmt.Errorf("sign allocation: version %d, this build issues %d", a.V, Version)
	}
	if err := validateAllocation(a); err != nil {
		return "", fmt.Errorf("sign allocation: %w", err)
	}
	payload, err := json.Marshal(a)
	if err != nil {
		return "", fmt.Errorf("sign allocation: %w", err)
	}
	v := encode(key, payload)
	if len(v) > MaxSize {
		return "", fmt.Errorf("sign allocation: annotation value is %d bytes, at most %d", len(v), MaxSize)
	}
	return v, nil
}

func encode(key Key, payload []byte) string {
	enc := base64.RawURLEncoding
	return enc.EncodeToString(payload) + "." + enc.EncodeToString(mac(key, payload))
}

func mac(key Key, payload []byte) []byte {
	m := hmac.New(sha256.New, key[:])
	m.Write(payload)
	return m.Sum(nil)
}

// Verify checks an annotation value made by Sign and returns its allocation.
// Every error wraps ErrRejected and one of ErrMalformed, ErrBadMAC or
// ErrVersion.
//
// The encoding is checked exactly: two unpadded base64url parts joined by one
// dot, nothing else, at most MaxSize bytes. The MAC is checked (in
// constant time) before the payload is parsed. The payload must be a JSON
// object whose "v" is Version, with no fields but the known ones, in
// the canonical form Sign writes, and with sane values (see Sign). The
// canonical form means an allocation has exactly one valid value per key.
//
// Verify does not check the GPUs against the node (CheckGPUs) nor the ID
// against other pods (internal/bindings).
func Verify(key Key, value string) (*Allocation, error) {
	if len(value) > MaxSize {
		return nil, malformed("value is %d bytes, at most %d", len(value), MaxSize)
	}
	encPayload, encMAC, ok := strings.Cut(value, ".")
	if !ok || strings.Contains(encMAC, ".") {
		return nil, malformed("want <payload>.<MAC>, found %d dots", strings.Count(value, "."))
	}
	payload, err := decodePart("payload", encPayload)
	if err != nil {
		return nil, err
	}
	sum, err := decodePart("MAC", encMAC)
	if err != nil {
		return nil, err
	}
	if len(sum) != sha256.Size {
		return nil, malformed("MAC is %d bytes, want %d", len(sum), sha256.Size)
	}
	if !hmac.Equal(sum, mac(key, payload)) {
		return nil, &rejection{reason: ErrBadMAC, msg: "bad MAC"}
	}

	// The version decides the schema, so read it before decoding strictly:
	// a later version may add fields this build does not know.
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(payload, &fields); err != nil {
		if _, syntax := errors.AsType[*json.SyntaxError](err); syntax {
			return nil, malformedCause(err, "payload is not JSON")
		}
		return nil, malformedCause(err, "payload is not a JSON object")
	}
	if fields == nil {
		return nil, malformed("payload is null, not a JSON object")
	}
	rawV, ok := fields["v"]
	if !ok {
		return nil, malformed("payload has no version (\"v\")")
	}
	var v int
	if err := json.Unmarshal(rawV, &v); err != nil {
		return nil, malformedCause(err, "version %s is not an integer", rawV)
	}
	if v != Version {
		return nil, &rejection{reason: ErrVersion, msg: fmt.Sprintf("unknown version %d (this build knows %d)", v, Version)}
	}

	a := new(Allocation)
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(a); err != nil {
		return nil, malformedCause(err, "payload does not match version %d", Version)
	}
	if err := validateAllocation(a); err != nil {
		return nil, &rejection{reason: ErrMalformed, msg: "malformed: " + err.Error(), cause: err}
	}
	// Field names differing in case, duplicate fields, whitespace, escapes:
	// encoding/json accepts them all. Only the bytes Sign writes are valid.
	canonical, err := json.Marshal(a)
	if err != nil {
		return nil, malformedCause(err, "payload cannot be re-encoded")
	}
	if !bytes.Equal(canonical, payload) {
		return nil, malformed("payload is not in canonical form")
	}
	return a, nil
}

// decodePart decodes one unpadded base64url part. Go's decoder skips CR and
// LF, and padding would give a value two spellings, so the alphabet is
// checked first; Strict rejects non-zero trailing bits for the same reason.
func decodePart(name, s string) ([]byte, error) {
	if s == "" {
		return nil, malformed("empty %s", name)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return nil, malformed("%s: character %s at offset %d is not unpadded base64url", name, quoteByte(c), i)
		}
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil {
		return nil, malformedCause(err, "%s is not canonical base64url", name)
	}
	return b, nil
}

// validateAllocation checks the payload's values, except the version.
func validateAllocation(a *Allocation) error {
	if !isAllocationID(a.ID) {
		return fmt.Errorf("id %q is not 32 lower-case hex characters", a.ID)
	}
	if a.Issued <= 0 {
		return fmt.Errorf("issued time %d is not a positive unix time", a.Issued)
	}
	if len(a.GPUs) == 0 {
		return errors.New("no GPUs")
	}
	if len(a.GPUs) > limits.MaxLimitsGPUs {
		return fmt.Errorf("%d GPUs, at most %d", len(a.GPUs), limits.MaxLimitsGPUs)
	}
	switch a.CoresPolicy {
	case "", limits.CoresPolicyBurst:
	case limits.CoresPolicyHard:
		// One spelling per allocation: hard is the field left out.
		return fmt.Errorf("cores_policy %q: hard is written by leaving the field out", a.CoresPolicy)
	default:
		return fmt.Errorf("cores_policy %q: want %q or no field (hard)", a.CoresPolicy, limits.CoresPolicyBurst)
	}
	for i, g := range a.GPUs {
		if err := limits.ValidateUUID(g.UUID); err != nil {
			return fmt.Errorf("gpus[%d]: %w", i, err)
		}
		for _, prev := range a.GPUs[:i] {
			if prev.UUID == g.UUID {
				return fmt.Errorf("gpus[%d]: GPU %s listed twice", i, g.UUID)
			}
		}
		switch {
		case g.Minor < 0 || g.Minor > MaxMinor:
			return fmt.Errorf("gpus[%d] (%s): minor %d outside 0..%d", i, g.UUID, g.Minor, MaxMinor)
		case g.Slices < 1:
			return fmt.Errorf("gpus[%d] (%s): %d slices, at least 1", i, g.UUID, g.Slices)
		case g.Memory == 0:
			return fmt.Errorf("gpus[%d] (%s): memory 0, must be positive", i, g.UUID)
		case g.Cores < 1 || g.Cores > 100:
			return fmt.Errorf("gpus[%d] (%s): cores %d outside 1..100", i, g.UUID, g.Cores)
		}
	}
	return nil
}

func isAllocationID(id string) bool {
	if len(id) != 32 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// CheckGPUs rejects an allocation that names a GPU for which known returns
// false, with ErrUnknownGPU naming the first such UUID.
func CheckGPUs(a *Allocation, known func(uuid string) bool) error {
	for _, g := range a.GPUs {
		if !known(g.UUID) {
			return &rejection{reason: ErrUnknownGPU, msg: "unknown GPU " + g.UUID}
		}
	}
	return nil
}

// quoteByte quotes one byte of a value for an error message: a Go character
// literal for ASCII, its hex value for a byte of a multi-byte character.
func quoteByte(c byte) string {
	if c < utf8.RuneSelf {
		return strconv.QuoteRune(rune(c))
	}
	return fmt.Sprintf("byte 0x%02x", c)
}
