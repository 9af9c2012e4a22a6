#!/bin/sh
# Checkpoints belong to a job (docs/train.md, "Checkpoints belong to a job").
# The reproduction of issue 11: run A to step 1500 with a checkpoint every 10
# steps; run B, with another lr and --max_restarts 1, in the same directory;
# SIGKILL B's worker at step 260. B must neither prune nor resume A's
# checkpoints (before this, the restart resumed A's step 1500 and finished with
# A's weights, exit 0): it is refused at the start, naming A, what differs and
# the ways out. Then: --resume auto with another lr is refused for not
# fitting; with the same configuration it takes the directory over; A's
# command run again (another run id, the same job) continues; a run whose
# directory was taken over stops before its next checkpoint; resuming and
# pruning keep to the job's own checkpoints; a standalone train is identified
# by its configuration; markers written before runs were recorded are
# continued by the same job; a checkpoint written before CONFIG existed cannot
# show its job and is continued only with --resume auto.
# timeout: 180
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] && [ -x "$MGLAUNCH" ] || skip_all "train or mglaunch not built"

ARGS="--data synthetic --train-samples 512 --test-samples 128 --model mlp --hidden 32
      --batch-size 32 --checkpoint-every 10 --log-every 10"
ck=$T/ck
hash_of() { sed -n 's/.*done:.*param hash \([0-9a-f]*\).*/\1/p' "$1" | tail -n 1; }
# the directory's files with their checksums: what "untouched" means
state() { (cd "$1" && md5sum $(ls | sort)); }

"$MGLAUNCH" --nproc_per_node 1 --rdzv_id runA --log_dir "$T/logs" "$TRAIN" $ARGS --lr 0.05 \
    --steps 1500 --checkpoint-dir "$ck" >"$T/a.out" 2>&1
is $? 0 "run A: 1500 steps, a checkpoint every 10"
ok test -f "$ck/ckpt-000000001500.done"
state "$ck" >"$T/a.state"

# run B: another lr, one restart allowed, its worker SIGKILLed at step 260
"$MGLAUNCH" --nproc_per_node 1 --max_restarts 1 --log_dir "$T/logs" "$TRAIN" $ARGS --lr 0.1 \
    --steps 1500 --checkpoint-dir "$ck" >"$T/b.out" 2>&1 &
lp=$!
at_cleanup "kill -KILL $lp 2>/dev/null"
killer() {
    while kill -0 "$lp" 2>/dev/null; do
        if grep -q "step 260/" "$T/b.out" 2>/dev/null; then
            w=$(pgrep -P "$lp" -x train)
            [ -n "$w" ] && kill -KILL $w && echo killed >"$T/b.killed"
            return
        fi
        sleep 0.01
    done
}
killer &
kp=$!
at_cleanup "kill -KILL $kp 2>/dev/null"
wait "$lp"
rc=$?
wait "$kp"
is "$rc" 2 "run B is refused (exit 2: do not retry)"
unlike "$(cat "$T/b.out")" "resumed from" "B resumes none of A's checkpoints"
like "$(cat "$T/b.out")" "'$ck' holds the checkpoints of another job, run 'runA' \(newest: step 1500\): written with lr 0.05 \(this run: 0.1\). To continue that job, run it with its settings; to start this one, use another --checkpoint-dir \(or start from its weights: --resume $ck/ckpt-000000001500.mgc with another --checkpoint-dir\)" \
    "the message names the run that owns the directory, what differs and the ways out"
is "$(state "$ck")" "$(cat "$T/a.state")" "A's checkpoints are untouched: none pruned, none written"

# --resume auto continues A's checkpoints only when they fit: another lr does not
"$MGLAUNCH" --nproc_per_node 1 --log_dir "$T/logs" "$TRAIN" $ARGS --lr 0.1 --steps 1600 \
    --checkpoint-dir "$ck" --resume auto >"$T/c.out" 2>&1
is $? 2 "--resume auto with another lr is refused"
like "$(cat "$T/c.out")" "cannot resume: '$ck/ckpt-000000001500.mgc' does not fit this run: written with lr 0.05 \(this run: 0.1\)" \
    "saying what differs"
is "$(state "$ck")" "$(cat "$T/a.state")" "and the directory stays A's"

# the same configuration with --resume auto takes the directory over
"$MGLAUNCH" --nproc_per_node 1 --rdzv_id runC --log_dir "$T/logs" "$TRAIN" $ARGS --lr 0.05 \
    --steps 1600 --checkpoint-dir "$ck" --resume auto >"$T/d.out" 2>&1
is $? 0 "--resume auto with A's configuration"
like "$(cat "$T/d.out")" "resumed from $ck/ckpt-000000001500.mgc \(step 1500" "continues from A's newest"
like "$(cat "$T/d.out")" "continuing this job's checkpoints in '$ck', from run 'runA' \(newest: step 1500\)" \
    "and says whose checkpoints of this job it continues"
unlike "$(cat "$T/d.out")" "warning: this run" "without a take-over warning: they are this job's"
like "$(sed -n 2p "$ck/ckpt-owner")" "^run [0-9a-f]{16} runC$" "the owner record names the new run"
is "$(ls "$ck" | grep -c '\.done$')" 3 "--keep-checkpoints 3 counts A's checkpoints as its own now"
ok test -f "$ck/ckpt-000000001600.done"
# A's command again, under a new run id: the same job, so it goes on from C's checkpoints
"$MGLAUNCH" --nproc_per_node 1 --log_dir "$T/logs" "$TRAIN" $ARGS --lr 0.05 \
    --steps 1700 --checkpoint-dir "$ck" >"$T/a2.out" 2>&1
is $? 0 "A's command run again continues the job"
like "$(cat "$T/a2.out")" "continuing this job's checkpoints in '$ck', from run 'runC' \(newest: step 1600\)" \
    "saying whose checkpoints it continues"
like "$(cat "$T/a2.out")" "resumed from $ck/ckpt-000000001600.mgc \(step 1600" "from the newest"
unlike "$(cat "$T/a2.out")" "took '$ck' over" "no take-over warning: it is the same job"
ok test -f "$ck/ckpt-000000001700.done"

# a run whose directory is taken over while it runs stops before its next checkpoint
ck2=$T/ck2
"$TRAIN" $ARGS --steps 1000000 --keep-checkpoints 0 --checkpoint-dir "$ck2" >"$T/e.out" 2>&1 &
ep=$!
at_cleanup "kill -KILL $ep 2>/dev/null"
wait_for 30 test -f "$ck2/ckpt-000000000010.done"
"$TRAIN" $ARGS --steps 5 --lr 0.01 --checkpoint-dir "$ck2" --resume "$ck2/ckpt-000000000010.mgc" \
    >"$T/f.out" 2>&1
is $? 0 "--resume FILE in another run's directory takes it over (the weights on purpose)"
like "$(cat "$T/f.out")" "warning: '$ck2/ckpt-000000000010.mgc' was written with another configuration: lr 0.05 \(this run: 0.01\)" \
    "--resume FILE warns about what differs instead of refusing"
gone() { ! kill -0 "$1" 2>/dev/null; }
wait_for 60 gone "$ep" || kill -KILL "$ep"
wait "$ep"
is $? 2 "the first run stops"
like "$(cat "$T/e.out")" "cannot write a checkpoint: run 'config-[0-9a-f]{16}' took '$ck2' over; stopping so as not to overwrite its checkpoints" \
    "before it overwrites the new owner's checkpoints"

# a standalone train is identified by its configuration: the same command
# again continues; another configuration is another run
ck3=$T/ck3
"$TRAIN" $ARGS --steps 30 --checkpoint-dir "$ck3" >"$T/g1.out" 2>&1
"$TRAIN" $ARGS --steps 50 --checkpoint-dir "$ck3" >"$T/g2.out" 2>&1
is $? 0 "the same command again, longer"
like "$(cat "$T/g2.out")" "resumed from $ck3/ckpt-000000000030.mgc \(step 30" "continues where it stopped"
"$TRAIN" $ARGS --steps 50 --checkpoint-dir "$ck3" --warmup 5 >"$T/g3.out" 2>&1
is $? 2 "another configuration is another job"
like "$(cat "$T/g3.out")" "holds the checkpoints of another job, run 'config-[0-9a-f]{16}' \(newest: step 50\): written with warmup 0 \(this run: 5\)" \
    "refused, with the run and the difference named"
is "$(grep -c "another job" "$T/g3.out")" 1 "once"

# resuming and pruning keep to the run's own checkpoints: a newer checkpoint of
# another run that appeared in the directory is neither resumed nor removed
ck4=$T/ck4
"$TRAIN" $ARGS --steps 60 --checkpoint-dir "$T/other" --lr 0.01 >/dev/null 2>&1
"$TRAIN" $ARGS --steps 20 --checkpoint-dir "$ck4" >/dev/null 2>&1
cp "$T/other/ckpt-000000000060.mgc" "$T/other/ckpt-000000000060.done" "$ck4/"
"$TRAIN" $ARGS --steps 50 --checkpoint-dir "$ck4" --keep-checkpoints 1 >"$T/h.out" 2>&1
is $? 0 "a run with another run's checkpoint among its own"
like "$(cat "$T/h.out")" "resumed from $ck4/ckpt-000000000020.mgc" "resumes its own newest, not the other's"
is "$(ls "$ck4" | grep '\.done$' | tr '\n' ' ')" "ckpt-000000000050.done ckpt-000000000060.done " \
    "--keep-checkpoints 1 kept its newest and left the other run's alone"

# markers from before runs were recorded (and no owner record): the same job's
# command continues them
ck5=$T/ck5
"$TRAIN" $ARGS --steps 20 --checkpoint-dir "$ck5" >/dev/null 2>&1
rm "$ck5/ckpt-owner"
for m in "$ck5"/*.done; do
    s=$(basename "$m" .done | sed 's/^ckpt-0*//')
    echo "mg checkpoint complete: step $s" >"$m"
done
"$TRAIN" $ARGS --steps 30 --checkpoint-dir "$ck5" >"$T/i.out" 2>&1
is $? 0 "checkpoints without a recorded run, of this job"
like "$(cat "$T/i.out")" "continuing this job's checkpoints in '$ck5', from run \(no run id: written before checkpoints recorded their run\) \(newest: step 20\)" \
    "are continued, saying whose"
like "$(cat "$T/i.out")" "resumed from $ck5/ckpt-000000000020.mgc" "from their newest"

# a checkpoint written before CONFIG existed cannot show its job: refused,
# and --resume auto continues it
ck6=$T/ck6
"$MGLAUNCH" --nproc_per_node 1 --rdzv_id old --log_dir "$T/logs" "$TRAIN" $ARGS --steps 20 \
    --checkpoint-dir "$ck6" >/dev/null 2>&1
/usr/bin/python3 - "$ck6/ckpt-000000000020.mgc" <<'PY'
# drops the CONFIG section (tag 6) and writes the header's sizes and CRCs again
import struct, sys, zlib
p = sys.argv[1]
b = open(p, "rb").read()
hdr, raw = bytearray(b[:64]), zlib.decompress(b[64:])
out, i = b"", 0
while True:
    tag, idx, n = struct.unpack_from("<IIQ", raw, i)
    if tag != 6:
        out += raw[i:i + 16 + n]
    i += 16 + n
    if tag == 0:
        break
z = zlib.compress(out)
struct.pack_into("<QQ", hdr, 16, len(z), len(out))
struct.pack_into("<I", hdr, 52, zlib.crc32(z))
struct.pack_into("<I", hdr, 60, zlib.crc32(bytes(hdr[:60])))
open(p, "wb").write(bytes(hdr) + z)
PY
"$MGLAUNCH" --nproc_per_node 1 --log_dir "$T/logs" "$TRAIN" $ARGS --steps 30 \
    --checkpoint-dir "$ck6" >"$T/k.out" 2>&1
is $? 2 "a checkpoint without CONFIG of another run: refused"
like "$(cat "$T/k.out")" "holds the checkpoints of another job, run 'old' \(newest: step 20\): written before checkpoints recorded their configuration, so whether it is this job cannot be told \(--resume auto continues it\)" \
    "saying why and what to do"
"$MGLAUNCH" --nproc_per_node 1 --log_dir "$T/logs" "$TRAIN" $ARGS --steps 30 \
    --checkpoint-dir "$ck6" --resume auto >"$T/l.out" 2>&1
is $? 0 "--resume auto continues it"
like "$(cat "$T/l.out")" "resumed from $ck6/ckpt-000000000020.mgc" "from that checkpoint"
like "$(cat "$T/l.out")" "warning: this run \('[^']*'\) took '$ck6' over from run 'old' \(newest: step 20\): its checkpoints count as this run's from now on" \
    "and warns that it took over a directory it cannot tell is this job's"
done_testing
