/* Builds crafted checkpoints from a real one, for the tests of bounded
 * checkpoint reads (docs/checkpoint-format.md):
 *
 *   ckpt_craft inflate SRC DST BYTES   SRC's sections plus an unknown one of BYTES
 *                                      zero bytes before the end: valid CRCs, a
 *                                      stream that inflates to BYTES more, in a
 *                                      file of about BYTES / 1000
 *   ckpt_craft header SRC DST RAW      SRC with the header's raw size set to RAW
 *                                      and the header CRC fixed
 *
 * A zlib stream of gigabytes is not deflated byte by byte: after a full flush
 * the compressor forgets what came before, so a megabyte of zeros compresses
 * to the same bytes every time, and the stream repeats them. Its Adler-32 is
 * combined arithmetically. */
#include "checkpoint.h"
#include "rtutil.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define UNIT     (1u << 20)
#define OUT_MAX  (4u << 20)
#define TAG_JUNK 99

static void die(const char *what)
{
    fprintf(stderr, "ckpt_craft: %s\n", what);
    exit(1);
}

struct buf {
    unsigned char *p;
    size_t len, cap;
};

static void put(struct buf *b, const void *data, size_t len)
{
    if (len == 0)
        return;
    if (b->len + len > b->cap) {
        b->cap = (b->len + len) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p)
            die("out of memory");
    }
    memcpy(b->p + b->len, data, len);
    b->len += len;
}

/* Deflates len bytes with the given flush, appending the output to out. */
static void squeeze(z_stream *zs, const void *in, size_t len, int flush, struct buf *out)
{
    static unsigned char chunk[OUT_MAX];
    zs->next_in = (unsigned char *)in;
    zs->avail_in = (uInt)len;
    do {
        zs->next_out = chunk;
        zs->avail_out = sizeof(chunk);
        if (deflate(zs, flush) == Z_STREAM_ERROR)
            die("deflate");
        put(out, chunk, sizeof(chunk) - zs->avail_out);
    } while (zs->avail_out == 0);
}

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die("cannot open the source");
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc(*len);
    if (!p || fread(p, 1, *len, f) != *len)
        die("cannot read the source");
    fclose(f);
    return p;
}

static void write_file(const char *path, const unsigned char *hdr, const struct buf *payload)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(hdr, 1, MG_CKPT_HEADER_SIZE, f) != MG_CKPT_HEADER_SIZE ||
        (payload && fwrite(payload->p, 1, payload->len, f) != payload->len) || fclose(f) != 0)
        die("cannot write the result");
}

static void fix_header_crc(unsigned char *h)
{
    mg_put_u32(h + 60, (uint32_t)crc32(0, h, 60));
}

static int craft_inflate(const char *src, const char *dst, uint64_t extra)
{
    char err[MG_ERRMSG_LEN];
    struct mg_ckpt_file f;
    if (mg_ckpt_read(src, &f, err) < 0)
        die(err);
    /* the sections as they were, then the junk section's header */
    struct buf plain = {0}, out = {0}, unit = {0}, tail = {0};
    for (int i = 0; i < f.nsections; i++) {
        unsigned char h[16];
        mg_put_u32(h, f.sections[i].tag);
        mg_put_u32(h + 4, f.sections[i].index);
        mg_put_u64(h + 8, f.sections[i].len);
        put(&plain, h, 16);
        put(&plain, f.sections[i].data, f.sections[i].len);
    }
    unsigned char jh[16], end[16] = {0};
    mg_put_u32(jh, TAG_JUNK);
    mg_put_u32(jh + 4, 0);
    mg_put_u64(jh + 8, extra);
    put(&plain, jh, 16);

    static unsigned char zeros[UNIT];
    z_stream zs = {0};
    if (deflateInit(&zs, 9) != Z_OK)
        die("deflateInit");
    squeeze(&zs, plain.p, plain.len, Z_FULL_FLUSH, &out);
    uint64_t units = extra / UNIT, rest = extra % UNIT;
    struct buf again = {0};
    if (units) {
        squeeze(&zs, zeros, UNIT, Z_FULL_FLUSH, &unit);
        squeeze(&zs, zeros, UNIT, Z_FULL_FLUSH, &again);
        if (again.len != unit.len || memcmp(again.p, unit.p, unit.len) != 0)
            die("a full flush did not make the compressed megabyte repeat");
    }
    squeeze(&zs, zeros, (size_t)rest, Z_FULL_FLUSH, &tail);
    squeeze(&zs, end, sizeof(end), Z_FINISH, &tail);
    deflateEnd(&zs);
    if (tail.len < 4)
        die("short stream");
    tail.len -= 4; /* the Adler-32 of what was really fed; ours follows */

    uLong a_unit = adler32(adler32(0, NULL, 0), zeros, UNIT);
    uLong adler = adler32(adler32(0, NULL, 0), plain.p, (uInt)plain.len);
    for (uint64_t u = 0; u < units; u++)
        adler = adler32_combine64(adler, a_unit, UNIT);
    adler =
        adler32_combine64(adler, adler32(adler32(0, NULL, 0), zeros, (uInt)rest), (z_off64_t)rest);
    adler = adler32_combine64(adler, adler32(adler32(0, NULL, 0), end, 16), 16);
    unsigned char be[4] = {(unsigned char)(adler >> 24), (unsigned char)(adler >> 16),
                           (unsigned char)(adler >> 8), (unsigned char)adler};
    for (uint64_t u = 0; u < units; u++)
        put(&out, unit.p, unit.len);
    put(&out, tail.p, tail.len);
    put(&out, be, 4);

    unsigned char h[MG_CKPT_HEADER_SIZE];
    size_t srclen;
    unsigned char *orig = slurp(src, &srclen);
    memcpy(h, orig, sizeof(h));
    mg_put_u64(h + 16, out.len);
    mg_put_u64(h + 24, plain.len + extra + sizeof(end));
    mg_put_u32(h + 52, (uint32_t)crc32(0, out.p, (uInt)out.len));
    fix_header_crc(h);
    write_file(dst, h, &out);
    free(orig);
    free(plain.p);
    free(out.p);
    free(unit.p);
    free(again.p);
    free(tail.p);
    mg_ckpt_file_release(&f);
    return 0;
}

static int craft_header(const char *src, const char *dst, uint64_t raw)
{
    size_t len;
    unsigned char *p = slurp(src, &len);
    if (len < MG_CKPT_HEADER_SIZE)
        die("the source is not a checkpoint");
    mg_put_u64(p + 24, raw);
    fix_header_crc(p);
    struct buf payload = {p + MG_CKPT_HEADER_SIZE, len - MG_CKPT_HEADER_SIZE, 0};
    write_file(dst, p, &payload);
    free(p);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 5)
        die("usage: ckpt_craft inflate|header SRC DST BYTES");
    uint64_t n = strtoull(argv[4], NULL, 10);
    if (!strcmp(argv[1], "inflate"))
        return craft_inflate(argv[2], argv[3], n);
    if (!strcmp(argv[1], "header"))
        return craft_header(argv[2], argv[3], n);
    die("usage: ckpt_craft inflate|header SRC DST BYTES");
    return 1;
}
