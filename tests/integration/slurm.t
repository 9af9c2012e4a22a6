#!/bin/sh
# mglaunch under a real Slurm: munged, slurmctld and two slurmd (nodes n1 and
# n2, each on its own test host) started by tests/lib/slurm.sh. srun -N2 runs
# one mglaunch per node and they train together; the shapes the issue lists
# (more tasks than nodes, mglaunch without srun in a multi-node batch script,
# two jobs sharing a node, a single-node step's run id) and scancel during
# training (ten times: exit 143 on every node, nothing left behind); an sbatch
# job preempted with SIGUSR1 requeues itself and resumes from its checkpoint;
# SIGUSR1 to mglaunch reaches the worker and not its children;
# --nproc_per_node gpu counts the GPUs Slurm gave the step.
# timeout: 150
. "$(dirname "$0")/../lib/lib.sh"
. "$TOP/tests/lib/netns.sh"
. "$TOP/tests/lib/slurm.sh"

slurm_have 2>"$T/why" || skip_all "no Slurm here: $(head -n 1 "$T/why")"
hosts_up 2
slurm_up 2>"$T/why" || bail "Slurm starts: $(head -c 300 "$T/why")"

CNN="--model cnn --data fashion-mnist --steps 30 --train-samples 2048 --test-samples 512 --log-every 10"

show() { sed 's/^/#   /' "$1" | tail -n "${2:-12}"; }
none_running() { ! pgrep -f "$1" >/dev/null; }
requeued() { sl squeue -h -j "$1" -o '%T %r' 2>/dev/null | grep -q 'PENDING'; }

# 1. One mglaunch per node, the static rendezvous taken from SLURM_*.
sl srun -N2 "$MGLAUNCH" --nproc_per_node 1 "$TRAIN" $CNN >"$T/s1" 2>&1
rc=$?
if [ $rc = 0 ] && grep -q 'tcp ring of 2 ranks on 2 hosts' "$T/s1" && grep -q '^train: done: .* 30 steps' "$T/s1"; then
    _result 0 "srun -N2 mglaunch train: two nodes train together"
else
    _result 1 "srun -N2 mglaunch train: two nodes train together (exit $rc)"
    show "$T/s1"
fi
like "$(cat "$T/s1")" "Slurm: --nnodes 2, --node_rank 1, --master_addr n1, --master_port 1[0-9]{4} \(the job's\)" \
    "mglaunch says what it took from SLURM_*, and the job's port"

# 2. Two tasks on one node would be two independent trainings.
sl timeout 20 srun -N1 -n2 "$MGLAUNCH" --nproc_per_node 1 "$TRAIN" $CNN >"$T/s2" 2>&1
rc=$?
n=$(grep -c '^train: done' "$T/s2")
[ $rc != 0 ] && [ $rc != 124 ] && [ "$n" = 0 ] && grep -q -- '--ntasks-per-node=1' "$T/s2"
_result $? "srun -N1 -n2 mglaunch is refused, naming --ntasks-per-node=1 ($n trainings ran, exit $rc)"
like "$(grep -m1 mglaunch: "$T/s2")" "one mglaunch per node: this Slurm step runs 2 tasks on 1 node" "  and saying why"

# 3. Two tasks per node on two nodes.
sl timeout 8 srun -N2 --ntasks-per-node=2 "$MGLAUNCH" --nproc_per_node 1 "$TRAIN" $CNN >"$T/s3" 2>&1
rc=$?
[ $rc != 0 ] && [ $rc != 124 ] && grep -q -- 'srun --nodes=2 --ntasks=2 --ntasks-per-node=1' "$T/s3"
_result $? "srun -N2 --ntasks-per-node=2 mglaunch is refused at once, naming the srun line (exit $rc)"
[ $? = 0 ] || show "$T/s3"

# 4. mglaunch in a two-node batch script, without srun: it runs on the first
# node only.
id=$(sl sbatch --parsable -N2 -J nosrun -o "$T/s4" --wrap "exec $MGLAUNCH --nproc_per_node 1 $TRAIN $CNN")
slurm_wait_gone "$id" 8
gone=$?
[ $gone = 0 ] || sl scancel "$id"
slurm_wait_gone "$id" 10
[ $gone = 0 ] && grep -q 'batch script of Slurm job .* srun --nodes=2' "$T/s4"
_result $? "mglaunch in a 2-node batch script without srun stops at once and says to use srun"
[ $? = 0 ] || show "$T/s4"

# 5. Two jobs sharing both nodes, each on the default static port.
bg_sl srun -N2 -J share1 "$MGLAUNCH" --nproc_per_node 1 "$TRAIN" $CNN >"$T/s5a" 2>&1
pa=$!
bg_sl srun -N2 -J share2 "$MGLAUNCH" --nproc_per_node 1 "$TRAIN" $CNN >"$T/s5b" 2>&1
pb=$!
wait $pa
ra=$?
wait $pb
rb=$?
is "$ra $rb" "0 0" "two jobs sharing both nodes train at once (a per-job default port)"
[ "$ra $rb" = "0 0" ] || diag "$(cat "$T/s5a" "$T/s5b" | grep -m1 -i 'in use\|cannot')"

# 6. A one-node step's run id is the job's.
sl srun -N1 "$MGLAUNCH" --nproc_per_node 1 sh -c 'echo "job=$SLURM_JOB_ID run=$TORCHELASTIC_RUN_ID"' >"$T/s6" 2>&1
line=$(grep '^job=' "$T/s6")
job=$(printf '%s' "$line" | sed 's/job=\([0-9]*\) .*/\1/')
[ -n "$job" ] && [ "$line" = "job=$job run=slurm-$job" ]
_result $? "a single-node step's run id is slurm-<jobid> ($line)"

# 7. scancel while training: every mglaunch stops with 143 (stopped, not a
# failure) and nothing is left behind. Ten times: the misclassification is a race.
bad_status=0
bad_orphans=0
for i in 1 2 3 4 5 6 7 8 9 10; do
    L=$T/c$i
    bg_sl srun -N2 -J "cancel$i" sh -c "exec $MGLAUNCH --log_dir $L/\$SLURMD_NODENAME --nproc_per_node 1 $TRAIN --model mlp --data synthetic --steps 1000000 --log-every 50" >"$T/c$i.out" 2>&1
    sp=$!
    wait_for 20 grep -q '^step ' "$T/c$i.out" || diag "trial $i: training did not start: $(tail -n 3 "$T/c$i.out" | tr '\n' ' ')"
    sl scancel -n "cancel$i"
    wait $sp
    for n in n1 n2; do
        st=$("$MGLAUNCH" logs "$L/$n" 2>&1 | grep '^\*')
        case $st in
        *"stopped by SIGTERM (exit 143)"*) ;;
        *)
            bad_status=$((bad_status + 1))
            diag "trial $i $n: $st"
            grep -E '^mglaunch|^train' "$T/c$i.out" | sed 's/^/#     /' | head -n 12
            ;;
        esac
    done
    # Everything of the job (it names $L) is gone within Slurm's KillWait (5 s).
    if ! wait_for 6 none_running "$L/"; then
        bad_orphans=$((bad_orphans + 1))
        diag "trial $i: left behind: $(pgrep -af "$L/" | head -n 3 | tr '\n' ' ')"
    fi
done
is "$bad_orphans" 0 "scancel during training, 10 trials: no process of the job is left"
is "$bad_status" 0 "scancel during training, 10 trials: every node's mglaunch is stopped by SIGTERM, exit 143"

# 8. Preemption, with docs/slurm.md's sbatch script: Slurm's warning signal
# (--signal=B:USR1@90, sent here at once) reaches the batch script, which
# requeues the job; the new run resumes from the checkpoint. Only the sizes
# change: two nodes without GPUs, a short training, a checkpoint every 10 steps.
sed -n '/^```sh$/,/^```$/p' "$TOP/docs/slurm.md" | sed -n '2,/^```$/p' | sed '$d' >"$T/doc.sh"
sed -e 's/--nodes=4/--nodes=2/' -e 's/--gpus-per-node=8 --cpus-per-task=32/--cpus-per-task=1/' \
    -e 's/--time=24:00:00/--time=10/' -e 's/--nproc_per_node gpu/--nproc_per_node 1/' \
    -e 's/--epochs 90/--steps 150 --train-samples 2048 --test-samples 512 --log-every 10/' \
    -e 's/--checkpoint-every 500/--checkpoint-every 10/' "$T/doc.sh" >"$T/job.sh"
like "$(head -n 1 "$T/doc.sh") $(grep -c . "$T/job.sh")" '^#!/bin/bash [1-9]' "docs/slurm.md's sbatch script is there"
diff "$T/doc.sh" "$T/job.sh" | grep '^>' | sed 's/^/# changed: /'
CK=$T/mg-train
id=$(SCRATCH=$T PATH="$MG_BUILD/bin:$PATH" sl sbatch --parsable -D "$T" -o "$T/s8" "$T/job.sh")
wait_for 30 sh -c "ls '$CK' 2>/dev/null | grep -q 'ckpt-.*mgc$'" || diag "no checkpoint: $(tail -n 3 "$T/s8" | tr '\n' ' ')"
sl scancel --batch --signal=USR1 "$id"
# Slurm holds a requeued job back for a while (reason BeginTime); let it go.
if _sl_poll 10 requeued "$id"; then
    sl scontrol update JobId="$id" StartTime=now
else
    diag "job $id was not requeued: $(sl squeue -h -j "$id" -o '%T %r')"
fi
slurm_wait_gone "$id" 40 || { diag "job $id still queued: $(sl squeue -h -j "$id" -o '%T %r')"; sl scancel "$id"; }
out=$(cat "$T/s8")
like "$out" "requeueing $id" "SIGUSR1 reached the batch script, which requeued the job"
runs=$(grep -c 'Slurm: --nnodes 2, --node_rank 0' "$T/s8")
is "$runs" 2 "the job ran twice"
[ "$runs" = 2 ] ||
    diag "job $id: $(sl scontrol -o show job "$id" 2>&1 | grep -o 'JobState=[^ ]* Reason=[^ ]*\|Restarts=[^ ]*' | tr '\n' ' ')"
like "$out" "train: resumed from $CK/ckpt-0*[1-9][0-9]*.mgc" "the second run resumed from a checkpoint"
like "$out" "train: done: .* step" "and trained to the end"
[ $? = 0 ] || show "$T/s8" 20
# 9. SIGUSR1 to mglaunch itself (a one-node batch script passing Slurm's
# warning on to it): the worker, which handles it, gets it; the worker's child,
# which has no handler, is the worker's business and must survive.
cat >"$T/usr1.sh" <<EOS
#!/bin/sh
$MGLAUNCH --nproc_per_node 1 sh -c 'trap "echo worker got USR1" USR1; sleep 1000 & c=\$!; echo "child \$c"; while kill -0 \$c 2>/dev/null; do wait \$c; done; echo "child gone"' &
pid=\$!
trap 'kill -USR1 \$pid' USR1
wait \$pid
wait \$pid
EOS
id=$(sl sbatch --parsable -N1 -o "$T/s9" "$T/usr1.sh")
wait_for 20 grep -q '^child [0-9]' "$T/s9" || diag "the worker did not start: $(tail -n 3 "$T/s9" | tr '\n' ' ')"
child=$(sed -n 's/^child \([0-9]*\)$/\1/p' "$T/s9" | head -n 1)
sl scancel --batch --signal=USR1 "$id"
DESC="SIGUSR1 to mglaunch reaches the worker, which handles it" ok wait_for 10 grep -q '^worker got USR1' "$T/s9"
sleep 0.5
DESC="the worker's child without a handler survives SIGUSR1" ok kill -0 "$child"
sl scancel "$id"
slurm_wait_gone "$id" 15

# 10. --nproc_per_node gpu: one worker per GPU Slurm gave the step on each
# node (the cluster's GPUs are files; what the machine has does not count).
NOCVD="env -u CUDA_VISIBLE_DEVICES -u NVIDIA_VISIBLE_DEVICES"
sl srun -N2 --gpus-per-node=2 $NOCVD "$MGLAUNCH" --nproc_per_node gpu sh -c 'echo "rank $RANK of $WORLD_SIZE"' >"$T/s10" 2>&1
is "$(grep -c '^rank [0-3] of 4$' "$T/s10")" 4 "srun -N2 --gpus-per-node=2, --nproc_per_node gpu: 4 workers, 2 per node"
[ $? = 0 ] || show "$T/s10"
sl srun -N1 --gpus-per-node=1 $NOCVD "$MGLAUNCH" --nproc_per_node auto sh -c 'echo "rank $RANK of $WORLD_SIZE"' >"$T/s11" 2>&1
is "$(grep '^rank' "$T/s11")" "rank 0 of 1" "srun -N1 --gpus-per-node=1, --nproc_per_node auto: 1 worker"
if ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
    diag "this machine has GPUs: a step without any would count them"
else
    sl srun -N1 $NOCVD "$MGLAUNCH" --nproc_per_node gpu true >"$T/s12" 2>&1
    like "$(cat "$T/s12")" "no GPU found \(no NVIDIA GPU" "a step without GPUs: --nproc_per_node gpu says there are none"
fi
done_testing
