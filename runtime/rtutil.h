/* Small helpers shared by libmg's runtime files: error messages for the caller,
 * a fast 64-bit hash of a byte range, little-endian packing. */
#ifndef MG_RTUTIL_H
#define MG_RTUTIL_H

#include "mg_err.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "libmg's file formats are written in host order and assume a little-endian host"
#endif

/* Writes a message into err (MG_ERRMSG_LEN bytes) when err is not NULL;
 * returns code, so a caller can write `return mg_errf(err, -EINVAL, ...)`. */
__attribute__((format(printf, 3, 4))) int mg_errf(char *err, int code, const char *fmt, ...);

/* 64-bit hash of a byte range ("mg hash64 v1", documented in docs/checkpoint-format.md).
 * Bit-identical inputs give identical hashes on every machine. */
uint64_t mg_hash64(const void *data, size_t len);

static inline void mg_put_u32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, 4);
}
static inline void mg_put_u64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, 8);
}
static inline uint32_t mg_get_u32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t mg_get_u64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Wall time in seconds on the monotonic clock. */
double mg_seconds(void);

#endif
