#!/bin/sh
# Every output of train says where it goes, once, in its opening lines
# (docs/train.md, "Where everything goes"): the metrics file, TensorBoard's
# events file, CSV's metrics.csv, the checkpoint directory, the remote copies,
# as absolute paths (relative flags included) and a URL without its password;
# each named file is the one written. A run with none of them says none.
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] && [ -x "$MGLAUNCH" ] || skip_all "train or mglaunch not built"

DATA="--data synthetic --train-samples 256 --test-samples 64 --model mlp --hidden 16 --steps 8"
cd "$T" || bail "no temp dir"
mkdir out
"$MGLAUNCH" --nproc_per_node 2 --log_dir logs "$TRAIN" $DATA --tensorboard --csv \
    --checkpoint-dir ./ck --checkpoint-every 4 --keep-checkpoints 2 \
    --upload-cmd "cp {} '$T/out/'" >a.out 2>&1
is $? 0 "a run under mglaunch with every output"
run=$(ls logs | head -n 1)
T=$(pwd -P) # getcwd's spelling
metrics=$(sed -n 's/^train: metrics: //p' a.out)
is "$metrics" "$T/logs/$run/attempt_0/metrics.jsonl" "the metrics file, absolute"
ok test -s "$metrics"
tb=$(sed -n 's/^train: TensorBoard: \([^ ]*\) (tensorboard --logdir \([^)]*\))$/\1 \2/p' a.out)
like "$tb" "^$T/logs/$run/tensorboard/events\.out\.tfevents\.[^ ]+ $T/logs/$run/tensorboard$" \
    "TensorBoard: the events file, and the directory to give tensorboard"
ok test -s "${tb%% *}"
csv=$(sed -n 's/^train: CSV: //p' a.out)
is "$csv" "$T/logs/$run/csv/version_0/metrics.csv" "CSV: its metrics.csv"
ok test -s "$csv"
is "$(sed -n 's/^train: checkpoints: //p' a.out)" \
    "$T/ck (every 4 steps and at the end; the newest 2 kept)" \
    "the checkpoint directory, absolute, with its cadence"
ok test -f "$T/ck/ckpt-000000000008.done"
like "$(sed -n 's/^train: copies of the checkpoints and metrics: //p' a.out)" "^command 'cp \{\} " \
    "the remote copies"
for w in "metrics:" "TensorBoard:" "CSV:" "checkpoints:" "copies of"; do
    is "$(grep -c "^train: $w" a.out)" 1 "'$w' said once"
done
before=$(grep -n '^train: metrics:' a.out | cut -d: -f1)
first_step=$(grep -n '^step ' a.out | head -n 1 | cut -d: -f1)
ok test "$before" -lt "$first_step"

# a destination URL: shown without its password
"$TRAIN" $DATA --metrics m.jsonl --upload "http://me:hunter2@127.0.0.1:9/dest" --upload-wait 0 \
    >b.out 2>&1
is "$(sed -n 's/^train: metrics: //p' b.out)" "$T/m.jsonl" "--metrics FILE, relative: absolute"
is "$(sed -n 's/^train: copies of the checkpoints and metrics: //p' b.out)" "http://127.0.0.1:9/dest" \
    "the URL without user and password"
unlike "$(cat b.out)" "hunter2" "the password is nowhere"

"$TRAIN" $DATA >c.out 2>&1
is $? 0 "a run with no output files"
unlike "$(cat c.out)" "^train: (metrics|TensorBoard|CSV|checkpoints|copies)" "names none"
done_testing
