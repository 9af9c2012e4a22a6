#!/bin/sh
# Benchmark: what train's outputs cost the training. The same run (2 ranks
# wired as torchrun would, the mlp on Fashion-MNIST, the same checkpoints in
# both) with every output off against all of them on: JSON lines, TensorBoard
# and CSV metrics with a record every 10 steps, and --upload sending every
# checkpoint and metrics file to a WebDAV server (Debian's nginx on loopback,
# started here) while the training goes on. Throughput is train's own
# samples/s (the time in steps); the runs alternate off/on, and the median of
# each side is compared. It checks its own result: both sides must end with
# the same parameter hash (outputs never change the training), and with
# everything copied.
#
# Two checkpoint cadences, each its own table:
#   - one checkpoint per epoch (469 steps here, Lightning's default cadence;
#     still 3-4 a second on this model): the target, under 2% apart;
#   - one every 100 steps (about 20 a second, 20-25 MB/s sent while the 2 ranks
#     keep both cores busy): what copying at that rate costs, shown, no target.
# The server stands in for another machine: it runs at nice 19 (SERVER_NICE)
# so that it takes what the ranks leave, and its CPU time is listed apart.
#
# On a shared or virtual machine one 2-rank run differs from the next by
# several per cent. So each table also gives the noise floor (the medians of
# the odd and the even off runs, apart by as much as nothing at all) and what
# the outputs cost in CPU time: the ranks' CPU seconds (all their threads, the
# upload's too; a rank that waits for a slower one spins, so this counts the
# slowdown as well) and the server's, each side's median, over the off side's.
#
#   tests/bench/sinks.sh                 15 runs a side, 3 epochs, both cadences
#   REPEAT=3 EPOCHS=1 tests/bench/sinks.sh   (quicker, noisier)
#   CADENCES="469 100"  the checkpoint intervals to run, the first is the target's
#   ON=metrics|upload   the on side with only the metrics or only --upload (default all)
#   STRICT=1     also fail when the first cadence's difference is 2% or more
#   UPLOAD_DEST=s3://bucket/prefix (or http(s)://...)
#                --upload to that server instead of the local nginx (the AWS_*
#                variables as train's docs say); each run gets its own prefix
#   UPLOAD_CMD=1 --upload-cmd copying to a directory instead (cp per file: a
#                fork and exec per copy, which the 2 busy cores feel); also
#                what runs when nginx is not installed
. "$(dirname "$0")/../lib/bench.sh"
REPEAT=${REPEAT:-15}
EPOCHS=${EPOCHS:-3}
CADENCES=${CADENCES:-469 100}
ON=${ON:-all}
case $ON in all | metrics | upload) ;; *) echo "sinks.sh: ON is all, metrics or upload" >&2; exit 2 ;; esac
need "$TRAIN"
DATA_DIR=/usr/share/datasets/fashion-mnist
[ -d "$DATA_DIR" ] || { diag "Fashion-MNIST missing (scripts/deps.sh)"; exit 2; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
ARGS="--model mlp --data fashion-mnist --epochs $EPOCHS --batch-size 64 --seed 0 --log-every 10
      --keep-checkpoints 3"

. "$TOP/tests/lib/nginx.sh"
if [ -z "${UPLOAD_DEST:-}" ] && [ "${UPLOAD_CMD:-0}" != 1 ]; then
    if [ -n "$NGINX" ] && nginx_dav "$T/nginx"; then
        UPLOAD_DEST=http://127.0.0.1:$NGINX_PORT/runs
        [ "${SERVER_NICE:-19}" = 0 ] ||
            renice -n "${SERVER_NICE:-19}" -p "$NGINX_PID" $(pgrep -P "$NGINX_PID") >/dev/null
    else
        diag "no nginx (scripts/deps.sh): copying with --upload-cmd instead"
    fi
fi

machine_line
echo "setting: 2 ranks, mlp, Fashion-MNIST, $EPOCHS epoch(s), log every 10 steps, $REPEAT runs a side"
echo "on: $ON; copies: ${UPLOAD_DEST:-"--upload-cmd (cp to a directory)"}"
echo

# cpu_ticks PID FIELD...: the sum of those fields of /proc/PID/stat, 0 when gone
# (fields 14 15: its own user and system time; 16 17: its waited-for children's)
cpu_ticks() {
    _p=$1
    shift
    sed 's/.*) //' "/proc/$_p/stat" 2>/dev/null | awk -v f="$*" '
        { n = split(f, k, " "); s = 0; for (i = 1; i <= n; i++) s += $(k[i] - 2); print s }' |
        grep . || echo 0
}
# server_ticks: the CPU time of nginx, its master and its workers
server_ticks() {
    [ -n "${NGINX_PID:-}" ] || { echo 0; return; }
    _s=$(cpu_ticks "$NGINX_PID" 14 15)
    for _w in $(pgrep -P "$NGINX_PID" 2>/dev/null); do
        _s=$((_s + $(cpu_ticks "$_w" 14 15)))
    done
    echo "$_s"
}
TICK=$(getconf CLK_TCK)

# run SIDE K EVERY: one run, a checkpoint every EVERY steps; prints
# "samples/s wall_s hash ranks_cpu_s server_cpu_s"
run() {
    _d=$T/$1.$3.$2
    mkdir -p "$_d/up"
    _extra=""
    if [ "$1" = on ] && [ "$ON" != upload ]; then
        _extra="--metrics $_d/m.jsonl --tensorboard $_d/tb --csv $_d/csv"
    fi
    if [ "$1" = on ] && [ "$ON" != metrics ] && [ -n "${UPLOAD_DEST:-}" ]; then
        _extra="$_extra --upload $UPLOAD_DEST/$$-$3-$2"
    elif [ "$1" = on ] && [ "$ON" != metrics ]; then
        _extra="$_extra --upload-cmd 'mkdir -p $_d/up/\$(dirname \$MG_UPLOAD_NAME) && cp {} $_d/up/\$MG_UPLOAD_NAME'"
    fi
    _c0=$(cpu_ticks $$ 16 17)
    _s0=$(server_ticks)
    eval run_ranks 2 "$_d/r" "$TRAIN" $ARGS --checkpoint-every "$3" --checkpoint-dir "$_d/ck" $_extra || {
        diag "$1 run $2 failed: $(tail -n 3 "$_d/r.err.0" "$_d/r.out.0")"
        return 1
    }
    _c1=$(cpu_ticks $$ 16 17)
    _s1=$(server_ticks)
    _r=$(sed -n 's/.*done: .*(\([0-9]*\) samples\/s), wall time \([0-9.]*\) s; param hash \([0-9a-f]*\).*/\1 \2 \3/p' "$_d/r.out.0")
    [ -n "$_r" ] || { diag "$1 run $2: no summary line in $_d/r.out.0"; return 1; }
    echo "$_r $_c0 $_c1 $_s0 $_s1" | awk -v t="$TICK" '{ printf "%s %s %s %.2f %.2f\n", $1, $2, $3, ($5 - $4) / t, ($7 - $6) / t }'
    if [ "$1" = on ] && [ "$ON" != metrics ] && ! grep -q 'upload to .*: \([0-9]*\) of \1 copies made' "$_d/r.out.0"; then
        diag "on run $2: not everything was copied: $(grep 'upload' "$_d/r.out.0" "$_d/r.err.0" | tail -n 2)"
        return 1
    fi
}

# a first run builds the shared dataset cache (and warms the page cache)
run off warm 469 >/dev/null || exit 1
target=""
for every in $CADENCES; do
    : >"$T/off"
    : >"$T/on"
    i=0
    while [ $i -lt "$REPEAT" ]; do
        run off $i "$every" >>"$T/off" || exit 1
        run on $i "$every" >>"$T/on" || exit 1
        i=$((i + 1))
    done
    hashes=$(cut -d' ' -f3 "$T/off" "$T/on" | sort -u | wc -l)
    if [ "$hashes" -ne 1 ]; then
        diag "the runs ended with different weights: $(cut -d' ' -f3 "$T/off" "$T/on" | sort -u | tr '\n' ' ')"
        exit 1
    fi
    off=$(cut -d' ' -f1 "$T/off" | median)
    on=$(cut -d' ' -f1 "$T/on" | median)
    coff=$(cut -d' ' -f4 "$T/off" | median)
    con=$(cut -d' ' -f4 "$T/on" | median)
    son=$(cut -d' ' -f5 "$T/on" | median)
    diff=$(awk -v a="$off" -v b="$on" 'BEGIN { printf "%.2f", (a - b) / a * 100 }')
    if [ -z "$target" ]; then
        target=$diff
        what="target: under 2%"
    else
        what="no target: the cost of copying at that rate"
    fi
    echo "a checkpoint every $every steps:"
    printf '  %-34s %12s %14s %14s\n' "outputs" "samples/s" "wall s" "ranks' CPU s"
    printf '  %-34s %12s %14s %14s\n' "off (checkpoints only)" "$off" \
        "$(cut -d' ' -f2 "$T/off" | median)" "$coff"
    printf '  %-34s %12s %14s %14s\n' "on ($ON)" "$on" \
        "$(cut -d' ' -f2 "$T/on" | median)" "$con"
    echo "  throughput with every output on: ${diff}% below off ($what)"
    # the noise floor: the odd off runs against the even ones
    odd=$(awk 'NR % 2 == 1 { print $1 }' "$T/off" | median)
    even=$(awk 'NR % 2 == 0 { print $1 }' "$T/off" | median)
    [ -n "$even" ] && awk -v a="$odd" -v b="$even" 'BEGIN {
        d = (a - b) / (a > b ? a : b) * 100; if (d < 0) d = -d
        printf "  noise floor: the odd off runs against the even ones, %.2f%% apart\n", d }'
    awk -v a="$coff" -v b="$con" -v s="$son" 'BEGIN { if (a > 0)
        printf "  CPU time the outputs cost: the ranks %+.1f%%, the server %.1f%% (of the off ranks'"'"' %.2f s)\n",
               (b - a) / a * 100, s / a * 100, a }'
    grep -h 'upload to .*copies made' "$T"/on.$every.0/r.out.0 | sed 's/^train: /  each on run: /' || :
    echo "  runs (samples/s): off $(cut -d' ' -f1 "$T/off" | tr '\n' ' ')| on $(cut -d' ' -f1 "$T/on" | tr '\n' ' ')"
    echo "  runs (ranks' CPU s): off $(cut -d' ' -f4 "$T/off" | tr '\n' ' ')| on $(cut -d' ' -f4 "$T/on" | tr '\n' ' ')"
    cp "$T/off" "$OUT/sinks.$every.off" && cp "$T/on" "$OUT/sinks.$every.on"
    echo
done
echo "every run ended with the same parameter hash"
if [ "${STRICT:-0}" = 1 ] && awk -v d="$target" 'BEGIN { exit !(d >= 2 || d <= -2) }'; then
    diag "missed the target: ${target}%"
    exit 1
fi
