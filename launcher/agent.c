/* The agent's rounds: forming the group through the rendezvous backend,
 * starting an attempt, deciding what follows it (exit, hold, re-form,
 * restart after a backoff), the run's result and its end, the signals the
 * launcher gets and the API for rendezvous backends (see agent.h). Creating
 * and releasing the agent is agent_setup.c's, the workers themselves
 * workers.c's, their output relay.c's; the poll loop is loop.c's. */
#include "agent_internal.h"
#include "events.h"
#include "mg_err.h"
#include "net.h"
#include "proc.h"
#include "summary.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void finish(struct mg_agent *ag, int code);
static void on_signal(void *ctx, int sig);

/* ---- results ------------------------------------------------------------------------------ */

void mg_agent_error(struct mg_agent *ag, int err, const char *fmt, ...)
{
    va_list ap;
    char what[400];
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    if (!ag->res.error) {
        ag->res.error = err;
        mg_fmt(ag->res.error_msg, sizeof(ag->res.error_msg), "%s: %s", what, mg_strerror(err));
    }
}

/* The run is over with this exit code: the result, run_end, the backend told. */
static void finish_now(struct mg_agent *ag, int code)
{
    struct mg_agent_result *r = &ag->res;
    const struct mg_root_cause *rc = &r->root;
    char sig[32], rsig[32], xsig[32];

    if (ag->state == ST_DONE)
        return;
    ag->state = ST_DONE;
    mg_tty_restore(&ag->tty);
    r->exit_code = code;
    r->signo = ag->term_sig;
    r->ok = code == 0;
    struct mg_ev_run_end e = {
        .result = code == 0      ? "succeeded"
                  : ag->term_sig ? "signaled"
                  : r->error     ? "error"
                                 : "failed",
        .exit_code = code,
        .rounds = r->rounds,
        .restarts = r->restarts,
        .signal = ag->term_sig ? mg_signame(ag->term_sig, sig, sizeof(sig)) : NULL,
        .error = r->error ? r->error_msg : NULL,
        .has_root = r->nfailures > 0,
        .root =
            {
                .attempt = rc->f.attempt,
                .rank = rc->f.rank,
                .local_rank = rc->f.local_rank,
                .pid = rc->f.pid,
                .exit_code = rc->f.exit_code,
                .signal = rc->f.signo ? mg_signame(rc->f.signo, rsig, sizeof(rsig)) : NULL,
                .host = rc->host,
                .time_ms = rc->f.wall_ms,
                .message = rc->message[0] ? rc->message : NULL,
            },
        .has_remote = r->remote.set,
        .remote =
            {
                .rank = r->remote.rank,
                .local_rank = r->remote.local_rank,
                .pid = (int)r->remote.pid,
                .exit_code = r->remote.exit_code,
                .signal = r->remote.signo ? mg_signame(r->remote.signo, xsig, sizeof(xsig)) : NULL,
                .host = r->remote.host,
                .node = r->remote.node[0] ? r->remote.node : NULL,
                .time_ms = r->remote.wall_ms,
                .first_rank = r->remote.first_rank,
                .nranks = r->remote.nranks,
                .message = r->remote.message[0] ? r->remote.message : NULL,
            },
    };
    mg_event_run_end(&ag->rd, &e);
    mg_rundir_flush(&ag->rd);
    if (ag->cfg.rdzv->shutdown)
        ag->cfg.rdzv->shutdown(ag->cfg.rdzv_impl, ag, code);
}

/* The run ends with this exit code, unless it ends on a failure that a stop
 * of the whole job may have caused: then the stop signal gets until
 * hold_failure_until to arrive, and the run ends as stopped if it does. */
static void finish(struct mg_agent *ag, int code)
{
    if (ag->state == ST_DONE || (ag->state == ST_ENDING && !ag->term_sig))
        return;
    if (code != 0 && !ag->term_sig && mg_now_ms() < ag->hold_failure_until) {
        ag->state = ST_ENDING;
        ag->end_code = code;
        ag->end_deadline = ag->hold_failure_until;
        return;
    }
    finish_now(ag, code);
}

/* ---- rounds -------------------------------------------------------------------------------- */

static void start_round(struct mg_agent *ag)
{
    struct mg_round_info info = {
        .round = ag->round,
        .restart_count = ag->o->max_restarts - ag->restarts_left,
        .local_world_size = ag->nproc,
    };
    ag->state = ST_FORMING;
    ag->group_ready = 0;
    int rc = ag->cfg.rdzv->next_round(ag->cfg.rdzv_impl, ag, &info);
    if (rc && ag->state != ST_DONE) {
        mg_agent_error(ag, rc, "rendezvous (%s) failed", ag->cfg.rdzv->name);
        finish(ag, 1);
    }
}

/* The attempt's summary in the result and its attempt_start event. */
static void record_attempt(struct mg_agent *ag)
{
    const struct mg_group *g = &ag->group;
    int restart_count = ag->o->max_restarts - ag->restarts_left;

    if (ag->round >= ag->attempts_cap) {
        int ncap = ag->attempts_cap ? ag->attempts_cap * 2 : 8;
        struct mg_attempt_summary *a = realloc(ag->res.attempts, (size_t)ncap * sizeof(*a));
        if (a) {
            ag->res.attempts = a;
            ag->attempts_cap = ncap;
        }
    }
    if (ag->round < ag->attempts_cap) {
        struct mg_attempt_summary *a = &ag->res.attempts[ag->round];
        memset(a, 0, sizeof(*a));
        a->attempt = ag->attempt;
        a->restart_count = restart_count;
        a->first_failure = -1;
    }
    ag->res.rounds = ag->round + 1;
    struct mg_ev_attempt_start e = {
        .attempt = ag->attempt,
        .restart_count = restart_count,
        .round = ag->round,
        .nproc = ag->nproc,
        .world_size = g->world_size,
        .group_rank = g->group_rank,
        .group_world_size = g->group_world_size,
        .first_rank = g->rank_offset,
        .master_addr = g->master_addr,
        .master_port = g->master_port,
        .dir = ag->attempt_dir,
    };
    mg_event_attempt_start(&ag->rd, &e);
}

/* The group is formed: a new attempt directory, then the workers. */
static void start_attempt(struct mg_agent *ag)
{
    ag->state = ST_RUNNING;
    ag->stopping = 0;
    ag->group_deadline = ag->kill_deadline = INT64_MAX;
    ag->attempt_failed = ag->attempt_fatal = 0;
    ag->restart_req = 0;
    ag->running = 0;
    ag->open_pipes = 0;
    ag->attempt_start_ms = mg_now_ms();
    int rc = mg_rundir_new_attempt(&ag->rd, ag->nproc, &ag->attempt, ag->attempt_dir,
                                   sizeof(ag->attempt_dir));
    if (rc) {
        mg_agent_error(ag, rc, "cannot create an attempt directory in %s", ag->rd.dir);
        if (ag->group.master_fd >= 0)
            close(ag->group.master_fd);
        ag->group.master_fd = -1;
        finish(ag, 1);
        return;
    }
    mg_workers_prepare(ag);
    record_attempt(ag);
    /* The port was held until now so nobody else could take it. */
    if (ag->group.master_fd >= 0) {
        close(ag->group.master_fd);
        ag->group.master_fd = -1;
    }
    mg_watch_attempt_start(ag, &ag->watch);
    mg_workers_spawn(ag);
    if (ag->res.error) {
        /* Could not start the whole group: a launcher failure, not a worker's. */
        ag->attempt_fatal = 1;
        mg_workers_stop(ag, SIGTERM);
        ag->fail_req = 1;
        ag->fail_code = 1;
    }
    if (ag->running == 0)
        ag->drain_deadline = mg_now_ms();
}

static void after_attempt(struct mg_agent *ag, int64_t ran);

/* Every worker exited and the pipes are drained: the attempt's outcome. */
static void end_attempt(struct mg_agent *ag)
{
    struct mg_attempt_tally t;

    mg_workers_end(ag, &t);
    int64_t ran = mg_now_ms() - ag->attempt_start_ms;
    mg_watch_resume_event(ag, &ag->watch); /* a worker that said it and died at once */
    if (ag->round < ag->attempts_cap) {
        struct mg_attempt_summary *a = &ag->res.attempts[ag->round];
        a->nfailed = t.nfailed;
        a->nstopped = t.nstopped;
        a->first_failure = t.first_failure;
        a->duration_ms = ran;
    }
    enum mg_round_result result = ag->attempt_failed             ? MG_ROUND_FAILED
                                  : (ag->stopping || t.nstopped) ? MG_ROUND_STOPPED
                                                                 : MG_ROUND_SUCCEEDED;
    struct mg_ev_attempt_end e = {
        .attempt = ag->attempt,
        .result = result == MG_ROUND_FAILED    ? "failed"
                  : result == MG_ROUND_STOPPED ? "stopped"
                                               : "succeeded",
        .failed = t.nfailed,
        .stopped = t.nstopped,
        .duration_ms = ran,
        .step = mg_watch_lowest_step(ag, &ag->watch),
    };
    mg_event_attempt_end(&ag->rd, &e);
    ag->round++;
    ag->hold_req = 0;
    if (ag->cfg.rdzv->round_ended)
        ag->cfg.rdzv->round_ended(ag->cfg.rdzv_impl, ag, result);
    after_attempt(ag, ran);
}

/* What follows an attempt: exit, hold, re-form or restart. */
static void after_attempt(struct mg_agent *ag, int64_t ran)
{
    const struct mg_launch_opts *o = ag->o;
    struct mg_agent_result *r = &ag->res;

    if (ag->term_sig) {
        finish(ag, 128 + ag->term_sig);
        return;
    }
    if (ag->fail_req) {
        finish(ag, ag->fail_code);
        return;
    }
    int failure = ag->attempt_failed || (ag->restart_req && ag->restart_kind == MG_RESTART_FAILURE);
    if (!failure && ag->restart_req) {
        mg_agent_note(ag, "re-forming the group (%s)", ag->restart_reason);
        start_round(ag);
        return;
    }
    if (!failure && ag->hold_req) {
        ag->state = ST_HOLD;
        return;
    }
    if (!failure) {
        finish(ag, 0);
        return;
    }
    int code = r->nfailures ? r->root.f.exit_code : 1;
    if (ag->attempt_fatal == 2 && code == MG_EXIT_NO_RETRY && ag->restarts_left > 0) {
        mg_agent_note(ag,
                      "not restarting: exit code %d is the do-not-retry class (a usage or "
                      "configuration error, which a restart would meet again)",
                      MG_EXIT_NO_RETRY);
        finish(ag, MG_EXIT_NO_RETRY);
        return;
    }
    if (ag->attempt_fatal == 1) {
        mg_agent_note(ag, "not restarting: the program could not be started");
        finish(ag, code ? code : 1);
        return;
    }
    if (ag->restarts_left <= 0) {
        finish(ag, code ? code : 1);
        return;
    }
    ag->restarts_left--;
    r->restarts++;
    int64_t delay = mg_backoff_next(&ag->backoff, ran);
    int done = o->max_restarts - ag->restarts_left;
    if (delay)
        mg_agent_note(ag, "restarting the workers in %lld ms (restart %d of %d)", (long long)delay,
                      done, o->max_restarts);
    else
        mg_agent_note(ag, "restarting the workers (restart %d of %d)", done, o->max_restarts);
    struct mg_ev_restart e = {
        .restart_count = done,
        .max_restarts = o->max_restarts,
        .backoff_ms = delay,
        .reason = ag->attempt_failed ? "worker failed" : ag->restart_reason,
    };
    mg_event_restart(&ag->rd, &e);
    if (delay > 0) {
        ag->state = ST_BACKOFF;
        ag->backoff_deadline = mg_now_ms() + delay;
    } else {
        start_round(ag);
    }
}

static void nearest(int64_t *dl, int64_t d)
{
    if (d >= 0 && (*dl < 0 || d < *dl))
        *dl = d;
}

/* When a worker sent SIGKILL is to be given up on, or -1. */
static int64_t unkillable_deadline(const struct mg_agent *ag)
{
    int64_t dl = -1;
    for (int i = 0; i < ag->nproc; i++)
        if (ag->w[i].outcome == W_RUNNING && ag->w[i].kill_ms)
            nearest(&dl, ag->w[i].kill_ms + UNKILLABLE_MS);
    return dl;
}

/* One state transition if one is due; returns 1 when something happened. */
static int step(struct mg_agent *ag)
{
    int64_t now = mg_now_ms();
    switch (ag->state) {
    case ST_FORMING:
        if (!ag->group_ready)
            return 0;
        ag->group_ready = 0;
        start_attempt(ag);
        return 1;
    case ST_RUNNING:
        if (ag->stopping && ag->running > 0 && now >= ag->group_deadline) {
            mg_workers_stop_groups(ag);
            return 1;
        }
        if (ag->stopping && (ag->running > 0 || mg_workers_groups_left(ag)) &&
            now >= ag->kill_deadline) {
            mg_agent_note(ag, "grace period over: killing the remaining workers");
            mg_workers_kill(ag, "grace period over");
            ag->kill_deadline = INT64_MAX;
            return 1;
        }
        if (ag->running > 0 && unkillable_deadline(ag) >= 0 && now >= unkillable_deadline(ag)) {
            mg_workers_unkillable(ag, now);
            return 1;
        }
        if (ag->running == 0 && (ag->open_pipes == 0 || now >= ag->drain_deadline) &&
            !(ag->kill_deadline != INT64_MAX && mg_workers_groups_left(ag))) {
            end_attempt(ag);
            return 1;
        }
        return 0;
    case ST_BACKOFF:
        if (now < ag->backoff_deadline)
            return 0;
        start_round(ag);
        return 1;
    case ST_ENDING:
        if (now < ag->end_deadline)
            return 0;
        finish_now(ag, ag->end_code);
        return 1;
    case ST_HOLD:
    case ST_DONE:
        return 0;
    }
    return 0;
}

/* The state machine's next deadline, for the loop's poll timeout. */
static int next_deadline_ms(void *ctx)
{
    struct mg_agent *ag = ctx;
    int64_t dl = -1;
    if (ag->state == ST_RUNNING && ag->stopping && ag->running > 0 &&
        ag->kill_deadline != INT64_MAX)
        nearest(&dl, ag->kill_deadline);
    if (ag->state == ST_RUNNING && ag->stopping && ag->running > 0 &&
        ag->group_deadline != INT64_MAX)
        nearest(&dl, ag->group_deadline);
    /* A group a stopped worker left: looked at again shortly, until the
     * grace period's end. */
    if (ag->state == ST_RUNNING && ag->running == 0 && ag->kill_deadline != INT64_MAX &&
        mg_workers_groups_left(ag))
        nearest(&dl, mg_now_ms() + 50 < ag->kill_deadline ? mg_now_ms() + 50 : ag->kill_deadline);
    if (ag->state == ST_RUNNING && ag->running == 0)
        nearest(&dl, ag->drain_deadline);
    if (ag->state == ST_RUNNING && ag->running > 0)
        nearest(&dl, unkillable_deadline(ag));
    if (ag->state == ST_BACKOFF)
        nearest(&dl, ag->backoff_deadline);
    if (ag->state == ST_ENDING)
        nearest(&dl, ag->end_deadline);
    if (ag->lingering)
        nearest(&dl, ag->linger_deadline);
    return mg_ms_until(dl);
}

/* ---- signals ------------------------------------------------------------------------------ */

/* The signals the loop reads from its signalfd: --signals-to-handle (which
 * stop the run), SIGUSR1 and SIGUSR2 (passed on) unless listed there, and
 * the ones mglaunch needs itself. They are handled whatever their
 * disposition at start: a script's background job starts with SIGINT and
 * SIGQUIT ignored, and must still stop on them, as torchrun does. The one
 * exception is SIGHUP ignored at start by nohup, whose whole point is to
 * survive a hangup, unless --signals-to-handle names SIGHUP. The workers get
 * the signals passed on to them with their default action (stop_set and
 * reset_set). */
static void handled_signals(struct mg_agent *ag, sigset_t *set)
{
    const struct mg_launch_opts *o = ag->o;
    sigemptyset(set);
    sigemptyset(&ag->stop_set);
    sigemptyset(&ag->reset_set);
    for (int i = 0; i < o->nsignals; i++) {
        int sig = o->signals[i];
        struct sigaction old;
        if (sig == SIGHUP && !o->signals_given && sigaction(SIGHUP, NULL, &old) == 0 &&
            old.sa_handler == SIG_IGN)
            continue; /* nohup */
        sigaddset(&ag->stop_set, sig);
        sigaddset(&ag->reset_set, sig);
        sigaddset(set, sig);
    }
    sigaddset(set, SIGUSR1);
    sigaddset(set, SIGUSR2);
    sigaddset(&ag->reset_set, SIGUSR1);
    sigaddset(&ag->reset_set, SIGUSR2);
    sigaddset(set, SIGCHLD);
    sigaddset(set, SIGCONT);
    sigaddset(set, SIGTSTP);
    if (ag->cfg.on_tty)
        sigaddset(set, SIGWINCH);
}

static void on_term_signal(struct mg_agent *ag, int sig)
{
    char name[32];
    struct mg_ev_signal e = {.signal = mg_signame(sig, name, sizeof(name))};
    mg_event_signal(&ag->rd, &e);
    if (++ag->nterm > 1) {
        mg_agent_note(ag, "%s again: killing the workers now", name);
        mg_workers_kill(ag, "second signal");
        return;
    }
    ag->term_sig = sig;
    /* Workers that failed just before it were stopped by the same stop. */
    mg_workers_excuse_recent(ag);
    if (ag->state == ST_RUNNING && ag->running > 0) {
        mg_agent_note(
            ag, "%s: stopping the workers (%g s grace period; send it again to kill them now)",
            name, ag->o->shutdown_timeout);
        if (ag->stopping)
            mg_workers_signal(ag, sig); /* already asked to stop after a failure: pass it on */
        else
            mg_workers_stop(ag, sig);
    } else if (ag->state != ST_RUNNING) {
        finish(ag, 128 + sig);
    }
}

void mg_agent_take_stop_signal(struct mg_agent *ag)
{
    struct timespec now = {0, 0};
    sigset_t pending, set;

    if (ag->nterm || sigpending(&pending) < 0)
        return;
    sigandset(&set, &pending, &ag->stop_set);
    if (sigisemptyset(&set))
        return;
    /* Taken off the pending set (the signals are blocked), so the loop's
     * signalfd does not see it a second time. */
    int sig = sigtimedwait(&set, NULL, &now);
    if (sig > 0)
        on_signal(ag, sig);
}

static void on_signal(void *ctx, int sig)
{
    struct mg_agent *ag = ctx;
    if (sigismember(&ag->stop_set, sig) == 1) {
        if (ag->state == ST_DONE)
            ag->lingering = 0; /* the run already ended: just stop waiting */
        else
            on_term_signal(ag, sig);
        return;
    }
    switch (sig) {
    case SIGUSR1:
    case SIGUSR2: {
        /* To the worker only, as torchrun sends its signals: a child of the
         * worker without a handler (a DataLoader process) would die of it. */
        char name[32];
        struct mg_ev_signal e = {mg_signame(sig, name, sizeof(name)), 1};
        mg_workers_notify(ag, sig);
        mg_event_signal(&ag->rd, &e);
        break;
    }
    case SIGTSTP: /* Ctrl-Z: the workers are in other process groups */
        mg_workers_signal(ag, SIGSTOP);
        mg_workers_flush(ag);
        mg_rundir_flush(&ag->rd);
        mg_tty_restore(&ag->tty); /* the shell gets its terminal back as it was */
        raise(SIGSTOP);
        break;
    case SIGCONT:
        if (mg_workers_on_pty(ag) && mg_tty_is_foreground(ag->tty.fd))
            mg_tty_raw(&ag->tty);
        mg_workers_signal(ag, SIGCONT);
        break;
    case SIGWINCH:
        mg_workers_resize(ag);
        break;
    }
}

static void on_children(void *ctx)
{
    mg_workers_reap(ctx);
}

int mg_agent_run(struct mg_agent *ag)
{
    const char *what = NULL;
    start_round(ag);
    while (ag->state != ST_DONE || ag->lingering) {
        while (step(ag))
            ;
        if (ag->state == ST_DONE && (!ag->lingering || mg_now_ms() >= ag->linger_deadline))
            break;
        mg_rundir_flush(&ag->rd);
        mg_workers_flush(ag);
        int rc = mg_loop_once(&ag->loop, &what);
        if (rc < 0) {
            mg_agent_error(ag, rc, "%s", what);
            mg_workers_kill(ag, "launcher error");
            finish_now(ag, 1);
            break;
        }
    }
    mg_workers_flush(ag);
    mg_rundir_flush(&ag->rd);
    return ag->res.exit_code;
}

/* The loop this agent runs: the signals it handles (blocked, then read from
 * its signalfd) and the workers' pipes. */
int mg_agent_loop_init(struct mg_agent *ag, char *err, size_t errcap)
{
    sigset_t set;
    int rc;
    struct sigaction dfl = {.sa_handler = SIG_DFL}, ign = {.sa_handler = SIG_IGN};
    struct mg_loop_signals on = {on_signal, on_children, ag};

    /* A parent that ignores SIGCHLD would make our children vanish unreaped. */
    sigaction(SIGCHLD, &dfl, NULL);
    sigaction(SIGPIPE, &ign, NULL);
    handled_signals(ag, &set);
    if ((rc = mg_loop_init(&ag->loop, &set, &on))) {
        mg_fmt(err, errcap, "signalfd: %s", strerror(-rc));
        return rc;
    }
    /* Blocked now and read from the signalfd; an ignored disposition
     * inherited from the parent must not decide anything any more. */
    for (int s = 1; s < NSIG; s++)
        if (sigismember(&ag->reset_set, s) == 1)
            sigaction(s, &dfl, NULL);
    /* The workers' pipes come first in every poll, as their output came
     * first before anything a backend does about it. */
    struct mg_poller pipes = {mg_workers_fill, mg_workers_process, next_deadline_ms, ag};
    if ((rc = mg_loop_add_poller(&ag->loop, &pipes)) < 0) {
        mg_fmt(err, errcap, "poll set: %s", mg_strerror(rc));
        return rc;
    }
    return 0;
}

/* ---- for backends ----------------------------------------------------------------------- */

int mg_agent_group_formed(struct mg_agent *ag, const struct mg_group *g)
{
    if (ag->state != ST_FORMING)
        return -EINVAL;
    ag->group = *g;
    ag->group_ready = 1;
    if (g->has_restart_count) {
        int left = ag->o->max_restarts - g->restart_count;
        ag->restarts_left = left > 0 ? left : 0;
        ag->res.restarts = g->restart_count;
    }
    return 0;
}

void mg_agent_request_restart(struct mg_agent *ag, enum mg_restart_kind kind, const char *reason)
{
    if (ag->state == ST_DONE)
        return;
    if (!ag->restart_req || kind == MG_RESTART_FAILURE)
        ag->restart_kind = kind;
    ag->restart_req = 1;
    mg_fmt(ag->restart_reason, sizeof(ag->restart_reason), "%s", reason ? reason : "requested");
    if (ag->state == ST_RUNNING && ag->running > 0 && !ag->stopping)
        mg_workers_stop(ag, SIGTERM);
    else if (ag->state == ST_FORMING)
        ag->restart_req = 0; /* the backend is forming anyway */
    else if (ag->state == ST_HOLD)
        after_attempt(ag, mg_now_ms() - ag->attempt_start_ms);
}

void mg_agent_hold_exit(struct mg_agent *ag)
{
    ag->hold_req = 1;
}

void mg_agent_excuse_failure(struct mg_agent *ag, const char *reason)
{
    if (ag->state == ST_DONE || ag->attempt_fatal)
        return;
    ag->attempt_failed = 0;
    ag->restart_req = 1;
    ag->restart_kind = MG_RESTART_MEMBERSHIP;
    mg_fmt(ag->restart_reason, sizeof(ag->restart_reason), "%s", reason ? reason : "failure");
}

void mg_agent_finish(struct mg_agent *ag, int exit_code)
{
    if (ag->state == ST_HOLD)
        finish(ag, exit_code);
}

void mg_agent_fail(struct mg_agent *ag, int exit_code, const char *msg)
{
    if (ag->state == ST_DONE)
        return;
    if (!ag->res.error) {
        ag->res.error = -MG_ECLOSED;
        mg_fmt(ag->res.error_msg, sizeof(ag->res.error_msg), "%s", msg ? msg : "failed");
    }
    ag->fail_req = 1;
    ag->fail_code = exit_code;
    if (ag->state == ST_RUNNING && ag->running > 0)
        mg_workers_stop(ag, SIGTERM);
    else if (ag->state != ST_RUNNING)
        finish(ag, exit_code);
}

void mg_agent_remote_cause(struct mg_agent *ag, const struct mg_remote_cause *rc)
{
    if (ag->res.remote.set)
        return;
    ag->res.remote = *rc;
    ag->res.remote.set = 1;
}

void mg_agent_linger(struct mg_agent *ag, int64_t deadline_ms)
{
    ag->lingering = 1;
    ag->linger_deadline = deadline_ms;
}

void mg_agent_linger_end(struct mg_agent *ag)
{
    ag->lingering = 0;
}

int mg_agent_add_poller(struct mg_agent *ag, const struct mg_agent_poller *p)
{
    struct mg_poller lp = {p->fill, p->process, p->timeout_ms, p->ctx};
    return mg_loop_add_poller(&ag->loop, &lp);
}

void mg_agent_remove_poller(struct mg_agent *ag, int id)
{
    if (id > 0) /* 0 is the workers' pipes */
        mg_loop_remove_poller(&ag->loop, id);
}

static void run_timer(void *ctx, int id)
{
    struct mg_agent *ag = ctx;
    ag->timers[id].fn(ag, ag->timers[id].ctx);
}

int mg_agent_add_timer(struct mg_agent *ag, int64_t deadline_ms, mg_agent_timer_fn fn, void *ctx)
{
    int id = mg_loop_add_timer(&ag->loop, deadline_ms, run_timer, ag);
    if (id >= 0) {
        ag->timers[id].fn = fn;
        ag->timers[id].ctx = ctx;
    }
    return id;
}

void mg_agent_cancel_timer(struct mg_agent *ag, int id)
{
    mg_loop_cancel_timer(&ag->loop, id);
}

int64_t mg_backoff_next(struct mg_backoff *b, int64_t ran_ms)
{
    if (ran_ms >= MG_BACKOFF_WINDOW_MS)
        b->streak = 0;
    int64_t d = 0;
    if (b->streak > 0) {
        d = MG_BACKOFF_BASE_MS;
        for (int i = 1; i < b->streak && d < MG_BACKOFF_MAX_MS; i++)
            d *= 2;
        if (d > MG_BACKOFF_MAX_MS)
            d = MG_BACKOFF_MAX_MS;
    }
    if (b->streak < 1000)
        b->streak++;
    return d;
}
