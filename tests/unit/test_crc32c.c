/* crc32c.c: the CRC-32C check value, the iSCSI test vectors of RFC 3720
 * (B.4), and the table code against a bit-at-a-time reference at every length
 * and split, so slicing-by-8's tail and alignment handling are covered. */
#include "crc32c.h"
#include "tap.h"

#include <stdint.h>

/* timeout: 60 */

static uint32_t crc_bitwise(const unsigned char *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

int main(void)
{
    is_int(mg_crc32c(0, "123456789", 9), 0xE3069283u, "check value: \"123456789\" -> 0xE3069283");
    is_int(mg_crc32c(0, "", 0), 0, "empty input -> 0");
    is_int(mg_crc32c(0x12345678u, "", 0), 0x12345678u, "empty input leaves a running CRC");

    unsigned char v[48];
    memset(v, 0, 32);
    is_int(mg_crc32c(0, v, 32), 0x8A9136AAu, "RFC 3720 B.4: 32 bytes of zeros");
    memset(v, 0xff, 32);
    is_int(mg_crc32c(0, v, 32), 0x62A8AB43u, "RFC 3720 B.4: 32 bytes of 0xFF");
    for (int i = 0; i < 32; i++)
        v[i] = (unsigned char)i;
    is_int(mg_crc32c(0, v, 32), 0x46DD794Eu, "RFC 3720 B.4: 32 incrementing bytes");
    for (int i = 0; i < 32; i++)
        v[i] = (unsigned char)(31 - i);
    is_int(mg_crc32c(0, v, 32), 0x113FDB5Cu, "RFC 3720 B.4: 32 decrementing bytes");
    static const unsigned char scsi[48] = {
        0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
        0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    is_int(mg_crc32c(0, scsi, sizeof(scsi)), 0xD9963A56u, "RFC 3720 B.4: an iSCSI read command");

    /* Every length 0..300, from every alignment 0..7, whole and split at
     * every point, against the bit-at-a-time reference. */
    static unsigned char buf[320];
    uint32_t x = 0x9e3779b9u;
    for (size_t i = 0; i < sizeof(buf); i++) {
        x = x * 1664525u + 1013904223u;
        buf[i] = (unsigned char)(x >> 24);
    }
    int whole_bad = 0, split_bad = 0;
    for (size_t off = 0; off < 8; off++) {
        for (size_t n = 0; n + off <= 308; n++) {
            uint32_t want = crc_bitwise(buf + off, n);
            if (mg_crc32c(0, buf + off, n) != want)
                whole_bad++;
            for (size_t cut = 0; cut <= n; cut += 1 + n / 16)
                if (mg_crc32c(mg_crc32c(0, buf + off, cut), buf + off + cut, n - cut) != want)
                    split_bad++;
        }
    }
    is_int(whole_bad, 0, "every length and alignment agrees with the bitwise reference");
    is_int(split_bad, 0, "a CRC extended piece by piece equals the whole one");
    return done_testing();
}
