/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78): the checksum of
 * TFRecord framing in TensorBoard event files, and of iSCSI, ext4 and Btrfs.
 * Own table-driven code, shared by the runtime (which writes event files) and
 * the launcher; checked against the standard check value and an independent
 * reader (tests/unit/test_crc32c.c, tests/integration/metrics_tb.t). */
#ifndef MG_CRC32C_H
#define MG_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over buf[0..len), as zlib's crc32() does:
 * mg_crc32c(mg_crc32c(0, a, n), b, m) == the CRC of a followed by b.
 * mg_crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t mg_crc32c(uint32_t crc, const void *buf, size_t len);

#endif
