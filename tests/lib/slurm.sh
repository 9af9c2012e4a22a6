# A real Slurm cluster for the integration tests: munged, slurmctld and two
# slurmd (nodes n1 and n2) on this machine, each slurmd on its own test host
# (tests/lib/netns.sh), slurmctld on the switch; every daemon on a private
# port, with its key, state, spool and logs under $T, node names resolved
# through a private hosts file bind-mounted into the daemons' mount
# namespaces (and so into every job); two GPUs per node, gres entries over
# plain files (Slurm hands them out and tells the jobs; nothing opens them).
# Nothing outside $T changes. Stopped on every exit path: the daemons, and
# every process that carries this cluster's SLURM_CONF (slurmstepd, the
# jobs), killed by pid. Needs root. Source after lib.sh and netns.sh.
#
#   slurm_have          true when it can run here (else: why, on stderr)
#   slurm_up            starts it and waits until both nodes are idle; exports SLURM_CONF
#   sl CMD...           runs a Slurm client (srun, sbatch, squeue, scancel, scontrol)
#                       where the controller is, with the cluster's hosts file
#   bg_sl CMD...        the same in the background, in its own process group ($!)
#   slurm_job_id NAME   the id of the job named NAME (empty when none)
#   slurm_wait_gone ID SECS   waits until job ID has left the queue; 1 if it has not
#   slurm_down          stops it, jobs and all (at_cleanup calls it)
#   SLURM_DIR           $T/slurm: slurm.conf, hosts, log/

SLURM_DIR=
_slurm_pids=

slurm_have() {
    [ "$(id -u)" = 0 ] || { echo "not root (slurmd runs jobs as any user only as root)" >&2; return 1; }
    for _c in munged slurmctld slurmd srun sbatch squeue scancel scontrol sinfo; do
        command -v "$_c" >/dev/null 2>&1 || [ -x "/usr/sbin/$_c" ] ||
            { echo "no $_c (scripts/deps.sh installs slurmctld slurmd slurm-client munge)" >&2; return 1; }
    done
    command -v unshare >/dev/null 2>&1 || { echo "no unshare" >&2; return 1; }
}

# _sl_run fg|bg H NAME CMD...: CMD on test host H ("sw": the controller's),
# with NAME as its host name (a UTS namespace: node n1's processes see n1, as
# on a real node) and the cluster's /etc/hosts (a mount namespace); bg: in the
# background, in its own process group ($!). nsenter rather than ip netns
# exec, which mounts a new /sys and so hides the cgroup mounts slurmd
# insists on finding.
_sl_run() {
    _m=$1
    _h=$2
    _n=$3
    shift 3
    set -- unshare --uts --mount --propagation private \
        sh -c 'hostname "$1" && mount --bind "$0" /etc/hosts && shift && exec "$@"' \
        "$SLURM_DIR/hosts" "$_n" "$@"
    [ "$HOSTS_MODE" = netns ] && set -- nsenter --net="/run/netns/$(_host_ns "$_h")" "$@"
    if [ "$_m" = bg ]; then bg "$@"; else "$@"; fi
}

sl() { _sl_run fg sw slurmctl "$@"; }
bg_sl() { _sl_run bg sw slurmctl "$@"; }

_slurm_port() {
    if [ "$HOSTS_MODE" = netns ]; then
        echo "$1" # each daemon has its namespace's ports to itself
    else
        free_port
    fi
}

slurm_up() {
    SLURM_DIR=$T/slurm
    _d=$SLURM_DIR
    mkdir -p "$_d/munge" "$_d/state" "$_d/spool" "$_d/log"
    chmod 700 "$_d/munge"
    at_cleanup slurm_down
    # munge: its own key, socket and files; jobs find it through AuthInfo.
    head -c 1024 /dev/urandom >"$_d/munge/munge.key"
    chmod 400 "$_d/munge/munge.key"
    bg /usr/sbin/munged --foreground --force --socket="$_d/munge/munge.sock" \
        --key-file="$_d/munge/munge.key" --log-file="$_d/log/munged.log" \
        --pid-file="$_d/munge/munged.pid" --seed-file="$_d/munge/munged.seed" >"$_d/log/munged.out" 2>&1
    _slurm_pids="$_slurm_pids $!"
    _ctl=$(host_addr sw)
    _ctlport=$(_slurm_port 16817)
    _p1=$(_slurm_port 16818)
    _p2=$(_slurm_port 16818)
    printf '127.0.0.1\tlocalhost\n%s\tslurmctl\n%s\tn1\n%s\tn2\n' "$_ctl" \
        "$(host_addr 0)" "$(host_addr 1)" >"$_d/hosts"
    cat >"$_d/slurm.conf" <<EOC
ClusterName=mgtest
SlurmctldHost=slurmctl($_ctl)
SlurmctldPort=$_ctlport
SlurmdPort=$_p1
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$_d/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$_d/state
SlurmdSpoolDir=$_d/spool/%n
SlurmctldPidFile=$_d/slurmctld.pid
SlurmdPidFile=$_d/slurmd-%n.pid
SlurmctldLogFile=$_d/log/slurmctld.log
SlurmdLogFile=$_d/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=10
SlurmdTimeout=10
InactiveLimit=0
MinJobAge=30
KillWait=5
Waittime=0
NodeName=n1 NodeHostname=n1 NodeAddr=$(host_addr 0) Port=$_p1 CPUs=2 RealMemory=1000 Gres=gpu:2 State=UNKNOWN
NodeName=n2 NodeHostname=n2 NodeAddr=$(host_addr 1) Port=$_p2 CPUs=2 RealMemory=1000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=10 State=UP OverSubscribe=YES
EOC
    # Two GPUs per node for the scheduler to hand out (--gpus-per-node): files
    # standing for /dev/nvidia0 and 1, since no GPU is needed to count them.
    mkdir -p "$_d/gpu"
    : >"$_d/gpu/nvidia0"
    : >"$_d/gpu/nvidia1"
    printf 'Name=gpu File=%s/gpu/nvidia[0-1]\n' "$_d" >"$_d/gres.conf"
    export SLURM_CONF=$_d/slurm.conf
    wait_for 10 test -S "$_d/munge/munge.sock" || { echo "munged did not start: $(tail -n 3 "$_d/log/munged.log")" >&2; return 1; }
    _sl_run bg sw slurmctl /usr/sbin/slurmctld -D -i -f "$SLURM_CONF" >"$_d/log/slurmctld.out" 2>&1
    _slurm_pids="$_slurm_pids $!"
    for _n in 1 2; do
        mkdir -p "$_d/spool/n$_n"
        _sl_run bg $((_n - 1)) "n$_n" /usr/sbin/slurmd -D -N "n$_n" -f "$SLURM_CONF" >"$_d/log/slurmd-n$_n.out" 2>&1
        _slurm_pids="$_slurm_pids $!"
    done
    _sl_poll 20 _slurm_idle ||
        { echo "the nodes did not come up: $(sl sinfo -h -N -o '%N %t' 2>&1 | tr '\n' ' ')$(tail -n 2 "$_d"/log/slurm*.log | tr '\n' ' ')" >&2; return 1; }
}

slurm_job_id() { sl squeue -h -n "$1" -o %i 2>/dev/null | head -n 1; }

# _sl_poll SECS FUNC ARGS...: wait_for for shell functions (which sl is).
_sl_poll() {
    _pe=$(($(date +%s%N) / 1000000 + $1 * 1000))
    shift
    while ! "$@"; do
        [ $(($(date +%s%N) / 1000000)) -ge $_pe ] && return 1
        sleep 0.1
    done
}

_slurm_idle() { [ "$(sl sinfo -h -N -o %t 2>/dev/null | grep -c idle)" = 2 ]; }
# Gone: the controller has forgotten the job, or it is in a final state. A
# client that fails (a busy controller) says nothing about the job.
_slurm_gone() {
    _sg=$(sl scontrol -o show job "$1" 2>&1)
    case $_sg in
    *"Invalid job id"*) return 0 ;;
    *JobState=COMPLETED\ * | *JobState=CANCELLED\ * | *JobState=FAILED\ * | *JobState=TIMEOUT\ * | \
        *JobState=NODE_FAIL\ * | *JobState=OUT_OF_MEMORY\ * | *JobState=BOOT_FAIL\ * | *JobState=DEADLINE\ *)
        return 0 ;;
    esac
    return 1
}

slurm_wait_gone() { _sl_poll "$2" _slurm_gone "$1"; }

slurm_down() {
    [ -n "$SLURM_DIR" ] || return 0
    for _p in $_slurm_pids; do kill -TERM "$_p" 2>/dev/null; done
    # Whatever this cluster started (slurmstepd, job tasks) carries its SLURM_CONF.
    for _e in /proc/[0-9]*/environ; do
        if tr '\0' '\n' 2>/dev/null <"$_e" | grep -qxF "SLURM_CONF=$SLURM_DIR/slurm.conf"; then
            _p=${_e#/proc/}
            kill -KILL "${_p%/environ}" 2>/dev/null
        fi
    done
    for _p in $_slurm_pids; do kill -KILL "$_p" 2>/dev/null; done
    SLURM_DIR=
    return 0
}
