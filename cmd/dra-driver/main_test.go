package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  string // NODE_NAME
		kube string // KUBECONFIG
		code int
		want string
	}{
		{"no node name", []string{"--kubeconfig", "/nonexistent"}, "", "", 2, "the node name is required"},
		{"stray argument", []string{"--node-name", "n", "extra"}, "", "", 2, `unexpected arguments ["extra"]`},
		{"version", []string{"--version"}, "", "", 0, "nri-vgpu-dra-driver "},
		{"bad config", []string{"--node-name", "n", "--config", "/nonexistent/config.toml"}, "", "", 1, "cannot load the configuration"},
		{"node name from the environment, bad kubeconfig", []string{"--config", "/dev/null", "--kubeconfig", "/nonexistent"}, "n", "", 1, "cannot configure the API server client"},
		// As the packaged unit starts it: both from the environment.
		{"kubeconfig from the environment", []string{"--config", "/dev/null"}, "n", "/nonexistent/kubelet.conf", 1, "/nonexistent/kubelet.conf"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("NODE_NAME", tt.env)
			t.Setenv("KUBECONFIG", tt.kube)
			var stderr bytes.Buffer
			code := run(context.Background(), tt.args, &stderr, nil)
			if code != tt.code || !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("run(%q) = %d, stderr %q; want %d and %q", tt.args, code, stderr.String(), tt.code, tt.want)
			}
		})
	}
}
