/* Datasets held in memory as bytes, normalized when a batch is gathered.
 *
 * - IDX files (MNIST's format), plain or gzip-compressed (read through zlib,
 *   which also reads plain files). The reader checks the magic number, the
 *   element type (unsigned byte), the number of dimensions, every dimension
 *   and that the data length matches the header exactly; errors name the file
 *   and what is wrong.
 * - fashion-mnist and mnist: the four standard files in a directory
 *   ({train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]); Debian's package
 *   dataset-fashion-mnist installs them in /usr/share/datasets/fashion-mnist.
 * - synthetic: 10 classes of 28x28 images made from fixed class prototypes
 *   plus noise, generated from a fixed seed (learnable, instant to create).
 *
 * - a cache of decoded datasets (data_cache.c): the first process of a host
 *   to need an IDX pair decodes it into one file that every later one maps
 *   read-only (shared in the page cache), after checking it against the
 *   source files and its own hash; a stale or corrupt file is rebuilt,
 *   never used (docs/train.md, "Dataset cache").
 *
 * Normalization is torchvision's ToTensor + Normalize:
 * (x / 255 - mean) / std, with fashion-mnist (0.2860, 0.3530),
 * mnist (0.1307, 0.3081), synthetic (0.5, 0.5).
 *
 * A function with a `char *err` argument writes what went wrong there: a
 * buffer of MG_ERRMSG_LEN bytes (mg_err.h). */
#ifndef MG_DATA_H
#define MG_DATA_H

#include "mg_err.h"

#include <stddef.h>
#include <stdint.h>

#define MG_IDX_MAX_DIMS     3
#define MG_IDX_MAX_BYTES    ((size_t)1 << 31) /* a bigger IDX file is refused */
#define MG_DATASET_NAME_MAX 64
#define MG_DATASET_PATH_MAX 4096

enum mg_data_kind {
    MG_DATA_FASHION_MNIST = 1,
    MG_DATA_MNIST = 2,
    MG_DATA_SYNTHETIC = 3,
};

struct mg_idx {
    int ndim;
    int dims[MG_IDX_MAX_DIMS];
    size_t size; /* bytes of data = product of dims */
    uint8_t *data;
};

/* Reads an IDX file of unsigned bytes with want_ndim dimensions. Errors:
 * -errno (cannot open), -MG_EFORMAT (bad magic, type, dims), -MG_ETRUNC
 * (shorter than the header says), -MG_ETOOBIG; err gets "'path': problem". */
int mg_idx_read(const char *path, int want_ndim, struct mg_idx *out, char *err);
void mg_idx_release(struct mg_idx *idx);

/* What the dataset cache did for one load. */
enum mg_data_cache_status {
    MG_DATA_CACHE_OFF,      /* no cache asked for, or nothing to cache (synthetic) */
    MG_DATA_CACHE_HIT,      /* a valid cache file is mapped */
    MG_DATA_CACHE_BUILT,    /* there was none: decoded, written, mapped */
    MG_DATA_CACHE_REBUILT,  /* it was stale or corrupt (cache_note says how): rewritten */
    MG_DATA_CACHE_BYPASSED, /* it could not be used (cache_note says why): decoded only */
};

#define MG_DATA_CACHE_NOTE_MAX 320

struct mg_dataset {
    char name[MG_DATASET_NAME_MAX];   /* "fashion-mnist train" */
    char images[MG_DATASET_PATH_MAX]; /* the images file, for messages ("" for synthetic) */
    int n;                            /* samples */
    int c, h, w;                      /* one sample */
    int classes;
    uint8_t *pixels; /* n * c*h*w */
    uint8_t *labels; /* n, each < classes */
    float mean, std; /* normalization */
    void *map;       /* the cache file's mapping, when pixels and labels point into it */
    size_t map_len;
    int cache; /* enum mg_data_cache_status */
    char cache_note[MG_DATA_CACHE_NOTE_MAX];
};

int mg_data_parse(const char *s, enum mg_data_kind *out);
const char *mg_data_name(enum mg_data_kind kind);
/* Where the files are by default ("" for synthetic). */
const char *mg_data_default_dir(enum mg_data_kind kind);

/* Loads the train (train != 0) or test split from dir; limit > 0 keeps only the
 * first `limit` samples. For synthetic, dir is ignored and limit is the size
 * (0 = 4096 train / 1024 test). */
int mg_dataset_load(struct mg_dataset *ds, enum mg_data_kind kind, const char *dir, int train,
                    long limit, char *err);
/* The same through the dataset cache in cache_dir (NULL or "": no cache, as
 * mg_dataset_load). A cache that cannot be used is no error: the files are
 * decoded as without one and ds->cache says BYPASSED, with the reason in
 * ds->cache_note. Errors are the files' own, as mg_dataset_load's. */
int mg_dataset_load_cached(struct mg_dataset *ds, enum mg_data_kind kind, const char *dir,
                           int train, long limit, const char *cache_dir, char *err);
void mg_dataset_release(struct mg_dataset *ds);

/* Reads an IDX pair, images (3 dimensions) and labels (1), and checks that
 * they agree (as many labels as images, each label below 10). On failure
 * both are released; err names the file. */
int mg_idx_pair_read(const char *ipath, const char *lpath, struct mg_idx *img, struct mg_idx *lab,
                     char *err);

/* ---- the dataset cache (data_cache.c) ------------------------------------------ */

/* Where the cache lives: MG_DATA_CACHE when set ("off" or "0": no cache,
 * giving ""), else $XDG_CACHE_HOME/mg/data, else $HOME/.cache/mg/data, else
 * ${TMPDIR:-/tmp}/mg-data-<uid>. Writes the directory (or "") into buf;
 * -ENAMETOOLONG when it does not fit. */
int mg_data_cache_dir(char *buf, size_t len);

/* Fills ds's n, c, h, w, classes, pixels, labels from the cache file for the
 * pair (ipath, lpath) in cache_dir, building it first when it is missing,
 * stale (a source file's device, inode, size, modification or change time
 * differs from what the file records, or a source changed while it was
 * built) or corrupt (bad header, length, or hash of the data); concurrent
 * callers wait for one builder, and a killed builder leaves nothing a later
 * one would use. Returns 0 (ds->cache says what happened; BYPASSED when the
 * cache could not be written or read, and the pair was decoded without it) or
 * the files' own error, as mg_idx_pair_read's. */
int mg_data_cache_load(struct mg_dataset *ds, const char *cache_dir, const char *ipath,
                       const char *lpath, char *err);

static inline size_t mg_dataset_sample_size(const struct mg_dataset *ds)
{
    return (size_t)ds->c * ds->h * ds->w;
}

/* x[i] = normalized pixels of sample idx[i], y[i] = its label (host memory). */
void mg_dataset_gather(const struct mg_dataset *ds, const int32_t *idx, int n, float *x,
                       int32_t *y);

#endif
