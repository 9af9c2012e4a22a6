/* Forming a round of the multi-node rendezvous (rdzv_proto.h): finding the
 * open round and joining it, or waiting as a spare, or asking for a new one;
 * closing it once enough nodes joined (the membership record, node ranks,
 * whether a restart counts); and taking the formed round. */
#include "rdzv_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CLOSE_MAX_BYTES (MG_KV_MAX_VALUE - 1)
/* When a node other than the last to join closes a round (see round_iter). */
#define CLOSE_GRACE_MS   500
#define CLOSE_STAGGER_MS 50

/* What one pass of a join step tells mg_rdzv_join_step, besides 1 (formed)
 * and errors: it waited (return to the caller), start over from the top, or
 * continue at once in the same phase. */
#define STEP_WAITED     0
#define STEP_AGAIN      2
#define STEP_AGAIN_SAME 3

/* ---- the membership record ------------------------------------------------------ */

/* Parses a close record into members; 0, or -MG_EFORMAT. */
static int close_parse(const char *v, int64_t *restarts, struct mg_rdzv_desc **out, int *n)
{
    long long round, k;
    int nn, world;
    const char *p;

    if (sscanf(v, "round=%lld restarts=%lld nnodes=%d world=%d", &round, &k, &nn, &world) != 4 ||
        nn < 1 || nn > MG_RDZV_MAX_NODES)
        return -MG_EFORMAT;
    struct mg_rdzv_desc *d = calloc((size_t)nn, sizeof(*d));
    if (!d)
        return -ENOMEM;
    p = strchr(v, '\n');
    for (int i = 0; i < nn; i++) {
        if (!p || mg_rdzv_desc_parse(p + 1, &d[i]) < 0) {
            free(d);
            return -MG_EFORMAT;
        }
        p = strchr(p + 1, '\n');
    }
    *restarts = k;
    *out = d;
    *n = nn;
    return 0;
}

/* Reads NS/r/R/close. 1 and the members when it exists, 0 when not. */
static int read_close(struct mg_rdzv *r, int64_t round, int64_t *restarts, struct mg_rdzv_desc **m,
                      int *n)
{
    char k[KEY_MAX], *v = NULL;
    size_t len;
    key(r, k, "r/%" PRId64 "/close", round);
    int rc = r->kv->ops->get(r->kv, k, &v, &len, NULL);
    if (rc == -MG_ENOKEY)
        return 0;
    if (rc < 0)
        return kvfail(r, "reading the round", rc);
    rc = close_parse(v, restarts, m, n);
    free(v);
    if (rc < 0) {
        say(r, "round %" PRId64 ": malformed membership record", round);
        return rc;
    }
    return 1;
}

/* Deletes what is left of an old round (best effort). */
static void forget_round(struct mg_rdzv *r, int64_t round)
{
    char k[KEY_MAX];
    struct mg_kv_entry *e = NULL;
    int n = 0;
    key(r, k, "r/%" PRId64 "/", round);
    if (r->kv->ops->list(r->kv, k, MG_RDZV_MAX_NODES * 2 + 8, 0, &e, &n) < 0)
        return;
    for (int i = 0; i < n; i++)
        r->kv->ops->del(r->kv, e[i].key);
    mg_kv_free_list(e, n);
}

/* ---- closing a round ------------------------------------------------------------ */

/* A round that follows a worker failure (cause f) decides whether the
 * restart counts: it does when every member of the failed round is back, and
 * not when one is gone (its death made the workers fail: a membership
 * change). Past --max_restarts the job fails with the recorded root cause.
 * Returns 1 to go on closing (st updated), 0 when the state moved on, < 0. */
static int count_restart(struct mg_rdzv *r, int64_t round, struct rdzv_state *st,
                         const struct mg_rdzv_desc *d, int nd)
{
    struct mg_rdzv_desc *prev = NULL;
    int64_t k_prev;
    int np = 0, all, rc;

    if (st->cause != 'f' || round == 0)
        return 1;
    rc = read_close(r, round - 1, &k_prev, &prev, &np);
    if (rc < 0)
        return rc;
    all = 1;
    for (int i = 0; i < np && all; i++)
        all = rdzv_find_member(d, nd, prev[i].id) >= 0;
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

/* Closes round R with the live agents that joined it, if there are enough.
 * Returns 0 (closed by us or someone else, or not closable yet), or < 0. */
static int try_close(struct mg_rdzv *r, int64_t round, struct rdzv_state *st)
{
    char k[KEY_MAX];
    struct mg_kv_entry *joined = NULL, *alive = NULL;
    struct mg_rdzv_desc *d = NULL;
    int nj = 0, na = 0, nd = 0, rc;
    size_t askip, jskip;
    char *rec = NULL;

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
    {
        size_t cap = 128 + (size_t)nd * 1024, off;
        int world = 0;
        rec = malloc(cap);
        if (!rec) {
            rc = -ENOMEM;
            goto out;
        }
        for (int i = 0; i < nd; i++)
            world += d[i].nproc;
        off =
            (size_t)snprintf(rec, cap, "round=%" PRId64 " restarts=%" PRId64 " nnodes=%d world=%d",
                             round, st->restarts, nd, world);
        for (int i = 0; i < nd && off < cap; i++) {
            rec[off++] = '\n';
            int w = mg_rdzv_desc_format(&d[i], rec + off, cap - off);
            if (w < 0) {
                rc = w;
                goto out;
            }
            off += (size_t)w;
        }
        if (off >= CLOSE_MAX_BYTES) {
            say(r, "round %" PRId64 ": the membership record is too large", round);
            rc = -MG_ETOOBIG;
            goto out;
        }
        key(r, k, "r/%" PRId64 "/close", round);
        rc = r->kv->ops->cas(r->kv, k, NULL, 0, rec, off, 0, NULL, NULL);
        if (rc < 0) {
            rc = kvfail(r, "closing the round", rc);
            goto out;
        }
        if (rc == 1 && round >= 2)
            forget_round(r, round - 2);
        rc = 0;
    }
out:
    free(rec);
    free(d);
    mg_kv_free_list(joined, nj);
    mg_kv_free_list(alive, na);
    return rc;
}

/* ---- taking the formed round --------------------------------------------------- */

static void take_round(struct mg_rdzv *r, int64_t round, int64_t restarts, struct mg_rdzv_desc *m,
                       int n, int me, struct mg_rdzv_world *w)
{
    memset(w, 0, sizeof(*w));
    w->round = (int)round;
    w->restart_count = (int)restarts;
    w->node_rank = me;
    w->nnodes = n;
    for (int i = 0; i < n; i++) {
        if (i < me)
            w->rank_base += m[i].nproc;
        w->world_size += m[i].nproc;
    }
    snprintf(w->master_addr, sizeof(w->master_addr), "%s", m[0].addr);
    w->master_port = m[0].port;
    w->master_fd = -1;
    if (me == 0) {
        w->master_fd = r->listen_fd;
    } else if (r->listen_fd >= 0) {
        close(r->listen_fd);
    }
    r->listen_fd = -1;
    free(r->members);
    r->members = m;
    r->nmembers = n;
    r->round = round;
    r->restarts = restarts;
    r->prev_rank = me;
    r->formed = 1;
    r->last_ok = mg_now_ms();
    r->next_tick = r->last_ok + r->conf.heartbeat_interval_ms;
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

/* One pass of the wait for round R, after joining it. Returns 1 formed (*w
 * filled), STEP_AGAIN when the round went on without us or the state moved
 * (start over), STEP_WAITED after waiting up to max_block ms, < 0 error. */
static int round_iter(struct mg_rdzv *r, struct mg_rdzv_world *w, int max_block)
{
    char k[KEY_MAX];
    struct mg_rdzv_desc *m = NULL;
    struct rdzv_state st;
    int64_t restarts, round = r->jround;
    int rc, n;

    rc = read_close(r, round, &restarts, &m, &n);
    if (rc < 0)
        return rc;
    if (rc == 1) {
        int me = rdzv_find_member(m, n, r->id);
        if (me < 0) {
            free(m);
            return STEP_AGAIN;
        }
        take_round(r, round, restarts, m, n, me, w);
        return 1;
    }
    rc = rdzv_state_read(r, &st);
    if (rc < 0)
        return rc;
    if (st.round != round || st.status != 'r')
        return STEP_AGAIN;
    if (mg_now_ms() >= r->jdeadline) {
        int got;
        int64_t c = get_count(r, round, &got);
        say(r,
            "round %" PRId64 " did not form within join_timeout (%gs): %" PRId64
            " node(s) joined, --nnodes needs at least %d",
            round, r->conf.join_timeout_ms / 1000.0, c, r->min);
        return -ETIMEDOUT;
    }

    int64_t c = get_count(r, round, &rc);
    if (rc < 0)
        return rc;
    r->jcount = c;
    if (c < r->min && round > 0 && r->nmembers > 0 &&
        (r->jpos == c || mg_now_ms() >= r->jat + CLOSE_GRACE_MS +
                                            (c > r->jpos ? c - r->jpos : 0) * CLOSE_STAGGER_MS)) {
        /* A re-formation that cannot reach MIN because a member died: fail
         * now rather than at join_timeout (a replacement would be a new job).
         * The last node to join looks (a listing of every live node), the
         * others only when it has not moved on, as with closing. */
        struct mg_kv_entry *alive = NULL;
        int na = 0, dead = -1;
        size_t skip;
        rc = rdzv_list_alive(r, &alive, &na, &skip);
        if (rc < 0)
            return rc;
        for (int i = 0; i < r->nmembers && dead < 0; i++)
            if (!rdzv_in_list(alive, na, skip, r->members[i].id))
                dead = i;
        mg_kv_free_list(alive, na);
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
        may_close = r->jpos == c || now >= fallback;
    }
    int close_now = may_close && c >= r->max;
    if (!close_now && may_close && c >= r->min) {
        if (now >= r->last_call)
            close_now = 1;
        if (!close_now && round > 0) {
            /* A re-formation: no need to wait once every live agent joined. */
            struct mg_kv_entry *alive = NULL;
            int na = 0;
            size_t skip;
            rc = rdzv_list_alive(r, &alive, &na, &skip);
            mg_kv_free_list(alive, na);
            if (rc < 0)
                return rc;
            close_now = c >= na;
        }
    }
    if (close_now) {
        rc = try_close(r, round, &st);
        if (rc < 0)
            return rc;
        rc = read_close(r, round, &restarts, &m, &n);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            free(m);
            return STEP_AGAIN_SAME; /* formed: the next pass takes it */
        }
        /* Not enough live joiners: give the last call another period. */
        r->last_call = mg_now_ms() + r->conf.last_call_timeout_ms;
    }
    key(r, k, "r/%" PRId64 "/close", round);
    int64_t other = rdzv_earlier(r->last_call, r->next_tick);
    if (!may_close)
        other = rdzv_earlier(other, fallback);
    rc = rdzv_wait_change(r, k, 0, r->jdeadline, other, max_block, "waiting for the round to form");
    return rc < 0 ? rc : STEP_WAITED;
}

/* One pass of the outer join loop: find the open round and join it, or wait
 * as a spare, or ask for a new round. Same returns as round_iter. */
static int join_iter(struct mg_rdzv *r, struct mg_rdzv_world *w, int max_block)
{
    char k[KEY_MAX], v[1024];
    struct mg_rdzv_desc *m = NULL;
    struct rdzv_state st;
    int64_t restarts, c;
    int rc, n;

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
    rc = read_close(r, st.round, &restarts, &m, &n);
    if (rc < 0)
        return rc;
    if (rc == 1) {
        int me = rdzv_find_member(m, n, r->id);
        if (me >= 0) {
            take_round(r, st.round, restarts, m, n, me, w);
            return 1;
        }
        free(m);
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
                              "waiting for a place in the job");
        return rc < 0 ? rc : STEP_WAITED;
    }
    /* Round st.round is open: join it. */
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
    r->jat = mg_now_ms();
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
