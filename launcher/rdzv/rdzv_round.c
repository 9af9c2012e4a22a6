/* Forming a round of the multi-node rendezvous (rdzv_proto.h): finding the
 * open round and joining it, or waiting as a spare, or asking for a new one;
 * closing it once enough nodes joined (claiming the close, the live joiners,
 * node ranks, whether a restart counts; rdzv_roster.c writes the membership
 * record); and taking the formed round. */
#include "rdzv_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* When a node other than the last to join closes a round (see round_iter). */
#define CLOSE_GRACE_MS   500
#define CLOSE_STAGGER_MS 50
/* How old a node's count of the live agents may be while it waits in a
 * round (see live_count). */
#define LIVE_EVERY_MS 1000
/* How long a node waiting in a round may go without reading the state and
 * the count again while nothing changes (see round_iter). */
#define QUIET_MS        1000
#define QUIET_MIN_NODES 128

/* What one pass of a join step tells mg_rdzv_join_step, besides 1 (formed)
 * and errors: it waited (return to the caller), start over from the top, or
 * continue at once in the same phase. */
#define STEP_WAITED     0
#define STEP_AGAIN      2
#define STEP_AGAIN_SAME 3

/* ---- closing a round ------------------------------------------------------------ */

/* A round that follows a worker failure (cause f) decides whether the
 * restart counts: it does when every member of the failed round is back, and
 * not when one is gone (its death made the workers fail: a membership
 * change). Past --max_restarts the job fails with the recorded root cause.
 * Returns 1 to go on closing (st updated), 0 when the state moved on, < 0. */
static int cmp_id(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int count_restart(struct mg_rdzv *r, int64_t round, struct rdzv_state *st,
                         const struct mg_rdzv_desc *d, int nd)
{
    struct mg_rdzv_desc *prev = NULL;
    struct rdzv_close_hdr ph;
    const char **ids;
    int all, rc;

    if (st->cause != 'f' || round == 0)
        return 1;
    rc = rdzv_read_all(r, round - 1, &ph, &prev);
    if (rc < 0)
        return rc;
    /* every member of the failed round among the new members: sorted ids and
     * a binary search, as rounds have thousands of members */
    ids = malloc((size_t)(nd ? nd : 1) * sizeof(*ids));
    if (!ids) {
        free(prev);
        return -ENOMEM;
    }
    for (int i = 0; i < nd; i++)
        ids[i] = d[i].id;
    qsort(ids, (size_t)nd, sizeof(*ids), cmp_id);
    all = 1;
    for (int i = 0; i < ph.nnodes && all; i++) {
        const char *id = prev[i].id;
        all = bsearch(&id, ids, (size_t)nd, sizeof(*ids), cmp_id) != NULL;
    }
    free(ids);
    free(prev);
    struct rdzv_state to = *st;
    to.restarts += all;
    to.cause = all ? 'c' : 'm';
    if (to.restarts > r->max_restarts) {
        struct mg_rdzv_failure f;
        char k[KEY_MAX], *v = NULL;
        size_t len;
        key(r, k, "r/%" PRId64 "/failure", round - 1);
        if (r->kv->ops->get(r->kv, k, &v, &len, NULL) != 0 || rdzv_fail_parse(v, &f) < 0) {
            memset(&f, 0, sizeof(f));
            f.rank = f.local_rank = -1;
            f.exit_code = 1;
            snprintf(f.host, sizeof(f.host), "?");
            snprintf(f.message, sizeof(f.message), "a worker failed and no restarts are left");
        }
        free(v);
        rc = rdzv_mark_failed(r, st, &f);
        return rc < 0 ? rc : -MG_EPEER;
    }
    rc = rdzv_state_cas(r, st, &to);
    if (rc != 1)
        return rc;
    *st = to;
    return 1;
}

static int take_round(struct mg_rdzv *r, const struct rdzv_close_hdr *h, struct mg_rdzv_desc *b0,
                      int me, const struct mg_rdzv_desc *all, struct mg_rdzv_world *w);

/* Claims the closing of round R (NS/r/R/closing: the closer's agent id),
 * so that one node at a time reads the joins and writes the membership. A
 * closer of a round of thousands reads and writes O(nodes); when it was
 * slow, the nodes that step in for it after their grace all did the same
 * at once, each slowing the store further (a 10,000-node round had dozens
 * of closers and never formed). A claim whose holder is no longer alive
 * (NS/a/ID gone) is taken over. 1 claimed (or held already), 0 another live
 * node holds it, < 0. */
static int claim_close(struct mg_rdzv *r, int64_t round)
{
    char k[KEY_MAX], ak[KEY_MAX], *cur = NULL;
    size_t len, idl = strlen(r->id);
    key(r, k, "r/%" PRId64 "/closing", round);
    int rc = r->kv->ops->cas(r->kv, k, NULL, 0, r->id, idl, 0, &cur, &len);
    for (int i = 0; rc == 0 && i < CAS_TRIES; i++) {
        if (!cur || (len == idl && memcmp(cur, r->id, idl) == 0)) {
            rc = 1; /* held already (a claim of an earlier pass) */
            break;
        }
        key(r, ak, "a/%s", cur);
        rc = r->kv->ops->get(r->kv, ak, NULL, NULL, NULL);
        if (rc == 0)
            break; /* alive: it goes on closing (rc 0: not ours) */
        if (rc != -MG_ENOKEY)
            break;
        char *held = cur; /* the holder died: take it over */
        size_t hl = len;
        cur = NULL;
        rc = r->kv->ops->cas(r->kv, k, held, hl, r->id, idl, 0, &cur, &len);
        free(held);
    }
    free(cur);
    if (rc < 0)
        return kvfail(r, "claiming the round's close", rc);
    return rc;
}

/* Closes round R with the live agents that joined it, if there are enough.
 * Returns 1 when this call closed it and this node, a member, took it from
 * what it wrote (*w filled: no need to read it back), CLOSE_BUSY when another
 * live node is closing it, 0 (closed by another, or by us without us, or not
 * closable yet), or < 0. */
#define CLOSE_BUSY 2
static int try_close(struct mg_rdzv *r, int64_t round, struct rdzv_state *st,
                     struct mg_rdzv_world *w)
{
    char k[KEY_MAX];
    struct mg_kv_entry *joined = NULL, *alive = NULL;
    struct mg_rdzv_desc *d = NULL;
    int nj = 0, na = 0, nd = 0, rc, claimed = 0;
    size_t askip, jskip;

    rc = claim_close(r, round);
    if (rc <= 0)
        return rc < 0 ? rc : CLOSE_BUSY; /* another live node is closing it */
    claimed = 1;
    key(r, k, "r/%" PRId64 "/j/", round);
    jskip = strlen(k);
    rc = r->kv->ops->list(r->kv, k, MG_RDZV_MAX_NODES, 1, &joined, &nj);
    if (rc < 0) {
        rc = kvfail(r, "listing the joined nodes", rc);
        goto out;
    }
    rc = rdzv_list_alive(r, &alive, &na, &askip);
    if (rc < 0)
        goto out;
    d = calloc((size_t)(nj ? nj : 1), sizeof(*d));
    if (!d) {
        rc = -ENOMEM;
        goto out;
    }
    for (int i = 0; i < nj; i++) {
        if (!rdzv_in_list(alive, na, askip, joined[i].key + jskip))
            continue; /* joined, then died */
        if (!joined[i].val || mg_rdzv_desc_parse(joined[i].val, &d[nd]) < 0)
            continue;
        nd++;
    }
    if (nd < r->min) {
        rc = 0;
        goto out;
    }
    mg_rdzv_rank_order(d, nd);
    if (nd > r->max)
        nd = r->max; /* the rest wait for a later round */
    rc = count_restart(r, round, st, d, nd);
    if (rc != 1)
        goto out; /* the job failed, or the state moved on */
    if (r->fixed >= 0) {
        /* static: every rank 0..N-1 exactly once */
        for (int i = 0; i < nd; i++) {
            if (d[i].fixed != i) {
                struct mg_rdzv_failure f = {.rank = -1, .local_rank = -1, .exit_code = 1};
                snprintf(f.host, sizeof(f.host), "%s", d[i].host);
                if (i > 0 && d[i].fixed == d[i - 1].fixed)
                    snprintf(f.message, sizeof(f.message),
                             "--node_rank %d given to two nodes: %.200s and %.200s", d[i].fixed,
                             d[i - 1].host, d[i].host);
                else
                    snprintf(f.message, sizeof(f.message),
                             "no node has --node_rank %d (of --nnodes %d)", i, r->max);
                rc = rdzv_mark_failed(r, st, &f);
                if (rc == 0)
                    rc = -MG_EPEER;
                goto out;
            }
        }
    }
    struct rdzv_close_hdr h;
    rc = rdzv_write_roster(r, round, st->restarts, d, nd, &h);
    if (rc == 1 && round >= 2)
        rdzv_forget_round(r, round - 2);
    if (rc == 1) {
        int me = -1, n0 = rdzv_roster_block_len(&h, 0);
        for (int i = 0; i < nd && me < 0; i++)
            if (strcmp(d[i].id, r->id) == 0)
                me = i;
        struct mg_rdzv_desc *b0 = me < 0 ? NULL : malloc((size_t)n0 * sizeof(*b0));
        rc = 0;
        if (b0) {
            memcpy(b0, d, (size_t)n0 * sizeof(*b0));
            rc = take_round(r, &h, b0, me, d, w);
        }
        claimed = 0; /* closed: the claim goes with the round's keys */
    }
out:
    if (claimed) {
        /* not closed (too few live joiners, or the state moved on): let
         * another try later */
        key(r, k, "r/%" PRId64 "/closing", round);
        r->kv->ops->del(r->kv, k);
    }
    free(d);
    mg_kv_free_list(joined, nj);
    mg_kv_free_list(alive, na);
    return rc;
}

/* ---- taking the formed round --------------------------------------------------- */

/* Takes round h->round, whose close record gave h and block 0 (b0, which
 * this takes over), when this node is in it: finds its rank (me, when the
 * caller knows it; else block 0, else the index), and its first global rank
 * (all: every member, from the closer; else from nproc= in the record; else
 * from its own block, read). Holds the blocks it has (the closer: its own
 * and those of the members it watches); the others are read when first
 * needed. 1 (*w filled), 0 when this node is not a member, < 0. */
static int take_round(struct mg_rdzv *r, const struct rdzv_close_hdr *h, struct mg_rdzv_desc *b0,
                      int me, const struct mg_rdzv_desc *all, struct mg_rdzv_world *w)
{
    int nb = rdzv_roster_nblocks(h), rc, n0 = rdzv_roster_block_len(h, 0);
    struct rdzv_block *blk;

    for (int i = 0; i < n0 && me < 0; i++)
        if (strcmp(b0[i].id, r->id) == 0)
            me = i;
    if (me < 0 && nb > 1) {
        rc = rdzv_index_lookup(r, h, r->id, &me);
        if (rc < 0) {
            free(b0);
            return rc;
        }
    }
    if (me < 0) {
        free(b0);
        return 0;
    }
    blk = calloc((size_t)nb, sizeof(*blk));
    if (!blk) {
        free(b0);
        return -ENOMEM;
    }
    blk[0] = (struct rdzv_block){.base = 0, .n = n0, .d = b0};
    int mine = me / h->block, base = 0;
    if (all) {
        /* the closer: every member at hand */
        for (int k = 1; k < nb; k++) {
            int keep = 0;
            for (int i = 0; i <= RDZV_WATCH_NEXT && i < h->nnodes; i++)
                keep |= (me + i) % h->nnodes / h->block == k;
            if (!keep)
                continue;
            blk[k].n = rdzv_roster_block_len(h, k);
            blk[k].d = malloc((size_t)blk[k].n * sizeof(*blk[k].d));
            if (!blk[k].d) {
                rc = -ENOMEM;
                goto fail;
            }
            memcpy(blk[k].d, all + k * h->block, (size_t)blk[k].n * sizeof(*blk[k].d));
            for (int i = 0; i < k * h->block; i++)
                blk[k].base += all[i].nproc;
        }
        for (int i = 0; i < me; i++)
            base += all[i].nproc;
    } else if (h->nproc > 0) {
        base = me * h->nproc; /* every member has nproc workers */
    } else {
        if (mine > 0) {
            rc = rdzv_read_block(r, h, mine, &blk[mine]);
            if (rc < 0)
                goto fail;
        }
        base = blk[mine].base;
        for (int i = mine * h->block; i < me; i++)
            base += blk[mine].d[i % h->block].nproc;
    }
    if (blk[mine].d && strcmp(blk[mine].d[me % h->block].id, r->id) != 0) {
        say(r, "round %" PRId64 ": its index and its members disagree", h->round);
        rc = -MG_EFORMAT;
        goto fail;
    }
    for (int k = 0; k < nb; k++)
        if (blk[k].d && !blk[k].n)
            blk[k].n = rdzv_roster_block_len(h, k);
    memset(w, 0, sizeof(*w));
    w->round = (int)h->round;
    w->restart_count = (int)h->restarts;
    w->node_rank = me;
    w->nnodes = h->nnodes;
    w->world_size = h->world;
    w->rank_base = base;
    snprintf(w->master_addr, sizeof(w->master_addr), "%s", b0[0].addr);
    w->master_port = b0[0].port;
    w->master_fd = -1;
    if (me == 0) {
        w->master_fd = r->listen_fd;
    } else if (r->listen_fd >= 0) {
        close(r->listen_fd);
    }
    r->listen_fd = -1;
    /* keep the blocks of this node and of the members it watches */
    for (int k = 0; k < nb; k++) {
        int keep = 0;
        for (int i = 0; i <= RDZV_WATCH_NEXT && i < h->nnodes; i++)
            keep |= (me + i) % h->nnodes / h->block == k;
        if (!keep) {
            free(blk[k].d);
            blk[k].d = NULL;
        }
    }
    rdzv_roster_free(r);
    r->mblk = blk;
    r->nmembers = h->nnodes;
    r->mblock = h->block;
    r->mtag = h->tag;
    r->round = h->round;
    r->restarts = h->restarts;
    r->prev_rank = me;
    r->formed = 1;
    r->last_ok = mg_now_ms();
    /* at a random point of the interval: the round's nodes out of step */
    r->next_tick = r->last_ok + rdzv_first_tick(r);
    return 1;
fail:
    for (int k = 0; k < nb; k++)
        free(blk[k].d);
    free(blk);
    return rc;
}

/* ---- joining -------------------------------------------------------------------- */

/* NS/r/ROUND/n: how many nodes joined the round. */
static int64_t get_count(struct mg_rdzv *r, int64_t round, int *rcp)
{
    char k[KEY_MAX], *v = NULL;
    size_t len;
    key(r, k, "r/%" PRId64 "/n", round);
    *rcp = r->kv->ops->get(r->kv, k, &v, &len, NULL);
    if (*rcp == -MG_ENOKEY) {
        *rcp = 0;
        return 0;
    }
    if (*rcp < 0) {
        kvfail(r, "reading the join count", *rcp);
        return 0;
    }
    int64_t c = strtoll(v, NULL, 10);
    free(v);
    return c;
}

/* How many agents are alive, for a node waiting in a round whose count is
 * c. A listing costs the store O(nodes), and a node asks in every pass, so
 * it lists again only when c has reached the number it listed last (then
 * every live agent may have joined) or that number is LIVE_EVERY_MS old
 * (nodes may have died): in a re-formation of thousands of nodes, one
 * listing per node instead of one per node and pass. */
static int live_count(struct mg_rdzv *r, int64_t c, int *na)
{
    int64_t now = mg_now_ms();
    if (r->live_at >= 0 && c < r->live_n && now < r->live_at + LIVE_EVERY_MS) {
        *na = r->live_n;
        return 0;
    }
    int rc;
    if (r->kv->ops->count) {
        /* the number only: every joiner of a re-formation of 10,000 nodes
         * listing the 10,000 live agents cost the store O(nodes^2) bytes */
        char k[KEY_MAX];
        key(r, k, "a/");
        rc = r->kv->ops->count(r->kv, k, na);
        if (rc < 0)
            return kvfail(r, "counting the live nodes", rc);
    } else {
        struct mg_kv_entry *alive = NULL;
        size_t skip;
        rc = rdzv_list_alive(r, &alive, na, &skip);
        mg_kv_free_list(alive, *na);
        if (rc < 0)
            return rc;
    }
    r->live_at = now;
    r->live_n = *na;
    return 0;
}

/* One pass of the wait for round R, after joining it. Returns 1 formed (*w
 * filled), STEP_AGAIN when the round went on without us or the state moved
 * (start over), STEP_WAITED after waiting up to max_block ms, < 0 error. */
static int round_iter(struct mg_rdzv *r, struct mg_rdzv_world *w, int max_block)
{
    char k[KEY_MAX];
    struct mg_rdzv_desc *m = NULL;
    struct rdzv_close_hdr h;
    struct rdzv_state st;
    int64_t round = r->jround, c;
    int rc;

    if (r->jfresh) {
        /* The pass right after joining: the state, the round still open and
         * the count are what the join itself saw a moment ago, so the reads
         * below would tell nothing new (three requests a node; the wait for
         * the close record at the end of this pass catches a change). */
        r->jfresh = 0;
        st = r->jst;
        c = r->jpos;
        goto decide;
    }
    if (max_block > 0 && r->jcount >= QUIET_MIN_NODES && mg_now_ms() < r->jquiet_until) {
        /* The last pass's wait for the close record ended without a change,
         * and this node read the state and the count less than QUIET_MS
         * ago: thousands of nodes waiting for the last ones to join would
         * otherwise read both and the record again every slice (about 20
         * requests a second each). A change of the state (a failure, the
         * job ended) is seen within a heartbeat interval (at least
         * QUIET_MS). Small rounds, where that load does not matter, read in
         * every pass as before. */
        st = r->jst;
        c = r->jcount;
        goto decide;
    }
    /* The close record: not in a large round with a backend whose wait
     * returns it (the wait at the end of this pass answers at once when it
     * exists), one request a node and heartbeat fewer. */
    rc = max_block > 0 && r->jcount >= QUIET_MIN_NODES && r->kv->ops->watch
             ? 0
             : rdzv_read_close(r, round, &h, &m);
    if (rc < 0)
        return rc;
    if (rc == 1) {
        rc = take_round(r, &h, m, -1, NULL, w);
        return rc == 0 ? STEP_AGAIN : rc;
    }
    rc = rdzv_state_read(r, &st);
    if (rc < 0)
        return rc;
    if (st.round != round || st.status != 'r')
        return STEP_AGAIN;
    if (mg_now_ms() >= r->jdeadline) {
        int got;
        c = get_count(r, round, &got);
        say(r,
            "round %" PRId64 " did not form within join_timeout (%gs): %" PRId64
            " node(s) joined, --nnodes needs at least %d",
            round, r->conf.join_timeout_ms / 1000.0, c, r->min);
        return -ETIMEDOUT;
    }

    c = get_count(r, round, &rc);
    if (rc < 0)
        return rc;
    r->jst = st;
    /* Until the next heartbeat (at least QUIET_MS): the heartbeat's ping
     * drops the wait parked on the store anyway, so the reads go with it,
     * and a round of thousands costs the store a few requests per node and
     * heartbeat_interval while it waits. */
    r->jquiet_until = rdzv_later(mg_now_ms() + QUIET_MS, r->next_tick);
decide:
    r->jcount = c;
    if (c < r->min && round > 0 && r->nmembers > 0 &&
        (r->jpos == c || mg_now_ms() >= r->jat + CLOSE_GRACE_MS +
                                            (c > r->jpos ? c - r->jpos : 0) * CLOSE_STAGGER_MS)) {
        /* A re-formation that cannot reach MIN because a member died: fail
         * now rather than at join_timeout (a replacement would be a new job).
         * The last node to join looks (the live nodes' count), the others
         * only when it has not moved on, as with closing; and only when too
         * few are alive, which member died (a listing and the old roster). */
        int na = 0, dead = -1;
        rc = live_count(r, c, &na);
        if (rc < 0)
            return rc;
        if (na < r->min) {
            struct mg_kv_entry *alive = NULL;
            size_t skip;
            rc = rdzv_list_alive(r, &alive, &na, &skip);
            if (rc < 0)
                return rc;
            /* the previous round's members (held by block, read as needed;
             * when they are gone already, the join timeout says it) */
            for (int i = 0; i < r->nmembers && dead < 0; i++) {
                const struct mg_rdzv_desc *mi;
                if (rdzv_member(r, i, &mi) < 0)
                    break;
                if (!rdzv_in_list(alive, na, skip, mi->id))
                    dead = i;
            }
            mg_kv_free_list(alive, na);
        }
        if (dead >= 0 && na < r->min) {
            rdzv_below_min(r, &st, dead, na); /* mark_failed says why */
            return -MG_EPEER;
        }
    }
    int64_t now = mg_now_ms(), fallback = -1;
    int may_close = 1;
    if (c >= r->min) {
        if (r->min_seen < 0)
            r->min_seen = now;
        if (r->last_call < 0)
            r->last_call = now + r->conf.last_call_timeout_ms;
        /* Only the last node to join closes at once; another one steps in
         * when it has not (it died, or the round lacks live nodes), the
         * nearest first: CLOSE_GRACE_MS, plus CLOSE_STAGGER_MS per place
         * between them. */
        int64_t base = c < r->max && round == 0 ? r->last_call : r->min_seen;
        int64_t dist = c > r->jpos ? c - r->jpos : 0;
        fallback = base + CLOSE_GRACE_MS + dist * CLOSE_STAGGER_MS;
        may_close = (r->jpos == c || now >= fallback) && now >= r->claim_retry_at;
    }
    int close_now = may_close && c >= r->max;
    if (!close_now && may_close && c >= r->min) {
        if (now >= r->last_call)
            close_now = 1;
        if (!close_now && round > 0) {
            /* A re-formation: no need to wait once every live agent joined. */
            int na = 0;
            rc = live_count(r, c, &na);
            if (rc < 0)
                return rc;
            close_now = c >= na;
        }
    }
    if (close_now) {
        rc = try_close(r, round, &st, w);
        if (rc == 1 || rc < 0)
            return rc; /* 1: closed it and took it */
        if (rc == CLOSE_BUSY) {
            /* Another live node is closing it: look again at the next
             * heartbeat (the wait below sees the record as soon as it is
             * written). */
            r->claim_retry_at = rdzv_later(mg_now_ms() + CLOSE_GRACE_MS, r->next_tick);
            may_close = 0;
            fallback = r->claim_retry_at;
        } else {
            rc = rdzv_read_close(r, round, &h, &m);
            if (rc < 0)
                return rc;
            if (rc == 1) {
                /* formed (by another closer, or without this node) */
                r->jquiet_until = 0;
                rc = take_round(r, &h, m, -1, NULL, w);
                return rc == 0 ? STEP_AGAIN : rc;
            }
            /* Not enough live joiners: give the last call another period. */
            r->last_call = mg_now_ms() + r->conf.last_call_timeout_ms;
        }
    }
    key(r, k, "r/%" PRId64 "/close", round);
    int64_t other = rdzv_earlier(r->last_call, r->next_tick);
    if (!may_close)
        other = rdzv_earlier(other, rdzv_later(fallback, r->claim_retry_at));
    char *v = NULL;
    size_t vlen = 0;
    rc = rdzv_wait_change(r, k, 0, r->jdeadline, other, max_block, "waiting for the round to form",
                          &v, &vlen);
    if (rc != 0)
        r->jquiet_until = 0; /* formed (or an error): the next pass reads */
    if (rc == 1 && v) {
        /* the record the wait returned: no need to read it again */
        rc = rdzv_close_parse(v, &h, &m);
        free(v);
        if (rc < 0) {
            say(r, "round %" PRId64 ": malformed membership record", round);
            return rc;
        }
        rc = take_round(r, &h, m, -1, NULL, w);
        return rc == 0 ? STEP_AGAIN : rc;
    }
    return rc < 0 ? rc : STEP_WAITED;
}

/* One pass of the outer join loop: find the open round and join it, or wait
 * as a spare, or ask for a new round. Same returns as round_iter. */
static int join_iter(struct mg_rdzv *r, struct mg_rdzv_world *w, int max_block)
{
    char k[KEY_MAX], v[1024];
    struct mg_rdzv_desc *m = NULL;
    struct rdzv_close_hdr h;
    struct rdzv_state st;
    int64_t c;
    int rc;

    if (mg_now_ms() >= r->jdeadline) {
        say(r, "no round could take this node within join_timeout (%gs)",
            r->conf.join_timeout_ms / 1000.0);
        return -ETIMEDOUT;
    }
    rc = rdzv_state_read(r, &st);
    if (rc < 0)
        return rc;
    if (st.status == 'd') {
        say(r,
            "the rendezvous of this run id already finished (round %" PRId64
            "); use a new --rdzv_id for a new job",
            st.round);
        return -MG_ECLOSED;
    }
    if (st.status == 'f') {
        rdzv_say_failed(r);
        return -MG_EPEER;
    }
    rc = rdzv_read_close(r, st.round, &h, &m);
    if (rc < 0)
        return rc;
    if (rc == 1) {
        int n = h.nnodes;
        rc = take_round(r, &h, m, -1, NULL, w);
        if (rc != 0)
            return rc; /* 1: this node is in it */
        if (n < r->max) {
            /* The round runs without us and has room: ask for a new one. */
            struct rdzv_state to = st;
            to.round++;
            to.cause = 'j';
            rc = rdzv_state_cas(r, &st, &to);
            return rc < 0 ? rc : STEP_AGAIN;
        }
        /* Full: wait as a spare for the next round. */
        key(r, k, "state");
        rc = rdzv_wait_change(r, k, st.rev, r->jdeadline, r->next_tick, max_block,
                              "waiting for a place in the job", NULL, NULL);
        return rc < 0 ? rc : STEP_WAITED;
    }
    /* Round st.round is open: join it, unless this agent already did (a join
     * begun again while the round is open): the count counts agents, so it
     * keeps its place rather than take a second one, which would close the
     * round one node short. */
    if (r->jpos > 0 && r->jround == st.round && !r->formed) {
        r->jstate = J_ROUND;
        return STEP_AGAIN_SAME;
    }
    struct mg_rdzv_desc d;
    rdzv_my_desc(r, &d);
    int len = mg_rdzv_desc_format(&d, v, sizeof(v));
    if (len < 0)
        return len;
    key(r, k, "r/%" PRId64 "/j/%s", st.round, r->id);
    rc = r->kv->ops->set(r->kv, k, v, (size_t)len, 0);
    if (rc < 0)
        return kvfail(r, "joining the round", rc);
    key(r, k, "r/%" PRId64 "/n", st.round);
    rc = r->kv->ops->add(r->kv, k, 1, &c);
    if (rc < 0)
        return kvfail(r, "joining the round", rc);
    r->jround = st.round;
    r->jpos = c;
    r->jst = st;
    r->jfresh = 1;
    r->live_at = -1;
    r->jquiet_until = 0;
    r->jat = mg_now_ms();
    r->claim_retry_at = -1;
    r->min_seen = -1;
    r->last_call = -1;
    r->jstate = J_ROUND;
    return STEP_AGAIN_SAME;
}

int mg_rdzv_join_begin(struct mg_rdzv *r)
{
    int rc;

    r->formed = 0;
    r->jstate = J_TOP;
    r->jfresh = 0;
    r->jcount = -1;
    r->jdeadline = mg_now_ms() + r->conf.join_timeout_ms;
    rc = rdzv_reserve_port(r);
    if (rc < 0)
        return rc;
    return rdzv_publish_alive(r);
}

void mg_rdzv_join_progress(const struct mg_rdzv *r, struct mg_rdzv_progress *p)
{
    p->round = r->jround;
    p->joined = r->jstate == J_TOP ? -1 : r->jcount;
    p->min = r->min;
    p->max = r->max;
    p->left_ms = mg_ms_until(r->jdeadline);
}

int mg_rdzv_join_step(struct mg_rdzv *r, struct mg_rdzv_world *w, int max_block_ms)
{
    for (;;) {
        int rc = rdzv_heartbeat_due(r);
        if (rc < 0)
            return rc;
        rc = r->jstate == J_TOP ? join_iter(r, w, max_block_ms) : round_iter(r, w, max_block_ms);
        if (rc == STEP_AGAIN) {
            r->jstate = J_TOP;
            continue;
        }
        if (rc == STEP_AGAIN_SAME)
            continue;
        if (rc == 1)
            r->jstate = J_IDLE;
        return rc; /* 1 formed, 0 waited, < 0 error */
    }
}
