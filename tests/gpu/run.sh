#!/bin/sh
# The GPU suite in one command (docs/gpu.md, "The GPU suite"): builds with the
# CUDA plugin required, runs the CUDA tests (the host ones and the GPU ones),
# compute-sanitizer's memcheck over the backend tests when the tool is there,
# and the GPU benchmark, each under its own time limit and all within a budget
# (8 minutes by default), keeps every log in a directory it names, and ends
# with one line: what passed, what failed and what was skipped, and why.
# Exits 1 when something failed or the build did not make the plugin.
#
#   tests/gpu/run.sh [--logs DIR] [--data DIR] [--budget SECONDS] [--limit SECONDS]
#                    [--no-build] [--no-bench] [TEST...]
#
#   --logs DIR     where the logs go (default: $BUILD/gpu-logs/<UTC time>); kept
#   --data DIR     Fashion-MNIST (default: $MG_FMNIST, else /usr/share/datasets/fashion-mnist)
#   --budget S     the whole run's time (default 480); a test that would start
#                  with less than 10 s left is skipped, saying so
#   --limit S      the most one test may take (default 240); its own "# timeout:"
#                  line when smaller
#   TEST...        these instead of the suite (paths, as for make test T=...)
set -u
cd "$(dirname "$0")/../.." || exit 2
BUILD=${BUILD:-build}
LOGS="" DATA=${MG_FMNIST:-/usr/share/datasets/fashion-mnist}
BUDGET=480 LIMIT=240 BUILD_STEP=1 BENCH=1
usage() {
    echo "usage: tests/gpu/run.sh [--logs DIR] [--data DIR] [--budget SECONDS] [--limit SECONDS] [--no-build] [--no-bench] [TEST...]" >&2
    exit 2
}
number() { case $2 in '' | *[!0-9]*) echo "tests/gpu/run.sh: $1 wants a number of seconds, not '$2'" >&2 && exit 2 ;; esac; }
while [ $# -gt 0 ]; do
    case $1 in
    --logs) [ $# -ge 2 ] || usage; LOGS=$2; shift 2 ;;
    --data) [ $# -ge 2 ] || usage; DATA=$2; shift 2 ;;
    --budget) [ $# -ge 2 ] || usage; number "$1" "$2"; BUDGET=$2; shift 2 ;;
    --limit) [ $# -ge 2 ] || usage; number "$1" "$2"; LIMIT=$2; shift 2 ;;
    --no-build) BUILD_STEP=0; shift ;;
    --no-bench) BENCH=0; shift ;;
    -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "tests/gpu/run.sh: unknown option $1" >&2; usage ;;
    *) break ;;
    esac
done
[ -n "$LOGS" ] || LOGS=$BUILD/gpu-logs/$(date -u +%Y%m%dT%H%M%SZ)
if ! mkdir -p "$LOGS" || ! [ -w "$LOGS" ]; then
    echo "tests/gpu/run.sh: cannot write the logs to $LOGS (--logs DIR)" >&2
    exit 2
fi
LOGS=$(cd "$LOGS" && pwd)
START=$(date +%s)
echo "tests/gpu/run.sh: logs in $LOGS"
trap 'echo "tests/gpu/run.sh: interrupted; logs in $LOGS"; exit 130' INT
trap 'echo "tests/gpu/run.sh: terminated; logs in $LOGS"; exit 143' TERM

if [ -f "$DATA/train-images-idx3-ubyte.gz" ] || [ -f "$DATA/train-images-idx3-ubyte" ]; then
    echo "Fashion-MNIST: $DATA"
else
    echo "Fashion-MNIST: not in $DATA (pass --data DIR, or set MG_FMNIST): the accuracy checks are skipped"
fi
export MG_FMNIST=$DATA

if [ $BUILD_STEP = 1 ]; then
    J=$(nproc 2>/dev/null || echo 2)
    if ! make -j"$J" MG_REQUIRE_CUDA=1 BUILD="$BUILD" all >"$LOGS/build.log" 2>&1; then
        tail -n 30 "$LOGS/build.log"
        echo "tests/gpu/run.sh: 0 passed, 1 failed (the build, with the CUDA plugin required: $LOGS/build.log), 0 skipped; logs in $LOGS"
        exit 1
    fi
    grep '^mg build: cuda plugin' "$LOGS/build.log"
fi
probe=$("$BUILD/tests/helpers/gpuprobe" probe 0 2>&1)
echo "GPU 0: $probe"

if [ $# -gt 0 ]; then
    TESTS=$*
else
    TESTS="$BUILD/tests/unit/test_cuda_kernels $BUILD/tests/unit/test_cuda_algo
           $BUILD/tests/unit/test_cuda_shapes $BUILD/tests/unit/test_nccl_boot
           $BUILD/tests/unit/test_ddp_device $BUILD/tests/unit/test_dist_device
           tests/integration/cuda_build.t tests/integration/cuda_probe.t
           tests/integration/train_device.t
           $BUILD/tests/unit/test_cuda_backend $BUILD/tests/unit/test_comm_nccl
           memcheck:$BUILD/tests/unit/test_cuda_backend memcheck:$BUILD/tests/unit/test_comm_nccl
           $(ls tests/gpu/*.t)"
    [ $BENCH = 1 ] && TESTS="$TESTS bench:tests/bench/gpu.sh"
fi

# compute-sanitizer: on PATH, else with the toolkit nvcc came from
SANITIZER=$(command -v compute-sanitizer 2>/dev/null)
if [ -z "$SANITIZER" ]; then
    for d in "${CUDA_HOME:-}" "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")")" /usr/local/cuda; do
        [ -n "$d" ] && [ -x "$d/bin/compute-sanitizer" ] && SANITIZER=$d/bin/compute-sanitizer && break
    done
fi

# the limit a test declares ("# timeout: N" in its source), as tests/lib/run-test reads it
declared() {
    src=$1
    case $1 in */tests/unit/*) src=tests/unit/$(basename "$1").c ;; esac
    n=$(sed -n 's/^[#/* ]*timeout: *\([0-9][0-9]*\).*/\1/p' "$src" 2>/dev/null | head -n 1)
    echo "${n:-120}"
}

passed=0 failed=0 skipped=0 why_failed="" why_skipped=""
printf '%-36s %-7s %5s %5s %5s %7s  %s\n' test result pass fail skip seconds note >"$LOGS/summary.txt"
note_of() { tr '\n' ' ' | cut -c1-"$1" | sed 's/ *$//'; }
for entry in $TESTS; do
    kind=test t=$entry
    case $entry in
    memcheck:*) kind=memcheck t=${entry#memcheck:} ;;
    bench:*) kind=bench t=${entry#bench:} ;;
    esac
    name=$(basename "$t")
    [ $kind = test ] || name="$kind $name"
    log=$LOGS/$(echo "$name" | tr ' /' '._').log
    left=$((BUDGET - ($(date +%s) - START)))
    limit=$(declared "$t")
    [ "$limit" -gt "$LIMIT" ] && limit=$LIMIT
    [ $kind = memcheck ] && limit=$((limit * 3)) && [ "$limit" -gt "$LIMIT" ] && limit=$LIMIT
    [ "$limit" -gt "$left" ] && limit=$left
    note="" result=""
    if [ "$left" -lt 10 ]; then
        result=skip note="not started: ${left}s left of the ${BUDGET}s budget (--budget)"
    elif [ $kind = memcheck ] && [ -z "$SANITIZER" ]; then
        result=skip note="no compute-sanitizer (on PATH or in the CUDA toolkit's bin/)"
    elif [ $kind = memcheck ] && [ "${probe#usable}" = "$probe" ]; then
        result=skip note="no CUDA device: $probe"
    fi
    secs=0 pass=0 fail=0 sk=0
    if [ -z "$result" ]; then
        t0=$(date +%s)
        case $kind in
        test) set -- "$t" ;;
        memcheck) set -- "$SANITIZER" --tool memcheck --error-exitcode 86 --leak-check no "$t" ;;
        bench) set -- "$t" ;;
        esac
        MG_BUILD=$BUILD timeout -k 5 "$limit" "$@" >"$log" 2>&1
        rc=$?
        secs=$(($(date +%s) - t0))
        pass=$(grep -c '^ok ' "$log")
        fail=$(grep -c '^not ok ' "$log")
        sk=$(grep -ci '^ok .*# skip' "$log")
        skip_all=$(sed -n 's/^1\.\.0 # SKIP //p' "$log" | head -n 1)
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
            result=FAIL note="timed out after ${limit}s (its limit; the log has what it did)"
        elif [ -n "$skip_all" ]; then
            result=skip note=$skip_all
        elif [ $kind = bench ] && grep -q 'no usable GPU' "$log"; then
            result=skip note=$(grep -m 1 'no usable GPU' "$log")
        elif [ $rc -ne 0 ] || [ "$fail" -ne 0 ]; then
            result=FAIL
            note=$(grep -m 1 '^not ok ' "$log")
            [ $kind = memcheck ] && [ $rc -eq 86 ] && note="memcheck found errors: $(grep '^========= ' "$log" | grep -v 'COMPUTE-SANITIZER' | head -n 1)"
            [ -n "$note" ] || note="exit status $rc: $(tail -n 1 "$log")"
        else
            result=ok
            [ "$sk" -gt 0 ] && note="$sk skipped inside: $(grep -i -m 1 '^ok .*# skip' "$log" | sed 's/.*# [Ss][Kk][Ii][Pp] *//')"
        fi
    fi
    note=$(printf '%s' "$note" | note_of 110)
    case $result in
    ok) passed=$((passed + 1)) ;;
    FAIL) failed=$((failed + 1)) why_failed="$why_failed${why_failed:+; }$name: $(printf '%s' "$note" | note_of 80)" ;;
    skip) skipped=$((skipped + 1)) why_skipped="$why_skipped${why_skipped:+; }$name: $(printf '%s' "$note" | note_of 60)" ;;
    esac
    printf '%-36s %-7s %5s %5s %5s %7s  %s\n' "$name" "$result" "$pass" "$fail" "$sk" "$secs" "$note" >>"$LOGS/summary.txt"
    echo "$name: $result${note:+ ($note)}"
done

echo
cat "$LOGS/summary.txt"
line="tests/gpu/run.sh: $passed passed, $failed failed${why_failed:+ ($why_failed)}, $skipped skipped${why_skipped:+ ($why_skipped)}; $(($(date +%s) - START)) s; logs in $LOGS"
echo "$line" >>"$LOGS/summary.txt"
echo
echo "$line"
[ $failed -eq 0 ]
