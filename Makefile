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
GOFLAGS_BUILD := -trimpath -ldflags "-s -w -X $(MODULE)/internal/version.Version=$(VERSION)"
FUZZTIME      ?= 5s

STATICCHECK_VERSION := v0.8.2

COMMANDS := nri-vgpu nri-vgpu-device-plugin nri-vgpu-runtime

.PHONY: all build deps test test-go test-shim fuzz lint bench demo e2e clean

all: build

## build: the Go binaries in bin/ and the shim in shim/build/
build: $(addprefix $(BIN)/,$(COMMANDS)) shim

$(BIN)/nri-vgpu: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/nri-vgpu
$(BIN)/nri-vgpu-device-plugin: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/device-plugin
$(BIN)/nri-vgpu-runtime: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/nri-vgpu-runtime
FORCE:

shim:
	$(MAKE) -C shim

## deps: install the system packages the build and tests need (Debian)
deps:
	hack/deps.sh

## test: lint, unit tests with -race, C tests, short fuzzing
test: deps lint test-go test-shim fuzz
	@echo "make test: all checks passed"

test-go:
	$(GO) test -race -count=1 ./...

test-shim:
	$(MAKE) -C shim test

## fuzz: run every Go fuzz target for FUZZTIME
fuzz:
	FUZZTIME=$(FUZZTIME) hack/fuzz.sh

## lint: gofmt, go vet, staticcheck (pinned)
lint: $(TOOLS)/staticcheck
	@out=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(TOOLS)/staticcheck ./...

$(TOOLS)/staticcheck:
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

## bench: Go and shim benchmarks
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
	$(MAKE) -C shim bench

## demo: the whole chain on simulated GPUs
demo:
	@echo "make demo: not yet — the end-to-end demo lands with the e2e work"

clean:
	rm -rf $(BIN) $(TOOLS)
	$(MAKE) -C shim clean
