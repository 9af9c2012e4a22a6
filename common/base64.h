/* Base64 (RFC 4648, section 4, with padding): etcd's JSON gateway carries keys
 * and values in it, and HTTP headers (Content-MD5, basic auth) will too.
 * Checked against the RFC's test vectors (tests/unit/test_base64.c). */
#ifndef MG_BASE64_H
#define MG_BASE64_H

#include <stddef.h>

/* The encoded length of n bytes, without the NUL: 4 * ceil(n / 3). */
static inline size_t mg_base64_len(size_t n)
{
    return (n + 2) / 3 * 4;
}

/* Writes mg_base64_len(n) characters and a NUL to dst; returns the length. */
size_t mg_base64_encode(const void *src, size_t n, char *dst);

/* Decodes n characters into at most cap bytes, and returns how many, or
 * -EINVAL for a character outside the alphabet (the URL-safe one of section
 * 5 is accepted too) or a dangling last character, -ENOSPC when cap is too
 * small. Trailing '=' are optional. */
int mg_base64_decode(const char *src, size_t n, void *dst, size_t cap);

#endif
