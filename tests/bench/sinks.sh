#!/bin/sh
# Benchmark: what train's outputs cost the training. The same run (2 ranks
# wired as torchrun would, the mlp on Fashion-MNIST, checkpoints every 100
# steps in both) with every output off against all of them on: JSON lines,
# TensorBoard and CSV metrics with a record every 10 steps, and --upload
# sending every checkpoint and metrics file to a WebDAV server (Debian's nginx
# on loopback, started here; it shares the 2 cores with the ranks) while the
# training goes on. Throughput is train's own samples/s (the time in steps); the runs
# alternate off/on, and the median of each side is compared. The target: under
# 2% apart. It checks its own result: both sides must end with the same
# parameter hash (outputs never change the training), and with everything
# copied.
#
#   tests/bench/sinks.sh                 5 runs a side, 3 epochs
#   REPEAT=3 EPOCHS=1 tests/bench/sinks.sh   (quicker, noisier)
#   STRICT=1     also fail when the difference is 2% or more
#   UPLOAD_DEST=s3://bucket/prefix (or http(s)://...)
#                --upload to that server instead of the local nginx (the AWS_*
#                variables as train's docs say); each run gets its own prefix
#   UPLOAD_CMD=1 --upload-cmd copying to a directory instead (cp per file: a
#                fork and exec per copy, which the 2 busy cores feel); also
#                what runs when nginx is not installed
. "$(dirname "$0")/../lib/bench.sh"
REPEAT=${REPEAT:-5}
EPOCHS=${EPOCHS:-3}
need "$TRAIN"
DATA_DIR=/usr/share/datasets/fashion-mnist
[ -d "$DATA_DIR" ] || { diag "Fashion-MNIST missing (scripts/deps.sh)"; exit 2; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
ARGS="--model mlp --data fashion-mnist --epochs $EPOCHS --batch-size 64 --seed 0 --log-every 10
      --checkpoint-every 100 --keep-checkpoints 3"

. "$TOP/tests/lib/nginx.sh"
if [ -z "${UPLOAD_DEST:-}" ] && [ "${UPLOAD_CMD:-0}" != 1 ]; then
    if [ -n "$NGINX" ] && nginx_dav "$T/nginx"; then
        UPLOAD_DEST=http://127.0.0.1:$NGINX_PORT/runs
    else
        diag "no nginx (scripts/deps.sh): copying with --upload-cmd instead"
    fi
fi

machine_line
echo "setting: 2 ranks, mlp, Fashion-MNIST, $EPOCHS epoch(s), log every 10 steps, checkpoint every 100, $REPEAT runs a side"
echo "copies: ${UPLOAD_DEST:-"--upload-cmd (cp to a directory)"}"
echo

# run SIDE K: one run; prints "samples/s wall_s hash"
run() {
    _d=$T/$1.$2
    mkdir -p "$_d/up"
    if [ "$1" = on ] && [ -n "${UPLOAD_DEST:-}" ]; then
        _extra="--metrics $_d/m.jsonl --tensorboard $_d/tb --csv $_d/csv
                --upload $UPLOAD_DEST/$$-$2"
    elif [ "$1" = on ]; then
        _extra="--metrics $_d/m.jsonl --tensorboard $_d/tb --csv $_d/csv
                --upload-cmd 'mkdir -p $_d/up/\$(dirname \$MG_UPLOAD_NAME) && cp {} $_d/up/\$MG_UPLOAD_NAME'"
    else
        _extra=""
    fi
    eval run_ranks 2 "$_d/r" "$TRAIN" $ARGS --checkpoint-dir "$_d/ck" $_extra || {
        diag "$1 run $2 failed: $(tail -n 3 "$_d/r.err.0" "$_d/r.out.0")"
        return 1
    }
    sed -n 's/.*done: .*(\([0-9]*\) samples\/s), wall time \([0-9.]*\) s; param hash \([0-9a-f]*\).*/\1 \2 \3/p' "$_d/r.out.0"
    if [ "$1" = on ] && ! grep -q 'upload to .*: \([0-9]*\) of \1 copies made' "$_d/r.out.0"; then
        diag "on run $2: not everything was copied: $(grep 'upload' "$_d/r.out.0" "$_d/r.err.0" | tail -n 2)"
        return 1
    fi
}

: >"$T/off"
: >"$T/on"
i=0
while [ $i -lt "$REPEAT" ]; do
    run off $i >>"$T/off" || exit 1
    run on $i >>"$T/on" || exit 1
    i=$((i + 1))
done
hashes=$(cut -d' ' -f3 "$T/off" "$T/on" | sort -u | wc -l)
off=$(cut -d' ' -f1 "$T/off" | median)
on=$(cut -d' ' -f1 "$T/on" | median)
woff=$(cut -d' ' -f2 "$T/off" | median)
won=$(cut -d' ' -f2 "$T/on" | median)
printf '%-34s %14s %12s\n' "outputs" "samples/s" "wall s"
printf '%-34s %14s %12s\n' "off (checkpoints only)" "$off" "$woff"
printf '%-34s %14s %12s\n' "metrics x3 + upload of everything" "$on" "$won"
diff=$(awk -v a="$off" -v b="$on" 'BEGIN { printf "%.2f", (a - b) / a * 100 }')
echo
echo "throughput with every output on: ${diff}% below off (target: under 2%)"
echo "runs (samples/s): off $(cut -d' ' -f1 "$T/off" | tr '\n' ' ')| on $(cut -d' ' -f1 "$T/on" | tr '\n' ' ')"
cp "$T/off" "$OUT/sinks.off" && cp "$T/on" "$OUT/sinks.on"
if [ "$hashes" -ne 1 ]; then
    diag "the runs ended with different weights: $(cut -d' ' -f3 "$T/off" "$T/on" | sort -u | tr '\n' ' ')"
    exit 1
fi
echo "every run ended with the same parameter hash"
if [ "${STRICT:-0}" = 1 ] && awk -v d="$diff" 'BEGIN { exit !(d >= 2 || d <= -2) }'; then
    diag "missed the target: ${diff}%"
    exit 1
fi
