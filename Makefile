# nri-vgpu — build, test, lint, bench, demo.
#
#   make demo    the whole chain on simulated GPUs (README)
#   make test    everything the project checks, installing what it needs
#
SHELL         := /bin/bash
GO            ?= go
MODULE        := github.com/nri-vgpu/nri-vgpu
BIN           := $(CURDIR)/bin
TOOLS         := $(CURDIR)/.tools
VERSION       ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# Position-independent, with a GNU build ID and the debug information, which
# hack/packages.sh splits into the debug packages. Not -bindnow: go-nvml
# leaves the NVML functions to lazy binding (the library is opened at run
# time), and binding them at start fails where there is no NVML.
GOFLAGS_BUILD := -trimpath -buildmode=pie -ldflags "-B gobuildid -X $(MODULE)/internal/version.Version=$(VERSION)"
# The pin hook (cmd/nri-vgpu-hook) is run by runc on the host, whose C
# library may be older than the build's or absent: statically linked, and
# not a PIE, which Go's linker makes dynamically linked (an ELF interpreter
# does its relocations). It also runs NVIDIA's CDI hooks (internal/cdihook),
# whose update-ldcache command imports go-nvml, which needs cgo: so cgo with
# the C library linked in (-static; the hook never opens NVML, whose
# dlopen is what the linker warns about), and Go's own resolver and user
# lookup (netgo, osusergo) rather than glibc's NSS, which a static binary
# cannot load. cmd/nri-vgpu-hook's test builds it with this rule and fails
# if it has an interpreter or needs a library.
GOFLAGS_STATIC := -trimpath -tags netgo,osusergo -ldflags "-B gobuildid -linkmode external -extldflags -static"
FUZZTIME      ?= 5s

STATICCHECK_VERSION := v0.8.2
DEADCODE_VERSION    := v0.52.0

COMMANDS := nri-vgpu nri-vgpu-device-plugin nri-vgpu-runtime nri-vgpu-dra-driver nri-vgpu-hook kubectl-nri_vgpu

.PHONY: all build shim deps test test-go test-shim test-e2e test-gpu-check test-docker test-packages test-deps fuzz lint bench demo demo-cluster e2e packages gpu-bundle clean

all: build

## build: the Go binaries in bin/ and the shim in shim/build/
build: $(addprefix $(BIN)/,$(COMMANDS)) shim

$(BIN)/nri-vgpu: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/nri-vgpu
$(BIN)/nri-vgpu-device-plugin: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/device-plugin
$(BIN)/nri-vgpu-runtime: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/nri-vgpu-runtime
$(BIN)/nri-vgpu-dra-driver: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/dra-driver
# kubectl nri-vgpu runs on operators' machines, not on the nodes: without
# cgo and not a PIE, hence statically linked, so that it needs neither a
# particular C library nor a dynamic loader (Alpine has none at glibc's path).
$(BIN)/kubectl-nri_vgpu: FORCE
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-B gobuildid -X $(MODULE)/internal/version.Version=$(VERSION)" -o $@ ./cmd/kubectl-nri_vgpu
$(BIN)/nri-vgpu-hook: FORCE
	CGO_ENABLED=1 $(GO) build $(GOFLAGS_STATIC) -o $@ ./cmd/nri-vgpu-hook
FORCE:

shim:
	$(MAKE) -C shim

## deps: install the system packages the build and tests need (Debian)
deps:
	hack/deps.sh

## test: lint, unit tests with -race, C tests, short fuzzing, end to end on
## real containerd and dockerd, the node packages installed into fresh roots,
## hack/deps.sh on fresh roots
test: deps lint test-go test-shim fuzz test-e2e test-gpu-check test-docker test-packages test-deps
	@echo "make test: all checks passed"

## test-go: the Go unit tests; internal/metrics checks a scrape with
## Debian's pinned promtool (hack/prometheus.sh), passed as PROMTOOL
test-go:
	promtool=$$(hack/prometheus.sh promtool) && PROMTOOL=$$promtool $(GO) test -race -count=1 ./...

test-shim:
	$(MAKE) -C shim test

## test-e2e (alias e2e): real containerd + runc + NRI, with the kubelet
## simulator and with a real single-node Kubernetes cluster scraped by a real
## Prometheus (root; installs containerd, runc, busybox-static, the CNI
## plugins, builds Kubernetes, etcd and the pinned helm, and unpacks Debian's
## pinned prometheus into caches when missing)
test-e2e e2e: build
	hack/e2e-deps.sh >/dev/null
	hack/k8s-deps.sh >/dev/null
	hack/helm.sh bin >/dev/null
	hack/prometheus.sh >/dev/null
	NRI_VGPU_E2E_PROMETHEUS="$$(hack/prometheus.sh prometheus)" $(GO) test -tags e2e -count=1 -timeout 30m ./test/e2e/...

## gpu-bundle: everything the GPU check runs, in gpu-bundle/ (one xz
## tarball; hack/gpu-bundle.sh): containerd, a static runc, the binaries,
## the shim, gpu-check. Prints its size; fails if it and the tracked tree
## reach 48 MiB
gpu-bundle:
	VERSION=$(VERSION) hack/gpu-bundle.sh

## test-gpu-check: the GPU check of a lent GPU machine (docs/validation.md),
## here on the fake driver: the bundle unpacked and run by hack/gpu-check.sh
test-gpu-check: gpu-bundle
	@logs=$$(mktemp -d /tmp/nri-vgpu-gpu-check-logs.XXXXXX) && \
	  hack/gpu-check.sh --simulated --logs "$$logs" || { rc=$$?; echo "logs kept in $$logs"; exit $$rc; }; \
	  rm -rf "$$logs"

## test-docker: nri-vgpu-runtime under a real dockerd (root; installs docker.io)
test-docker: build
	$(GO) test -tags e2e -count=1 -timeout 10m ./test/docker/

## packages: the node's deb and rpm in dist/ (nfpm, pinned in hack/packages.sh),
## and kubectl nri-vgpu's release archive
packages: build
	hack/packages.sh

## test-packages: lint the packages (lintian, rpmlint) and install them into
## fresh roots; lint the chart and check the rendered manifests
test-packages: packages
	test/packaging/lint.sh dist
	test/packaging/packages.sh dist
	hack/helm.sh check

## test-deps: hack/deps.sh makes fresh Debian roots (one with clang but not
## its fuzzer runtime) build the shim's fuzz target
test-deps:
	test/packaging/deps.sh

## fuzz: run every Go fuzz target for FUZZTIME
fuzz:
	FUZZTIME=$(FUZZTIME) hack/fuzz.sh

## lint: gofmt, go vet, staticcheck, deadcode (pinned)
lint: $(TOOLS)/staticcheck $(TOOLS)/deadcode
	@out=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags e2e ./test/...
	$(TOOLS)/staticcheck ./...
	$(TOOLS)/staticcheck -tags e2e ./test/...
	@# Functions that neither the binaries nor any test reach.
	@out=$$($(TOOLS)/deadcode -test -tags e2e ./...) || exit 1; \
	  if [ -n "$$out" ]; then echo "unreachable functions (deadcode):"; echo "$$out"; exit 1; fi

$(TOOLS)/staticcheck:
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

$(TOOLS)/deadcode:
	GOBIN=$(TOOLS) $(GO) install golang.org/x/tools/cmd/deadcode@$(DEADCODE_VERSION)

## bench: Go and shim benchmarks
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
	$(MAKE) -C shim bench

## demo: the whole chain on simulated GPUs
## demo: the whole chain on simulated GPUs (root; docs/demo.md)
demo: build
	@bin=$$(hack/e2e-deps.sh v2.4.2) && $(GO) run ./test/e2e/cmd/demo --containerd-bin "$$bin"

## demo-cluster: the demo's story as kubectl steps against a real single-node
## Kubernetes (root; builds Kubernetes into the cache the first time)
demo-cluster: build
	@bin=$$(hack/e2e-deps.sh v2.4.2) && kbin=$$(hack/k8s-deps.sh) && \
	  $(GO) run ./test/e2e/cmd/demo-cluster --containerd-bin "$$bin" --kubernetes-bin "$$kbin"

clean:
	rm -rf $(BIN) $(TOOLS) dist gpu-bundle
	$(MAKE) -C shim clean
