/* base64.c: the RFC 4648 test vectors both ways, the URL-safe alphabet,
 * optional padding, every byte value through a round trip, and the bounds. */
#include "base64.h"
#include "tap.h"

#include <errno.h>

/* timeout: 30 */

static void vector(const char *in, const char *want)
{
    char enc[64], dec[64];
    size_t n = mg_base64_encode(in, strlen(in), enc);
    is_str(enc, want, "encode '%s'", in);
    is_int((int)n, (int)mg_base64_len(strlen(in)), "  its length is mg_base64_len");
    int m = mg_base64_decode(want, strlen(want), dec, sizeof(dec));
    ok(m == (int)strlen(in) && memcmp(dec, in, (size_t)m) == 0, "  '%s' decodes to '%s'", want, in);
}

int main(void)
{
    /* RFC 4648, section 10 */
    vector("", "");
    vector("f", "Zg==");
    vector("fo", "Zm8=");
    vector("foo", "Zm9v");
    vector("foob", "Zm9vYg==");
    vector("fooba", "Zm9vYmE=");
    vector("foobar", "Zm9vYmFy");

    char d[256], e[400];
    is_int(mg_base64_decode("Zm9vYg", 6, d, sizeof(d)), 4, "padding is optional");
    is_int(mg_base64_decode("-_-_", 4, d, sizeof(d)), 3, "the URL-safe alphabet decodes");
    ok((unsigned char)d[0] == 0xfb && (unsigned char)d[1] == 0xff && (unsigned char)d[2] == 0xbf,
       "  to the same bits as '+/+/'");

    unsigned char all[256];
    for (int i = 0; i < 256; i++)
        all[i] = (unsigned char)(255 - i);
    size_t n = mg_base64_encode(all, sizeof(all), e);
    is_int((int)n, (int)mg_base64_len(256), "256 bytes encode to 344 characters");
    ok(mg_base64_decode(e, n, d, sizeof(d)) == 256 && memcmp(d, all, 256) == 0,
       "every byte value survives a round trip");

    is_int(mg_base64_decode("Zm9v!", 5, d, sizeof(d)), -EINVAL, "a character outside the alphabet");
    is_int(mg_base64_decode("Zm9 v", 5, d, sizeof(d)), -EINVAL, "white space is not skipped");
    is_int(mg_base64_decode("Zm9vY", 5, d, sizeof(d)), -EINVAL, "a dangling last character");
    is_int(mg_base64_decode("Zm9vYmFy", 8, d, 3), -ENOSPC, "the output bound holds");
    is_int(mg_base64_decode("Zm9vYmFy", 8, d, 6), 6, "  and an exact fit is fine");
    return done_testing();
}
