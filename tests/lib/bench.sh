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
