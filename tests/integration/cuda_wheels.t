#!/bin/sh
# Building and loading the CUDA plugin where PyTorch's pip wheels are the only
# CUDA libraries (docs/gpu.md, "A machine with PyTorch from pip"): a virtual
# environment laid out as pip lays out NVIDIA's wheels (site-packages/nvidia/
# <package>/{include,lib}, headers and versioned sonames only, no unversioned
# link), assembled from this machine's toolkit, and an nvcc with no headers of
# the libraries beside it. The build finds them through the environment's
# Python, links them by soname, and the plugin loads through its run path; once
# the environment has moved, libmg finds the wheels itself, from VIRTUAL_ENV or
# the python3 on PATH, and names every library it cannot find. The loader's
# own cache is hidden (a private mount namespace) so that the toolkit's copies
# in ldconfig's cache cannot answer for the wheels.
# timeout: 600
. "$(dirname "$0")/../lib/lib.sh"
cd "$TOP"
P=$HELPERS/gpuprobe
FAKE=$HELPERS/fakecuda
[ -x "$P" ] && [ -f "$FAKE/libcuda.so.1" ] || bail "gpuprobe and the stand-in driver are built"
have_plugin=$(sed -n 's/^#define MG_HAVE_CUDA \([01]\).*/\1/p' "$MG_BUILD/include/mg_config.h")
[ "$have_plugin" = 1 ] || skip_all "this build has no CUDA plugin (no CUDA toolkit with cuDNN and NCCL to lay out as wheels)"
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CU=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
LIB=$CU/lib64
[ -f "$LIB/libcudnn.so.9" ] || LIB=$CU/lib
for f in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2 libcudnn_ops.so.9; do
    [ -f "$LIB/$f" ] || skip_all "the toolkit in $CU has no $f to lay out as a wheel (the sonames this test knows are CUDA 13's)"
done

# make as a user runs it, also under `make test` (whose MAKELEVEL hides the build's banner)
mk() { env -u MAKELEVEL -u MAKEFLAGS -u MFLAGS make "$@"; }

# ---- a virtual environment with the wheels' layout --------------------------------
VENV=$T/venv
SP=$VENV/lib/python3.11/site-packages
NV=$SP/nvidia
mkdir -p "$VENV/bin" && ln -s /usr/bin/python3 "$VENV/bin/python3" &&
    printf 'home = /usr/bin\ninclude-system-site-packages = false\n' >"$VENV/pyvenv.cfg" ||
    bail "a virtual environment"
# package: headers (globs under the toolkit's include/) and sonames
lay() {
    pkg=$1 hdrs=$2 libs=$3
    mkdir -p "$NV/$pkg/include" "$NV/$pkg/lib"
    for h in $hdrs; do
        for f in "$CU"/include/$h; do [ -e "$f" ] && ln -s "$f" "$NV/$pkg/include/"; done
    done
    for l in $libs; do ln -s "$LIB/$l" "$NV/$pkg/lib/$l"; done
}
lay cudnn 'cudnn*.h' "$(cd "$LIB" && ls libcudnn*.so.9)"
lay nccl 'nccl*.h' libnccl.so.2
lay cublas 'cublas*.h' 'libcublas.so.13 libcublasLt.so.13'
# the CUDA runtime's wheel: every other header of the toolkit
mkdir -p "$NV/cuda_runtime/include" "$NV/cuda_runtime/lib"
for f in "$CU"/include/*; do
    case ${f##*/} in cudnn* | nccl* | cublas*) ;; *) ln -s "$f" "$NV/cuda_runtime/include/" ;; esac
done
ln -s "$LIB/libcudart.so.13" "$NV/cuda_runtime/lib/"
unversioned=$(ls "$NV"/*/lib | grep '\.so$' | head -n 3)
is "${unversioned:-none}" none "the wheels' layout has versioned sonames only"
# nvcc alone (as from the nvidia-cuda-nvcc wheel or a toolkit without cuDNN and NCCL)
mkdir -p "$T/nvcc/bin"
printf '#!/bin/sh\nexec %s "$@"\n' "$NVCC" >"$T/nvcc/bin/nvcc" && chmod +x "$T/nvcc/bin/nvcc"

# ---- the build finds them through the environment's Python -------------------------------
B=$T/b
out=$(env -u CUDNN_HOME -u NCCL_HOME -u CUBLAS_HOME -u CUDA_WHEELS -u LIBRARY_PATH CUDA_HOME="$T/nvcc" \
    nice -n 10 env -u MAKELEVEL -u MAKEFLAGS -u MFLAGS make --no-print-directory V=1 BUILD="$B" NVCC="$T/nvcc/bin/nvcc" PYTHON="$VENV/bin/python3" \
    MG_REQUIRE_CUDA=1 NVCC_ARCH='-gencode arch=compute_75,code=sm_75' "$B/lib/libmg_cuda.so" 2>&1)
rc=$?
is "$rc" 0 "make builds the plugin against the wheels (MG_REQUIRE_CUDA=1)" || diag "$(echo "$out" | tail -n 15)"
like "$out" "cuda plugin: $B/lib/libmg_cuda.so \\(nvcc [0-9.]+, cuDNN 9\\.[0-9.]+ in $NV/cudnn, NCCL 2\\.[0-9.]+ in $NV/nccl;" \
    "the build says where it found cuDNN and NCCL"
PLUGIN=$B/lib/libmg_cuda.so
[ -f "$PLUGIN" ] || bail "the plugin was built"
needed=$(readelf -d "$PLUGIN" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')
like "$needed" 'libnccl\.so\.2 libcudnn\.so\.9 libcublas\.so\.13 libcudart\.so\.13' \
    "the plugin needs the libraries by versioned soname ($needed)"
runpath=$(readelf -d "$PLUGIN" | sed -n 's/.*Library runpath: \[\(.*\)\]/\1/p')
is "$runpath" "$NV/cublas/lib:$NV/cuda_runtime/lib:$NV/cudnn/lib:$NV/nccl/lib" \
    "its run path is the wheels' lib directories"
cc_line=$(echo "$out" | grep -- '-c -o [^ ]*/cuda_conv\.o runtime/cuda/cuda_conv\.c')
for pkg in cudnn nccl cublas cuda_runtime; do
    like "$cc_line" "-isystem $NV/$pkg/include( |\$)" "the plugin's C files see the $pkg wheel's headers"
done
unlike "$cc_line" "$CU|/usr/local/cuda" "... and no toolkit's"
grep -q '#define MG_CUDA_LIBS "libcudart.so.13 libcublasLt.so.13 libcublas.so.13 libcudnn.so.9 libnccl.so.2"' \
    "$B/include/mg_config.h"
is $? 0 "libmg knows the sonames the plugin needs"
# CUDNN_HOME / NCCL_HOME name a place, and only that place is looked in
out=$(mk -s -n CUDA_HOME="$T/nvcc" BUILD="$T/b2" NVCC="$T/nvcc/bin/nvcc" PYTHON="$VENV/bin/python3" CUDNN_HOME="$T/nowhere" \
    MG_REQUIRE_CUDA=1 all 2>&1)
like "$out" "MG_REQUIRE_CUDA=1 but the CUDA plugin cannot be built: cuDNN not found .*CUDNN_HOME='$T/nowhere'" \
    "CUDNN_HOME without cuDNN is an error naming it"
out=$(mk -s -n CUDA_HOME="$T/nvcc" BUILD="$T/b2" NVCC="$T/nvcc/bin/nvcc" PYTHON=/bin/false CUDNN_HOME="$NV/cudnn" \
    NCCL_HOME="$NV/nccl" CUDA_WHEELS="$SP" all 2>&1)
like "$out" "cuDNN 9\\.[0-9.]+ in $NV/cudnn, NCCL 2\\.[0-9.]+ in $NV/nccl" "CUDNN_HOME and NCCL_HOME are used"

# ---- at run time, with the loader's cache hidden ------------------------------------------------
if ! unshare -rm sh -c 'mount --bind /dev/null /etc/ld.so.cache' 2>/dev/null; then
    diag "no private mount namespace here (unshare -rm, mount --bind over /etc/ld.so.cache): the run-time search is not checked"
    done_testing
fi
# nocache CMD...: CMD with an empty /etc/ld.so.cache, so only LD_LIBRARY_PATH, run paths and
# the system's own directories answer (the toolkit's copies are in the real cache)
printf '#!/bin/sh\nexec unshare -rm sh -c '"'"'mount --bind /dev/null /etc/ld.so.cache && exec "$@"'"'"' nocache "$@"\n' >"$T/nocache"
chmod +x "$T/nocache"
out=$(env -u LD_LIBRARY_PATH "$T/nocache" /usr/bin/python3 -c 'import ctypes; ctypes.CDLL("libcudnn.so.9")' 2>&1)
like "$out" 'libcudnn.so.9: cannot open shared object file' "without the cache the toolkit's cuDNN is not found"
clean() { env -u LD_LIBRARY_PATH -u VIRTUAL_ENV -u CONDA_PREFIX -u PYTHONPATH HOME="$T" PATH=/usr/bin:/bin "$@"; }
out=$(clean MG_CUDA_PLUGIN="$PLUGIN" "$T/nocache" "$P" open)
like "$out" '^ok: CUDA [0-9.]+, cuBLAS [0-9.]+, cuDNN 9[0-9.]*, NCCL 2[0-9.]* \(code: 0\)$' \
    "the plugin loads the wheels' libraries through its run path"

mv "$VENV" "$T/moved"
VENV=$T/moved NV=$T/moved/lib/python3.11/site-packages/nvidia
out=$(clean MG_CUDA_PLUGIN="$PLUGIN" VIRTUAL_ENV="$VENV" "$T/nocache" "$P" open)
like "$out" '^ok: CUDA ' "the environment moved: found through VIRTUAL_ENV"
out=$(clean MG_CUDA_PLUGIN="$PLUGIN" PATH="$VENV/bin:/usr/bin:/bin" "$T/nocache" "$P" open)
like "$out" '^ok: CUDA ' "... and through the python3 on PATH"
out=$(clean MG_CUDA_PLUGIN="$PLUGIN" PYTHONPATH="$VENV/lib/python3.11/site-packages" "$T/nocache" "$P" open)
like "$out" '^ok: CUDA ' "... and through PYTHONPATH"
out=$(clean MG_CUDA_PLUGIN="$PLUGIN" LD_LIBRARY_PATH="$NV/cudnn/lib:$NV/nccl/lib:$NV/cublas/lib:$NV/cuda_runtime/lib" \
    "$T/nocache" "$P" open)
like "$out" '^ok: CUDA ' "... and through LD_LIBRARY_PATH"
# through the search, on to the CUDA runtime, which the stand-in driver cannot run
out=$(clean MG_CUDA_PLUGIN="$PLUGIN" VIRTUAL_ENV="$VENV" LD_LIBRARY_PATH="$FAKE" FAKECUDA_DEVICES=1 "$T/nocache" "$P" backend 0)
like "$out" '^cuda_backend\.c:[0-9]+: cudaGetDeviceCount: .*\(code: -' \
    "with a driver, the backend starts the wheels' CUDA runtime, which answers for itself"

out=$(clean MG_CUDA_PLUGIN="$PLUGIN" "$T/nocache" "$P" open)
like "$out" "^the CUDA plugin $PLUGIN needs libraries this machine lacks: libcudart\\.so\\.13, libcublasLt\\.so\\.13, libcublas\\.so\\.13, libcudnn\\.so\\.9, libnccl\\.so\\.2 \\(looked on LD_LIBRARY_PATH, .*pip install torch.*\\(code: -ENOENT\\)$" \
    "no wheels anywhere: every missing library is named, and what to do"
rm "$NV/nccl/lib/libnccl.so.2" "$NV/cudnn/lib/libcudnn.so.9"
out=$(clean MG_CUDA_PLUGIN="$PLUGIN" VIRTUAL_ENV="$VENV" "$T/nocache" "$P" open)
like "$out" "needs libraries this machine lacks: libcudnn\\.so\\.9, libnccl\\.so\\.2 \\(" \
    "two wheels lack their library: those two are named"
done_testing
