#!/usr/bin/env bash
# Runs every Go fuzz target (func FuzzXxx in a _test.go file) for $FUZZTIME
# each, one at a time (go test -fuzz takes one target per run). The shim's
# libFuzzer target runs in make -C shim test.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-5s}

# The targets are found through git, so that a missing git or a tree that is
# not a checkout fails here instead of fuzzing nothing.
if ! files=$(git ls-files -co --exclude-standard '*_test.go'); then
	echo "fuzz: cannot list the test files with git (hack/deps.sh installs git; this must be a git checkout)" >&2
	exit 1
fi
# grep exits 1 for a batch of files without a target; only the list counts.
targets=$({ xargs -r grep -s -oE '^func (Fuzz[A-Za-z0-9_]+)' /dev/null <<<"$files" || true; } |
	sed -E 's/:func /:/' | sort -u)
if [ -z "$targets" ]; then
	echo "fuzz: found no func FuzzXxx in the test files git lists" >&2
	exit 1
fi
n=0
while IFS=: read -r file fn; do
	pkg=./$(dirname "$file")
	echo "fuzz: $pkg $fn ($fuzztime)"
	# Go's fuzzing coordinator can give up waiting for a worker on a loaded
	# machine ("context deadline exceeded", golang/go#56238) without any
	# input having failed: that, and only that, is run again, up to three
	# tries in all (twice in a row has been seen on this 2-core machine). A
	# real failure writes its input under testdata/fuzz and fails here.
	out=$(mktemp)
	for try in 1 2 3; do
		if go test -run '^$' -fuzz "^${fn}\$" -fuzztime "$fuzztime" "$pkg" 2>&1 | tee "$out"; then
			break
		fi
		if ! grep -q 'context deadline exceeded' "$out" || grep -q 'Failing input written' "$out" || [ "$try" = 3 ]; then
			rm -f "$out"
			exit 1
		fi
		echo "fuzz: $pkg $fn: the fuzzing engine timed out waiting for a worker; running it again"
	done
	rm -f "$out"
	n=$((n + 1))
done <<<"$targets"
echo "fuzz: $n targets run"
