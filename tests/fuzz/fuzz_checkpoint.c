/* Fuzz harness: the checkpoint reader (runtime/checkpoint.c): header, sizes,
 * zlib stream and section framing. The first byte picks how the rest is
 * taken: bit 0 clear, as the file itself; set, as a header followed by the
 * uncompressed payload, which the harness compresses and whose sizes it
 * fills in (random bytes are rarely a zlib stream, so the section framing
 * behind it is reached this way). Either way the harness fixes the two CRCs
 * (payload, then header), so that the fuzzer explores what lies behind them.
 * It refuses headers that announce more than 64 MiB of payload: the reader
 * allocates what the header announces before inflating (issue 11, item 6),
 * and bounding that against the model is the trainer's job. */
#include "checkpoint.h"
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define FUZZ_MAX_RAW (64u << 20)

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* header + raw payload -> header + zlib stream, sizes filled in; NULL when
 * the input is too short. */
static uint8_t *compress_payload(const uint8_t *data, size_t size, size_t *out_size)
{
    if (size < MG_CKPT_HEADER_SIZE)
        return NULL;
    size_t raw = size - MG_CKPT_HEADER_SIZE;
    uLongf zlen = compressBound((uLong)raw);
    uint8_t *out = malloc(MG_CKPT_HEADER_SIZE + zlen);
    memcpy(out, data, MG_CKPT_HEADER_SIZE);
    if (compress2(out + MG_CKPT_HEADER_SIZE, &zlen, data + MG_CKPT_HEADER_SIZE, (uLong)raw, 1) !=
        Z_OK) {
        free(out);
        return NULL;
    }
    put64(out + 16, zlen);
    put64(out + 24, raw);
    *out_size = MG_CKPT_HEADER_SIZE + zlen;
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64], err[MG_ERRMSG_LEN];
    struct mg_ckpt_file f;
    uint8_t *in;

    if (size < 1)
        return 0;
    if (data[0] & 1) {
        in = compress_payload(data + 1, size - 1, &size);
        if (!in)
            return 0;
    } else {
        size--;
        in = malloc(size ? size : 1);
        memcpy(in, data + 1, size);
    }
    if (size >= MG_CKPT_HEADER_SIZE) {
        if (get64(in + 24) > FUZZ_MAX_RAW) {
            free(in);
            return 0;
        }
        put32(in + 52,
              (uint32_t)crc32(0, in + MG_CKPT_HEADER_SIZE, (uInt)(size - MG_CKPT_HEADER_SIZE)));
        put32(in + 60, (uint32_t)crc32(0, in, 60));
    }
    int fd = fuzz_file(in, size, path, sizeof(path));
    free(in);
    if (fd < 0)
        return 0;
    if (mg_ckpt_read(path, &f, err) == 0) {
        uint64_t total = 0;
        for (int i = 0; i < f.nsections; i++) {
            const struct mg_ckpt_section *s = &f.sections[i];
            total += s->len;
            if (s->len) {
                volatile uint8_t sink = ((const uint8_t *)s->data)[s->len - 1];
                (void)sink;
            }
            if (mg_ckpt_find(&f, s->tag, s->index) == NULL)
                fuzz_fail("section %d (tag %u index %u) is not found again", i, s->tag, s->index);
        }
        if (total > f.info.raw_bytes)
            fuzz_fail("sections hold %llu bytes of a %llu-byte payload", (unsigned long long)total,
                      (unsigned long long)f.info.raw_bytes);
        mg_ckpt_file_release(&f);
    }
    close(fd);
    return 0;
}
