/* Checks of the collectives that every rank of a job runs against its
 * communicator: allreduce (sum and avg), reduce-scatter (sum and avg, in place
 * or not), broadcast and allgather over a range of sizes, odd ones included,
 * and barrier. Shared by the unit test (ranks made by
 * fork) and the rank helper the integration tests start.
 *
 * Each element of rank r's input is a pseudo-random float of varying
 * magnitude, so the order of a sum shows in its bits. A result is checked
 *   - against the exact sum (computed in double) within the fp32 error bound,
 *   - bit for bit against the rank-order sum when the layout promises that order
 *     (shared memory only), and
 *   - for identical bits on every rank (a hash of the result, allgathered);
 * a reduce-scatter's chunk must have the bits an allreduce of the same input
 * leaves there, and the rest of its input must be untouched.
 * Failures are printed as TAP comments ("# ...") and counted. */
#ifndef MG_COMM_CHECK_H
#define MG_COMM_CHECK_H

#include "comm.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cc_opts {
    size_t max_bytes; /* largest message to try */
    int rank_order;   /* sums must equal the rank-order sum bit for bit */
    int quiet;
};

static inline uint64_t cc_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* Rank r's element i in test t: a float in (-4, 4) with a random exponent. */
static inline float cc_val(int r, size_t i, unsigned t)
{
    uint64_t h = cc_mix(((uint64_t)t << 48) ^ ((uint64_t)r << 40) ^ (uint64_t)i);
    float mant = (float)(h & 0xffffff) / (float)0x1000000 - 0.5f;
    int e = (int)((h >> 24) & 7);
    return ldexpf(mant, e - 4) * 8.0f;
}

static inline uint64_t cc_hash(const void *p, size_t len)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

/* The result hash must be the same on every rank. */
static int cc_same_everywhere(struct mg_comm *c, uint64_t h, const char *what)
{
    uint64_t *all = calloc((size_t)c->world, sizeof(uint64_t));
    int bad = 0;
    if (!all)
        return 1;
    int rc = mg_comm_allgather(c, &h, all, sizeof(h), MG_COMM_DEFAULT_TIMEOUT);
    if (rc) {
        printf("# rank %d: %s: allgather of hashes failed: %s\n", c->rank, what, mg_comm_errmsg(c));
        bad = 1;
    } else {
        for (int q = 0; q < c->world; q++)
            if (all[q] != h) {
                printf("# rank %d: %s: result differs from rank %d's\n", c->rank, what, q);
                bad = 1;
                break;
            }
    }
    free(all);
    return bad;
}

/* One allreduce of test t's inputs in buf (count floats), checked. */
static int cc_allreduce_in(struct mg_comm *c, float *buf, size_t count, enum mg_reduce_op op,
                           unsigned t, const struct cc_opts *o)
{
    char what[96];
    snprintf(what, sizeof(what), "allreduce %s of %zu floats", op == MG_REDUCE_AVG ? "avg" : "sum",
             count);
    for (size_t i = 0; i < count; i++)
        buf[i] = cc_val(c->rank, i, t);
    int rc = mg_comm_allreduce(c, buf, count, op, MG_COMM_DEFAULT_TIMEOUT);
    if (rc) {
        printf("# rank %d: %s failed: %s\n", c->rank, what, mg_comm_errmsg(c));
        return 1;
    }
    int bad = 0;
    size_t shown = 0;
    for (size_t i = 0; i < count; i++) {
        double exact = 0, mag = 0;
        float ordered = 0;
        for (int q = 0; q < c->world; q++) {
            float v = cc_val(q, i, t);
            exact += v;
            mag += fabs(v);
            ordered = q == 0 ? v : ordered + v;
        }
        if (op == MG_REDUCE_AVG) {
            exact /= c->world;
            mag /= c->world;
            ordered = ordered / (float)c->world;
        }
        double tol = mag * c->world * 1.2e-7 + 1e-30;
        int wrong = fabs(buf[i] - exact) > tol ||
                    (o->rank_order && memcmp(&buf[i], &ordered, sizeof(float)) != 0);
        if (wrong) {
            bad = 1;
            if (shown++ < 3)
                printf("# rank %d: %s: element %zu is %.9g, want %.9g (rank order %.9g)\n", c->rank,
                       what, i, buf[i], exact, ordered);
        }
    }
    bad |= cc_same_everywhere(c, cc_hash(buf, count * sizeof(float)), what);
    return bad;
}

/* One reduce-scatter of test t's inputs (world * count floats in send; recv
 * NULL: in place, into this rank's chunk of send), checked against an
 * allreduce of the same inputs in scratch (world * count floats). */
static int cc_reduce_scatter_in(struct mg_comm *c, float *send, float *recv, float *scratch,
                                size_t count, enum mg_reduce_op op, unsigned t,
                                const struct cc_opts *o)
{
    char what[96];
    size_t total = count * (size_t)c->world, me = (size_t)c->rank * count;
    snprintf(what, sizeof(what), "reduce-scatter %s of %zu floats per rank%s",
             op == MG_REDUCE_AVG ? "avg" : "sum", count, recv ? "" : " (in place)");
    for (size_t i = 0; i < total; i++)
        send[i] = cc_val(c->rank, i, t);
    if (recv)
        for (size_t i = 0; i < count; i++)
            recv[i] = -1.0f;
    int rc = mg_comm_reduce_scatter(c, send, recv ? recv : send + me, count, op,
                                    MG_COMM_DEFAULT_TIMEOUT);
    if (rc) {
        printf("# rank %d: %s failed: %s\n", c->rank, what, mg_comm_errmsg(c));
        return 1;
    }
    const float *got = recv ? recv : send + me;
    /* the reference: an allreduce of the same input, checked on its own */
    int bad = cc_allreduce_in(c, scratch, total, op, t, o);
    if (memcmp(got, scratch + me, count * sizeof(float)) != 0) {
        for (size_t i = 0; i < count; i++)
            if (memcmp(&got[i], &scratch[me + i], sizeof(float)) != 0) {
                printf("# rank %d: %s: element %zu is %.9g, the allreduce gives %.9g\n", c->rank,
                       what, i, got[i], scratch[me + i]);
                break;
            }
        bad = 1;
    }
    for (size_t i = 0; i < total; i++)
        if ((i < me || i >= me + count || recv) && send[i] != cc_val(c->rank, i, t)) {
            printf("# rank %d: %s: input element %zu changed\n", c->rank, what, i);
            bad = 1;
            break;
        }
    return bad;
}

static int cc_reduce_scatter(struct mg_comm *c, size_t count, enum mg_reduce_op op, unsigned t,
                             int in_place, const struct cc_opts *o)
{
    size_t total = count * (size_t)c->world;
    float *send = malloc((total ? total : 1) * sizeof(float));
    float *recv = malloc((count ? count : 1) * sizeof(float));
    float *scratch = malloc((total ? total : 1) * sizeof(float));
    int bad = !send || !recv || !scratch;
    if (!bad)
        bad = cc_reduce_scatter_in(c, send, in_place ? NULL : recv, scratch, count, op, t, o);
    free(send);
    free(recv);
    free(scratch);
    return bad;
}

static int cc_allreduce(struct mg_comm *c, size_t count, enum mg_reduce_op op, unsigned t,
                        const struct cc_opts *o)
{
    float *buf = malloc((count ? count : 1) * sizeof(float));
    if (!buf)
        return 1;
    int bad = cc_allreduce_in(c, buf, count, op, t, o);
    free(buf);
    return bad;
}

static int cc_broadcast(struct mg_comm *c, size_t len, int root, unsigned t)
{
    unsigned char *buf = malloc(len ? len : 1);
    int bad = 0;
    if (!buf)
        return 1;
    for (size_t i = 0; i < len; i++)
        buf[i] = c->rank == root ? (unsigned char)cc_mix(t * 1000003u + i) : 0xee;
    int rc = mg_comm_broadcast(c, buf, len, root, MG_COMM_DEFAULT_TIMEOUT);
    if (rc) {
        printf("# rank %d: broadcast of %zu bytes from %d failed: %s\n", c->rank, len, root,
               mg_comm_errmsg(c));
        bad = 1;
    }
    for (size_t i = 0; !bad && i < len; i++)
        if (buf[i] != (unsigned char)cc_mix(t * 1000003u + i)) {
            printf("# rank %d: broadcast of %zu bytes from %d: byte %zu wrong\n", c->rank, len,
                   root, i);
            bad = 1;
        }
    free(buf);
    return bad;
}

static int cc_allgather(struct mg_comm *c, size_t len, unsigned t, int in_place)
{
    unsigned char *send = malloc(len ? len : 1);
    unsigned char *recv = malloc(len * (size_t)c->world + 1);
    int bad = 0;
    if (!send || !recv) {
        free(send);
        free(recv);
        return 1;
    }
    memset(recv, 0xee, len * (size_t)c->world);
    unsigned char *mine = in_place ? recv + (size_t)c->rank * len : send;
    for (size_t i = 0; i < len; i++)
        mine[i] = (unsigned char)cc_mix(((uint64_t)t << 40) ^ ((uint64_t)c->rank << 32) ^ i);
    int rc = mg_comm_allgather(c, mine, recv, len, MG_COMM_DEFAULT_TIMEOUT);
    if (rc) {
        printf("# rank %d: allgather of %zu bytes failed: %s\n", c->rank, len, mg_comm_errmsg(c));
        bad = 1;
    }
    for (int q = 0; !bad && q < c->world; q++)
        for (size_t i = 0; i < len; i++)
            if (recv[(size_t)q * len + i] !=
                (unsigned char)cc_mix(((uint64_t)t << 40) ^ ((uint64_t)q << 32) ^ i)) {
                printf("# rank %d: allgather of %zu bytes: byte %zu of rank %d wrong\n", c->rank,
                       len, i, q);
                bad = 1;
                break;
            }
    free(send);
    free(recv);
    return bad;
}

/* Runs everything; returns the number of failed checks. */
static int cc_run_all(struct mg_comm *c, const struct cc_opts *o)
{
    static const size_t counts[] = {0,      1,      2,       3,           15,      16,    17,
                                    63,     255,    1000,    4097,        16384,   16385, 65537,
                                    100003, 262144, 1000003, 4194304 + 5, 16777216};
    static const size_t bytes[] = {0,     1,      3,       7,       64,       1000,    65536,
                                   65537, 262147, 1048576, 4194311, 16777216, 67108864};
    int bad = 0;
    unsigned t = 1;
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        if (counts[k] * sizeof(float) > o->max_bytes)
            continue;
        bad += cc_allreduce(c, counts[k], MG_REDUCE_SUM, t++, o);
        if (counts[k] <= 100003)
            bad += cc_allreduce(c, counts[k], MG_REDUCE_AVG, t++, o);
    }
    bad += cc_allreduce(c, 65537, MG_REDUCE_AVG, t++, o);
    static const size_t rs_counts[] = {0, 1, 3, 16, 17, 1000, 4097, 16384, 16385, 65537, 262147};
    for (size_t k = 0; k < sizeof(rs_counts) / sizeof(rs_counts[0]); k++) {
        if (rs_counts[k] * (size_t)c->world * sizeof(float) > o->max_bytes)
            continue;
        bad += cc_reduce_scatter(c, rs_counts[k], k % 2 ? MG_REDUCE_AVG : MG_REDUCE_SUM, t++,
                                 (int)(k / 2 % 2), o);
    }
    /* recv overlapping send other than in place is refused, on every rank alike */
    if (c->world > 1) {
        float both[64] = {0};
        if (mg_comm_reduce_scatter(c, both, both + 1 + (size_t)c->rank * 4, 4, MG_REDUCE_SUM,
                                   MG_COMM_DEFAULT_TIMEOUT) != -EINVAL) {
            printf("# rank %d: an overlapping reduce-scatter was accepted\n", c->rank);
            bad++;
        }
    }
    for (size_t k = 0; k < sizeof(bytes) / sizeof(bytes[0]); k++) {
        if (bytes[k] > o->max_bytes)
            continue;
        bad += cc_broadcast(c, bytes[k], (int)(k % (size_t)c->world), t++);
        if (bytes[k] * (size_t)c->world <= o->max_bytes)
            bad += cc_allgather(c, bytes[k], t++, (int)(k & 1));
    }
    for (int root = 0; root < c->world; root++)
        bad += cc_broadcast(c, 4099, root, t++);
    for (int i = 0; i < 3; i++)
        if (mg_comm_barrier(c, MG_COMM_DEFAULT_TIMEOUT)) {
            printf("# rank %d: barrier failed: %s\n", c->rank, mg_comm_errmsg(c));
            bad++;
        }
    /* A rerun repeats exactly: same inputs, same bits. */
    if (o->max_bytes >= 4 * 100003) {
        float *a = malloc(100003 * sizeof(float)), *b = malloc(100003 * sizeof(float));
        if (a && b) {
            for (int pass = 0; pass < 2; pass++) {
                float *x = pass ? b : a;
                for (size_t i = 0; i < 100003; i++)
                    x[i] = cc_val(c->rank, i, 999);
                if (mg_comm_allreduce(c, x, 100003, MG_REDUCE_AVG, MG_COMM_DEFAULT_TIMEOUT))
                    bad++;
            }
            if (memcmp(a, b, 100003 * sizeof(float)) != 0) {
                printf("# rank %d: the same allreduce twice gave different bits\n", c->rank);
                bad++;
            }
        }
        free(a);
        free(b);
    }
    fflush(stdout);
    return bad;
}

/* The allreduce checks in registered memory (mg_comm_mem_alloc): sizes from 1
 * float to max_bytes, sums and averages, at the start of the buffer and 3 floats
 * in (off a cache line), checked as cc_allreduce_in does, and against the same
 * allreduce in ordinary memory bit for bit. On a one-host (rank-ordered)
 * communicator of several ranks, exactly the allreduces of zc_from bytes or
 * more must have been zero-copy (SIZE_MAX: none); on the others, none.
 * Returns the number of failed checks. */
static int cc_run_registered(struct mg_comm *c, const struct cc_opts *o, size_t zc_from)
{
    static const size_t counts[] = {1,     2,      3,      15,      16,      17,
                                    63,    255,    1000,   4097,    16384,   16385,
                                    65537, 100003, 262144, 1000003, 4194309, 16777216};
    size_t maxf = o->max_bytes / sizeof(float);
    void *mem;
    int bad = 0,
        rc = mg_comm_mem_alloc(c, (maxf + 3) * sizeof(float), &mem, MG_COMM_DEFAULT_TIMEOUT);
    if (rc) {
        printf("# rank %d: registering %zu bytes failed: %s\n", c->rank, (maxf + 3) * sizeof(float),
               *mg_comm_errmsg(c) ? mg_comm_errmsg(c) : "out of memory");
        return 1;
    }
    float *reg = mem, *plain = malloc((maxf + 3) * sizeof(float));
    if (!plain) {
        mg_comm_mem_free(c, reg);
        return 1;
    }
    for (size_t i = 0; i < maxf + 3; i++)
        if (reg[i] != 0) {
            printf("# rank %d: registered memory is not zero-filled\n", c->rank);
            bad++;
            break;
        }
    uint64_t zc0 = c->zerocopy, want = 0;
    unsigned t = 7000;
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        size_t n = counts[k];
        if (n > maxf)
            continue;
        for (int shift = 0; shift < (n <= 1000003 ? 2 : 1); shift++) {
            enum mg_reduce_op op = (k + (size_t)shift) % 2 ? MG_REDUCE_AVG : MG_REDUCE_SUM;
            float *buf = reg + (shift ? 3 : 0);
            bad += cc_allreduce_in(c, buf, n, op, t, o);
            if (n * sizeof(float) >= zc_from)
                want++;
            if (n <= 1000003) {
                bad += cc_allreduce_in(c, plain, n, op, t, o);
                if (memcmp(plain, buf, n * sizeof(float)) != 0) {
                    printf("# rank %d: allreduce of %zu floats: registered and ordinary memory "
                           "give different bits\n",
                           c->rank, n);
                    bad++;
                }
            }
            t++;
        }
    }
    /* Reduce-scatters whose input is registered (zero-copy on one host), in
     * place and not, off a cache line and not: the bits of ordinary memory. */
    static const size_t rs_counts[] = {1, 17, 1000, 16385, 65537, 262147};
    float *recv = malloc((maxf + 3) * sizeof(float)), *scratch = malloc((maxf + 3) * sizeof(float));
    for (size_t k = 0; recv && scratch && k < sizeof(rs_counts) / sizeof(rs_counts[0]); k++) {
        size_t n = rs_counts[k], total = n * (size_t)c->world;
        if (total + 3 > maxf)
            continue;
        for (int v = 0; v < 3; v++) {
            enum mg_reduce_op op = (k + (size_t)v) % 2 ? MG_REDUCE_AVG : MG_REDUCE_SUM;
            float *send = reg + (v == 2 ? 3 : 0);
            bad += cc_reduce_scatter_in(c, send, v == 1 ? NULL : recv, scratch, n, op, t, o);
            /* cc_reduce_scatter_in's reference allreduce is in ordinary memory */
            if (total * sizeof(float) >= zc_from)
                want++;
            bad += cc_reduce_scatter_in(c, plain, recv, scratch, n, op, t, o);
            t++;
        }
    }
    free(recv);
    free(scratch);
    /* Allgathers into registered memory (zero-copy on one host: each block read
     * from its owner's), in place and not. */
    static const size_t ag_floats[] = {1, 100, 16385, 70000};
    float *mine = malloc(70000 * sizeof(float));
    for (size_t k = 0; mine && k < sizeof(ag_floats) / sizeof(ag_floats[0]); k++) {
        size_t n = ag_floats[k], total = n * (size_t)c->world;
        if (total > maxf)
            continue;
        for (int in_place = 0; in_place < 2; in_place++) {
            float *src = in_place ? reg + (size_t)c->rank * n : mine;
            for (size_t i = 0; i < n; i++)
                src[i] = cc_val(c->rank, i, t);
            if (mg_comm_allgather(c, src, reg, n * sizeof(float), MG_COMM_DEFAULT_TIMEOUT)) {
                printf("# rank %d: registered allgather of %zu floats failed: %s\n", c->rank, n,
                       mg_comm_errmsg(c));
                bad++;
                continue;
            }
            int wrong = 0;
            for (int q = 0; q < c->world && !wrong; q++)
                for (size_t i = 0; i < n && !wrong; i++)
                    wrong = reg[(size_t)q * n + i] != cc_val(q, i, t);
            if (wrong) {
                printf("# rank %d: registered allgather of %zu floats%s: wrong result\n", c->rank,
                       n, in_place ? " (in place)" : "");
                bad++;
            }
            if (total * sizeof(float) >= zc_from)
                want++;
            t++;
        }
    }
    free(mine);
    /* A rerun repeats exactly. */
    size_t n = maxf < 100003 ? maxf : 100003;
    bad += cc_allreduce_in(c, reg, n, MG_REDUCE_AVG, 999, o);
    memcpy(plain, reg, n * sizeof(float));
    bad += cc_allreduce_in(c, reg, n, MG_REDUCE_AVG, 999, o);
    if (n * sizeof(float) >= zc_from)
        want += 2;
    if (memcmp(plain, reg, n * sizeof(float)) != 0) {
        printf("# rank %d: the same registered allreduce twice gave different bits\n", c->rank);
        bad++;
    }
    if (!c->rank_ordered || c->world == 1)
        want = 0;
    if (c->zerocopy - zc0 != want) {
        printf("# rank %d: %llu allreduces were zero-copy, expected %llu (%s)\n", c->rank,
               (unsigned long long)(c->zerocopy - zc0), (unsigned long long)want, c->desc);
        bad++;
    }
    free(plain);
    mg_comm_mem_free(c, reg);
    fflush(stdout);
    return bad;
}

#endif
