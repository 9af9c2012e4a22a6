#!/bin/sh
# Everything a GPU machine can check, in one command (docs/gpu.md): builds
# with the CUDA plugin required, runs the CUDA tests (the host ones and the
# GPU suite: make test-gpu's tests) and the GPU benchmark, and prints one
# table. Exits non-zero when a test failed or the build did not make the
# plugin. On a machine without a GPU the GPU suite reports itself skipped.
#
#   tests/gpu/run.sh            (from anywhere; builds into build/)
set -u
cd "$(dirname "$0")/../.." || exit 2
TOP=$(pwd)
BUILD=${BUILD:-build}
J=$(nproc 2>/dev/null || echo 2)
T=$(mktemp -d "${TMPDIR:-/tmp}/mggpu.XXXXXX")
trap 'rm -rf "$T"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "== build (make MG_REQUIRE_CUDA=1) =="
if ! make -j"$J" MG_REQUIRE_CUDA=1 BUILD="$BUILD" all >"$T/build.log" 2>&1; then
    tail -n 30 "$T/build.log"
    echo "tests/gpu/run.sh: the build failed (with the CUDA plugin required)"
    exit 1
fi
grep '^mg build: cuda plugin' "$T/build.log"

TESTS="$BUILD/tests/unit/test_cuda_kernels $BUILD/tests/unit/test_cuda_shapes
       $BUILD/tests/unit/test_nccl_boot $BUILD/tests/unit/test_ddp_device
       $BUILD/tests/unit/test_dist_device tests/integration/cuda_build.t
       tests/integration/cuda_probe.t tests/integration/train_device.t
       $BUILD/tests/unit/test_cuda_backend $BUILD/tests/unit/test_comm_nccl $(ls tests/gpu/*.t)"
echo
echo "== tests =="
failed=0
printf '%-34s %-6s %6s %6s %6s %8s  %s\n' test result pass fail skip seconds note >"$T/table"
for t in $TESTS; do
    start=$(date +%s.%N)
    MG_BUILD=$BUILD tests/lib/run-test "$t" >"$T/out" 2>&1
    rc=$?
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    pass=$(grep -c '^ok ' "$T/out")
    fail=$(grep -c '^not ok ' "$T/out")
    skip=$(grep -ci '^ok .*# skip' "$T/out")
    note=$(sed -n 's/^1\.\.0 # SKIP //p' "$T/out" | head -n 1 | cut -c1-70)
    if [ -n "$note" ]; then
        result=skip
    elif [ $rc -ne 0 ] || [ "$fail" -ne 0 ]; then
        result=FAIL
        failed=1
        note=$(grep -m 1 '^not ok ' "$T/out" | cut -c1-70)
        [ -n "$note" ] || note="exit status $rc"
        sed 's/^/    /' "$T/out" | grep -v '^    ok ' | tail -n 20
    else
        result=ok
    fi
    printf '%-34s %-6s %6s %6s %6s %8s  %s\n' "$(basename "$t")" "$result" "$pass" "$fail" \
        "$skip" "$secs" "$note" >>"$T/table"
    echo "$(basename "$t"): $result"
done

echo
echo "== benchmark (tests/bench/gpu.sh) =="
MG_BUILD=$BUILD tests/bench/gpu.sh >"$T/bench" 2>"$T/bench.err" || {
    failed=1
    cat "$T/bench.err"
}

echo
echo "== summary =="
cat "$T/table"
echo
cat "$T/bench"
[ $failed -eq 0 ] && echo "tests/gpu/run.sh: all passed" || echo "tests/gpu/run.sh: FAILED"
exit $failed
