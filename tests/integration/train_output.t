#!/bin/sh
# What train says when its output or its inputs go wrong (issue 11): every
# write is checked (stdout on a full disk, --metrics on a full disk, an error
# file that cannot be written), each failure reported once with the file and
# the reason and the exit status 3 (the run's output is incomplete); a
# diverging run stops with exit 4; a test set of the wrong image size is
# named without contradicting itself; a symlink loop is reported as one;
# --hidden 64, is refused; OMP_NUM_THREADS=lots is warned about and ignored.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] && [ -x "$MGLAUNCH" ] || skip_all "train or mglaunch not built"
[ -w /dev/full ] || skip_all "no /dev/full"

ARGS="--data synthetic --train-samples 256 --test-samples 64 --hidden 16 --batch-size 32"

# ---- stdout on a full disk ----
"$TRAIN" $ARGS --steps 20 --log-every 5 >/dev/full 2>"$T/err"
is $? 3 "stdout on /dev/full: exit 3 (output incomplete)"
is "$(cat "$T/err")" "train: cannot write to standard output: No space left on device (progress and results from here on are lost; the exit status will be 3)" \
    "said once on stderr, with the reason"
"$TRAIN" --help >/dev/full 2>"$T/err"
is $? 3 "--help on /dev/full: exit 3"
like "$(cat "$T/err")" "cannot write to standard output: No space left on device" "and says so"

# ---- metrics on a full disk ----
"$TRAIN" $ARGS --steps 20 --log-every 5 --metrics /dev/full >"$T/out" 2>"$T/err"
is $? 3 "--metrics /dev/full: exit 3"
is "$(cat "$T/err")" "train: cannot write metrics file '/dev/full': No space left on device (no more records are written there; the exit status will be 3)" \
    "said once, with the file and the reason"
like "$(cat "$T/out")" "train: done: test accuracy" "the run itself finishes"
"$TRAIN" $ARGS --steps 20 --metrics "$T/m.jsonl" >/dev/null 2>&1
is $? 0 "a metrics file that can be written: exit 0"

# ---- an error file that cannot be written ----
TORCHELASTIC_ERROR_FILE=/dev/full/error.json "$TRAIN" $ARGS --steps 2 --resume "$T/none.mgc" \
    >/dev/null 2>"$T/err"
is $? 1 "a failing run whose error file cannot be written: still exit 1"
like "$(cat "$T/err")" "cannot write the error file '/dev/full/error.json': Not a directory" \
    "and says why the error file is missing"

# ---- a diverging run ----
"$TRAIN" $ARGS --steps 50 --lr 1e6 --log-every 10 >"$T/out" 2>"$T/err"
is $? 4 "a loss that becomes NaN: exit 4"
like "$(cat "$T/err")" "^train: training diverged at step [0-9]+: the loss is (NaN|infinite) \(lr 1e\+06\); lower --lr" \
    "with a clear error"
unlike "$(cat "$T/out")" "done:" "and no result line"
"$MGLAUNCH" --nproc_per_node 2 --log_dir "$T/logs" "$TRAIN" $ARGS --steps 50 --lr 1e6 \
    >"$T/out" 2>&1
is $? 4 "under mglaunch, the launcher exits with the worker's 4"
like "$(cat "$T/out")" "training diverged at step" "and names the cause"

# ---- a test set of the wrong image size ----
d=$T/data
mkdir "$d"
/usr/bin/python3 - "$d" <<'EOF'
import struct, sys
d = sys.argv[1]
def idx(name, dims, data):
    with open(d + "/" + name, "wb") as f:
        f.write(bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", x) for x in dims) + data)
idx("train-images-idx3-ubyte", [64, 28, 28], bytes(64 * 28 * 28))
idx("train-labels-idx1-ubyte", [64], bytes(i % 10 for i in range(64)))
idx("t10k-images-idx3-ubyte", [16, 32, 32], bytes(16 * 32 * 32))
idx("t10k-labels-idx1-ubyte", [16], bytes(i % 10 for i in range(16)))
EOF
"$TRAIN" --data mnist --data-dir "$d" --steps 1 >/dev/null 2>"$T/err"
is $? 2 "a test set of 32x32 images is refused (exit 2: do not retry)"
is "$(cat "$T/err")" "train: mnist: '$d/t10k-images-idx3-ubyte' holds 32x32 images; the models take 28x28" \
    "naming the file and its size"

# ---- a symlink loop ----
ln -s t10k-images-idx3-ubyte.loop "$d/t10k-images-idx3-ubyte.loop2"
ln -s t10k-images-idx3-ubyte.loop2 "$d/t10k-images-idx3-ubyte.loop"
rm "$d/t10k-images-idx3-ubyte"
ln -s t10k-images-idx3-ubyte.loop "$d/t10k-images-idx3-ubyte"
"$TRAIN" --data mnist --data-dir "$d" --steps 1 >/dev/null 2>"$T/err"
is $? 1 "a symlink loop fails"
is "$(cat "$T/err")" "train: cannot load mnist: '$d/t10k-images-idx3-ubyte': Too many levels of symbolic links" \
    "reported as a loop, not as a missing file"

# ---- flags and environment ----
for h in "64," ",64" "64,,32"; do
    "$TRAIN" $ARGS --hidden "$h" --steps 1 >/dev/null 2>"$T/err"
    is $? 2 "--hidden $h is a usage error"
    like "$(cat "$T/err")" "^train: --hidden: empty size in '$h'" "saying which"
done
OMP_NUM_THREADS=lots "$TRAIN" $ARGS --steps 2 >"$T/out" 2>"$T/err"
is $? 0 "OMP_NUM_THREADS=lots: the run goes on"
is "$(cat "$T/err")" "train: warning: OMP_NUM_THREADS='lots' is not a positive integer: ignored, 1 BLAS thread (--threads N sets it)" \
    "with a warning, as PyTorch warns"
like "$(cat "$T/out")" "cpu \(.*1 thread\)" "on one thread"
OMP_NUM_THREADS=2,1 "$TRAIN" $ARGS --steps 2 >"$T/out" 2>"$T/err"
like "$(cat "$T/out")" "cpu \(.*2 threads\)" "OMP_NUM_THREADS=2,1: the first level's 2 threads"
is "$(cat "$T/err")" "" "without a warning"
done_testing
