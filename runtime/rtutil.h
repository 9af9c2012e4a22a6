/* Small helpers shared by libmg's runtime files: a fast 64-bit hash of a byte
 * range, little-endian packing, a monotonic clock. (Error messages for the
 * caller use common's mg_seterr, in mg_err.h.) */
#ifndef MG_RTUTIL_H
#define MG_RTUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "libmg's file formats are written in host order and assume a little-endian host"
#endif

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
