/* SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the store's
 * challenge-response authentication and anything else that needs a digest.
 * Own implementation, checked against the standard test vectors
 * (tests/unit/test_sha256.c). */
#ifndef MG_SHA256_H
#define MG_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define MG_SHA256_LEN   32
#define MG_SHA256_BLOCK 64

struct mg_sha256 {
    uint32_t h[8];
    uint64_t nbytes;
    uint8_t buf[MG_SHA256_BLOCK];
    size_t nbuf;
};

void mg_sha256_init(struct mg_sha256 *c);
void mg_sha256_update(struct mg_sha256 *c, const void *data, size_t len);
void mg_sha256_final(struct mg_sha256 *c, uint8_t out[MG_SHA256_LEN]);
void mg_sha256(const void *data, size_t len, uint8_t out[MG_SHA256_LEN]);

struct mg_hmac_sha256 {
    struct mg_sha256 inner, outer;
};

void mg_hmac_sha256_init(struct mg_hmac_sha256 *c, const void *key, size_t keylen);
void mg_hmac_sha256_update(struct mg_hmac_sha256 *c, const void *data, size_t len);
void mg_hmac_sha256_final(struct mg_hmac_sha256 *c, uint8_t out[MG_SHA256_LEN]);
void mg_hmac_sha256(const void *key, size_t keylen, const void *data, size_t len,
                    uint8_t out[MG_SHA256_LEN]);

/* Compares two buffers in time that depends only on len (for MACs).
 * Returns 1 when equal. */
int mg_memeq_ct(const void *a, const void *b, size_t len);

#endif
