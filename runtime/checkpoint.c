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

int mg_ckpt_mark_complete(const char *dir, uint64_t step, char *err)
{
    char path[MG_CKPT_PATH_MAX], tmp[MG_CKPT_PATH_MAX + 32], text[64];
    int fd, rc;
    mg_ckpt_marker_path(dir, step, path, sizeof(path));
    rc = open_tmp(path, tmp, sizeof(tmp), &fd);
    if (rc < 0)
        return mg_seterr(err, MG_ERRMSG_LEN, rc, "cannot create '%s': %s", tmp, mg_strerror(rc));
    int len = snprintf(text, sizeof(text), "mg checkpoint complete: step %" PRIu64 "\n", step);
    rc = mg_write_full(fd, text, (size_t)len, -1);
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

static int parse_sections(struct mg_ckpt_file *f, const char *path, char *err)
{
    size_t off = 0, cap = 16;
    f->sections = calloc(cap, sizeof(*f->sections));
    if (!f->sections)
        return -ENOMEM;
    for (;;) {
        if (f->info.raw_bytes - off < SECTION_HDR)
            return mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT, "'%s': section table ends early",
                             path);
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
    unsigned char hdr[MG_CKPT_HEADER_SIZE];
    unsigned char *zbuf = NULL;
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
    if (out->info.raw_bytes > MG_CKPT_MAX_RAW || out->info.payload_bytes > MG_CKPT_MAX_RAW) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_ETOOBIG,
                       "'%s': payload of %" PRIu64 " bytes is over the limit", path,
                       out->info.raw_bytes);
        goto close;
    }
    uint64_t want_size = MG_CKPT_HEADER_SIZE + out->info.payload_bytes;
    if ((uint64_t)st.st_size != want_size) {
        rc = mg_seterr(
            err, MG_ERRMSG_LEN, (uint64_t)st.st_size < want_size ? -MG_ETRUNC : -MG_EFORMAT,
            "'%s': %s: %lld bytes, the header says %" PRIu64, path,
            (uint64_t)st.st_size < want_size ? "truncated" : "longer than its header says",
            (long long)st.st_size, want_size);
        goto close;
    }
    zbuf = malloc(out->info.payload_bytes + 1);
    out->raw = malloc(out->info.raw_bytes + 1);
    if (!zbuf || !out->raw) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -ENOMEM, "'%s': out of memory", path);
        goto free_bufs;
    }
    rc = read_all(fd, zbuf, out->info.payload_bytes, &got);
    if (rc == 0 && got != out->info.payload_bytes)
        rc = -MG_ETRUNC;
    if (rc < 0) {
        mg_seterr(err, MG_ERRMSG_LEN, rc, "'%s': cannot read the payload: %s", path,
                  mg_strerror(rc));
        goto free_bufs;
    }
    uint32_t crc = 0;
    for (uint64_t off = 0; off < out->info.payload_bytes; off += 1u << 30) {
        uint64_t n = out->info.payload_bytes - off;
        crc = (uint32_t)crc32(crc, zbuf + off, (uInt)(n > (1u << 30) ? (1u << 30) : n));
    }
    if (crc != want_crc) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_ECRC,
                       "'%s': payload checksum mismatch (corrupt data)", path);
        goto free_bufs;
    }
    z_stream zs = {0};
    if (inflateInit(&zs) != Z_OK) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -ENOMEM, "'%s': out of memory", path);
        goto free_bufs;
    }
    uint64_t in_off = 0, out_off = 0;
    int zr = Z_OK;
    while (zr == Z_OK) {
        uint64_t in_left = out->info.payload_bytes - in_off;
        uint64_t out_left = out->info.raw_bytes + 1 - out_off;
        zs.next_in = zbuf + in_off;
        zs.avail_in = (uInt)(in_left > (1u << 30) ? (1u << 30) : in_left);
        zs.next_out = out->raw + out_off;
        zs.avail_out = (uInt)(out_left > (1u << 30) ? (1u << 30) : out_left);
        uInt ai = zs.avail_in, ao = zs.avail_out;
        zr = inflate(&zs, Z_NO_FLUSH);
        in_off += ai - zs.avail_in;
        out_off += ao - zs.avail_out;
        if (zr == Z_OK && ai == zs.avail_in && ao == zs.avail_out)
            zr = Z_BUF_ERROR;
    }
    inflateEnd(&zs);
    if (zr != Z_STREAM_END || out_off != out->info.raw_bytes || in_off != out->info.payload_bytes) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT,
                       "'%s': bad compressed payload (%" PRIu64 " of %" PRIu64 " bytes inflated)",
                       path, out_off, out->info.raw_bytes);
        goto free_bufs;
    }
    free(zbuf);
    zbuf = NULL;
    rc = parse_sections(out, path, err);
    if (rc < 0)
        goto free_bufs;
    close(fd);
    return 0;

free_bufs:
    free(zbuf);
    mg_ckpt_file_release(out);
close:
    close(fd);
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

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int mg_ckpt_list(const char *dir, uint64_t *steps, int max)
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
        if (n < max) {
            steps[n++] = step;
            continue;
        }
        /* Full: the newest max are kept, whatever order readdir gives. */
        int oldest = 0;
        for (int k = 1; k < n; k++)
            if (steps[k] < steps[oldest])
                oldest = k;
        if (step > steps[oldest])
            steps[oldest] = step;
    }
    closedir(d);
    qsort(steps, (size_t)n, sizeof(*steps), cmp_desc);
    return n;
}

int mg_ckpt_prune(const char *dir, int keep)
{
    uint64_t *steps = calloc(MG_CKPT_MAX_LIST, sizeof(*steps));
    char path[MG_CKPT_PATH_MAX];
    int rc = 0;
    if (!steps)
        return -ENOMEM;
    int n = mg_ckpt_list(dir, steps, MG_CKPT_MAX_LIST);
    if (n < 0) {
        free(steps);
        return n;
    }
    for (int i = keep > 0 ? keep : n; i < n; i++) {
        mg_ckpt_marker_path(dir, steps[i], path, sizeof(path));
        if (unlink(path) < 0 && errno != ENOENT)
            rc = -errno;
        mg_ckpt_path(dir, steps[i], path, sizeof(path));
        if (unlink(path) < 0 && errno != ENOENT)
            rc = -errno;
    }
    if (keep > 0 && n > 0) {
        /* leftovers of interrupted writes */
        DIR *d = opendir(dir);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            uint64_t step;
            int stale_file = parse_name(e->d_name, ".mgc", &step) && step < steps[0];
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
    free(steps);
    return rc;
}
