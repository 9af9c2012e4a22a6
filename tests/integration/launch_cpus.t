#!/bin/sh
# More workers than usable cores, with no GPU (CPU trainers): one warning
# line that says what it costs and what fits, and the run goes on; none when
# they fit or when there are GPUs. Usable cores come from the CPU affinity
# (taskset) and from the cgroup's CPU quota (a cgroup this test makes).
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
FW=$HELPERS/fakeworker
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset SLURM_GPUS_ON_NODE SLURM_STEP_GPUS SLURM_JOB_GPUS NVIDIA_VISIBLE_DEVICES
export CUDA_VISIBLE_DEVICES= # no GPU, whatever the machine has
command -v taskset >/dev/null || skip_all "no taskset"

warn1="mglaunch: warning: --nproc_per_node 2 on 1 usable core (its CPU affinity): with no GPU, the 2 workers train on the CPU and take turns on one core, so a step is no faster than with 1 worker, and every rank waits in each collective for the ranks that are not running; each worker also holds its own model and data. --nproc_per_node 1 fits"

taskset -c 0 "$MGLAUNCH" --nproc_per_node 2 "$FW" out hi >"$T/out" 2>"$T/err"
is $? 0 "2 CPU workers on 1 core: the run goes on"
is "$(cat "$T/err")" "$warn1" "  with one warning line: what it costs, what fits"
is "$(grep -c . "$T/out")" 2 "  both workers ran"
taskset -c 0 "$MGLAUNCH" --nproc_per_node 1 "$FW" out hi >"$T/out" 2>"$T/err"
is "$(cat "$T/err")" "" "1 worker on 1 core: no warning"
taskset -c 0 env -u CUDA_VISIBLE_DEVICES SLURM_GPUS_ON_NODE=2 "$MGLAUNCH" --nproc_per_node 2 \
    "$FW" out hi >"$T/out" 2>"$T/err"
is "$(cat "$T/err")" "" "with GPUs (a Slurm step's 2), no warning: the cores wait on the GPUs"
n=$(taskset -c 0,1 nproc 2>/dev/null)
if [ "${n:-0}" -ge 2 ]; then
    taskset -c 0,1 "$MGLAUNCH" --nproc_per_node 3 "$FW" >"$T/out" 2>"$T/err"
    like "$(cat "$T/err")" "^mglaunch: warning: --nproc_per_node 3 on 2 usable cores \\(its CPU affinity\\): .* take turns on those cores, so a step is no faster than with 2 workers, .* --nproc_per_node 2 fits$" \
        "3 workers on 2 cores"
fi

# the cgroup's CPU quota: half a core's worth (cgroup v1's cpu controller, or v2's cpu.max)
C=
if [ "$(id -u)" = 0 ] && [ -w /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
    C=/sys/fs/cgroup/cpu/mgtest-$$
    mkdir "$C" && at_cleanup "rmdir '$C' 2>/dev/null" && echo 50000 >"$C/cpu.cfs_quota_us" &&
        echo 100000 >"$C/cpu.cfs_period_us" || C=
    Q=$C/cpu.cfs_quota_us
elif [ "$(id -u)" = 0 ] && grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
    C=/sys/fs/cgroup/mgtest-$$
    mkdir "$C" && at_cleanup "rmdir '$C' 2>/dev/null" && echo "50000 100000" >"$C/cpu.max" || C=
    Q=$C/cpu.max
fi
if [ -n "$C" ] && [ "${n:-0}" -ge 2 ]; then
    taskset -c 0,1 sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$C" \
        "$MGLAUNCH" --nproc_per_node 2 "$FW" >"$T/out" 2>"$T/err"
    is $? 0 "2 workers in a cgroup with half a core: the run goes on"
    like "$(cat "$T/err")" "^mglaunch: warning: --nproc_per_node 2 on 1 usable core \\(the CPU quota of its cgroup, $Q; 2 in its CPU affinity\\): " \
        "  the warning names the cgroup's quota"
else
    ok 1 "# SKIP a cgroup with a CPU quota needs root and a cpu controller"
fi
done_testing
