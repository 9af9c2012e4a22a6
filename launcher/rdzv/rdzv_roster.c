/* The membership record of a formed round (rdzv_internal.h): its format
 * (the close record, blocks of members, the index from agent id to rank),
 * the closer's pipelined writes of it, the reads of it (block by block, as
 * a node needs them, and a member's rank from the index), the members a
 * node holds, and deleting an old round's keys. rdzv_round.c forms the
 * rounds it records. */
#include "rdzv_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CLOSE_MAX_BYTES (MG_KV_MAX_VALUE - 1)
/* The membership record: a round of at most ROSTER_INLINE nodes is one
 * record (NS/r/R/close); a larger one is written in blocks of ROSTER_BLOCK
 * members, the first in the close record, with an index from agent id to
 * rank, so that each node reads a few blocks rather than the whole roster
 * (which at thousands of nodes cost the store O(nodes^2) bytes a round). */
#ifndef ROSTER_INLINE /* (a build may set them small, to run every test through the blocks) */
#define ROSTER_INLINE 128
#define ROSTER_BLOCK  64
#endif
#define LINE_MAX_BYTES 1100 /* a member line: mg_rdzv_desc_format's longest, and "RANK ID" */

/* ---- the record's shape ---------------------------------------------------------- */

int rdzv_roster_nblocks(const struct rdzv_close_hdr *h)
{
    return (h->nnodes + h->block - 1) / h->block;
}

int rdzv_roster_block_len(const struct rdzv_close_hdr *h, int k)
{
    int n = h->nnodes - k * h->block;
    return n < h->block ? n : h->block;
}

/* The index record an agent id is listed in (FNV-1a of the id). */
static int index_of(const char *id, int nidx)
{
    uint32_t x = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)id; *p; p++)
        x = (x ^ *p) * 16777619u;
    return (int)(x % (uint32_t)nidx);
}

/* Parses n member lines, each after a '\n' from p on, into d. */
static int parse_lines(const char *p, struct mg_rdzv_desc *d, int n)
{
    for (int i = 0; i < n; i++) {
        if (!p || mg_rdzv_desc_parse(p + 1, &d[i]) < 0)
            return -MG_EFORMAT;
        p = strchr(p + 1, '\n');
    }
    return 0;
}

/* Parses a close record: its header, and block 0 into *b0 (allocated). */
int rdzv_close_parse(const char *v, struct rdzv_close_hdr *h, struct mg_rdzv_desc **b0)
{
    long long round, k;
    int used = 0;

    if (sscanf(v, "round=%lld restarts=%lld nnodes=%d world=%d%n", &round, &k, &h->nnodes,
               &h->world, &used) != 4 ||
        h->nnodes < 1 || h->nnodes > MG_RDZV_MAX_NODES)
        return -MG_EFORMAT;
    h->round = round;
    h->restarts = k;
    h->block = h->nnodes;
    h->tag = 0;
    h->nproc = 0;
    if (v[used] == ' ') {
        int more = 0;
        if (sscanf(v + used, " block=%d tag=%d%n", &h->block, &h->tag, &more) != 2 ||
            h->block < 1 || h->block > h->nnodes)
            return -MG_EFORMAT;
        /* nproc= (absent from an older closer's record) */
        if (sscanf(v + used + more, " nproc=%d", &h->nproc) != 1 || h->nproc < 1 ||
            (int64_t)h->nproc * h->nnodes != h->world)
            h->nproc = 0;
    }
    int n = rdzv_roster_block_len(h, 0);
    struct mg_rdzv_desc *d = calloc((size_t)n, sizeof(*d));
    if (!d)
        return -ENOMEM;
    if (parse_lines(strchr(v, '\n'), d, n) < 0) {
        free(d);
        return -MG_EFORMAT;
    }
    *b0 = d;
    return 0;
}

/* Reads NS/r/R/close: 1 and its parsed header and block 0 when it exists, 0
 * when not. */
int rdzv_read_close(struct mg_rdzv *r, int64_t round, struct rdzv_close_hdr *h,
                    struct mg_rdzv_desc **b0)
{
    char k[KEY_MAX], *v = NULL;
    size_t len;
    key(r, k, "r/%" PRId64 "/close", round);
    int rc = r->kv->ops->get(r->kv, k, &v, &len, NULL);
    if (rc == -MG_ENOKEY)
        return 0;
    if (rc < 0)
        return kvfail(r, "reading the round", rc);
    rc = rdzv_close_parse(v, h, b0);
    free(v);
    if (rc < 0) {
        say(r, "round %" PRId64 ": malformed membership record", round);
        return rc;
    }
    return 1;
}

/* Reads block k of round h->round's members into *b (block 0: from the
 * close record). */
int rdzv_read_block(struct mg_rdzv *r, const struct rdzv_close_hdr *h, int k, struct rdzv_block *b)
{
    char kk[KEY_MAX], *v = NULL;
    size_t len;
    int n = rdzv_roster_block_len(h, k), rc;

    if (k == 0) {
        struct rdzv_close_hdr h0;
        rc = rdzv_read_close(r, h->round, &h0, &b->d);
        if (rc == 0) {
            say(r, "round %" PRId64 ": its membership record is gone", h->round);
            return -MG_ENOKEY;
        }
        b->base = 0;
        b->n = n;
        return rc < 0 ? rc : 0;
    }
    key(r, kk, "r/%" PRId64 "/m/%d/%d", h->round, h->tag, k);
    rc = r->kv->ops->get(r->kv, kk, &v, &len, NULL);
    if (rc == -MG_ENOKEY) {
        say(r, "round %" PRId64 ": block %d of its membership record is gone", h->round, k);
        return rc;
    }
    if (rc < 0)
        return kvfail(r, "reading the round's members", rc);
    b->d = calloc((size_t)n, sizeof(*b->d));
    if (!b->d) {
        free(v);
        return -ENOMEM;
    }
    if (sscanf(v, "base=%d", &b->base) != 1 || b->base < 0 ||
        parse_lines(strchr(v, '\n'), b->d, n) < 0) {
        free(v);
        free(b->d);
        b->d = NULL;
        say(r, "round %" PRId64 ": malformed block %d of its membership record", h->round, k);
        return -MG_EFORMAT;
    }
    free(v);
    b->n = n;
    return 0;
}

/* Looks agent id up in round h's index: its rank into *rank, -1 when it is
 * not a member. */
int rdzv_index_lookup(struct mg_rdzv *r, const struct rdzv_close_hdr *h, const char *id, int *rank)
{
    char k[KEY_MAX], *v = NULL;
    size_t len, idl = strlen(id);
    int nidx = rdzv_roster_nblocks(h);

    *rank = -1;
    key(r, k, "r/%" PRId64 "/i/%d/%d", h->round, h->tag, index_of(id, nidx));
    int rc = r->kv->ops->get(r->kv, k, &v, &len, NULL);
    if (rc == -MG_ENOKEY)
        return 0; /* no member hashes there */
    if (rc < 0)
        return kvfail(r, "reading the round's index", rc);
    for (const char *p = v; *p;) {
        char *end;
        long x = strtol(p, &end, 10);
        const char *nl = strchr(end, '\n');
        size_t n = nl ? (size_t)(nl - end) : strlen(end);
        if (n == idl + 1 && end[0] == ' ' && memcmp(end + 1, id, idl) == 0 && x >= 0 &&
            x < h->nnodes) {
            *rank = (int)x;
            break;
        }
        if (!nl)
            break;
        p = nl + 1;
    }
    free(v);
    return 0;
}

void rdzv_roster_free(struct mg_rdzv *r)
{
    int nb = r->mblock > 0 ? (r->nmembers + r->mblock - 1) / r->mblock : 0;
    for (int i = 0; r->mblk && i < nb; i++)
        free(r->mblk[i].d);
    free(r->mblk);
    r->mblk = NULL;
    r->nmembers = 0;
}

int rdzv_member(struct mg_rdzv *r, int i, const struct mg_rdzv_desc **m)
{
    if (i < 0 || i >= r->nmembers || !r->mblk)
        return -EINVAL;
    struct rdzv_block *b = &r->mblk[i / r->mblock];
    if (!b->d) {
        struct rdzv_close_hdr h = {
            .round = r->round, .nnodes = r->nmembers, .block = r->mblock, .tag = r->mtag};
        int rc = rdzv_read_block(r, &h, i / r->mblock, b);
        if (rc < 0)
            return rc;
    }
    *m = &b->d[i % r->mblock];
    return 0;
}

/* Every member of round `round` (count_restart's previous round), into *out. */
int rdzv_read_all(struct mg_rdzv *r, int64_t round, struct rdzv_close_hdr *h,
                  struct mg_rdzv_desc **out)
{
    struct mg_rdzv_desc *b0 = NULL, *d;
    int rc = rdzv_read_close(r, round, h, &b0);
    if (rc <= 0)
        return rc < 0 ? rc : -MG_ENOKEY;
    d = realloc(b0, (size_t)h->nnodes * sizeof(*d));
    if (!d) {
        free(b0);
        return -ENOMEM;
    }
    for (int k = 1; k < rdzv_roster_nblocks(h); k++) {
        struct rdzv_block b;
        rc = rdzv_read_block(r, h, k, &b);
        if (rc < 0) {
            free(d);
            return rc;
        }
        memcpy(&d[k * h->block], b.d, (size_t)b.n * sizeof(*d));
        free(b.d);
    }
    *out = d;
    return 0;
}

/* Deletes what is left of an old round (best effort). */
void rdzv_forget_round(struct mg_rdzv *r, int64_t round)
{
    char k[KEY_MAX];
    struct mg_kv_entry *e = NULL;
    int n = 0;
    key(r, k, "r/%" PRId64 "/", round);
    if (r->kv->ops->list(r->kv, k, MG_RDZV_MAX_NODES * 3 + 8, 0, &e, &n) < 0)
        return;
    /* pipelined: a round of 10,000 nodes leaves over 20,000 keys */
    const char **keys = malloc((size_t)(n ? n : 1) * sizeof(*keys));
    for (int i = 0; keys && i < n; i++)
        keys[i] = e[i].key;
    if (keys)
        mg_kv_del_many(r->kv, keys, n);
    free(keys);
    mg_kv_free_list(e, n);
}

/* ---- writing it (the closer) ------------------------------------------------------ */

/* Appends member lines d[0..n) to buf (at *off, cap bytes). */
static int put_lines(char *buf, size_t cap, size_t *off, const struct mg_rdzv_desc *d, int n)
{
    for (int i = 0; i < n; i++) {
        if (*off + 1 >= cap)
            return -MG_ETOOBIG;
        buf[(*off)++] = '\n';
        int w = mg_rdzv_desc_format(&d[i], buf + *off, cap - *off);
        if (w < 0)
            return w;
        *off += (size_t)w;
    }
    return 0;
}

/* Writes round R's membership record: the members d[0..nd) in rank order.
 * A round of more than ROSTER_INLINE nodes gets its blocks after the first
 * (NS/r/R/m/TAG/K: "base=FIRST_GLOBAL_RANK" and the block's members) and its
 * index (NS/r/R/i/TAG/H: "RANK ID" lines of the members whose id hashes to
 * H) before the close record that names them: whoever reads the close record
 * finds them. TAG is this closer's place in the join count, so that two
 * closers never write the same keys: only the close record's compare-and-
 * swap decides, and the loser deletes its own. 1 when this call closed the
 * round, 0 when another closer did, < 0. */
int rdzv_write_roster(struct mg_rdzv *r, int64_t round, int64_t restarts,
                      const struct mg_rdzv_desc *d, int nd, struct rdzv_close_hdr *hout)
{
    struct rdzv_close_hdr h = {
        .round = round, .restarts = restarts, .nnodes = nd, .tag = (int)r->jpos};
    char k[KEY_MAX];
    char *buf = NULL, **keys = NULL, **vals = NULL;
    size_t *lens = NULL;
    int *order = NULL, *start = NULL, rc = 0, world = 0, nb, nw = 0, same = 1;
    size_t off = 0, cap;

    h.block = nd <= ROSTER_INLINE ? nd : ROSTER_BLOCK;
    nb = rdzv_roster_nblocks(&h);
    for (int i = 0; i < nd; i++) {
        world += d[i].nproc;
        same &= d[i].nproc == d[0].nproc;
    }
    h.world = world;
    /* nproc=K when every member has K workers: a node then knows its first
     * global rank from its rank alone, without reading its block */
    h.nproc = nb > 1 && same ? d[0].nproc : 0;
    cap = 128 + (size_t)h.block * LINE_MAX_BYTES;
    if ((buf = malloc(cap)) == NULL)
        return -ENOMEM;
    if (nb > 1) {
        /* The blocks after the first and the index records, written in a few
         * round trips (pipelined) rather than one per record. */
        keys = calloc((size_t)nb * 2, sizeof(*keys));
        vals = calloc((size_t)nb * 2, sizeof(*vals));
        lens = calloc((size_t)nb * 2, sizeof(*lens));
        order = malloc((size_t)nd * sizeof(*order));
        start = calloc((size_t)nb + 1, sizeof(*start));
        if (!keys || !vals || !lens || !order || !start) {
            rc = -ENOMEM;
            goto out;
        }
    }
    for (int kb = 1, base = 0; kb < nb && rc >= 0; kb++) {
        for (int i = (kb - 1) * h.block; i < kb * h.block; i++)
            base += d[i].nproc;
        off = (size_t)snprintf(buf, cap, "base=%d", base);
        rc = put_lines(buf, cap, &off, d + kb * h.block, rdzv_roster_block_len(&h, kb));
        key(r, k, "r/%" PRId64 "/m/%d/%d", round, h.tag, kb);
        if (rc >= 0 && (!(keys[nw] = strdup(k)) || !(vals[nw] = malloc(off + 1))))
            rc = -ENOMEM;
        if (rc >= 0) {
            memcpy(vals[nw], buf, off);
            lens[nw++] = off;
        }
    }
    /* the index: the members by bucket (a counting sort; start[b] .. start[b + 1]
     * of order are bucket b's, in rank order) */
    for (int i = 0; i < nd && nb > 1; i++)
        start[index_of(d[i].id, nb) + 1]++;
    for (int b = 0; b < nb && nb > 1; b++)
        start[b + 1] += start[b];
    for (int i = 0; i < nd && nb > 1; i++)
        order[start[index_of(d[i].id, nb)]++] = i; /* start[b] moves to bucket b's end */
    for (int b = nb; b > 0 && nb > 1; b--)
        start[b] = start[b - 1];
    if (nb > 1)
        start[0] = 0;
    for (int b = 0; b < nb && nb > 1 && rc >= 0; b++) {
        int lo = start[b], hi = start[b + 1];
        if (lo == hi)
            continue; /* no member hashes there */
        char *v = malloc((size_t)(hi - lo) * (MG_RDZV_ID_MAX + 16));
        if (!v) {
            rc = -ENOMEM;
            break;
        }
        off = 0;
        for (int j = lo; j < hi; j++)
            off += (size_t)sprintf(v + off, "%d %s\n", order[j], d[order[j]].id);
        key(r, k, "r/%" PRId64 "/i/%d/%d", round, h.tag, b);
        vals[nw] = v;
        lens[nw] = off;
        if (!(keys[nw++] = strdup(k)))
            rc = -ENOMEM;
    }
    if (rc >= 0 && nw > 0 &&
        (rc = mg_kv_set_many(r->kv, (const char *const *)keys, (const char *const *)vals, lens,
                             nw)) < 0)
        kvfail(r, "writing the round's members", rc);
    if (rc >= 0) {
        off =
            (size_t)snprintf(buf, cap, "round=%" PRId64 " restarts=%" PRId64 " nnodes=%d world=%d",
                             round, restarts, nd, world);
        if (nb > 1)
            off += (size_t)snprintf(buf + off, cap - off, " block=%d tag=%d", h.block, h.tag);
        if (h.nproc)
            off += (size_t)snprintf(buf + off, cap - off, " nproc=%d", h.nproc);
        rc = put_lines(buf, cap, &off, d, rdzv_roster_block_len(&h, 0));
        if (rc >= 0 && off >= CLOSE_MAX_BYTES)
            rc = -MG_ETOOBIG;
        if (rc == -MG_ETOOBIG)
            say(r, "round %" PRId64 ": the membership record is too large", round);
    }
    if (rc >= 0) {
        key(r, k, "r/%" PRId64 "/close", round);
        rc = r->kv->ops->cas(r->kv, k, NULL, 0, buf, off, 0, NULL, NULL);
        if (rc < 0)
            kvfail(r, "closing the round", rc);
    }
    if (rc <= 0 && nb > 1) {
        /* another closer's record won (or this one failed): drop this one's blocks */
        for (int kb = 1; kb < nb; kb++) {
            key(r, k, "r/%" PRId64 "/m/%d/%d", round, h.tag, kb);
            r->kv->ops->del(r->kv, k);
            key(r, k, "r/%" PRId64 "/i/%d/%d", round, h.tag, kb);
            r->kv->ops->del(r->kv, k);
        }
        key(r, k, "r/%" PRId64 "/i/%d/0", round, h.tag);
        r->kv->ops->del(r->kv, k);
    }
    *hout = h;
out:
    for (int i = 0; keys && i < nb * 2; i++) {
        free(keys[i]);
        free(vals[i]);
    }
    free(keys);
    free(vals);
    free(lens);
    free(order);
    free(start);
    free(buf);
    return rc;
}
