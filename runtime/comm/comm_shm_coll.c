/* The collectives of the ranks of one host, on the shared segment and the
 * flag round of comm_shm.c.
 *
 * A small allreduce travels in the flag round itself and is finished by
 * summing the peers' slots in rank order: one round, no system call when the
 * peers are running.
 *
 * Larger messages are pipelined in steps. The buffer is cut into one chunk per
 * rank; in step k each rank copies segment k of every other rank's chunk into
 * its own staging slot (A), sums segment k of its own chunk from everyone's
 * staging slots, in rank order, into its buffer and into its staging slot (R),
 * and copies the other ranks' finished segments out of their slots (C). The
 * slots are a few hundred KiB that stay in the caches, so memory traffic is
 * close to one read and one write of the buffer per rank, and each sum is
 * computed once, by one rank, and copied: every rank gets identical bits.
 *
 * An allreduce whose buffers sit at the same offset of the same registration
 * (mg_shm_mem_alloc) on every rank skips the staging slots: after the flag
 * round, rank r sums chunk r straight from every rank's buffer, in rank order,
 * and writes the sum into every rank's buffer; a second round says that all
 * chunks are written. Each rank then reads and writes its share of the buffer
 * once: a third of the memory traffic of staging, and two synchronizations
 * instead of one per pipeline step. Same sums, same bits. */
#include "comm_shm_internal.h"
#include "mg_err.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- allreduce ------------------------------------------------------------------- */

/* Piece k of a message of len units cut into pieces of step (k * step < len). */
static size_t piece_len(size_t len, uint32_t k, size_t step)
{
    size_t start = (size_t)k * step;
    return len - start < step ? len - start : step;
}

/* Floats of chunk c that fall in segment k. */
static size_t seg_len(const size_t *off, int c, uint32_t k, size_t seg)
{
    size_t len = off[c + 1] - off[c];
    return len <= (size_t)k * seg ? 0 : piece_len(len, k, seg);
}

/* The whole message in the flag round's slots; each rank sums it all (the
 * same sums, in the same order, on every rank). */
static int small_reduce(struct mg_shm *g, float *buf, size_t count, int divide_by, int want,
                        const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f)
{
    const float *src[MG_SHM_MAX_LOCAL];
    uint32_t seq = g->round;
    int rc = mg_shm_round(g, d, buf, count * sizeof(float), deadline_ms, f);
    if (rc || !want)
        return rc;
    for (int q = 0; q < g->n; q++)
        src[q] = q == g->me ? buf : (const float *)(small_slot(g, q, seq) + SMALL_HDR);
    mg_reduce_f32(buf, NULL, src, g->n, count, divide_by);
    return 0;
}

/* Where buf lies in this rank's registered memory (tag->reg = 0: nowhere). */
static void find_reg(const struct mg_shm *g, const float *buf, size_t bytes, struct zc_tag *tag)
{
    const char *p = (const char *)buf;
    *tag = (struct zc_tag){0};
    for (int i = 0; i < g->nregs; i++) {
        const struct shm_reg *r = &g->regs[i];
        const char *mine = r->map ? r->map + (size_t)g->me * r->stride : NULL;
        if (mine && p >= mine && (size_t)(p - mine) <= r->bytes &&
            bytes <= r->bytes - (size_t)(p - mine) && (size_t)(p - mine) % sizeof(float) == 0) {
            *tag = (struct zc_tag){.reg = (uint32_t)i + 1, .off = (uint64_t)(p - mine)};
            return;
        }
    }
}

/* The flag round of a large operation: each rank says where its buffer lies in
 * its registered memory (when look) and learns whether every rank's buffer lies
 * at the same offset of one registration (*all; *tag says where). */
static int zc_flag_round(struct mg_shm *g, const float *buf, size_t bytes, int look,
                         struct zc_tag *tag, int *all, const struct mg_opdesc *d,
                         int64_t deadline_ms, struct mg_fault *f)
{
    uint32_t seq = g->round;
    *tag = (struct zc_tag){0};
    if (look)
        find_reg(g, buf, bytes, tag);
    memcpy(small_slot(g, g->me, seq) + TAG_OFF, tag, sizeof(*tag));
    int rc = mg_shm_round(g, d, NULL, 0, deadline_ms, f);
    if (rc)
        return rc;
    *all = tag->reg != 0;
    for (int q = 0; q < g->n && *all; q++) {
        struct zc_tag t;
        memcpy(&t, small_slot(g, q, seq) + TAG_OFF, sizeof(t));
        *all = t.reg == tag->reg && t.off == tag->off;
    }
    return 0;
}

/* R(j) of a pipeline starts once every other rank has staged step j. */
static int wait_posted(struct mg_shm *g, uint32_t base, uint32_t j, int64_t deadline_ms,
                       struct mg_fault *f)
{
    for (int q = 0; q < g->n; q++) {
        if (q == g->me)
            continue;
        int rc = mg_shm_wait(g, q, &g->ctl[q].posted, base + j + 1, deadline_ms, f);
        if (rc)
            return rc;
    }
    return 0;
}

/* Zero-copy: the flag round proved every rank's buffer holds its input.
 * Chunk boundaries fall on cache lines of the buffers (which sit at the same
 * offset in every block), so no two ranks write one line. */
static int zc_allreduce(struct mg_shm *g, const struct zc_tag *tag, size_t count, int divide_by,
                        const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f)
{
    const struct shm_reg *r = &g->regs[tag->reg - 1];
    float *bufs[MG_SHM_MAX_LOCAL];
    size_t off[MG_SHM_MAX_LOCAL + 1];
    size_t lead = (size_t)(tag->off / sizeof(float)) % 16; /* of the first line, before buf */
    int n = g->n, me = g->me;
    mg_split_chunks(count + lead, n, off);
    size_t from = off[me] > lead ? off[me] - lead : 0,
           to = off[me + 1] > lead ? off[me + 1] - lead : 0;
    if (to > from) {
        for (int q = 0; q < n; q++)
            bufs[q] = (float *)(r->map + (size_t)q * r->stride + tag->off) + from;
        mg_reduce_f32n(bufs, n, (const float *const *)bufs, n, to - from, divide_by);
    }
    g->nzc++;
    /* Nobody may use the result (or write the next input) before every
     * chunk has been written. */
    return mg_shm_round(g, d, NULL, 0, deadline_ms, f);
}

/* The sums land in every rank's buf (root < 0) or only in root's; the other
 * ranks' buf then holds partial results. */
static int shm_reduce(struct mg_shm *g, float *buf, size_t count, int divide_by, int root,
                      const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f)
{
    const float *src[MG_SHM_MAX_LOCAL];
    size_t bytes = count * sizeof(float);
    int n = g->n, me = g->me, rc;
    int want = root < 0 || root == me; /* this rank needs the whole result */
    /* The path depends on the size only, so every rank takes the same one. */
    int zc = root < 0 && bytes && bytes >= g->zc_min;

    if (bytes <= g->small_max && !zc)
        return small_reduce(g, buf, count, divide_by, want, d, deadline_ms, f);

    /* A round without data; the tags say whether the buffers are registered. */
    struct zc_tag tag;
    int all;
    rc = zc_flag_round(g, buf, bytes, zc, &tag, &all, d, deadline_ms, f);
    if (rc)
        return rc;
    if (zc) {
        if (all)
            return zc_allreduce(g, &tag, count, divide_by, d, deadline_ms, f);
        if (bytes <= g->small_max) /* zc_min below small_max (tests): another round */
            return small_reduce(g, buf, count, divide_by, want, d, deadline_ms, f);
    }

    size_t off[MG_SHM_MAX_LOCAL + 1];
    mg_split_chunks(count, n, off);
    size_t seg = g->step_bytes / (size_t)n / 64 * 64 / sizeof(float); /* floats per segment */
    size_t maxchunk = 0;
    for (int c = 0; c < n; c++)
        if (off[c + 1] - off[c] > maxchunk)
            maxchunk = off[c + 1] - off[c];
    uint32_t nsteps = (uint32_t)((maxchunk + seg - 1) / seg);
    uint32_t base = g->steps;
    struct shm_rankctl *mine = &g->ctl[me];

    /* A(0), then R(j) A(j+1) C(j): the peers' sums get a whole stage of slack. */
    for (uint32_t k = 0; k <= nsteps; k++) {
        if (k > 0) {
            /* R(j): sum segment j of my chunk, in rank order. */
            uint32_t j = k - 1;
            rc = wait_posted(g, base, j, deadline_ms, f);
            if (rc)
                return rc;
            size_t l = seg_len(off, me, j, seg);
            if (l) {
                for (int q = 0; q < n; q++)
                    src[q] = q == me ? buf + off[me] + (size_t)j * seg
                                     : (const float *)large_slot(g, q, base + j) + (size_t)me * seg;
                /* Into my buffer if I need it, into my slot if someone else does. */
                float *mine_out = buf + off[me] + (size_t)j * seg;
                float *slot_out = (float *)large_slot(g, me, base + j) + (size_t)me * seg;
                int others = root < 0 || root != me;
                mg_reduce_f32(want ? mine_out : slot_out, want && others ? slot_out : NULL, src, n,
                              l, divide_by);
            }
            post(&mine->reduced, base + j + 1);
        }
        if (k < nsteps) {
            /* A(k): stage my part of everyone else's chunk. */
            rc = mg_shm_wait_slot_free(g, base, k, 1, deadline_ms, f);
            if (rc)
                return rc;
            float *slot = (float *)large_slot(g, me, base + k);
            for (int p = 0; p < n; p++) {
                size_t l = seg_len(off, p, k, seg);
                if (p != me && l)
                    memcpy(slot + (size_t)p * seg, buf + off[p] + (size_t)k * seg,
                           l * sizeof(float));
            }
            post(&mine->posted, base + k + 1);
        }
        if (k > 0) {
            /* C(j): copy the others' sums out of their slots. */
            uint32_t j = k - 1;
            for (int q = 0; q < n && want; q++) {
                if (q == me)
                    continue;
                rc = mg_shm_wait(g, q, &g->ctl[q].reduced, base + j + 1, deadline_ms, f);
                if (rc)
                    return rc;
                size_t l = seg_len(off, q, j, seg);
                if (l)
                    memcpy(buf + off[q] + (size_t)j * seg,
                           (const float *)large_slot(g, q, base + j) + (size_t)q * seg,
                           l * sizeof(float));
            }
            post(&mine->consumed, base + j + 1);
        }
    }
    mg_shm_finish_steps(g, base + nsteps);
    return 0;
}

int mg_shm_allreduce(struct mg_shm *g, float *buf, size_t count, int divide_by,
                     const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f)
{
    return shm_reduce(g, buf, count, divide_by, -1, d, deadline_ms, f);
}

int mg_shm_reduce(struct mg_shm *g, float *buf, size_t count, int root_local,
                  const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f)
{
    return shm_reduce(g, buf, count, 1, root_local, d, deadline_ms, f);
}

/* ---- reduce-scatter ---------------------------------------------------------------- */

/* Each rank sums only its own chunk, in rank order, as an allreduce's rank
 * would (so the bits are an allreduce's): from the flag round's slots for a
 * small message, straight from the peers' registered buffers when every rank's
 * send sits at the same offset of one registration, else through the staging
 * slots, A(k) and R(j) of the allreduce's pipeline without its copy-out. */
static int small_scatter(struct mg_shm *g, const float *send, float *recv, size_t count,
                         int divide_by, const struct mg_opdesc *d, int64_t deadline_ms,
                         struct mg_fault *f)
{
    const float *src[MG_SHM_MAX_LOCAL];
    uint32_t seq = g->round;
    int rc = mg_shm_round(g, d, send, (size_t)g->n * count * sizeof(float), deadline_ms, f);
    if (rc)
        return rc;
    for (int q = 0; q < g->n; q++)
        src[q] = (q == g->me ? send : (const float *)(small_slot(g, q, seq) + SMALL_HDR)) +
                 (size_t)g->me * count;
    mg_reduce_f32(recv, NULL, src, g->n, count, divide_by);
    return 0;
}

int mg_shm_reduce_scatter(struct mg_shm *g, const float *send, float *recv, size_t count,
                          int divide_by, const struct mg_opdesc *d, int64_t deadline_ms,
                          struct mg_fault *f)
{
    const float *src[MG_SHM_MAX_LOCAL];
    int n = g->n, me = g->me, rc;
    size_t bytes = (size_t)n * count * sizeof(float);
    int zc = bytes && bytes >= g->zc_min;

    if (bytes <= g->small_max && !zc)
        return small_scatter(g, send, recv, count, divide_by, d, deadline_ms, f);

    struct zc_tag tag;
    int all;
    rc = zc_flag_round(g, send, bytes, zc, &tag, &all, d, deadline_ms, f);
    if (rc)
        return rc;
    if (zc) {
        if (all) {
            const struct shm_reg *r = &g->regs[tag.reg - 1];
            for (int q = 0; q < n; q++)
                src[q] =
                    (const float *)(r->map + (size_t)q * r->stride + tag.off) + (size_t)me * count;
            mg_reduce_f32(recv, NULL, src, n, count, divide_by);
            g->nzc++;
            /* nobody may change its send buffer while the others read it */
            return mg_shm_round(g, d, NULL, 0, deadline_ms, f);
        }
        if (bytes <= g->small_max) /* zc_min below small_max (tests): another round */
            return small_scatter(g, send, recv, count, divide_by, d, deadline_ms, f);
    }

    size_t seg = g->step_bytes / (size_t)n / 64 * 64 / sizeof(float);
    uint32_t nsteps = (uint32_t)((count + seg - 1) / seg), base = g->steps;
    struct shm_rankctl *mine = &g->ctl[me];
    for (uint32_t k = 0; k <= nsteps; k++) {
        if (k > 0) {
            /* R(j): segment j of my chunk, summed in rank order into recv */
            uint32_t j = k - 1;
            rc = wait_posted(g, base, j, deadline_ms, f);
            if (rc)
                return rc;
            size_t at = (size_t)j * seg, l = piece_len(count, j, seg);
            for (int q = 0; q < n; q++)
                src[q] = q == me ? send + (size_t)me * count + at
                                 : (const float *)large_slot(g, q, base + j) + (size_t)me * seg;
            mg_reduce_f32(recv + at, NULL, src, n, l, divide_by);
            post(&mine->reduced, base + j + 1);
            post(&mine->consumed, base + j + 1);
        }
        if (k < nsteps) {
            /* A(k): stage segment k of every other rank's chunk */
            rc = mg_shm_wait_slot_free(g, base, k, 1, deadline_ms, f);
            if (rc)
                return rc;
            float *slot = (float *)large_slot(g, me, base + k);
            size_t at = (size_t)k * seg, l = piece_len(count, k, seg);
            for (int p = 0; p < n; p++)
                if (p != me)
                    memcpy(slot + (size_t)p * seg, send + (size_t)p * count + at,
                           l * sizeof(float));
            post(&mine->posted, base + k + 1);
        }
    }
    mg_shm_finish_steps(g, base + nsteps);
    return 0;
}

/* ---- broadcast --------------------------------------------------------------------- */

int mg_shm_broadcast(struct mg_shm *g, void *buf, size_t len, int root_local,
                     const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f)
{
    int me = g->me, rc;
    if (len <= g->small_max) {
        uint32_t seq = g->round;
        rc = mg_shm_round(g, d, buf, me == root_local ? len : 0, deadline_ms, f);
        if (rc)
            return rc;
        if (me != root_local && len)
            memcpy(buf, small_slot(g, root_local, seq) + SMALL_HDR, len);
        return 0;
    }
    rc = mg_shm_round(g, d, NULL, 0, deadline_ms, f);
    if (rc)
        return rc;
    size_t step = g->step_bytes;
    uint32_t nsteps = (uint32_t)((len + step - 1) / step), base = g->steps;
    char *p = buf;
    for (uint32_t k = 0; k < nsteps; k++) {
        size_t l = piece_len(len, k, step);
        if (me == root_local) {
            rc = mg_shm_wait_slot_free(g, base, k, 0, deadline_ms, f);
            if (rc)
                return rc;
            memcpy(large_slot(g, me, base + k), p + (size_t)k * step, l);
            post(&g->ctl[me].posted, base + k + 1);
        } else {
            rc = mg_shm_wait(g, root_local, &g->ctl[root_local].posted, base + k + 1, deadline_ms,
                             f);
            if (rc)
                return rc;
            memcpy(p + (size_t)k * step, large_slot(g, root_local, base + k), l);
            post(&g->ctl[me].consumed, base + k + 1);
        }
    }
    /* The root may not leave while others still read its slots: the next
     * round proves they finished, and so would a reuse of the slots. */
    mg_shm_finish_steps(g, base + nsteps);
    return 0;
}

/* ---- allgather ---------------------------------------------------------------------- */

static int staged_allgather(struct mg_shm *g, char *out, size_t len, int64_t deadline_ms,
                            struct mg_fault *f);

int mg_shm_allgather(struct mg_shm *g, const void *send, void *recv, size_t len,
                     const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f)
{
    int n = g->n, me = g->me, rc;
    char *out = recv;
    size_t total = (size_t)n * len;
    if (send != out + (size_t)me * len && len)
        memmove(out + (size_t)me * len, send, len);
    if (total && total >= g->zc_min) {
        /* recv registered at the same offset everywhere: copy each block
         * straight from its owner's recv (one read, one write of the others'
         * blocks, no staging), then a round so that nobody changes its block
         * while another still reads it. The path depends on the size only. */
        struct zc_tag tag;
        int all;
        rc = zc_flag_round(g, recv, total, (uintptr_t)recv % sizeof(float) == 0, &tag, &all, d,
                           deadline_ms, f);
        if (rc)
            return rc;
        if (all) {
            const struct shm_reg *r = &g->regs[tag.reg - 1];
            for (int q = 0; q < n; q++)
                if (q != me)
                    memcpy(out + (size_t)q * len,
                           r->map + (size_t)q * r->stride + tag.off + (size_t)q * len, len);
            g->nzc++;
            return mg_shm_round(g, d, NULL, 0, deadline_ms, f);
        }
        if (len > g->small_max) /* the round is done: straight to the slots */
            return staged_allgather(g, out, len, deadline_ms, f);
        /* zc_min below small_max (tests): another round, the small way */
    }
    if (len <= g->small_max) {
        uint32_t seq = g->round;
        rc = mg_shm_round(g, d, out + (size_t)me * len, len, deadline_ms, f);
        if (rc)
            return rc;
        for (int q = 0; q < n; q++)
            if (q != me && len)
                memcpy(out + (size_t)q * len, small_slot(g, q, seq) + SMALL_HDR, len);
        return 0;
    }
    rc = mg_shm_round(g, d, NULL, 0, deadline_ms, f);
    if (rc)
        return rc;
    return staged_allgather(g, out, len, deadline_ms, f);
}

/* After the operation's round: each block through its owner's staging slots. */
static int staged_allgather(struct mg_shm *g, char *out, size_t len, int64_t deadline_ms,
                            struct mg_fault *f)
{
    int n = g->n, me = g->me, rc;
    size_t step = g->step_bytes;
    uint32_t nsteps = (uint32_t)((len + step - 1) / step), base = g->steps;
    const char *mine = out + (size_t)me * len;
    for (uint32_t k = 0; k <= nsteps; k++) {
        if (k < nsteps) {
            size_t l = piece_len(len, k, step);
            rc = mg_shm_wait_slot_free(g, base, k, 0, deadline_ms, f);
            if (rc)
                return rc;
            memcpy(large_slot(g, me, base + k), mine + (size_t)k * step, l);
            post(&g->ctl[me].posted, base + k + 1);
        }
        if (k == 0)
            continue;
        uint32_t j = k - 1;
        size_t l = piece_len(len, j, step);
        for (int q = 0; q < n; q++) {
            if (q == me)
                continue;
            rc = mg_shm_wait(g, q, &g->ctl[q].posted, base + j + 1, deadline_ms, f);
            if (rc)
                return rc;
            memcpy(out + (size_t)q * len + (size_t)j * step, large_slot(g, q, base + j), l);
        }
        post(&g->ctl[me].consumed, base + j + 1);
    }
    mg_shm_finish_steps(g, base + nsteps);
    return 0;
}

/* ---- picks: each rank reads chosen ranges of chosen peers' blocks ------------------ */

int mg_shm_pick(struct mg_shm *g, const void *pub, size_t plen, const struct mg_shm_pick *picks,
                int npicks, const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f)
{
    int me = g->me, rc;
    if (plen <= g->small_max) {
        uint32_t seq = g->round;
        rc = mg_shm_round(g, d, pub, pub ? plen : 0, deadline_ms, f);
        if (rc)
            return rc;
        for (int i = 0; i < npicks; i++)
            if (picks[i].len)
                memcpy(picks[i].dst, small_slot(g, picks[i].from, seq) + SMALL_HDR + picks[i].off,
                       picks[i].len);
        return 0;
    }
    rc = mg_shm_round(g, d, NULL, 0, deadline_ms, f);
    if (rc)
        return rc;
    /* staged_allgather's pipeline, reading only the picked ranges: every rank
     * still posts each step, staged or not, so the slots' counters agree */
    size_t step = g->step_bytes;
    uint32_t nsteps = (uint32_t)((plen + step - 1) / step), base = g->steps;
    const char *mine = pub;
    for (uint32_t k = 0; k <= nsteps; k++) {
        if (k < nsteps) {
            rc = mg_shm_wait_slot_free(g, base, k, 0, deadline_ms, f);
            if (rc)
                return rc;
            if (mine)
                memcpy(large_slot(g, me, base + k), mine + (size_t)k * step,
                       piece_len(plen, k, step));
            post(&g->ctl[me].posted, base + k + 1);
        }
        if (k == 0)
            continue;
        uint32_t j = k - 1;
        size_t lo = (size_t)j * step, hi = lo + piece_len(plen, j, step);
        for (int i = 0; i < npicks; i++) {
            const struct mg_shm_pick *p = &picks[i];
            size_t a = p->off > lo ? p->off : lo, b = p->off + p->len < hi ? p->off + p->len : hi;
            if (a >= b)
                continue;
            rc = mg_shm_wait(g, p->from, &g->ctl[p->from].posted, base + j + 1, deadline_ms, f);
            if (rc)
                return rc;
            memcpy((char *)p->dst + (a - p->off), large_slot(g, p->from, base + j) + (a - lo),
                   b - a);
        }
        post(&g->ctl[me].consumed, base + j + 1);
    }
    mg_shm_finish_steps(g, base + nsteps);
    return 0;
}
