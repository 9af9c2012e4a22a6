/* The checkpoint container: header, zlib stream of sections, atomic writes,
 * completion markers, listing and pruning (see checkpoint.h). */
#include "checkpoint.h"
#include "fs.h"
#include "mg_err.h"
#include "net.h"
#include "rtutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

const unsigned char mg_ckpt_magic[8] = {0x89, 'M', 'G', 'C', 'K', 'P', 'T', '\n'};

#define IO_CHUNK    (256u << 10)
#define SECTION_HDR 16

/* Header layout (little-endian):
 *   0 magic[8]  8 version u32  12 header_size u32  16 payload_bytes u64
 *  24 raw_bytes u64  32 step u64  40 nparams u64  48 world_size u32
 *  52 payload_crc u32  56 flags u32  60 header_crc u32 (of bytes 0..59) */

void mg_ckpt_path(const char *dir, uint64_t step, char *buf, size_t len)
{
    snprintf(buf, len, "%s/ckpt-%012" PRIu64 ".mgc", dir, step);
}

void mg_ckpt_marker_path(const char *dir, uint64_t step, char *buf, size_t len)
{
    snprintf(buf, len, "%s/ckpt-%012" PRIu64 ".done", dir, step);
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return rc;
}

struct zwriter {
    z_stream zs;
    int fd;
    unsigned char out[IO_CHUNK];
    uint32_t crc;
    uint64_t written;
    uint64_t raw;
};

static int zw_feed(struct zwriter *w, const void *data, size_t len, int flush)
{
    const unsigned char *p = data;
    do {
        size_t piece = len > (1u << 30) ? (1u << 30) : len;
        w->zs.next_in = (unsigned char *)p;
        w->zs.avail_in = (uInt)piece;
        p += piece;
        len -= piece;
        int f = len == 0 ? flush : Z_NO_FLUSH;
        int zr;
        do {
            w->zs.next_out = w->out;
            w->zs.avail_out = sizeof(w->out);
            zr = deflate(&w->zs, f);
            if (zr == Z_STREAM_ERROR)
                return -MG_EFORMAT;
            size_t have = sizeof(w->out) - w->zs.avail_out;
            if (have) {
                int rc = mg_write_full(w->fd, w->out, have, -1);
                if (rc < 0)
                    return rc;
                w->crc = (uint32_t)crc32(w->crc, w->out, (uInt)have);
                w->written += have;
            }
        } while (w->zs.avail_out == 0 || (f == Z_FINISH && zr != Z_STREAM_END));
        w->raw += piece;
    } while (len);
    return 0;
}

static int zw_section(struct zwriter *w, uint32_t tag, uint32_t index, uint64_t len,
                      const void *data)
{
    unsigned char h[SECTION_HDR];
    mg_put_u32(h, tag);
    mg_put_u32(h + 4, index);
    mg_put_u64(h + 8, len);
    int rc = zw_feed(w, h, sizeof(h), Z_NO_FLUSH);
    if (rc == 0 && len)
        rc = zw_feed(w, data, len, Z_NO_FLUSH);
    return rc;
}

static void pack_header(unsigned char *h, const struct mg_ckpt_info *info, uint32_t payload_crc)
{
    memset(h, 0, MG_CKPT_HEADER_SIZE);
    memcpy(h, mg_ckpt_magic, 8);
    mg_put_u32(h + 8, info->version);
    mg_put_u32(h + 12, MG_CKPT_HEADER_SIZE);
    mg_put_u64(h + 16, info->payload_bytes);
    mg_put_u64(h + 24, info->raw_bytes);
    mg_put_u64(h + 32, info->step);
    mg_put_u64(h + 40, info->nparams);
    mg_put_u32(h + 48, info->world_size);
    mg_put_u32(h + 52, payload_crc);
    mg_put_u32(h + 56, 0);
    mg_put_u32(h + 60, (uint32_t)crc32(0, h, 60));
}

/* Writes path through a temporary file: write, fsync, rename, fsync dir. */
static int open_tmp(const char *path, char *tmp, size_t len, int *fd)
{
    snprintf(tmp, len, "%s.tmp.%ld", path, (long)getpid());
    *fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    return *fd < 0 ? -errno : 0;
}

static int commit_tmp(int fd, const char *tmp, const char *path, const char *dir)
{
    int rc = 0;
    if (fsync(fd) < 0)
        rc = -errno;
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path) < 0)
        rc = -errno;
    if (rc == 0)
        rc = fsync_dir(dir);
    if (rc < 0)
        unlink(tmp);
    return rc;
}

int mg_ckpt_write(const char *dir, const struct mg_ckpt_info *info_in,
                  const struct mg_ckpt_section *sections, int nsections, char *err)
{
    char path[MG_CKPT_PATH_MAX], tmp[MG_CKPT_PATH_MAX + 32];
    unsigned char hdr[MG_CKPT_HEADER_SIZE];
    struct mg_ckpt_info info = *info_in;
    struct zwriter *w = NULL;
    int fd = -1, rc;

    if (nsections < 0 || nsections > MG_CKPT_MAX_SECTIONS)
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_ETOOBIG, "too many checkpoint sections (%d)",
                         nsections);
    if (info.version == 0)
        info.version = MG_CKPT_VERSION;
    if (info.version < MG_CKPT_VERSION_MIN || info.version > MG_CKPT_VERSION)
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_EVERSION,
                         "cannot write checkpoint format version %u", info.version);
    rc = mg_mkdir_p(dir, 0755);
    if (rc < 0)
        return mg_seterr(err, MG_ERRMSG_LEN, rc, "cannot create checkpoint directory '%s': %s", dir,
                         mg_strerror(rc));
    mg_ckpt_path(dir, info.step, path, sizeof(path));
    rc = open_tmp(path, tmp, sizeof(tmp), &fd);
    if (rc < 0)
        return mg_seterr(err, MG_ERRMSG_LEN, rc, "cannot create '%s': %s", tmp, mg_strerror(rc));
    w = calloc(1, sizeof(*w));
    if (!w) {
        rc = -ENOMEM;
        goto close;
    }
    w->fd = fd;
    /* Stored blocks: weights and optimizer moments barely compress (level 1
     * saves under a tenth of the bytes), and inflating them took five times as
     * long as the rest of a restart's read; stored, a read is a copy and a CRC. */
    if (deflateInit(&w->zs, Z_NO_COMPRESSION) != Z_OK) {
        rc = -ENOMEM;
        goto free_w;
    }
    memset(hdr, 0, sizeof(hdr));
    rc = mg_write_full(fd, hdr, sizeof(hdr), -1);
    for (int i = 0; rc == 0 && i < nsections; i++)
        rc = zw_section(w, sections[i].tag, sections[i].index, sections[i].len, sections[i].data);
    if (rc == 0) {
        unsigned char end[SECTION_HDR] = {0};
        rc = zw_feed(w, end, sizeof(end), Z_FINISH);
    }
    if (rc < 0)
        goto deflate_end;
    info.payload_bytes = w->written;
    info.raw_bytes = w->raw;
    pack_header(hdr, &info, w->crc);
    if (pwrite(fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr)) {
        rc = errno ? -errno : -EIO;
        goto deflate_end;
    }
    deflateEnd(&w->zs);
    free(w);
    rc = commit_tmp(fd, tmp, path, dir);
    if (rc < 0)
        return mg_seterr(err, MG_ERRMSG_LEN, rc, "cannot write '%s': %s", path, mg_strerror(rc));
    return 0;

deflate_end:
    deflateEnd(&w->zs);
free_w:
    free(w);
close:
    close(fd);
    unlink(tmp);
    return mg_seterr(err, MG_ERRMSG_LEN, rc, "cannot write '%s': %s", tmp, mg_strerror(rc));
}

/* Writes a small file atomically: temporary name, fsync, rename, fsync dir. */
static int write_small(const char *dir, const char *path, const char *text, size_t len, char *err)
{
    char tmp[MG_CKPT_PATH_MAX + 32];
    int fd, rc = open_tmp(path, tmp, sizeof(tmp), &fd);
    if (rc < 0)
        return mg_seterr(err, MG_ERRMSG_LEN, rc, "cannot create '%s': %s", tmp, mg_strerror(rc));
    rc = mg_write_full(fd, text, len, -1);
    if (rc < 0) {
        close(fd);
        unlink(tmp);
        return mg_seterr(err, MG_ERRMSG_LEN, rc, "cannot write '%s': %s", tmp, mg_strerror(rc));
    }
    rc = commit_tmp(fd, tmp, path, dir);
    if (rc < 0)
        return mg_seterr(err, MG_ERRMSG_LEN, rc, "cannot write '%s': %s", path, mg_strerror(rc));
    return 0;
}

#define MARKER_TEXT "mg checkpoint complete: step "

int mg_ckpt_mark_complete(const char *dir, uint64_t step, uint64_t run, char *err)
{
    char path[MG_CKPT_PATH_MAX], text[96];
    mg_ckpt_marker_path(dir, step, path, sizeof(path));
    int len =
        snprintf(text, sizeof(text), MARKER_TEXT "%" PRIu64 " run %016" PRIx64 "\n", step, run);
    return write_small(dir, path, text, (size_t)len, err);
}

static int read_all(int fd, void *buf, size_t len, size_t *got)
{
    char *p = buf;
    *got = 0;
    while (*got < len) {
        ssize_t r = read(fd, p + *got, len - *got);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            break;
        *got += (size_t)r;
    }
    return 0;
}

/* Splits the inflated payload into sections. A partial payload (the prefix a
 * bounded read kept) ends where the kept bytes end: the sections that fit
 * whole are listed, and a missing end section is no error there. */
static int parse_sections(struct mg_ckpt_file *f, uint64_t have, const char *path, char *err)
{
    size_t off = 0, cap = 16;
    f->sections = calloc(cap, sizeof(*f->sections));
    if (!f->sections)
        return -ENOMEM;
    for (;;) {
        if (have - off < SECTION_HDR) {
            if (f->partial)
                return 0;
            return mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT, "'%s': section table ends early",
                             path);
        }
        const unsigned char *h = f->raw + off;
        uint32_t tag = mg_get_u32(h);
        uint64_t len = mg_get_u64(h + 8);
        off += SECTION_HDR;
        if (tag == MG_CKPT_TAG_END) {
            if (len != 0 || off != f->info.raw_bytes)
                return mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT,
                                 "'%s': data after the end section", path);
            return 0;
        }
        if (len > f->info.raw_bytes - off)
            return mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT,
                             "'%s': section %d (tag %u) is %" PRIu64 " bytes, past the end", path,
                             f->nsections, tag, len);
        if (len > have - off)
            return 0; /* partial: this one was not kept */
        if (f->nsections >= MG_CKPT_MAX_SECTIONS)
            return mg_seterr(err, MG_ERRMSG_LEN, -MG_ETOOBIG, "'%s': over %d sections", path,
                             MG_CKPT_MAX_SECTIONS);
        if ((size_t)f->nsections == cap) {
            struct mg_ckpt_section *s = realloc(f->sections, 2 * cap * sizeof(*s));
            if (!s)
                return -ENOMEM;
            f->sections = s;
            cap *= 2;
        }
        f->sections[f->nsections++] = (struct mg_ckpt_section){
            .tag = tag, .index = mg_get_u32(h + 4), .len = len, .data = f->raw + off};
        off += len;
    }
}

int mg_ckpt_read(const char *path, struct mg_ckpt_file *out, char *err)
{
    return mg_ckpt_read_bounded(path, NULL, out, err);
}

/* What the header may promise: consistent sizes (zlib never grows its input
 * by more than compressBound() says), within the general cap. Checked before
 * anything is allocated. */
static int check_sizes(const struct mg_ckpt_info *info, const char *path, char *err)
{
    if (info->raw_bytes > MG_CKPT_MAX_RAW)
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_ETOOBIG,
                         "'%s': payload of %" PRIu64 " bytes is over the limit", path,
                         info->raw_bytes);
    if (info->payload_bytes > compressBound((uLong)info->raw_bytes))
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT,
                         "'%s': %" PRIu64
                         " bytes of compressed payload cannot inflate to the %" PRIu64
                         " bytes the header says",
                         path, info->payload_bytes, info->raw_bytes);
    return 0;
}

/* How much of the inflated payload a bounded read keeps (the rest is only
 * checksummed): what the reader says a checkpoint of its model can hold. */
static int kept_bytes(const struct mg_ckpt_info *info, const struct mg_ckpt_bound *bound,
                      const char *path, uint64_t *keep, char *err)
{
    *keep = info->raw_bytes;
    if (!bound)
        return 0;
    if (info->world_size == 0 || info->world_size > bound->max_world)
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT,
                         "'%s': world size %u in the header (at most %u)", path, info->world_size,
                         bound->max_world);
    uint64_t max_raw = bound->fixed + bound->per_rank * info->world_size;
    if (*keep > max_raw)
        *keep = max_raw;
    return 0;
}

int mg_ckpt_read_bounded(const char *path, const struct mg_ckpt_bound *bound,
                         struct mg_ckpt_file *out, char *err)
{
    unsigned char hdr[MG_CKPT_HEADER_SIZE];
    unsigned char *zbuf = NULL;
    z_stream zs = {0};
    int zinit = 0;
    struct stat st;
    size_t got;
    int fd, rc;

    memset(out, 0, sizeof(*out));
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
        return mg_seterr(err, MG_ERRMSG_LEN, rc, "'%s': cannot open: %s", path, mg_strerror(rc));
    }
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        mg_seterr(err, MG_ERRMSG_LEN, rc, "'%s': %s", path, mg_strerror(rc));
        goto close;
    }
    rc = read_all(fd, hdr, sizeof(hdr), &got);
    if (rc < 0) {
        mg_seterr(err, MG_ERRMSG_LEN, rc, "'%s': cannot read: %s", path, mg_strerror(rc));
        goto close;
    }
    if (got < 8 || memcmp(hdr, mg_ckpt_magic, 8) != 0) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT, "'%s': not an mg checkpoint (bad magic)",
                       path);
        goto close;
    }
    if (got < sizeof(hdr)) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_ETRUNC,
                       "'%s': truncated inside the header (%zu bytes)", path, got);
        goto close;
    }
    out->info.version = mg_get_u32(hdr + 8);
    if (out->info.version < MG_CKPT_VERSION_MIN || out->info.version > MG_CKPT_VERSION) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_EVERSION,
                       "'%s': checkpoint format version %u, this build reads versions %d to %d",
                       path, out->info.version, MG_CKPT_VERSION_MIN, MG_CKPT_VERSION);
        goto close;
    }
    if (mg_get_u32(hdr + 60) != (uint32_t)crc32(0, hdr, 60)) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_ECRC,
                       "'%s': header checksum mismatch (corrupt header)", path);
        goto close;
    }
    if (mg_get_u32(hdr + 12) != MG_CKPT_HEADER_SIZE) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT, "'%s': header size %u, expected %d", path,
                       mg_get_u32(hdr + 12), MG_CKPT_HEADER_SIZE);
        goto close;
    }
    out->info.payload_bytes = mg_get_u64(hdr + 16);
    out->info.raw_bytes = mg_get_u64(hdr + 24);
    out->info.step = mg_get_u64(hdr + 32);
    out->info.nparams = mg_get_u64(hdr + 40);
    out->info.world_size = mg_get_u32(hdr + 48);
    uint32_t want_crc = mg_get_u32(hdr + 52);
    rc = check_sizes(&out->info, path, err);
    if (rc < 0)
        goto close;
    uint64_t want_size = MG_CKPT_HEADER_SIZE + out->info.payload_bytes;
    if ((uint64_t)st.st_size != want_size) {
        rc = mg_seterr(
            err, MG_ERRMSG_LEN, (uint64_t)st.st_size < want_size ? -MG_ETRUNC : -MG_EFORMAT,
            "'%s': %s: %lld bytes, the header says %" PRIu64, path,
            (uint64_t)st.st_size < want_size ? "truncated" : "longer than its header says",
            (long long)st.st_size, want_size);
        goto close;
    }
    uint64_t keep;
    rc = kept_bytes(&out->info, bound, path, &keep, err);
    if (rc < 0)
        goto close;
    out->partial = keep < out->info.raw_bytes;
    /* one byte more than promised: a stream that goes on past the header's
     * size is caught by filling it */
    uint64_t room = out->partial ? keep : keep + 1;
    zbuf = malloc(IO_CHUNK);
    out->raw = malloc(room);
    if (!zbuf || !out->raw || inflateInit(&zs) != Z_OK) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -ENOMEM, "'%s': out of memory", path);
        goto free_bufs;
    }
    zinit = 1;
    /* The payload streams through: read a chunk, checksum it, inflate it while
     * there is room. A partial read stops inflating at the bound but still
     * checksums every byte. */
    uint64_t in_off = 0, out_off = 0;
    uint32_t crc = 0;
    int zr = Z_OK;
    while (in_off < out->info.payload_bytes) {
        uint64_t left = out->info.payload_bytes - in_off;
        size_t want = left < IO_CHUNK ? (size_t)left : IO_CHUNK;
        rc = read_all(fd, zbuf, want, &got);
        if (rc == 0 && got != want)
            rc = -MG_ETRUNC;
        if (rc < 0) {
            mg_seterr(err, MG_ERRMSG_LEN, rc, "'%s': cannot read the payload: %s", path,
                      mg_strerror(rc));
            goto free_bufs;
        }
        crc = (uint32_t)crc32(crc, zbuf, (uInt)got);
        in_off += got;
        zs.next_in = zbuf;
        zs.avail_in = (uInt)got;
        while (zr == Z_OK && zs.avail_in > 0 && out_off < room) {
            uint64_t out_left = room - out_off;
            zs.next_out = out->raw + out_off;
            zs.avail_out = (uInt)(out_left > (1u << 30) ? (1u << 30) : out_left);
            uInt ao = zs.avail_out, ai = zs.avail_in;
            zr = inflate(&zs, Z_NO_FLUSH);
            out_off += ao - zs.avail_out;
            if (zr == Z_OK && ai == zs.avail_in && ao == zs.avail_out)
                zr = Z_BUF_ERROR;
        }
        if (zr == Z_STREAM_END && zs.avail_in > 0)
            zr = Z_DATA_ERROR; /* bytes after the stream's end */
    }
    if (crc != want_crc) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_ECRC,
                       "'%s': payload checksum mismatch (corrupt data)", path);
        goto free_bufs;
    }
    int complete = zr == Z_STREAM_END && out_off == out->info.raw_bytes;
    if (out->partial ? (zr != Z_OK && zr != Z_STREAM_END) || out_off != keep : !complete) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT,
                       "'%s': bad compressed payload (%" PRIu64 " of %" PRIu64 " bytes inflated)",
                       path, out_off, out->info.raw_bytes);
        goto free_bufs;
    }
    rc = parse_sections(out, out_off, path, err);
    if (rc < 0)
        goto free_bufs;
    inflateEnd(&zs);
    free(zbuf);
    close(fd);
    return 0;

free_bufs:
    if (zinit)
        inflateEnd(&zs);
    free(zbuf);
    mg_ckpt_file_release(out);
close:
    close(fd);
    return rc;
}

uint64_t mg_ckpt_sections_bytes(const struct mg_ckpt_section *sections, int nsections)
{
    uint64_t n = SECTION_HDR; /* the end section */
    for (int i = 0; i < nsections; i++)
        n += SECTION_HDR + sections[i].len;
    return n;
}

int mg_ckpt_sections_pack(unsigned char *buf, uint64_t cap, const struct mg_ckpt_section *sections,
                          int nsections, uint64_t *offsets, uint64_t *len)
{
    uint64_t need = mg_ckpt_sections_bytes(sections, nsections), off = 0;
    if (need > cap)
        return -MG_ETOOBIG;
    for (int i = 0; i < nsections; i++) {
        const struct mg_ckpt_section *s = &sections[i];
        mg_put_u32(buf + off, s->tag);
        mg_put_u32(buf + off + 4, s->index);
        mg_put_u64(buf + off + 8, s->len);
        off += SECTION_HDR;
        if (offsets)
            offsets[i] = off;
        if (s->data && s->len)
            memcpy(buf + off, s->data, s->len);
        off += s->len;
    }
    memset(buf + off, 0, SECTION_HDR);
    *len = off + SECTION_HDR;
    return 0;
}

int mg_ckpt_parse_payload(unsigned char *raw, uint64_t len, const char *what,
                          struct mg_ckpt_file *out, char *err)
{
    memset(out, 0, sizeof(*out));
    out->raw = raw;
    out->info.raw_bytes = len;
    /* a payload in memory has no header to say its version: it is this build's,
     * every field of the current version written (without it, the position of
     * a pass that began mid-epoch, after a reshard, read as 0) */
    out->info.version = MG_CKPT_VERSION;
    int rc = parse_sections(out, len, what, err);
    if (rc < 0)
        mg_ckpt_file_release(out);
    return rc;
}

void mg_ckpt_file_release(struct mg_ckpt_file *f)
{
    free(f->raw);
    free(f->sections);
    memset(f, 0, sizeof(*f));
}

const struct mg_ckpt_section *mg_ckpt_find(const struct mg_ckpt_file *f, uint32_t tag,
                                           uint32_t index)
{
    for (int i = 0; i < f->nsections; i++)
        if (f->sections[i].tag == tag && f->sections[i].index == index)
            return &f->sections[i];
    return NULL;
}

/* Parses "ckpt-<digits><suffix>" exactly. */
static int parse_name(const char *name, const char *suffix, uint64_t *step)
{
    if (strncmp(name, "ckpt-", 5) != 0)
        return 0;
    const char *p = name + 5;
    uint64_t v = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 19) {
        v = v * 10 + (uint64_t)(*p - '0');
        p++;
        digits++;
    }
    if (digits == 0 || strcmp(p, suffix) != 0)
        return 0;
    *step = v;
    return 1;
}

/* The run a completion marker records; 0 for a marker written before they did. */
static uint64_t marker_run(const char *dir, uint64_t step)
{
    char path[MG_CKPT_PATH_MAX], text[128];
    mg_ckpt_marker_path(dir, step, path, sizeof(path));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t got = 0;
    int rc = read_all(fd, text, sizeof(text) - 1, &got);
    close(fd);
    if (rc < 0)
        return 0;
    text[got] = '\0';
    const char *p = strstr(text, " run ");
    if (strncmp(text, MARKER_TEXT, strlen(MARKER_TEXT)) != 0 || !p)
        return 0;
    char *end;
    uint64_t run = strtoull(p + 5, &end, 16);
    return end == p + 5 + 16 && *end == '\n' ? run : 0;
}

static int cmp_entry_desc(const void *a, const void *b)
{
    uint64_t x = ((const struct mg_ckpt_entry *)a)->step;
    uint64_t y = ((const struct mg_ckpt_entry *)b)->step;
    return x < y ? 1 : x > y ? -1 : 0;
}

int mg_ckpt_list_runs(const char *dir, const struct mg_ckpt_owner *own, struct mg_ckpt_entry *out,
                      int max)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? 0 : -errno;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        uint64_t step;
        char path[MG_CKPT_PATH_MAX];
        struct stat st;
        if (!parse_name(e->d_name, ".done", &step))
            continue;
        mg_ckpt_path(dir, step, path, sizeof(path));
        if (stat(path, &st) < 0 || max < 1)
            continue;
        uint64_t run = marker_run(dir, step);
        if (own && !mg_ckpt_owner_has(own, run))
            continue;
        if (n < max) {
            out[n++] = (struct mg_ckpt_entry){step, run};
            continue;
        }
        /* Full: the newest max are kept, whatever order readdir gives. */
        int oldest = 0;
        for (int k = 1; k < n; k++)
            if (out[k].step < out[oldest].step)
                oldest = k;
        if (step > out[oldest].step)
            out[oldest] = (struct mg_ckpt_entry){step, run};
    }
    closedir(d);
    qsort(out, (size_t)n, sizeof(*out), cmp_entry_desc);
    return n;
}

int mg_ckpt_list(const char *dir, uint64_t *steps, int max)
{
    struct mg_ckpt_entry *e = calloc(max > 0 ? (size_t)max : 1, sizeof(*e));
    if (!e)
        return -ENOMEM;
    int n = mg_ckpt_list_runs(dir, NULL, e, max);
    for (int i = 0; i < n; i++)
        steps[i] = e[i].step;
    free(e);
    return n;
}

int mg_ckpt_prune(const char *dir, int keep, const struct mg_ckpt_owner *own)
{
    struct mg_ckpt_entry *list = calloc(MG_CKPT_MAX_LIST, sizeof(*list));
    char path[MG_CKPT_PATH_MAX];
    int rc = 0;
    if (!list)
        return -ENOMEM;
    int n = mg_ckpt_list_runs(dir, own, list, MG_CKPT_MAX_LIST);
    if (n < 0) {
        free(list);
        return n;
    }
    for (int i = keep > 0 ? keep : n; i < n; i++) {
        mg_ckpt_marker_path(dir, list[i].step, path, sizeof(path));
        if (unlink(path) < 0 && errno != ENOENT)
            rc = -errno;
        mg_ckpt_path(dir, list[i].step, path, sizeof(path));
        if (unlink(path) < 0 && errno != ENOENT)
            rc = -errno;
    }
    if (keep > 0 && n > 0) {
        /* leftovers of interrupted writes */
        DIR *d = opendir(dir);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            uint64_t step;
            int stale_file = parse_name(e->d_name, ".mgc", &step) && step < list[0].step;
            int tmp = strncmp(e->d_name, "ckpt-", 5) == 0 && strstr(e->d_name, ".tmp.");
            if (!stale_file && !tmp)
                continue;
            if (stale_file) {
                char marker[MG_CKPT_PATH_MAX];
                struct stat st;
                mg_ckpt_marker_path(dir, step, marker, sizeof(marker));
                if (stat(marker, &st) == 0)
                    continue;
            }
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            unlink(path);
        }
        if (d)
            closedir(d);
    }
    free(list);
    return rc;
}

/* ---- the owner record ---------------------------------------------------------- */

#define OWNER_HEADER "mg checkpoint directory owner, format 1\n"
#define OWNER_MAX    8192

int mg_ckpt_owner_has(const struct mg_ckpt_owner *o, uint64_t run)
{
    if (o->run == run)
        return 1;
    for (int i = 0; i < o->nadopted; i++)
        if (o->adopted[i] == run)
            return 1;
    return 0;
}

void mg_ckpt_owner_adopt(struct mg_ckpt_owner *o, uint64_t run)
{
    if (mg_ckpt_owner_has(o, run))
        return;
    if (o->nadopted == MG_CKPT_MAX_ADOPTED) {
        memmove(o->adopted, o->adopted + 1, (MG_CKPT_MAX_ADOPTED - 1) * sizeof(o->adopted[0]));
        o->nadopted--;
    }
    o->adopted[o->nadopted++] = run;
}

static int parse_hex16(const char *p, uint64_t *out)
{
    for (int i = 0; i < 16; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
            return -1;
    *out = strtoull(p, NULL, 16);
    return 0;
}

static int parse_owner(char *text, struct mg_ckpt_owner *o)
{
    memset(o, 0, sizeof(*o));
    if (strncmp(text, OWNER_HEADER, strlen(OWNER_HEADER)) != 0)
        return -1;
    int have_run = 0;
    char *save = NULL;
    for (char *line = strtok_r(text + strlen(OWNER_HEADER), "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        uint64_t h;
        if (strncmp(line, "run ", 4) == 0 && !have_run) {
            if (parse_hex16(line + 4, &h) < 0 || (line[20] != ' ' && line[20] != '\0'))
                return -1;
            o->run = h;
            snprintf(o->run_id, sizeof(o->run_id), "%s", line[20] ? line + 21 : "");
            have_run = 1;
        } else if (strncmp(line, "adopted ", 8) == 0) {
            if (parse_hex16(line + 8, &h) < 0 || line[24] != '\0' ||
                o->nadopted == MG_CKPT_MAX_ADOPTED)
                return -1;
            o->adopted[o->nadopted++] = h;
        } else {
            return -1;
        }
    }
    return have_run ? 0 : -1;
}

int mg_ckpt_owner_read(const char *dir, struct mg_ckpt_owner *o, char *err)
{
    char path[MG_CKPT_PATH_MAX];
    snprintf(path, sizeof(path), "%s/" MG_CKPT_OWNER_FILE, dir);
    memset(o, 0, sizeof(*o));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int rc = -errno;
        if (rc == -ENOENT || rc == -ENOTDIR)
            return 0;
        return mg_seterr(err, MG_ERRMSG_LEN, rc, "cannot open '%s': %s", path, mg_strerror(rc));
    }
    char *text = malloc(OWNER_MAX + 1);
    size_t got = 0;
    int rc = text ? read_all(fd, text, OWNER_MAX + 1, &got) : -ENOMEM;
    close(fd);
    if (rc < 0) {
        free(text);
        return mg_seterr(err, MG_ERRMSG_LEN, rc, "cannot read '%s': %s", path, mg_strerror(rc));
    }
    text[got > OWNER_MAX ? OWNER_MAX : got] = '\0';
    rc = got > OWNER_MAX || strlen(text) != got ? -1 : parse_owner(text, o);
    free(text);
    if (rc < 0)
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT,
                         "'%s' is not a checkpoint directory's owner record", path);
    return 1;
}

int mg_ckpt_owner_write(const char *dir, const struct mg_ckpt_owner *o, char *err)
{
    char path[MG_CKPT_PATH_MAX], text[OWNER_MAX], id[MG_CKPT_RUN_ID_MAX + 1];
    int rc = mg_mkdir_p(dir, 0755);
    if (rc < 0)
        return mg_seterr(err, MG_ERRMSG_LEN, rc, "cannot create checkpoint directory '%s': %s", dir,
                         mg_strerror(rc));
    /* the id is for people: one line of it */
    snprintf(id, sizeof(id), "%s", o->run_id);
    for (char *c = id; *c; c++)
        if (*c == '\n' || *c == '\r')
            *c = '?';
    size_t len = (size_t)snprintf(text, sizeof(text), OWNER_HEADER "run %016" PRIx64 "%s%s\n",
                                  o->run, *id ? " " : "", id);
    for (int i = 0; i < o->nadopted && i < MG_CKPT_MAX_ADOPTED; i++)
        len += (size_t)snprintf(text + len, sizeof(text) - len, "adopted %016" PRIx64 "\n",
                                o->adopted[i]);
    snprintf(path, sizeof(path), "%s/" MG_CKPT_OWNER_FILE, dir);
    return write_small(dir, path, text, len, err);
}
