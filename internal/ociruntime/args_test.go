package ociruntime

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseArgs(t *testing.T) {
	const id = "a2fba5934a2e447f1a513088e8841cdf66caa93945ebbe6f5b7aef5961a7a471"
	tests := []struct {
		name string
		argv string
		want Args
	}{
		{
			name: "docker 20.10 create",
			argv: "--root /run/docker/runtime-runc/moby --log /b/log.json --log-format json create --bundle /b --pid-file /b/init.pid " + id,
			want: Args{Verb: "create", Root: "/run/docker/runtime-runc/moby", Log: "/b/log.json", LogFormat: "json", Bundle: "/b", ContainerID: id},
		},
		{
			name: "systemd cgroup and debug before the verb",
			argv: "--debug --systemd-cgroup --root /r create --bundle /b " + id,
			want: Args{Verb: "create", Root: "/r", Debug: true, Bundle: "/b", ContainerID: id},
		},
		{
			name: "flags with =",
			argv: "--root=/r --log=/l --log-format=text create --bundle=/b --pid-file=/p " + id,
			want: Args{Verb: "create", Root: "/r", Log: "/l", LogFormat: "text", Bundle: "/b", ContainerID: id},
		},
		{
			name: "short bundle flag",
			argv: "create -b /b " + id,
			want: Args{Verb: "create", Bundle: "/b", ContainerID: id},
		},
		{
			name: "short bundle flag with =",
			argv: "create -b=/b " + id,
			want: Args{Verb: "create", Bundle: "/b", ContainerID: id},
		},
		{
			name: "single-dash global flags (Go flag syntax)",
			argv: "-root /r -log /l create -bundle /b " + id,
			want: Args{Verb: "create", Root: "/r", Log: "/l", Bundle: "/b", ContainerID: id},
		},
		{
			name: "bundle defaults to the working directory",
			argv: "create --pid-file /p " + id,
			want: Args{Verb: "create", ContainerID: id},
		},
		{
			name: "value flags and booleans around the bundle",
			argv: "create --console-socket /s.sock --no-pivot --bundle /b --preserve-fds 2 --no-new-keyring " + id,
			want: Args{Verb: "create", Bundle: "/b", ContainerID: id},
		},
		{
			name: "a value that looks like a verb",
			argv: "--log create --root delete create --bundle /b " + id,
			want: Args{Verb: "create", Root: "delete", Log: "create", Bundle: "/b", ContainerID: id},
		},
		{
			name: "delete --force",
			argv: "--root /r delete --force " + id,
			want: Args{Verb: "delete", Root: "/r", ContainerID: id},
		},
		{
			name: "other verbs",
			argv: "--root /r start " + id,
			want: Args{Verb: "start", Root: "/r", ContainerID: id},
		},
		{
			name: "version flag, no verb",
			argv: "--version",
			want: Args{},
		},
		{
			name: "no arguments",
			argv: "",
			want: Args{},
		},
		{
			name: "global value flag without its value",
			argv: "--root",
			want: Args{},
		},
		{
			name: "create without an ID",
			argv: "create --bundle /b",
			want: Args{Verb: "create", Bundle: "/b"},
		},
		{
			name: "-- ends the global flags",
			argv: "--debug -- create --bundle /b " + id,
			want: Args{Verb: "create", Debug: true, Bundle: "/b", ContainerID: id},
		},
		{
			name: "--debug=false",
			argv: "--debug=false create " + id,
			want: Args{Verb: "create", ContainerID: id},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			argv := append([]string{"nri-vgpu-runtime"}, strings.Fields(tt.argv)...)
			got := ParseArgs(argv)
			want := tt.want
			want.Argv = argv
			if !reflect.DeepEqual(*got, want) {
				t.Errorf("ParseArgs(%q)\n got %+v\nwant %+v", tt.argv, *got, want)
			}
		})
	}
}
