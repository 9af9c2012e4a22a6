#!/bin/sh
# The GPU suite's own behaviour (tests/gpu/run.sh, docs/gpu.md "The GPU
# suite"), checked without a GPU: stand-in tests that pass, fail, skip, hang
# past their limit and outlive the budget; a stand-in compute-sanitizer; the
# stand-in driver (tests/helpers/fakecuda) showing a device or none. The logs
# stay in the directory the first line names, the summary is one line of what
# passed, failed and was skipped and why, and the exit status says whether
# anything failed.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
cd "$TOP"
RUN=tests/gpu/run.sh
FAKE=$HELPERS/fakecuda
[ -x "$HELPERS/gpuprobe" ] && [ -f "$FAKE/libcuda.so.1" ] || bail "gpuprobe and the stand-in driver are built"
export BUILD=$MG_BUILD

# stand-in tests
mkdir -p "$T/t" "$T/bin"
mk() { printf '#!/bin/sh\n%s\n' "$2" >"$T/t/$1" && chmod +x "$T/t/$1"; }
mk pass.t '# timeout: 30
echo "ok 1 - fine"; echo "ok 2 # skip needs two GPUs"; echo "1..2"'
mk fail.t 'echo "ok 1 - fine"; echo "not ok 2 - the sum is wrong"; echo "1..2"; exit 1'
mk skipall.t 'echo "1..0 # SKIP no CUDA device (no NVIDIA driver)"'
mk slow.t '# timeout: 100
echo "ok 1 - started"; sleep 60; echo "1..1"'
mk late.t 'echo "ok 1 - ran"; echo "1..1"'

out=$(env -u MG_FMNIST "$RUN" --no-build --no-bench --logs "$T/logs" --limit 3 --data "$T/nodata" \
    "$T/t/pass.t" "$T/t/fail.t" "$T/t/skipall.t" "$T/t/slow.t" 2>&1)
rc=$?
is "$rc" 1 "a failed test: exit status 1"
is "$(echo "$out" | head -n 1)" "tests/gpu/run.sh: logs in $T/logs" "the first line names the log directory"
like "$out" "Fashion-MNIST: not in $T/nodata \\(pass --data DIR, or set MG_FMNIST\\)" \
    "missing data: says where it looked and what to pass"
last=$(echo "$out" | tail -n 1)
like "$last" '^tests/gpu/run\.sh: 1 passed, 2 failed \(fail\.t: not ok 2 - the sum is wrong; slow\.t: timed out after 3s' \
    "one summary line: passed, failed with the first failure of each"
like "$last" ', 1 skipped \(skipall\.t: no CUDA device \(no NVIDIA driver\)\); [0-9]+ s; logs in '"$T/logs"'$' \
    "... skipped with the reason, and where the logs are"
like "$out" 'pass\.t +ok +2 +0 +1 .*1 skipped inside: needs two GPUs' "the table counts a test's own skips"
for f in pass.t fail.t skipall.t slow.t summary.txt; do
    DESC="the log of $f is kept" ok test -s "$T/logs/$f.log" -o -s "$T/logs/$f"
done
like "$(cat "$T/logs/slow.t.log")" '^ok 1 - started' "... a timed-out test's log has what it did"
is "$(tail -n 1 "$T/logs/summary.txt")" "$last" "summary.txt ends with the same line"
[ -d /proc/self ] && ! pgrep -f "$T/t/slow.t" >/dev/null
is $? 0 "the timed-out test is gone"

# the budget: what would start with under 10 s left is skipped, saying so
out=$("$RUN" --no-build --no-bench --logs "$T/logs2" --budget 12 --limit 3 "$T/t/slow.t" "$T/t/late.t" 2>&1)
like "$(echo "$out" | tail -n 1)" '1 skipped \(late\.t: not started: [0-9]+s left of the 12s budget' \
    "a test past the budget is not started, and the line says why"

# memcheck: with a device (the stand-in driver shows one) and compute-sanitizer on PATH
printf '#!/bin/sh\necho "sanitizer: $*" >>"%s/sanitizer.args"\nwhile [ $# -gt 1 ]; do shift; done\n"$1"\n[ -n "${SANITIZER_ERRORS:-}" ] && echo "========= Invalid __global__ read of size 4" && exit 86\nexit 0\n' \
    "$T" >"$T/bin/compute-sanitizer"
chmod +x "$T/bin/compute-sanitizer"
withdev() { env LD_LIBRARY_PATH="$FAKE" FAKECUDA_DEVICES=1 PATH="$T/bin:$PATH" "$@"; }
out=$(withdev "$RUN" --no-build --no-bench --logs "$T/logs3" "memcheck:$T/t/pass.t" 2>&1)
is $? 0 "memcheck of a clean test passes"
like "$(cat "$T/sanitizer.args")" "sanitizer: --tool memcheck --error-exitcode 86 --leak-check no $T/t/pass.t" \
    "... run under compute-sanitizer --tool memcheck"
out=$(withdev SANITIZER_ERRORS=1 "$RUN" --no-build --no-bench --logs "$T/logs4" "memcheck:$T/t/pass.t" 2>&1)
like "$(echo "$out" | tail -n 1)" '1 failed \(memcheck pass\.t: memcheck found errors: ========= Invalid __global__ read' \
    "memcheck's errors fail it, quoted"
out=$(env LD_LIBRARY_PATH="$FAKE" FAKECUDA_DEVICES=1 PATH=/usr/bin:/bin CUDA_HOME="$T/none" \
    "$RUN" --no-build --no-bench --logs "$T/logs5" "memcheck:$T/t/pass.t" 2>&1)
like "$(echo "$out" | tail -n 1)" 'memcheck pass\.t: no compute-sanitizer' "no compute-sanitizer: skipped, saying so"
out=$(env LD_LIBRARY_PATH="$FAKE" FAKECUDA_INIT=100 PATH="$T/bin:$PATH" \
    "$RUN" --no-build --no-bench --logs "$T/logs6" "memcheck:$T/t/pass.t" 2>&1)
like "$(echo "$out" | tail -n 1)" 'memcheck pass\.t: no CUDA device: no CUDA device: cuInit' \
    "no device: memcheck skipped with the driver's answer"

# the real GPU tests on this machine's driver (a driver with no device): each skips with why
out=$(env LD_LIBRARY_PATH="$FAKE" FAKECUDA_INIT=100 "$RUN" --no-build --no-bench --logs "$T/logs7" \
    "$MG_BUILD/tests/unit/test_cuda_backend" tests/gpu/train_gpu.t 2>&1)
is $? 0 "the GPU tests without a device: nothing failed"
like "$(echo "$out" | tail -n 1)" '0 passed, 0 failed, 2 skipped \(test_cuda_backend: .*no CUDA device.*; train_gpu\.t: .*\)' \
    "... both skipped, with the reason"

out=$("$RUN" --budget soon 2>&1)
is "$?:$out" "2:tests/gpu/run.sh: --budget wants a number of seconds, not 'soon'" "a bad option: one line, status 2"
done_testing
