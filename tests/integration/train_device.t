#!/bin/sh
# train's compute device on a machine without a usable GPU (docs/train.md,
# --device; docs/gpu.md): --device auto computes on the CPU, says why, gives
# the CPU's bits, and loads nothing of CUDA to find that out (LD_DEBUG=files
# lists what the dynamic loader opened); --device cuda stops at once with one
# line naming the reason and exit status 2: no driver, a driver without a
# device, none visible, a driver older than the build's CUDA, a driver the
# CUDA runtime cannot run on, a missing plugin. The driver's answers come
# from the stand-in libcuda.so.1 (tests/helpers/fakecuda). And a checkpoint
# does not depend on the device: written under one --device, it resumes under
# another as the same run (the GPU half of that is tests/gpu/train_gpu.t).
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] || skip_all "train not built"
FAKE=$HELPERS/fakecuda
PLUGIN=$MG_BUILD/lib/libmg_cuda.so
have_plugin=$(sed -n 's/^#define MG_HAVE_CUDA \([01]\).*/\1/p' "$MG_BUILD/include/mg_config.h")
hash_of() { sed -n 's/.*done:.*param hash \([0-9a-f]*\).*/\1/p' "$1"; }
args="--data synthetic --train-samples 512 --test-samples 128 --batch-size 32 --steps 6
      --log-every 1000"

if [ -x "$HELPERS/gpuprobe" ] && "$HELPERS/gpuprobe" probe 0 | grep -q '^usable:'; then
    diag "this machine has a usable GPU: tests/gpu/train_gpu.t checks train on it"
    have_gpu=1
else
    have_gpu=0
fi

# ---- --device auto ---------------------------------------------------------------
"$TRAIN" $args --device cpu >"$T/cpu" 2>&1
is $? 0 "--device cpu"
if [ $have_gpu = 0 ]; then
    LD_DEBUG=files "$TRAIN" $args --device auto >"$T/auto" 2>"$T/ld"
    is $? 0 "--device auto without a usable GPU runs"
    if [ "$have_plugin" = 1 ]; then
        like "$(cat "$T/auto")" '^train: --device auto: computing on the CPU \(no NVIDIA driver \(libcuda\.so\.1: ' \
            "... on the CPU, saying why"
        ok grep -q 'file=libcuda\.so\.1 ' "$T/ld" "... it asked for the driver (LD_DEBUG sees the dlopen)"
    else
        like "$(cat "$T/auto")" '^train: --device auto: computing on the CPU \(this build of mg has no CUDA plugin\)' \
            "... on the CPU, in a build without the plugin"
    fi
    loaded=$(grep -Eo 'file=[^ ]*(libmg_cuda|libcublas|libcudnn|libcudart|libnccl)[^ ]*' "$T/ld" | sort -u)
    is "$loaded" "" "... and loaded neither the plugin nor cuBLAS, cuDNN, cudart or NCCL"
    is "$(hash_of "$T/auto")" "$(hash_of "$T/cpu")" "... with the CPU's bits"
fi

# ---- --device cuda: why not, in one line, exit 2 ----------------------------------
# why <regex> <description> <env...>: train --device cuda under that environment
why() {
    want=$1 desc=$2
    shift 2
    env "$@" "$TRAIN" $args --device cuda >"$T/out" 2>"$T/err"
    is $? 2 "$desc: exit 2"
    is "$(wc -l <"$T/err" | tr -d ' ')" 1 "$desc: one line"
    like "$(cat "$T/err")" "^train: cannot start the cuda backend: $want" "$desc: says why"
    is "$(cat "$T/out")" "" "$desc: nothing on stdout"
}
if [ "$have_plugin" = 1 ] && [ $have_gpu = 0 ]; then
    why 'no NVIDIA driver \(libcuda\.so\.1: cannot open shared object file' "no driver"
    why 'no CUDA device: cuInit: no CUDA-capable device is detected \(CUDA_ERROR_NO_DEVICE\)$' \
        "a driver without a device" LD_LIBRARY_PATH="$FAKE" FAKECUDA_INIT=100
    why "no CUDA device: the driver shows none \(CUDA_VISIBLE_DEVICES=''\)$" \
        "no visible device" LD_LIBRARY_PATH="$FAKE" FAKECUDA_DEVICES=0 CUDA_VISIBLE_DEVICES=
    why 'the NVIDIA driver supports CUDA 12\.4, and this build of mg needs CUDA [0-9]+\.0 ' \
        "a driver too old" LD_LIBRARY_PATH="$FAKE" FAKECUDA_DEVICES=1 FAKECUDA_DRIVER=12040
    why "the CUDA plugin $T/none\.so is missing \(set MG_CUDA_PLUGIN to where it is\)$" \
        "a missing plugin" LD_LIBRARY_PATH="$FAKE" FAKECUDA_DEVICES=1 MG_CUDA_PLUGIN="$T/none.so"
    # the stand-in answers the probe only: the CUDA runtime then finds it wanting
    why 'cuda_backend\.c:[0-9]+: cudaGetDeviceCount: .*\(cudaError[A-Za-z]*\)$' \
        "a driver the CUDA runtime cannot use" LD_LIBRARY_PATH="$FAKE" FAKECUDA_DEVICES=1 \
        MG_CUDA_PLUGIN="$PLUGIN"
    # --device auto trusts the driver's answer: it picks CUDA, and so meets the same failure
    env LD_LIBRARY_PATH="$FAKE" FAKECUDA_DEVICES=1 MG_CUDA_PLUGIN="$PLUGIN" "$TRAIN" $args \
        --device auto >"$T/out" 2>"$T/err"
    is $? 2 "--device auto where the driver shows a GPU: CUDA is chosen (and fails here: exit 2)"
    like "$(cat "$T/err")" '^train: cannot start the cuda backend: cuda_backend\.c' \
        "... and says so in one line"
fi

# ---- a checkpoint resumes under another device ------------------------------------
# The run's identity leaves the device out: a checkpoint of --device X is the
# same run's under --device Y, resumed without --resume.
"$TRAIN" $args --steps 3 --device cpu --checkpoint-dir "$T/ck" >"$T/first" 2>&1
is $? 0 "3 steps on --device cpu, checkpointed"
"$TRAIN" $args --device auto --checkpoint-dir "$T/ck" >"$T/second" 2>&1
is $? 0 "the other 3 under --device auto"
like "$(cat "$T/second")" "resumed from $T/ck/ckpt-000000000003\.mgc \(step 3" "... resumed the checkpoint"
[ $have_gpu = 0 ] && is "$(hash_of "$T/second")" "$(hash_of "$T/cpu")" \
    "... and ended with the bits of the run that never stopped"

# MG_CUDA_DEVICE: another device than LOCAL_RANK (two ranks sharing one GPU); checked like one
out=$(MG_CUDA_DEVICE=abc "$TRAIN" --data synthetic --steps 1 2>&1)
is "$?:$out" "1:train: MG_CUDA_DEVICE='abc': expected an integer from 0 to 1023" \
    "MG_CUDA_DEVICE that is not a number: one line (status 1, as for any bad launcher variable)"
out=$(env LD_LIBRARY_PATH="$FAKE" FAKECUDA_DEVICES=2 MG_CUDA_DEVICE=5 LOCAL_RANK=0 "$TRAIN" --device cuda \
    --data synthetic --steps 1 2>&1)
like "$out" "no CUDA device 5: the driver shows 2" "MG_CUDA_DEVICE=5 is the device asked for, not LOCAL_RANK"
# MG_TEST_COMM_THREAD at world size 1 on the CPU: DDP's thread over the single-rank communicator, same bits
"$TRAIN" --data synthetic --steps 5 --log-every 1000 >"$T/w1" 2>&1
MG_TEST_COMM_THREAD=1 "$MGLAUNCH" --nproc_per_node 1 --log_dir "$T/l1" "$TRAIN" --data synthetic --steps 5 \
    --log-every 1000 >"$T/w1t" 2>&1
is "$?:$(hash_of "$T/w1t")" "0:$(hash_of "$T/w1")" "MG_TEST_COMM_THREAD=1 at world size 1: the same bits"

# --tf32 / MG_TF32: checked like any flag; no effect on the CPU
out=$("$TRAIN" --tf32 2 --data synthetic --steps 1 2>&1)
like "$?:$out" "^2:train: --tf32" "--tf32 2: a usage error"
out=$(MG_TF32=yes "$TRAIN" --data synthetic --steps 1 2>&1)
is "$?:$out" "2:train: MG_TF32='yes': expected 0 or 1 (see train --help)" "MG_TF32=yes: a usage error naming it"
MG_TF32=1 "$TRAIN" --tf32 1 --data synthetic --steps 5 --log-every 1000 >"$T/tf32" 2>&1
is "$?:$(hash_of "$T/tf32")" "0:$(hash_of "$T/w1")" "--tf32 1 on the CPU: the FP32 bits"
done_testing
