/* Random store frames for the fuzz tests (test_store_proto.c, test_store.c):
 * a valid request with random fields, then, half the time, one mutation. */
#ifndef MG_TEST_STORE_FRAMES_H
#define MG_TEST_STORE_FRAMES_H

#include "store_proto.h"

#include <stdlib.h>
#include <string.h>

/* A random valid request, encoded; then, half the time, one mutation (a
 * byte changed, the body cut, or a byte added). */
/* out must hold 256 bytes. */
static inline size_t random_frame(unsigned *seed, uint8_t *out)
{
    static const char letters[] = "abcxyz/\0";
    uint8_t key[8], val[16], val2[16], packed[3 * 10];
    struct mg_sp_req q = {.op = (uint8_t)(1 + rand_r(seed) % MG_SP_OP_MAX)};
    q.klen = 1 + (size_t)rand_r(seed) % 8;
    for (size_t i = 0; i < q.klen; i++)
        key[i] = (uint8_t)letters[rand_r(seed) % 7];
    q.key = key;
    q.vlen = (size_t)rand_r(seed) % 16;
    q.vlen2 = (size_t)rand_r(seed) % 16;
    memset(val, 'v', sizeof(val));
    memset(val2, 'w', sizeof(val2));
    q.val = val;
    q.val2 = val2;
    q.num = rand_r(seed) % 5 - 2;
    q.timeout_ms = (uint32_t)rand_r(seed) % 3;
    q.max = (uint32_t)rand_r(seed) % 4;
    q.nkeys = 1 + rand_r(seed) % 3;
    q.keys = packed;
    q.keys_len = 0;
    for (int i = 0; i < q.nkeys; i++)
        q.keys_len += mg_sp_keys_put(packed + q.keys_len, key, 1 + (size_t)i);
    if (q.op == MG_SP_SET && rand_r(seed) % 2)
        q.flags = MG_SP_F_EPHEMERAL;
    if (q.op == MG_SP_CAS && rand_r(seed) % 2) {
        q.flags = MG_SP_F_EXPECT_ABSENT;
        q.vlen = 0;
    }
    size_t n = mg_sp_req_encode(out, &q, 1);
    int m = rand_r(seed) % 6;
    if (m == 0 && n > MG_SP_HDR_LEN) { /* change one body byte */
        size_t at = MG_SP_HDR_LEN + (size_t)rand_r(seed) % (n - MG_SP_HDR_LEN);
        out[at] = (uint8_t)(rand_r(seed) % 3 ? out[at] ^ (1u << (rand_r(seed) % 8)) : 0xff);
    } else if (m == 1 && n > MG_SP_HDR_LEN) { /* cut the body */
        n = MG_SP_HDR_LEN + (size_t)rand_r(seed) % (n - MG_SP_HDR_LEN);
        mg_sp_put32(out, (uint32_t)(n - MG_SP_HDR_LEN));
    } else if (m == 2) { /* one byte more */
        out[n++] = (uint8_t)rand_r(seed);
        mg_sp_put32(out, (uint32_t)(n - MG_SP_HDR_LEN));
    } else if (m == 3) { /* another flag */
        out[5] = (uint8_t)(1u << (rand_r(seed) % 3));
    }
    return n;
}

#endif
