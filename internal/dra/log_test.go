package dra

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// The claim's name and UID reach every line prepare logs, through the
// logger the request's context carries.
func TestPrepareLogsTheClaim(t *testing.T) {
	d, _ := newDriver(t)
	var logs bytes.Buffer
	d.log = slog.New(slog.NewTextHandler(&logs, nil))
	if r := prepareOne(t, d, claim(uid1, []string{"p1"}, result("gpu", devA, "4Gi", ""))); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := prepareOne(t, d, claim(uid2, []string{"p2"}, result("gpu", "no-such-device", "4Gi", ""))); r.Err == nil {
		t.Fatal("a claim of an unknown device was prepared")
	}
	for _, want := range []string{
		`msg="claim prepared" claim=ml/claim-1111 uid=` + uid1 + ` gpus=`,
		`msg="cannot prepare claim" claim=ml/claim-2222 uid=` + uid2 + ` err=`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}
