/* Reader for the golden reference files written by tests/golden/gen.py (the
 * format is described there), and comparison helpers that report the largest
 * difference. Header-only: each test program that needs it includes it. */
#ifndef MG_TEST_GOLD_H
#define MG_TEST_GOLD_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GOLD_MAX_RECORDS 512

struct gold_rec {
    char name[128];
    int dtype; /* 0 float32, 1 int32 */
    int ndim;
    int dims[8];
    size_t numel; /* of the full tensor */
    uint32_t stride, count;
    void *data; /* count values: elements 0, stride, 2*stride, ... */
};

struct gold {
    int n;
    struct gold_rec recs[GOLD_MAX_RECORDS];
};

static inline const char *gold_dir(void)
{
    const char *d = getenv("MG_GOLDEN_DIR");
    return d ? d : "tests/golden";
}

static inline int gold_read_u32(FILE *f, uint32_t *v)
{
    return fread(v, 4, 1, f) == 1 ? 0 : -1;
}

/* Returns 0, or -1 when the file is missing or malformed. */
static inline int gold_load(const char *name, struct gold *g)
{
    char path[1024], magic[8];
    snprintf(path, sizeof(path), "%s/%s", gold_dir(), name);
    FILE *f = fopen(path, "rb");
    memset(g, 0, sizeof(*g));
    if (!f)
        return -1;
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "MGGOLD1\n", 8) != 0)
        goto bad;
    for (;;) {
        uint32_t len, dtype, ndim;
        if (gold_read_u32(f, &len) < 0)
            break; /* EOF */
        if (g->n == GOLD_MAX_RECORDS || len >= sizeof(g->recs[0].name))
            goto bad;
        struct gold_rec *r = &g->recs[g->n];
        if (fread(r->name, 1, len, f) != len || gold_read_u32(f, &dtype) < 0 ||
            gold_read_u32(f, &ndim) < 0 || ndim > 8)
            goto bad;
        r->name[len] = 0;
        r->dtype = (int)dtype;
        r->ndim = (int)ndim;
        r->numel = 1;
        for (uint32_t i = 0; i < ndim; i++) {
            uint32_t d;
            if (gold_read_u32(f, &d) < 0)
                goto bad;
            r->dims[i] = (int)d;
            r->numel *= d;
        }
        if (gold_read_u32(f, &r->stride) < 0 || gold_read_u32(f, &r->count) < 0 ||
            r->count > (1u << 24))
            goto bad;
        r->data = malloc((size_t)r->count * 4 + 1);
        if (!r->data || fread(r->data, 4, r->count, f) != r->count)
            goto bad;
        g->n++;
    }
    fclose(f);
    return 0;
bad:
    fclose(f);
    return -1;
}

static inline void gold_free(struct gold *g)
{
    for (int i = 0; i < g->n; i++)
        free(g->recs[i].data);
    g->n = 0;
}

static inline const struct gold_rec *gold_get(const struct gold *g, const char *name)
{
    for (int i = 0; i < g->n; i++)
        if (!strcmp(g->recs[i].name, name))
            return &g->recs[i];
    return NULL;
}

/* Compares the full tensor `got` (n floats) with the record's samples.
 * Returns the largest |got - want|; *bad counts elements beyond atol + rtol*|want|. */
static inline double gold_cmp(const struct gold_rec *r, const float *got, size_t n, double atol,
                              double rtol, int *bad)
{
    const float *want = r->data;
    double worst = 0.0;
    *bad = 0;
    if (r->dtype != 0 || n != r->numel) {
        *bad = -1;
        return INFINITY;
    }
    for (uint32_t i = 0; i < r->count; i++) {
        double w = want[i], v = got[(size_t)i * r->stride];
        double d = fabs(v - w);
        if (!(d <= atol + rtol * fabs(w)))
            (*bad)++;
        if (d > worst || d != d)
            worst = d != d ? INFINITY : d;
    }
    return worst;
}

#endif
