#!/bin/sh
# A worker the kernel's OOM killer takes is named as such: in the failure
# summary, the event log and `mglaunch logs`, not left as a bare SIGKILL.
# For real: mglaunch runs in a memory cgroup of the test's own with a small
# limit (cgroup v2 memory.max, or v1 memory.limit_in_bytes), and its worker
# allocates past it.
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
FW=$HELPERS/fakeworker
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done

[ "$(id -u)" = 0 ] || skip_all "needs root to create a memory cgroup"
# Our memory cgroup: v1's memory controller, else v2's unified one.
v1=$(sed -n 's/^[0-9]*:memory:\(.*\)$/\1/p' /proc/self/cgroup)
v2=$(sed -n 's/^0::\(.*\)$/\1/p' /proc/self/cgroup)
if [ -n "$v1" ] && [ -w "/sys/fs/cgroup/memory$v1" ]; then
    CG=/sys/fs/cgroup/memory${v1%/}/mgtest-oom-$$
    LIMIT=memory.limit_in_bytes
elif [ -n "$v2" ] && grep -qw memory "/sys/fs/cgroup${v2%/}/cgroup.controllers" 2>/dev/null &&
    [ -w "/sys/fs/cgroup${v2%/}" ]; then
    CG=/sys/fs/cgroup${v2%/}/mgtest-oom-$$
    LIMIT=memory.max
else
    skip_all "no writable memory cgroup here (v1: $v1, v2: $v2)"
fi
mkdir "$CG" 2>"$T/mkdir.err" || skip_all "cannot create a memory cgroup: $(cat "$T/mkdir.err")"
at_cleanup 'rmdir "$CG" 2>/dev/null'
if ! echo 96M >"$CG/$LIMIT" 2>"$T/lim.err"; then
    bail "a 96 MiB limit on the test's cgroup: $(cat "$T/lim.err")"
fi
[ -e "$CG/memory.swap.max" ] && echo 0 >"$CG/memory.swap.max"
[ -e "$CG/memory.memsw.limit_in_bytes" ] && echo 96M >"$CG/memory.memsw.limit_in_bytes" 2>/dev/null
diag "cgroup $CG, $LIMIT $(cat "$CG/$LIMIT")"

# mglaunch (and, inheriting it, its workers) in that cgroup; local rank 1 allocates 400 MiB.
sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$CG" \
    "$MGLAUNCH" --nproc_per_node 2 --log_dir "$T/logs" --rdzv_id oom "$FW" \
    'if' local_rank=1 alloc 400 sleep 5 >"$T/out" 2>"$T/err"
rc=$?
is "$rc" 137 "the OOM-killed worker's exit code: 137 (SIGKILL)"
e=$(cat "$T/err")
like "$e" "local rank 1 \\(rank 1, pid [0-9]+\\) was killed by the kernel's OOM killer \\(out of memory; " \
    "the note when it died names the OOM killer"
like "$e" "attempt 0 .*: rank 1 .* was killed by the kernel's OOM killer: out of memory \\(SIGKILL, exit code 137\\)" \
    "the summary's attempt line too"
like "$e" "  exit      : was killed by the kernel's OOM killer: out of memory" "and the root cause"
like "$e" "  memory    : .*(oom_kill [0-9]+ -> [0-9]+|kernel log: .*Killed process)" \
    "with what the kernel said"
like "$(grep worker_exit "$T/logs/oom/events.jsonl" | grep '"local_rank":1')" '"oom":"' \
    "the event log records it"
out=$("$MGLAUNCH" logs "$T/logs" --run oom)
like "$out" "local rank 1 .* failed: killed by the kernel's OOM killer, out of memory \\(exit 137\\)" \
    "mglaunch logs says so"
like "$out" "memory    : " "  and shows the evidence in the root cause"

# A SIGKILL sent by hand is still just that.
"$MGLAUNCH" --nproc_per_node 1 "$FW" signal KILL >"$T/out" 2>"$T/err"
is "$?" 137 "a worker killed with SIGKILL by someone else: 137"
unlike "$(cat "$T/err")" "OOM" "not called an out-of-memory kill"
like "$(cat "$T/err")" "was killed by SIGKILL" "a plain SIGKILL"
done_testing
