/* The workers of an attempt: reaping them, stopping them, and the
 * bookkeeping of their exits and failures (see agent_internal.h). Preparing
 * and spawning them is workers_spawn.c's, their output relay.c's. */
#include "agent_internal.h"
#include "errfile.h"
#include "procstate.h"
#include "events.h"
#include "mg_err.h"
#include "net.h"
#include "proc.h"
#include "summary.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_SENTINEL_RESTARTS 10

/* ---- stopping ----------------------------------------------------------------------- */

void mg_workers_signal(struct mg_agent *ag, int sig)
{
    for (int i = 0; i < ag->nproc; i++)
        if (ag->w[i].outcome == W_RUNNING)
            kill(-ag->w[i].pid, sig);
}

void mg_workers_notify(struct mg_agent *ag, int sig)
{
    for (int i = 0; i < ag->nproc; i++)
        if (ag->w[i].outcome == W_RUNNING)
            kill(ag->w[i].pid, sig);
}

void mg_workers_stop(struct mg_agent *ag, int sig)
{
    int64_t grace = (int64_t)(ag->o->shutdown_timeout * 1000.0);
    int64_t delay = (int64_t)(ag->o->stop_group_delay * 1000.0);
    for (int i = 0; i < ag->nproc; i++) {
        struct worker *w = &ag->w[i];
        if (w->outcome != W_RUNNING)
            continue;
        /* One that is already exiting (its sockets may be closed, which is
         * what made another fail first) is not stopped: it failed too. */
        if (mg_proc_exiting(w->pid) == 1) {
            w->exiting_at_stop = 1;
            continue;
        }
        if (w->hang[0])
            continue; /* already killed */
        w->stop_sent = grace > 0 ? sig : SIGKILL;
        /* The worker first, so that it can save while its helpers (DataLoader
         * workers, a writer's subprocess) still run; they get it after
         * --stop_group_delay. torchrun signals the whole group at once, and
         * the helpers die under the save (pytorch/pytorch#113231). A stopped
         * process keeps a signal pending until it is continued: SIGCONT
         * follows, or a frozen rank would cost the whole grace period. */
        if (delay > 0 && w->stop_sent != SIGKILL) {
            kill(w->pid, w->stop_sent);
            kill(w->pid, SIGCONT);
            w->group_pending = 1;
        } else {
            kill(-w->pid, w->stop_sent);
            kill(-w->pid, SIGCONT);
        }
        if (w->stop_sent == SIGKILL && !w->kill_ms)
            w->kill_ms = mg_now_ms();
    }
    if (!ag->stopping) {
        ag->kill_deadline = mg_now_ms() + grace;
        ag->group_deadline = mg_now_ms() + (delay < grace ? delay : grace);
    }
    ag->stopping = 1;
}

void mg_workers_stop_groups(struct mg_agent *ag)
{
    for (int i = 0; i < ag->nproc; i++) {
        struct worker *w = &ag->w[i];
        if (w->group_pending && w->outcome == W_RUNNING) {
            kill(-w->pid, w->stop_sent);
            kill(-w->pid, SIGCONT);
        }
        w->group_pending = 0;
    }
    ag->group_deadline = INT64_MAX;
}

int mg_workers_groups_left(struct mg_agent *ag)
{
    int n = 0;
    for (int i = 0; i < ag->nproc; i++) {
        struct worker *w = &ag->w[i];
        /* The group id stays the worker's pid while a member lives, so the
         * pid cannot name another group until this says it is gone. */
        if (w->group_left && !mg_proc_group_alive(w->pid))
            w->group_left = 0;
        n += w->group_left;
    }
    return n;
}

void mg_workers_kill(struct mg_agent *ag, const char *why)
{
    int n = 0;
    for (int i = 0; i < ag->nproc; i++)
        if (ag->w[i].outcome == W_RUNNING) {
            kill(-ag->w[i].pid, SIGKILL);
            if (!ag->w[i].kill_ms)
                ag->w[i].kill_ms = mg_now_ms();
            /* one that was already exiting is still its own failure */
            if (!ag->w[i].exiting_at_stop)
                ag->w[i].stop_sent = SIGKILL;
            n++;
        }
    for (int i = 0; i < ag->nproc; i++)
        if (ag->w[i].group_left) {
            kill(-ag->w[i].pid, SIGKILL);
            ag->w[i].group_left = 0;
        }
    if (n) {
        struct mg_ev_kill e = {.attempt = ag->attempt, .workers = n, .reason = why};
        mg_event_kill(&ag->rd, &e);
    }
}

void mg_workers_condemn(struct mg_agent *ag, int i, int sig, int pid, const char *kind,
                        const char *verdict, const char *why)
{
    if (i < 0 || i >= ag->nproc)
        return;
    struct worker *w = &ag->w[i];
    if (w->outcome != W_RUNNING || w->hang[0])
        return;
    mg_fmt(w->hang, sizeof(w->hang), "%s", why && *why ? why : verdict);
    mg_fmt(w->verdict, sizeof(w->verdict), "%s", verdict);
    char name[32];
    if (sig > 0) {
        kill(pid == w->pid ? -pid : pid, sig);
        if (sig == SIGKILL)
            w->kill_ms = mg_now_ms();
    }
    struct mg_ev_kill e = {.attempt = ag->attempt, .workers = 1, .reason = kind};
    mg_event_kill(&ag->rd, &e);
    if (!ag->stopping)
        mg_agent_note(ag, "sent %s to local rank %d (rank %d, pid %d); stopping the other workers",
                      mg_signame(sig, name, sizeof(name)), w->local_rank, w->rank, pid);
    mg_workers_stop(ag, SIGTERM);
}

static void worker_exited(struct mg_agent *ag, struct worker *w, int wstatus);

int64_t mg_workers_unkillable(struct mg_agent *ag, int64_t now)
{
    int64_t next = -1;
    for (int i = 0; i < ag->nproc; i++) {
        struct worker *w = &ag->w[i];
        if (w->outcome != W_RUNNING || !w->kill_ms)
            continue;
        int64_t due = w->kill_ms + UNKILLABLE_MS;
        if (now < due) {
            next = next < 0 || due < next ? due : next;
            continue;
        }
        struct mg_procstate ps;
        char st[160];
        mg_procstate_read(NULL, (int)w->pid, &ps);
        mg_agent_note(ag,
                      "local rank %d (rank %d, pid %d) is still there %.0f s after SIGKILL: %s; "
                      "not waiting for it any longer (it may still hold its GPU, memory and "
                      "ports; see `cat /proc/%d/stack`)",
                      w->local_rank, w->rank, (int)w->pid, (now - w->kill_ms) / 1000.0,
                      mg_procstate_text(&ps, st, sizeof(st)), (int)w->pid);
        worker_exited(ag, w, SIGKILL); /* as if killed: a wait status of signal 9 */
    }
    return next;
}

/* ---- failures ------------------------------------------------------------------------- */

static void describe_exit(const struct worker *w, const char *oom, char *buf, size_t cap)
{
    char sig[32];
    if (w->exec_errno)
        mg_fmt(buf, cap, "could not be executed (%s), exit code %d", strerror(w->exec_errno),
               mg_status_code(w->wstatus));
    else if (oom && *oom)
        mg_fmt(buf, cap, "was killed by the kernel's OOM killer (out of memory; %s)", oom);
    else if (WIFSIGNALED(w->wstatus))
        mg_fmt(buf, cap, "was killed by %s", mg_signame(WTERMSIG(w->wstatus), sig, sizeof(sig)));
    else
        mg_fmt(buf, cap, "exited with code %d", mg_status_code(w->wstatus));
}

/* An exit a stop signal would cause: killed by one, or exited 128 + its
 * number (a handler's "exit(128 + signum)", a shell's). */
static int stop_shaped(const struct mg_agent *ag, int wstatus)
{
    int sig = WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : WEXITSTATUS(wstatus) - 128;
    return sig > 0 && sig < NSIG && sigismember(&ag->stop_set, sig) == 1;
}

/* An abrupt death: a signal that no stop explains (a crash, an OOM kill,
 * kill -9), not an exit the program chose. */
static int crashed(const struct mg_agent *ag, const struct worker *w)
{
    return WIFSIGNALED(w->wstatus) && !stop_shaped(ag, w->wstatus) && !w->exec_errno;
}

static void record_failure(struct mg_agent *ag, struct worker *w, const struct mg_errfile *ef,
                           int has_ef, const char *oom)
{
    struct mg_agent_result *r = &ag->res;
    w->failure = -1;
    if (r->nfailures >= MG_MAX_FAILURES) {
        r->failures_dropped++;
        return;
    }
    struct mg_failure *f = &r->failures[r->nfailures];
    memset(f, 0, sizeof(*f));
    f->attempt = ag->attempt;
    f->restart_count = ag->o->max_restarts - ag->restarts_left;
    f->rank = w->rank;
    f->local_rank = w->local_rank;
    f->pid = w->pid;
    f->exit_code = mg_status_code(w->wstatus);
    f->signo = WIFSIGNALED(w->wstatus) ? WTERMSIG(w->wstatus) : 0;
    f->exec_errno = w->exec_errno;
    f->wall_ms = mg_wall_ms();
    f->seen_ms = w->end_ms;
    f->duration_ms = w->end_ms - w->start_ms;
    if (has_ef)
        mg_fmt(f->message, sizeof(f->message), "%s", ef->message);
    mg_fmt(f->oom, sizeof(f->oom), "%s", oom);
    mg_fmt(f->verdict, sizeof(f->verdict), "%s", w->hang[0] ? w->verdict : "");
    w->failure = r->nfailures++;
    /* A stop of the whole job may be on its way: a worker that died of a
     * terminating signal (or exited as its handler of one does), or, with
     * several nodes, any failure (its peer may have been stopped first). */
    if (!w->exec_errno && (stop_shaped(ag, w->wstatus) || ag->group.group_world_size > 1))
        ag->hold_failure_until = w->end_ms + STOP_WINDOW_MS;
}

static void fill_root_cause(struct mg_agent *ag, struct worker *w);

/* mglaunch's own stop signal came after these failures. */
void mg_workers_excuse_recent(struct mg_agent *ag)
{
    struct mg_agent_result *r = &ag->res;
    int64_t since = mg_now_ms() - STOP_WINDOW_MS;
    int keep = r->nfailures;
    char sig[32];

    /* Failures are recorded as they are seen: the recent ones are the last. */
    while (keep > 0 && r->failures[keep - 1].seen_ms >= since && !r->failures[keep - 1].exec_errno)
        keep--;
    if (keep == r->nfailures)
        return;
    for (int k = keep; k < r->nfailures; k++) {
        const struct mg_failure *f = &r->failures[k];
        struct mg_ev_worker_exit e = {
            .w = {f->attempt, f->local_rank, f->rank, f->pid},
            .outcome = "stopped",
            .exit_code = f->exit_code,
            .signal = f->signo ? mg_signame(f->signo, sig, sizeof(sig)) : NULL,
            .duration_ms = f->duration_ms,
            .message = f->message[0] ? f->message : NULL,
        };
        mg_event_worker_exit(&ag->rd, &e);
        /* An attempt that already ended: its tally. */
        for (int i = 0; i < r->rounds && r->attempts; i++) {
            struct mg_attempt_summary *a = &r->attempts[i];
            if (a->attempt != f->attempt || (ag->state == ST_RUNNING && i == ag->round))
                continue;
            a->nfailed--;
            a->nstopped++;
            if (a->first_failure >= keep)
                a->first_failure = -1;
            if (a->nfailed == 0) {
                struct mg_ev_attempt_end ae = {
                    .attempt = a->attempt,
                    .result = "stopped",
                    .failed = 0,
                    .stopped = a->nstopped,
                    .duration_ms = a->duration_ms,
                    .step = -1,
                };
                mg_event_attempt_end(&ag->rd, &ae);
            }
        }
    }
    /* The attempt that runs: its workers. */
    if (ag->state == ST_RUNNING) {
        int failed = 0;
        for (int i = 0; i < ag->nproc; i++) {
            struct worker *w = &ag->w[i];
            if (w->outcome == W_FAILED && w->failure >= keep) {
                w->outcome = W_STOPPED;
                w->failure = -1;
            }
            failed |= w->outcome == W_FAILED;
        }
        ag->attempt_failed = failed || ag->attempt_fatal;
    }
    r->nfailures = keep;
    if (keep == 0 || r->root_failure >= keep) {
        /* the root cause was excused: the first failure kept takes its place */
        memset(&r->root, 0, sizeof(r->root));
        r->root_failure = -1;
        for (int i = 0; keep > 0 && i < ag->nproc && r->root_failure < 0; i++)
            if (ag->w[i].outcome == W_FAILED && ag->w[i].failure == 0)
                fill_root_cause(ag, &ag->w[i]);
        if (keep > 0 && r->root_failure < 0) { /* its workers are gone: what was recorded */
            r->root.f = r->failures[0];
            r->root_failure = 0;
        }
    }
    ag->hold_failure_until = 0;
}

/* Fills the root cause once the attempt is over and its output drained. */
static void fill_root_cause(struct mg_agent *ag, struct worker *w)
{
    struct mg_root_cause *rc = &ag->res.root;
    /* only the first failed attempt of the run has the run's root cause */
    if (w->failure < 0 || ag->res.failures[w->failure].attempt != ag->res.failures[0].attempt)
        return;
    rc->f = ag->res.failures[w->failure];
    ag->res.root_failure = w->failure;
    mg_fmt(rc->host, sizeof(rc->host), "%s", ag->cfg.hostname);
    mg_worker_dir(ag, w->local_rank, rc->log_path, sizeof(rc->log_path));
    mg_worker_errfile_path(ag, w->local_rank, rc->error_file, sizeof(rc->error_file));
    rc->logs_saved = w->out.file_fd != -2 || w->err.file_fd != -2;
    rc->stderr_kept = 1;
    mg_worker_logs_note(w, rc->logs_note, sizeof(rc->logs_note));
    if (w->exec_errno) {
        mg_fmt(rc->exec_error, sizeof(rc->exec_error), "%s", strerror(w->exec_errno));
        mg_fmt(rc->message, sizeof(rc->message), "cannot execute '%s': %s", ag->cfg.exec_path,
               rc->exec_error);
        rc->error_file[0] = '\0';
    } else {
        mg_root_cause_errfile(rc);
    }
    if (w->hang[0]) /* the watchdog's verdict, not what a killed worker may have left */
        mg_fmt(rc->message, sizeof(rc->message), "%s", w->hang);
    if (w->tail)
        mg_tail_lines(w->tail, w->tail_len, w->tail_cut, MG_STDERR_TAIL_LINES, rc->stderr_tail,
                      sizeof(rc->stderr_tail));
}

/* ---- worker exit --------------------------------------------------------------------- */

static void worker_exited(struct mg_agent *ag, struct worker *w, int wstatus)
{
    char how[512], sig[32], oom[200] = "";
    struct mg_errfile ef;
    int has_ef = 0;

    /* A stop signal that is already on its way is the cause of this exit
     * more often than not: act on it first. */
    if (wstatus != 0 && !w->stop_sent)
        mg_agent_take_stop_signal(ag);
    w->wstatus = wstatus;
    w->end_ms = mg_now_ms();
    ag->running--;
    /* Anything the worker left behind in its process group goes with it;
     * when it exited before its group had the stop signal (it saved fast, or
     * it is a shell that the signal ended while its program runs on), the
     * group gets the stop signal now and SIGKILL at the grace period's end. */
    if (w->group_pending) {
        kill(-w->pid, w->stop_sent);
        kill(-w->pid, SIGCONT);
        w->group_pending = 0;
        w->group_left = 1;
    } else {
        kill(-w->pid, SIGKILL);
    }
    if (ag->sent.fd >= 0)
        mg_sentinel_forget(&ag->sent, w->pid);

    if (w->hang[0]) {
        /* The watchdog's verdict, whatever the exit: the root cause. */
        w->outcome = W_FAILED;
        memset(&ef, 0, sizeof(ef));
        ef.rank = -1;
        mg_fmt(ef.message, sizeof(ef.message), "%s", w->hang);
        has_ef = 1;
        record_failure(ag, w, &ef, has_ef, oom);
        ag->attempt_failed = 1;
    } else if (wstatus == 0) {
        w->outcome = W_SUCCEEDED; /* even when asked to stop: it finished cleanly */
    } else if (w->stop_sent || (w->exiting_at_stop && !crashed(ag, w))) {
        /* (one that was exiting when the others were stopped counts as
         * stopped too, unless it crashed: a stop that reached it first) */
        w->outcome = W_STOPPED;
    } else {
        char ef_path[PATH_MAX + 16];
        w->outcome = W_FAILED;
        mg_worker_errfile_path(ag, w->local_rank, ef_path, sizeof(ef_path));
        has_ef = !w->exec_errno && mg_errfile_read(ef_path, &ef) == 0;
        /* A SIGKILL nobody here sent: the OOM killer's, when the kernel says so. */
        if (WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
            mg_oom_check(&w->oom, (int)w->pid, NULL, oom, sizeof(oom));
        record_failure(ag, w, &ef, has_ef, oom);
        ag->attempt_failed = 1;
        if (w->exec_errno)
            ag->attempt_fatal = 1;
        else if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == MG_EXIT_NO_RETRY &&
                 !ag->attempt_fatal)
            ag->attempt_fatal = 2;
    }

    struct mg_ev_worker_exit e = {
        .w = {ag->attempt, w->local_rank, w->rank, w->pid},
        .outcome = w->outcome == W_SUCCEEDED ? "succeeded"
                   : w->outcome == W_FAILED  ? "failed"
                                             : "stopped",
        .exit_code = mg_status_code(wstatus),
        .signal = WIFSIGNALED(wstatus) ? mg_signame(WTERMSIG(wstatus), sig, sizeof(sig)) : NULL,
        .exec_error = w->exec_errno ? strerror(w->exec_errno) : NULL,
        .duration_ms = w->end_ms - w->start_ms,
        .message = has_ef ? ef.message : NULL,
        .oom = oom[0] ? oom : NULL,
    };
    mg_event_worker_exit(&ag->rd, &e);

    if (w->outcome == W_FAILED && !ag->stopping) {
        describe_exit(w, oom, how, sizeof(how));
        mg_agent_note(ag, "local rank %d (rank %d, pid %d) %s; stopping the other workers",
                      w->local_rank, w->rank, (int)w->pid, how);
        mg_workers_stop(ag, SIGTERM);
    }
    if (ag->running == 0)
        ag->drain_deadline = mg_now_ms() + DRAIN_MS;
}

static void start_sentinel_again(struct mg_agent *ag)
{
    mg_sentinel_stop(&ag->sent);
    ag->sent.pid = -1;
    if (++ag->sentinel_restarts > MAX_SENTINEL_RESTARTS || mg_sentinel_start(&ag->sent) < 0) {
        mg_agent_note(ag,
                      "warning: the sentinel process died; worker children may outlive a killed "
                      "mglaunch");
        return;
    }
    for (int i = 0; i < ag->nproc; i++)
        if (ag->w[i].outcome == W_RUNNING)
            mg_sentinel_add(&ag->sent, ag->w[i].pid);
}

static void reaped(struct mg_agent *ag, pid_t pid, int st)
{
    if (pid == ag->sent.pid) {
        start_sentinel_again(ag);
        return;
    }
    for (int i = 0; i < ag->nproc; i++)
        if (ag->w[i].outcome == W_RUNNING && ag->w[i].pid == pid) {
            worker_exited(ag, &ag->w[i], st);
            return;
        }
}

void mg_workers_reap(struct mg_agent *ag)
{
    /* Every child that has exited is collected before any is acted on, and
     * the ones a signal ended go first: a SIGKILLed rank and the rank whose
     * collective then failed are usually both waiting here, and waitpid
     * returns them in the order they were started, so the first failure
     * named (and the console's "stopping the other workers" line) would
     * otherwise be the survivor's exit code instead of the cause. */
    enum {
        BATCH = 64
    };
    struct {
        pid_t pid;
        int st;
    } got[BATCH];
    int n;
    do {
        n = 0;
        pid_t pid;
        int st;
        while (n < BATCH && (pid = waitpid(-1, &st, WNOHANG)) > 0) {
            got[n].pid = pid;
            got[n++].st = st;
        }
        for (int pass = 0; pass < 2; pass++)
            for (int k = 0; k < n; k++)
                if (!!WIFSIGNALED(got[k].st) == !pass)
                    reaped(ag, got[k].pid, got[k].st);
    } while (n == BATCH);
}
/* ---- the end of an attempt -------------------------------------------------------------- */

/* The module a Python traceback says it could not import, from the last
 * "No module named 'x'" in text; 0 when there is none. */
static int missing_module(const char *text, size_t len, char *name, size_t cap)
{
    const char *key = "No module named '", *p = NULL;
    for (const char *s = text; (s = memmem(s, len - (size_t)(s - text), key, strlen(key)));
         s += strlen(key))
        p = s + strlen(key);
    if (!p)
        return 0;
    size_t n = 0;
    while (p + n < text + len && p[n] != '\'' && p[n] != '\n')
        n++;
    if (n == 0 || n >= cap || p + n >= text + len)
        return 0;
    memcpy(name, p, n);
    name[n] = '\0';
    return 1;
}

/* When a Python program could not import a module and no rank said
 * anything else (the ranks still importing are stopped after the first
 * failure, so "every rank" cannot be asked for), the interpreter is the
 * likely culprit: say which one ran and how to pick another. first: the
 * worker of the attempt's first failure. */
static void import_hint(struct mg_agent *ag, const struct worker *first)
{
    char mod[128], other[128];
    if (!ag->cfg.python || ag->res.hint[0] || !first->tail ||
        !missing_module(first->tail, first->tail_len, mod, sizeof(mod)))
        return;
    for (int i = 0; i < ag->nproc; i++) {
        const struct worker *w = &ag->w[i];
        int has = w->tail && missing_module(w->tail, w->tail_len, other, sizeof(other));
        if (w->outcome == W_SUCCEEDED || (w->outcome == W_FAILED && !has) ||
            (has && strcmp(other, mod) != 0))
            return;
    }
    mg_fmt(ag->res.hint, sizeof(ag->res.hint),
           "rank %d could not import '%s' under %s (%s), and no rank reported anything else. If "
           "another Python has it, name that one: PYTHON_EXEC=/path/to/python mglaunch ...",
           first->rank, mod, ag->cfg.python,
           ag->cfg.python_source ? ag->cfg.python_source : "python3, the first one on PATH");
}

void mg_workers_end(struct mg_agent *ag, struct mg_attempt_tally *t)
{
    int first = -1;

    t->nfailed = t->nstopped = 0;
    mg_workers_drain(ag);
    for (int i = 0; i < ag->nproc; i++) {
        struct worker *w = &ag->w[i];
        if (w->outcome == W_FAILED) {
            t->nfailed++;
            if (first < 0 || (w->failure >= 0 && w->failure < ag->w[first].failure))
                first = i;
        } else if (w->outcome == W_STOPPED) {
            t->nstopped++;
        }
    }
    /* A worker that was already exiting when the first failure was seen,
     * killed by a signal no stop explains, is the root cause when that first
     * failure did not crash itself: the crash broke the others' connections,
     * and one of them exited, with an error of its own, before mglaunch saw
     * the crash (docs/cli.md). */
    if (first >= 0 && !crashed(ag, &ag->w[first])) {
        int crash = -1;
        for (int i = 0; i < ag->nproc; i++) {
            const struct worker *w = &ag->w[i];
            if (w->outcome == W_FAILED && w->failure >= 0 && w->exiting_at_stop && crashed(ag, w) &&
                (crash < 0 || w->failure < ag->w[crash].failure))
                crash = i;
        }
        if (crash >= 0)
            first = crash;
    }
    if (first >= 0)
        fill_root_cause(ag, &ag->w[first]);
    if (first >= 0)
        import_hint(ag, &ag->w[first]);
    mg_workers_report_logs(ag);
    t->first_failure = first >= 0 ? ag->w[first].failure : -1;
    for (int i = 0; i < ag->nproc; i++) {
        struct worker *w = &ag->w[i];
        if (w->out.file_fd >= 0)
            close(w->out.file_fd);
        if (w->err.file_fd >= 0)
            close(w->err.file_fd);
        w->out.file_fd = w->err.file_fd = -1;
        free(w->tail);
        w->tail = NULL;
    }
    for (int k = 0; k < 2; k++) {
        if (ag->filt_fd[k] >= 0)
            close(ag->filt_fd[k]);
        ag->filt_fd[k] = -1;
    }
}

void mg_workers_release(struct mg_agent *ag)
{
    for (int k = 0; k < 2; k++)
        if (ag->filt_fd[k] >= 0)
            close(ag->filt_fd[k]);
    for (int i = 0; ag->w && i < ag->nproc; i++) {
        struct worker *w = &ag->w[i];
        if (w->outcome == W_RUNNING)
            kill(-w->pid, SIGKILL);
        if (w->out.fd >= 0)
            close(w->out.fd);
        if (w->err.fd >= 0)
            close(w->err.fd);
        if (w->out.file_fd >= 0)
            close(w->out.file_fd);
        if (w->err.file_fd >= 0)
            close(w->err.file_fd);
        mg_linebuf_release(&w->out.lb);
        mg_linebuf_release(&w->err.lb);
        mg_pty_close(&w->pty[0]);
        mg_pty_close(&w->pty[1]);
        free(w->tail);
        mg_worker_setup_release(w);
    }
    mg_tty_restore(&ag->tty);
}
