#!/bin/sh
# `make demo` from a clean copy of the tree builds only what the demo runs
# (mglaunch and train, with libmg linked in), never the test programs, the
# fuzz harnesses or the CUDA plugin, even where nvcc and the CUDA headers are
# there (a stand-in nvcc records any compile it is asked for); then the demo
# itself trains and ends with `mglaunch logs`' summary.
# timeout: 300
. "$(dirname "$0")/../lib/lib.sh"
command -v git >/dev/null && git -C "$TOP" rev-parse --git-dir >/dev/null 2>&1 ||
    skip_all "the tree is not a git checkout"

# The tree as a clone gets it: the tracked files, working-tree content, no build/.
src=$T/clone
mkdir -p "$src"
(cd "$TOP" && git ls-files -z | xargs -0 tar cf - 2>/dev/null) | tar xf - -C "$src" ||
    bail "copy the tracked files"
[ -f "$src/Makefile" ] && [ ! -e "$src/build" ] || bail "a clean copy of the tree"

# A CUDA toolkit that looks complete: the Makefile would build the plugin with
# it (the real headers and libraries where the machine has them, a stand-in nvcc).
# The make below is a fresh one, as a user's: under make test it would inherit
# MAKELEVEL and print no build banner, and CC=clang SANITIZE=... (which make exports
# from its command line) would send its build elsewhere.
cuda=$T/cuda
real=${CUDA_HOME:-/usr/local/cuda}
[ -f "$real/include/cublas_api.h" ] && [ -f "$real/include/cudnn_version.h" ] &&
    [ -f "$real/include/nccl.h" ] || skip_all "no CUDA toolkit with cuDNN and NCCL at $real to stand in for"
mkdir -p "$cuda/bin"
ln -s "$real/include" "$cuda/include"
for d in lib64 lib; do [ -d "$real/$d" ] && ln -s "$real/$d" "$cuda/$d"; done
cat >"$cuda/bin/nvcc" <<EOF
#!/bin/sh
[ "\$1" = --version ] && { echo 'Cuda compilation tools, release 12.0'; exit 0; }
echo "nvcc \$*" >>"$T/nvcc.calls"
exit 1
EOF
chmod +x "$cuda/bin/nvcc"

out=$(cd "$src" && MG_DEMO_LOG_DIR=$T/logs MG_DEMO_ARGS='--model mlp --train-samples 512 --test-samples 256' \
    env -u MAKELEVEL -u MAKEFLAGS -u MFLAGS -u CC -u SANITIZE -u DEBUG -u BUILD nice -n 10 make -j2 NVCC="$cuda/bin/nvcc" CUDA_HOME="$cuda" demo 2>&1)
rc=$?
is "$rc" 0 "make demo succeeds from a clean copy"
[ $rc -eq 0 ] || printf '%s\n' "$out" | tail -n 30 | sed 's/^/#   /'
like "$out" "cuda plugin: .*libmg_cuda.so" "the stand-in CUDA toolkit looks complete to the Makefile"
b=$src/build
ok test -x "$b/bin/mglaunch"
ok test -x "$b/bin/train"
ok test -f "$b/lib/libmg.a"
is "$(ls "$b/lib/libmg_cuda.so" "$b/bin/mglaunch-dashboard" 2>/dev/null)" "" "no CUDA plugin, no dashboard"
is "$(cat "$T/nvcc.calls" 2>/dev/null)" "" "nvcc compiled nothing"
is "$(ls "$b/tests" 2>/dev/null)" "" "no unit tests, helpers or fuzz harnesses"
is "$(find "$b/obj" -path '*/tests/*' -o -name '*.host.o' 2>/dev/null | head -n 3)" "" "no test objects"
like "$out" "train: done: test accuracy" "the demo trained"
like "$out" "== mglaunch logs" "the demo ends with mglaunch logs' summary"

done_testing
