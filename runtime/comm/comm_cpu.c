/* The CPU communication backend: the collectives of a job laid out on hosts,
 * composed from the shared-memory group (comm_shm.c) and the TCP ring
 * (comm_ring.c). comm_cpu_boot.c finds the layout through the store and builds
 * the pieces; mg_comm_cpu_assemble puts them together.
 *
 *   one host, several ranks             shared memory
 *   one rank per host, or MG_COMM=tcp   a TCP ring over all ranks
 *   several hosts with several ranks    hierarchical: shared memory within each
 *                                       host, a TCP ring among the host leaders
 *                                       (the lowest rank of each host), then
 *                                       shared memory again
 *
 * The hierarchical allreduce sums within each host in rank order into the
 * host's leader (a reduce, not an allreduce: the others need no copy yet),
 * then around the ring of leaders; the leader divides (avg) and broadcasts to
 * its host: the bits are the same on every rank and fixed for a given layout.
 *
 * Registered memory (mem_alloc) comes from the shared memory segment when the
 * job is on one host, so allreduces on it are zero-copy (comm_shm_coll.c); in the
 * other layouts, and with MG_COMM_ZEROCOPY=0, it is ordinary memory. */
#include "comm.h"
#include "comm_internal.h"
#include "mg_err.h"
#include "net.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- failures ---------------------------------------------------------------------- */

static void format_seconds(int ms, char *buf, size_t len)
{
    if (ms % 1000 == 0)
        snprintf(buf, len, "%d s", ms / 1000);
    else
        snprintf(buf, len, "%.3g s", ms / 1000.0);
}

int mg_cpu_fail(struct cpu_comm *cc, const struct mg_opdesc *d, const struct mg_fault *f,
                int timeout_ms)
{
    struct mg_comm *c = &cc->base;
    char what[96], theirs[96], secs[32];
    mg_opdesc_text(d, what, sizeof(what));
    switch (f->kind) {
    case MG_FAULT_TIMEOUT:
        format_seconds(timeout_ms, secs, sizeof(secs));
        snprintf(c->errmsg, sizeof(c->errmsg), "%s: timed out after %s waiting for rank %d", what,
                 secs, f->peer);
        break;
    case MG_FAULT_DIED:
        snprintf(c->errmsg, sizeof(c->errmsg),
                 "%s: rank %d (pid %d) exited while this rank waited for it", what, f->peer,
                 f->pid);
        break;
    case MG_FAULT_CLOSED:
        snprintf(c->errmsg, sizeof(c->errmsg),
                 "%s: rank %d closed its connection (it exited or failed)", what, f->peer);
        break;
    case MG_FAULT_MISMATCH:
        mg_opdesc_text(&f->theirs, theirs, sizeof(theirs));
        snprintf(c->errmsg, sizeof(c->errmsg),
                 "%s: rank %d called %s instead (ranks must call the same collectives in the "
                 "same order)",
                 what, f->peer, theirs);
        break;
    case MG_FAULT_IO:
        snprintf(c->errmsg, sizeof(c->errmsg), "%s: connection with rank %d failed: %s", what,
                 f->peer, mg_strerror(f->err));
        break;
    case MG_FAULT_ABORTED:
        switch (f->orig_kind) {
        case MG_FAULT_TIMEOUT:
            snprintf(theirs, sizeof(theirs), "rank %d timed out waiting for rank %d", f->origin,
                     f->peer);
            break;
        case MG_FAULT_DIED:
            snprintf(theirs, sizeof(theirs), "rank %d (pid %d) exited", f->peer, f->pid);
            break;
        case MG_FAULT_CLOSED:
            snprintf(theirs, sizeof(theirs), "rank %d lost its connection to rank %d", f->origin,
                     f->peer);
            break;
        case MG_FAULT_MISMATCH:
            snprintf(theirs, sizeof(theirs), "rank %d found rank %d calling another collective",
                     f->origin, f->peer);
            break;
        default:
            snprintf(theirs, sizeof(theirs), "rank %d failed", f->origin);
            break;
        }
        snprintf(c->errmsg, sizeof(c->errmsg), "%s: stopped because %s", what, theirs);
        break;
    default:
        snprintf(c->errmsg, sizeof(c->errmsg), "%s: %s", what, mg_strerror(f->err));
        break;
    }
    c->failed = 1;
    c->failed_code = mg_fault_code(f);
    /* Make the others fail now rather than at their timeouts. */
    if (cc->shm)
        mg_shm_abort(cc->shm, f);
    if (cc->ring)
        mg_ring_abort(cc->ring);
    return c->failed_code;
}

/* ---- collectives --------------------------------------------------------------------- */

int64_t mg_cpu_deadline(int timeout_ms)
{
    return timeout_ms < 0 ? -1 : mg_now_ms() + timeout_ms;
}

static int cpu_allreduce(struct mg_comm *c, float *buf, size_t count, enum mg_reduce_op op,
                         int timeout_ms)
{
    struct cpu_comm *cc = (struct cpu_comm *)c;
    struct mg_opdesc d = {.kind = op == MG_REDUCE_AVG ? MG_OP_ALLREDUCE_AVG : MG_OP_ALLREDUCE_SUM,
                          .root = -1,
                          .len = (uint64_t)count * sizeof(float)};
    struct mg_fault f = {0};
    int64_t deadline = mg_cpu_deadline(timeout_ms);
    int div = op == MG_REDUCE_AVG ? c->world : 1, rc = 0;

    switch (cc->layout) {
    case L_SHM:
        rc = mg_shm_allreduce(cc->shm, buf, count, div, &d, deadline, &f);
        c->zerocopy = mg_shm_zerocopy_count(cc->shm);
        break;
    case L_RING:
        rc = mg_ring_allreduce(cc->ring, buf, count, div, &d, deadline, &f);
        break;
    case L_HIER:
        if (cc->shm)
            rc = mg_shm_reduce(cc->shm, buf, count, 0, &d, deadline, &f);
        if (!rc && cc->ring)
            rc = mg_ring_allreduce(cc->ring, buf, count, div, &d, deadline, &f);
        if (!rc && cc->shm)
            rc = mg_shm_broadcast(cc->shm, buf, count * sizeof(float), 0, &d, deadline, &f);
        break;
    }
    return rc ? mg_cpu_fail(cc, &d, &f, timeout_ms) : 0;
}

static int cpu_broadcast(struct mg_comm *c, void *buf, size_t len, int root, int timeout_ms)
{
    struct cpu_comm *cc = (struct cpu_comm *)c;
    struct mg_opdesc d = {.kind = MG_OP_BROADCAST, .root = root, .len = len};
    struct mg_fault f = {0};
    int64_t deadline = mg_cpu_deadline(timeout_ms);
    int rc = 0, root_host = cc->host_of[root];

    switch (cc->layout) {
    case L_SHM:
        rc = mg_shm_broadcast(cc->shm, buf, len, cc->local_of[root], &d, deadline, &f);
        break;
    case L_RING:
        rc = mg_ring_broadcast(cc->ring, buf, len, root, &d, deadline, &f);
        break;
    case L_HIER:
        if (cc->shm && cc->host == root_host)
            rc = mg_shm_broadcast(cc->shm, buf, len, cc->local_of[root], &d, deadline, &f);
        if (!rc && cc->ring)
            rc = mg_ring_broadcast(cc->ring, buf, len, root_host, &d, deadline, &f);
        if (!rc && cc->shm && cc->host != root_host)
            rc = mg_shm_broadcast(cc->shm, buf, len, 0, &d, deadline, &f);
        break;
    }
    return rc ? mg_cpu_fail(cc, &d, &f, timeout_ms) : 0;
}

static int cpu_allgather(struct mg_comm *c, const void *send, void *recv, size_t len,
                         int timeout_ms)
{
    struct cpu_comm *cc = (struct cpu_comm *)c;
    struct mg_opdesc d = {.kind = MG_OP_ALLGATHER, .root = -1, .len = len};
    struct mg_fault f = {0};
    int64_t deadline = mg_cpu_deadline(timeout_ms);
    int rc = 0, nh = c->nhosts;
    char *out = recv, *local = NULL, *hostbuf = NULL;
    size_t *lens = NULL;

    switch (cc->layout) {
    case L_SHM:
        rc = mg_shm_allgather(cc->shm, send, recv, len, &d, deadline, &f);
        c->zerocopy = mg_shm_zerocopy_count(cc->shm);
        break;
    case L_RING:
        if (send != out + (size_t)c->rank * len && len)
            memmove(out + (size_t)c->rank * len, send, len);
        lens = malloc((size_t)c->world * sizeof(size_t));
        if (!lens) {
            f = (struct mg_fault){.kind = MG_FAULT_LOCAL, .peer = c->rank, .err = -ENOMEM};
            rc = -ENOMEM;
            break;
        }
        for (int r = 0; r < c->world; r++)
            lens[r] = len;
        rc = mg_ring_allgatherv(cc->ring, recv, lens, &d, deadline, &f);
        break;
    case L_HIER: {
        /* Gather the host's blocks, swap host blocks around the ring of
         * leaders, place them by rank, then share the whole result. */
        int nl = c->local_world;
        local = malloc((size_t)nl * len + 1);
        if (cc->ring) {
            hostbuf = malloc((size_t)c->world * len + 1);
            lens = malloc((size_t)nh * sizeof(size_t));
        }
        if (!local || (cc->ring && (!hostbuf || !lens))) {
            f = (struct mg_fault){.kind = MG_FAULT_LOCAL, .peer = c->rank, .err = -ENOMEM};
            rc = -ENOMEM;
            break;
        }
        if (cc->shm)
            rc = mg_shm_allgather(cc->shm, send, local, len, &d, deadline, &f);
        else if (len)
            memcpy(local, send, len);
        if (!rc && cc->ring) {
            size_t off = 0, mine = 0;
            for (int h = 0; h < nh; h++) {
                lens[h] = (size_t)(cc->host_start[h + 1] - cc->host_start[h]) * len;
                if (h == cc->host)
                    mine = off;
                off += lens[h];
            }
            if (len)
                memcpy(hostbuf + mine, local, (size_t)nl * len);
            rc = mg_ring_allgatherv(cc->ring, hostbuf, lens, &d, deadline, &f);
            for (int i = 0; !rc && len && i < c->world; i++)
                memcpy(out + (size_t)cc->members[i] * len, hostbuf + (size_t)i * len, len);
        }
        if (!rc && cc->shm)
            rc = mg_shm_broadcast(cc->shm, recv, (size_t)c->world * len, 0, &d, deadline, &f);
        break;
    }
    }
    free(local);
    free(hostbuf);
    free(lens);
    return rc ? mg_cpu_fail(cc, &d, &f, timeout_ms) : 0;
}

/* Whether the ring's allreduce of n chunks of count floats cuts them where
 * the reduce-scatter does: then the ring's own reduce-scatter has its bits. */
static int ring_chunks_match(size_t count, int n)
{
    size_t off[MG_SHM_MAX_LOCAL + 1], *o = off;
    if (n > MG_SHM_MAX_LOCAL && !(o = malloc(((size_t)n + 1) * sizeof(size_t))))
        return 0;
    mg_split_chunks(count * (size_t)n, n, o);
    int match = 1;
    for (int c = 0; c <= n && match; c++)
        match = o[c] == (size_t)c * count;
    if (o != off)
        free(o);
    return match;
}

/* The bits are an allreduce's of the same buffer, in every layout: shared
 * memory sums each chunk in rank order, as its allreduce does; the ring uses
 * its allreduce's schedule when the chunks fall where that one cuts them, and
 * otherwise (and across hosts) does the allreduce itself on a copy and keeps
 * its chunk. */
static int cpu_reduce_scatter(struct mg_comm *c, const float *send, float *recv, size_t count,
                              enum mg_reduce_op op, int timeout_ms)
{
    struct cpu_comm *cc = (struct cpu_comm *)c;
    struct mg_opdesc d = {.kind = op == MG_REDUCE_AVG ? MG_OP_REDUCE_SCATTER_AVG
                                                      : MG_OP_REDUCE_SCATTER_SUM,
                          .root = -1,
                          .len = (uint64_t)count * sizeof(float)};
    struct mg_fault f = {0};
    int64_t deadline = mg_cpu_deadline(timeout_ms);
    int div = op == MG_REDUCE_AVG ? c->world : 1, rc = 0;
    size_t total = count * (size_t)c->world;
    float *work = NULL;

    if (cc->layout == L_SHM) {
        rc = mg_shm_reduce_scatter(cc->shm, send, recv, count, div, &d, deadline, &f);
        c->zerocopy = mg_shm_zerocopy_count(cc->shm);
        return rc ? mg_cpu_fail(cc, &d, &f, timeout_ms) : 0;
    }
    /* the ring and the host reduce overwrite their buffer: a copy of send */
    work = malloc(total * sizeof(float) + 1);
    if (!work) {
        f = (struct mg_fault){.kind = MG_FAULT_LOCAL, .peer = c->rank, .err = -ENOMEM};
        return mg_cpu_fail(cc, &d, &f, timeout_ms);
    }
    memcpy(work, send, total * sizeof(float));
    if (cc->layout == L_RING && ring_chunks_match(count, c->world)) {
        rc = mg_ring_reduce_scatter(cc->ring, work, count, recv, div, &d, deadline, &f);
    } else if (cc->layout == L_RING) {
        rc = mg_ring_allreduce(cc->ring, work, total, div, &d, deadline, &f);
        if (!rc)
            memmove(recv, work + (size_t)c->rank * count, count * sizeof(float));
    } else {
        if (cc->shm)
            rc = mg_shm_reduce(cc->shm, work, total, 0, &d, deadline, &f);
        if (!rc && cc->ring)
            rc = mg_ring_allreduce(cc->ring, work, total, div, &d, deadline, &f);
        if (!rc && cc->shm)
            rc = mg_shm_broadcast(cc->shm, work, total * sizeof(float), 0, &d, deadline, &f);
        if (!rc)
            memmove(recv, work + (size_t)c->rank * count, count * sizeof(float));
    }
    free(work);
    return rc ? mg_cpu_fail(cc, &d, &f, timeout_ms) : 0;
}

static int cpu_barrier_desc(struct cpu_comm *cc, const struct mg_opdesc *d, int timeout_ms)
{
    struct mg_fault f = {0};
    int64_t deadline = mg_cpu_deadline(timeout_ms);
    int rc = 0;
    switch (cc->layout) {
    case L_SHM:
        rc = mg_shm_barrier(cc->shm, d, deadline, &f);
        break;
    case L_RING:
        rc = mg_ring_barrier(cc->ring, d, deadline, &f);
        break;
    case L_HIER:
        /* Everyone here arrived; every host arrived; release everyone here. */
        if (cc->shm)
            rc = mg_shm_barrier(cc->shm, d, deadline, &f);
        if (!rc && cc->ring)
            rc = mg_ring_barrier(cc->ring, d, deadline, &f);
        if (!rc && cc->shm)
            rc = mg_shm_barrier(cc->shm, d, deadline, &f);
        break;
    }
    return rc ? mg_cpu_fail(cc, d, &f, timeout_ms) : 0;
}

static int cpu_barrier(struct mg_comm *c, int timeout_ms)
{
    struct mg_opdesc d = {.kind = MG_OP_BARRIER, .root = -1};
    return cpu_barrier_desc((struct cpu_comm *)c, &d, timeout_ms);
}

static int cpu_mem_alloc(struct mg_comm *c, size_t bytes, void **out, int timeout_ms)
{
    struct cpu_comm *cc = (struct cpu_comm *)c;
    if (cc->layout == L_SHM && !cc->no_zerocopy) {
        struct mg_opdesc d = {.kind = MG_OP_REGISTER, .root = -1, .len = bytes};
        struct mg_fault f = {0};
        int rc = mg_shm_mem_alloc(cc->shm, bytes, out, &d, mg_cpu_deadline(timeout_ms), &f);
        if (rc)
            return mg_cpu_fail(cc, &d, &f, timeout_ms);
        if (*out)
            return 0;
    }
    *out = mg_comm_plain_alloc(bytes);
    return *out ? 0 : -ENOMEM;
}

static void cpu_mem_free(struct mg_comm *c, void *p)
{
    struct cpu_comm *cc = (struct cpu_comm *)c;
    if (!cc->shm || !mg_shm_mem_free(cc->shm, p))
        free(p);
}

static void cpu_release(struct mg_comm *c)
{
    struct cpu_comm *cc = (struct cpu_comm *)c;
    if (!cc)
        return;
    mg_shm_release(cc->shm);
    mg_ring_release(cc->ring);
    free(cc->host_of);
    free(cc->local_of);
    free(cc->host_start);
    free(cc->members);
    free(cc);
}

static const struct mg_comm_ops cpu_ops = {
    .name = "cpu",
    .allreduce = cpu_allreduce,
    .broadcast = cpu_broadcast,
    .allgather = cpu_allgather,
    .reduce_scatter = cpu_reduce_scatter,
    .shift = mg_cpu_shift,
    .barrier = cpu_barrier,
    .release = cpu_release,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
};

/* ---- assembly ------------------------------------------------------------------------ */

int mg_comm_cpu_assemble(struct mg_comm **out, const struct mg_cpu_parts *p)
{
    int world = p->world, rank = p->rank;
    if (world < 2 || rank < 0 || rank >= world || !p->host_of)
        return -EINVAL;
    struct cpu_comm *cc = calloc(1, sizeof(*cc));
    if (!cc)
        return -ENOMEM;
    cc->host_of = calloc((size_t)world, sizeof(int));
    cc->local_of = calloc((size_t)world, sizeof(int));
    cc->host_start = calloc((size_t)world + 1, sizeof(int));
    cc->members = calloc((size_t)world, sizeof(int));
    int *fill = calloc((size_t)world, sizeof(int));
    if (!cc->host_of || !cc->local_of || !cc->host_start || !cc->members || !fill) {
        free(fill);
        cpu_release(&cc->base);
        return -ENOMEM;
    }
    int nh = 0;
    for (int r = 0; r < world; r++) {
        int h = p->host_of[r];
        if (h < 0 || h > nh || h >= world) { /* hosts must be numbered by first appearance */
            free(fill);
            cpu_release(&cc->base);
            return -EINVAL;
        }
        if (h == nh)
            nh++;
        cc->host_of[r] = h;
        cc->host_start[h + 1]++;
    }
    for (int h = 0; h < nh; h++) {
        cc->host_start[h + 1] += cc->host_start[h];
        fill[h] = cc->host_start[h];
    }
    for (int r = 0; r < world; r++) {
        int h = cc->host_of[r];
        cc->local_of[r] = fill[h] - cc->host_start[h];
        cc->members[fill[h]++] = r;
    }
    free(fill);

    cc->base.ops = &cpu_ops;
    cc->base.rank = rank;
    cc->base.world = world;
    cc->base.nhosts = nh;
    cc->base.timeout_ms = p->timeout_ms > 0 ? p->timeout_ms : MG_COMM_TIMEOUT_DEFAULT_MS;
    cc->host = cc->host_of[rank];
    cc->base.local_rank = cc->local_of[rank];
    cc->base.local_world = cc->host_start[cc->host + 1] - cc->host_start[cc->host];
    if (p->all_ring)
        cc->layout = L_RING;
    else if (nh == 1)
        cc->layout = L_SHM;
    else if (nh == world)
        cc->layout = L_RING;
    else
        cc->layout = L_HIER;

    /* The pieces must match the layout. */
    int need_shm = cc->layout != L_RING && cc->base.local_world > 1;
    int need_ring = cc->layout == L_RING || (cc->layout == L_HIER && cc->base.local_rank == 0);
    if (need_shm != !!p->shm || need_ring != !!p->ring) {
        cpu_release(&cc->base);
        return -EINVAL;
    }
    cc->shm = p->shm;
    cc->ring = p->ring;
    cc->no_zerocopy = p->no_zerocopy;
    cc->base.rank_ordered = cc->layout == L_SHM;
    if (cc->layout == L_SHM)
        snprintf(cc->base.desc, sizeof(cc->base.desc), "cpu: shared memory, %d ranks on 1 host",
                 world);
    else if (cc->layout == L_RING)
        snprintf(cc->base.desc, sizeof(cc->base.desc), "cpu: tcp ring of %d ranks on %d host%s",
                 world, nh, nh == 1 ? "" : "s");
    else
        snprintf(cc->base.desc, sizeof(cc->base.desc),
                 "cpu: hierarchical, %d ranks on %d hosts (shared memory + tcp ring)", world, nh);
    *out = &cc->base;
    return 0;
}

int mg_comm_cpu_check(struct mg_comm *c, int timeout_ms)
{
    struct mg_opdesc d = {.kind = MG_OP_SETUP, .root = -1};
    return cpu_barrier_desc((struct cpu_comm *)c, &d, timeout_ms);
}
