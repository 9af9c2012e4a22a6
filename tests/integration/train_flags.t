#!/bin/sh
# train's command line: --help, --version, both flag spellings, and every kind
# of bad flag gets one line on stderr naming the problem and exit status 2.
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] || skip_all "train not built"

out=$("$TRAIN" --help)
is $? 0 "--help exits 0"
like "$out" "usage: train" "--help prints the usage"
like "$out" "--checkpoint-every" "--help lists the flags"
like "$("$TRAIN" --version)" "^train \(mg\) [0-9]" "--version"

# bad <regex> <args...>: exit 2, exactly one line on stderr, matching regex, nothing on stdout
bad() {
    want=$1
    shift
    "$TRAIN" "$@" >"$T/out" 2>"$T/err"
    rc=$?
    is "$rc" 2 "exit 2: train $*"
    is "$(wc -l <"$T/err" | tr -d ' ')" 1 "one line on stderr: train $*"
    like "$(cat "$T/err")" "^train: .*$want" "message for: train $*"
    is "$(cat "$T/out")" "" "nothing on stdout: train $*"
}
bad "unknown option '--frobnicate'" --frobnicate
bad "unknown option '--lr-max'" --lr-max=3
bad "--batch-size needs a value" --batch-size
bad "--batch-size: 'abc' is not an integer" --batch-size abc
bad "--batch-size: 0 is out of range" --batch-size 0
bad "--epochs: -3 is out of range" --epochs=-3
bad "--lr: 'fast' is not a number" --lr fast
bad "--model: unknown model 'resnet'" --model resnet
bad "--data: unknown dataset 'cifar10'" --data cifar10
bad "--optimizer: unknown optimizer 'adam'" --optimizer adam
bad "--schedule: unknown schedule 'linear'" --schedule linear
bad "--device: unknown device 'tpu'" --device tpu
bad "--epochs and --steps cannot be used together" --epochs 2 --steps 10
bad "--momentum and --nesterov apply to sgd" --optimizer adamw --momentum 0.9
bad "--nesterov needs a momentum" --nesterov --momentum 0
bad "--resume auto needs --checkpoint-dir" --resume auto
bad "--hidden and --dropout apply to the mlp" --model cnn --hidden 128
bad "--drop-last takes no value" --drop-last=1
bad "--seed: '-1' is not a non-negative integer" --seed -1
bad "--betas: want B1,B2" --optimizer adamw --betas 0.9
bad "unexpected argument 'extra'" extra
bad "--data-dir does not apply to --data synthetic" --data synthetic --data-dir /tmp
"$TRAIN" --device cuda --data synthetic --steps 1 >"$T/out" 2>"$T/err"
cuda_rc=$?
if [ $cuda_rc = 0 ]; then
    diag "this build has a CUDA backend and this machine a GPU: --device cuda accepted"
    ok true "--device cuda runs in a CUDA build"
elif grep -q '^#define MG_HAVE_CUDA 1' "$MG_BUILD/include/mg_config.h"; then
    # A CUDA build on a machine without a usable GPU: one line saying why
    # (tests/integration/train_device.t goes through the reasons), exit 2.
    like "$(cat "$T/err")" '^train: cannot start the cuda backend: (no NVIDIA driver|no CUDA device)' \
        "--device cuda without a usable GPU: one line naming the backend and why"
    is "$(wc -l <"$T/err" | tr -d ' ')" 1 "... and only that line"
    is $cuda_rc 2 "... exit 2"
else
    bad "--device cuda: this build of mg has no CUDA plugin" --device cuda
fi
bad "--device: unknown device 'gpu' \(known: cpu, cuda, auto\)" --device gpu

# both spellings and both value forms are accepted
out=$("$TRAIN" --data synthetic --train_samples=64 --test-samples 32 --batch_size 16 \
    --steps=2 --log-every 1 2>&1)
is $? 0 "--flag=value, --flag value and underscores are accepted"
like "$out" "step 2/2" "the run happened"
done_testing
