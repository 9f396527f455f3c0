package allocation

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
)

var testKey = Key{
	0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
	0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f,
}

const GiB = 1 << 30

const (
	testID    = "3f8a0c1d2e4b5a6978877665544332a1"
	testUUID0 = "GPU-8e1c2a3b-0000-1111-2222-333344445555"
	testUUID1 = "GPU-0b6a9f2e-aaaa-bbbb-cccc-ddddeeeeffff"
)

func testAllocation() *Allocation {
	return &Allocation{
		V:      Version,
		ID:     testID,
		Issued: 1763719200,
		GPUs: []GPU{
			{UUID: testUUID0, Minor: 0, Slices: 2, Memory: 8 * GiB, Cores: 50},
			{UUID: testUUID1, Minor: 3, Slices: 1, Memory: 1638 * limits.MiB, Cores: 10},
		},
	}
}

// signRaw signs arbitrary payload bytes, bypassing Sign's checks, to build
// values only a key holder could make.
func signRaw(key Key, payload string) string { return encode(key, []byte(payload)) }

// signModified signs testAllocation after mod changed it.
func signModified(mod func(a *Allocation)) string {
	a := testAllocation()
	mod(a)
	b, err := json.Marshal(a)
	if err != nil {
		panic(err)
	}
	return encode(testKey, b)
}

// validPayload is the canonical JSON of testAllocation.
func validPayload() string {
	b, _ := json.Marshal(testAllocation())
	return string(b)
}

func TestSignVerifyRoundTrip(t *testing.T) {
	a := testAllocation()
	v, err := Sign(testKey, a)
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	payload, sum, ok := strings.Cut(v, ".")
	if !ok {
		t.Fatalf("Sign = %q: no dot", v)
	}
	raw, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		t.Fatalf("payload: %v", err)
	}
	wantJSON := `{"v":1,"id":"3f8a0c1d2e4b5a6978877665544332a1","issued":1763719200,"gpus":[` +
		`{"uuid":"GPU-8e1c2a3b-0000-1111-2222-333344445555","minor":0,"slices":2,"memory":8589934592,"cores":50},` +
		`{"uuid":"GPU-0b6a9f2e-aaaa-bbbb-cccc-ddddeeeeffff","minor":3,"slices":1,"memory":1717567488,"cores":10}]}`
	if string(raw) != wantJSON {
		t.Errorf("payload\n got %s\nwant %s", raw, wantJSON)
	}
	if len(sum) != 43 { // 32 bytes, unpadded
		t.Errorf("MAC part %q is %d characters, want 43", sum, len(sum))
	}
	got, err := Verify(testKey, v)
	if err != nil {
		t.Fatalf("Verify(Sign(a)): %v", err)
	}
	if !equalAllocations(got, a) {
		t.Errorf("Verify(Sign(a)) = %+v, want %+v", got, a)
	}
	// Signing is deterministic: one allocation, one value.
	if v2, _ := Sign(testKey, got); v2 != v {
		t.Errorf("Sign(Verify(v)) = %q, want %q", v2, v)
	}
}

// A burst allocation carries the policy as the last field; a hard one
// (above) has no such field, as before the field existed.
func TestSignVerifyBurst(t *testing.T) {
	a := testAllocation()
	a.GPUs = a.GPUs[1:]
	a.CoresPolicy = limits.CoresPolicyBurst
	v, err := Sign(testKey, a)
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	payload, _, _ := strings.Cut(v, ".")
	raw, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		t.Fatalf("payload: %v", err)
	}
	wantJSON := `{"v":1,"id":"3f8a0c1d2e4b5a6978877665544332a1","issued":1763719200,"gpus":[` +
		`{"uuid":"GPU-0b6a9f2e-aaaa-bbbb-cccc-ddddeeeeffff","minor":3,"slices":1,"memory":1717567488,"cores":10}],` +
		`"cores_policy":"burst"}`
	if string(raw) != wantJSON {
		t.Errorf("payload\n got %s\nwant %s", raw, wantJSON)
	}
	got, err := Verify(testKey, v)
	if err != nil {
		t.Fatalf("Verify(Sign(a)): %v", err)
	}
	if got.CoresPolicy != "burst" {
		t.Errorf("Verify(Sign(a)).CoresPolicy = %q, want burst", got.CoresPolicy)
	}
}

func equalAllocations(a, b *Allocation) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

// TestVerifyRejects has one case for every way Verify refuses a value.
func TestVerifyRejects(t *testing.T) {
	valid, err := Sign(testKey, testAllocation())
	if err != nil {
		t.Fatal(err)
	}
	validPayloadB64, validMAC, _ := strings.Cut(valid, ".")
	otherKey := testKey
	otherKey[0] ^= 1
	signedWithOtherKey, _ := Sign(otherKey, testAllocation())
	otherAllocation := signModified(func(a *Allocation) { a.GPUs = a.GPUs[:1] })

	// A payload byte changed after signing (2 GPUs' worth of memory).
	tampered := strings.Replace(validPayload(), `"memory":8589934592`, `"memory":17179869184`, 1)
	tamperedPayload := base64.RawURLEncoding.EncodeToString([]byte(tampered)) + "." + validMAC
	macBytes, _ := base64.RawURLEncoding.DecodeString(validMAC)
	macBytes[31] ^= 0x80
	tamperedMAC := validPayloadB64 + "." + base64.RawURLEncoding.EncodeToString(macBytes)

	seventeen := make([]GPU, limits.MaxLimitsGPUs+1)
	for i := range seventeen {
		seventeen[i] = GPU{UUID: fmt.Sprintf("GPU-%d", i), Minor: i, Slices: 1, Memory: GiB, Cores: 10}
	}

	tests := []struct {
		name   string
		value  string
		reason error
		msg    string // the whole message, or its start when prefix is set
		prefix bool
	}{
		// Encoding.
		{"oversize", strings.Repeat("A", MaxSize+1), ErrMalformed,
			"allocation rejected: malformed: value is 8193 bytes, at most 8192", false},
		{"empty", "", ErrMalformed,
			"allocation rejected: malformed: want <payload>.<MAC>, found 0 dots", false},
		{"no dot", validPayloadB64, ErrMalformed,
			"allocation rejected: malformed: want <payload>.<MAC>, found 0 dots", false},
		{"extra dot", valid + ".", ErrMalformed,
			"allocation rejected: malformed: want <payload>.<MAC>, found 2 dots", false},
		{"three parts", validPayloadB64 + ".x." + validMAC, ErrMalformed,
			"allocation rejected: malformed: want <payload>.<MAC>, found 2 dots", false},
		{"empty payload", "." + validMAC, ErrMalformed,
			"allocation rejected: malformed: empty payload", false},
		{"empty MAC", validPayloadB64 + ".", ErrMalformed,
			"allocation rejected: malformed: empty MAC", false},
		{"padded payload", "eyJ2IjoxfQ==." + validMAC, ErrMalformed,
			"allocation rejected: malformed: payload: character '=' at offset 10 is not unpadded base64url", false},
		{"padded MAC", validPayloadB64 + "." + validMAC + "=", ErrMalformed,
			"allocation rejected: malformed: MAC: character '=' at offset 43 is not unpadded base64url", false},
		{"standard base64 alphabet", "ab+/." + validMAC, ErrMalformed,
			"allocation rejected: malformed: payload: character '+' at offset 2 is not unpadded base64url", false},
		{"newline in payload", validPayloadB64[:8] + "\n" + validPayloadB64[8:] + "." + validMAC, ErrMalformed,
			`allocation rejected: malformed: payload: character '\n' at offset 8 is not unpadded base64url`, false},
		{"leading space", " " + valid, ErrMalformed,
			"allocation rejected: malformed: payload: character ' ' at offset 0 is not unpadded base64url", false},
		{"trailing newline", valid + "\n", ErrMalformed,
			`allocation rejected: malformed: MAC: character '\n' at offset 43 is not unpadded base64url`, false},
		{"non-ASCII", "é." + validMAC, ErrMalformed,
			"allocation rejected: malformed: payload: character byte 0xc3 at offset 0 is not unpadded base64url", false},
		{"impossible base64 length", "A." + validMAC, ErrMalformed,
			"allocation rejected: malformed: payload is not canonical base64url: illegal base64 data at input byte 0", false},
		{"non-zero trailing bits", "AB." + validMAC, ErrMalformed,
			"allocation rejected: malformed: payload is not canonical base64url: illegal base64 data at input byte 0", false},
		{"short MAC", validPayloadB64 + "." + base64.RawURLEncoding.EncodeToString(macBytes[:31]), ErrMalformed,
			"allocation rejected: malformed: MAC is 31 bytes, want 32", false},

		// Authentication.
		{"other key", signedWithOtherKey, ErrBadMAC, "allocation rejected: bad MAC", false},
		{"tampered payload", tamperedPayload, ErrBadMAC, "allocation rejected: bad MAC", false},
		{"tampered MAC", tamperedMAC, ErrBadMAC, "allocation rejected: bad MAC", false},
		{"MAC of another allocation", otherAllocation[:strings.IndexByte(otherAllocation, '.')] + "." + validMAC, ErrBadMAC,
			"allocation rejected: bad MAC", false},

		// JSON and version.
		{"not JSON", signRaw(testKey, "v=1"), ErrMalformed,
			"allocation rejected: malformed: payload is not JSON: invalid character", true},
		{"truncated JSON", signRaw(testKey, validPayload()[:40]), ErrMalformed,
			"allocation rejected: malformed: payload is not JSON: unexpected end of JSON input", false},
		{"trailing data", signRaw(testKey, validPayload()+"{}"), ErrMalformed,
			"allocation rejected: malformed: payload is not JSON: invalid character '{' after top-level value", false},
		{"array", signRaw(testKey, "[1]"), ErrMalformed,
			"allocation rejected: malformed: payload is not a JSON object: json: cannot unmarshal array", true},
		{"null", signRaw(testKey, "null"), ErrMalformed,
			"allocation rejected: malformed: payload is null, not a JSON object", false},
		{"no version", signRaw(testKey, `{"id":"`+testID+`"}`), ErrMalformed,
			`allocation rejected: malformed: payload has no version ("v")`, false},
		{"version in upper case", signRaw(testKey, strings.Replace(validPayload(), `"v"`, `"V"`, 1)), ErrMalformed,
			`allocation rejected: malformed: payload has no version ("v")`, false},
		{"version string", signRaw(testKey, `{"v":"1"}`), ErrMalformed,
			`allocation rejected: malformed: version "1" is not an integer: json: cannot unmarshal string`, true},
		{"version fraction", signRaw(testKey, `{"v":1.5}`), ErrMalformed,
			`allocation rejected: malformed: version 1.5 is not an integer: json: cannot unmarshal number 1.5`, true},
		{"version 2", signRaw(testKey, strings.Replace(validPayload(), `"v":1`, `"v":2`, 1)), ErrVersion,
			"allocation rejected: unknown version 2 (this build knows 1)", false},
		{"version 2 with new fields", signRaw(testKey, `{"v":2,"future":{"x":[1]}}`), ErrVersion,
			"allocation rejected: unknown version 2 (this build knows 1)", false},
		{"version 0", signRaw(testKey, strings.Replace(validPayload(), `"v":1`, `"v":0`, 1)), ErrVersion,
			"allocation rejected: unknown version 0 (this build knows 1)", false},
		{"unknown field", signRaw(testKey, strings.Replace(validPayload(), `"v":1,`, `"v":1,"pod":"x",`, 1)), ErrMalformed,
			`allocation rejected: malformed: payload does not match version 1: json: unknown field "pod"`, false},
		{"unknown GPU field", signRaw(testKey, strings.Replace(validPayload(), `"cores":50`, `"cores":50,"mig":true`, 1)), ErrMalformed,
			`allocation rejected: malformed: payload does not match version 1: json: unknown field "mig"`, false},
		{"wrong type", signRaw(testKey, strings.Replace(validPayload(), `"issued":1763719200`, `"issued":"now"`, 1)), ErrMalformed,
			"allocation rejected: malformed: payload does not match version 1: json: cannot unmarshal string", true},
		{"negative memory", signRaw(testKey, strings.Replace(validPayload(), `"memory":8589934592`, `"memory":-1`, 1)), ErrMalformed,
			"allocation rejected: malformed: payload does not match version 1: json: cannot unmarshal number -1", true},

		// Values.
		{"short id", signModified(func(a *Allocation) { a.ID = "3f8a" }), ErrMalformed,
			`allocation rejected: malformed: id "3f8a" is not 32 lower-case hex characters`, false},
		{"upper-case id", signModified(func(a *Allocation) { a.ID = strings.ToUpper(testID) }), ErrMalformed,
			`allocation rejected: malformed: id "3F8A0C1D2E4B5A6978877665544332A1" is not 32 lower-case hex characters`, false},
		{"empty id", signModified(func(a *Allocation) { a.ID = "" }), ErrMalformed,
			`allocation rejected: malformed: id "" is not 32 lower-case hex characters`, false},
		{"issued 0", signModified(func(a *Allocation) { a.Issued = 0 }), ErrMalformed,
			"allocation rejected: malformed: issued time 0 is not a positive unix time", false},
		{"issued negative", signModified(func(a *Allocation) { a.Issued = -5 }), ErrMalformed,
			"allocation rejected: malformed: issued time -5 is not a positive unix time", false},
		{"no GPUs", signModified(func(a *Allocation) { a.GPUs = nil }), ErrMalformed,
			"allocation rejected: malformed: no GPUs", false},
		{"empty GPU list", signModified(func(a *Allocation) { a.GPUs = []GPU{} }), ErrMalformed,
			"allocation rejected: malformed: no GPUs", false},
		{"17 GPUs", signModified(func(a *Allocation) { a.GPUs = seventeen }), ErrMalformed,
			"allocation rejected: malformed: 17 GPUs, at most 16", false},
		{"empty uuid", signModified(func(a *Allocation) { a.GPUs[1].UUID = "" }), ErrMalformed,
			"allocation rejected: malformed: gpus[1]: empty GPU UUID", false},
		{"uuid with a space", signModified(func(a *Allocation) { a.GPUs[0].UUID = "GPU 1" }), ErrMalformed,
			`allocation rejected: malformed: gpus[0]: GPU UUID "GPU 1": character ' ' at offset 3 is not one of A-Z a-z 0-9 - _ . : /`, false},
		{"uuid with the device-ID separator", signModified(func(a *Allocation) { a.GPUs[0].UUID = "GPU-1::0" }), ErrMalformed,
			`allocation rejected: malformed: gpus[0]: GPU UUID "GPU-1::0" contains "::"`, false},
		{"duplicate uuid", signModified(func(a *Allocation) { a.GPUs[1].UUID = testUUID0 }), ErrMalformed,
			"allocation rejected: malformed: gpus[1]: GPU " + testUUID0 + " listed twice", false},
		{"negative minor", signModified(func(a *Allocation) { a.GPUs[1].Minor = -1 }), ErrMalformed,
			"allocation rejected: malformed: gpus[1] (" + testUUID1 + "): minor -1 outside 0..1048575", false},
		{"huge minor", signModified(func(a *Allocation) { a.GPUs[1].Minor = MaxMinor + 1 }), ErrMalformed,
			"allocation rejected: malformed: gpus[1] (" + testUUID1 + "): minor 1048576 outside 0..1048575", false},
		{"no slices", signModified(func(a *Allocation) { a.GPUs[0].Slices = 0 }), ErrMalformed,
			"allocation rejected: malformed: gpus[0] (" + testUUID0 + "): 0 slices, at least 1", false},
		{"no memory", signModified(func(a *Allocation) { a.GPUs[0].Memory = 0 }), ErrMalformed,
			"allocation rejected: malformed: gpus[0] (" + testUUID0 + "): memory 0, must be positive", false},
		{"no cores", signModified(func(a *Allocation) { a.GPUs[0].Cores = 0 }), ErrMalformed,
			"allocation rejected: malformed: gpus[0] (" + testUUID0 + "): cores 0 outside 1..100", false},
		{"too many cores", signModified(func(a *Allocation) { a.GPUs[0].Cores = 101 }), ErrMalformed,
			"allocation rejected: malformed: gpus[0] (" + testUUID0 + "): cores 101 outside 1..100", false},
		{"cores_policy hard written out", signModified(func(a *Allocation) { a.CoresPolicy = "hard" }), ErrMalformed,
			`allocation rejected: malformed: cores_policy "hard": hard is written by leaving the field out`, false},
		{"cores_policy unknown", signModified(func(a *Allocation) { a.CoresPolicy = "share" }), ErrMalformed,
			`allocation rejected: malformed: cores_policy "share": want "burst" or no field (hard)`, false},
		{"cores_policy upper case", signModified(func(a *Allocation) { a.CoresPolicy = "BURST" }), ErrMalformed,
			`allocation rejected: malformed: cores_policy "BURST": want "burst" or no field (hard)`, false},
		{"cores_policy empty string", signRaw(testKey, strings.TrimSuffix(validPayload(), "}")+`,"cores_policy":""}`), ErrMalformed,
			"allocation rejected: malformed: payload is not in canonical form", false},
		{"cores_policy not a string", signRaw(testKey, strings.TrimSuffix(validPayload(), "}")+`,"cores_policy":1}`), ErrMalformed,
			"allocation rejected: malformed: payload does not match version 1: json: cannot unmarshal number", true},

		// Canonical form: valid JSON for the same allocation, other bytes.
		{"whitespace", signRaw(testKey, strings.Replace(validPayload(), `"v":1`, `"v": 1`, 1)), ErrMalformed,
			"allocation rejected: malformed: payload is not in canonical form", false},
		{"field order", signRaw(testKey, strings.Replace(validPayload(), `"v":1,"id":"`+testID+`"`, `"id":"`+testID+`","v":1`, 1)), ErrMalformed,
			"allocation rejected: malformed: payload is not in canonical form", false},
		{"field name case", signRaw(testKey, strings.Replace(validPayload(), `"issued"`, `"Issued"`, 1)), ErrMalformed,
			"allocation rejected: malformed: payload is not in canonical form", false},
		{"duplicate field", signRaw(testKey, strings.Replace(validPayload(), `"v":1,`, `"v":1,"issued":5,`, 1)), ErrMalformed,
			"allocation rejected: malformed: payload is not in canonical form", false},
		{"escaped character", signRaw(testKey, strings.Replace(validPayload(), `"GPU-8e1c`, `"\u0047PU-8e1c`, 1)), ErrMalformed,
			"allocation rejected: malformed: payload is not in canonical form", false},
		{"exponent", signRaw(testKey, strings.Replace(validPayload(), `"slices":2`, `"slices":2.0`, 1)), ErrMalformed,
			"allocation rejected: malformed: payload does not match version 1: json: cannot unmarshal number 2.0", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := Verify(testKey, tt.value)
			if err == nil {
				t.Fatalf("Verify accepted %+v", a)
			}
			if a != nil {
				t.Errorf("Verify returned an allocation with error %v", err)
			}
			if !errors.Is(err, tt.reason) {
				t.Errorf("error %q is not %v", err, tt.reason)
			}
			if !errors.Is(err, ErrRejected) {
				t.Errorf("error %q is not ErrRejected", err)
			}
			for _, other := range []error{ErrMalformed, ErrBadMAC, ErrVersion, ErrUnknownGPU, ErrReplay} {
				if other != tt.reason && errors.Is(err, other) {
					t.Errorf("error %q is also %v", err, other)
				}
			}
			if tt.prefix && !strings.HasPrefix(err.Error(), tt.msg) || !tt.prefix && err.Error() != tt.msg {
				t.Errorf("message\n got %q\nwant %q", err, tt.msg)
			}
		})
	}
}

func TestSentinels(t *testing.T) {
	sentinels := map[error]string{
		ErrMalformed:  "allocation rejected: malformed",
		ErrBadMAC:     "allocation rejected: bad MAC",
		ErrVersion:    "allocation rejected: unknown version",
		ErrUnknownGPU: "allocation rejected: unknown GPU",
		ErrReplay:     "allocation rejected: allocation ID bound to another pod",
	}
	for s, msg := range sentinels {
		if !errors.Is(s, ErrRejected) {
			t.Errorf("%v is not ErrRejected", s)
		}
		if s.Error() != msg {
			t.Errorf("sentinel message %q, want %q", s, msg)
		}
		for o := range sentinels {
			if o != s && errors.Is(s, o) {
				t.Errorf("%v is %v", s, o)
			}
		}
	}
	wrapped := fmt.Errorf("nri-vgpu: %w", &rejection{reason: ErrBadMAC, msg: "bad MAC"})
	if !errors.Is(wrapped, ErrBadMAC) || wrapped.Error() != "nri-vgpu: allocation rejected: bad MAC" {
		t.Errorf("wrapped rejection: %q", wrapped)
	}
}

func TestSignRejects(t *testing.T) {
	tests := []struct {
		name string
		a    *Allocation
		want string
	}{
		{"nil", nil, "sign allocation: nil allocation"},
		{"version 0", func() *Allocation { a := testAllocation(); a.V = 0; return a }(),
			"sign allocation: version 0, this build issues 1"},
		{"bad id", func() *Allocation { a := testAllocation(); a.ID = "x"; return a }(),
			`sign allocation: id "x" is not 32 lower-case hex characters`},
		{"no cores", func() *Allocation { a := testAllocation(); a.GPUs[1].Cores = 0; return a }(),
			"sign allocation: gpus[1] (" + testUUID1 + "): cores 0 outside 1..100"},
		{"cores_policy hard", func() *Allocation { a := testAllocation(); a.CoresPolicy = "hard"; return a }(),
			`sign allocation: cores_policy "hard": hard is written by leaving the field out`},
		{"cores_policy unknown", func() *Allocation { a := testAllocation(); a.CoresPolicy = "soft"; return a }(),
			`sign allocation: cores_policy "soft": want "burst" or no field (hard)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := Sign(testKey, tt.a)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("Sign = %q, %v; want error %q", v, err, tt.want)
			}
		})
	}
}

// TestSignLargest checks that the largest allocation Verify accepts can be
// signed within MaxSize.
func TestSignLargest(t *testing.T) {
	a := testAllocation()
	a.Issued = 1<<63 - 1
	a.CoresPolicy = limits.CoresPolicyBurst
	a.GPUs = nil
	for i := range limits.MaxLimitsGPUs {
		a.GPUs = append(a.GPUs, GPU{
			UUID:   fmt.Sprintf("%02d", i) + strings.Repeat("u", limits.MaxUUIDLen-2),
			Minor:  MaxMinor,
			Slices: 1<<63 - 1,
			Memory: 1<<64 - 1,
			Cores:  100,
		})
	}
	v, err := Sign(testKey, a)
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	if _, err := Verify(testKey, v); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	t.Logf("largest value: %d bytes", len(v))
}

func TestCheckGPUs(t *testing.T) {
	a := testAllocation()
	node := map[string]bool{testUUID0: true, testUUID1: true}
	if err := CheckGPUs(a, func(u string) bool { return node[u] }); err != nil {
		t.Fatalf("CheckGPUs with both GPUs present: %v", err)
	}
	delete(node, testUUID1)
	err := CheckGPUs(a, func(u string) bool { return node[u] })
	if !errors.Is(err, ErrUnknownGPU) || !errors.Is(err, ErrRejected) {
		t.Fatalf("CheckGPUs with a GPU missing: %v, want ErrUnknownGPU", err)
	}
	if want := "allocation rejected: unknown GPU " + testUUID1; err.Error() != want {
		t.Errorf("message %q, want %q", err, want)
	}
}

func TestNewAllocationID(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		id, err := NewID()
		if err != nil {
			t.Fatal(err)
		}
		if !isAllocationID(id) {
			t.Fatalf("NewID = %q: not 32 lower-case hex characters", id)
		}
		if seen[id] {
			t.Fatalf("NewID repeated %s", id)
		}
		seen[id] = true
	}
}

func BenchmarkSignVerify(b *testing.B) {
	a := testAllocation()
	for b.Loop() {
		v, err := Sign(testKey, a)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Verify(testKey, v); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyBadMAC(b *testing.B) {
	v, _ := Sign(testKey, testAllocation())
	other := testKey
	other[0] ^= 1
	for b.Loop() {
		if _, err := Verify(other, v); !errors.Is(err, ErrBadMAC) {
			b.Fatal(err)
		}
	}
}

func TestAllocationLimits(t *testing.T) {
	a := testAllocation()
	got := a.Limits("")
	want := &limits.LimitsFile{
		GPUs: []limits.GPULimit{
			{UUID: testUUID0, Memory: 8 * GiB, Cores: 50},
			{UUID: testUUID1, Memory: 1638 * limits.MiB, Cores: 10},
		},
		CoresPolicy: limits.CoresPolicyHard,
		LogLevel:    limits.LogLevelWarn,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("a.Limits(\"\") = %+v, want %+v", got, want)
	}
	got = a.Limits(limits.LogLevelInfo)
	if got.CoresPolicy != limits.CoresPolicyHard || got.LogLevel != limits.LogLevelInfo {
		t.Errorf("a.Limits(info) = %+v, want policy hard, level info", got)
	}
	if _, err := got.Marshal(); err != nil {
		t.Errorf("Marshal of the limits of a valid allocation: %v", err)
	}
}

// The cores policy signed into an allocation reaches the limits file the
// shim reads, as the cores.policy line.
func TestBurstAllocationLimits(t *testing.T) {
	a := testAllocation()
	a.GPUs = a.GPUs[:1]
	a.CoresPolicy = limits.CoresPolicyBurst
	data, err := a.Limits(limits.LogLevelDebug).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	want := `# written by nri-vgpu; read by libvgpu-shim.so
version=1
gpu.0.uuid=GPU-8e1c2a3b-0000-1111-2222-333344445555
gpu.0.memory=8589934592
gpu.0.cores=50
cores.policy=burst
log.level=debug
`
	if string(data) != want {
		t.Errorf("limits file of a burst allocation:\n%s\nwant:\n%s", data, want)
	}
}
