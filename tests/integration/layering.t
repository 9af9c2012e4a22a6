#!/bin/sh
# The layering DESIGN.md promises, checked on the sources and the binaries:
# the launcher and common/ never include a runtime or model header (the
# Makefile does not even put runtime/ on their include path), and mglaunch
# links no CUDA, NCCL, BLAS or libmg code. And the source code layout in
# docs/development.md names every source file, so that a reader finds each one.
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
cd "$TOP"
[ -x "$MGLAUNCH" ] || bail "mglaunch is built ($MGLAUNCH)"

# Every header that lives under runtime/ or models/, by the name an #include uses.
runtime_headers=$(find runtime models -name '*.h' -exec basename {} \; | sort -u)
bad=""
for f in $(find launcher common -name '*.c' -o -name '*.h' | sort); do
    for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f"); do
        base=$(basename "$inc")
        # A header of the same name in the launcher or common is theirs, not the runtime's.
        [ -n "$(find launcher common -name "$base" | head -n 1)" ] && continue
        if printf '%s\n' "$runtime_headers" | grep -qx -- "$base"; then
            bad="$bad $f:$inc"
        fi
    done
    case $(grep -E '#[[:space:]]*include[[:space:]]*[<"](cuda|cublas|cudnn|nccl|cblas|openblas)' "$f") in
    "") ;;
    *) bad="$bad $f:(CUDA/BLAS header)" ;;
    esac
done
is "${bad:-none}" none "no launcher/ or common/ file includes a runtime, model, CUDA or BLAS header"

needed=$(readelf -d "$MGLAUNCH" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')
unlike "$needed" 'cuda|cublas|cudnn|nccl|openblas|blas|libmg' "mglaunch needs no CUDA, NCCL or BLAS library ($needed)"

# No symbol that libmg defines is in mglaunch (common/ is shared and allowed).
LIBMG=$MG_BUILD/lib/libmg.a
if [ -f "$LIBMG" ]; then
    nm --defined-only -g "$LIBMG" 2>/dev/null | awk 'NF == 3 { print $3 }' | sort -u >"$T/libmg.syms"
    nm --defined-only -g "$MGLAUNCH" | awk 'NF == 3 { print $3 }' | sort -u >"$T/mglaunch.syms"
    both=$(comm -12 "$T/libmg.syms" "$T/mglaunch.syms" | head -n 5 | tr '\n' ' ')
    is "${both:-none}" none "mglaunch defines no libmg symbol"
    DESC="libmg.a lists its symbols (so the check above is not vacuous)" ok test "$(wc -l <"$T/libmg.syms")" -gt 50
else
    bail "libmg.a is built ($LIBMG)"
fi
und=$(nm -u "$MGLAUNCH" | grep -Ei 'cuda|cublas|cudnn|nccl|cblas|sgemm' | head -n 5 | tr '\n' ' ')
is "${und:-none}" none "mglaunch asks for no CUDA, NCCL or BLAS symbol"
# Each source file under common/ launcher/ runtime/ models/ is listed in the
# layout (a .h may share its .c's line: "kv_open.c, .h").
layout=$(sed -n '/^## Source code layout/,/^## /p' docs/development.md)
unlisted=""
for f in $(find common launcher runtime models -name '*.[ch]' -o -name '*.cu' -o -name '*.html' | sort); do
    b=$(basename "$f")
    stem=${b%.*}
    printf '%s\n' "$layout" | grep -Eq "(^|[ /,])($b|$stem\.(c|cu))([ ,]|\$)" || unlisted="$unlisted $f"
done
is "${unlisted:-none}" none "docs/development.md's source code layout lists every source file"
done_testing
