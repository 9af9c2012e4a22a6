#!/bin/sh
# The stop order (--stop_group_delay): a stop signal reaches the worker
# process first and the rest of its process group later, so that a worker
# saving on SIGTERM still has its helpers (DataLoader workers, a writer's
# subprocess). The worker here forks a helper into its group; its SIGTERM
# handler takes a while to save, then writes whether the helper was still
# alive. By default it is; with --stop_group_delay 0 (torchrun's whole group
# at once) it is not. A worker that ignores SIGTERM: the helper gets it after
# the delay, the worker SIGKILL after the grace period. A shell wrapper that
# the signal ends while its program runs: the group gets the signal when the
# shell exits, and mglaunch waits for the program to save; not for zombies.
# timeout: 90
. "$(dirname "$0")/../lib/lib.sh"
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset MG_STOP_GROUP_DELAY
L=$T/logs

cat >"$T/w.py" <<'EOF2'
import os, signal, sys, time
out, ignore = sys.argv[1], len(sys.argv) > 2 and sys.argv[2] == "ignore"
child = os.fork()
if child == 0:  # the helper, in the worker's process group
    def helper_term(*_):
        with open(out + ".helper", "w") as f:
            f.write("helper got SIGTERM\n")
        os._exit(0)
    signal.signal(signal.SIGTERM, helper_term)
    while True:
        time.sleep(0.05)
def on_term(*_):
    time.sleep(0.5)  # the save takes a while
    pid, _ = os.waitpid(child, os.WNOHANG)
    with open(out + ".tmp", "w") as f:
        f.write("helper alive\n" if pid == 0 else "helper dead\n")
    os.rename(out + ".tmp", out)
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else on_term)
open(out + ".ready", "w").close()
while True:
    time.sleep(0.05)
EOF2

# stop NAME FLAGS...: starts one worker, SIGTERMs mglaunch once it is ready,
# and waits; its exit status in $RC.
stop() {
    _n=$1
    shift
    bg "$MGLAUNCH" --log_dir "$L" --rdzv_id "$_n" --nproc_per_node 1 "$@" >"$T/$_n.out" 2>"$T/$_n.err"
    _p=$!
    wait_for 20 test -e "$T/$_n.save.ready" || diag "$_n: the worker did not start"
    kill -TERM "$_p"
    wait "$_p"
    RC=$?
}

stop def /usr/bin/python3 "$T/w.py" "$T/def.save"
is "$RC" 143 "SIGTERM: exit code 143"
is "$(cat "$T/def.save" 2>&1)" "helper alive" \
    "by default the worker saves while its helper still runs (the group gets it later)"

stop tr --stop_group_delay 0 /usr/bin/python3 "$T/w.py" "$T/tr.save"
is "$RC" 143 "--stop_group_delay 0: exit code 143"
is "$(cat "$T/tr.save" 2>&1)" "helper dead" \
    "--stop_group_delay 0: the whole group at once, as torchrun (the helper died under the save)"

MG_STOP_GROUP_DELAY=0 stop env /usr/bin/python3 "$T/w.py" "$T/env.save"
is "$(cat "$T/env.save" 2>&1)" "helper dead" "MG_STOP_GROUP_DELAY=0 does the same"
PET_STOP_GROUP_DELAY=0 stop pet /usr/bin/python3 "$T/w.py" "$T/pet.save"
is "$(cat "$T/pet.save" 2>&1)" "helper dead" "so does PET_STOP_GROUP_DELAY=0"

# A worker that ignores SIGTERM: its helper gets it after the delay, the
# worker SIGKILL at the end of the grace period.
stop ign --stop_group_delay 0.3 --shutdown_timeout 1.5 /usr/bin/python3 "$T/w.py" "$T/ign.save" ignore
is "$RC" 143 "a worker ignoring SIGTERM: exit code 143"
is "$(cat "$T/ign.save.helper" 2>&1)" "helper got SIGTERM" "  its helper got SIGTERM after the delay"
like "$(grep worker_exit "$L/ign/events.jsonl")" '"signal":"SIGKILL"' "  the worker SIGKILL after the grace period"
like "$(grep '"event":"kill"' "$L/ign/events.jsonl")" '"reason":"grace period over"' "  (the kill event says why)"

# A shell wrapper that SIGTERM ends while its program runs on: the program
# gets the signal when the shell exits, and mglaunch waits for it to save.
stop sh --no_python /bin/sh -c "/usr/bin/python3 $T/w.py $T/sh.save; echo done" 
is "$RC" 143 "a shell wrapper: exit code 143"
is "$(cat "$T/sh.save" 2>&1)" "helper dead" \
    "  the program under it got SIGTERM (with its group) and saved before mglaunch ended"
ok test ! -e "$T/sh.save.tmp"

# A shell loop whose SIGTERM ends it between two sleeps: the sleep it leaves
# gets the signal with the group and dies, an orphan's zombie that this
# machine's init may never reap; mglaunch does not wait on it (it did, for
# the whole grace period, when it counted zombies as the group's members).
stop loop --shutdown_timeout 50 --no_python /bin/sh -c \
    ": >$T/loop.save.ready; while :; do sleep 0.05; done"
is "$RC" 143 "a shell loop: exit code 143"
unlike "$(cat "$L/loop/events.jsonl")" '"event":"kill"' "  no SIGKILL: nothing waited for the grace period"

"$MGLAUNCH" --stop_group_delay -1 true >"$T/bad" 2>&1
is $? 2 "--stop_group_delay -1: a usage error"
like "$(cat "$T/bad")" "invalid value '-1' for --stop_group_delay" "  naming the flag"

done_testing
