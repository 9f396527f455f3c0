package harness

import (
	"flag"
	"io"
	"path/filepath"
	"strings"
	"testing"
)

func TestChainFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    ChainFlags
		wantErr string
	}{
		{name: "defaults", want: ChainFlags{BinDir: "/src/bin", ShimBuild: "/src/shim/build", ContainerdBin: DefaultBinDir(), Runc: DefaultRunc()}},
		{name: "all set", args: []string{"-bin", "/b", "-shim", "/s", "-containerd-bin", "/c", "-runc", "/r"},
			want: ChainFlags{BinDir: "/b", ShimBuild: "/s", ContainerdBin: "/c", Runc: "/r"}},
		{name: "argument left over", args: []string{"-bin", "/b", "extra"}, wantErr: `unexpected arguments ["extra"]`},
		{name: "unknown flag", args: []string{"-nope"}, wantErr: "-nope"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c ChainFlags
			fs := flag.NewFlagSet("demo", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			c.Register(fs, filepath.FromSlash("/src"))
			err := ParseAll(fs, tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseAll(%q) = %v, want an error holding %q", tt.args, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c != tt.want {
				t.Errorf("flags %+v, want %+v", c, tt.want)
			}
		})
	}
}
