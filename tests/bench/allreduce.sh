#!/bin/sh
# allreduce with 2 ranks on this host: mg (shared memory in ordinary memory,
# through the staging slots; shared memory in registered memory, zero-copy, as
# DDP's gradients are; and the TCP ring forced with MG_COMM=tcp) against
# torch.distributed over Gloo, 4 KB to 64 MB, side by side in one run, with
# memcpy and loopback TCP bandwidth measured alongside. Every timed allreduce
# is also checked for a correct sum.
#
#   tests/bench/allreduce.sh [SIZES...]      (run from the top of the tree, after make)
#
# Targets (issue 4): at 64 KB and below mg >= 10x Gloo; at 16 MB and above
# mg >= 3x Gloo and a bus bandwidth >= 3 GB/s, judged on the staging path (any
# buffer) and on the zero-copy path. Bus bandwidth = size / time x 2(n-1)/n,
# which is size / time for 2 ranks. (Up to 64 KB both paths are the same one
# flag round.)
. "$(dirname "$0")/../lib/bench.sh"
RANKBIN=$HELPERS/comm_rank
need "$RANKBIN"

SIZES=${*:-4096 16384 65536 262144 1048576 4194304 16777216 67108864}

# run2 OUT CMD...: two ranks of CMD on localhost; rank 0's stdout to OUT.
run2() {
    out=$1
    shift
    rc=0
    run_ranks 2 "$T/rank" "$@" || rc=1
    cat "$T/rank.err.0" "$T/rank.err.1" >&2
    cp "$T/rank.out.0" "$out"
    return $rc
}

echo "allreduce, 2 ranks on $(host_line)"
fail=0
run2 "$T/shm" env MG_COMM=auto "$RANKBIN" bench $SIZES || { echo "mg (shm) FAILED" >&2; fail=1; }
run2 "$T/zc" env MG_COMM=auto "$RANKBIN" bench --registered $SIZES ||
    { echo "mg (shm, registered) FAILED" >&2; fail=1; }
run2 "$T/tcp" env MG_COMM=tcp "$RANKBIN" bench $SIZES || { echo "mg (tcp) FAILED" >&2; fail=1; }
have_gloo=0
if have_torch; then
    if run2 "$T/gloo" $PY "$TOP/tests/bench/gloo_allreduce.py" $SIZES; then
        have_gloo=1
    else
        echo "gloo reference FAILED" >&2
        fail=1
    fi
else
    echo "(python3-torch not installed: no Gloo column; scripts/deps.sh --bench installs it)"
fi
memcpy=$("$RANKBIN" memcpy 67108864)
tcpbw=$("$RANKBIN" tcp 1048576)
echo "memcpy bandwidth (64 MB, one core): $memcpy GB/s"
echo "loopback TCP bandwidth (one stream, 1 MB writes): $tcpbw GB/s"
echo

awk -v have_gloo=$have_gloo -v memcpy="$memcpy" -v tcpbw="$tcpbw" -v W="$T" '
function human(b) { return b >= 1048576 ? sprintf("%d MB", b / 1048576) : sprintf("%d KB", b / 1024) }
BEGIN {
    while ((getline l < (W "/shm")) > 0) { split(l, f, " "); shm[f[1]] = f[2]; order[++n] = f[1] }
    while ((getline l < (W "/tcp")) > 0) { split(l, f, " "); tcp[f[1]] = f[2] }
    while ((getline l < (W "/zc")) > 0) { split(l, f, " "); zc[f[1]] = f[2] }
    if (have_gloo) while ((getline l < (W "/gloo")) > 0) { split(l, f, " "); gloo[f[1]] = f[2] }
    printf "%8s | %10s | %-30s | %-30s | %-39s\n", "", "gloo", "mg, shared memory (staging)",
           "mg, zero-copy (registered)", "mg, tcp ring (forced)"
    printf "%8s | %10s | %10s %7s %11s | %10s %7s %11s | %10s %11s %7s %8s\n", "size", "us", "us",
           "x gloo", "busbw", "us", "x gloo", "busbw", "us", "busbw", "x gloo", "/tcp bw"
    printf "%8s-+-%10s-+-%10s-%7s-%11s-+-%10s-%7s-%11s-+-%10s-%11s-%7s-%8s\n", "--------",
           "----------", "----------", "-------", "-----------", "----------", "-------",
           "-----------", "----------", "-----------", "-------", "--------"
    missed = ""
    for (i = 1; i <= n; i++) {
        b = order[i]; bw = b / shm[b] / 1000; tbw = (b in tcp) ? b / tcp[b] / 1000 : 0
        zbw = (b in zc) ? b / zc[b] / 1000 : 0
        g = have_gloo && (b in gloo) ? gloo[b] : 0
        ratio = g ? g / shm[b] : 0; tratio = g && (b in tcp) ? g / tcp[b] : 0
        zratio = g && (b in zc) ? g / zc[b] : 0
        gs = g ? sprintf("%.1f", g) : "-"; rs = g ? sprintf("%.1fx", ratio) : "-"
        zs = (b in zc) ? sprintf("%.1f", zc[b]) : "-"; zrs = zratio ? sprintf("%.1fx", zratio) : "-"
        ts = (b in tcp) ? sprintf("%.1f", tcp[b]) : "-"; trs = tratio ? sprintf("%.1fx", tratio) : "-"
        frac = (tcpbw + 0 > 0) ? tbw / tcpbw : 0
        printf "%8s | %10s | %10.1f %7s %6.2f GB/s | %10s %7s %6.2f GB/s | %10s %6.2f GB/s %7s %8.2f\n",
               human(b), gs, shm[b], rs, bw, zs, zrs, zbw, ts, tbw, trs, frac
        if (g && b <= 65536 && ratio < 10) missed = missed sprintf(" %s: %.1fx < 10x;", human(b), ratio)
        if (b >= 16777216 && g && ratio < 3) missed = missed sprintf(" %s: %.1fx < 3x;", human(b), ratio)
        if (b >= 16777216 && bw < 3) missed = missed sprintf(" %s: %.2f GB/s < 3 GB/s;", human(b), bw)
        if (zratio && b <= 65536 && zratio < 10)
            missed = missed sprintf(" %s zero-copy: %.1fx < 10x;", human(b), zratio)
        if (b >= 16777216 && zratio && zratio < 3)
            missed = missed sprintf(" %s zero-copy: %.1fx < 3x;", human(b), zratio)
        if (b >= 16777216 && (b in zc) && zbw < 3)
            missed = missed sprintf(" %s zero-copy: %.2f GB/s < 3 GB/s;", human(b), zbw)
    }
    printf "\nmg bus bandwidth at 64 MB: %.2f GB/s staging, %.2f GB/s zero-copy = %.0f%% and %.0f%% of memcpy (%s GB/s)\n",
           67108864 / shm[67108864] / 1000, 67108864 / zc[67108864] / 1000,
           100 * 67108864 / shm[67108864] / 1000 / memcpy, 100 * 67108864 / zc[67108864] / 1000 / memcpy, memcpy
    printf "mg TCP ring (forced) at 64 MB: %.2f GB/s = %.0f%% of one loopback TCP stream (%s GB/s)\n",
           67108864 / tcp[67108864] / 1000, 100 * 67108864 / tcp[67108864] / 1000 / tcpbw, tcpbw
    if (!have_gloo) print "targets: not judged (no Gloo reference)"
    else if (missed == "") print "targets: met (<= 64 KB: >= 10x Gloo; >= 16 MB: >= 3x Gloo and >= 3 GB/s)"
    else print "targets: MISSED:" missed
}'
exit $fail
