/* Small helpers shared by libmg's runtime files (see rtutil.h). */
#include "rtutil.h"

#include <time.h>

static inline uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

/* Four independent lanes over 32-byte blocks keep the multiplies in flight;
 * the tail and the length are folded in at the end. */
uint64_t mg_hash64(const void *data, size_t len)
{
    const unsigned char *p = data;
    const uint64_t k = 0x9e3779b97f4a7c15ULL;
    uint64_t h[4] = {k, k ^ 1, k ^ 2, k ^ 3};
    size_t i = 0;
    for (; i + 32 <= len; i += 32) {
        for (int l = 0; l < 4; l++) {
            uint64_t w = mg_get_u64(p + i + 8 * l);
            h[l] = (h[l] ^ w) * 0x100000001b3ULL;
            h[l] ^= h[l] >> 29;
        }
    }
    uint64_t acc = (uint64_t)len * k;
    for (int l = 0; l < 4; l++)
        acc = mix64(acc ^ h[l]) * k;
    for (; i < len; i++)
        acc = mix64(acc ^ p[i]);
    return mix64(acc);
}

double mg_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
