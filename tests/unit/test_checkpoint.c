/* Checkpoints: the container round-trips bit-exactly; a bad magic, version,
 * header or payload CRC, truncation and trailing bytes are each refused with
 * their own error; markers, listing, pruning and fallback to an older
 * checkpoint; a trainer saved and restored continues with the same bits as
 * one that never stopped (SGD and AdamW, dropout, gradient accumulation, an
 * epoch boundary); shape and configuration mismatches are refused; a
 * checkpoint resumed with another world size (resharding) continues from the
 * same parameters, step and place in the epoch, every sample once; owner
 * records and the runs in markers keep listing and pruning to a run's own;
 * a crafted file is read no further than a checkpoint of the model holds.
 * timeout: 120 */
#include "checkpoint.h"
#include "mg_err.h"
#include "models.h"
#include "rtutil.h"
#include "trainer.h"
#include "tap.h"

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
    is_int(mg_ckpt_mark_complete(dir, 42, 0, err), 0, "mark complete");
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
            mg_ckpt_mark_complete(sub, step, 0, err);
    }
    snprintf(path, sizeof(path), "%s/ckpt-000000000020.mgc.tmp.999", sub);
    FILE *f = fopen(path, "w");
    fclose(f);
    uint64_t steps[8];
    int n = mg_ckpt_list(sub, steps, 8);
    ok(n == 4 && steps[0] == 40 && steps[3] == 10, "complete checkpoints, newest first");
    n = mg_ckpt_list(sub, steps, 2);
    ok(n == 2 && steps[0] == 40 && steps[1] == 30,
       "a short list holds the newest, whatever order the directory gives: %d %llu %llu", n,
       (unsigned long long)steps[0], (unsigned long long)steps[1]);
    is_int(mg_ckpt_prune(sub, 2, NULL), 0, "prune to 2");
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

/* ---- owner records, runs in markers ------------------------------------------------- */

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0)
        BAIL_OUT("write %s", path);
}

static void test_owner(void)
{
    char err[MG_ERRMSG_LEN], sub[300], path[MG_CKPT_PATH_MAX];
    struct mg_ckpt_owner o, back;
    snprintf(sub, sizeof(sub), "%s/owner", dir);
    is_int(mg_ckpt_owner_read(sub, &back, err), 0, "no directory: no owner");
    memset(&o, 0, sizeof(o));
    o.run = 0x1234;
    snprintf(o.run_id, sizeof(o.run_id), "job\nwith a newline");
    mg_ckpt_owner_adopt(&o, 0);
    mg_ckpt_owner_adopt(&o, 0xabc);
    mg_ckpt_owner_adopt(&o, 0xabc);
    mg_ckpt_owner_adopt(&o, 0x1234);
    is_int(o.nadopted, 2, "adopting is idempotent and never the owner itself");
    is_int(mg_ckpt_owner_write(sub, &o, err), 0, "write an owner record (creating the directory)");
    is_int(mg_ckpt_owner_read(sub, &back, err), 1, "read it back");
    ok(back.run == 0x1234 && !strcmp(back.run_id, "job?with a newline") && back.nadopted == 2 &&
           back.adopted[0] == 0 && back.adopted[1] == 0xabc,
       "run, id (one line of it) and adopted runs: %s", back.run_id);
    ok(mg_ckpt_owner_has(&back, 0x1234) && mg_ckpt_owner_has(&back, 0xabc) &&
           mg_ckpt_owner_has(&back, 0) && !mg_ckpt_owner_has(&back, 0x999),
       "membership");
    struct mg_ckpt_owner full = {.run = 1};
    for (uint64_t r = 100; r < 100 + MG_CKPT_MAX_ADOPTED + 3; r++)
        mg_ckpt_owner_adopt(&full, r);
    ok(full.nadopted == MG_CKPT_MAX_ADOPTED && full.adopted[0] == 103 &&
           mg_ckpt_owner_has(&full, 100 + MG_CKPT_MAX_ADOPTED + 2),
       "a full list forgets the oldest");

    snprintf(path, sizeof(path), "%s/" MG_CKPT_OWNER_FILE, sub);
    const char *bad[] = {"", "mg checkpoint directory owner, format 1\n",
                         "mg checkpoint directory owner, format 2\nrun 0000000000001234 x\n",
                         "mg checkpoint directory owner, format 1\nrun 12345 x\n",
                         "mg checkpoint directory owner, format 1\nrun 0000000000001234\nwho?\n"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        write_text(path, bad[i]);
        is_int(mg_ckpt_owner_read(sub, &back, err), -MG_EFORMAT, "not an owner record: case %zu",
               i);
    }
    write_text(path, "mg checkpoint directory owner, format 1\nrun 0000000000001234\n");
    ok(mg_ckpt_owner_read(sub, &back, err) == 1 && back.run == 0x1234 && !back.run_id[0],
       "a record without an id");

    /* markers record their run; listing and pruning keep to the owner's */
    struct mg_ckpt_section sec = {1, 0, 4, "abcd"};
    uint64_t run_of[] = {0xa, 0xb, 0, 0xa, 0xa};
    for (int i = 0; i < 5; i++) {
        uint64_t step = 10 * (uint64_t)(i + 1);
        struct mg_ckpt_info info = {.step = step};
        mg_ckpt_write(sub, &info, &sec, 1, err);
        mg_ckpt_mark_complete(sub, step, run_of[i], err);
    }
    mg_ckpt_marker_path(sub, 30, path, sizeof(path));
    write_text(path,
               "mg checkpoint complete: step 30\n"); /* as written before runs were recorded */
    struct mg_ckpt_info stale = {.step = 35};
    mg_ckpt_write(sub, &stale, &sec, 1, err);
    struct mg_ckpt_entry e[8];
    int n = mg_ckpt_list_runs(sub, NULL, e, 8);
    ok(n == 5 && e[0].step == 50 && e[0].run == 0xa && e[2].step == 30 && e[2].run == 0 &&
           e[3].run == 0xb,
       "every complete checkpoint with the run its marker records");
    struct mg_ckpt_owner a = {.run = 0xa};
    n = mg_ckpt_list_runs(sub, &a, e, 8);
    ok(n == 3 && e[0].step == 50 && e[1].step == 40 && e[2].step == 10, "only run a's");
    mg_ckpt_owner_adopt(&a, 0);
    n = mg_ckpt_list_runs(sub, &a, e, 8);
    ok(n == 4 && e[2].step == 30, "and the unrecorded ones it adopted");
    struct mg_ckpt_owner only_a = {.run = 0xa};
    is_int(mg_ckpt_prune(sub, 1, &only_a), 0, "prune run a's to 1");
    uint64_t steps[8];
    n = mg_ckpt_list(sub, steps, 8);
    ok(n == 3 && steps[0] == 50 && steps[1] == 30 && steps[2] == 20,
       "run a's older ones are gone; run b's and the unrecorded one are not");
    mg_ckpt_path(sub, 35, path, sizeof(path));
    ok(access(path, F_OK) != 0, "an unmarked file older than the run's newest is removed");
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
    mg_ckpt_mark_complete(sub, (uint64_t)K, 0, err);
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
    is_int(mg_trainer_load(&b.t, path, err), 0, "other world size: resharded");
    ok(b.t.resumed.resharded && b.t.resumed.world == 1 && b.t.step == 2, "from world size %d",
       b.t.resumed.world);
    drop(&b);
    make(&b, "mlp", &wide, MG_OPTIM_ADAMW, 1, 5, 1, err);
    is_int(mg_trainer_load(&b.t, path, err), -MG_ECONFIG, "other optimizer refused");
    drop(&b);

    /* newest corrupt: fall back to the previous one, with a report */
    steps(&a, 1);
    mg_trainer_save(&a.t, sub, NULL, 0, err);
    mg_ckpt_mark_complete(sub, 2, 0, err);
    mg_ckpt_mark_complete(sub, 3, 0, err);
    mg_ckpt_path(sub, 3, path, sizeof(path));
    flip(path, file_size(path) / 2);
    make(&b, "mlp", &wide, MG_OPTIM_SGD, 1, 5, 1, err);
    struct mg_resume_report rep;
    is_int(mg_trainer_resume_latest(&b.t, sub, NULL, &rep, err), 0, "resume with a corrupt newest");
    ok(rep.found && rep.step == 2 && b.t.step == 2, "fell back to step 2");
    ok(rep.nskipped == 1 && strstr(rep.skipped[0], "checksum"), "reported: %s", rep.skipped[0]);
    mg_ckpt_path(sub, 2, path, sizeof(path));
    flip(path, file_size(path) / 2);
    is_int(mg_trainer_resume_latest(&b.t, sub, NULL, &rep, err), -MG_ECRC, "all corrupt: an error");
    ok(strstr(err, "no intact checkpoint"), "message: %s", err);
    drop(&b);
    make(&b, "mlp", &narrow, MG_OPTIM_SGD, 1, 5, 1, err);
    snprintf(sub, sizeof(sub), "%s/empty", dir);
    is_int(mg_trainer_resume_latest(&b.t, sub, NULL, &rep, err), 0,
           "no checkpoint directory: no error");
    ok(!rep.found && b.t.step == 0, "nothing found, training starts at step 0");
    drop(&b);
    drop(&a);
}

/* ---- bounded reads -------------------------------------------------------------------- */

/* A copy of src with an unknown section of extra zero bytes before the end:
 * valid CRCs, a stream that inflates to all of it. */
static void craft(const char *src, const char *dst, uint64_t extra)
{
    char err[MG_ERRMSG_LEN];
    struct mg_ckpt_file f;
    if (mg_ckpt_read(src, &f, err) < 0)
        BAIL_OUT("%s", err);
    struct mg_ckpt_section *secs = calloc((size_t)f.nsections + 1, sizeof(*secs));
    void *zeros = calloc(1, extra);
    if (!secs || !zeros)
        BAIL_OUT("out of memory");
    memcpy(secs, f.sections, (size_t)f.nsections * sizeof(*secs));
    secs[f.nsections] = (struct mg_ckpt_section){99, 0, extra, zeros};
    char sub[300];
    snprintf(sub, sizeof(sub), "%s/craft", dir);
    struct mg_ckpt_info info = f.info;
    info.step = 1;
    if (mg_ckpt_write(sub, &info, secs, f.nsections + 1, err) < 0)
        BAIL_OUT("%s", err);
    char path[MG_CKPT_PATH_MAX];
    mg_ckpt_path(sub, 1, path, sizeof(path));
    if (rename(path, dst) != 0)
        BAIL_OUT("rename");
    free(zeros);
    free(secs);
    mg_ckpt_file_release(&f);
}

static void bounded_cases(void)
{
    char err[MG_ERRMSG_LEN], sub[300], path[MG_CKPT_PATH_MAX], p3[MG_CKPT_PATH_MAX],
        p4[MG_CKPT_PATH_MAX];
    struct setup a, b, wide;
    struct mg_model_options mo = {.hidden = {32}, .nhidden = 1},
                            big = {.hidden = {256}, .nhidden = 1};
    snprintf(sub, sizeof(sub), "%s/bound", dir);
    make(&a, "mlp", &mo, MG_OPTIM_SGD, 1, 5, 1, err);
    steps(&a, 2);
    mg_trainer_save(&a.t, sub, NULL, 0, err);
    mg_ckpt_mark_complete(sub, 2, 0, err);
    mg_ckpt_path(sub, 2, path, sizeof(path));
    mg_ckpt_path(sub, 3, p3, sizeof(p3));
    mg_ckpt_path(sub, 4, p4, sizeof(p4));

    struct mg_ckpt_bound bound;
    mg_trainer_ckpt_bound(&a.t, &bound);
    uint64_t extra = 16u << 20;
    ok(bound.fixed < extra / 8, "the bound of a %zu-parameter model: %llu bytes + %llu per rank",
       a.m.nparams, (unsigned long long)bound.fixed, (unsigned long long)bound.per_rank);
    craft(path, p3, extra);
    mg_ckpt_mark_complete(sub, 3, 0, err);
    struct mg_ckpt_file f;
    is_int(mg_ckpt_read(p3, &f, err), 0, "the crafted file is a valid checkpoint (unbounded read)");
    const struct mg_ckpt_section *junk = mg_ckpt_find(&f, 99, 0);
    ok(junk && junk->len == extra && !f.partial, "with %llu bytes of junk",
       (unsigned long long)extra);
    mg_ckpt_file_release(&f);
    is_int(mg_ckpt_read_bounded(p3, &bound, &f, err), 0, "a bounded read of it");
    ok(f.partial && mg_ckpt_find(&f, MG_CKPT_TAG_META, 0) && !mg_ckpt_find(&f, 99, 0),
       "is partial: what comes first is there, the junk is not");
    mg_ckpt_file_release(&f);

    make(&b, "mlp", &mo, MG_OPTIM_SGD, 1, 5, 1, err);
    is_int(mg_trainer_load(&b.t, p3, err), -MG_ETOOBIG, "the trainer refuses it as too big");
    ok(strstr(err, "more than a checkpoint of this model holds") != NULL, "message: %s", err);

    /* a header edit: a raw size of 60 GiB with its CRC fixed */
    copy_file(path, p4);
    unsigned char h[MG_CKPT_HEADER_SIZE];
    FILE *fp = fopen(p4, "rb");
    if (!fp || fread(h, 1, sizeof(h), fp) != sizeof(h))
        BAIL_OUT("read header");
    fclose(fp);
    mg_put_u64(h + 24, (uint64_t)60 << 30);
    mg_put_u32(h + 60, (uint32_t)crc32(0, h, 60));
    poke(p4, 0, h, sizeof(h));
    mg_ckpt_mark_complete(sub, 4, 0, err);
    is_int(mg_trainer_load(&b.t, p4, err), -MG_EFORMAT, "a header promising 60 GiB: corrupt");
    ok(strstr(err, "bad compressed payload") != NULL, "message: %s", err);

    struct mg_resume_report rep;
    is_int(mg_trainer_resume_latest(&b.t, sub, NULL, &rep, err), 0, "resume past both");
    ok(rep.found && rep.step == 2 && rep.nskipped == 2, "from step 2, two skipped");

    /* another model's checkpoint, bigger than the bound, is still a shape mismatch */
    make(&wide, "mlp", &big, MG_OPTIM_ADAMW, 1, 5, 1, err);
    snprintf(sub, sizeof(sub), "%s/bound-wide", dir);
    mg_trainer_save(&wide.t, sub, NULL, 0, err);
    mg_ckpt_path(sub, 0, path, sizeof(path));
    is_int(mg_trainer_load(&b.t, path, err), -MG_ESHAPE, "a bigger model's checkpoint");
    ok(strstr(err, "0.weight [256, 784] in the checkpoint, 0.weight [32, 784] in the model") !=
           NULL,
       "message: %s", err);
    drop(&wide);
    drop(&b);
    drop(&a);
}

/* ---- resharding: a checkpoint of W ranks resumed by W' ranks ------------------------- */

#define MAXW 4

struct group {
    int world, batch;
    struct setup r[MAXW];
};

/* W ranks of an mlp with dropout (no communication: each trains its own shard,
 * which is all the data position needs). global: --global-batch-size or 0. */
static void group_make(struct group *g, int world, int batch, long global, int drop_last)
{
    char err[MG_ERRMSG_LEN];
    struct mg_model_options mo = {.hidden = {32}, .nhidden = 1, .dropout = 0.2f};
    g->world = world;
    g->batch = batch;
    for (int r = 0; r < world; r++) {
        struct setup *s = &g->r[r];
        memset(s, 0, sizeof(*s));
        if (mg_model_create(&s->m, be, "mlp", &mo, 16, err) < 0)
            BAIL_OUT("%s", err);
        mg_model_init_params(&s->m, 100 + (uint64_t)r); /* replaced by the checkpoint */
        struct mg_train_config cfg = {.batch_size = batch,
                                      .accum_steps = 1,
                                      .total_steps = 1000,
                                      .seed = 9,
                                      .rank = r,
                                      .world = world,
                                      .drop_last = drop_last,
                                      .global_batch = global};
        mg_optim_defaults(&cfg.optim, MG_OPTIM_SGD);
        cfg.optim.momentum = 0.9;
        cfg.sched = (struct mg_schedule){.kind = MG_SCHED_CONSTANT, .base_lr = 0.05, .total = 1000};
        if (mg_trainer_init(&s->t, &s->m, &train_ds, &test_ds, &cfg, NULL, err) < 0)
            BAIL_OUT("%s", err);
    }
}

static void group_drop(struct group *g)
{
    for (int r = 0; r < g->world; r++)
        drop(&g->r[r]);
}

static void group_steps(struct group *g, int k)
{
    for (int r = 0; r < g->world; r++)
        steps(&g->r[r], k);
}

/* Rank 0 writes the checkpoint with every rank's state (what train does). */
static void group_save(struct group *g, const char *sub, char *path)
{
    char err[MG_ERRMSG_LEN];
    struct mg_rank_state states[MAXW];
    for (int r = 0; r < g->world; r++)
        mg_trainer_rank_state(&g->r[r].t, &states[r]);
    if (mg_trainer_save(&g->r[0].t, sub, states, g->world, err) < 0 ||
        mg_ckpt_mark_complete(sub, (uint64_t)g->r[0].t.step, 0, err) < 0)
        BAIL_OUT("%s", err);
    mg_ckpt_path(sub, (uint64_t)g->r[0].t.step, path, MG_CKPT_PATH_MAX);
}

/* Adds to count[] the samples every rank of g took in its current pass over
 * the epoch from batch `from` on: up to now, or to the pass's end (whole). */
static void group_taken(struct group *g, long from, int whole, int *count)
{
    for (int r = 0; r < g->world; r++) {
        const struct mg_trainer *t = &g->r[r].t;
        long k = whole ? t->sampler.pass_samples : t->batch_in_epoch * (long)g->batch;
        if (k > t->sampler.pass_samples)
            k = t->sampler.pass_samples;
        for (long i = from * g->batch; i < k; i++)
            count[t->sampler.indices[i]]++;
    }
}

/* W ranks train K steps into the first epoch and checkpoint; W' ranks resume:
 * the same parameters, optimizer state and step; the rest of the epoch shared
 * among the W' ranks so that, with what the W ranks took, every sample comes
 * once (padding: at least once, fewer than W' extra; drop_last: at most once,
 * fewer than W' missing); dropout streams of their own; --epochs recounted. */
static void reshard_case(int w_old, int b_old, int w_new, int b_new, int drop_last, int k)
{
    char err[MG_ERRMSG_LEN], sub[300], path[MG_CKPT_PATH_MAX], what[64];
    struct group a, b;
    int count[100] = {0};
    snprintf(what, sizeof(what), "%dx%d -> %dx%d%s after %d", w_old, b_old, w_new, b_new,
             drop_last ? " drop_last" : "", k);
    snprintf(sub, sizeof(sub), "%s/reshard-%d-%d-%d-%d-%d-%d", dir, w_old, b_old, w_new, b_new,
             drop_last, k);
    group_make(&a, w_old, b_old, 0, drop_last);
    group_steps(&a, k);
    ok(a.r[0].t.epoch == 0, "%s: still in the first epoch", what);
    group_save(&a, sub, path);
    group_taken(&a, 0, 0, count);
    long taken = 0;
    for (int i = 0; i < 100; i++)
        taken += count[i];

    long global = b_new != b_old ? (long)b_old * w_old : 0; /* a changed batch needs it */
    group_make(&b, w_new, b_new, global, drop_last);
    int same = 1, loaded = 1;
    uint64_t furthest = 0;
    for (int r = 0; r < w_old; r++)
        if (a.r[r].m.dropout_rng.offset > furthest)
            furthest = a.r[r].m.dropout_rng.offset;
    for (int r = 0; r < w_new; r++) {
        struct setup *s = &b.r[r];
        if (mg_trainer_load(&s->t, path, err) < 0) {
            loaded = 0;
            diag("rank %d: %s", r, err);
            continue;
        }
        same &= !memcmp(s->m.param_buf, a.r[0].m.param_buf, s->m.nparams * 4) &&
                !memcmp(s->t.opt.state, a.r[0].t.opt.state, s->t.opt.state_count * 4) &&
                s->t.step == k && s->t.opt.steps == a.r[0].t.opt.steps &&
                s->t.resumed.resharded == (w_old != w_new) && s->t.resumed.world == w_old;
        /* a rank of the old world keeps its stream, past every old rank's numbers */
        same &=
            s->m.dropout_rng.offset == (w_old == w_new ? a.r[r].m.dropout_rng.offset : furthest);
        if (r < w_old)
            same &= s->m.dropout_rng.seed == a.r[r].m.dropout_rng.seed;
        for (int q = 0; q < r; q++)
            same &= s->m.dropout_rng.seed != b.r[q].m.dropout_rng.seed;
    }
    ok(loaded, "%s: every new rank loads the checkpoint", what);
    ok(same, "%s: rank 0's parameters, optimizer state and step %d; dropout streams of their own",
       what, k);
    const struct mg_resume_info *ri = &b.r[0].t.resumed;
    is_int(ri->position, taken, "%s: position %ld = the samples the old ranks took", what,
           ri->position);

    /* the step at which the first epoch ends, counted after the reshard */
    long end = mg_trainer_steps_for_epochs(&b.r[0].t, 1), from = b.r[0].t.batch_in_epoch;
    group_steps(&b, (int)(end - k));
    ok(b.r[0].t.epoch == 0 && b.r[0].t.batch_in_epoch == b.r[0].t.pass_batches,
       "%s: --epochs 1 recounted: the epoch ends at step %ld", what, end);
    group_taken(&b, from, 1, count);
    int once = 1, extra = 0, missing = 0;
    for (int i = 0; i < 100; i++) {
        once &= count[i] <= (drop_last ? 1 : 2);
        extra += count[i] > 1 ? count[i] - 1 : 0;
        missing += count[i] == 0;
    }
    if (drop_last)
        ok(once && missing < w_new, "%s: no sample twice, %d dropped (< %d)", what, missing, w_new);
    else
        ok(once && missing == 0 && extra < w_new,
           "%s: every sample taken, %d padding repeats (< %d)", what, extra, w_new);
    group_drop(&a);
    group_drop(&b);
}

/* A pass that began mid-epoch is itself checkpointed and resumed: by the same
 * world size (version 2 file, bit for bit) and by yet another one. */
static void reshard_twice(void)
{
    char err[MG_ERRMSG_LEN], sub[300], path[MG_CKPT_PATH_MAX], path2[MG_CKPT_PATH_MAX];
    struct group a, b, c, d;
    int count[100] = {0};
    snprintf(sub, sizeof(sub), "%s/reshard-twice", dir);
    group_make(&a, 3, 8, 0, 0); /* 34 per rank, 5 batches */
    group_steps(&a, 2);         /* positions 0..47 */
    group_save(&a, sub, path);
    group_taken(&a, 0, 0, count);
    group_make(&b, 2, 8, 0, 0);
    for (int r = 0; r < 2; r++)
        if (mg_trainer_load(&b.r[r].t, path, err) < 0)
            BAIL_OUT("%s", err);
    ok(b.r[0].t.epoch_start == 48, "3 -> 2: the pass begins at position 48 (%ld)",
       b.r[0].t.epoch_start);
    group_steps(&b, 1); /* positions 48..63 */
    group_save(&b, sub, path2);
    group_taken(&b, 0, 0, count);
    struct mg_ckpt_file f;
    is_int(mg_ckpt_read(path2, &f, err), 0, "read the resharded run's checkpoint");
    is_int((int)f.info.version, 2, "a pass that began mid-epoch is written as version 2");
    mg_ckpt_file_release(&f);
    is_int(mg_ckpt_read(path, &f, err), 0, "read the first checkpoint");
    is_int((int)f.info.version, 1, "one from the epoch's start stays version 1");
    mg_ckpt_file_release(&f);

    /* same world size: the same batches and bits as the run that goes on */
    group_make(&c, 2, 8, 0, 0);
    for (int r = 0; r < 2; r++)
        if (mg_trainer_load(&c.r[r].t, path2, err) < 0)
            BAIL_OUT("%s", err);
    ok(!c.r[0].t.resumed.resharded && c.r[0].t.epoch_start == 48 && c.r[0].t.batch_in_epoch == 1,
       "2 -> 2: the same pass, batch 1 of it");
    group_steps(&b, 3);
    group_steps(&c, 3);
    /* (rank 1's parameters are its own here: no averaging in this test) */
    ok(!memcmp(b.r[0].m.param_buf, c.r[0].m.param_buf, b.r[0].m.nparams * 4) &&
           b.r[1].m.dropout_rng.offset == c.r[1].m.dropout_rng.offset &&
           b.r[0].t.epoch == c.r[0].t.epoch && b.r[0].t.batch_in_epoch == c.r[0].t.batch_in_epoch,
       "2 -> 2 from a version 2 file: bit-identical to the run that never stopped");

    /* and on to 4 ranks: what 3 took, then 2, then 4 is the epoch once */
    group_make(&d, 4, 8, 0, 0);
    for (int r = 0; r < 4; r++)
        if (mg_trainer_load(&d.r[r].t, path2, err) < 0)
            BAIL_OUT("%s", err);
    is_int(d.r[0].t.epoch_start, 64, "3 -> 2 -> 4: the pass begins at position 64");
    group_steps(&d, 1);
    group_taken(&d, 0, 1, count);
    int good = 1, extra = 0;
    for (int i = 0; i < 100; i++) {
        good &= count[i] >= 1 && count[i] <= 2;
        extra += count[i] - 1;
    }
    ok(good && extra < 4, "3 -> 2 -> 4: every sample of the epoch, %d padding repeats", extra);
    group_drop(&a);
    group_drop(&b);
    group_drop(&c);
    group_drop(&d);
}

static void reshard_refusals(void)
{
    char err[MG_ERRMSG_LEN], sub[300], path[MG_CKPT_PATH_MAX];
    struct group a, b;
    snprintf(sub, sizeof(sub), "%s/reshard-refused", dir);
    group_make(&a, 2, 16, 0, 0);
    group_steps(&a, 1);
    group_save(&a, sub, path);
    group_make(&b, 3, 8, 0, 0);
    is_int(mg_trainer_load(&b.r[0].t, path, err), -MG_ECONFIG,
           "another world size and another batch per process: refused");
    ok(strstr(err, "written with batch size 16 per process x 2 processes, this run has batch "
                   "size 8 per process: pass --batch-size 16") &&
           strstr(err, "--global-batch-size 32"),
       "message: %s", err);
    ok(b.r[0].t.step == 0 && !b.r[0].t.resumed.loaded, "the trainer is left as it was");
    group_drop(&b);
    group_make(&b, 3, 8, 24, 0);
    is_int(mg_trainer_load(&b.r[0].t, path, err), -MG_ECONFIG, "another global batch: refused");
    ok(strstr(err, "a global batch of 32; this run has --global-batch-size 24"), "message: %s",
       err);
    group_drop(&b);
    group_make(&b, 3, 16, 0, 1);
    is_int(mg_trainer_load(&b.r[0].t, path, err), -MG_ECONFIG, "another drop_last: refused");
    group_drop(&b);
    group_make(&b, 2, 8, 16, 0);
    is_int(mg_trainer_load(&b.r[0].t, path, err), -MG_ECONFIG,
           "the same world size with another batch per process: refused");
    ok(strstr(err, "written with batch size 16, this run has batch size 8"), "message: %s", err);
    group_drop(&b);
    group_drop(&a);
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
    test_owner();
    bounded_cases();
    reshard_case(3, 8, 2, 8, 0, 2);   /* shrink: 34 per rank, 48 taken, 26 each after */
    reshard_case(2, 8, 3, 8, 0, 3);   /* grow */
    reshard_case(3, 8, 2, 8, 1, 2);   /* drop_last */
    reshard_case(4, 8, 3, 8, 1, 3);   /* drop_last, 4 of 100 left to 3 ranks: 1 dropped */
    reshard_case(3, 8, 1, 8, 0, 1);   /* to a single process */
    reshard_case(1, 16, 3, 16, 0, 2); /* from a single process */
    reshard_case(2, 16, 4, 8, 0, 1);  /* --global-batch-size 32 on both sides */
    reshard_case(3, 8, 3, 8, 0, 2);   /* the same world: no reshard, same rules hold */
    reshard_twice();
    reshard_refusals();
    mg_dataset_release(&train_ds);
    mg_dataset_release(&test_ds);
    mg_backend_release(be);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        diag("could not remove %s", dir);
    return done_testing();
}
