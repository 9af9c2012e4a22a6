/* Checkpoint content (see trainer.h): what the trainer puts in a checkpoint's
 * sections (layouts in docs/checkpoint-format.md), and how a run resumes from
 * one, resharding it when the world size changed. The container format itself
 * is checkpoint.c's. */
#include "trainer.h"
#include "mg_err.h"
#include "rtutil.h"
#include "trainer_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define META_BYTES      256
#define OPTIM_HDR_BYTES 24
#define SECTION_BYTES   16          /* a section's header (checkpoint.c) */
#define MAX_WORLD       (1 << 20)   /* MG_DIST_MAX_WORLD */
#define FUTURE_SLACK    (64u << 10) /* sections a later writer may add */

uint64_t mg_run_id_hash(const char *run_id)
{
    if (!run_id || !*run_id || strcmp(run_id, "none") == 0)
        return 0;
    uint64_t h = mg_hash64(run_id, strlen(run_id));
    return h == 0 || h == UINT64_MAX ? 1 : h;
}

/* Micro-batches of a pass from position start (the same on every rank: the
 * training sampler pads or drops, it is never uneven). */
static long pass_batches(long n, int world, enum mg_sampler_mode mode, int batch, long start)
{
    long len = mg_sampler_pass_len(n, 0, world, mode, start);
    return (len + batch - 1) / batch;
}

void mg_trainer_rank_state(const struct mg_trainer *t, struct mg_rank_state *out)
{
    out->rank = (uint32_t)t->cfg.rank;
    out->dropout = t->model->dropout_rng;
}

void mg_rank_state_pack(const struct mg_rank_state *s, unsigned char out[MG_RANK_STATE_BYTES])
{
    memset(out, 0, MG_RANK_STATE_BYTES);
    mg_put_u32(out, s->rank);
    mg_put_u64(out + 8, s->dropout.seed);
    mg_put_u64(out + 16, s->dropout.offset);
}

int mg_rank_state_unpack(const unsigned char *in, size_t len, struct mg_rank_state *out)
{
    if (len < 24)
        return -MG_EFORMAT;
    out->rank = mg_get_u32(in);
    out->dropout.seed = mg_get_u64(in + 8);
    out->dropout.offset = mg_get_u64(in + 16);
    return 0;
}

/* Positions of the current epoch's order taken by every rank so far. */
static long epoch_position(const struct mg_trainer *t)
{
    long len =
        mg_sampler_pass_len(t->train->n, 0, t->cfg.world, mg_train_mode(&t->cfg), t->epoch_start);
    long taken = t->batch_in_epoch * (long)t->cfg.batch_size;
    return t->epoch_start + (taken < len ? taken : len) * t->cfg.world;
}

static void pack_meta(const struct mg_trainer *t, unsigned char *p)
{
    const struct mg_model *m = t->model;
    double lr = t->cfg.sched.base_lr;
    uint64_t lr_bits;
    memcpy(&lr_bits, &lr, 8);
    memset(p, 0, META_BYTES);
    memcpy(p, m->name, strnlen(m->name, MG_NAME_MAX - 1));
    mg_put_u64(p + 32, (uint64_t)t->step);
    mg_put_u64(p + 40, (uint64_t)t->epoch);
    mg_put_u64(p + 48, (uint64_t)t->batch_in_epoch);
    mg_put_u64(p + 56, t->samples_seen);
    mg_put_u64(p + 64, t->cfg.seed);
    mg_put_u32(p + 72, (uint32_t)t->cfg.world);
    mg_put_u32(p + 76, (uint32_t)t->cfg.batch_size);
    mg_put_u32(p + 80, (uint32_t)t->cfg.accum_steps);
    mg_put_u32(p + 84, (uint32_t)t->cfg.drop_last);
    mg_put_u64(p + 88, (uint64_t)t->train->n);
    mg_put_u64(p + 96, m->nparams);
    mg_put_u32(p + 104, (uint32_t)m->ntensors);
    mg_put_u32(p + 108, (uint32_t)t->cfg.optim.kind);
    mg_put_u64(p + 112, lr_bits);
    mg_put_u32(p + 120, (uint32_t)t->cfg.sched.kind);
    mg_put_u64(p + 128, (uint64_t)t->cfg.total_steps);
    mg_put_u64(p + 136, (uint64_t)t->epoch_start); /* version 2 */
    mg_put_u64(p + 144, (uint64_t)t->cfg.global_batch);
    mg_put_u64(p + 152, t->cfg.run_id_hash);
    mg_put_u64(p + 160, (uint64_t)epoch_position(t));
}

/* The CONFIG section: "run_id <id>" then the run's configuration lines. */
static char *config_text(const struct mg_trainer *t, size_t *len)
{
    const char *id = t->cfg.run_id ? t->cfg.run_id : "";
    const char *conf = t->cfg.run_config ? t->cfg.run_config : "";
    size_t cap = strlen(id) + strlen(conf) + 16;
    char *text = malloc(cap);
    if (!text)
        return NULL;
    int n = snprintf(text, cap, "run_id %s\n%s", id, conf);
    *len = (size_t)n < MG_RUN_CONFIG_MAX ? (size_t)n : MG_RUN_CONFIG_MAX;
    return text;
}

size_t mg_trainer_state_count(const struct mg_trainer *t)
{
    return (size_t)mg_optim_state_vectors(&t->opt.cfg) * t->model->nparams;
}

int mg_trainer_gather_state(struct mg_trainer *t)
{
    int nvec = mg_optim_state_vectors(&t->opt.cfg);
    if (!t->hooks.gather_state || !nvec)
        return 0;
    size_t room = t->hooks.shard_len * (size_t)t->cfg.world;
    if (room < t->model->nparams)
        room = t->model->nparams;
    free(t->gathered);
    t->gathered = malloc((size_t)nvec * room * sizeof(float));
    if (!t->gathered)
        return -ENOMEM;
    int rc = t->hooks.gather_state(t->hooks.ctx, t->opt.state, t->gathered, nvec);
    if (rc < 0) {
        free(t->gathered);
        t->gathered = NULL;
    }
    return rc;
}

/* What a checkpoint's sections point to: a file's (every rank's RANK
 * section, the whole optimizer state) or a snapshot's (this rank's own). */
struct sections {
    unsigned char meta[META_BYTES], ohdr[OPTIM_HDR_BYTES];
    unsigned char *tensors, *rank_blobs;
    char *config;
    struct mg_ckpt_section *secs;
    int n;
};

#define SEC_PARAMS 2 /* where sections_build puts PARAMS and the optimizer state */
#define SEC_STATE  4

static void sections_release(struct sections *s)
{
    free(s->tensors);
    free(s->rank_blobs);
    free(s->config);
    free(s->secs);
}

/* Everything but the floats: params and state are the PARAMS and OPTIM 1
 * data (NULL: room the caller fills), nstate floats of state; local says
 * that the state is this rank's own (its shard, with ZeRO: a snapshot). */
static int sections_build(const struct mg_trainer *t, const struct mg_rank_state *ranks, int nranks,
                          const float *params, const float *state, size_t nstate, int local,
                          struct sections *s)
{
    const struct mg_model *m = t->model;
    size_t config_len = 0;
    memset(s, 0, sizeof(*s));
    s->tensors = calloc((size_t)m->ntensors, MG_TENSOR_REC_BYTES);
    s->rank_blobs = calloc((size_t)nranks, MG_RANK_STATE_BYTES);
    s->secs = calloc((size_t)nranks + 6, sizeof(*s->secs));
    s->config = config_text(t, &config_len);
    if (!s->tensors || !s->rank_blobs || !s->secs || !s->config) {
        sections_release(s);
        return -ENOMEM;
    }
    pack_meta(t, s->meta);
    for (int i = 0; i < m->ntensors; i++)
        mg_model_tensor_record(&m->params[i], s->tensors + (size_t)i * MG_TENSOR_REC_BYTES);
    mg_put_u32(s->ohdr, (uint32_t)t->opt.cfg.kind);
    mg_put_u32(s->ohdr + 4, local ? 1 : 0);
    mg_put_u64(s->ohdr + 8, t->opt.steps);
    mg_put_u64(s->ohdr + 16, nstate);
    struct mg_ckpt_section *secs = s->secs;
    int n = 0;
    secs[n++] = (struct mg_ckpt_section){MG_CKPT_TAG_META, 0, META_BYTES, s->meta};
    secs[n++] = (struct mg_ckpt_section){MG_CKPT_TAG_TENSORS, 0,
                                         (uint64_t)m->ntensors * MG_TENSOR_REC_BYTES, s->tensors};
    secs[n++] = (struct mg_ckpt_section){MG_CKPT_TAG_PARAMS, 0, m->nparams * sizeof(float), params};
    /* OPTIM is its header then the state: two sections with the same tag would be
     * ambiguous, so the header goes in index 0 and the state in index 1 */
    secs[n++] = (struct mg_ckpt_section){MG_CKPT_TAG_OPTIM, 0, OPTIM_HDR_BYTES, s->ohdr};
    secs[n++] = (struct mg_ckpt_section){MG_CKPT_TAG_OPTIM, 1, nstate * sizeof(float), state};
    for (int r = 0; r < nranks; r++) {
        unsigned char *b = s->rank_blobs + (size_t)r * MG_RANK_STATE_BYTES;
        mg_rank_state_pack(&ranks[r], b);
        secs[n++] =
            (struct mg_ckpt_section){MG_CKPT_TAG_RANK, ranks[r].rank, MG_RANK_STATE_BYTES, b};
    }
    secs[n++] = (struct mg_ckpt_section){MG_CKPT_TAG_CONFIG, 0, config_len, s->config};
    s->n = n;
    return 0;
}

int mg_trainer_save(struct mg_trainer *t, const char *dir, const struct mg_rank_state *ranks,
                    int nranks, char *err)
{
    struct mg_model *m = t->model;
    struct sections sec;
    struct mg_rank_state own;
    int rc;

    if (!ranks) {
        mg_trainer_rank_state(t, &own);
        ranks = &own;
        nranks = 1;
    }
    int sharded = t->hooks.gather_state != NULL;
    float *hp = t->host_state, *hs = !sharded ? hp + m->nparams : t->gathered ? t->gathered : hp;
    size_t nstate = mg_trainer_state_count(t);
    rc = sections_build(t, ranks, nranks, hp, hs, nstate, 0, &sec);
    if (rc < 0)
        return mg_seterr(err, MG_ERRMSG_LEN, rc, "out of memory writing a checkpoint");
    mg_model_get_params(m, hp);
    if (sharded && nstate && !t->gathered) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, -EINVAL,
                       "the sharded optimizer state was not gathered for this checkpoint");
        goto out;
    }
    if (nstate && !sharded) /* a sharded state was gathered into hs */
        m->be->ops->download(m->be, hs, t->opt.state, nstate * sizeof(float));
    rc = m->be->ops->sync(m->be);
    if (rc < 0) {
        mg_seterr(err, MG_ERRMSG_LEN, rc, "cannot copy the parameters from the device: %s",
                  mg_strerror(rc));
        goto out;
    }
    struct mg_ckpt_info info = {
        /* version 1 readers read everything but a pass that began mid-epoch */
        .version = t->epoch_start ? 2 : 1,
        .step = (uint64_t)t->step,
        .nparams = m->nparams,
        .world_size = (uint32_t)t->cfg.world,
    };
    rc = mg_ckpt_write(dir, &info, sec.secs, sec.n, err);
    if (sharded) { /* the shard is all this rank keeps */
        free(t->gathered);
        t->gathered = NULL;
    }
out:
    sections_release(&sec);
    return rc;
}

/* ---- snapshots in memory -------------------------------------------------------- */

int mg_trainer_snapshot_bytes(const struct mg_trainer *t, uint64_t *bytes)
{
    struct sections sec;
    struct mg_rank_state own;
    mg_trainer_rank_state(t, &own);
    int rc = sections_build(t, &own, 1, NULL, NULL, t->opt.state_count, 1, &sec);
    if (rc < 0)
        return rc;
    *bytes = mg_ckpt_sections_bytes(sec.secs, sec.n);
    sections_release(&sec);
    return 0;
}

int mg_trainer_snapshot_pack(struct mg_trainer *t, unsigned char *buf, uint64_t cap, uint64_t *len)
{
    struct mg_model *m = t->model;
    struct sections sec;
    struct mg_rank_state own;
    uint64_t off[8];
    mg_trainer_rank_state(t, &own);
    int rc = sections_build(t, &own, 1, NULL, NULL, t->opt.state_count, 1, &sec);
    if (rc < 0)
        return rc;
    rc = mg_ckpt_sections_pack(buf, cap, sec.secs, sec.n, off, len);
    if (rc == 0) {
        /* the floats go straight from the model and the optimizer to the slot */
        mg_model_get_params(m, (float *)(void *)(buf + off[SEC_PARAMS]));
        if (t->opt.state_count)
            m->be->ops->download(m->be, buf + off[SEC_STATE], t->opt.state,
                                 t->opt.state_count * sizeof(float));
        rc = m->be->ops->sync(m->be);
    }
    sections_release(&sec);
    return rc;
}

static const struct mg_ckpt_section *need(const struct mg_ckpt_file *f, uint32_t tag,
                                          uint32_t index, uint64_t min_len, const char *path,
                                          const char *what, char *err, int *rc)
{
    const struct mg_ckpt_section *s = mg_ckpt_find(f, tag, index);
    if (!s || s->len < min_len) {
        *rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT, "'%s': %s section %s", path, what,
                        s ? "too short" : "missing");
        return NULL;
    }
    return s;
}

static int check_meta(const struct mg_trainer *t, const unsigned char *p, const char *path,
                      char *err)
{
    const struct mg_model *m = t->model;
    char name[MG_NAME_MAX + 1] = {0};
    memcpy(name, p, MG_NAME_MAX);
#define MISMATCH(what, fmt, a, b)                                                                  \
    mg_seterr(err, MG_ERRMSG_LEN, -MG_ECONFIG,                                                     \
              "'%s': written with " what " " fmt ", this run has " what " " fmt, path, a, b)
    if (strcmp(name, m->name) != 0)
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_ESHAPE,
                         "'%s': holds model '%s', this run trains '%s'", path, name, m->name);
    if (mg_get_u32(p + 104) != (uint32_t)m->ntensors)
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_ESHAPE,
                         "'%s': holds %" PRIu64
                         " parameters in %u tensors, the model has %zu in %d",
                         path, mg_get_u64(p + 96), mg_get_u32(p + 104), m->nparams, m->ntensors);
    return 0;
}

/* Everything but the model's shape (checked tensor by tensor in between). A
 * world size of its own is no mismatch: the load reshards. The batch per rank
 * may then differ only as this run's --global-batch-size makes it, when that
 * is the checkpoint's global batch too. */
static int check_config(const struct mg_trainer *t, const unsigned char *p, const char *path,
                        char *err)
{
    unsigned world = mg_get_u32(p + 72), batch = mg_get_u32(p + 76);
    if (world == 0 || batch == 0)
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT, "'%s': world size %u, batch size %u",
                         path, world, batch);
    if (batch != (uint32_t)t->cfg.batch_size && world == (uint32_t)t->cfg.world)
        return MISMATCH("batch size", "%u", batch, (unsigned)t->cfg.batch_size);
    if (world != (uint32_t)t->cfg.world) {
        uint64_t had = mg_get_u64(p + 144);
        uint64_t global = had ? had : (uint64_t)batch * world;
        char was[96];
        if (had)
            snprintf(was, sizeof(was), "--global-batch-size %" PRIu64, had);
        else
            snprintf(was, sizeof(was), "batch size %u per process x %u processes", batch, world);
        if (t->cfg.global_batch && (uint64_t)t->cfg.global_batch != global)
            return mg_seterr(err, MG_ERRMSG_LEN, -MG_ECONFIG,
                             "'%s': written with %s, a global batch of %" PRIu64
                             "; this run has --global-batch-size %ld",
                             path, was, global, t->cfg.global_batch);
        if (!t->cfg.global_batch && batch != (uint32_t)t->cfg.batch_size)
            return mg_seterr(err, MG_ERRMSG_LEN, -MG_ECONFIG,
                             "'%s': written with %s, this run has batch size %d per process: "
                             "pass --batch-size %u (the effective batch then follows the world "
                             "size) or --global-batch-size %" PRIu64 " (it stays)",
                             path, was, t->cfg.batch_size, batch, global);
    }
    if (mg_get_u32(p + 80) != (uint32_t)t->cfg.accum_steps)
        return MISMATCH("accumulation steps", "%u", mg_get_u32(p + 80),
                        (unsigned)t->cfg.accum_steps);
    if (mg_get_u32(p + 84) != (uint32_t)t->cfg.drop_last)
        return MISMATCH("drop_last", "%u", mg_get_u32(p + 84), (unsigned)t->cfg.drop_last);
    if (mg_get_u64(p + 64) != t->cfg.seed)
        return MISMATCH("seed", "%" PRIu64, mg_get_u64(p + 64), t->cfg.seed);
    if (mg_get_u64(p + 88) != (uint64_t)t->train->n)
        return MISMATCH("training samples", "%" PRIu64, mg_get_u64(p + 88), (uint64_t)t->train->n);
    if (mg_get_u32(p + 108) != (uint32_t)t->cfg.optim.kind)
        return MISMATCH("optimizer", "%s", mg_optim_name(mg_get_u32(p + 108)),
                        mg_optim_name(t->cfg.optim.kind));
#undef MISMATCH
    return 0;
}

/* The data position a checkpoint continues from (trainer.h, "Resharding"):
 * with the same world size its own pass, batch for batch; with another, a
 * pass from the position the old ranks had reached together. */
static int restore_position(struct mg_trainer *t, const struct mg_ckpt_file *f,
                            const unsigned char *meta, const char *path, char *err)
{
    struct mg_resume_info *ri = &t->resumed;
    long n = t->train->n;
    enum mg_sampler_mode mode = mg_train_mode(&t->cfg);
    long epoch = (long)mg_get_u64(meta + 40), b = (long)mg_get_u64(meta + 48);
    uint64_t start = f->info.version >= 2 ? mg_get_u64(meta + 136) : 0;
    if (start >= (uint64_t)n || epoch < 0 || b < 0)
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT,
                         "'%s': data position past the end (epoch %ld, batch %ld from position "
                         "%" PRIu64 " of %ld)",
                         path, epoch, b, start, n);
    long old_len = mg_sampler_pass_len(n, 0, ri->world, mode, (long)start);
    long old_batches = (old_len + ri->batch_size - 1) / ri->batch_size;
    long taken = b < old_batches ? b * ri->batch_size : old_len;
    ri->position = (long)start + taken * ri->world;
    ri->left = ri->position < n ? n - ri->position : 0;
    if (!ri->resharded) {
        t->epoch = epoch;
        t->epoch_start = (long)start;
        t->batch_in_epoch = b;
        t->pass_batches = pass_batches(n, t->cfg.world, mode, t->cfg.batch_size, (long)start);
        ri->epoch = epoch + (b >= t->pass_batches);
        ri->per_rank = old_len - taken;
        return 0;
    }
    long per_rank =
        b < old_batches ? mg_sampler_pass_len(n, 0, t->cfg.world, mode, ri->position) : 0;
    if (per_rank > 0) {
        t->epoch = epoch;
        t->epoch_start = ri->position;
    } else {
        /* the epoch is done (or what is left is dropped): the next one, from its start */
        t->epoch = epoch + 1;
        t->epoch_start = 0;
        ri->left = 0;
    }
    t->batch_in_epoch = 0;
    t->pass_batches = pass_batches(n, t->cfg.world, mode, t->cfg.batch_size, t->epoch_start);
    ri->epoch = t->epoch;
    ri->per_rank = per_rank;
    return 0;
}

/* This rank's dropout stream: its own from the checkpoint; after a reshard,
 * or from another rank's snapshot (peer), the stream of (seed, rank) from the
 * furthest offset any old rank reached: every rank draws as many numbers a
 * step, so that is where this rank's own stream stood too. */
static int restore_rank_state(struct mg_trainer *t, const struct mg_ckpt_file *f, const char *path,
                              int peer, char *err)
{
    struct mg_model *m = t->model;
    struct mg_rank_state rs;
    int rc = 0;
    if (!t->resumed.resharded &&
        (!peer || mg_ckpt_find(f, MG_CKPT_TAG_RANK, (uint32_t)t->cfg.rank))) {
        const struct mg_ckpt_section *s =
            need(f, MG_CKPT_TAG_RANK, (uint32_t)t->cfg.rank, 24, path, "RANK", err, &rc);
        if (!s)
            return rc;
        mg_rank_state_unpack(s->data, s->len, &rs);
        m->dropout_rng = rs.dropout;
        return 0;
    }
    uint64_t furthest = 0;
    int found = 0;
    for (int i = 0; i < f->nsections; i++) {
        const struct mg_ckpt_section *s = &f->sections[i];
        if (s->tag != MG_CKPT_TAG_RANK || mg_rank_state_unpack(s->data, s->len, &rs) < 0)
            continue;
        found = 1;
        if (rs.dropout.offset > furthest)
            furthest = rs.dropout.offset;
    }
    if (!found)
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT, "'%s': RANK section missing", path);
    m->dropout_rng.seed = mg_dropout_seed(t->cfg.seed, t->cfg.rank);
    m->dropout_rng.offset = furthest;
    return 0;
}

void mg_trainer_ckpt_bound(const struct mg_trainer *t, struct mg_ckpt_bound *b)
{
    const struct mg_model *m = t->model;
    /* every section this version writes, with the largest optimizer state
     * (AdamW: 2 floats per parameter): another optimizer's checkpoint is a
     * configuration mismatch to report, not a file to refuse unread */
    b->fixed = 8 * SECTION_BYTES + META_BYTES + (uint64_t)m->ntensors * MG_TENSOR_REC_BYTES +
               OPTIM_HDR_BYTES + 3 * (uint64_t)m->nparams * sizeof(float) + MG_RUN_CONFIG_MAX +
               FUTURE_SLACK;
    b->per_rank = SECTION_BYTES + MG_RANK_STATE_BYTES;
    b->max_world = MAX_WORLD;
}

/* The value of key in "key value" lines, or NULL. */
static const char *config_find(const char *text, size_t len, const char *key, size_t klen,
                               size_t *vlen)
{
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *eol = nl ? nl : end;
        if ((size_t)(eol - p) > klen && memcmp(p, key, klen) == 0 && p[klen] == ' ') {
            *vlen = (size_t)(eol - p) - klen - 1;
            return p + klen + 1;
        }
        p = eol + 1;
    }
    return NULL;
}

static void diff_add(char *out, size_t cap, const char *key, size_t klen, const char *was,
                     size_t wlen, const char *now, size_t nlen)
{
    size_t used = strlen(out);
    if (used + 1 >= cap)
        return;
    snprintf(out + used, cap - used, "%s%.*s %.*s (this run: %.*s)", used ? ", " : "", (int)klen,
             key, (int)wlen, was, (int)nlen, now);
}

/* What the checkpoint says differently from this run's configuration. A
 * file without CONFIG (written before it existed) has only META's base lr
 * and schedule, comparable when the world size (which --scale-lr may have
 * multiplied in) is the same. */
static void config_diff(const struct mg_trainer *t, const struct mg_ckpt_file *f,
                        const unsigned char *meta, char *out, size_t cap)
{
    out[0] = '\0';
    const struct mg_ckpt_section *s = mg_ckpt_find(f, MG_CKPT_TAG_CONFIG, 0);
    const char *mine = t->cfg.run_config;
    if (s && mine) {
        const char *p = mine;
        while (*p) {
            size_t line = strcspn(p, "\n"), klen = strcspn(p, " \n");
            size_t vlen, nlen = line > klen ? line - klen - 1 : 0;
            /* the batch is checked against META with the resharding rules */
            int skip = klen == 5 && memcmp(p, "batch", 5) == 0;
            const char *was = skip ? NULL : config_find(s->data, s->len, p, klen, &vlen);
            if (was && (vlen != nlen || memcmp(was, p + klen + 1, nlen) != 0))
                diff_add(out, cap, p, klen, was, vlen, p + klen + 1, nlen);
            p += line + (p[line] == '\n');
        }
        return;
    }
    if (s || mg_get_u32(meta + 72) != (uint32_t)t->cfg.world)
        return;
    char was[64], now[64];
    double lr;
    uint64_t bits = mg_get_u64(meta + 112);
    memcpy(&lr, &bits, 8);
    if (lr != t->cfg.sched.base_lr) {
        snprintf(was, sizeof(was), "%.9g", lr);
        snprintf(now, sizeof(now), "%.9g", t->cfg.sched.base_lr);
        diff_add(out, cap, "lr", 2, was, strlen(was), now, strlen(now));
    }
    uint32_t kind = mg_get_u32(meta + 120);
    if (kind != (uint32_t)t->cfg.sched.kind) {
        snprintf(was, sizeof(was), "%s", mg_sched_name((enum mg_sched_kind)kind));
        snprintf(now, sizeof(now), "%s", mg_sched_name(t->cfg.sched.kind));
        diff_add(out, cap, "schedule", 8, was, strlen(was), now, strlen(now));
    }
}

/* A partial read (checkpoint.h): the header promised more than a checkpoint
 * of this model holds. Another model's file is still told apart by its META
 * and TENSORS, which come first; anything else is a damaged or crafted file. */
static int check_partial(const struct mg_trainer *t, const struct mg_ckpt_file *f, const char *path,
                         char *err)
{
    struct mg_ckpt_bound b;
    mg_trainer_ckpt_bound(t, &b);
    return mg_seterr(err, MG_ERRMSG_LEN, -MG_ETOOBIG,
                     "'%s': the header says the payload inflates to %" PRIu64
                     " bytes, more than a checkpoint of this model holds (%" PRIu64 ")",
                     path, f->info.raw_bytes, b.fixed + b.per_rank * f->info.world_size);
}

/* How load_file takes what it reads: a checkpoint file's whole state, or a
 * snapshot's (this rank's own optimizer state, nothing resharded), or
 * another rank's snapshot (a peer's: the whole state of a replicated
 * optimizer, resharded as a file when the world size changed), only checked
 * or applied too. */
enum load_mode {
    LOAD_FILE,
    LOAD_SNAP_CHECK,
    LOAD_SNAP_APPLY,
    LOAD_PEER_CHECK,
    LOAD_PEER_APPLY,
    LOAD_GATHERED_CHECK, /* a peer's snapshot, and the whole optimizer state beside it */
    LOAD_GATHERED_APPLY
};

/* A snapshot continues this very run at its world size: anything else is
 * the disk checkpoint's to resume (with its reshard and messages). */
static int check_snapshot(const struct mg_trainer *t, const unsigned char *meta,
                          const unsigned char *oh, const char *path, int peer, int gathered,
                          char *err)
{
    const struct mg_resume_info *ri = &t->resumed;
    if (peer && !gathered && t->hooks.shard_state)
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_ECONFIG,
                         "%s: another rank's, and a ZeRO-1 shard is its own rank's only", path);
    if (!peer && ri->world != t->cfg.world)
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_ECONFIG,
                         "%s: written by a run of world size %d, this one has %d", path, ri->world,
                         t->cfg.world);
    if (mg_get_u64(meta + 152) != t->cfg.run_id_hash)
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_ECONFIG,
                         "%s: written by another run (id hash %016" PRIx64
                         ", this run's %016" PRIx64 ")",
                         path, mg_get_u64(meta + 152), t->cfg.run_id_hash);
    if (ri->config_diff[0])
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_ECONFIG, "%s: written with %s", path,
                         ri->config_diff);
    if (mg_get_u32(oh + 4) != 1)
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT, "%s: holds no rank's own optimizer state",
                         path);
    return 0;
}

static int load_file(struct mg_trainer *t, const struct mg_ckpt_file *f, const char *path,
                     enum load_mode mode, const float *full, char *err)
{
    struct mg_model *m = t->model;
    const struct mg_ckpt_section *s;
    int rc = 0;
    s = need(f, MG_CKPT_TAG_META, 0, META_BYTES, path, "META", err, &rc);
    if (!s)
        return f->partial ? check_partial(t, f, path, err) : rc;
    const unsigned char *meta = s->data;
    rc = check_meta(t, meta, path, err);
    if (rc < 0)
        return rc;
    s = need(f, MG_CKPT_TAG_TENSORS, 0, (uint64_t)m->ntensors * MG_TENSOR_REC_BYTES, path,
             "TENSORS", err, &rc);
    if (!s)
        return f->partial ? check_partial(t, f, path, err) : rc;
    for (int i = 0; i < m->ntensors; i++) {
        const unsigned char *r = (const unsigned char *)s->data + (size_t)i * MG_TENSOR_REC_BYTES;
        struct mg_tensor c = {0};
        const struct mg_tensor *x = &m->params[i];
        memcpy(c.name, r, MG_NAME_MAX - 1);
        c.ndim = (int)mg_get_u32(r + MG_NAME_MAX);
        int same = strcmp(c.name, x->name) == 0 && c.ndim == x->ndim;
        for (int d = 0; d < MG_MAX_DIMS && d < c.ndim; d++) {
            c.shape[d] = (int)mg_get_u32(r + MG_NAME_MAX + 4 + 4 * d);
            same = same && d < x->ndim && c.shape[d] == x->shape[d];
        }
        if (!same) {
            char a[64], b[64];
            c.ndim = c.ndim > MG_MAX_DIMS ? MG_MAX_DIMS : c.ndim;
            mg_tensor_shape_str(&c, a, sizeof(a));
            mg_tensor_shape_str(x, b, sizeof(b));
            return mg_seterr(err, MG_ERRMSG_LEN, -MG_ESHAPE,
                             "'%s': model shape mismatch: tensor %d is %s %s in the checkpoint, %s "
                             "%s in the model",
                             path, i, c.name, a, x->name, b);
        }
    }
    if (f->partial)
        return check_partial(t, f, path, err);
    rc = check_config(t, meta, path, err);
    if (rc < 0)
        return rc;
    const struct mg_ckpt_section *params =
        need(f, MG_CKPT_TAG_PARAMS, 0, m->nparams * sizeof(float), path, "PARAMS", err, &rc);
    if (!params)
        return rc;
    s = need(f, MG_CKPT_TAG_OPTIM, 0, OPTIM_HDR_BYTES, path, "OPTIM", err, &rc);
    if (!s)
        return rc;
    const unsigned char *oh = s->data;
    int gathered = mode == LOAD_GATHERED_CHECK || mode == LOAD_GATHERED_APPLY;
    int peer = mode == LOAD_PEER_CHECK || mode == LOAD_PEER_APPLY || gathered;
    int check_only =
        mode == LOAD_SNAP_CHECK || mode == LOAD_PEER_CHECK || mode == LOAD_GATHERED_CHECK;
    int own = mode == LOAD_SNAP_CHECK || mode == LOAD_SNAP_APPLY; /* this rank's own state */
    size_t nstate = mode == LOAD_FILE || gathered ? mg_trainer_state_count(t) : t->opt.state_count;
    /* gathered: the snapshot's own state is its shard; the whole one is beside it */
    if (!gathered && mg_get_u64(oh + 16) != nstate)
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_ECONFIG,
                         "'%s': optimizer state has %" PRIu64 " values, this optimizer needs %zu "
                         "(different momentum setting?)",
                         path, mg_get_u64(oh + 16), nstate);
    const struct mg_ckpt_section *ostate =
        gathered ? NULL
                 : need(f, MG_CKPT_TAG_OPTIM, 1, nstate * sizeof(float), path, "optimizer state",
                        err, &rc);
    if (!gathered && !ostate)
        return rc;
    const void *state = gathered ? (const void *)full : ostate->data;

    struct mg_resume_info *ri = &t->resumed;
    uint64_t lr_bits = mg_get_u64(meta + 112);
    memset(ri, 0, sizeof(*ri));
    ri->world = (int)mg_get_u32(meta + 72);
    ri->batch_size = (int)mg_get_u32(meta + 76);
    ri->accum_steps = (int)mg_get_u32(meta + 80);
    ri->global_batch = (long)mg_get_u64(meta + 144);
    memcpy(&ri->lr, &lr_bits, 8);
    ri->run_id_hash = mg_get_u64(meta + 152);
    ri->resharded = ri->world != t->cfg.world;
    config_diff(t, f, meta, ri->config_diff, sizeof(ri->config_diff));
    const struct mg_ckpt_section *cs = mg_ckpt_find(f, MG_CKPT_TAG_CONFIG, 0);
    ri->has_config = cs != NULL;
    size_t idlen = 0;
    const char *id = cs ? config_find(cs->data, cs->len, "run_id", 6, &idlen) : NULL;
    if (id && idlen <= MG_CKPT_RUN_ID_MAX)
        mg_fmt(ri->run_id, sizeof(ri->run_id), "%.*s", (int)idlen, id);
    if (mode != LOAD_FILE && (rc = check_snapshot(t, meta, oh, path, peer, gathered, err)) < 0) {
        t->resumed.loaded = 0;
        return rc;
    }
    /* everything is checked before anything changes: a refused file leaves the trainer as it was */
    struct mg_trainer before = *t;
    rc = restore_position(t, f, meta, path, err);
    if (rc == 0)
        rc = restore_rank_state(t, f, path, peer, err);
    if (rc < 0 || check_only) {
        *t = before;
        t->resumed.loaded = 0;
        return rc;
    }
    mg_model_set_params(m, params->data);
    if (own) /* this rank's own state (its shard with ZeRO) as it was */
        m->be->ops->upload(m->be, t->opt.state, state, nstate * sizeof(float));
    else if (nstate && t->hooks.shard_state) /* a sharded optimizer takes its shard */
        t->hooks.shard_state(t->hooks.ctx, state, t->opt.state,
                             mg_optim_state_vectors(&t->opt.cfg));
    else if (nstate)
        m->be->ops->upload(m->be, t->opt.state, state, nstate * sizeof(float));
    /* with ZeRO, ranks compare the whole state they read: a snapshot's shards
     * differ by design (each was checked against its own hash) */
    ri->state_hash = own && t->hooks.shard_state ? 0 : mg_hash64(state, nstate * sizeof(float));
    t->opt.steps = mg_get_u64(oh + 8);
    t->step = (long)mg_get_u64(meta + 32);
    t->samples_seen = mg_get_u64(meta + 56);
    ri->loaded = 1;
    mg_model_zero_grad(m);
    return m->be->ops->sync(m->be);
}

int mg_trainer_load(struct mg_trainer *t, const char *path, char *err)
{
    struct mg_ckpt_file f;
    struct mg_ckpt_bound b;
    mg_trainer_ckpt_bound(t, &b);
    int rc = mg_ckpt_read_bounded(path, &b, &f, err);
    if (rc < 0)
        return rc;
    rc = load_file(t, &f, path, LOAD_FILE, NULL, err);
    mg_ckpt_file_release(&f);
    return rc;
}

static int is_corruption(int rc)
{
    return rc == -MG_EFORMAT || rc == -MG_ETRUNC || rc == -MG_ECRC || rc == -MG_EVERSION ||
           rc == -MG_ETOOBIG || rc == -ENOENT || rc == -EIO;
}

int mg_trainer_resume_latest(struct mg_trainer *t, const char *dir, const struct mg_ckpt_owner *own,
                             struct mg_resume_report *rep, char *err)
{
    struct mg_ckpt_entry *list = calloc(MG_CKPT_MAX_LIST, sizeof(*list));
    int rc, last = 0;
    memset(rep, 0, sizeof(*rep));
    if (!list)
        return mg_seterr(err, MG_ERRMSG_LEN, -ENOMEM, "out of memory");
    int n = mg_ckpt_list_runs(dir, own, list, MG_CKPT_MAX_LIST);
    if (n < 0) {
        rc = mg_seterr(err, MG_ERRMSG_LEN, n, "cannot list checkpoint directory '%s': %s", dir,
                       mg_strerror(n));
        goto out;
    }
    for (int i = 0; i < n; i++) {
        char path[MG_CKPT_PATH_MAX], msg[MG_ERRMSG_LEN];
        mg_ckpt_path(dir, list[i].step, path, sizeof(path));
        rc = mg_trainer_load(t, path, msg);
        if (rc == 0) {
            rep->found = 1;
            rep->step = list[i].step;
            snprintf(rep->path, sizeof(rep->path), "%s", path);
            goto out;
        }
        if (!is_corruption(rc)) {
            mg_seterr(err, MG_ERRMSG_LEN, rc, "%s", msg);
            goto out;
        }
        if (rep->nskipped < MG_RESUME_MAX_SKIPPED)
            memcpy(rep->skipped[rep->nskipped++], msg, sizeof(msg));
        last = rc;
    }
    rc = n > 0
             ? mg_seterr(err, MG_ERRMSG_LEN, last,
                         "no intact checkpoint in '%s' (newest problem: %s)", dir, rep->skipped[0])
             : 0;
out:
    free(list);
    return rc;
}

int mg_trainer_snapshot_load(struct mg_trainer *t, const struct mg_ckpt_file *f, const char *what,
                             int apply, char *err)
{
    return load_file(t, f, what, apply ? LOAD_SNAP_APPLY : LOAD_SNAP_CHECK, NULL, err);
}

int mg_trainer_snapshot_load_peer(struct mg_trainer *t, const struct mg_ckpt_file *f,
                                  const char *what, int apply, char *err)
{
    return load_file(t, f, what, apply ? LOAD_PEER_APPLY : LOAD_PEER_CHECK, NULL, err);
}

int mg_trainer_snapshot_load_gathered(struct mg_trainer *t, const struct mg_ckpt_file *f,
                                      const float *full, const char *what, int apply, char *err)
{
    return load_file(t, f, what, apply ? LOAD_GATHERED_APPLY : LOAD_GATHERED_CHECK, full, err);
}
