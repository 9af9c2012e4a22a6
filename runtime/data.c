/* IDX files, the MNIST-style datasets and the synthetic one (see data.h). */
#include "data.h"
#include "cpu_kernels.h"
#include "mg_err.h"
#include "rng.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <zlib.h>

#define READ_CHUNK (1u << 20)

/* zlib's messages start with the path; ours already name the file. */
static const char *zmessage(gzFile f, const char *path, int *zerr)
{
    const char *m = gzerror(f, zerr);
    size_t n = strlen(path);
    if (m && strncmp(m, path, n) == 0 && m[n] == ':' && m[n + 1] == ' ')
        m += n + 2;
    return m ? m : "";
}

int mg_idx_read(const char *path, int want_ndim, struct mg_idx *out, char *err)
{
    int rc;
    unsigned char hdr[4 + 4 * MG_IDX_MAX_DIMS];
    memset(out, 0, sizeof(*out));
    if (want_ndim < 1 || want_ndim > MG_IDX_MAX_DIMS)
        return mg_seterr(err, MG_ERRMSG_LEN, -EINVAL, "'%s': cannot read %d-dimensional IDX data",
                         path, want_ndim);
    errno = 0;
    gzFile f = gzopen(path, "rb");
    if (!f) {
        rc = errno ? -errno : -ENOMEM;
        return mg_seterr(err, MG_ERRMSG_LEN, rc, "'%s': cannot open: %s", path, mg_strerror(rc));
    }
    int got = gzread(f, hdr, 4);
    if (got < 0)
        goto gz_error;
    if (got < 4) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_ETRUNC,
                       "'%s': truncated: %d bytes, shorter than an IDX header", path, got);
        goto close;
    }
    if (hdr[0] != 0 || hdr[1] != 0) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT,
                       "'%s': bad magic 0x%02x%02x%02x%02x: not an IDX file (want 0x0000 then type "
                       "and dimension count)",
                       path, hdr[0], hdr[1], hdr[2], hdr[3]);
        goto close;
    }
    if (hdr[2] != 0x08) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT,
                       "'%s': element type 0x%02x is not supported (want 0x08, unsigned byte)",
                       path, hdr[2]);
        goto close;
    }
    if (hdr[3] != want_ndim) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT, "'%s': has %d dimensions, expected %d",
                       path, hdr[3], want_ndim);
        goto close;
    }
    got = gzread(f, hdr + 4, (unsigned)(4 * want_ndim));
    if (got < 0)
        goto gz_error;
    if (got < 4 * want_ndim) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_ETRUNC,
                       "'%s': truncated inside the header (%d of %d dimension bytes)", path, got,
                       4 * want_ndim);
        goto close;
    }
    size_t size = 1;
    for (int i = 0; i < want_ndim; i++) {
        const unsigned char *p = hdr + 4 + 4 * i;
        uint32_t d = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
        if (d == 0 || d > (uint32_t)INT32_MAX) {
            rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT, "'%s': dimension %d is %u", path, i, d);
            goto close;
        }
        out->dims[i] = (int)d;
        size *= d;
        if (size > MG_IDX_MAX_BYTES) {
            rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_ETOOBIG, "'%s': data over the %zu-byte limit",
                           path, MG_IDX_MAX_BYTES);
            goto close;
        }
    }
    out->ndim = want_ndim;
    out->size = size;
    /* The buffer grows as the bytes arrive, not to what the header claims:
     * a 16-byte file must not cost 2 GiB (found by tests/fuzz/fuzz_idx.c). */
    size_t have = 0, cap = size < READ_CHUNK ? size : READ_CHUNK;
    out->data = malloc(cap);
    while (out->data && have < size) {
        if (have == cap) {
            size_t ncap = cap > size / 2 ? size : 2 * cap;
            uint8_t *p = realloc(out->data, ncap);
            if (!p) {
                free(out->data);
                out->data = NULL;
                break;
            }
            out->data = p;
            cap = ncap;
        }
        size_t want = cap - have < READ_CHUNK ? cap - have : READ_CHUNK;
        got = gzread(f, out->data + have, (unsigned)want);
        if (got < 0)
            goto gz_error;
        if (got == 0)
            break;
        have += (size_t)got;
    }
    if (!out->data) {
        rc =
            mg_seterr(err, MG_ERRMSG_LEN, -ENOMEM, "'%s': out of memory for %zu bytes", path, size);
        goto close;
    }
    if (have < size) {
        int zerr;
        const char *zmsg = zmessage(f, path, &zerr);
        char why[160] = "";
        if (zerr)
            snprintf(why, sizeof(why), " (%s)", zmsg);
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_ETRUNC,
                       "'%s': truncated: the header promises %zu data bytes, the file has %zu%s",
                       path, size, have, why);
        goto close;
    }
    unsigned char extra;
    got = gzread(f, &extra, 1);
    if (got < 0)
        goto gz_error;
    if (got > 0) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT,
                       "'%s': longer than its header says (more than %zu data bytes)", path, size);
        goto close;
    }
    gzclose(f);
    return 0;

gz_error : {
    int zerr;
    const char *zmsg = zmessage(f, path, &zerr);
    if (zerr == Z_ERRNO)
        rc = mg_seterr(err, MG_ERRMSG_LEN, -errno, "'%s': cannot read: %s", path, strerror(errno));
    else
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT, "'%s': corrupt gzip data: %s", path, zmsg);
}
close:
    gzclose(f);
    mg_idx_release(out);
    return rc;
}

void mg_idx_release(struct mg_idx *idx)
{
    free(idx->data);
    memset(idx, 0, sizeof(*idx));
}

int mg_data_parse(const char *s, enum mg_data_kind *out)
{
    if (!strcmp(s, "fashion-mnist"))
        *out = MG_DATA_FASHION_MNIST;
    else if (!strcmp(s, "mnist"))
        *out = MG_DATA_MNIST;
    else if (!strcmp(s, "synthetic"))
        *out = MG_DATA_SYNTHETIC;
    else
        return -EINVAL;
    return 0;
}

const char *mg_data_name(enum mg_data_kind kind)
{
    switch (kind) {
    case MG_DATA_FASHION_MNIST:
        return "fashion-mnist";
    case MG_DATA_MNIST:
        return "mnist";
    case MG_DATA_SYNTHETIC:
        return "synthetic";
    }
    return "?";
}

const char *mg_data_default_dir(enum mg_data_kind kind)
{
    switch (kind) {
    case MG_DATA_FASHION_MNIST:
        return "/usr/share/datasets/fashion-mnist";
    case MG_DATA_MNIST:
        return "/usr/share/datasets/mnist";
    case MG_DATA_SYNTHETIC:
        break;
    }
    return "";
}

static void set_norm(struct mg_dataset *ds, float mean, float std)
{
    ds->mean = mean;
    ds->std = std;
}

/* "dir/name" when it exists, else "dir/name.gz" when that exists. A name
 * that is there but cannot be reached (a symlink loop, a permission) is
 * reported as what it is, not as missing. */
static int find_file(const char *dir, const char *name, char *path, size_t len, char *err)
{
    struct stat st;
    snprintf(path, len, "%s/%s", dir, name);
    if (stat(path, &st) == 0)
        return 0;
    int rc = -errno;
    if (rc != -ENOENT)
        return mg_seterr(err, MG_ERRMSG_LEN, rc, "'%s': %s", path, mg_strerror(rc));
    snprintf(path, len, "%s/%s.gz", dir, name);
    if (stat(path, &st) == 0)
        return 0;
    rc = -errno;
    if (rc != -ENOENT)
        return mg_seterr(err, MG_ERRMSG_LEN, rc, "'%s': %s", path, mg_strerror(rc));
    return mg_seterr(err, MG_ERRMSG_LEN, rc, "'%s': cannot find %s or %s.gz: %s", dir, name, name,
                     mg_strerror(rc));
}

int mg_idx_pair_read(const char *ipath, const char *lpath, struct mg_idx *img, struct mg_idx *lab,
                     char *err)
{
    int rc = mg_idx_read(ipath, 3, img, err);
    if (rc < 0)
        return rc;
    rc = mg_idx_read(lpath, 1, lab, err);
    if (rc < 0)
        goto release_img;
    if (lab->dims[0] != img->dims[0]) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_ESHAPE, "'%s' has %d labels but '%s' has %d images",
                       lpath, lab->dims[0], ipath, img->dims[0]);
        goto release_lab;
    }
    for (int i = 0; i < lab->dims[0]; i++)
        if (lab->data[i] >= 10) {
            rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT,
                           "'%s': label %d of sample %d is not in 0..9", lpath, lab->data[i], i);
            goto release_lab;
        }
    return 0;
release_lab:
    mg_idx_release(lab);
release_img:
    mg_idx_release(img);
    return rc;
}

static int load_idx_pair(struct mg_dataset *ds, const char *dir, int train, long limit,
                         const char *cache_dir, char *err)
{
    char ipath[4096], lpath[4096];
    struct mg_idx img = {0}, lab = {0};
    const char *split = train ? "train" : "t10k";
    char iname[64], lname[64];
    int rc;
    snprintf(iname, sizeof(iname), "%s-images-idx3-ubyte", split);
    snprintf(lname, sizeof(lname), "%s-labels-idx1-ubyte", split);
    rc = find_file(dir, iname, ipath, sizeof(ipath), err);
    if (rc < 0)
        return rc;
    rc = find_file(dir, lname, lpath, sizeof(lpath), err);
    if (rc < 0)
        return rc;
    if (cache_dir && *cache_dir) {
        rc = mg_data_cache_load(ds, cache_dir, ipath, lpath, err);
    } else {
        rc = mg_idx_pair_read(ipath, lpath, &img, &lab, err);
        if (rc == 0) {
            ds->n = img.dims[0];
            ds->c = 1;
            ds->h = img.dims[1];
            ds->w = img.dims[2];
            ds->classes = 10;
            ds->pixels = img.data;
            ds->labels = lab.data;
        }
    }
    if (rc == 0 && limit > 0 && limit < ds->n)
        ds->n = (int)limit;
    if (rc == 0)
        snprintf(ds->images, sizeof(ds->images), "%s", ipath);
    return rc;
}

/* Fixed prototypes per class (from a fixed data seed, so every training seed
 * sees the same data), samples = 3/8 prototype + 5/8 uniform noise. */
static int make_synthetic(struct mg_dataset *ds, int train, long limit)
{
    const int S = 28 * 28, classes = 10;
    int n = limit > 0 ? (int)(limit > (1L << 24) ? (1L << 24) : limit) : train ? 4096 : 1024;
    uint8_t proto[10][28 * 28];
    struct mg_mt19937 g;
    mg_mt19937_seed(&g, 0x5eed5eedu);
    for (int k = 0; k < classes; k++)
        for (int p = 0; p < S; p++)
            proto[k][p] = (uint8_t)(mg_mt19937_u32(&g) >> 24);
    ds->pixels = malloc((size_t)n * S);
    ds->labels = malloc((size_t)n);
    if (!ds->pixels || !ds->labels)
        return -ENOMEM;
    mg_mt19937_seed(&g, train ? 1 : 2);
    for (int i = 0; i < n; i++) {
        int k = (int)(mg_mt19937_u32(&g) % (uint32_t)classes);
        ds->labels[i] = (uint8_t)k;
        for (int p = 0; p < S; p++) {
            unsigned noise = mg_mt19937_u32(&g) >> 24;
            ds->pixels[(size_t)i * S + p] = (uint8_t)((3u * proto[k][p] + 5u * noise) / 8u);
        }
    }
    ds->n = n;
    ds->c = 1;
    ds->h = ds->w = 28;
    ds->classes = classes;
    return 0;
}

int mg_dataset_load(struct mg_dataset *ds, enum mg_data_kind kind, const char *dir, int train,
                    long limit, char *err)
{
    return mg_dataset_load_cached(ds, kind, dir, train, limit, NULL, err);
}

int mg_dataset_load_cached(struct mg_dataset *ds, enum mg_data_kind kind, const char *dir,
                           int train, long limit, const char *cache_dir, char *err)
{
    int rc;
    memset(ds, 0, sizeof(*ds));
    snprintf(ds->name, sizeof(ds->name), "%s %s", mg_data_name(kind), train ? "train" : "test");
    switch (kind) {
    case MG_DATA_FASHION_MNIST:
    case MG_DATA_MNIST:
        rc = load_idx_pair(ds, dir && *dir ? dir : mg_data_default_dir(kind), train, limit,
                           cache_dir, err);
        if (kind == MG_DATA_FASHION_MNIST)
            set_norm(ds, 0.2860f, 0.3530f);
        else
            set_norm(ds, 0.1307f, 0.3081f);
        break;
    case MG_DATA_SYNTHETIC:
        rc = make_synthetic(ds, train, limit);
        if (rc < 0)
            mg_seterr(err, MG_ERRMSG_LEN, rc, "out of memory for the synthetic dataset");
        set_norm(ds, 0.5f, 0.5f);
        break;
    default:
        return mg_seterr(err, MG_ERRMSG_LEN, -EINVAL, "unknown dataset");
    }
    if (rc < 0)
        mg_dataset_release(ds);
    return rc;
}

void mg_dataset_release(struct mg_dataset *ds)
{
    if (ds->map) {
        munmap(ds->map, ds->map_len);
    } else {
        free(ds->pixels);
        free(ds->labels);
    }
    ds->map = NULL;
    ds->map_len = 0;
    ds->pixels = ds->labels = NULL;
    ds->n = 0;
}

void mg_dataset_gather(const struct mg_dataset *ds, const int32_t *idx, int n, float *x, int32_t *y)
{
    size_t S = mg_dataset_sample_size(ds);
    for (int i = 0; i < n; i++) {
        /* samples are scattered over the set: fetch a few ahead */
        if (i + 4 < n) {
            const uint8_t *next = ds->pixels + (size_t)idx[i + 4] * S;
            for (size_t off = 0; off < S; off += 64)
                __builtin_prefetch(next + off);
        }
        mg_k_normalize_u8(x + (size_t)i * S, ds->pixels + (size_t)idx[i] * S, S, ds->mean, ds->std);
        y[i] = ds->labels[idx[i]];
    }
}
