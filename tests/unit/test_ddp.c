/* DDP's gradient buckets: slices of the flat gradient buffer cut at layer
 * boundaries from its end, the first one small, none over the cap unless one
 * layer is; and the averaging of buckets by the communication thread as
 * backward reports layers ready, checked with two forked ranks, with the
 * gradients in registered memory (zero-copy) and without.
 * timeout: 60 */
#include "tap.h"
#include "comm_internal.h"
#include "ddp.h"
#include "mg_err.h"
#include "models.h"
#include "net.h"

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

/* Two ranks average gradients through the hooks: grad_ready in reverse layer
 * order, then reduce_grads; every element must be the mean, on both ranks.
 * With zerocopy the gradients move to registered memory at the start
 * (broadcast_params) and the large buckets are zero-copy; the model gets its
 * own buffer back at release. */
static int rank_main(int rank, const char *shm_name, struct mg_model *m, int threaded, int zerocopy)
{
    int ranks[2] = {0, 1}, host_of[2] = {0, 0};
    struct mg_shm_cfg cfg = {.nlocal = 2, .local_rank = rank, .ranks = ranks, .spin_us = -1};
    struct mg_shm *g = NULL;
    struct mg_fault f;
    int rc;
    if (rank == 0)
        rc = mg_shm_create(&g, shm_name, 7, &cfg);
    else
        while ((rc = mg_shm_attach(&g, shm_name, 7, &cfg)) == -ENOENT || rc == -MG_EFORMAT)
            usleep(1000);
    if (rc || mg_shm_wait_attached(g, mg_now_ms() + 10000, &f))
        return 10;
    if (rank == 0)
        mg_shm_unlink(shm_name);
    struct mg_comm *c;
    struct mg_cpu_parts parts = {
        .rank = rank, .world = 2, .host_of = host_of, .shm = g, .no_zerocopy = !zerocopy};
    if (mg_comm_cpu_assemble(&c, &parts))
        return 11;
    struct mg_ddp *d;
    char err[256];
    struct mg_ddp_opts o = {
        .bucket_cap = 64 << 10, .first_bucket = 16 << 10, .no_thread = !threaded};
    if (mg_ddp_create(&d, c, m, &o, err, sizeof(err)))
        return 12;
    struct mg_train_hooks h;
    mg_ddp_hooks(d, &h);
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
    mg_ddp_release(d);
    if (m->grad_buf != own || m->grads[0].data != own + m->params[0].offset)
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
    mg_model_release(&mlp);
    mg_model_release(&cnn);
    mg_backend_release(be);
    return done_testing();
}
