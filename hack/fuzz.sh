#!/usr/bin/env bash
# Runs every Go fuzz target (func FuzzXxx in a _test.go file) for $FUZZTIME
# each, one at a time (go test -fuzz takes one target per run).
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-5s}
n=0
while IFS=: read -r file fn; do
	pkg=./$(dirname "$file")
	echo "fuzz: $pkg $fn ($fuzztime)"
	go test -run '^$' -fuzz "^${fn}\$" -fuzztime "$fuzztime" "$pkg"
	n=$((n + 1))
done < <(git ls-files -co --exclude-standard '*_test.go' |
	xargs -r grep -oE '^func (Fuzz[A-Za-z0-9_]+)' /dev/null |
	sed -E 's/:func /:/' | sort -u)
echo "fuzz: $n targets run"
