/* DDP's gradient buckets: slices of the flat gradient buffer cut at layer
 * boundaries from its end, the first one small, none over the cap unless one
 * layer is, and with several ranks every cut moved up to a multiple of 16 x
 * world floats; the averaging of buckets by the communication thread as
 * backward reports layers ready, checked with two and three forked ranks,
 * with the gradients in registered memory (zero-copy) and without; and
 * ZeRO-1: the shards cover the parameters once, the sharded update (SGD with
 * momentum, AdamW) leaves every rank with exactly the parameters of a whole
 * update, and the whole optimizer state gathered from the shards is the
 * whole update's, and shards back exactly; a shard put back by the layout
 * of its world size alone (mg_ddp_unshard) lands where the gathered state
 * has it.
 * timeout: 120 */
#include "tap.h"
#include "comm_internal.h"
#include "ddp.h"
#include "mg_err.h"
#include "models.h"
#include "net.h"
#include "shm_comm.h"

#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>

static int layer_start(const struct mg_model *m, size_t off)
{
    if (off == 0)
        return 1;
    for (int i = 0; i < m->nlayers; i++)
        if (m->layers[i].param_count && m->layers[i].param_offset == off)
            return 1;
    return 0;
}

static void check_plan(struct mg_model *m, struct mg_comm *c, size_t cap, size_t first,
                       const char *what)
{
    struct mg_ddp *d;
    char err[256];
    struct mg_ddp_opts o = {.bucket_cap = cap, .first_bucket = first};
    is_int(mg_ddp_create(&d, c, m, &o, err, sizeof(err)), 0, "%s: created", what);
    const struct mg_ddp_bucket *b;
    int nb = mg_ddp_buckets(d, &b);
    size_t end = m->nparams;
    int ok_cover = 1, ok_layers = 1, ok_cap = 1;
    for (int k = 0; k < nb; k++) {
        if (b[k].offset + b[k].count != end)
            ok_cover = 0;
        end = b[k].offset;
        if (!layer_start(m, b[k].offset))
            ok_layers = 0;
        size_t limit = (k == 0 ? first : cap) / sizeof(float);
        /* over the cap only by the layer that crossed it */
        for (int i = 0; i < m->nlayers; i++) {
            const struct mg_layer *l = &m->layers[i];
            if (l->param_count && l->param_offset == b[k].offset &&
                b[k].count - l->param_count >= limit && k != nb - 1)
                ok_cap = 0;
        }
    }
    ok(ok_cover && end == 0, "%s: %d buckets cover the buffer back to front", what, nb);
    ok(ok_layers, "%s: buckets start at layer boundaries", what);
    ok(ok_cap, "%s: no bucket goes on past its cap", what);
    diag("%s: %d buckets, first %zu floats", what, nb, nb ? b[0].count : 0);
    mg_ddp_release(d);
}

/* The buckets of a world-size job: multiples of 16 x world floats, covering
 * the parameters and the padding to the next multiple, each starting at most
 * one multiple above a layer boundary. */
static int aligned_plan(const struct mg_ddp *d, const struct mg_model *m, int world)
{
    const struct mg_ddp_bucket *b;
    int nb = mg_ddp_buckets(d, &b);
    size_t a = 16 * (size_t)world, end = mg_ddp_padded_len(d);
    if (end % a || end < m->nparams || end - m->nparams >= a)
        return 0;
    for (int k = 0; k < nb; k++) {
        if (b[k].count % a || b[k].offset + b[k].count != end || !b[k].count)
            return 0;
        int near = 0;
        for (int i = 0; i < m->nlayers; i++)
            if (m->layers[i].param_count && b[k].offset >= m->layers[i].param_offset &&
                b[k].offset - m->layers[i].param_offset < a)
                near = 1;
        if (!near && b[k].offset != 0)
            return 0;
        end = b[k].offset;
    }
    return end == 0;
}

/* The gradients every rank gives in step `step` (rank r's element i). */
static float fake_grad(int rank, size_t i, int step)
{
    return (float)(rank + 1) * (float)((i * 7 + (size_t)step) % 1000) * 1e-3f - 0.3f;
}

/* ZeRO-1 over world forked ranks: three steps of the sharded update through
 * the hooks, against the same steps of a whole optimizer computed locally from
 * the averaged gradients (the same rank-order sums); then the whole state
 * gathered from the shards, and sharded back. Exit status 0 or the failed
 * check. */
static int zero_main(int rank, int world, const char *shm_name, struct mg_model *m, int threaded,
                     enum mg_optim_kind kind)
{
    struct mg_comm *c = shm_comm_join(rank, world, shm_name, 1);
    if (!c)
        return 10;
    struct mg_ddp *d;
    char err[256];
    struct mg_ddp_opts o = {
        .bucket_cap = 64 << 10, .first_bucket = 16 << 10, .no_thread = !threaded, .zero = 1};
    if (mg_ddp_create(&d, c, m, &o, err, sizeof(err)))
        return 11;
    if (!aligned_plan(d, m, world))
        return 12;
    const struct mg_ddp_bucket *runs, *b;
    size_t len, covered = 0;
    int nr = mg_ddp_shard(d, &runs, &len), nb = mg_ddp_buckets(d, &b);
    if (nr != nb || len * (size_t)world != mg_ddp_padded_len(d))
        return 13;
    for (int k = 0; k < nr; k++) {
        size_t chunk = b[k].count / (size_t)world;
        if (runs[k].offset != b[k].offset + (size_t)rank * chunk || runs[k].count > chunk)
            return 14;
        covered += runs[k].count;
    }
    /* every parameter in exactly one rank's shard */
    size_t total = 0;
    size_t all[4];
    if (mg_comm_allgather(c, &covered, all, sizeof(covered), 5000))
        return 15;
    for (int q = 0; q < world; q++)
        total += all[q];
    if (total != m->nparams)
        return 16;

    struct mg_train_hooks h;
    mg_ddp_hooks(d, &h);
    if (h.shard_len != len || !h.begin_update || !h.gather_state || !h.shard_state)
        return 17;
    struct mg_optim_config cfg;
    mg_optim_defaults(&cfg, kind);
    cfg.momentum = kind == MG_OPTIM_SGD ? 0.9 : 0.0;
    cfg.weight_decay = 0.01;
    struct mg_optim shard, whole;
    if (mg_optim_init(&shard, m->be, &cfg, len) || mg_optim_init(&whole, m->be, &cfg, m->nparams))
        return 18;
    for (size_t i = 0; i < m->nparams; i++)
        m->param_buf[i] = (float)(i % 17) * 0.01f - 0.05f;
    float *ref = malloc(m->nparams * sizeof(float)), *avg = malloc(m->nparams * sizeof(float));
    memcpy(ref, m->param_buf, m->nparams * sizeof(float));
    if (h.broadcast_params(h.ctx, m->param_buf, m->nparams))
        return 19;
    for (int step = 0; step < 3; step++) {
        double lr = 0.1 / (step + 1);
        if (h.begin_update(h.ctx, &shard, lr))
            return 20;
        for (size_t i = 0; i < m->nparams; i++) {
            m->grad_buf[i] = fake_grad(rank, i, step);
            float sum = fake_grad(0, i, step);
            for (int q = 1; q < world; q++)
                sum += fake_grad(q, i, step);
            avg[i] = sum / (float)world;
        }
        for (int i = m->nlayers - 1; i >= 0; i--)
            if (m->layers[i].param_count &&
                h.grad_ready(h.ctx, m->grad_buf, m->layers[i].param_offset,
                             m->layers[i].param_count))
                return 21;
        if (h.reduce_grads(h.ctx, m->grad_buf, m->nparams))
            return 22;
        shard.steps++;
        mg_optim_step(&whole, ref, avg, lr);
        if (memcmp(ref, m->param_buf, m->nparams * sizeof(float)) != 0)
            return 23; /* the whole update's bits, on every rank */
    }
    int nvec = mg_optim_state_vectors(&cfg);
    /* room for the padded length, as the hook asks */
    float *full = calloc(2 * len * (size_t)world, sizeof(float));
    float *back = calloc(2 * len, sizeof(float));
    if (h.gather_state(h.ctx, shard.state, full, nvec))
        return 24;
    if (memcmp(full, whole.state, (size_t)nvec * m->nparams * sizeof(float)) != 0)
        return 25; /* the gathered state is the whole optimizer's */
    h.shard_state(h.ctx, full, back, nvec);
    if (memcmp(back, shard.state, (size_t)nvec * len * sizeof(float)) != 0)
        return 26;
    /* the layout computed for this world size without the communicator (a
     * snapshot's shard read after a node loss) is this one: the shard lands
     * where the gathered state has it */
    if (mg_ddp_shard_len_at(m, &o, world) != len)
        return 29;
    float *put = calloc((size_t)nvec * m->nparams, sizeof(float));
    if (!put || mg_ddp_unshard(m, &o, world, rank, shard.state, len, put, nvec) != 0)
        return 30;
    if (mg_ddp_unshard(m, &o, world, rank, shard.state, len + 1, put, nvec) != -MG_EFORMAT)
        return 31; /* a shard of another length is refused */
    for (int v = 0; v < nvec; v++)
        for (int k = 0; k < nr; k++)
            if (memcmp(put + (size_t)v * m->nparams + runs[k].offset,
                       full + (size_t)v * m->nparams + runs[k].offset,
                       runs[k].count * sizeof(float)) != 0)
                return 32;
    free(put);
    if (mg_ddp_check_replicas(d, 3) != 0)
        return 27;
    float *trained = malloc(m->nparams * sizeof(float));
    memcpy(trained, m->param_buf, m->nparams * sizeof(float));
    float *regp = m->param_buf;
    mg_ddp_release(d);
    if (m->param_buf == regp || memcmp(trained, m->param_buf, m->nparams * sizeof(float)))
        return 28; /* the model has its own buffer back, with the trained weights */
    mg_optim_release(&shard);
    mg_optim_release(&whole);
    mg_comm_release(c);
    free(ref);
    free(avg);
    free(full);
    free(back);
    free(trained);
    return 0;
}

/* Two ranks average gradients through the hooks: grad_ready in reverse layer
 * order, then reduce_grads; every element must be the mean, on both ranks.
 * With zerocopy the gradients move to registered memory at the start
 * (broadcast_params) and the large buckets are zero-copy; the model gets a
 * buffer of its own back at release, with the gradients. */
static int rank_main(int rank, const char *shm_name, struct mg_model *m, int threaded, int zerocopy)
{
    struct mg_comm *c = shm_comm_join(rank, 2, shm_name, zerocopy);
    if (!c)
        return 10;
    struct mg_ddp *d;
    char err[256];
    struct mg_ddp_opts o = {
        .bucket_cap = 64 << 10, .first_bucket = 16 << 10, .no_thread = !threaded};
    if (mg_ddp_create(&d, c, m, &o, err, sizeof(err)))
        return 12;
    if (!aligned_plan(d, m, 2))
        return 17;
    struct mg_train_hooks h;
    mg_ddp_hooks(d, &h);
    if (h.begin_update || h.shard_len)
        return 18; /* no sharding without zero */
    float *own = m->grad_buf;
    if (h.broadcast_params(h.ctx, m->param_buf, m->nparams))
        return 15;
    if (m->grad_buf == own || m->grads[0].data != m->grad_buf + m->params[0].offset)
        return 16; /* registered memory (ordinary memory without zero-copy) replaces it */
    int bad = 0;
    for (int step = 0; step < 3; step++) {
        for (size_t i = 0; i < m->nparams; i++)
            m->grad_buf[i] = (float)(rank + 1) * (float)(i % 1000) + (float)step;
        for (int i = m->nlayers - 1; i >= 0; i--)
            if (m->layers[i].param_count &&
                h.grad_ready(h.ctx, m->grad_buf, m->layers[i].param_offset,
                             m->layers[i].param_count))
                return 13;
        if (h.reduce_grads(h.ctx, m->grad_buf, m->nparams))
            return 14;
        for (size_t i = 0; i < m->nparams; i++) {
            float want = ((1.0f * (float)(i % 1000) + (float)step) +
                          (2.0f * (float)(i % 1000) + (float)step)) /
                         2.0f;
            if (m->grad_buf[i] != want)
                bad = 1;
        }
    }
    double sums[2] = {rank + 1.0, 10.0 * rank};
    if (h.reduce_sums(h.ctx, sums, 2) || sums[0] != 3.0 || sums[1] != 10.0)
        bad = 1;
    if (mg_ddp_check_replicas(d, 1) != 0)
        bad = 1; /* identical so far */
    m->param_buf[7] += (float)rank;
    if (mg_ddp_check_replicas(d, 2) != -MG_EDIVERGED ||
        !strstr(mg_ddp_errmsg(d), "replicas diverged at step 2: rank 1's parameters"))
        bad = 1; /* rank 1 now differs: both ranks must say so */
    if ((c->zerocopy > 0) != zerocopy)
        bad = 1;
    float *reg = m->grad_buf, last = m->grad_buf[m->nparams - 1];
    mg_ddp_release(d);
    if (!m->grad_buf || m->grad_buf == reg ||
        m->grads[0].data != m->grad_buf + m->params[0].offset ||
        m->grad_buf[m->nparams - 1] != last)
        bad = 1;
    mg_comm_release(c);
    return bad;
}

int main(void)
{
    struct mg_backend *be;
    struct mg_model mlp, cnn;
    char err[MG_ERRMSG_LEN];
    if (mg_backend_create(MG_DEVICE_CPU, NULL, &be) < 0)
        BAIL_OUT("no cpu backend");
    struct mg_model_options mo = {0};
    if (mg_model_create(&mlp, be, "mlp", &mo, 8, err) < 0 ||
        mg_model_create(&cnn, be, "cnn", &mo, 8, err) < 0)
        BAIL_OUT("models: %s", err);
    struct mg_comm *one;
    mg_comm_single_create(&one);
    check_plan(&mlp, one, 25u << 20, 1u << 20, "mlp, defaults");
    check_plan(&cnn, one, 25u << 20, 1u << 20, "cnn, defaults");
    check_plan(&cnn, one, 100u << 10, 10u << 10, "cnn, 100 KiB buckets");
    check_plan(&cnn, one, 4, 4, "cnn, a bucket per layer");
    mg_comm_release(one);

    for (int run = 0; run < 4; run++) {
        int threaded = run & 1, zerocopy = run >> 1;
        char name[64];
        snprintf(name, sizeof(name), "/mg-test-ddp-%d", (int)getpid());
        fflush(stdout);
        pid_t pids[2];
        for (int r = 0; r < 2; r++) {
            pids[r] = fork();
            if (pids[r] == 0) {
                alarm(50);
                _exit(rank_main(r, name, &cnn, threaded, zerocopy));
            }
        }
        for (int r = 0; r < 2; r++) {
            int st;
            waitpid(pids[r], &st, 0);
            ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
               "%s, %s: rank %d: buckets averaged, sums reduced, divergence seen (status %d)",
               threaded ? "communication thread" : "no thread",
               zerocopy ? "registered gradients" : "ordinary memory", r, st);
        }
        mg_shm_unlink(name);
    }

    /* ZeRO-1: 2 to 4 ranks, both optimizers, with and without the thread */
    for (int run = 0; run < 6; run++) {
        int world = 2 + run % 3, threaded = run < 3;
        enum mg_optim_kind kind = run % 2 ? MG_OPTIM_ADAMW : MG_OPTIM_SGD;
        struct mg_model *m = run % 2 ? &mlp : &cnn;
        char name[64];
        snprintf(name, sizeof(name), "/mg-test-zero-%d", (int)getpid());
        fflush(stdout);
        pid_t pids[4];
        for (int r = 0; r < world; r++) {
            pids[r] = fork();
            if (pids[r] == 0) {
                alarm(100);
                _exit(zero_main(r, world, name, m, threaded, kind));
            }
        }
        for (int r = 0; r < world; r++) {
            int st;
            waitpid(pids[r], &st, 0);
            ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
               "ZeRO-1, %d ranks, %s, %s, %s: rank %d: shards cover the parameters once, the "
               "sharded update gives the whole update's bits, the state gathers and shards back "
               "(status %d)",
               world, m == &cnn ? "cnn" : "mlp", kind == MG_OPTIM_ADAMW ? "adamw" : "sgd",
               threaded ? "communication thread" : "no thread", r,
               WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        }
        mg_shm_unlink(name);
    }
    struct mg_ddp *dz;
    mg_comm_single_create(&one);
    struct mg_ddp_opts zo = {.zero = 1};
    is_int(mg_ddp_create(&dz, one, &mlp, &zo, err, sizeof(err)), 0, "ZeRO-1 on one rank");
    const struct mg_ddp_bucket *runs;
    size_t zlen;
    ok(mg_ddp_shard(dz, &runs, &zlen) >= 1 && zlen == mlp.nparams,
       "one rank's shard is every parameter");
    mg_ddp_release(dz);
    mg_comm_release(one);
    mg_model_release(&mlp);
    mg_model_release(&cnn);
    mg_backend_release(be);
    return done_testing();
}
