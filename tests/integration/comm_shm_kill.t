#!/bin/sh
# Nothing is left in /dev/shm, whatever dies when: each of 3 ranks on one host
# is SIGKILLed at each step of the CPU communicator's bootstrap
# (MG_COMM_DEBUG_KILL=STEP@RANK, docs/distributed.md), mglaunch stops the
# others, and no shared memory segment of the job remains. Before the segment
# was a memfd, a leader killed after creating it, or a rank killed before
# attaching it, left 2 MB in /dev/shm until reboot.
# timeout: 240
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] && [ -x "$MGLAUNCH" ] || skip_all "train or mglaunch not built"
[ -d /dev/shm ] || skip_all "no /dev/shm"

RUN=shmkill$$
# what a job of this test left (mg names a segment after its run id), removed
# at the end whatever happened
left() { ls /dev/shm | grep -c "^mg-$1-" ; }
at_cleanup "rm -f /dev/shm/mg-$RUN-*"
steps="nonce published planned shm-created shm-published shm-attached shm-ready ring checked"
for step in $steps; do
    for rank in 0 1 2; do
        # the leader creates and publishes the segment, the others attach it
        fires=1
        case $step in
        shm-created | shm-published) [ $rank = 0 ] || fires=0 ;;
        shm-attached) [ $rank != 0 ] || fires=0 ;;
        esac
        MG_COMM_DEBUG_KILL=$step@$rank "$MGLAUNCH" --nproc_per_node 3 --rdzv_id "$RUN-$step-$rank" \
            --log_dir "$T/logs" --monitor_interval 0.05 "$TRAIN" --data synthetic \
            --train-samples 96 --test-samples 32 --hidden 8 --batch-size 8 --steps 2 \
            >"$T/out" 2>&1
        rc=$?
        if [ $fires = 1 ]; then
            is "$rc" 137 "rank $rank killed at '$step': the job fails with its SIGKILL"
        else
            is "$rc" 0 "rank $rank never reaches '$step': the job runs"
        fi
        is "$(left "$RUN-$step-$rank")" 0 "rank $rank killed at '$step': nothing of the job in /dev/shm"
    done
done
done_testing
