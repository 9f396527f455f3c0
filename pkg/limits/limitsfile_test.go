package limits

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

const (
	testUUID0 = "GPU-8e1c2a3b-0000-1111-2222-333344445555"
	testUUID1 = "GPU-0b6a9f2e-aaaa-bbbb-cccc-ddddeeeeffff"
)

func testLimits() *LimitsFile {
	return &LimitsFile{
		GPUs: []GPULimit{
			{UUID: testUUID0, Memory: 8 * GiB, Cores: 50},
			{UUID: testUUID1, Memory: 0, Cores: 100},
		},
		CoresPolicy: CoresPolicyBurst,
		LogLevel:    LogLevelDebug,
	}
}

const testLimitsText = `# written by nri-vgpu; read by libvgpu-shim.so
version=1
gpu.0.uuid=GPU-8e1c2a3b-0000-1111-2222-333344445555
gpu.0.memory=8589934592
gpu.0.cores=50
gpu.1.uuid=GPU-0b6a9f2e-aaaa-bbbb-cccc-ddddeeeeffff
gpu.1.memory=0
gpu.1.cores=100
cores.policy=burst
log.level=debug
`

func TestMarshal(t *testing.T) {
	got, err := testLimits().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != testLimitsText {
		t.Errorf("Marshal:\n%s\nwant:\n%s", got, testLimitsText)
	}
	f, err := ParseLimits(got)
	if err != nil {
		t.Fatalf("ParseLimits(Marshal()): %v", err)
	}
	if !reflect.DeepEqual(f, testLimits()) {
		t.Errorf("ParseLimits(Marshal(f)) = %+v, want %+v", f, testLimits())
	}

	// Defaults are written out.
	d := &LimitsFile{GPUs: []GPULimit{{UUID: "GPU-a", Memory: 1, Cores: 1}}}
	got, err = d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	want := "# written by nri-vgpu; read by libvgpu-shim.so\nversion=1\ngpu.0.uuid=GPU-a\ngpu.0.memory=1\ngpu.0.cores=1\ncores.policy=hard\nlog.level=warn\n"
	if string(got) != want {
		t.Errorf("Marshal with defaults:\n%s\nwant:\n%s", got, want)
	}
}

func TestMarshalLedgerShards(t *testing.T) {
	f := &LimitsFile{GPUs: []GPULimit{{UUID: "GPU-a", Memory: 1, Cores: 1}}, LedgerShards: LedgerShards}
	got, err := f.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	want := "# written by nri-vgpu; read by libvgpu-shim.so\nversion=1\ngpu.0.uuid=GPU-a\ngpu.0.memory=1\ngpu.0.cores=1\ncores.policy=hard\nlog.level=warn\nledger.shards=64\n"
	if string(got) != want {
		t.Errorf("Marshal with ledger shards:\n%s\nwant:\n%s", got, want)
	}
	back, err := ParseLimits(got)
	if err != nil {
		t.Fatalf("ParseLimits(Marshal()): %v", err)
	}
	if back.LedgerShards != 64 {
		t.Errorf("ParseLimits(Marshal()).LedgerShards = %d, want 64", back.LedgerShards)
	}
}

func TestMarshalLargest(t *testing.T) {
	f := &LimitsFile{CoresPolicy: CoresPolicyBurst, LogLevel: LogLevelDebug, LedgerShards: MaxLedgerShards}
	for i := range MaxLimitsGPUs {
		f.GPUs = append(f.GPUs, GPULimit{UUID: fmt.Sprintf("%02d", i) + strings.Repeat("u", MaxUUIDLen-2), Memory: 1<<64 - 1, Cores: 100})
	}
	data, err := f.Marshal()
	if err != nil {
		t.Fatalf("Marshal of the largest limits file: %v", err)
	}
	if _, err := ParseLimits(data); err != nil {
		t.Fatalf("ParseLimits: %v", err)
	}
	t.Logf("largest limits file: %d bytes", len(data))
}

func TestMarshalRejects(t *testing.T) {
	seventeen := &LimitsFile{}
	for i := range MaxLimitsGPUs + 1 {
		seventeen.GPUs = append(seventeen.GPUs, GPULimit{UUID: fmt.Sprintf("GPU-%d", i), Cores: 1})
	}
	mod := func(m func(f *LimitsFile)) *LimitsFile { f := testLimits(); m(f); return f }
	tests := []struct {
		name string
		f    *LimitsFile
		want string
	}{
		{"no GPUs", &LimitsFile{}, "limits file: no GPUs"},
		{"17 GPUs", seventeen, "limits file: 17 GPUs, at most 16"},
		{"empty uuid", mod(func(f *LimitsFile) { f.GPUs[1].UUID = "" }), "limits file: gpu 1: empty GPU UUID"},
		{"uuid with a comment", mod(func(f *LimitsFile) { f.GPUs[0].UUID = "GPU-1#x" }),
			`limits file: gpu 0: GPU UUID "GPU-1#x": character '#' at offset 5 is not one of A-Z a-z 0-9 - _ . : /`},
		{"uuid with a newline", mod(func(f *LimitsFile) { f.GPUs[0].UUID = "GPU-1\nlog.level=debug" }),
			`limits file: gpu 0: GPU UUID "GPU-1\nlog.level=debug": character '\n' at offset 5 is not one of A-Z a-z 0-9 - _ . : /`},
		{"duplicate uuid", mod(func(f *LimitsFile) { f.GPUs[1].UUID = testUUID0 }), "limits file: gpu 1: GPU " + testUUID0 + " is also gpu 0"},
		{"cores 0", mod(func(f *LimitsFile) { f.GPUs[1].Cores = 0 }), "limits file: gpu 1 (" + testUUID1 + "): cores 0 outside 1..100"},
		{"cores 101", mod(func(f *LimitsFile) { f.GPUs[0].Cores = 101 }), "limits file: gpu 0 (" + testUUID0 + "): cores 101 outside 1..100"},
		{"policy", mod(func(f *LimitsFile) { f.CoresPolicy = "soft" }), `limits file: cores policy "soft": want hard or burst`},
		{"log level", mod(func(f *LimitsFile) { f.LogLevel = "trace" }), `limits file: log level "trace": want error, warn, info or debug`},
		{"ledger shards 257", mod(func(f *LimitsFile) { f.LedgerShards = 257 }), "limits file: ledger shards 257 outside 1..256 (0: none)"},
		{"ledger shards -1", mod(func(f *LimitsFile) { f.LedgerShards = -1 }), "limits file: ledger shards -1 outside 1..256 (0: none)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data, err := tt.f.Marshal()
			if err == nil || err.Error() != tt.want {
				t.Fatalf("Marshal = %q, %v; want error %q", data, err, tt.want)
			}
		})
	}
}

func TestParseLimitsAccepts(t *testing.T) {
	one := func(uuid string, mem uint64, cores int) *LimitsFile {
		return &LimitsFile{GPUs: []GPULimit{{uuid, mem, cores}}, CoresPolicy: CoresPolicyHard, LogLevel: LogLevelWarn}
	}
	shards := func(f *LimitsFile, k int) *LimitsFile { f.LedgerShards = k; return f }
	tests := []struct {
		name, text string
		want       *LimitsFile
	}{
		{"canonical", testLimitsText, testLimits()},
		{"defaults", "version=1\ngpu.0.uuid=GPU-a\ngpu.0.memory=1\ngpu.0.cores=1\n", one("GPU-a", 1, 1)},
		{"no final newline", "version=1\ngpu.0.uuid=GPU-a\ngpu.0.memory=1\ngpu.0.cores=1", one("GPU-a", 1, 1)},
		{"comments, blank lines and spaces",
			"# limits\n\n  # indented comment\nversion = 1   # format\n\t\ngpu.0.uuid\t=\tGPU-a # the GPU\n gpu.0.memory= 0 \ngpu.0.cores =100#\n#\n",
			one("GPU-a", 0, 100)},
		{"contract example", "version=1\ngpu.0.uuid=GPU-8e1c\ngpu.0.memory=8589934592      # bytes; 0 = no memory limit on this GPU\n" +
			"gpu.0.cores=50               # percent of SM time, 1..100; 100 = no throttling\n" +
			"cores.policy=hard            # hard | burst (burst: may exceed when the GPU is otherwise idle)\nlog.level=warn\n",
			one("GPU-8e1c", 8*GiB, 50)},
		{"keys in any order after version",
			"version=1\nlog.level=error\ngpu.1.cores=2\ngpu.0.memory=5\ngpu.1.uuid=GPU-b\ngpu.0.uuid=GPU-a\ncores.policy=burst\ngpu.1.memory=6\ngpu.0.cores=1\n",
			&LimitsFile{GPUs: []GPULimit{{"GPU-a", 5, 1}, {"GPU-b", 6, 2}}, CoresPolicy: CoresPolicyBurst, LogLevel: LogLevelError}},
		{"largest memory", "version=1\ngpu.0.uuid=GPU-a\ngpu.0.memory=18446744073709551615\ngpu.0.cores=1\n", one("GPU-a", 1<<64-1, 1)},
		{"comment with any bytes", "version=1 # é \x80 =#=\ngpu.0.uuid=GPU-a\ngpu.0.memory=1\ngpu.0.cores=1\n", one("GPU-a", 1, 1)},
		{"one ledger shard", "version=1\nledger.shards=1\ngpu.0.uuid=GPU-a\ngpu.0.memory=1\ngpu.0.cores=1\n", shards(one("GPU-a", 1, 1), 1)},
		{"most ledger shards", "version=1\ngpu.0.uuid=GPU-a\ngpu.0.memory=1\ngpu.0.cores=1\nledger.shards = 256 # K\n", shards(one("GPU-a", 1, 1), 256)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := ParseLimits([]byte(tt.text))
			if err != nil {
				t.Fatalf("ParseLimits: %v", err)
			}
			if !reflect.DeepEqual(f, tt.want) {
				t.Errorf("ParseLimits = %+v, want %+v", f, tt.want)
			}
		})
	}
}

func TestParseLimitsRejects(t *testing.T) {
	const head = "version=1\n"
	const gpu0 = "gpu.0.uuid=GPU-a\ngpu.0.memory=1\ngpu.0.cores=1\n"
	tests := []struct {
		name, text, want string
	}{
		{"too big", head + gpu0 + "#" + strings.Repeat("x", MaxLimitsSize), "4153 bytes, at most 4096"},
		{"empty", "", "no version=1 line"},
		{"only comments", "# nothing\n\n", "no version=1 line"},
		{"version missing", gpu0, "line 1: the first key must be version, got gpu.0.uuid"},
		{"version after a key", "log.level=warn\n" + head + gpu0, "line 1: the first key must be version, got log.level"},
		{"version 2", "version=2\n" + gpu0, `line 1: unsupported version "2", want 1`},
		{"version 01", "version=01\n" + gpu0, `line 1: unsupported version "01", want 1`},
		{"version twice", head + gpu0 + head, "line 5: duplicate key version (first on line 1)"},
		{"no GPUs", head + "cores.policy=hard\n", "no GPUs"},
		{"no equals", head + "gpu.0.uuid GPU-a\n", `line 2: "gpu.0.uuid GPU-a" is not key=value`},
		{"empty key", head + "=x\n", `line 2: unknown key ""`},
		{"unknown key", head + gpu0 + "memory=1\n", `line 5: unknown key "memory"`},
		{"unknown gpu field", head + gpu0 + "gpu.0.minor=1\n", `line 5: unknown key "gpu.0.minor"`},
		{"gpu without field", head + "gpu.0=x\n", `line 2: unknown key "gpu.0"`},
		{"key case", head + "GPU.0.uuid=GPU-a\n", `line 2: unknown key "GPU.0.uuid"`},
		{"space inside key", head + "gpu.0 .uuid=GPU-a\n", `line 2: key gpu.0 .uuid: GPU index: "0 " is not a non-negative decimal integer`},
		{"index not a number", head + "gpu.x.uuid=GPU-a\n", `line 2: key gpu.x.uuid: GPU index: "x" is not a non-negative decimal integer`},
		{"index with leading zero", head + "gpu.00.uuid=GPU-a\n", `line 2: key gpu.00.uuid: GPU index: "00" has a leading zero`},
		{"negative index", head + "gpu.-1.uuid=GPU-a\n", `line 2: key gpu.-1.uuid: GPU index: "-1" is not a non-negative decimal integer`},
		{"index 16", head + "gpu.16.uuid=GPU-a\n", "line 2: key gpu.16.uuid: GPU index 16, at most 16 GPUs"},
		{"huge index", head + "gpu.99999999999999999999.uuid=GPU-a\n", `line 2: key gpu.99999999999999999999.uuid: GPU index: "99999999999999999999" out of range`},
		{"duplicate key", head + gpu0 + "gpu.0.cores=2\n", "line 5: duplicate key gpu.0.cores (first on line 4)"},
		{"duplicate key with spaces", head + gpu0 + " gpu.0.cores = 1\n", "line 5: duplicate key gpu.0.cores (first on line 4)"},
		{"duplicate policy", head + gpu0 + "cores.policy=hard\ncores.policy=burst\n", "line 6: duplicate key cores.policy (first on line 5)"},
		{"missing uuid", head + "gpu.0.memory=1\ngpu.0.cores=1\n", "line 2: gpu.0 has no uuid"},
		{"missing uuid of gpu 1", head + gpu0 + "gpu.1.cores=1\ngpu.1.memory=1\n", "line 5: gpu.1 has no uuid"},
		{"missing memory", head + "gpu.0.uuid=GPU-a\ngpu.0.cores=1\n", "line 2: gpu.0 has no memory"},
		{"missing cores", head + "gpu.0.uuid=GPU-a\ngpu.0.memory=1\n", "line 2: gpu.0 has no cores"},
		{"gap", head + gpu0 + "gpu.2.uuid=GPU-c\ngpu.2.memory=1\ngpu.2.cores=1\n",
			"no keys for gpu.1, but gpu.2 exists: GPU indices must be 0..2 without gaps"},
		{"no gpu 0", head + "gpu.1.uuid=GPU-c\ngpu.1.memory=1\ngpu.1.cores=1\n",
			"no keys for gpu.0, but gpu.1 exists: GPU indices must be 0..1 without gaps"},
		{"duplicate uuid", head + gpu0 + "gpu.1.uuid=GPU-a\ngpu.1.memory=1\ngpu.1.cores=1\n",
			"line 5: gpu.1.uuid GPU-a is also gpu.0.uuid (line 2)"},
		{"empty uuid", head + "gpu.0.uuid=\n", "line 2: gpu.0.uuid: empty GPU UUID"},
		{"uuid with a space", head + "gpu.0.uuid=GPU a\n", `line 2: gpu.0.uuid: GPU UUID "GPU a": character ' ' at offset 3 is not one of A-Z a-z 0-9 - _ . : /`},
		{"uuid with equals", head + "gpu.0.uuid=GPU=a\n", `line 2: gpu.0.uuid: GPU UUID "GPU=a": character '=' at offset 3 is not one of A-Z a-z 0-9 - _ . : /`},
		{"memory with unit", head + "gpu.0.memory=1GiB\n", `line 2: gpu.0.memory: "1GiB" is not a non-negative decimal integer`},
		{"negative memory", head + "gpu.0.memory=-1\n", `line 2: gpu.0.memory: "-1" is not a non-negative decimal integer`},
		{"memory with sign", head + "gpu.0.memory=+1\n", `line 2: gpu.0.memory: "+1" is not a non-negative decimal integer`},
		{"memory with leading zero", head + "gpu.0.memory=010\n", `line 2: gpu.0.memory: "010" has a leading zero`},
		{"memory overflow", head + "gpu.0.memory=18446744073709551616\n", `line 2: gpu.0.memory: "18446744073709551616" out of range`},
		{"empty memory", head + "gpu.0.memory=\n", "line 2: gpu.0.memory: empty number"},
		{"cores 0", head + "gpu.0.cores=0\n", `line 2: gpu.0.cores: "0" is not an integer in 1..100`},
		{"cores 101", head + "gpu.0.cores=101\n", `line 2: gpu.0.cores: "101" is not an integer in 1..100`},
		{"cores percent", head + "gpu.0.cores=50%\n", `line 2: gpu.0.cores: "50%" is not an integer in 1..100`},
		{"cores leading zero", head + "gpu.0.cores=050\n", `line 2: gpu.0.cores: "050" is not an integer in 1..100`},
		{"policy", head + gpu0 + "cores.policy=soft\n", `line 5: cores.policy "soft": want hard or burst`},
		{"policy case", head + gpu0 + "cores.policy=Hard\n", `line 5: cores.policy "Hard": want hard or burst`},
		{"log level", head + gpu0 + "log.level=trace\n", `line 5: log.level "trace": want error, warn, info or debug`},
		{"ledger shards 0", head + gpu0 + "ledger.shards=0\n", `line 5: ledger.shards: "0" is not an integer in 1..256`},
		{"ledger shards 257", head + gpu0 + "ledger.shards=257\n", `line 5: ledger.shards: "257" is not an integer in 1..256`},
		{"ledger shards empty", head + gpu0 + "ledger.shards=\n", `line 5: ledger.shards: "" is not an integer in 1..256`},
		{"ledger shards leading zero", head + gpu0 + "ledger.shards=064\n", `line 5: ledger.shards: "064" is not an integer in 1..256`},
		{"ledger shards signed", head + gpu0 + "ledger.shards=+64\n", `line 5: ledger.shards: "+64" is not an integer in 1..256`},
		{"ledger shards huge", head + "ledger.shards=99999999999999999999\n" + gpu0, `line 2: ledger.shards: "99999999999999999999" is not an integer in 1..256`},
		{"ledger shards twice", head + gpu0 + "ledger.shards=64\nledger.shards=64\n", "line 6: duplicate key ledger.shards (first on line 5)"},
		{"ledger key case", head + gpu0 + "Ledger.shards=64\n", `line 5: unknown key "Ledger.shards"`},
		{"CRLF", "version=1\r\n" + gpu0, `line 1: control character '\r'`},
		{"NUL", head + "gpu.0.uuid=GPU-a\x00\n", `line 2: control character '\x00'`},
		{"NUL in a comment", head + "# \x00\n", `line 2: control character '\x00'`},
		{"DEL", head + "\x7f\n", `line 2: control character '\x7f'`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := ParseLimits([]byte(tt.text))
			if err == nil || err.Error() != tt.want {
				t.Fatalf("ParseLimits = %+v, %v; want error %q", f, err, tt.want)
			}
		})
	}
}
