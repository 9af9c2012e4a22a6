#!/bin/sh
# What the build promises about CUDA (docs/gpu.md): mglaunch and train link
# no CUDA library (a CPU run pays nothing, and both start where CUDA is not
# installed); the plugin resolves every symbol against the libraries it
# names and exports only its entry point; the kernels promised to match the
# CPU bit for bit contain no fused multiply-add (their PTX, which is what
# every GPU compiles or runs); and MG_REQUIRE_CUDA=1 refuses a build that
# cannot make the plugin, so CI never stops compiling the CUDA code unnoticed.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
cd "$TOP"
[ -x "$MGLAUNCH" ] && [ -x "$TRAIN" ] || bail "mglaunch and train are built"
cuda_re='cuda|cublas|cudnn|nccl|nvrtc'
for prog in "$MGLAUNCH" "$TRAIN"; do
    needed=$(readelf -d "$prog" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')
    unlike "$needed" "$cuda_re" "$(basename "$prog") needs no CUDA library ($needed)"
    und=$(nm -D --undefined-only "$prog" | grep -Ei "$cuda_re" | head -n 3 | tr '\n' ' ')
    is "${und:-none}" none "$(basename "$prog") asks for no CUDA symbol"
done

have_plugin=$(sed -n 's/^#define MG_HAVE_CUDA \([01]\).*/\1/p' "$MG_BUILD/include/mg_config.h")
PLUGIN=$MG_BUILD/lib/libmg_cuda.so
PTX=$MG_BUILD/obj/runtime/cuda/cuda_kernels.ptx
if [ "$have_plugin" != 1 ]; then
    out=$(make -s -n NVCC= MG_REQUIRE_CUDA=1 BUILD="$T/b" all 2>&1)
    like "$out" 'MG_REQUIRE_CUDA=1 but the CUDA plugin cannot be built: nvcc cuBLAS cuDNN NCCL not found' \
        "MG_REQUIRE_CUDA=1 without nvcc is an error"
    done_testing
fi

[ -f "$PLUGIN" ] && [ -f "$PTX" ] || bail "the plugin and its PTX are built"
needed=$(readelf -d "$PLUGIN" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')
for lib in libcudart libcublas libcudnn libnccl; do
    like "$needed" "$lib\\.so" "the plugin names $lib ($needed)"
done
unlike "$needed" 'libstdc\+\+' "the plugin needs no C++ runtime (its kernels' host stubs are built without one)"
# (under clang's sanitizers the program that loads the plugin brings their runtime)
und=$(ldd -r "$PLUGIN" 2>&1 | grep -i 'undefined symbol' | grep -v 'symbol: __\(asan\|ubsan\|sanitizer\|lsan\)_' |
    head -n 3)
is "${und:-none}" none "every symbol of the plugin resolves (ldd -r)"
exports=$(nm -D --defined-only "$PLUGIN" | awk '{ print $3 }' | tr '\n' ' ')
is "$exports" "mg_gpu_plugin_v1 " "the plugin exports its entry point and nothing else"

# No fma.rn in the kernels that must give the CPU's bits, in the PTX of the
# oldest target and of Hopper's (what newer GPUs compile). The softmax kernels
# call the GPU's expf/logf (libdevice uses fma there): a tolerance, and they
# are the only ones allowed any.
tolerant='k_xent_fwd_rows k_xent_fwd_blocks'
for ptx in "$PTX" "${PTX%.ptx}.compute_90.ptx"; do
    arch=$(sed -n 's/^\.target \(sm_[0-9]*\).*/\1/p' "$ptx")
    kernels=$(sed -n 's/^\.visible \.entry _Z[0-9]*\([a-z_0-9]*\).*/\1/p' "$ptx")
    DESC="the PTX for $arch lists the kernels ($(echo $kernels | wc -w))" ok test "$(echo $kernels | wc -w)" -ge 15
    bad=""
    for k in $kernels; do
        n=$(awk -v k="$k" '/^\.visible \.entry/ { on = index($0, k "P") > 0 } on && /fma\.rn/ { c++ } END { print c + 0 }' "$ptx")
        case " $tolerant " in
        *" $k "*) diag "$arch $k: $n fma (tolerance kernel)" ;;
        *) [ "$n" = 0 ] || bad="$bad $k:$n" ;;
        esac
    done
    is "${bad:-none}" none "no fused multiply-add in the kernels promised to match the CPU ($arch)"
    mul=$(awk '/^\.visible \.entry _Z5k_sgd/ { on = 1 } /^\.visible \.entry/ && !/k_sgd/ { on = 0 } on && /mul\.rn\.f32/ { c++ } END { print c + 0 }' "$ptx")
    DESC="... and the SGD kernel has its multiplies ($mul mul.rn.f32): the check looks at real code" ok test "$mul" -ge 3
done
# every kernel is loaded when the backend starts, not at its first launch (lazy
# loading would stall the first overlapped step): each is in mgk_preload's list
missing=""
for k in $kernels; do
    grep -q "MGK_PRELOAD_ONE($k);" runtime/cuda/cuda_kernels.cu || missing="$missing $k"
done
is "${missing:-none}" none "mgk_preload loads every kernel of the PTX"
grep -q 'mgk_preload(&' runtime/cuda/cuda_backend.c
is $? 0 "... and the backend calls it when it starts"
# nothing on the legacy default stream: mg's streams are non-blocking, so such a
# copy is unordered with them (a pageable cudaMemcpy returns before the DMA lands)
legacy=$(grep -nE '\bcuda(Memcpy|Memset|Memcpy2D|Memcpy3D)\(' runtime/cuda/*.c | head -n 3)
is "${legacy:-none}" none "no synchronous copy or memset on the legacy stream in the plugin"
grep -q 'code=\[sm_90,compute_90\]' Makefile
is $? 0 "the plugin carries compute_90 PTX for GPUs newer than its machine code"

# a toolkit with nvcc but without the libraries' headers
mkdir -p "$T/cuda/bin" "$T/cuda/include"
printf '#!/bin/sh\necho "Cuda compilation tools, release 13.0"\n' >"$T/cuda/bin/nvcc"
chmod +x "$T/cuda/bin/nvcc"
out=$(make -s -n NVCC="$T/cuda/bin/nvcc" CUDA_HOME="$T/cuda" MG_REQUIRE_CUDA=1 BUILD="$T/b" all 2>&1)
like "$out" 'MG_REQUIRE_CUDA=1 but the CUDA plugin cannot be built: CUDA-runtime cuBLAS cuDNN NCCL not found' \
    "MG_REQUIRE_CUDA=1 with a toolkit that lacks the libraries is an error"
out=$(make -s -n NVCC= MG_REQUIRE_CUDA=1 BUILD="$T/b" all 2>&1)
like "$out" 'MG_REQUIRE_CUDA=1 but the CUDA plugin cannot be built: nvcc cuBLAS cuDNN NCCL not found' \
    "MG_REQUIRE_CUDA=1 without nvcc is an error"
out=$(make -s -n MG_REQUIRE_CUDA=1 BUILD="$T/b" all 2>&1)
unlike "$out" 'MG_REQUIRE_CUDA' "MG_REQUIRE_CUDA=1 with this machine's toolkit is fine"
done_testing
