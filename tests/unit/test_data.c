/* Data: the IDX reader on good and broken files (plain and gzip), dataset
 * loading from a directory, Fashion-MNIST normalization against torchvision,
 * the synthetic set, and the sampler against torch's DistributedSampler.
 * timeout: 60 */
#include "data.h"
#include "gold.h"
#include "mg_err.h"
#include "sampler.h"
#include "tap.h"

#include <errno.h>
#include <unistd.h>
#include <zlib.h>

static char dir[256];

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* Writes an IDX file: magic bytes, dims, then `len` data bytes (pattern i*7). */
static void write_idx(const char *name, unsigned char type, int ndim, const uint32_t *dims,
                      size_t len, int gz, char *path)
{
    unsigned char hdr[16] = {0, 0, type, (unsigned char)ndim};
    unsigned char *data = malloc(len + 1);
    for (size_t i = 0; i < len; i++)
        data[i] = (unsigned char)(i * 7 % 10);
    for (int i = 0; i < ndim; i++)
        put_be32(hdr + 4 + 4 * i, dims[i]);
    snprintf(path, 512, "%s/%s", dir, name);
    if (gz) {
        gzFile f = gzopen(path, "wb");
        gzwrite(f, hdr, 4 + 4 * ndim);
        if (len)
            gzwrite(f, data, (unsigned)len);
        gzclose(f);
    } else {
        FILE *f = fopen(path, "wb");
        fwrite(hdr, 1, 4 + 4 * ndim, f);
        fwrite(data, 1, len, f);
        fclose(f);
    }
    free(data);
}

static void write_raw(const char *name, const void *bytes, size_t len, char *path)
{
    snprintf(path, 512, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    fwrite(bytes, 1, len, f);
    fclose(f);
}

static void truncate_file(const char *path, long keep)
{
    if (truncate(path, keep) != 0)
        BAIL_OUT("truncate %s", path);
}

static void test_idx(void)
{
    char path[512], err[MG_ERRMSG_LEN];
    struct mg_idx idx;
    uint32_t d3[3] = {5, 4, 3}, d1[1] = {60};

    write_idx("good", 0x08, 3, d3, 60, 0, path);
    is_int(mg_idx_read(path, 3, &idx, err), 0, "plain IDX reads");
    ok(idx.dims[0] == 5 && idx.dims[1] == 4 && idx.dims[2] == 3 && idx.size == 60, "dims");
    ok(idx.data[59] == (59 * 7 % 10), "data");
    mg_idx_release(&idx);
    write_idx("good.gz", 0x08, 3, d3, 60, 1, path);
    is_int(mg_idx_read(path, 3, &idx, err), 0, "gzip IDX reads");
    ok(idx.data[10] == 0 && idx.data[11] == 7, "gzip data");
    mg_idx_release(&idx);

    write_raw("magic", "ABCDEFGHIJKLMNOP", 16, path);
    is_int(mg_idx_read(path, 3, &idx, err), -MG_EFORMAT, "bad magic");
    ok(strstr(err, path) && strstr(err, "bad magic"), "message names file and problem: %s", err);
    write_idx("type", 0x0D, 3, d3, 240, 0, path);
    is_int(mg_idx_read(path, 3, &idx, err), -MG_EFORMAT, "float IDX refused");
    ok(strstr(err, "element type 0x0d"), "message: %s", err);
    write_idx("ndim", 0x08, 1, d1, 60, 0, path);
    is_int(mg_idx_read(path, 3, &idx, err), -MG_EFORMAT, "wrong dimension count");
    ok(strstr(err, "has 1 dimensions, expected 3"), "message: %s", err);
    uint32_t zero[3] = {5, 0, 3};
    write_idx("zero", 0x08, 3, zero, 0, 0, path);
    is_int(mg_idx_read(path, 3, &idx, err), -MG_EFORMAT, "zero dimension");
    ok(strstr(err, "dimension 1 is 0"), "message: %s", err);
    uint32_t huge[3] = {0x7fffffff, 0x7fffffff, 2};
    write_idx("huge", 0x08, 3, huge, 0, 0, path);
    is_int(mg_idx_read(path, 3, &idx, err), -MG_ETOOBIG, "size over the cap refused");

    write_idx("short", 0x08, 3, d3, 59, 0, path);
    is_int(mg_idx_read(path, 3, &idx, err), -MG_ETRUNC, "truncated data");
    ok(strstr(err, path) && strstr(err, "promises 60 data bytes, the file has 59"), "message: %s",
       err);
    write_idx("short.gz", 0x08, 3, d3, 50, 1, path);
    is_int(mg_idx_read(path, 3, &idx, err), -MG_ETRUNC, "truncated gzip data");
    write_idx("long", 0x08, 3, d3, 61, 0, path);
    is_int(mg_idx_read(path, 3, &idx, err), -MG_EFORMAT, "trailing bytes");
    ok(strstr(err, "longer than its header"), "message: %s", err);
    write_idx("hdr", 0x08, 3, d3, 0, 0, path);
    truncate_file(path, 9);
    is_int(mg_idx_read(path, 3, &idx, err), -MG_ETRUNC, "header cut short");
    ok(strstr(err, "inside the header"), "message: %s", err);
    write_raw("empty", "", 0, path);
    is_int(mg_idx_read(path, 3, &idx, err), -MG_ETRUNC, "empty file");

    /* a gzip stream cut in the middle, and one with damaged deflate data */
    uint32_t big[3] = {50, 28, 28};
    write_idx("cut.gz", 0x08, 3, big, 50 * 784, 1, path);
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    truncate_file(path, size / 2);
    int rc = mg_idx_read(path, 3, &idx, err);
    ok(rc == -MG_ETRUNC || rc == -MG_EFORMAT, "gzip stream cut in half: %s", err);
    write_idx("bad.gz", 0x08, 3, big, 50 * 784, 1, path);
    f = fopen(path, "r+b");
    fseek(f, 30, SEEK_SET);
    fwrite("\xff\xff\xff\xff\xff\xff\xff\xff", 1, 8, f);
    fclose(f);
    rc = mg_idx_read(path, 3, &idx, err);
    ok(rc == -MG_EFORMAT || rc == -MG_ETRUNC, "damaged deflate data: %s", err);
    ok(strstr(err, path) != NULL, "names the file");

    snprintf(path, sizeof(path), "%s/missing", dir);
    is_int(mg_idx_read(path, 3, &idx, err), -ENOENT, "missing file");
    ok(strstr(err, "cannot open"), "message: %s", err);
}

static void test_dataset_dir(void)
{
    char path[512], err[MG_ERRMSG_LEN], sub[300];
    struct mg_dataset ds;
    uint32_t img[3] = {6, 28, 28}, lab[1] = {5};
    snprintf(sub, sizeof(sub), "%s", dir);
    write_idx("t10k-images-idx3-ubyte", 0x08, 3, img, 6 * 784, 0, path);
    write_idx("t10k-labels-idx1-ubyte.gz", 0x08, 1, lab, 5, 1, path);
    is_int(mg_dataset_load(&ds, MG_DATA_MNIST, sub, 0, 0, err), -MG_ESHAPE,
           "label count differs from image count");
    ok(strstr(err, "has 5 labels but") && strstr(err, "has 6 images"), "message: %s", err);
    lab[0] = 6;
    write_idx("t10k-labels-idx1-ubyte.gz", 0x08, 1, lab, 6, 1, path);
    is_int(mg_dataset_load(&ds, MG_DATA_MNIST, sub, 0, 0, err), 0, "plain images, gzip labels");
    is_int(ds.n, 6, "six samples");
    mg_dataset_release(&ds);
    is_int(mg_dataset_load(&ds, MG_DATA_MNIST, sub, 0, 4, err), 0, "limit");
    is_int(ds.n, 4, "limit keeps the first samples");
    mg_dataset_release(&ds);
    /* label 12 is out of range: rewrite labels with a bad value */
    unsigned char bad[8 + 6] = {0, 0, 8, 1, 0, 0, 0, 6, 1, 2, 12, 3, 4, 5};
    write_raw("t10k-labels-idx1-ubyte", bad, sizeof(bad), path);
    is_int(mg_dataset_load(&ds, MG_DATA_MNIST, sub, 0, 0, err), -MG_EFORMAT,
           "label out of range (plain file preferred over .gz)");
    ok(strstr(err, "label 12 of sample 2"), "message: %s", err);
    is_int(mg_dataset_load(&ds, MG_DATA_MNIST, sub, 1, 0, err), -ENOENT, "no train files");
    ok(strstr(err, "train-images-idx3-ubyte"), "message names the missing file: %s", err);
}

static void test_fashion(const struct gold *g)
{
    char err[MG_ERRMSG_LEN];
    struct mg_dataset ds;
    if (access(mg_data_default_dir(MG_DATA_FASHION_MNIST), R_OK) != 0) {
        ok(1, "# SKIP dataset-fashion-mnist is not installed");
        return;
    }
    int rc = mg_dataset_load(&ds, MG_DATA_FASHION_MNIST, NULL, 0, 0, err);
    is_int(rc, 0, "Fashion-MNIST test split loads from the default directory");
    if (rc < 0) {
        diag("%s", err);
        return;
    }
    ok(ds.n == 10000 && ds.h == 28 && ds.w == 28 && ds.classes == 10, "10000 images of 28x28");
    float x[3 * 784];
    int32_t y[3], idx[3] = {0, 1, 2};
    mg_dataset_gather(&ds, idx, 3, x, y);
    const struct gold_rec *gx = gold_get(g, "fashion.t10k.x"), *gy = gold_get(g, "fashion.t10k.y");
    ok(gx && gy, "golden records present");
    if (gx && gy) {
        ok(!memcmp(x, gx->data, sizeof(x)), "normalized pixels equal torchvision's, bit for bit");
        ok(!memcmp(y, gy->data, sizeof(y)), "labels");
    }
    mg_dataset_release(&ds);
}

static void test_synthetic(void)
{
    char err[MG_ERRMSG_LEN];
    struct mg_dataset a, b;
    is_int(mg_dataset_load(&a, MG_DATA_SYNTHETIC, NULL, 1, 500, err), 0, "synthetic");
    is_int(mg_dataset_load(&b, MG_DATA_SYNTHETIC, NULL, 1, 500, err), 0, "synthetic again");
    ok(a.n == 500 && !memcmp(a.pixels, b.pixels, 500 * 784) && !memcmp(a.labels, b.labels, 500),
       "synthetic data is deterministic");
    int hist[10] = {0}, good = 1;
    for (int i = 0; i < a.n; i++)
        if (a.labels[i] < 10)
            hist[a.labels[i]]++;
        else
            good = 0;
    for (int k = 0; k < 10; k++)
        good &= hist[k] > 20;
    ok(good, "all ten classes present");
    mg_dataset_release(&a);
    mg_dataset_release(&b);
    is_int(mg_dataset_load(&a, MG_DATA_SYNTHETIC, NULL, 0, 0, err), 0, "synthetic test split");
    is_int(a.n, 1024, "default synthetic test size");
    mg_dataset_release(&a);
}

static void test_sampler(const struct gold *g)
{
    int matched = 0, total = 0;
    for (int r = 0; r < g->n; r++) {
        int n, world, rank, epoch, drop;
        if (sscanf(g->recs[r].name, "n%d.w%d.r%d.e%d.d%d", &n, &world, &rank, &epoch, &drop) != 5)
            continue;
        struct mg_sampler s;
        total++;
        if (mg_sampler_init(&s, n, rank, world, 1, drop ? MG_SAMPLER_DROP_LAST : MG_SAMPLER_PAD,
                            42) < 0)
            continue;
        mg_sampler_set_epoch(&s, epoch);
        if ((uint32_t)s.num_samples == g->recs[r].count &&
            !memcmp(s.indices, g->recs[r].data, (size_t)s.num_samples * 4))
            matched++;
        else
            diag("differs: %s", g->recs[r].name);
        mg_sampler_release(&s);
    }
    ok(total > 0 && matched == total,
       "%d of %d DistributedSampler shards (padding, drop_last, epochs) match PyTorch", matched,
       total);

    /* evaluation shards: every sample exactly once */
    int seen[103] = {0}, good = 1;
    for (int rank = 0; rank < 4; rank++) {
        struct mg_sampler s;
        mg_sampler_init(&s, 103, rank, 4, 0, MG_SAMPLER_UNEVEN, 0);
        mg_sampler_set_epoch(&s, 0);
        good &= s.num_samples == (rank < 3 ? 26 : 25);
        for (int i = 0; i < s.num_samples; i++)
            seen[s.indices[i]]++;
        mg_sampler_release(&s);
    }
    for (int i = 0; i < 103; i++)
        good &= seen[i] == 1;
    ok(good, "uneven shards cover every sample exactly once");
    struct mg_sampler s;
    is_int(mg_sampler_init(&s, 3, 0, 4, 1, MG_SAMPLER_DROP_LAST, 0), -EINVAL,
           "drop_last with fewer samples than ranks is refused");
    is_int(mg_sampler_init(&s, 3, 4, 4, 1, MG_SAMPLER_PAD, 0), -EINVAL, "rank >= world refused");
}

/* rank's indices of a pass over an n-sample epoch from position start */
static int pass_is(int n, int world, int rank, enum mg_sampler_mode mode, long start, int shuffle,
                   const int32_t *want, int nwant)
{
    struct mg_sampler s;
    if (mg_sampler_init(&s, n, rank, world, shuffle, mode, 42) < 0)
        return 0;
    mg_sampler_set_pass(&s, 3, start);
    int good = s.pass_samples == nwant &&
               (nwant == 0 || !memcmp(s.indices, want, sizeof(int32_t) * (size_t)nwant));
    if (!good) {
        char got[256] = "";
        for (int i = 0; i < s.pass_samples && strlen(got) < 200; i++)
            snprintf(got + strlen(got), sizeof(got) - strlen(got), " %d", s.indices[i]);
        diag("n %d world %d rank %d from %ld: got%s", n, world, rank, start, got);
    }
    mg_sampler_release(&s);
    return good;
}

/* Passes that begin mid-epoch (a resumed run with another world size). Without
 * shuffling, position k is sample k mod n, so the sets can be written down. */
static void test_sampler_pass(void)
{
    /* n 11: 3 ranks took 2 samples each (positions 0..5); 2 ranks share the rest */
    ok(pass_is(11, 2, 0, MG_SAMPLER_PAD, 6, 0, (int32_t[]){6, 8, 10}, 3) &&
           pass_is(11, 2, 1, MG_SAMPLER_PAD, 6, 0, (int32_t[]){7, 9, 0}, 3),
       "padding: from 6 of 11 over 2 ranks: {6, 8, 10} and {7, 9, 0} (0 repeats as padding)");
    ok(pass_is(11, 2, 0, MG_SAMPLER_DROP_LAST, 6, 0, (int32_t[]){6, 8}, 2) &&
           pass_is(11, 2, 1, MG_SAMPLER_DROP_LAST, 6, 0, (int32_t[]){7, 9}, 2),
       "drop_last: {6, 8} and {7, 9}; 10 is dropped");
    ok(pass_is(11, 2, 0, MG_SAMPLER_UNEVEN, 6, 0, (int32_t[]){6, 8, 10}, 3) &&
           pass_is(11, 2, 1, MG_SAMPLER_UNEVEN, 6, 0, (int32_t[]){7, 9}, 2),
       "uneven: {6, 8, 10} and {7, 9}");
    ok(pass_is(11, 3, 2, MG_SAMPLER_PAD, 9, 0, (int32_t[]){0}, 1) &&
           pass_is(11, 3, 0, MG_SAMPLER_PAD, 9, 0, (int32_t[]){9}, 1),
       "2 left for 3 ranks: 9, 10 and one repeat of 0");
    ok(pass_is(11, 3, 0, MG_SAMPLER_DROP_LAST, 9, 0, NULL, 0), "the same with drop_last: nothing");
    is_int((int)mg_sampler_pass_len(11, 0, 2, MG_SAMPLER_PAD, 11), 0, "no pass from the end");

    /* any n, world and start: the positions from start are covered as a pass from 0 would be */
    int good = 1;
    for (int n = 1; n <= 23; n++)
        for (int world = 1; world <= 5 && world <= n; world++)
            for (long start = 0; start < n; start++)
                for (int mode = 0; mode < 3; mode++) {
                    int count[23] = {0}, total = 0;
                    for (int rank = 0; rank < world; rank++) {
                        struct mg_sampler s;
                        if (mg_sampler_init(&s, n, rank, world, 1, (enum mg_sampler_mode)mode, 7) <
                            0) {
                            good &= mode == MG_SAMPLER_DROP_LAST && n < world;
                            continue;
                        }
                        mg_sampler_set_pass(&s, 1, start);
                        good &= s.pass_samples <= s.num_samples;
                        for (int i = 0; i < s.pass_samples; i++)
                            count[s.indices[i]]++;
                        total += s.pass_samples;
                        mg_sampler_release(&s);
                    }
                    /* which samples the positions [0, start) were: the permutation for seed + 1 */
                    struct mg_sampler all;
                    mg_sampler_init(&all, n, 0, 1, 1, MG_SAMPLER_PAD, 7);
                    mg_sampler_set_epoch(&all, 1);
                    for (long k = 0; k < start; k++)
                        count[all.indices[k]]++;
                    mg_sampler_release(&all);
                    long left = n - start;
                    for (int i = 0; i < n; i++) {
                        if (mode == MG_SAMPLER_PAD)
                            good &= count[i] >= 1 && count[i] <= 2;
                        else
                            good &= count[i] <= 1;
                    }
                    if (mode == MG_SAMPLER_PAD)
                        good &= total == (left + world - 1) / world * world;
                    else if (mode == MG_SAMPLER_DROP_LAST)
                        good &= total == left / world * world;
                    else
                        good &= total == left;
                }
    ok(good, "any pass from any position: padding covers the rest (< world repeats), drop_last "
             "never repeats, uneven covers it exactly once");

    /* the same world size: a pass from c * world is the epoch's shard from its c-th sample */
    good = 1;
    for (int world = 1; world <= 4; world++)
        for (int rank = 0; rank < world; rank++)
            for (int c = 0; c < 25; c++) {
                struct mg_sampler a, b;
                mg_sampler_init(&a, 97, rank, world, 1, MG_SAMPLER_PAD, 5);
                mg_sampler_init(&b, 97, rank, world, 1, MG_SAMPLER_PAD, 5);
                mg_sampler_set_epoch(&a, 2);
                mg_sampler_set_pass(&b, 2, (long)c * world);
                good &= b.pass_samples == a.num_samples - c &&
                        !memcmp(b.indices, a.indices + c, sizeof(int32_t) * (size_t)b.pass_samples);
                mg_sampler_release(&a);
                mg_sampler_release(&b);
            }
    ok(good, "the same world size: a pass from position c x world = the shard from sample c");
}

int main(void)
{
    struct gold g;
    snprintf(dir, sizeof(dir), "%s/mgdata.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir))
        BAIL_OUT("mkdtemp");
    if (gold_load("data.gold", &g) < 0)
        BAIL_OUT("cannot read %s/data.gold", gold_dir());
    test_idx();
    test_dataset_dir();
    test_fashion(&g);
    test_synthetic();
    test_sampler(&g);
    test_sampler_pass();
    gold_free(&g);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        diag("could not remove %s", dir);
    return done_testing();
}
