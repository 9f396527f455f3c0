package allocation

import (
	"errors"
	"strings"
	"testing"
)

// FuzzVerify feeds arbitrary annotation values to Verify. It must never
// panic, every error must be a rejection, and whatever it accepts must be
// exactly what Sign makes of the result: one allocation, one value.
func FuzzVerify(f *testing.F) {
	valid, err := Sign(testKey, testAllocation())
	if err != nil {
		f.Fatal(err)
	}
	payload, mac, _ := strings.Cut(valid, ".")
	for _, seed := range []string{
		valid,
		"",
		".",
		"..",
		payload,
		payload + ".",
		"." + mac,
		valid + ".",
		valid + "=",
		valid + "\n",
		payload + "." + mac[:42],
		strings.ToUpper(payload) + "." + mac,
		signRaw(testKey, "null"),
		signRaw(testKey, "{}"),
		signRaw(testKey, `{"v":2}`),
		signRaw(testKey, `{"v":1}`),
		signRaw(testKey, validPayload()+" "),
		signModified(func(a *Allocation) { a.GPUs[0].Cores = 0 }),
		signModified(func(a *Allocation) { a.GPUs = a.GPUs[:1] }),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		a, err := Verify(testKey, value)
		if err != nil {
			if a != nil {
				t.Fatalf("Verify returned an allocation and error %v", err)
			}
			assertRejected(t, err)
			return
		}
		again, err := Sign(testKey, a)
		if err != nil {
			t.Fatalf("Verify accepted %q but Sign refuses its allocation: %v", value, err)
		}
		if again != value {
			t.Fatalf("Verify accepted %q, which Sign writes as %q", value, again)
		}
	})
}

// FuzzVerifySignedPayload signs arbitrary payload bytes, so that fuzzing
// reaches the JSON and value checks behind the MAC, which FuzzVerify can
// only reach from its seeds.
func FuzzVerifySignedPayload(f *testing.F) {
	for _, seed := range []string{
		validPayload(),
		"",
		"null",
		"[]",
		"{}",
		`{"v":1}`,
		`{"v":2,"x":1}`,
		`{"v":"1"}`,
		`{"v":1e0}`,
		`{"V":1}`,
		strings.Replace(validPayload(), `"v":1,`, `"v":1,"v":1,`, 1),
		strings.TrimSuffix(validPayload(), "}") + `,"cores_policy":"burst"}`,
		strings.TrimSuffix(validPayload(), "}") + `,"cores_policy":"hard"}`,
		strings.Replace(validPayload(), `"slices":2`, `"slices":-2`, 1),
		strings.Replace(validPayload(), `"memory":8589934592`, `"memory":18446744073709551616`, 1),
		strings.Replace(validPayload(), `GPU-8e1c`, `GPU-\u00e9`, 1),
		strings.Replace(validPayload(), `GPU-8e1c`, "GPU-\xff", 1),
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		value := encode(testKey, payload)
		a, err := Verify(testKey, value)
		if err != nil {
			if a != nil {
				t.Fatalf("Verify returned an allocation and error %v", err)
			}
			assertRejected(t, err)
			return
		}
		again, err := Sign(testKey, a)
		if err != nil {
			t.Fatalf("Verify accepted payload %q but Sign refuses its allocation: %v", payload, err)
		}
		if again != value {
			t.Fatalf("Verify accepted payload %q, which Sign writes as %q", payload, again)
		}
	})
}

func assertRejected(t *testing.T, err error) {
	t.Helper()
	if !strings.HasPrefix(err.Error(), "allocation rejected: ") {
		t.Fatalf("error %q does not start with %q", err, "allocation rejected: ")
	}
	n := 0
	for _, r := range []error{ErrMalformed, ErrBadMAC, ErrVersion} {
		if errors.Is(err, r) {
			n++
		}
	}
	if n != 1 || !errors.Is(err, ErrRejected) {
		t.Fatalf("error %q: not exactly one of the reasons Verify gives", err)
	}
}
