#!/bin/sh
# make fuzz: runs each harness's libFuzzer build (build/fuzz/tests/fuzz/fuzz_NAME)
# for FUZZ_SECONDS, one after the other, from its seed corpus
# (tests/fuzz/corpus/NAME, read only) and what earlier runs found
# (build/fuzz/corpus/NAME, where new inputs go). A crash, leak, sanitizer
# report, timeout or broken invariant leaves its input in
# build/fuzz/crashes/NAME/. Prints one line per harness: executions, inputs
# in the corpus, findings; exits 1 when there is a finding.
#   tests/fuzz/run.sh NAME...     (FUZZ_SECONDS=60, FUZZ_JOBS=1, MG_BUILD=build/fuzz)
set -u
cd "$(dirname "$0")/../.."
B=${MG_BUILD:-build/fuzz}
SECS=${FUZZ_SECONDS:-60}
found=0
printf '%-16s %12s %8s %8s %9s\n' harness executions exec/s corpus findings
for name in "$@"; do
    bin=$B/tests/fuzz/fuzz_$name
    work=$B/corpus/$name
    crashes=$B/crashes/$name
    mkdir -p "$work" "$crashes"
    dict=
    [ -f "tests/fuzz/dict/$name.dict" ] && dict="-dict=tests/fuzz/dict/$name.dict"
    before=$(ls "$crashes" | wc -l)
    # -timeout: an input that takes 10 s is a finding (a hang); -rss_limit_mb:
    # so is one that makes the process take 2 GiB; -malloc_limit_mb: and one
    # that makes a parser allocate 512 MiB at once (a length believed before
    # the bytes arrive).
    "$bin" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=512 \
        -print_final_stats=1 \
        -artifact_prefix="$crashes/" $dict "$work" "tests/fuzz/corpus/$name" \
        >"$B/fuzz_$name.log" 2>&1
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$B/fuzz_$name.log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$B/fuzz_$name.log" | tail -n 1)
    after=$(ls "$crashes" | wc -l)
    new=$((after - before))
    [ "$new" -gt 0 ] && found=1
    printf '%-16s %12s %8s %8s %9s\n' "$name" "${execs:-?}" "${rate:-?}" "$(ls "$work" | wc -l)" "$new"
    [ "$new" -gt 0 ] && grep -m 3 -E 'ERROR|runtime error|invariant|out-of-memory|timeout' \
        "$B/fuzz_$name.log" | sed 's/^/    /'
done
[ "$found" = 0 ] || echo "findings: $B/crashes/ (the logs: $B/fuzz_NAME.log)"
exit $found
