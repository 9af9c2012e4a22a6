/* The multi-node rendezvous plugged into the agent's loop (see rdzv_multi.h). */
#include "rdzv_multi.h"
#include "rdzv_multi_internal.h"
#include "mg_err.h"
#include "net.h"
#include "kv_open.h"
#include "proc.h"
#include "rdzv_conf.h"
#include "rdzv_proto.h"
#include "sha256.h"
#include "tcpstore.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <unistd.h>

/* Longest a join or barrier step holds the loop waiting for a remote
 * backend to change (docs/rendezvous.md, "The agent's loop"). The agent
 * hosting the store never waits: it steps again when the store changed. */
#define STEP_BLOCK_MS 100
/* At exit, the longest the last requests (leaving the rendezvous, etcd's
 * lease revocation) may take when the backend does not answer. */
#define EXIT_BLOCK_MS 1000

/* ---- what mglaunch prints ------------------------------------------------------------- */

/* A line on the launcher's console, as the agent's own notes. */
void mg_multi_note(struct multi *m, const char *fmt, ...)
{
    va_list ap;
    if (!m->status)
        return;
    va_start(ap, fmt);
    fputs("mglaunch: ", m->status);
    vfprintf(m->status, fmt, ap);
    fputc('\n', m->status);
    fflush(m->status);
    va_end(ap);
}

/* ---- driving the protocol from the agent's timers ----------------------------------------- */

static void set_timer(struct multi *m, int64_t at, mg_agent_timer_fn fn)
{
    if (m->timer >= 0)
        mg_agent_cancel_timer(m->ag, m->timer);
    m->timer = mg_agent_add_timer(m->ag, at, fn, m);
}

static void cancel_timer(struct multi *m)
{
    if (m->timer >= 0 && m->ag)
        mg_agent_cancel_timer(m->ag, m->timer);
    m->timer = -1;
    m->waiting = NULL;
}

/* How long a step may wait for a change: a remote backend's wait blocks (a
 * bounded slice); the hosted store's is answered at once. */
static int step_block(const struct multi *m)
{
    return m->host ? 0 : STEP_BLOCK_MS;
}

/* After a step that found nothing to do. Remote backends: step again at
 * once (the step already waited). The host: when its store changes (the
 * poller below), or when the rendezvous has a deadline. */
static void step_later(struct multi *m, mg_agent_timer_fn fn)
{
    if (!m->host) {
        set_timer(m, mg_now_ms(), fn);
        return;
    }
    set_timer(m, mg_now_ms() + mg_rdzv_wait_ms(m->r), fn);
    m->waiting = fn;
}

/* The hosted store as one of the loop's pollers. */
static int host_fill(void *ctx, struct pollfd *fds, int max)
{
    return mg_kv_host_pollfds(((struct multi *)ctx)->host, fds, max);
}

static int host_process(void *ctx, const struct pollfd *fds, int n)
{
    struct multi *m = ctx;
    int rc = mg_kv_host_process(m->host, fds, n);
    if (rc == 1 && m->waiting)
        set_timer(m, mg_now_ms(), m->waiting); /* waiting stays set until the step runs */
    return rc < 0 ? rc : 0;
}

static int host_timeout(void *ctx)
{
    return mg_kv_host_timeout_ms(((struct multi *)ctx)->host);
}

/* The exit code for a job that failed: its recorded root cause's, else that
 * of this node's own failed worker, if one failed. */
static int remote_code(struct multi *m)
{
    struct mg_rdzv_failure f;
    if (mg_rdzv_failure_info(m->r, &f) == 0 && f.rank >= 0 && f.exit_code > 0)
        return f.exit_code;
    const struct mg_agent_result *res = m->ag ? mg_agent_result(m->ag) : NULL;
    if (res && res->nfailures && res->root.f.exit_code > 0)
        return res->root.f.exit_code;
    return 1;
}

/* The job's root cause, when the rendezvous says it was another node's. */
static void remote_cause(struct multi *m)
{
    struct mg_rdzv_failure f;
    if (!mg_rdzv_failure_elsewhere(m->r) || mg_rdzv_failure_info(m->r, &f) < 0)
        return;
    struct mg_remote_cause rc = {
        .rank = f.rank,
        .local_rank = f.local_rank,
        .exit_code = f.exit_code,
        .signo = f.signal,
        .pid = f.pid,
        .wall_ms = (int64_t)(f.time * 1000.0),
        .first_rank = f.first_rank,
        .nranks = f.nranks,
    };
    snprintf(rc.host, sizeof(rc.host), "%s", f.host);
    snprintf(rc.node, sizeof(rc.node), "%s", f.node);
    snprintf(rc.message, sizeof(rc.message), "%s", f.message);
    mg_agent_remote_cause(m->ag, &rc);
}

static void fail_run(struct multi *m, int rc)
{
    char msg[MG_RDZV_MSG_MAX + 512];
    int code = rc == -MG_EPEER || rc == MG_RDZV_FAILED ? remote_code(m) : 1;
    if (rc == -MG_EPEER || rc == MG_RDZV_FAILED)
        remote_cause(m);
    cancel_timer(m);
    m->phase = M_IDLE;
    int64_t dropped = mg_rdzv_dropped_ms(m->r);
    if (dropped > 0) {
        /* What ended the job here followed from this node's own silence:
         * that comes first, with what to do when the node was only slow. */
        double hb = m->conf.heartbeat_timeout_ms / 1000.0, more = hb * 2;
        while (more * 1000 < dropped * 1.5)
            more *= 2;
        snprintf(msg, sizeof(msg),
                 "rendezvous (%s): this node was declared dead: its heartbeats stopped for %.1f "
                 "s, past heartbeat_timeout (%gs) (was it stopped, or starved of CPU? If it was "
                 "only slow, give it more room: --rdzv_conf heartbeat_timeout=%g), and the job "
                 "could not take it back: %s",
                 mg_rdzv_backend_name(m->backend), dropped / 1000.0, hb, more,
                 mg_rdzv_message(m->r));
    } else {
        snprintf(msg, sizeof(msg), "rendezvous (%s): %s", mg_rdzv_backend_name(m->backend),
                 mg_rdzv_message(m->r));
    }
    mg_agent_fail(m->ag, code, msg);
}

/* Every restart is "membership" for the agent: the rendezvous counts the
 * job's failure restarts and hands the count over with the group. */
static void restart(struct multi *m)
{
    cancel_timer(m);
    m->phase = M_RESTARTING;
    mg_agent_request_restart(m->ag, MG_RESTART_MEMBERSHIP, mg_rdzv_message(m->r));
}

static void on_tick(struct mg_agent *ag, void *ctx);

/* The running group's next check: when the rendezvous asks, else in a second. */
static void tick_later(struct multi *m)
{
    int t = mg_rdzv_timeout_ms(m->r);
    set_timer(m, mg_now_ms() + (t < 0 ? 1000 : t), on_tick);
}

/* A join that waits for other nodes says so after a few seconds, and again
 * now and then, so that a user looking at a quiet console knows why. */
#define PROGRESS_FIRST_MS 5000
#define PROGRESS_EVERY_MS 30000

static void say_progress(struct multi *m)
{
    struct mg_rdzv_progress p;
    int64_t now = mg_now_ms();

    if (now < m->progress_ms)
        return;
    m->progress_ms = now + PROGRESS_EVERY_MS;
    mg_rdzv_join_progress(m->r, &p);
    if (p.joined < 0)
        mg_multi_note(
            m, "rendezvous: waiting for a place in the job (--nnodes %d:%d); join_timeout in %d s",
            p.min, p.max, (p.left_ms + 999) / 1000);
    else
        mg_multi_note(m,
                      "rendezvous: waiting for nodes: %" PRId64 " joined round %" PRId64
                      ", --nnodes %d:%d; join_timeout in %d s",
                      p.joined, p.round, p.min, p.max, (p.left_ms + 999) / 1000);
}

/* The workers' MG_STORE_TOKEN: with a rendezvous token, a secret every node
 * derives alike (the rendezvous token itself never reaches the workers);
 * without one, none (rank 0's store then warns that it is open). */
static void workers_token(const struct multi *m, char out[MG_GROUP_TOKEN_LEN + 1])
{
    static const char label[] = "mg-store-v1 workers ";
    struct mg_hmac_sha256 h;
    uint8_t mac[MG_SHA256_LEN];
    out[0] = '\0';
    if (!m->conf.token[0])
        return;
    mg_hmac_sha256_init(&h, m->conf.token, strlen(m->conf.token));
    mg_hmac_sha256_update(&h, label, sizeof(label) - 1);
    mg_hmac_sha256_update(&h, m->run_id, strlen(m->run_id));
    mg_hmac_sha256_final(&h, mac);
    for (size_t i = 0; i < sizeof(mac) && 2 * i < MG_GROUP_TOKEN_LEN; i++)
        snprintf(out + 2 * i, 3, "%02x", mac[i]);
}

static void on_join_step(struct mg_agent *ag, void *ctx)
{
    struct multi *m = ctx;
    struct mg_rdzv_world w;
    struct mg_group g;

    m->timer = -1;
    m->waiting = NULL;
    int rc = mg_rdzv_join_step(m->r, &w, step_block(m));
    if (rc == 0 || rc == -EINTR) {
        /* -EINTR: a terminating signal is pending; the loop acts on it next. */
        if (rc == 0)
            say_progress(m);
        step_later(m, on_join_step);
        return;
    }
    if (rc == -MG_ECLOSED && m->was_excluded && mg_rdzv_job_state(m->r) == 'd') {
        /* The others finished the job while this node sat out: its part is
         * done too. A closed connection (the store's host gone) is no
         * finish: the job's state says which. */
        mg_multi_note(
            m, "node exclusion: the job finished while this node sat out; nothing left to do");
        m->phase = M_IDLE;
        mg_agent_fail(ag, 0, "the job finished while this node sat out");
        return;
    }
    if (rc < 0) {
        fail_run(m, rc);
        return;
    }
    m->was_excluded = 0; /* back in a round: a later close is not "done while out" */
    memset(&g, 0, sizeof(g));
    g.group_rank = w.node_rank;
    g.group_world_size = w.nnodes;
    m->node_rank = w.node_rank;
    m->rank_base = w.rank_base;
    m->nranks = m->nproc;
    g.world_size = w.world_size;
    g.rank_offset = w.rank_base;
    g.role_rank_offset = w.rank_base; /* one role */
    g.role_world_size = w.world_size;
    snprintf(g.master_addr, sizeof(g.master_addr), "%s", w.master_addr);
    g.master_port = w.master_port;
    g.master_fd = w.master_fd;
    g.has_restart_count = 1;
    g.restart_count = w.restart_count;
    if (m->backend == MG_RDZV_STATIC) {
        /* torchrun's static rule: MASTER_PORT = --master_port, the agent
         * store (rank 0's agent hosts it for the agents and the workers):
         * the one port the nodes need between them. */
        if (g.master_fd >= 0)
            close(g.master_fd);
        g.master_fd = -1;
        snprintf(g.master_addr, sizeof(g.master_addr), "%s", m->store_host);
        g.master_port = m->store_port;
        g.use_agent_store = 1;
        g.agent_store_token = m->conf.token[0] ? m->conf.token : NULL;
    }
    workers_token(m, g.store_token);
    m->phase = M_RUNNING;
    m->formed_ms = mg_now_ms();
    m->last_nnodes = w.nnodes;
    if (mg_agent_group_formed(ag, &g) < 0) {
        if (g.master_fd >= 0)
            close(g.master_fd);
        return;
    }
    tick_later(m);
}

static void on_tick(struct mg_agent *ag, void *ctx)
{
    struct multi *m = ctx;
    m->timer = -1;
    if (m->phase != M_RUNNING)
        return;
    enum mg_rdzv_event ev = mg_rdzv_tick(m->r);
    char note[MG_RDZV_MSG_MAX];
    if (mg_rdzv_take_note(m->r, note, sizeof(note)))
        mg_multi_note(m, "%s", note);
    switch (ev) {
    case MG_RDZV_RESTART:
        restart(m);
        return;
    case MG_RDZV_FAILED:
        fail_run(m, MG_RDZV_FAILED);
        return;
    case MG_RDZV_NONE:
    case MG_RDZV_DONE:
        break;
    }
    tick_later(m);
}

static void on_barrier_step(struct mg_agent *ag, void *ctx)
{
    struct multi *m = ctx;
    m->timer = -1;
    m->waiting = NULL;
    int rc = mg_rdzv_finish_step(m->r, step_block(m));
    switch (rc) {
    case MG_RDZV_NONE:
    case -EINTR: /* a terminating signal is pending; the loop acts on it next */
        step_later(m, on_barrier_step);
        return;
    case MG_RDZV_DONE:
        m->phase = M_IDLE;
        if (m->node_rank > 0 && m->nranks > 1) /* node rank 0's console has the job's own */
            mg_multi_note(m, "every node finished; ranks %d-%d here exited 0 (node rank %d)",
                          m->rank_base, m->rank_base + m->nranks - 1, m->node_rank);
        else if (m->node_rank > 0)
            mg_multi_note(m, "every node finished; rank %d here exited 0 (node rank %d)",
                          m->rank_base, m->node_rank);
        mg_agent_finish(ag, 0);
        return;
    case MG_RDZV_RESTART:
        restart(m);
        return;
    case MG_RDZV_FAILED:
        fail_run(m, MG_RDZV_FAILED);
        return;
    default:
        /* Timed out, or the backend went away: this node's workers succeeded. */
        m->phase = M_IDLE;
        mg_agent_finish(ag, 0);
        return;
    }
}

static int ts_fill(void *ctx, struct pollfd *fds, int max)
{
    return mg_tcpstore_pollfds(ctx, fds, max);
}

static int ts_process(void *ctx, const struct pollfd *fds, int n)
{
    return mg_tcpstore_process(ctx, fds, n);
}

static void on_cooldown_end(struct mg_agent *ag, void *ctx);

/* Node exclusion: one more failure of this node's own; the next join sits
 * out when exclude_after of them fall within exclude_window. */
static void count_failure(struct multi *m)
{
    int k = m->conf.exclude_after;
    if (k <= 0)
        return;
    int64_t now = mg_now_ms();
    if (m->nfail == k) { /* keep the newest k */
        memmove(m->fail_ms, m->fail_ms + 1, (size_t)(k - 1) * sizeof(m->fail_ms[0]));
        m->nfail--;
    }
    m->fail_ms[m->nfail++] = now;
    if (m->nfail == k && now - m->fail_ms[0] <= m->conf.exclude_window_ms)
        m->exclude_next = 1;
}

/* While this node sits out: its connection kept up, and the job watched,
 * so that it ends with the job if the others finish or fail meanwhile. */
static void on_excluded_tick(struct mg_agent *ag, void *ctx)
{
    struct multi *m = ctx;
    m->timer = -1;
    int rc = mg_rdzv_refresh(m->r);
    int st = rc < 0 ? rc : mg_rdzv_job_state(m->r);
    if (st == 'd') {
        mg_multi_note(
            m, "node exclusion: the job finished while this node sat out; nothing left to do");
        mg_rdzv_sit_in(m->r);
        m->phase = M_IDLE;
        mg_agent_fail(ag, 0, "the job finished while this node sat out");
        return;
    }
    if (st == 'f' || st < 0) {
        if (st == 'f')
            mg_rdzv_sit_in(m->r);
        fail_run(m, st < 0 ? st : -MG_EPEER);
        return;
    }
    if (mg_now_ms() >= m->cooldown_end) {
        on_cooldown_end(ag, m);
        return;
    }
    int64_t next = mg_now_ms() + m->conf.heartbeat_interval_ms;
    set_timer(m, next < m->cooldown_end ? next : m->cooldown_end, on_excluded_tick);
}

static void on_cooldown_end(struct mg_agent *ag, void *ctx)
{
    struct multi *m = ctx;
    (void)ag;
    m->timer = -1;
    mg_multi_note(m, "node exclusion: the cooldown is over; joining the job again");
    m->phase = M_JOINING;
    m->progress_ms = mg_now_ms() + PROGRESS_FIRST_MS;
    int rc = mg_rdzv_refresh(m->r);
    mg_rdzv_sit_in(m->r);
    if (rc == 0)
        rc = mg_rdzv_join_begin(m->r);
    if (rc < 0 && rc != -EINTR) {
        fail_run(m, rc);
        return;
    }
    set_timer(m, mg_now_ms(), on_join_step);
}

/* Whether this node sits out the coming round(s): after exclude_after
 * failures of its own within exclude_window, when the others are still at
 * least --nnodes MIN without it (a spare may take its place). It leaves the
 * rendezvous (no longer a live agent, so the others re-form without it) and
 * comes back after exclude_cooldown as a new node would. */
static int exclude_now(struct multi *m)
{
    if (!m->exclude_next)
        return 0;
    m->exclude_next = 0;
    int k = m->nfail;
    double window = (double)(m->fail_ms[k - 1] - m->fail_ms[0]) / 1000.0;
    m->nfail = 0;
    if (m->last_nnodes - 1 < mg_rdzv_min_nodes(m->r)) {
        mg_multi_note(
            m,
            "node exclusion: %d failures of this node's workers within %.0f s, but the job "
            "would fall below --nnodes %d without it (%d nodes now): staying",
            k, window, mg_rdzv_min_nodes(m->r), m->last_nnodes);
        return 0;
    }
    int rc = mg_rdzv_sit_out(m->r);
    if (rc < 0 && rc != -EINTR) {
        fail_run(m, rc);
        return 1;
    }
    m->phase = M_EXCLUDED;
    m->was_excluded = 1;
    mg_multi_note(
        m,
        "node exclusion: %d failures of this node's workers within %.0f s (--rdzv_conf "
        "exclude_after=%d); the other %d node%s go on without it, and it joins again in %g s "
        "(exclude_cooldown)",
        k, window, m->conf.exclude_after, m->last_nnodes - 1, m->last_nnodes == 2 ? "" : "s",
        m->conf.exclude_cooldown_ms / 1000.0);
    m->cooldown_end = mg_now_ms() + m->conf.exclude_cooldown_ms;
    set_timer(m, mg_now_ms() + m->conf.heartbeat_interval_ms, on_excluded_tick);
    return 1;
}

static int multi_next_round(void *impl, struct mg_agent *ag, const struct mg_round_info *info)
{
    struct multi *m = impl;
    m->ag = ag;
    cancel_timer(m);
    if (m->ts && m->ts_poller < 0) {
        struct mg_agent_poller p = {.fill = ts_fill, .process = ts_process, .ctx = m->ts};
        m->ts_poller = mg_agent_add_poller(ag, &p);
        if (m->ts_poller < 0)
            return m->ts_poller;
    }
    if (m->host && m->poller < 0) {
        /* Served by this loop for the agent's whole life. */
        struct mg_agent_poller p = {
            .fill = host_fill, .process = host_process, .timeout_ms = host_timeout, .ctx = m};
        m->poller = mg_agent_add_poller(ag, &p);
        if (m->poller < 0)
            return m->poller;
    }
    if (exclude_now(m)) /* sitting out, or failed (fail_run said why) */
        return m->phase == M_EXCLUDED && m->timer < 0 ? -ENOSPC : 0;
    m->phase = M_JOINING;
    m->progress_ms = mg_now_ms() + PROGRESS_FIRST_MS;
    int rc = mg_rdzv_join_begin(m->r);
    if (rc == -EINTR)
        return 0; /* a terminating signal is pending: the loop ends the run next */
    if (rc < 0) {
        fail_run(m, rc);
        return 0;
    }
    /* After a failure, the agent's backoff (docs/cli.md), applied here since
     * the agent leaves multi-node restarts to the rendezvous. */
    int64_t delay = 0;
    if (m->formed_ms && mg_rdzv_last_reason(m->r) == MG_RDZV_R_FAILURE)
        delay = mg_backoff_next(&m->backoff, mg_now_ms() - m->formed_ms);
    set_timer(m, mg_now_ms() + delay, on_join_step);
    return m->timer < 0 ? -ENOSPC : 0;
}

static void multi_round_ended(void *impl, struct mg_agent *ag, enum mg_round_result result)
{
    struct multi *m = impl;
    const struct mg_agent_result *res = mg_agent_result(ag);

    cancel_timer(m);
    if (m->host && m->backend == MG_RDZV_STATIC && result != MG_ROUND_SUCCEEDED) {
        /* The round is over on every node: the next one starts with the
         * workers' part of the agent store empty (torch namespaces attempts
         * in it, but later torch does not; mg's workers do). */
        if (m->ts)
            mg_tcpstore_clear(m->ts);
        mg_kv_host_delete_prefix(m->host, "/worker/", NULL);
    }
    if (m->phase == M_RESTARTING && result == MG_ROUND_FAILED) {
        /* A worker failed before the restart stopped it: the round had
         * already moved on (a node died, one failed elsewhere, one joined),
         * and this failure is most likely that change's doing (a peer's
         * death breaks the collectives at once). Every node re-forms; the
         * failure does not end this node's part in the job. */
        mg_agent_excuse_failure(ag, mg_rdzv_message(m->r));
    }
    if (m->phase != M_RUNNING) {
        m->phase = M_IDLE;
        return; /* stopped for a restart or a failure already handled */
    }
    m->phase = M_IDLE;
    if (result == MG_ROUND_SUCCEEDED) {
        int rc = mg_rdzv_finish_begin(m->r);
        if (rc < 0 && rc != -EINTR)
            return; /* no barrier possible: exit as the workers did */
        mg_agent_hold_exit(ag);
        m->phase = M_BARRIER;
        set_timer(m, mg_now_ms(), on_barrier_step);
        return;
    }
    if (result == MG_ROUND_FAILED) {
        struct mg_rdzv_failure f = {.rank = -1, .local_rank = -1, .exit_code = 1};
        int idx =
            res->rounds > 0 && res->attempts ? res->attempts[res->rounds - 1].first_failure : -1;
        if (idx >= 0 && idx < res->nfailures) {
            const struct mg_failure *x = &res->failures[idx];
            f.rank = x->rank;
            f.local_rank = x->local_rank;
            f.exit_code = x->exit_code;
            f.signal = x->signo;
            f.pid = (long)x->pid;
            f.time = x->wall_ms / 1000.0;
            snprintf(f.message, sizeof(f.message), "%s", x->message);
        }
        snprintf(f.host, sizeof(f.host), "%s", m->hostname);
        if (idx >= 0 && f.signal == 0 && f.exit_code == MG_EXIT_NO_RETRY) {
            /* The do-not-retry class: the job ends on every node with this
             * root cause, rather than re-forming into the same error. */
            mg_rdzv_fail_job(m->r, &f);
            fail_run(m, MG_RDZV_FAILED);
            return;
        }
        /* Re-form on every node; the next round decides whether it counts. */
        if (mg_rdzv_worker_failed(m->r, &f) == MG_RDZV_RESTART) {
            if (mg_rdzv_failed_here(m->r))
                count_failure(m);
            mg_agent_excuse_failure(ag, mg_rdzv_message(m->r));
        } else
            fail_run(m, MG_RDZV_FAILED); /* the run ends here: say why */
    }
}

static void on_close_step(struct mg_agent *ag, void *ctx)
{
    struct multi *m = ctx;
    m->timer = -1;
    m->waiting = NULL;
    if (mg_rdzv_close_step(m->r)) {
        m->phase = M_IDLE;
        mg_agent_linger_end(ag);
        return;
    }
    step_later(m, on_close_step);
}

static void multi_shutdown(void *impl, struct mg_agent *ag, int exit_code)
{
    struct multi *m = impl;
    cancel_timer(m);
    m->ag = ag;
    m->phase = M_IDLE;
    /* The run is over: what is left to send (leaving, etcd's lease
     * revocation at release) is a courtesy, bounded by a timer. */
    m->exit_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (m->exit_fd >= 0) {
        struct itimerspec its = {.it_value = {.tv_sec = EXIT_BLOCK_MS / 1000,
                                              .tv_nsec = EXIT_BLOCK_MS % 1000 * 1000000L}};
        timerfd_settime(m->exit_fd, 0, &its, NULL);
        m->kv->abort_fd = m->exit_fd;
    }
    if (mg_rdzv_close_begin(m->r, m->host != NULL, exit_code ? "it stopped with an error" : ""))
        return;
    /* This agent's store holds the outcome: serve it (a signal ends that)
     * until the others have read it and gone, at most close_timeout. */
    m->phase = M_CLOSING;
    mg_agent_linger(ag, mg_now_ms() + m->conf.close_timeout_ms);
    step_later(m, on_close_step);
}

void mg_multi_release(void *impl)
{
    struct multi *m = impl;
    if (!m)
        return;
    mg_rdzv_release(m->r);
    mg_kv_host_release(m->host); /* before the TCPStore side it hands connections to */
    mg_tcpstore_release(m->ts);
    if (m->abort_fd >= 0)
        close(m->abort_fd);
    if (m->exit_fd >= 0)
        close(m->exit_fd);
    free(m);
}

/* One table for the three backends; each instance names its own (the agent
 * prints the name and logs it as rdzv_backend). */
const struct mg_rdzv_ops mg_multi_ops = {
    .next_round = multi_next_round,
    .round_ended = multi_round_ended,
    .shutdown = multi_shutdown,
    .release = mg_multi_release,
};
