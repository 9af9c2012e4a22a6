#!/bin/sh
# The GPU suite's counter of host waits (tests/helpers/cudawaits, preloaded by
# tests/gpu/sync_free.t), against the real CUDA runtime of this build, with no
# GPU: a library loaded the way train loads the CUDA plugin (dlopen, its own
# scope, libcudart its dependency) calls cudaStreamSynchronize twice,
# cudaDeviceSynchronize, cudaEventSynchronize and cudaMemcpy once each; under
# LD_PRELOAD each call is counted and still reaches the real runtime (which
# answers that there is no driver, 35, not the counter's own 3), and the
# counts land in MG_CUDAWAITS_OUT at exit.
# timeout: 60
. "$(dirname "$0")/../lib/lib.sh"
LIB=$HELPERS/cudawaits/libcudawaits.so
[ -f "$LIB" ] || bail "the wait counter is built ($LIB)"
[ -f "$MG_BUILD/lib/libmg_cuda.so" ] || skip_all "this build has no CUDA plugin (no CUDA runtime to check against)"
CUDART=$(ldd "$MG_BUILD/lib/libmg_cuda.so" | sed -n 's/^[[:space:]]*libcudart\.so\.[0-9]* => \(\/[^ ]*\) .*/\1/p' | head -n 1)
[ -n "$CUDART" ] || skip_all "the plugin's libcudart is not found on this machine"
cat >"$T/waiter.c" <<'C'
int cudaStreamSynchronize(void *s);
int cudaDeviceSynchronize(void);
int cudaEventSynchronize(void *e);
int cudaMemcpy(void *d, const void *s, unsigned long n, int kind);
int waits(void)
{
    char a[4] = {0}, b[4] = {0};
    cudaStreamSynchronize(0);
    cudaDeviceSynchronize();
    cudaEventSynchronize(0);
    cudaMemcpy(a, b, 4, 0);
    return cudaStreamSynchronize(0);
}
C
cat >"$T/main.c" <<'C'
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv)
{
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    int (*waits)(void) = h ? (int (*)(void))dlsym(h, "waits") : 0;
    if (!waits) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    printf("%d\n", waits());
    return 0;
}
C
cc -shared -fPIC -o "$T/libwaiter.so" "$T/waiter.c" "$CUDART" -Wl,-rpath,"$(dirname "$CUDART")" &&
    cc -o "$T/main" "$T/main.c" -ldl || bail "cannot build the probe program"
out=$("$T/main" "$T/libwaiter.so" 2>&1)
diag "without the counter, the runtime answers $out (no driver here)"
got=$(MG_CUDAWAITS_OUT="$T/counts" LD_PRELOAD=$LIB "$T/main" "$T/libwaiter.so" 2>&1)
is "$got" "$out" "under LD_PRELOAD every call still reaches the real runtime (its answer: $out)"
unlike "$got" '^3$' "... not the counter's stand-in answer"
is "$(cat "$T/counts" 2>/dev/null)" \
    "cudaStreamSynchronize 2 cudaDeviceSynchronize 1 cudaEventSynchronize 1 cudaMemcpy 1" \
    "each call counted, the counts in MG_CUDAWAITS_OUT at exit"
MG_CUDAWAITS_OUT="$T/counts" LD_PRELOAD=$LIB /bin/true
is "$(wc -l <"$T/counts")" 2 "a program without CUDA: a line of zeros appended, nothing broken"
like "$(tail -n 1 "$T/counts")" '^cudaStreamSynchronize 0 cudaDeviceSynchronize 0' "... all zero"
done_testing
