/* The CPU communicator's shift (struct mg_comm_ops): every rank's block to
 * rank (rank + k) mod world, moving each block once over each link it needs:
 *
 *   one host            shared memory: each rank picks its source's block
 *   a TCP ring          the blocks passed k members on, in k pipelined rounds
 *   hierarchical        each host's blocks gathered into its leader, passed
 *                       around the ring of leaders to the leader of their
 *                       destination's host, and handed out there
 *
 * A block crosses as many ring links as its destination's host is away: one
 * for ZeRO-1's copies on the next node (k = LOCAL_WORLD_SIZE), none for a
 * destination on its own host. An allgather would move every block over
 * every link. The blocks only move, so the bits are the sender's. */
#include "comm_internal.h"
#include "mg_err.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The ring's members ("groups"): a rank each (L_RING), or a host each. */
struct plan {
    const struct cpu_comm *cc;
    int world, k, ngroups;
};

static int group_of(const struct plan *p, int r)
{
    return p->cc->layout == L_RING ? r : p->cc->host_of[r];
}

static int group_size(const struct plan *p, int g)
{
    return p->cc->layout == L_RING ? 1 : p->cc->host_start[g + 1] - p->cc->host_start[g];
}

static int group_member(const struct plan *p, int g, int i)
{
    return p->cc->layout == L_RING ? g : p->cc->members[p->cc->host_start[g] + i];
}

/* Ring links from rank s's group to its destination's. */
static int hops_of(const struct plan *p, int s)
{
    int d = (s + p->k) % p->world;
    return ((group_of(p, d) - group_of(p, s)) % p->ngroups + p->ngroups) % p->ngroups;
}

struct item {
    int rank, hops;
};

static int item_cmp(const void *a, const void *b)
{
    const struct item *x = a, *y = b;
    if (x->hops != y->hops)
        return x->hops > y->hops ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Group g's blocks in the order they travel: the farthest first, so that a
 * round passes on a head of what it received; by rank within. */
static void travel_order(const struct plan *p, int g, struct item *out)
{
    int n = group_size(p, g);
    for (int i = 0; i < n; i++) {
        out[i].rank = group_member(p, g, i);
        out[i].hops = hops_of(p, out[i].rank);
    }
    qsort(out, (size_t)n, sizeof(*out), item_cmp);
}

static int count_from(const struct plan *p, int g, int hops)
{
    int n = group_size(p, g), m = 0;
    for (int i = 0; i < n; i++)
        m += hops_of(p, group_member(p, g, i)) >= hops;
    return m;
}

/* Where the block for rank dest goes in this group's out (by local index). */
static size_t out_at(const struct plan *p, int dest, size_t len)
{
    return p->cc->layout == L_RING ? 0 : (size_t)p->cc->local_of[dest] * len;
}

/* The ring member's part: its group's blocks in b0 (travel order), out to
 * be filled with the blocks for its group's ranks. */
static int leader_relay(const struct plan *p, char *b0, char *out, size_t len,
                        const struct mg_opdesc *d, int64_t deadline, struct mg_fault *f)
{
    const struct cpu_comm *cc = p->cc;
    int me = group_of(p, cc->base.rank), G = p->ngroups, rounds = 0, rc = 0, nmax = 0;
    for (int s = 0; s < p->world; s++) {
        int h = hops_of(p, s);
        rounds = h > rounds ? h : rounds;
    }
    for (int g = 0; g < G; g++)
        nmax = group_size(p, g) > nmax ? group_size(p, g) : nmax;
    char **bufs = calloc((size_t)rounds + 1, sizeof(*bufs));
    size_t *slen = calloc((size_t)rounds + 1, sizeof(size_t));
    size_t *rlen = calloc((size_t)rounds + 1, sizeof(size_t));
    struct item *order = malloc((size_t)nmax * sizeof(*order));
    char *room = NULL;
    if (!bufs || !slen || !rlen || !order) {
        rc = -ENOMEM;
        goto out;
    }
    size_t total = 0;
    bufs[0] = b0;
    slen[0] = (size_t)count_from(p, me, 1) * len;
    for (int t = 1; t <= rounds; t++) {
        int g = ((me - t) % G + G) % G;
        rlen[t] = (size_t)count_from(p, g, t) * len;
        slen[t] = t < rounds ? (size_t)count_from(p, g, t + 1) * len : 0;
        total += rlen[t];
    }
    if (rounds && !(room = malloc(total + 1))) {
        rc = -ENOMEM;
        goto out;
    }
    for (int t = 1, at = 0; t <= rounds; at += (int)(rlen[t] / (len ? len : 1)), t++)
        bufs[t] = room + (size_t)at * len;
    if (rounds)
        rc = mg_ring_relay(cc->ring, rounds, bufs, slen, rlen, d, deadline, f);
    if (rc)
        goto out;
    /* the blocks that end here: those of their round's hops, the tail of it */
    for (int t = 0; t <= rounds && len; t++) {
        int g = ((me - t) % G + G) % G, n = group_size(p, g);
        travel_order(p, g, order);
        for (int i = 0, at = 0; i < n; i++) {
            if (order[i].hops < t)
                continue;
            if (order[i].hops == t)
                memcpy(out + out_at(p, (order[i].rank + p->k) % p->world, len),
                       bufs[t] + (size_t)at * len, len);
            at++;
        }
    }
out:
    if (rc == -ENOMEM)
        *f = (struct mg_fault){.kind = MG_FAULT_LOCAL, .peer = cc->base.rank, .err = -ENOMEM};
    free(room);
    free(order);
    free(bufs);
    free(slen);
    free(rlen);
    return rc;
}

/* A ring, or hosts: gather into the leader, relay, hand out. */
static int relay_shift(struct cpu_comm *cc, const void *send, void *recv, size_t len, int k,
                       const struct mg_opdesc *d, int64_t deadline, struct mg_fault *f)
{
    struct mg_comm *c = &cc->base;
    struct plan p = {cc, c->world, k, cc->layout == L_RING ? c->world : c->nhosts};
    int me = group_of(&p, c->rank), nl = group_size(&p, me), rc = 0;
    struct item *order = NULL;
    struct mg_shm_pick *picks = NULL, pk;
    char *b0 = NULL, *out = NULL;
    if (!cc->ring) {
        /* not the host's leader: its block in, this rank's block out */
        rc = mg_shm_pick(cc->shm, send, len, NULL, 0, d, deadline, f);
        pk = (struct mg_shm_pick){
            .from = 0, .off = (size_t)c->local_rank * len, .len = len, .dst = recv};
        return rc ? rc : mg_shm_pick(cc->shm, NULL, (size_t)nl * len, &pk, 1, d, deadline, f);
    }
    if (!cc->shm) /* alone in its group: nothing to gather or hand out */
        return leader_relay(&p, (char *)(uintptr_t)send, recv, len, d, deadline, f);
    order = malloc((size_t)nl * sizeof(*order));
    picks = malloc((size_t)nl * sizeof(*picks));
    b0 = malloc((size_t)nl * len + 1);
    out = malloc((size_t)nl * len + 1);
    if (!order || !picks || !b0 || !out) {
        *f = (struct mg_fault){.kind = MG_FAULT_LOCAL, .peer = c->rank, .err = -ENOMEM};
        rc = -ENOMEM;
        goto out;
    }
    travel_order(&p, me, order);
    int np = 0;
    for (int i = 0; i < nl; i++) {
        if (order[i].rank == c->rank && len)
            memcpy(b0 + (size_t)i * len, send, len);
        else if (order[i].rank != c->rank)
            picks[np++] = (struct mg_shm_pick){
                .from = cc->local_of[order[i].rank], .len = len, .dst = b0 + (size_t)i * len};
    }
    rc = mg_shm_pick(cc->shm, NULL, len, picks, np, d, deadline, f);
    if (!rc)
        rc = leader_relay(&p, b0, out, len, d, deadline, f);
    if (!rc)
        rc = mg_shm_pick(cc->shm, out, (size_t)nl * len, NULL, 0, d, deadline, f);
    if (!rc && len)
        memcpy(recv, out, len); /* the leader is local rank 0 */
out:
    free(order);
    free(picks);
    free(b0);
    free(out);
    return rc;
}

int mg_cpu_shift(struct mg_comm *c, const void *send, void *recv, size_t len, int k, int timeout_ms)
{
    struct cpu_comm *cc = (struct cpu_comm *)c;
    struct mg_opdesc d = {.kind = MG_OP_SHIFT, .root = k, .len = len};
    struct mg_fault f = {0};
    int64_t deadline = mg_cpu_deadline(timeout_ms);
    int rc;
    if (cc->layout == L_SHM) {
        int src = (c->rank - k + c->world) % c->world;
        struct mg_shm_pick pk = {.from = cc->local_of[src], .len = len, .dst = recv};
        rc = mg_shm_pick(cc->shm, send, len, &pk, 1, &d, deadline, &f);
    } else {
        rc = relay_shift(cc, send, recv, len, k, &d, deadline, &f);
    }
    return rc ? mg_cpu_fail(cc, &d, &f, timeout_ms) : 0;
}
