/* Checkpoints: the container round-trips bit-exactly; a bad magic, version,
 * header or payload CRC, truncation and trailing bytes are each refused with
 * their own error; markers, listing, pruning and fallback to an older
 * checkpoint; a trainer saved and restored continues with the same bits as
 * one that never stopped (SGD and AdamW, dropout, gradient accumulation, an
 * epoch boundary); shape and configuration mismatches are refused.
 * timeout: 120 */
#include "checkpoint.h"
#include "mg_err.h"
#include "models.h"
#include "rtutil.h"
#include "trainer.h"
#include "../tap.h"

#include <zlib.h>

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];
static struct mg_backend *be;
static struct mg_dataset train_ds, test_ds;

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void poke(const char *path, long off, const void *bytes, size_t n)
{
    FILE *f = fopen(path, "r+b");
    fseek(f, off, SEEK_SET);
    fwrite(bytes, 1, n, f);
    fclose(f);
}

static void flip(const char *path, long off)
{
    unsigned char c;
    FILE *f = fopen(path, "r+b");
    fseek(f, off, SEEK_SET);
    if (fread(&c, 1, 1, f) != 1)
        BAIL_OUT("read %s", path);
    c ^= 0x40;
    fseek(f, off, SEEK_SET);
    fwrite(&c, 1, 1, f);
    fclose(f);
}

static void copy_file(const char *from, const char *to)
{
    char cmd[2 * MG_CKPT_PATH_MAX + 64];
    snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", from, to);
    if (system(cmd) != 0)
        BAIL_OUT("cp");
}

static void test_container(void)
{
    char err[MG_ERRMSG_LEN], path[MG_CKPT_PATH_MAX], bad[MG_CKPT_PATH_MAX + 16];
    size_t n = 100000;
    float *blob = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        blob[i] = (float)i * 0.001f - 3.0f;
    const char *text = "hello";
    struct mg_ckpt_section secs[] = {
        {7, 0, n * sizeof(float), blob}, {8, 3, 5, text}, {9, 0, 0, NULL}};
    struct mg_ckpt_info info = {.step = 42, .nparams = n, .world_size = 2};
    is_int(mg_ckpt_write(dir, &info, secs, 3, err), 0, "write a checkpoint");
    mg_ckpt_path(dir, 42, path, sizeof(path));
    ok(file_size(path) > MG_CKPT_HEADER_SIZE, "file %s exists", path);
    struct mg_ckpt_file f;
    is_int(mg_ckpt_read(path, &f, err), 0, "read it back");
    ok(f.info.step == 42 && f.info.nparams == n && f.info.world_size == 2 &&
           f.info.version == MG_CKPT_VERSION,
       "header fields");
    const struct mg_ckpt_section *s = mg_ckpt_find(&f, 7, 0);
    ok(s && s->len == n * sizeof(float) && !memcmp(s->data, blob, s->len),
       "float section round-trips bit-exactly");
    s = mg_ckpt_find(&f, 8, 3);
    ok(s && s->len == 5 && !memcmp(s->data, "hello", 5), "indexed section");
    ok(mg_ckpt_find(&f, 9, 0) && !mg_ckpt_find(&f, 8, 0), "empty section; lookup by index");
    mg_ckpt_file_release(&f);

    uint64_t steps[8];
    is_int(mg_ckpt_list(dir, steps, 8), 0, "not listed before its completion marker");
    is_int(mg_ckpt_mark_complete(dir, 42, err), 0, "mark complete");
    ok(mg_ckpt_list(dir, steps, 8) == 1 && steps[0] == 42, "listed once marked");

    /* corruptions, each on a fresh copy */
    struct {
        const char *what;
        int want;
        const char *msg;
    } cases[] = {
        {"bad magic", -MG_EFORMAT, "bad magic"},
        {"unknown version", -MG_EVERSION, "version 99"},
        {"header CRC", -MG_ECRC, "header checksum"},
        {"payload CRC", -MG_ECRC, "payload checksum"},
        {"truncated", -MG_ETRUNC, "truncated"},
        {"trailing bytes", -MG_EFORMAT, "longer than its header"},
        {"cut inside the header", -MG_ETRUNC, "inside the header"},
    };
    long size = file_size(path);
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        snprintf(bad, sizeof(bad), "%s/bad%zu", dir, c);
        copy_file(path, bad);
        switch (c) {
        case 0:
            poke(bad, 1, "X", 1);
            break;
        case 1: {
            unsigned char h[MG_CKPT_HEADER_SIZE];
            FILE *fp = fopen(bad, "rb");
            if (fread(h, 1, sizeof(h), fp) != sizeof(h))
                BAIL_OUT("read header");
            fclose(fp);
            mg_put_u32(h + 8, 99);
            mg_put_u32(h + 60, (uint32_t)crc32(0, h, 60));
            poke(bad, 0, h, sizeof(h));
            break;
        }
        case 2:
            flip(bad, 33);
            break;
        case 3:
            flip(bad, size / 2);
            break;
        case 4:
            if (truncate(bad, size - 100) != 0)
                BAIL_OUT("truncate");
            break;
        case 5:
            poke(bad, size, "x", 1);
            break;
        case 6:
            if (truncate(bad, 30) != 0)
                BAIL_OUT("truncate");
            break;
        }
        is_int(mg_ckpt_read(bad, &f, err), cases[c].want, "%s is refused", cases[c].what);
        ok(strstr(err, cases[c].msg) && strstr(err, bad), "message: %s", err);
    }
    free(blob);
}

static void test_prune(void)
{
    char err[MG_ERRMSG_LEN], path[MG_CKPT_PATH_MAX];
    char sub[300];
    snprintf(sub, sizeof(sub), "%s/prune/deeper/still", dir);
    struct mg_ckpt_section sec = {1, 0, 4, "abcd"};
    for (uint64_t step = 10; step <= 50; step += 10) {
        struct mg_ckpt_info info = {.step = step};
        mg_ckpt_write(sub, &info, &sec, 1, err);
        if (step != 50)
            mg_ckpt_mark_complete(sub, step, err);
    }
    snprintf(path, sizeof(path), "%s/ckpt-000000000020.mgc.tmp.999", sub);
    FILE *f = fopen(path, "w");
    fclose(f);
    uint64_t steps[8];
    int n = mg_ckpt_list(sub, steps, 8);
    ok(n == 4 && steps[0] == 40 && steps[3] == 10, "complete checkpoints, newest first");
    is_int(mg_ckpt_prune(sub, 2), 0, "prune to 2");
    n = mg_ckpt_list(sub, steps, 8);
    ok(n == 2 && steps[0] == 40 && steps[1] == 30, "the two newest remain");
    mg_ckpt_path(sub, 10, path, sizeof(path));
    ok(access(path, F_OK) != 0, "older files removed");
    mg_ckpt_path(sub, 50, path, sizeof(path));
    ok(access(path, F_OK) == 0, "a newer unmarked file is left alone (it may be in progress)");
    snprintf(path, sizeof(path), "%s/ckpt-000000000020.mgc.tmp.999", sub);
    ok(access(path, F_OK) != 0, "temporary leftovers removed");
    snprintf(path, sizeof(path), "%s/nothing-here", dir);
    is_int(mg_ckpt_list(path, steps, 8), 0, "a missing directory has no checkpoints");
}

/* ---- trainer-level round trips ---------------------------------------------------------- */

struct setup {
    struct mg_model m;
    struct mg_trainer t;
};

static int make(struct setup *s, const char *model, const struct mg_model_options *mo,
                enum mg_optim_kind kind, int accum, uint64_t seed, int world, char *err)
{
    memset(s, 0, sizeof(*s));
    int rc = mg_model_create(&s->m, be, model, mo, 16, err);
    if (rc < 0)
        return rc;
    mg_model_init_params(&s->m, seed);
    struct mg_train_config cfg = {
        .batch_size = 16, .accum_steps = accum, .total_steps = 100, .seed = seed, .world = world};
    mg_optim_defaults(&cfg.optim, kind);
    if (kind == MG_OPTIM_SGD)
        cfg.optim.momentum = 0.9, cfg.optim.nesterov = 1, cfg.optim.weight_decay = 1e-4;
    cfg.sched = (struct mg_schedule){.kind = MG_SCHED_COSINE,
                                     .base_lr = kind == MG_OPTIM_SGD ? 0.05 : 1e-3,
                                     .warmup = 3,
                                     .total = 100};
    return mg_trainer_init(&s->t, &s->m, &train_ds, &test_ds, &cfg, NULL, err);
}

static void drop(struct setup *s)
{
    mg_trainer_release(&s->t);
    mg_model_release(&s->m);
}

static void steps(struct setup *s, int k)
{
    struct mg_step_stats st;
    for (int i = 0; i < k; i++)
        if (mg_trainer_step(&s->t, &st) < 0)
            BAIL_OUT("step failed");
}

static void resume_case(const char *what, const char *model, const struct mg_model_options *mo,
                        enum mg_optim_kind kind, int accum, int K)
{
    char err[MG_ERRMSG_LEN], sub[300], path[MG_CKPT_PATH_MAX];
    struct setup a, b, c;
    snprintf(sub, sizeof(sub), "%s/%s", dir, what);
    if (make(&a, model, mo, kind, accum, 5, 1, err) < 0 ||
        make(&b, model, mo, kind, accum, 5, 1, err) < 0)
        BAIL_OUT("%s", err);
    steps(&a, K);
    is_int(mg_trainer_save(&a.t, sub, NULL, 0, err), 0, "%s: save after %d steps", what, K);
    mg_ckpt_mark_complete(sub, (uint64_t)K, err);
    mg_ckpt_path(sub, (uint64_t)K, path, sizeof(path));
    /* b: a fresh process that restores the checkpoint */
    mg_model_init_params(&b.m, 77); /* different weights: everything must come from the file */
    is_int(mg_trainer_load(&b.t, path, err), 0, "%s: load", what);
    size_t np = a.m.nparams, ns = a.t.opt.state_count;
    ok(!memcmp(a.m.param_buf, b.m.param_buf, np * 4) &&
           (ns == 0 || !memcmp(a.t.opt.state, b.t.opt.state, ns * 4)),
       "%s: parameters and optimizer state restored bit-exactly", what);
    ok(a.t.step == b.t.step && a.t.epoch == b.t.epoch && a.t.batch_in_epoch == b.t.batch_in_epoch &&
           a.t.opt.steps == b.t.opt.steps && a.m.dropout_rng.offset == b.m.dropout_rng.offset &&
           a.m.dropout_rng.seed == b.m.dropout_rng.seed,
       "%s: step %ld, epoch %ld, batch %ld, RNG restored", what, b.t.step, b.t.epoch,
       b.t.batch_in_epoch);
    steps(&a, K);
    steps(&b, K);
    /* c: 2K steps straight */
    if (make(&c, model, mo, kind, accum, 5, 1, err) < 0)
        BAIL_OUT("%s", err);
    steps(&c, 2 * K);
    ok(a.t.epoch >= 1, "%s: the run crossed an epoch boundary", what);
    ok(mg_model_param_hash(&a.m) == mg_model_param_hash(&c.m),
       "%s: saving does not disturb the run", what);
    ok(mg_model_param_hash(&b.m) == mg_model_param_hash(&c.m) &&
           !memcmp(b.m.param_buf, c.m.param_buf, np * 4) &&
           (ns == 0 || !memcmp(b.t.opt.state, c.t.opt.state, ns * 4)),
       "%s: K + resume + K steps == 2K steps, bit for bit (hash %016llx)", what,
       (unsigned long long)mg_model_param_hash(&b.m));
    drop(&a);
    drop(&b);
    drop(&c);
}

static void mismatch_cases(void)
{
    char err[MG_ERRMSG_LEN], sub[300], path[MG_CKPT_PATH_MAX];
    struct setup a, b;
    struct mg_model_options wide = {.hidden = {32}, .nhidden = 1},
                            narrow = {.hidden = {16}, .nhidden = 1};
    snprintf(sub, sizeof(sub), "%s/mismatch", dir);
    make(&a, "mlp", &wide, MG_OPTIM_SGD, 1, 5, 1, err);
    steps(&a, 2);
    mg_trainer_save(&a.t, sub, NULL, 0, err);
    mg_ckpt_path(sub, 2, path, sizeof(path));

    make(&b, "mlp", &narrow, MG_OPTIM_SGD, 1, 5, 1, err);
    is_int(mg_trainer_load(&b.t, path, err), -MG_ESHAPE, "other hidden size: shape mismatch");
    ok(strstr(err, "0.weight [32, 784] in the checkpoint, 0.weight [16, 784] in the model") != NULL,
       "message: %s", err);
    drop(&b);
    make(&b, "cnn", NULL, MG_OPTIM_SGD, 1, 5, 1, err);
    is_int(mg_trainer_load(&b.t, path, err), -MG_ESHAPE, "other model refused");
    ok(strstr(err, "holds model 'mlp'"), "message: %s", err);
    drop(&b);
    make(&b, "mlp", &wide, MG_OPTIM_SGD, 1, 6, 1, err);
    is_int(mg_trainer_load(&b.t, path, err), -MG_ECONFIG, "other seed refused");
    ok(strstr(err, "seed 5, this run has seed 6"), "message: %s", err);
    drop(&b);
    make(&b, "mlp", &wide, MG_OPTIM_SGD, 1, 5, 2, err);
    is_int(mg_trainer_load(&b.t, path, err), -MG_ECONFIG, "other world size refused");
    ok(strstr(err, "world size 1, this run has world size 2"), "message: %s", err);
    drop(&b);
    make(&b, "mlp", &wide, MG_OPTIM_ADAMW, 1, 5, 1, err);
    is_int(mg_trainer_load(&b.t, path, err), -MG_ECONFIG, "other optimizer refused");
    drop(&b);

    /* newest corrupt: fall back to the previous one, with a report */
    steps(&a, 1);
    mg_trainer_save(&a.t, sub, NULL, 0, err);
    mg_ckpt_mark_complete(sub, 2, err);
    mg_ckpt_mark_complete(sub, 3, err);
    mg_ckpt_path(sub, 3, path, sizeof(path));
    flip(path, file_size(path) / 2);
    make(&b, "mlp", &wide, MG_OPTIM_SGD, 1, 5, 1, err);
    struct mg_resume_report rep;
    is_int(mg_trainer_resume_latest(&b.t, sub, &rep, err), 0, "resume with a corrupt newest");
    ok(rep.found && rep.step == 2 && b.t.step == 2, "fell back to step 2");
    ok(rep.nskipped == 1 && strstr(rep.skipped[0], "checksum"), "reported: %s", rep.skipped[0]);
    mg_ckpt_path(sub, 2, path, sizeof(path));
    flip(path, file_size(path) / 2);
    is_int(mg_trainer_resume_latest(&b.t, sub, &rep, err), -MG_ECRC, "all corrupt: an error");
    ok(strstr(err, "no intact checkpoint"), "message: %s", err);
    drop(&b);
    make(&b, "mlp", &narrow, MG_OPTIM_SGD, 1, 5, 1, err);
    snprintf(sub, sizeof(sub), "%s/empty", dir);
    is_int(mg_trainer_resume_latest(&b.t, sub, &rep, err), 0, "no checkpoint directory: no error");
    ok(!rep.found && b.t.step == 0, "nothing found, training starts at step 0");
    drop(&b);
    drop(&a);
}

int main(void)
{
    char err[MG_ERRMSG_LEN];
    snprintf(dir, sizeof(dir), "%s/mgckpt.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir))
        BAIL_OUT("mkdtemp");
    if (mg_backend_create(MG_DEVICE_CPU, NULL, &be) < 0)
        BAIL_OUT("no CPU backend");
    if (mg_dataset_load(&train_ds, MG_DATA_SYNTHETIC, NULL, 1, 100, err) < 0 ||
        mg_dataset_load(&test_ds, MG_DATA_SYNTHETIC, NULL, 0, 50, err) < 0)
        BAIL_OUT("%s", err);
    test_container();
    test_prune();
    struct mg_model_options drop_opt = {.hidden = {64}, .nhidden = 1, .dropout = 0.2f};
    resume_case("mlp-sgd-dropout", "mlp", &drop_opt, MG_OPTIM_SGD, 1, 5);
    resume_case("mlp-adamw-accum", "mlp", &drop_opt, MG_OPTIM_ADAMW, 2, 4);
    resume_case("cnn-sgd", "cnn", NULL, MG_OPTIM_SGD, 1, 5);
    mismatch_cases();
    mg_dataset_release(&train_ds);
    mg_dataset_release(&test_ds);
    mg_backend_release(be);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        diag("could not remove %s", dir);
    return done_testing();
}
