/* Foundations: PyTorch's mt19937 (reference values from the C++ standard and
 * torch.randperm), uniform_ on CPU floats, the counter-based dropout stream,
 * mg_hash64, tensor shape strings, message buffers, and the BLAS loader.
 * timeout: 30 */
#include "blas.h"
#include "mg_err.h"
#include "rng.h"
#include "rtutil.h"
#include "tensor.h"
#include "tap.h"

#include <errno.h>

int main(void)
{
    struct mg_mt19937 g;
    mg_mt19937_seed(&g, 5489);
    uint32_t v = 0;
    for (int i = 0; i < 10000; i++)
        v = mg_mt19937_u32(&g);
    is_int(v, 4123659995u, "mt19937(5489): the 10000th number is 4123659995 (C++ standard)");

    /* torch.Generator().manual_seed(5); torch.randperm(10, generator=g) */
    int32_t perm[10], want[10] = {1, 4, 9, 6, 3, 5, 0, 2, 8, 7};
    mg_mt19937_seed(&g, 5);
    mg_rng_randperm(&g, perm, 10);
    ok(!memcmp(perm, want, sizeof(want)), "randperm(10) with seed 5 equals torch's");

    /* torch.manual_seed(0); torch.empty(3).uniform_(-1, 1) */
    float u[3];
    mg_mt19937_seed(&g, 0);
    mg_rng_uniform(&g, u, 3, -1.0, 1.0);
    ok(u[0] >= -1 && u[0] < 1 && u[1] >= -1 && u[2] < 1, "uniform_ stays in [from, to)");
    is_double(u[0], -0.007486820220947266, 0, "uniform_(-1, 1) first value equals torch's");

    uint32_t a = mg_rng_counter_u32(7, 100), b = mg_rng_counter_u32(7, 100);
    ok(a == b && a != mg_rng_counter_u32(7, 101) && a != mg_rng_counter_u32(8, 100),
       "counter stream: a pure function of (seed, index)");
    long ones = 0;
    for (uint64_t i = 0; i < 100000; i++)
        ones += __builtin_popcount(mg_rng_counter_u32(1, i));
    ok(fabs(ones / 100000.0 - 16.0) < 0.05, "counter stream bits are balanced (%.3f of 32)",
       ones / 100000.0);

    unsigned char buf[1000];
    for (int i = 0; i < 1000; i++)
        buf[i] = (unsigned char)(i * 31);
    uint64_t h = mg_hash64(buf, 1000);
    ok(h == mg_hash64(buf, 1000), "hash is deterministic");
    ok(h != mg_hash64(buf, 999), "hash covers the length");
    buf[517] ^= 1;
    ok(h != mg_hash64(buf, 1000), "one bit changes the hash");
    is_int(mg_hash64("", 0) == mg_hash64("", 0), 1, "empty input hashes");

    struct mg_tensor t = {.ndim = 4, .shape = {64, 32, 5, 5}};
    char s[64];
    mg_tensor_shape_str(&t, s, sizeof(s));
    is_str(s, "[64, 32, 5, 5]", "shape string");

    char err[MG_ERRMSG_LEN];
    is_int(mg_seterr(err, sizeof(err), -EINVAL, "x=%d", 3), -EINVAL, "mg_seterr returns its code");
    is_str(err, "x=3", "and formats the message");
    is_int(mg_seterr(NULL, MG_ERRMSG_LEN, -5, "ignored"), -5, "a NULL buffer is allowed");
    char small[4];
    mg_seterr(small, sizeof(small), -EINVAL, "%s", "abcdef");
    is_str(small, "abc", "a message is cut to the buffer it is given");

    const struct mg_blas *blas;
    is_int(mg_blas_load(1, &blas, err), 0, "a BLAS loads");
    float A[4] = {1, 2, 3, 4}, B[4] = {5, 6, 7, 8}, C[4];
    blas->sgemm(MG_BLAS_ROW_MAJOR, MG_BLAS_NO_TRANS, MG_BLAS_TRANS, 2, 2, 2, 1.0f, A, 2, B, 2, 0.0f,
                C, 2);
    ok(C[0] == 17 && C[1] == 23 && C[2] == 39 && C[3] == 53, "sgemm through the loader");
    diag("BLAS: %s, kernels %s", blas->library, blas->core[0] ? blas->core : "?");
    return done_testing();
}
