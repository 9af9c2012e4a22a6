# Shared set-up for the benchmark scripts in tests/bench/ (tables, not TAP).
#
#   . "$(dirname "$0")/../lib/bench.sh"
#   need PATH...         each must be an executable: else says to run make, exits 2
#   spawn CMD...         starts CMD in the background; its pid is in $! and in
#                        $SPAWNED, and it is killed at exit unless reaped
#   reap                 waits for every spawned process; fails when one failed
#   run_ranks N PFX CMD... N ranks of CMD on this host, wired as torchrun would
#                        (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
#                        MASTER_ADDR=127.0.0.1, a free MASTER_PORT, agent store
#                        off, OMP_NUM_THREADS=1); rank r's output in PFX.out.r
#                        and PFX.err.r; fails when a rank fails
#   have_torch           python3-torch (torch.distributed) is installed
#   have_torchrun        $TORCHRUN (/usr/bin/torchrun unless set) is installed
#   median               the middle of the numbers on stdin (the lower middle
#                        one for an even count: a value that was measured)
#   host_line            "HOST (N cores), DATE"
#   machine_line         "machine: N CPUs, load L; DATE"
#   versions_line        "mglaunch V vs torchrun (torch V)"
#   diag MSG             a note on stderr, prefixed with the script's name
#   model_flops MODEL    FLOP per training sample (forward + backward, dense count,
#                        no input gradient for the first layer): mlp, cnn
#   cpu_ghz              the core's clock as it runs (turbo included), measured
#                        by tests/helpers/blas_info --clock; /proc/cpuinfo's
#                        nominal "cpu MHz" where that cannot measure
#
# What the recovery benchmarks (startup.sh, snapshot.sh, nodeloss.sh) share, the
# kill-and-measure loop:
#   series NAME FUNC COUNT [ARGS]  FUNC ARGS REP for REP = 0..COUNT-1 ($_rep too),
#                        the lines into $T/NAME; a failed one sets fail=1
#   rand_step REP        a step in 60..140, random per script run and REP
#   wait_steps SECS CMD N  until CMD (a count, eval'ed) prints N or more; 1 at SECS
#   kill_and_time DONE FILE N SECS CMD...  runs CMD (the kill) through stampexec,
#                        waits up to SECS for DONE FILE N (mg_done_at, tr_done_at:
#                        the Nth first step's time in FILE), prints the ms from the
#                        kill to it; 1 when it never came
#   mg_done_at FILE N    the time of rank 0's Nth "first step done at" (train's
#                        --profile-startup lines); tr_done_at: startup_ref.py's
#   ms_between A B       milliseconds from time A to B (seconds), "" when one is 0
#
#   peak_gflops N [VAR=VALUE]  the hardware's FP32 peak for N cores: N x clock x
#                        FLOP per cycle of the CPU's best ISA (tests/helpers/
#                        blas_info, under the setting given); prints "GFLOP/s ISA
#                        FLOP/cycle family-that-fits ISA-of-the-BLAS-kernels"
#
# and from setup.sh: at_cleanup, bg, free_port, wait_for, $TOP, $MG_BUILD,
# $MGLAUNCH, $TRAIN, $HELPERS, and $T, a private temporary directory removed
# at exit, which is also $TMPDIR (the launchers' default log directories land
# there). Also $PY (Debian's python3, where python3-torch is), $TR_ARGS (the
# torchrun flags every comparison uses), $OUT (tests/bench/out/, for results
# kept after the run) and $BENCH (the script's name, for messages).

_t_prefix=mgbench
. "$(dirname "$0")/../lib/setup.sh"
BENCH=$(basename "$0")
PY=/usr/bin/python3
TORCHRUN=${TORCHRUN:-/usr/bin/torchrun}
# torchrun 1.13 under Python 3.11 crashes with its default -t 0 (and with -r/-t 3):
# -r 1 -t 1 is the cheapest setting that runs.
TR_ARGS="--monitor_interval 0.1 -r 1 -t 1"
OUT=$TOP/tests/bench/out
mkdir -p "$OUT"
SPAWNED=""
# A bare fork, not bg's setsid: a timed start pays for no extra exec, and a
# reaped pid leaves the list, so a recycled pid is never killed.
at_cleanup 'for _p in $SPAWNED; do kill -KILL "$_p" 2>/dev/null; done; for _p in $SPAWNED; do wait "$_p" 2>/dev/null; done'

diag() { printf '%s: %s\n' "$BENCH" "$*" >&2; }

need() {
    for _b in "$@"; do
        [ -x "$_b" ] || { diag "$_b missing: run make first"; exit 2; }
    done
}

spawn() {
    "$@" &
    SPAWNED="$SPAWNED $!"
}

reap() {
    _rrc=0
    for _p in $SPAWNED; do wait "$_p" || _rrc=1; done
    SPAWNED=""
    return $_rrc
}

run_ranks() {
    _rn=$1
    _rpfx=$2
    shift 2
    _rport=$(free_port)
    _rr=0
    while [ $_rr -lt "$_rn" ]; do
        RANK=$_rr WORLD_SIZE=$_rn LOCAL_RANK=$_rr LOCAL_WORLD_SIZE=$_rn MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$_rport TORCHELASTIC_USE_AGENT_STORE=False OMP_NUM_THREADS=1 \
            spawn "$@" >"$_rpfx.out.$_rr" 2>"$_rpfx.err.$_rr"
        _rr=$((_rr + 1))
    done
    reap
}

have_torch() { $PY -c 'import torch.distributed' 2>/dev/null; }

have_torchrun() { [ -x "$TORCHRUN" ]; }

median() { sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }

host_line() { echo "$(hostname) ($(getconf _NPROCESSORS_ONLN) cores), $(date -u +%Y-%m-%dT%H:%M:%SZ)"; }

machine_line() { echo "machine: $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M UTC')"; }

versions_line() {
    _tv="not installed"
    have_torchrun && _tv=$($PY -c 'import torch; print("torch", torch.__version__)' 2>/dev/null)
    echo "mglaunch $("$MGLAUNCH" --version | cut -d' ' -f2) vs torchrun (${_tv:-not installed})"
}

model_flops() {
    case $1 in
    mlp) echo 818176 ;;
    cnn) echo 22298112 ;;
    *) echo 0 ;;
    esac
}

cpu_ghz() {
    [ -n "${_CPU_GHZ:-}" ] || _CPU_GHZ=$("$HELPERS/blas_info" --clock 2>/dev/null)
    case ${_CPU_GHZ:-0} in
    0 | 0.00) awk -F: '/^cpu MHz/ { printf "%.2f", $2 / 1000; exit }' /proc/cpuinfo ;;
    *) echo "$_CPU_GHZ" ;;
    esac
}

peak_gflops() {
    _pn=$1
    shift
    _ghz=$(cpu_ghz)
    env "$@" "$HELPERS/blas_info" 2>/dev/null | sed -n 3p |
        awk -v n="$_pn" -v ghz="$_ghz" '{ printf "%.1f %s %s %s %s\n", n * ghz * $4, $3, $4, $5, $1 }'
}

# ---- the kill-and-measure loop of the recovery benchmarks ----
ms_between() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.1f\n", (b - a) * 1000; else print "" }'; }
mg_done_at() { sed -n 's/.*startup: rank 0: .*first step done at \([0-9.]*\),.*/\1/p' "$1" | sed -n "${2}p"; }
tr_done_at() { sed -n 's/.*"first_step_done": \([0-9.]*\),.*/\1/p' "$1" | sed -n "${2}p"; }
wait_steps() {
    _w=$(($1 * 50))
    while [ $_w -gt 0 ]; do
        [ "$(eval "$2" 2>/dev/null || echo 0)" -ge "$3" ] 2>/dev/null && return 0
        sleep 0.02
        _w=$((_w - 1))
    done
    return 1
}
rand_step() { awk -v s="$$$1" 'BEGIN { srand(s); printf "%d", 60 + rand() * 80 }'; }
kill_and_time() {
    _kt_done=$1
    _kt_file=$2
    _kt_n=$3
    _kt_secs=$4
    shift 4
    "$HELPERS/stampexec" "$T/tk" "$@"
    wait_steps "$_kt_secs" "[ -n \"\$($_kt_done '$_kt_file' $_kt_n)\" ] && echo 1" 1 || return 1
    ms_between "$(cat "$T/tk")" "$($_kt_done "$_kt_file" "$_kt_n")"
}
series() {
    _sn=$1
    _sf=$2
    _sc=$3
    shift 3
    : >"$T/$_sn"
    _rep=0
    while [ "$_rep" -lt "$_sc" ]; do
        $_sf "$@" "$_rep" >>"$T/$_sn" || fail=1
        _rep=$((_rep + 1))
    done
}
