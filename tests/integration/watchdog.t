#!/bin/sh
# The progress watchdog (launcher/watchdog/, runtime/progress.h): a rank that
# stops moving is named at once with its state from /proc and what the ranks
# were doing (the flight recorder), killed, reported as the attempt's root
# cause, and the group restarts. Each kind of hang: stopped (SIGSTOP), a spin
# in its own code, blocked before a collective, in uninterruptible sleep in
# the kernel; the stacks of every rank taken first (eu-stack, gdb, the
# kernel's for one in uninterruptible sleep, or a line saying there is no
# tool); then train itself frozen with SIGSTOP from outside. Also: a
# stopped worker gets SIGCONT with its stop signal (no grace period spent on
# it), two nodes, --hang-timeout 0 turns the watchdog off, `mglaunch dump` on a live
# job, bad values are refused.
# timeout: 150
. "$(dirname "$0")/../lib/lib.sh"
CR=$HELPERS/comm_rank
for v in $(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset MG_HANG_TIMEOUT
L=$T/logs
# 2 s floor: a rank of a healthy run on a busy machine is not taken for hung
HT=2

# ---- each kind of hang, in comm_rank's steps: rank 1 hangs after 100 steps, in step 101
for kind in stop spin sleep vfork; do
    "$MGLAUNCH" --log_dir "$L" --rdzv_id "$kind" --nproc_per_node 2 --max_restarts 1 \
        --hang-timeout $HT "$CR" steps 400 1 100 "$kind" >"$T/out" 2>"$T/err"
    is $? 0 "$kind: the restarted group finishes"
    e=$(cat "$T/err")
    case $kind in
    stop) st="stopped \\(T: SIGSTOP, SIGTSTP or a job control stop\\)" ;;
    spin) st="running \\(R: on a CPU, in its own code\\)" ;;
    sleep) st="sleeping in the kernel \\(S, in [a-z_]*sleep[a-z_]*\\)" ;;
    vfork) st="in uninterruptible sleep in the kernel \\(D(, in [a-z_]+)?\\)" ;;
    esac
    like "$e" "mglaunch: watchdog: rank 1 \\(local rank 1, host $(hostname), pid [0-9]+\\) is hung: no progress for [0-9.]+ s \\(bound $HT.0 s: --hang-timeout $HT s; its slowest recent step [0-9.e-]+ s\\); it is $st; it was in forward/backward of step 101 \\(100 done\\); rank 0 waits in allreduce #101 \\(bucket 0, 64 KB\\) since [0-9.]+ s; rank 1 last finished #100" \
        "$kind: one line names the rank, its state, what it did and where the others wait"
    if [ $kind = vfork ]; then
        like "$e" "watchdog: local rank 1 is in uninterruptible sleep: its kernel stack is in $L/$kind/attempt_0/1/stacks.txt
mglaunch: watchdog: stacks of local rank 0 in $L/$kind/attempt_0/<local rank>/stacks.txt" \
            "$kind: the stacks of both ranks taken"
    else
        like "$e" "watchdog: stacks of local ranks 0,1 in $L/$kind/attempt_0/<local rank>/stacks.txt" \
            "$kind: the stacks of both ranks taken"
    fi
    s1=$(cat "$L/$kind/attempt_0/1/stacks.txt")
    if [ $kind = vfork ]; then
        # ptrace cannot stop a process in uninterruptible sleep: the kernel's stack
        like "$s1" "^# rank 1 \\(local rank 1, host $(hostname), pid [0-9]+\\), hung, at [0-9-]+ [0-9:.]+, from /proc/[0-9]+/stack" \
            "$kind: rank 1's stack is the kernel's"
        like "$s1" "(kernel_clone|vfork)" "$kind: where it waits"
    else
        like "$s1" "^# rank 1 \\(local rank 1, host $(hostname), pid [0-9]+\\), hung, at [0-9-]+ [0-9:.]+, by eu-stack" \
            "$kind: rank 1's stacks say it is the hung one"
        like "$s1" "#[0-9]+ +0x[0-9a-f]+ (hang_now|cmd_steps)" "$kind: with its frames, where it hangs"
    fi
    like "$(cat "$L/$kind/attempt_0/0/stacks.txt")" "#[0-9]+ +0x[0-9a-f]+ " "$kind: and rank 0's"
    like "$e" "sent SIGKILL to local rank 1 \\(rank 1, pid [0-9]+\\); stopping the other workers" "$kind: killed"
    like "$e" "restarting the workers \\(restart 1 of 1\\)" "$kind: restarted"
    is "$(grep -c ' steps$' "$T/out")" 2 "$kind: both ranks did their steps in the second attempt"
    grep -q '"event":"kill".*"reason":"hung"' "$L/$kind/events.jsonl"
    is $? 0 "$kind: the event log has the kill"
    grep '"event":"worker_exit"' "$L/$kind/events.jsonl" | grep '"rank":1' |
        grep -q '"outcome":"failed".*hung: no progress'
    is $? 0 "$kind: and rank 1's exit as the failure, with why"
done

# ---- no restart left: the summary's root cause is the hung rank, not its peer
"$MGLAUNCH" --log_dir "$L" --rdzv_id last --nproc_per_node 2 --hang-timeout $HT "$CR" \
    steps 400 0 50 sleep >"$T/out" 2>"$T/err"
is $? 137 "no restart left: exit code 137 (the hung rank's SIGKILL)"
e=$(cat "$T/err")
like "$e" "attempt 0 \\(restart 0, [^)]*\\): rank 0 \\(local rank 0, pid [0-9]+\\) was hung: killed by mglaunch's watchdog \\(SIGKILL, exit code 137\\); 1 stopped" \
    "the attempt's line: rank 0 hung, its peer stopped"
like "$e" "  rank      : 0 \\(local rank 0\\)" "root cause: the hung rank"
like "$e" "  message   : hung: no progress for [0-9.]+ s in forward/backward of step 51 \\(50 done\\); sleeping in the kernel" \
    "its message says why"
like "$("$MGLAUNCH" logs "$L" --run last)" "      stacks \\(the watchdog's\\): $L/last/attempt_0/0/stacks.txt" \
    "mglaunch logs names the stacks"

# ---- a wrapper script that runs the program without exec: its process is watched
"$MGLAUNCH" --log_dir "$L" --rdzv_id wrap --nproc_per_node 2 --hang-timeout $HT /bin/sh -c \
    "\"$CR\" steps 400 1 50 spin; echo after" >"$T/out" 2>"$T/err"
is $? 137 "a wrapper: the hung rank's group is killed, its exit code is SIGKILL's"
e=$(cat "$T/err")
like "$e" "watchdog: rank 1 \\(local rank 1, host $(hostname), pid [0-9]+\\) is hung: .* it is running \\(R" \
    "the program under the wrapper is found hung"
like "$(cat "$L/wrap/attempt_0/1/stacks.txt")" "(hang_now|cmd_steps)" "and its stack is the program's, not the shell's"

# ---- the stack tools: gdb when eu-stack is missing, a clear line when both are
mkdir "$T/gdbonly" "$T/none"
if command -v gdb >/dev/null; then
    ln -s "$(command -v gdb)" "$T/gdbonly/gdb"
    PATH=$T/gdbonly "$MGLAUNCH" --log_dir "$L" --rdzv_id gdb --nproc_per_node 2 --hang-timeout $HT \
        "$CR" steps 400 1 50 sleep >"$T/out" 2>"$T/err"
    s1=$(cat "$L/gdb/attempt_0/1/stacks.txt")
    like "$s1" "^# rank 1 .*, hung, at .*, by gdb -batch" "gdb took the stacks"
    like "$s1" "#[0-9]+ +.*(sleep|hang_now|cmd_steps)" "with frames"
else
    ok true "# SKIP gdb not installed"
fi
PATH=$T/none "$MGLAUNCH" --log_dir "$L" --rdzv_id none --nproc_per_node 2 --hang-timeout $HT \
    "$CR" steps 400 1 50 sleep >"$T/out" 2>"$T/err"
is $? 137 "no stack tool: the hung rank is killed all the same"
like "$(cat "$T/err")" "watchdog: no stacks taken: neither eu-stack \\(Debian's elfutils\\) nor gdb is installed" \
    "and says why there are no stacks"

# ---- train frozen from outside
"$MGLAUNCH" --log_dir "$L" --rdzv_id train --nproc_per_node 2 --max_restarts 1 --hang-timeout $HT \
    "$TRAIN" --data synthetic --train-samples 4096 --test-samples 256 --batch-size 32 --epochs 40 \
    --log-every 50 >"$T/out" 2>"$T/err" &
M=$!
at_cleanup "kill -KILL $M 2>/dev/null"
wait_for 60 grep -q '^step ' "$T/out" || bail "train did not start its steps"
W=$(sed -n 's/.*"event":"worker_start".*"local_rank":1.*"pid":\([0-9]*\).*/\1/p' "$L/train/events.jsonl" | head -1)
[ -n "$W" ] || bail "no pid for local rank 1 in the event log"
kill -STOP "$W"
wait $M
is $? 0 "train: restarted after the hang, and finished"
e=$(cat "$T/err")
like "$e" "watchdog: rank 1 \\(local rank 1, host $(hostname), pid $W\\) is hung: no progress for [0-9.]+ s \\(bound [0-9.]+ s: [^)]*\\); it is stopped \\(T: SIGSTOP" \
    "train: the frozen rank named, stopped"
like "$e" "it was in [a-z/ ]+ (of step [0-9]+ \\([0-9]+ done\\)|after step [0-9]+)(, inside allreduce #[0-9]+ \\([^)]*\\))?; rank 0 waits in [a-z_]+ #[0-9]+( \\([^)]*\\))? since [0-9.]+ s; rank 1 last finished #[0-9]+" \
    "train: rank 0 waits in a collective (a bucket's allreduce, or another collective at an epoch's end)"
like "$(cat "$T/out")" "train: done" "train: done"

# ---- the watchdog off: a stopped worker still stops at once on SIGTERM (SIGCONT)
"$MGLAUNCH" --log_dir "$L" --rdzv_id off --nproc_per_node 2 --hang-timeout 0 "$CR" \
    steps 100000 1 50 stop >"$T/out" 2>"$T/err" &
M=$!
at_cleanup "kill -KILL $M 2>/dev/null"
wait_for 30 grep -q 'hangs (stop)' "$T/err" || bail "rank 1 did not stop itself"
W=$(sed -n 's/.*"event":"worker_start".*"local_rank":1.*"pid":\([0-9]*\).*/\1/p' "$L/off/events.jsonl" | head -1)
wait_for 10 grep -q ') T ' "/proc/$W/stat"
is $? 0 "rank 1 is stopped"
sleep 1
unlike "$(cat "$T/err")" "watchdog" "--hang-timeout 0: no watchdog"
kill -TERM $M
wait $M
is $? 143 "SIGTERM ends the run"
unlike "$(cat "$T/err")" "grace period over" "the stopped worker obeyed SIGTERM (SIGCONT sent with it)"

# ---- two nodes (two agents on loopback, c10d): the hung rank's node names it;
# the other says its ranks wait for a rank elsewhere, and learns the verdict
# (node 1's bound is the longer, so node 0 surely sees the wait before the verdict)
P=$(free_port)
for n in 0 1; do
    "$MGLAUNCH" --log_dir "$L/n$n" --rdzv_id mn --nnodes 2 --nproc_per_node 1 --rdzv_backend c10d \
        --rdzv_endpoint "127.0.0.1:$P" --hang-timeout $((HT + n * 2)) "$CR" steps 400 1 100 sleep \
        >"$T/mn$n" 2>&1 &
    eval "mn$n=\$!"
done
at_cleanup "kill -KILL $mn0 $mn1 2>/dev/null"
wait $mn0
c0=$?
wait $mn1
c1=$?
is "$c0 $c1" "137 137" "two nodes: both end with the hung rank's exit code"
like "$(cat "$T/mn1")" "watchdog: rank 1 \\(local rank 0, host $(hostname), pid [0-9]+\\) is hung" \
    "the hung rank's node names it"
e=$(cat "$T/mn0")
like "$e" "watchdog: no progress on $(hostname) for the ranks here; rank 0 waits in allreduce #101 \\(bucket 0, 64 KB\\) since [0-9.]+ s: the rank they wait for is on another node" \
    "the other node says whom its rank waits for"
like "$e" "the job failed: rank 1 \\(local rank 0\\) on $(hostname) exited with code 137: hung: no progress" \
    "and learns the verdict through the rendezvous"

# ---- mglaunch dump on a live job: records and stacks, the job goes on
# (with 100 KB of environment in front of MG_PROGRESS_FD, as a pod's can be)
BIG_ENV=$(head -c 100000 /dev/zero | tr '\0' x) "$MGLAUNCH" --log_dir "$L" --rdzv_id live --nproc_per_node 2 "$CR" steps 1000000000 1 -1 none \
    >"$T/live.out" 2>"$T/live.err" &
M=$!
at_cleanup "kill -KILL $M 2>/dev/null"
wait_for 30 grep -q 'first step done' "$T/live.err" || bail "the live job did not start its steps"
"$MGLAUNCH" dump "$L" --run live >"$T/dump" 2>&1
is $? 0 "mglaunch dump: exit 0"
d=$(cat "$T/dump")
like "$d" "^run live, attempt 0, host $(hostname), at " "names the run"
for r in 0 1; do
    like "$d" "rank $r \\(local rank $r, pid [0-9]+\\): [a-z]+" "rank $r and its state"
done
like "$d" "  in [a-z/ ]+ (of step [0-9]+ \\([0-9]+ done\\)|after step [0-9]+|before its first step) for [0-9.]+ s; last progress [0-9.]+ s ago" "its step and phase"
like "$d" "  last finished collective: allreduce #[0-9]+ \\(bucket 0, 64 KB\\), [0-9.]+ ms" "its last collective"
like "$d" "  #[0-9]+ +0x[0-9a-f]+ (cmd_steps|mg_comm_allreduce|main)" "and its stack"
f=$(sed -n 's/^  saved in \(.*dump-[0-9]*\.txt\)$/\1/p' "$T/dump" | head -1)
like "$(head -1 "$f" 2>/dev/null)" "^# mglaunch dump at " "saved in the attempt's directory: $f"
grep -q "^# stacks, by eu-stack" "$f"
is $? 0 "with the stacks"
ok kill -0 $M
like "$("$MGLAUNCH" logs "$L" --run live)" "      mglaunch dump: $L/live/attempt_0/1/dump-[0-9]+.txt" \
    "mglaunch logs names the dumps"
kill -TERM $M
wait $M
"$MGLAUNCH" dump "$L" --run live >"$T/dump" 2>&1
is $? 1 "a run that ended: exit 1"
like "$(cat "$T/dump")" "mglaunch dump: run live in $L is not running \\(its mglaunch has ended\\)" "says so"
"$MGLAUNCH" dump "$L" --bogus >"$T/dump" 2>&1
is $? 2 "a bad argument: exit 2"
like "$(cat "$T/dump")" "mglaunch dump: unknown argument '--bogus'" "says which"

# ---- bad values
"$MGLAUNCH" --hang-timeout soon "$CR" info >"$T/out" 2>"$T/err"
is $? 2 "a bad --hang-timeout: usage error"
like "$(cat "$T/err")" "invalid value 'soon' for --hang-timeout: expected a number of seconds \\(0 turns the watchdog off\\)" \
    "says what was wrong"
MG_HANG_TIMEOUT=-1 "$MGLAUNCH" "$CR" info >"$T/out" 2>"$T/err"
is $? 2 "a bad MG_HANG_TIMEOUT: usage error"
like "$(cat "$T/err")" "MG_HANG_TIMEOUT" "names the variable"
done_testing
