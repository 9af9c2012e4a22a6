/* Base64 encoding and decoding (see base64.h). */
#include "base64.h"

#include <errno.h>

static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t mg_base64_encode(const void *src, size_t n, char *dst)
{
    const unsigned char *s = src;
    size_t o = 0, i;
    for (i = 0; i + 2 < n; i += 3) {
        unsigned v = (unsigned)s[i] << 16 | (unsigned)s[i + 1] << 8 | s[i + 2];
        dst[o++] = alphabet[v >> 18];
        dst[o++] = alphabet[(v >> 12) & 63];
        dst[o++] = alphabet[(v >> 6) & 63];
        dst[o++] = alphabet[v & 63];
    }
    if (i < n) {
        unsigned v = (unsigned)s[i] << 16 | (i + 1 < n ? (unsigned)s[i + 1] << 8 : 0);
        dst[o++] = alphabet[v >> 18];
        dst[o++] = alphabet[(v >> 12) & 63];
        dst[o++] = i + 1 < n ? alphabet[(v >> 6) & 63] : '=';
        dst[o++] = '=';
    }
    dst[o] = 0;
    return o;
}

static int value(int ch)
{
    if (ch >= 'A' && ch <= 'Z')
        return ch - 'A';
    if (ch >= 'a' && ch <= 'z')
        return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9')
        return ch - '0' + 52;
    if (ch == '+' || ch == '-')
        return 62;
    if (ch == '/' || ch == '_')
        return 63;
    return -1;
}

int mg_base64_decode(const char *src, size_t n, void *dst, size_t cap)
{
    unsigned char *d = dst;
    size_t o = 0;
    unsigned acc = 0;
    int bits = 0;

    while (n && src[n - 1] == '=')
        n--;
    for (size_t i = 0; i < n; i++) {
        int v = value((unsigned char)src[i]);
        if (v < 0)
            return -EINVAL;
        acc = acc << 6 | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o >= cap)
                return -ENOSPC;
            d[o++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    if (bits >= 6)
        return -EINVAL;
    return (int)o;
}
