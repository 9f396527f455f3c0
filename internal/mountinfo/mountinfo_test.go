package mountinfo

import "testing"

func TestUnescapeMountPath(t *testing.T) {
	tests := map[string]string{
		`/tmp/a`:           "/tmp/a",
		`/tmp/with\040sp`:  "/tmp/with sp",
		`/tmp/tab\011x`:    "/tmp/tab\tx",
		`/tmp/back\134sl`:  `/tmp/back\sl`,
		`/tmp/trailing\04`: `/tmp/trailing\04`,
	}
	for in, want := range tests {
		if got := unescapeMountPath(in); got != want {
			t.Errorf("unescapeMountPath(%q) = %q, want %q", in, got, want)
		}
	}
}
