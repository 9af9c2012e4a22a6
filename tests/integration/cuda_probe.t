#!/bin/sh
# Finding a GPU and the CUDA plugin, and saying why not (docs/gpu.md, "Errors"):
# no driver, no device, a driver too old, a missing plugin, a file that is not
# a plugin, a plugin whose libraries are missing. The driver's answers for a
# machine that has one come from a stand-in libcuda.so.1 (tests/helpers/fakecuda)
# put first on LD_LIBRARY_PATH: it answers the probe's few driver calls, and
# nothing else runs on it. --device auto must not load the CUDA libraries to
# find that there is no GPU.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
P=$HELPERS/gpuprobe
FAKE=$HELPERS/fakecuda
[ -x "$P" ] && [ -f "$FAKE/libcuda.so.1" ] || bail "gpuprobe and the stand-in driver are built"
PLUGIN=$MG_BUILD/lib/libmg_cuda.so
have_plugin=$(sed -n 's/^#define MG_HAVE_CUDA \([01]\).*/\1/p' "$MG_BUILD/include/mg_config.h")

# ---- the real machine --------------------------------------------------------
out=$("$P" probe 0)
case $out in
usable:*)
    diag "this machine has a usable GPU ($out): the no-driver checks do not apply"
    ;;
*)
    like "$out" '^no NVIDIA driver \(libcuda\.so\.1: cannot open shared object file.*\) \(code: -ENXIO\)$' \
        "no driver: one line, naming libcuda.so.1"
    out=$("$P" auto 0)
    if [ "$have_plugin" = 1 ]; then
        like "$out" '^cpu: no NVIDIA driver' "--device auto falls back to the CPU and says why"
    else
        like "$out" '^cpu: this build of mg has no CUDA plugin' "--device auto: the CPU, in a build without CUDA"
    fi
    like "$out" 'cuBLAS loaded: no' "... without loading the plugin, cuBLAS or cuDNN"
    if [ "$have_plugin" = 1 ]; then
        out=$("$P" backend 0)
        like "$out" '^no NVIDIA driver .*\(code: -ENXIO\)$' "the CUDA backend: the driver's answer first"
        out=$(MG_CUDA_PLUGIN=$PLUGIN "$P" plugin-backend 0)
        like "$out" 'cudaGetDeviceCount: CUDA driver version is insufficient for CUDA runtime version \(cudaErrorInsufficientDriver\) \(code: -ENXIO\)$' \
            "the plugin alone fails cleanly too, with the CUDA runtime's own words"
    fi
    ;;
esac

# ---- a driver with no device, with devices, too old, broken ---------------------
fake() { env LD_LIBRARY_PATH="$FAKE" "$@"; }
out=$(fake FAKECUDA_INIT=100 "$P" probe 0)
is "$out" "no CUDA device: cuInit: no CUDA-capable device is detected (CUDA_ERROR_NO_DEVICE) (code: -ENODEV)" \
    "a driver without a device"
out=$(fake FAKECUDA_DEVICES=0 CUDA_VISIBLE_DEVICES= "$P" probe 0)
is "$out" "no CUDA device: the driver shows none (CUDA_VISIBLE_DEVICES='') (code: -ENODEV)" \
    "no visible device: CUDA_VISIBLE_DEVICES is named"
out=$(fake FAKECUDA_DEVICES=2 "$P" probe 5)
is "$out" "no CUDA device 5: the driver shows 2 (code: -ENODEV)" "a device index past the last"
out=$(fake FAKECUDA_DEVICES=2 "$P" probe 1)
is "$out" "usable: Fake GPU 1 (17.0 GiB, sm_90); driver for CUDA 13.0 (code: 0)" \
    "a usable device: its name, memory and compute capability"
out=$(fake FAKECUDA_INIT=999 "$P" probe 0)
is "$out" "the NVIDIA driver does not start: cuInit: unknown error (CUDA_ERROR_UNKNOWN) (code: -ENXIO)" \
    "a driver that fails to start"
out=$(fake FAKECUDA_DEVICES=1 FAKECUDA_DRIVER=12040 "$P" probe 0)
if [ "$have_plugin" = 1 ]; then
    like "$out" '^the NVIDIA driver supports CUDA 12\.4, and this build of mg needs CUDA [0-9]+\.0 .*\(code: -MG_EVERSION\)$' \
        "a driver older than the CUDA this build was made with"
else
    like "$out" '^usable:' "a CPU-only build needs no particular driver"
fi

# ---- the plugin ----------------------------------------------------------------------
out=$(MG_CUDA_PLUGIN=$T/none.so "$P" open)
is "$out" "the CUDA plugin $T/none.so is missing (set MG_CUDA_PLUGIN to where it is) (code: -ENOENT)" \
    "MG_CUDA_PLUGIN names a file that does not exist"
cp "$0" "$T/text.so" # a shell script, long enough to have its header read
out=$(MG_CUDA_PLUGIN=$T/text.so "$P" open)
like "$out" "^the CUDA plugin $T/text.so cannot be loaded: .*invalid ELF header.*\(code: -MG_EFORMAT\)$" \
    "a text file"
libz=$(/sbin/ldconfig -p | sed -n 's/.*libz\.so\.1 .*=> \(.*\)/\1/p' | head -n 1)
out=$(MG_CUDA_PLUGIN=$libz "$P" open)
is "$out" "$libz is not an mg CUDA plugin: it has no mg_gpu_plugin_v1 function (code: -MG_EFORMAT)" \
    "a shared library that is not a plugin"
# a plugin whose dependency is gone: the message names the dependency
printf 'int mg_dep(void);\nint mg_dep(void) { return 1; }\n' >"$T/dep.c"
printf 'int mg_dep(void);\nint mg_use(void);\nint mg_use(void) { return mg_dep(); }\n' >"$T/plug.c"
if cc -shared -fPIC -o "$T/libmgdep.so" "$T/dep.c" &&
    cc -shared -fPIC -o "$T/plug.so" "$T/plug.c" -L"$T" -lmgdep; then
    rm -f "$T/libmgdep.so"
    out=$(MG_CUDA_PLUGIN=$T/plug.so "$P" open)
    like "$out" "^the CUDA plugin $T/plug.so needs a library this machine lacks: libmgdep\.so: cannot open shared object file.*\(code: -ENOENT\)$" \
        "a library the plugin needs is missing: named"
else
    bail "cc builds two small shared libraries"
fi

if [ "$have_plugin" = 1 ]; then
    out=$(MG_CUDA_PLUGIN=$PLUGIN "$P" open)
    like "$out" '^ok: CUDA [0-9.]+, cuBLAS [0-9.]+, cuDNN [0-9.]+, NCCL [0-9.]+ \(code: 0\)$' \
        "the plugin this build made loads"
    # found next to the program: <dir>/bin/prog loads <dir>/lib/libmg_cuda.so
    mkdir -p "$T/inst/bin" "$T/inst/lib"
    cp "$P" "$T/inst/bin/gpuprobe" && cp "$PLUGIN" "$T/inst/lib/libmg_cuda.so"
    out=$("$T/inst/bin/gpuprobe" open)
    like "$out" '^ok: ' "without MG_CUDA_PLUGIN, the plugin is ../lib/libmg_cuda.so from the program"
    out=$("$T/inst/bin/gpuprobe" path)
    is "$out" "$T/inst/bin/../lib/libmg_cuda.so (code: 0)" "... and that is the path it names"
    out=$(fake FAKECUDA_DEVICES=1 MG_CUDA_PLUGIN=$PLUGIN "$P" auto 0)
    like "$out" '^cuda$' "--device auto picks CUDA when the driver shows a device and the plugin loads"
else
    out=$("$P" backend 0)
    is "$out" "this build of mg has no CUDA plugin (it was built without nvcc, cuDNN and NCCL; see docs/gpu.md) (code: -MG_EUNSUPPORTED)" \
        "a CPU-only build says so"
fi
done_testing
