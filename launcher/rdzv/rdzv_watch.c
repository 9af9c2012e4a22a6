/* The multi-node rendezvous while the workers run (rdzv_proto.h): the
 * heartbeat, the members' liveness and the job's state on each tick; a local
 * worker's failure, which re-forms the group on every node; and the end of
 * the round: the exit barrier, leaving, and the host's close. */
#include "rdzv_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- liveness ------------------------------------------------------------------- */

int mg_rdzv_timeout_ms(const struct mg_rdzv *r)
{
    if (!r->formed)
        return -1;
    return mg_ms_until(r->next_tick);
}

/* The state moved on while this node runs round r->round. */
static enum mg_rdzv_event state_moved(struct mg_rdzv *r, const struct rdzv_state *st)
{
    if (st->status == 'f') {
        rdzv_say_failed(r);
        r->formed = 0;
        return MG_RDZV_FAILED;
    }
    if (st->round != r->round) {
        if (st->restarts > r->restarts || st->cause == 'f') {
            r->reason = MG_RDZV_R_FAILURE;
            say(r, "a worker failed on another node (round %" PRId64 ")", st->round);
        } else if (st->cause == 'x') {
            r->reason = MG_RDZV_R_NODE_DIED;
            say(r, "a node stopped sending heartbeats (round %" PRId64 ")", st->round);
        } else {
            r->reason = MG_RDZV_R_NODE_JOINED;
            say(r, "a node is waiting to join (round %" PRId64 ")", st->round);
        }
        r->formed = 0;
        return MG_RDZV_RESTART;
    }
    if (st->status == 'd') {
        say(r, "every node finished");
        r->formed = 0;
        return MG_RDZV_DONE;
    }
    return MG_RDZV_NONE;
}

/* Whether silence_ms without a whole tick explains a dropped connection:
 * the store drops one whose lease (heartbeat_timeout - heartbeat_interval)
 * ran out, as measured from when it read the last request, which can be a
 * little before this node saw that request's answer; a connection cut on
 * the way finds the node silent for an interval at most. */
static int silent_past_lease(const struct mg_rdzv *r, int64_t silence_ms)
{
    int64_t lease = r->conf.heartbeat_timeout_ms - r->conf.heartbeat_interval_ms;
    return silence_ms >= lease * 3 / 4;
}

/* The backend dropped this node: its lease ran out (the others declared it
 * dead and go on without it), and it joins the next round as a new node.
 * silent_ms: how long the backend had not answered a whole tick; why: what
 * showed it. */
static enum mg_rdzv_event dropped(struct mg_rdzv *r, int64_t silent_ms, const char *why)
{
    char tmp[MG_RDZV_MSG_MAX];
    snprintf(tmp, sizeof(tmp), "%s", why);
    r->reason = MG_RDZV_R_LEASE_LOST;
    r->formed = 0;
    r->lost_at = 0;
    /* The group re-forms: this node's workers stop, and it comes back as a
     * new node. The others may not have seen it gone yet (a connection cut
     * and made again within a heartbeat, before their watch looked): were
     * the round left as it is, this node would find itself in it still,
     * with its old rank, and start workers alone. So it moves the round on
     * itself, as a dead node's watcher would (best effort: the join reads
     * whatever the state became). */
    struct rdzv_state st;
    if (rdzv_state_read(r, &st) == 0 && st.status == 'r' && st.round == r->round) {
        struct rdzv_state to = st;
        to.round++;
        to.cause = 'x';
        rdzv_state_cas(r, &st, &to);
    }
    if (!silent_past_lease(r, silent_ms)) {
        /* not for silence: a connection cut on the way (a proxy, a NAT) */
        say(r, "this node lost its place in the job (%s); rejoining as a new node", tmp);
        return MG_RDZV_RESTART;
    }
    r->dropped_ms = silent_ms;
    say(r,
        "this node was declared dead: its heartbeats stopped for %.1f s, past heartbeat_timeout "
        "(%gs) (was it stopped, or starved of CPU?); rejoining as a new node",
        silent_ms / 1000.0, r->conf.heartbeat_timeout_ms / 1000.0);
    return MG_RDZV_RESTART;
}

/* Whether a request failed because the backend's connection closed. */
static int closed(int rc)
{
    return rc == -MG_ECLOSED || rc == -ECONNRESET || rc == -EPIPE;
}

/* The backend's connection closed under this live agent. The store closes a
 * connection whose lease ran out (this agent's heartbeats stopped for
 * heartbeat_timeout: it was stopped or starved, and the others declared it
 * dead), and whichever request of a tick comes first finds it closed, not
 * only the heartbeat; or the store's host is gone. Connecting again (the
 * backend's keepalive does) tells which: a store that answers dropped this
 * node, which rejoins; one that does not is tried at every tick until
 * heartbeat_timeout from the first try, then the job is lost here. */
static enum mg_rdzv_event reconnect(struct mg_rdzv *r)
{
    int64_t now = mg_now_ms();
    int first = r->lost_at == 0;
    if (first) {
        r->lost_at = now;
        r->lost_silent_ms = r->op_at - r->last_ok;
    }
    char why[MG_ERRMSG_LEN];
    int rc = r->kv->ops->keepalive(r->kv);
    snprintf(why, sizeof(why), "%s", mg_kv_error(r->kv));
    if (rc == 0) {
        r->lost_at = 0; /* the connection was made good, lease and all */
        return MG_RDZV_NONE;
    }
    if (rc == -EKEYEXPIRED) {
        /* A store that came back without this job's rounds is another one
         * (its host restarted): what the job was went with the old one. */
        struct rdzv_state st;
        rc = rdzv_state_read(r, &st);
        if (rc == 0 && st.round < r->round) {
            say(r,
                "the rendezvous store came back without this job's state (round %" PRId64
                ", this node was in round %" PRId64
                "): did the agent hosting it restart? The job cannot go on; start every node "
                "again",
                st.round, r->round);
            r->formed = 0;
            return MG_RDZV_FAILED;
        }
        if (rc == 0)
            return dropped(r, r->lost_silent_ms, why);
        snprintf(why, sizeof(why), "%.*s", (int)sizeof(why) - 1, r->msg);
    }
    /* A store that dropped this node for its silence and then does not
     * answer is gone, most likely because the job ended without the node:
     * its host leaves once the live nodes are done. */
    int silent = silent_past_lease(r, r->lost_silent_ms);
    if (now - r->lost_at >= r->conf.heartbeat_timeout_ms) {
        if (silent) {
            r->dropped_ms = r->lost_silent_ms;
            say(r,
                "its rendezvous store is gone (%s, for %.1f s): the job most likely ended "
                "without it",
                why, (now - r->lost_at) / 1000.0);
        } else {
            say(r,
                "lost the rendezvous backend: %s (did the agent hosting the store exit?); "
                "connecting again failed for %.1f s (heartbeat_timeout %gs)",
                why, (now - r->lost_at) / 1000.0, r->conf.heartbeat_timeout_ms / 1000.0);
        }
        r->formed = 0;
        return MG_RDZV_FAILED;
    }
    if (first)
        snprintf(r->note, sizeof(r->note),
                 "rendezvous: the connection to the backend closed (%s); connecting again until "
                 "heartbeat_timeout (%gs)",
                 why, r->conf.heartbeat_timeout_ms / 1000.0);
    return MG_RDZV_NONE;
}

/* A backend error during the run: tolerated until heartbeat_timeout. */
static enum mg_rdzv_event run_error(struct mg_rdzv *r, int rc)
{
    if (rc == -EKEYEXPIRED)
        return dropped(r, r->op_at - r->last_ok, mg_kv_error(r->kv));
    if (closed(rc))
        return reconnect(r);
    if (mg_now_ms() - r->last_ok >= r->conf.heartbeat_timeout_ms) {
        char tmp[MG_RDZV_MSG_MAX];
        snprintf(tmp, sizeof(tmp), "%s", r->msg);
        say(r, "lost the rendezvous backend: %s", tmp);
        r->formed = 0;
        return MG_RDZV_FAILED;
    }
    return MG_RDZV_NONE;
}

/* Whether this node's key and those of the next RDZV_WATCH_NEXT members in rank
 * order (wrapping) are still there: 1 when one is gone, 0 when not. Every
 * member is watched so by RDZV_WATCH_NEXT others, and the one that sees it gone
 * moves the round for all; a heartbeat costs a few requests whatever the
 * size of the job, where a listing of every live node costs the store and
 * each node O(nodes), O(nodes^2) a second in all. */
static int watch_ring(struct mg_rdzv *r)
{
    char k[KEY_MAX], *v;
    size_t len;
    int me = r->prev_rank; /* this node's rank in the formed round */
    int n = r->nmembers - 1 < RDZV_WATCH_NEXT ? r->nmembers - 1 : RDZV_WATCH_NEXT;
    for (int i = 0; i <= n; i++) {
        const struct mg_rdzv_desc *m;
        int rc = rdzv_member(r, (me + i) % r->nmembers, &m);
        if (rc < 0)
            return rc;
        key(r, k, "a/%s", m->id);
        v = NULL;
        r->op_at = mg_now_ms();
        rc = r->kv->ops->get(r->kv, k, &v, &len, NULL);
        free(v);
        if (rc == -MG_ENOKEY)
            return 1;
        if (rc < 0)
            return kvfail(r, "checking the live nodes", rc);
    }
    return 0;
}

enum mg_rdzv_event mg_rdzv_tick(struct mg_rdzv *r)
{
    struct mg_kv_entry *alive = NULL;
    struct rdzv_state st;
    int na = 0, rc, dead = -1;
    size_t skip;

    if (!r->formed)
        return MG_RDZV_NONE;
    int64_t now = mg_now_ms();
    if (now < r->next_tick)
        return MG_RDZV_NONE;
    r->next_tick = now + r->conf.heartbeat_interval_ms;
    r->dropped_ms = 0; /* back in a formed round */
    if (r->lost_at)
        return reconnect(r); /* the connection closed at an earlier tick */

    r->op_at = mg_now_ms();
    rc = r->kv->ops->keepalive(r->kv);
    if (rc < 0)
        return run_error(r, kvfail(r, "heartbeat", rc));
    r->op_at = mg_now_ms();
    rc = rdzv_state_read(r, &st);
    if (rc < 0)
        return run_error(r, rc);
    enum mg_rdzv_event ev = state_moved(r, &st);
    if (ev != MG_RDZV_NONE)
        return ev;
    r->op_at = mg_now_ms();
    rc = watch_ring(r);
    if (rc < 0)
        return run_error(r, rc);
    if (rc == 0) {
        r->last_ok = mg_now_ms();
        return MG_RDZV_NONE;
    }
    r->op_at = mg_now_ms();
    rc = rdzv_list_alive(r, &alive, &na, &skip);
    if (rc < 0)
        return run_error(r, rc);
    r->last_ok = mg_now_ms();
    /* which of the watched ones (this node first) is gone */
    const struct mg_rdzv_desc *m = NULL;
    for (int i = 0; i <= RDZV_WATCH_NEXT && i < r->nmembers && dead < 0; i++) {
        int j = (r->prev_rank + i) % r->nmembers;
        if (rdzv_member(r, j, &m) == 0 && !rdzv_in_list(alive, na, skip, m->id))
            dead = j;
    }
    mg_kv_free_list(alive, na);
    if (dead < 0)
        return MG_RDZV_NONE;

    /* A member is gone. */
    r->reason = MG_RDZV_R_NODE_DIED;
    if (dead == r->prev_rank) {
        /* Our own key vanished: the backend dropped us. */
        return dropped(r, mg_now_ms() - r->last_ok, "its key in the rendezvous is gone");
    }
    if (na < r->min) {
        rdzv_below_min(r, &st, dead, na);
        r->formed = 0;
        return MG_RDZV_FAILED;
    }
    struct rdzv_state to = st;
    to.round++;
    to.cause = 'x';
    r->op_at = mg_now_ms();
    rc = rdzv_state_cas(r, &st, &to);
    if (rc < 0)
        return run_error(r, rc);
    char ranks[64];
    int nr;
    rdzv_member_ranks(r, dead, &nr, ranks, sizeof(ranks));
    say(r, "node %s (node rank %d: %s) stopped sending heartbeats", m->host, dead, ranks);
    r->formed = 0;
    if (rc == 0) {
        /* Someone else moved the state first: follow it. */
        ev = state_moved(r, &st);
        if (ev == MG_RDZV_FAILED || ev == MG_RDZV_DONE)
            return ev;
        r->reason = MG_RDZV_R_NODE_DIED;
    }
    return MG_RDZV_RESTART;
}

/* A backend error that a stall or a dropped connection explains. */
static int transient(int rc)
{
    return rc == -ETIMEDOUT || rc == -EAGAIN || rc == -EIO || rc == -MG_ECLOSED ||
           rc == -ECONNRESET || rc == -EPIPE || rc == -ECONNREFUSED || rc == -EHOSTUNREACH ||
           rc == -ENETUNREACH;
}

/* After a request of mg_rdzv_worker_failed failed: whether to try again. The
 * workers are gone and the round must move on, so the backend gets what the
 * heartbeat gives it: heartbeat_timeout since it last answered. A heartbeat
 * tells a stall (it times out too: try again) from a dropped lease (the
 * connection is made again, -EKEYEXPIRED: the other nodes treat this one as
 * new, and it can still move the round on) from a backend that is gone. */
static int failed_again(struct mg_rdzv *r, int rc, int64_t deadline)
{
    if (!transient(rc) || mg_now_ms() >= deadline)
        return 0;
    rc = r->kv->ops->keepalive(r->kv);
    if (rc == 0 || rc == -EKEYEXPIRED)
        return 1;
    kvfail(r, "heartbeat", rc);
    return rc == -ETIMEDOUT && mg_now_ms() < deadline;
}

/* mg_rdzv_worker_failed gives up after error rc: r->msg holds the backend's
 * words for it. */
static enum mg_rdzv_event failed_unreachable(struct mg_rdzv *r, int rc)
{
    char tmp[MG_RDZV_MSG_MAX];
    snprintf(tmp, sizeof(tmp), "%s", r->msg);
    if (transient(rc))
        say(r,
            "a worker failed here, and the rendezvous backend did not answer within "
            "heartbeat_timeout (%gs) to re-form the group (round %" PRId64 "): %s",
            r->conf.heartbeat_timeout_ms / 1000.0, r->round, tmp);
    else
        say(r, "a worker failed here, and the group cannot re-form (round %" PRId64 "): %s",
            r->round, tmp);
    return MG_RDZV_FAILED;
}

enum mg_rdzv_event mg_rdzv_worker_failed(struct mg_rdzv *r, const struct mg_rdzv_failure *f)
{
    char k[KEY_MAX], rec[1024];
    struct rdzv_state st;
    int64_t deadline = r->last_ok + r->conf.heartbeat_timeout_ms;
    int rc, n, recorded = 0, have = 0, moved = 0, errors = 0;

    r->formed = 0;
    r->failed_here = 0;
    /* the record names this node: whichever node ends the job on it later
     * passes it on as another node's failure */
    struct mg_rdzv_failure mine = *f;
    if (!mine.node[0])
        snprintf(mine.node, sizeof(mine.node), "%s", r->id);
    n = rdzv_fail_format(&mine, rec, sizeof(rec));
    if (n < 0 || (size_t)n >= sizeof(rec))
        n = (int)strlen(rec);
    key(r, k, "r/%" PRId64 "/failure", r->round);
    while (moved < CAS_TRIES) {
        rc = have ? 0 : rdzv_state_read(r, &st);
        if (rc == 0 && !recorded) {
            /* This round's first failure: the root cause, should the job end
             * on it (best effort: it only words the final message). */
            recorded = r->kv->ops->cas(r->kv, k, NULL, 0, rec, (size_t)n, 0, NULL, NULL) >= 0;
        }
        if (rc == 0) {
            have = 1;
            if (st.status == 'd') {
                say(r,
                    "a worker failed here after every node of round %" PRId64
                    " had finished: the job is over",
                    st.round);
                return MG_RDZV_FAILED;
            }
            if (st.status != 'r' || st.round != r->round) {
                /* Something else already restarted or ended the job (a node
                 * that died made these workers fail too): follow it. */
                enum mg_rdzv_event ev = state_moved(r, &st);
                return ev == MG_RDZV_NONE ? MG_RDZV_RESTART : ev;
            }
            /* Re-form first: the next round counts the restart when every node
             * comes back, and not when the workers failed because a node died. */
            struct rdzv_state to = st;
            to.round++;
            to.cause = 'f';
            rc = rdzv_state_cas(r, &st, &to);
            if (rc == 1) {
                r->reason = MG_RDZV_R_FAILURE;
                r->failed_here = 1;
                say(r, "a worker failed here (round %" PRId64 ")", r->round);
                return MG_RDZV_RESTART;
            }
            if (rc == 0) {
                moved++; /* st holds the state that won: look at it again */
                continue;
            }
        }
        have = 0;
        if (++errors > CAS_TRIES || !failed_again(r, rc, deadline))
            return failed_unreachable(r, rc);
    }
    say(r,
        "a worker failed here, and the rendezvous state kept changing: %d tries to move on "
        "from round %" PRId64 " did not take",
        CAS_TRIES, r->round);
    return MG_RDZV_FAILED;
}

int mg_rdzv_fail_job(struct mg_rdzv *r, const struct mg_rdzv_failure *f)
{
    struct rdzv_state st;
    r->formed = 0;
    int rc = rdzv_state_read(r, &st);
    if (rc < 0)
        return kvfail(r, "ending the job", rc);
    if (st.status != 'r')
        return 0; /* already over */
    return rdzv_mark_failed(r, &st, f);
}

int mg_rdzv_failed_here(const struct mg_rdzv *r)
{
    return r->failed_here;
}

int mg_rdzv_min_nodes(const struct mg_rdzv *r)
{
    return r->min;
}

int mg_rdzv_sit_out(struct mg_rdzv *r)
{
    char k[KEY_MAX];
    mg_rdzv_leave(r);
    key(r, k, "o/%s", r->id);
    int rc = r->kv->ops->set(r->kv, k, "1", 1, MG_KV_EPHEMERAL);
    return rc < 0 ? kvfail(r, "sitting out", rc) : 0;
}

void mg_rdzv_sit_in(struct mg_rdzv *r)
{
    char k[KEY_MAX];
    key(r, k, "o/%s", r->id);
    r->kv->ops->del(r->kv, k);
}

int mg_rdzv_job_state(struct mg_rdzv *r)
{
    struct rdzv_state st;
    int rc = rdzv_state_read(r, &st);
    return rc < 0 ? kvfail(r, "reading the job's state", rc) : st.status;
}

int mg_rdzv_refresh(struct mg_rdzv *r)
{
    int rc = r->kv->ops->keepalive(r->kv);
    r->next_tick = mg_now_ms() + r->conf.heartbeat_interval_ms;
    if (rc == -EKEYEXPIRED) /* reconnected, or the lease is made anew by the next set */
        return 0;
    return rc < 0 ? kvfail(r, "coming back", rc) : 0;
}

/* ---- the exit barrier, leaving, closing ------------------------------------------ */

int mg_rdzv_finish_begin(struct mg_rdzv *r)
{
    char k[KEY_MAX];
    int rc;

    r->bdeadline = mg_now_ms() + r->conf.exit_barrier_timeout_ms;
    key(r, k, "r/%" PRId64 "/done/%s", r->round, r->id);
    rc = r->kv->ops->set(r->kv, k, "1", 1, 0);
    return rc < 0 ? kvfail(r, "announcing that this node finished", rc) : 0;
}

int mg_rdzv_finish_step(struct mg_rdzv *r, int max_block_ms)
{
    struct mg_kv_entry *alive = NULL, *done = NULL;
    int na = 0, nd = 0, waiting = 0, rc;
    size_t askip, dskip;
    struct rdzv_state st;
    char k[KEY_MAX], first[MG_HOST_MAX] = "";
    int64_t round = r->round;

    rc = rdzv_heartbeat_due(r);
    if (rc < 0)
        return rc;
    rc = rdzv_state_read(r, &st);
    if (rc < 0)
        return rc;
    if (st.round != round || st.status != 'r') {
        enum mg_rdzv_event ev = state_moved(r, &st);
        if (ev != MG_RDZV_NONE)
            return ev;
    }
    rc = rdzv_list_alive(r, &alive, &na, &askip);
    if (rc < 0)
        return rc;
    key(r, k, "r/%" PRId64 "/done/", round);
    dskip = strlen(k);
    rc = r->kv->ops->list(r->kv, k, MG_RDZV_MAX_NODES, 0, &done, &nd);
    if (rc < 0) {
        mg_kv_free_list(alive, na);
        return kvfail(r, "reading the exit barrier", rc);
    }
    for (int i = 0; i < r->nmembers; i++) {
        const struct mg_rdzv_desc *mi;
        rc = rdzv_member(r, i, &mi); /* the first step reads the blocks not held */
        if (rc < 0) {
            mg_kv_free_list(alive, na);
            mg_kv_free_list(done, nd);
            return rc;
        }
        const char *id = mi->id;
        /* A dead node is not waited for. */
        if (!rdzv_in_list(done, nd, dskip, id) && rdzv_in_list(alive, na, askip, id)) {
            if (!waiting++)
                snprintf(first, sizeof(first), "%s", mi->host);
        }
    }
    mg_kv_free_list(alive, na);
    mg_kv_free_list(done, nd);
    if (!waiting) {
        struct rdzv_state to = st;
        to.status = 'd';
        rc = rdzv_state_cas(r, &st, &to);
        if (rc < 0)
            return rc;
        if (rc == 0 && (st.round != round || st.status != 'd')) {
            enum mg_rdzv_event ev = state_moved(r, &st);
            return ev != MG_RDZV_NONE ? (int)ev : MG_RDZV_NONE;
        }
        say(r, "every node finished");
        r->formed = 0;
        return MG_RDZV_DONE;
    }
    if (mg_now_ms() >= r->bdeadline) {
        say(r,
            "exit barrier: still waiting for %d node(s) (%s%s) after exit_barrier_timeout "
            "(%gs); leaving",
            waiting, first, waiting > 1 ? ", ..." : "", r->conf.exit_barrier_timeout_ms / 1000.0);
        r->formed = 0;
        return -ETIMEDOUT;
    }
    key(r, k, "state");
    rc = rdzv_wait_change(r, k, st.rev, r->bdeadline, r->next_tick, max_block_ms,
                          "waiting in the exit barrier", NULL, NULL);
    return rc < 0 ? rc : MG_RDZV_NONE;
}

void mg_rdzv_leave(struct mg_rdzv *r)
{
    char k[KEY_MAX];
    key(r, k, "a/%s", r->id);
    r->kv->ops->del(r->kv, k);
    r->formed = 0;
}

int mg_rdzv_close_begin(struct mg_rdzv *r, int hosting, const char *why)
{
    struct rdzv_state st;

    r->formed = 0;
    r->jstate = J_IDLE;
    if (!hosting) {
        mg_rdzv_leave(r);
        return 1;
    }
    r->cdeadline = mg_now_ms() + r->conf.close_timeout_ms;
    if (rdzv_state_read(r, &st) < 0)
        return 1;
    if (st.status == 'r') {
        struct mg_rdzv_failure f = {.rank = -1, .local_rank = -1, .exit_code = 1};
        snprintf(f.host, sizeof(f.host), "%s", r->host);
        snprintf(f.message, sizeof(f.message), "the agent hosting the rendezvous store exited%s%s",
                 why && *why ? ": " : "", why ? why : "");
        char keep[MG_RDZV_MSG_MAX];
        snprintf(keep, sizeof(keep), "%s", r->msg);
        rdzv_mark_failed(r, &st, &f);
        snprintf(r->msg, sizeof(r->msg), "%s", keep);
    }
    mg_rdzv_leave(r);
    return mg_rdzv_close_step(r);
}

int mg_rdzv_close_step(struct mg_rdzv *r)
{
    struct mg_kv_entry *alive = NULL;
    int na = 0;
    size_t skip;

    /* The store goes away with this process: let the others read the outcome,
     * those sitting out (node exclusion) included. */
    if (mg_now_ms() >= r->cdeadline || rdzv_list_alive(r, &alive, &na, &skip) < 0)
        return 1;
    mg_kv_free_list(alive, na);
    if (na == 0) {
        char k[KEY_MAX];
        key(r, k, "o/");
        if (r->kv->ops->list(r->kv, k, MG_RDZV_MAX_NODES, 0, &alive, &na) < 0)
            return 1;
        mg_kv_free_list(alive, na);
    }
    r->wake_at = r->cdeadline;
    return na == 0;
}
