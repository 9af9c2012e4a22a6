#!/bin/sh
# Runs every benchmark script in tests/bench/ (each *.sh but this one), one
# after the other, and fails when any of them fails. `make bench` calls it.
# Each benchmark prints its own table; results also go to tests/bench/out/.
set -u
dir=$(cd "$(dirname "$0")" && pwd)
failed=""
n=0
for b in "$dir"/*.sh; do
    [ "$(basename "$b")" = run-all.sh ] && continue
    [ -f "$b" ] || continue
    n=$((n + 1))
    echo "==> $(basename "$b")"
    if ! sh "$b"; then
        failed="$failed $(basename "$b")"
    fi
    echo
done
if [ -n "$failed" ]; then
    echo "benchmarks failed:$failed" >&2
    exit 1
fi
echo "$n benchmark(s) done"
