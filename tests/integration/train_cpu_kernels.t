#!/bin/sh
# The OpenBLAS kernels train runs on the CPU (docs/train.md, CPU kernels): chosen
# from the processor's instruction sets when the library falls below them, named
# with the reason in train's first line; the user's OPENBLAS_CORETYPE wins, then
# MG_BLAS_CORETYPE; a bad MG_BLAS_CORETYPE stops train with one line. CPUs this
# machine is not are emulated by qemu-x86_64 (Debian's qemu-user, TCG) with a
# model number OpenBLAS does not know, so the real library really falls back:
# an AVX2 one (OpenBLAS picks Prescott, libmg reloads it with Haswell), an AVX
# one (Sandybridge) and an SSE4.1 one (Prescott is the best there is: kept).
# The same family gives the same bits on the emulated CPU as here.
# The decision itself, on recorded cpuid bits, is tests/unit/test_blas_kernels.
# timeout: 120
. "$(dirname "$0")/../lib/lib.sh"
[ -x "$TRAIN" ] || skip_all "train not built"
INFO=$HELPERS/blas_info
args="--data synthetic --train-samples 256 --test-samples 64 --batch-size 32 --steps 2
      --log-every 1000"
hash_of() { sed -n 's/.*done:.*param hash \([0-9a-f]*\).*/\1/p' "$1"; }
first() { "$TRAIN" $args >"$T/out" 2>&1; echo "rc=$? $(head -1 "$T/out")"; }
unset OPENBLAS_CORETYPE MG_BLAS_CORETYPE

# ---- this machine --------------------------------------------------------------
"$INFO" >"$T/info"
is "$?" 0 "the BLAS loads and multiplies right"
diag "here: $(sed -n 2p "$T/info")"
like "$(first)" '^rc=0 .*, cpu \(OpenBLAS [A-Za-z0-9_]+[ ,]' "train names the OpenBLAS kernels"
like "$(OPENBLAS_CORETYPE=Prescott first)" \
    'cpu \(OpenBLAS Prescott set by OPENBLAS_CORETYPE, 1 thread(; this CPU has [^)]*)?\)$' \
    "OPENBLAS_CORETYPE is obeyed and named"
like "$(OPENBLAS_CORETYPE=Prescott MG_BLAS_CORETYPE=Sandybridge first)" \
    'cpu \(OpenBLAS Prescott set by OPENBLAS_CORETYPE' "OPENBLAS_CORETYPE wins over MG_BLAS_CORETYPE"
like "$(MG_BLAS_CORETYPE=prescott first)" 'cpu \(OpenBLAS Prescott set by MG_BLAS_CORETYPE, ' \
    "MG_BLAS_CORETYPE names a family (any case)"
like "$(MG_BLAS_CORETYPE=library first)" \
    "cpu \\(OpenBLAS $(head -1 "$T/info" | cut -d' ' -f2), the library's choice \\(MG_BLAS_CORETYPE=library\\)" \
    "MG_BLAS_CORETYPE=library keeps the library's own choice"
MG_BLAS_CORETYPE=bogus "$TRAIN" $args >"$T/out" 2>&1
is "$?" 2 "a bad MG_BLAS_CORETYPE stops train with a usage error (exit 2)"
is "$(cat "$T/out")" "train: cannot start the cpu backend: MG_BLAS_CORETYPE='bogus' is not auto, library or an OpenBLAS x86-64 kernel family (SkylakeX, Haswell, Zen, Sandybridge, Prescott, ...)" \
    "... with one line naming the value and what it may be"

# ---- CPUs the library does not know ----------------------------------------------
if ! command -v qemu-x86_64 >/dev/null 2>&1; then
    diag "qemu-x86_64 not installed (apt-get install qemu-user): no emulated CPUs"
    done_testing
fi
case $MG_BUILD in
*san-*)
    # ASan's shadow memory does not map under qemu-user; the plain build runs these
    diag "sanitizer build: no emulated CPUs (qemu-user cannot run ASan binaries)"
    done_testing
    ;;
esac
emu() { # emu CPU [VAR=VALUE]: blas_info on an emulated CPU (family 6, model 250)
    cpu=$1
    shift
    qemu-x86_64 -cpu "$cpu,model=250" ${1:+-E "$1"} "$INFO" 2>"$T/emu.err" ||
        { sed 's/^/# /' "$T/emu.err"; echo "failed"; }
}
AVX2=Haswell-noTSX-IBRS
emu $AVX2 >"$T/emu"
if [ "$(cut -d' ' -f2 "$T/emu" | head -1)" != Prescott ]; then
    diag "this OpenBLAS recognises an unknown AVX2 CPU by itself ($(head -1 "$T/emu")): nothing to override"
    like "$(head -1 "$T/emu")" '^Haswell ' "it runs AVX2 kernels"
else
    is "$(cat "$T/emu")" "Haswell Prescott features
OpenBLAS Haswell kernels chosen for AVX2+FMA, 1 thread; the library picked Prescott for this CPU
AVX2+FMA 32 AVX2+FMA 32 Haswell" \
        "unknown AVX2 CPU: the library's Prescott replaced by Haswell, and the banner says why"
    qemu-x86_64 -cpu $AVX2,model=250 "$TRAIN" $args >"$T/emu.train" 2>/dev/null
    like "$(head -1 "$T/emu.train")" \
        'cpu \(OpenBLAS Haswell kernels chosen for AVX2\+FMA, 1 thread; the library picked Prescott for this CPU\)$' \
        "... in train's first line"
    case $(sed -n 3p "$T/info" | cut -d' ' -f3) in
    AVX2+FMA | AVX-512)
        MG_BLAS_CORETYPE=Haswell "$TRAIN" $args >"$T/host.train" 2>&1
        is "$(hash_of "$T/emu.train")" "$(hash_of "$T/host.train")" \
            "the same family gives the same bits on another CPU (docs/train.md, Determinism)"
        ;;
    *) diag "this CPU has no AVX2: no comparison of bits with the emulated one" ;;
    esac
    is "$(emu $AVX2 OPENBLAS_CORETYPE=Prescott | sed 1d)" \
        "OpenBLAS Prescott set by OPENBLAS_CORETYPE, 1 thread; this CPU has AVX2+FMA
SSE3 8 AVX2+FMA 32 Haswell" \
        "the user's OPENBLAS_CORETYPE=Prescott stays, and the banner says what the CPU has"
    is "$(emu $AVX2 MG_BLAS_CORETYPE=library | head -1)" "Prescott Prescott mg_library" \
        "MG_BLAS_CORETYPE=library keeps the fallback"
    is "$(emu SandyBridge | head -1)" "Sandybridge Prescott features" \
        "unknown AVX CPU: Sandybridge"
fi
is "$(emu Penryn | head -1)" "Prescott Prescott library" \
    "unknown SSE4.1 CPU: Prescott kept (nothing better runs there)"
done_testing
