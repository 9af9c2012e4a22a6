/* The workers of an attempt: preparing and spawning them, reaping them,
 * stopping them, and the bookkeeping of their exits and failures (see
 * agent_internal.h). Their output is relay.c's. */
#include "agent_internal.h"
#include "errfile.h"
#include "procstate.h"
#include "events.h"
#include "gpus.h"
#include "mg_err.h"
#include "net.h"
#include "proc.h"
#include "spawn.h"
#include "summary.h"
#include "workerenv.h"

#include <errno.h>
#include <fcntl.h>
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

static void worker_dir(const struct mg_agent *ag, int local_rank, char *buf, size_t cap)
{
    mg_fmt(buf, cap, "%s/%d", ag->attempt_dir, local_rank);
}

/* TORCHELASTIC_ERROR_FILE of a worker: error.json in its directory. */
static void error_file_path(const struct mg_agent *ag, int local_rank, char *buf, size_t cap)
{
    mg_fmt(buf, cap, "%s/%d/error.json", ag->attempt_dir, local_rank);
}

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
    worker_dir(ag, w->local_rank, rc->log_path, sizeof(rc->log_path));
    error_file_path(ag, w->local_rank, rc->error_file, sizeof(rc->error_file));
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
        error_file_path(ag, w->local_rank, ef_path, sizeof(ef_path));
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

void mg_workers_reap(struct mg_agent *ag)
{
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        if (pid == ag->sent.pid) {
            start_sentinel_again(ag);
            continue;
        }
        for (int i = 0; i < ag->nproc; i++)
            if (ag->w[i].outcome == W_RUNNING && ag->w[i].pid == pid) {
                worker_exited(ag, &ag->w[i], st);
                break;
            }
    }
}
/* ---- attempts ------------------------------------------------------------------------ */

static int open_log(const char *dir, const char *name)
{
    char path[PATH_MAX + 32];
    mg_fmt(path, sizeof(path), "%s/%s", dir, name);
    return open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0640);
}

/* Per-worker argv with ${local_rank} substituted (torchrun's macro). */
static int build_argv(struct mg_agent *ag, struct worker *w)
{
    size_t bytes = (size_t)(ag->cfg.argc + 1) * sizeof(char *);
    for (int i = 0; i < ag->cfg.argc; i++)
        bytes += strlen(ag->cfg.argv[i]) + 16 * 2 + 1; /* room for the number, twice */
    char **argv = malloc(bytes);
    if (!argv)
        return -ENOMEM;
    char *s = (char *)(argv + ag->cfg.argc + 1), *end = (char *)argv + bytes;
    for (int i = 0; i < ag->cfg.argc; i++) {
        const char *a = ag->cfg.argv[i];
        if (!strchr(a, '$')) {
            size_t n = strlen(a) + 1;
            memcpy(s, a, n);
        } else if (mg_subst_local_rank(a, w->local_rank, s, (size_t)(end - s)) < 0) {
            free(argv);
            return -E2BIG;
        }
        argv[i] = s;
        s += strlen(s) + 1;
    }
    argv[ag->cfg.argc] = NULL;
    w->argv = argv;
    return 0;
}

static void setup_stream(struct mg_agent *ag, struct worker *w, struct stream *s, int bit,
                         const char *dir, const char *file)
{
    const struct mg_launch_opts *o = ag->o;
    int red = mg_stdmap_get(&o->redirects, w->local_rank) & bit;
    int tee = mg_stdmap_get(&o->tee, w->local_rank) & bit;
    s->fd = -1;
    s->file_fd = -2; /* -2: not saved (not even tried) */
    if (ag->cfg.log_dir_given || red || tee) {
        s->file_fd = open_log(dir, file);
        if (s->file_fd < 0)
            mg_agent_error(ag, -errno, "cannot create %s/%s", dir, file);
    }
    s->console = CON_NONE;
    if ((!red || tee) && mg_opts_rank_shown(o, w->local_rank))
        s->console = bit == MG_STD_OUT ? CON_OUT : CON_ERR;
    s->prefixed = tee || o->prefix_template != NULL;
    s->tee = tee != 0;
    s->pty = 0;
    s->at_line_start = 1;
    mg_linebuf_init(&s->lb, 0);
}

static void cleanup_worker_setup(struct worker *w)
{
    free(w->envp);
    w->envp = NULL;
    free(w->argv);
    w->argv = NULL;
}

/* Everything one worker needs before the first fork: its environment,
 * argv, console prefix and log files. A failure is recorded. */
static void prepare_worker(struct mg_agent *ag, struct worker *w)
{
    const struct mg_launch_opts *o = ag->o;
    const struct mg_group *g = &ag->group;
    int i = w->local_rank, rc;
    char dir[PATH_MAX + 16], ef[PATH_MAX + 32];

    char vdev[MG_GPU_ID_LEN];
    /* MG_*=<fd> of the memories this rank is lent (mg_agent_rankmem_add) */
    char extra_buf[MG_AGENT_RANKMEM_MAX][80];
    char *extra[MG_AGENT_RANKMEM_MAX + MG_AGENT_EXTRA_ENV_MAX + 1] = {NULL};
    int nx = 0;
    for (int k = 0; k < ag->nrankmem; k++) {
        mg_rankmem_env(&ag->rankmem[k].m[i], ag->rankmem[k].env, extra_buf[k],
                       sizeof(extra_buf[k]));
        extra[nx++] = extra_buf[k];
    }
    for (int k = 0; k < ag->nextra_env;
         k++) /* (the agent's own: the file timer's, the Python hook's) */
        extra[nx++] = ag->extra_env[k];
    worker_dir(ag, i, dir, sizeof(dir));
    error_file_path(ag, i, ef, sizeof(ef));
    if (o->virtual_local_rank)
        mg_virtual_device(o, mg_env_get(ag->cfg.environ, "CUDA_VISIBLE_DEVICES"), i, vdev,
                          sizeof(vdev));
    struct mg_worker_env we = {
        .local_rank = o->virtual_local_rank ? 0 : i,
        .rank = w->rank,
        .group_rank = g->group_rank,
        .role_rank = g->role_rank_offset + i,
        .role_name = o->role,
        .local_world_size = ag->nproc,
        .world_size = g->world_size,
        .group_world_size = g->group_world_size,
        .role_world_size = g->role_world_size,
        .master_addr = g->master_addr,
        .master_port = g->master_port,
        .restart_count = o->max_restarts - ag->restarts_left,
        .max_restarts = o->max_restarts,
        .run_id = ag->cfg.run_id,
        .error_file = ef,
        .cuda_visible_devices = o->virtual_local_rank ? vdev
                                : ag->cvd[0]          ? ag->cvd
                                                      : NULL,
        .use_agent_store = g->use_agent_store,
        .agent_store_token = g->agent_store_token,
        .store_token = g->store_token,
        .run_log_dir = ag->rd.dir,
        .attempt = ag->attempt,
        .extra = extra,
    };
    if ((rc = mg_env_build(ag->cfg.environ, &we, &w->envp))) {
        mg_agent_error(ag, rc, "cannot build the environment of local rank %d", i);
        return;
    }
    for (int k = 0; k < ag->cfg.argc; k++)
        if (strchr(ag->cfg.argv[k], '$')) {
            if ((rc = build_argv(ag, w)))
                mg_agent_error(ag, rc, "cannot build the arguments of local rank %d", i);
            break;
        }
    struct mg_prefix_vars pv = {o->role, i, w->rank, ag->cfg.hostname};
    int n = mg_prefix_expand(o->prefix_template ? o->prefix_template : MG_PREFIX_DEFAULT, &pv,
                             w->prefix, sizeof(w->prefix), NULL);
    w->prefix_len = n > 0 ? (size_t)n : 0;
    setup_stream(ag, w, &w->out, MG_STD_OUT, dir, "stdout.log");
    setup_stream(ag, w, &w->err, MG_STD_ERR, dir, "stderr.log");
    /* A terminal for the ranks shown on the console: --local_ranks_filter's,
     * else local rank 0, when its stdout is shown (-r may send it to a file). */
    w->has_pty =
        ag->tty.fd >= 0 && w->out.console != CON_NONE && (o->ranks_filter != NULL || i == 0);
}

void mg_workers_prepare(struct mg_agent *ag)
{
    static const char *const filtered[2] = {"filtered_stdout.log", "filtered_stderr.log"};
    for (int k = 0; k < 2; k++)
        if (ag->o->ndup_filters[k] > 0) {
            ag->filt_fd[k] = open_log(ag->attempt_dir, filtered[k]);
            if (ag->filt_fd[k] < 0)
                mg_agent_error(ag, -errno, "cannot create %s/%s", ag->attempt_dir, filtered[k]);
        }
    for (int i = 0; i < ag->nproc; i++) {
        struct worker *w = &ag->w[i];
        memset(w, 0, sizeof(*w));
        w->pty[0].master = w->pty[0].slave = w->pty[1].master = w->pty[1].slave = -1;
        w->local_rank = i;
        w->rank = ag->group.rank_offset + i;
        w->out.fd = w->err.fd = -1;
        w->out.file_fd = w->err.file_fd = -2;
        w->out.console = w->err.console = CON_NONE;
        w->failure = -1;
        w->outcome = W_IDLE;
    }
    for (int i = 0; i < ag->nproc && !ag->res.error; i++)
        prepare_worker(ag, &ag->w[i]);
}

/* The descriptors of the memories w's rank is lent, into keep; how many. */
static int lent_fds(const struct mg_agent *ag, const struct worker *w, int *keep)
{
    for (int k = 0; k < ag->nrankmem; k++)
        keep[k] = ag->rankmem[k].m[w->local_rank].fd;
    return ag->nrankmem;
}

/* Starts a worker on two pseudo-terminals: stdin+stdout and stderr. */
static int spawn_on_pty(struct mg_agent *ag, struct worker *w)
{
    struct mg_spawned sp;
    int rc, keep[MG_AGENT_RANKMEM_MAX];
    int nkeep = lent_fds(ag, w, keep);
    if ((rc = mg_pty_open(&w->pty[0], ag->tty.fd)) || (rc = mg_pty_open(&w->pty[1], ag->tty.fd))) {
        mg_pty_close(&w->pty[0]);
        mg_agent_error(ag, rc, "cannot open a pseudo-terminal for local rank %d", w->local_rank);
        return rc;
    }
    struct mg_spawn_req req = {
        .path = ag->cfg.exec_path,
        .argv = w->argv ? w->argv : ag->cfg.argv,
        .envp = w->envp,
        .tty_fd = w->pty[0].slave,
        .stdin_fd = -1,
        .stdout_fd = -1,
        .stderr_fd = w->pty[1].slave,
        .sentinel_fd = ag->sent.fd,
        .reset = &ag->reset_set,
        .numa = ag->cfg.numa ? &ag->cfg.numa[w->local_rank] : NULL,
        .keep_fds = keep,
        .nkeep = nkeep,
    };
    rc = mg_spawn(&req, &sp);
    mg_pty_close_slave(&w->pty[0]);
    mg_pty_close_slave(&w->pty[1]);
    if (rc) {
        mg_pty_close(&w->pty[0]);
        mg_pty_close(&w->pty[1]);
        mg_agent_error(ag, rc, "cannot start local rank %d", w->local_rank);
        return rc;
    }
    w->pid = sp.pid;
    w->exec_errno = sp.exec_errno;
    /* The streams own the masters from now on (close_stream closes them). */
    w->out.fd = w->pty[0].master;
    w->err.fd = w->pty[1].master;
    w->pty[0].master = w->pty[1].master = -1;
    w->out.pty = w->err.pty = 1;
    mg_tty_raw(&ag->tty);
    return 0;
}

/* Starts one prepared worker with its stdout and stderr on pipes to us (or
 * on pseudo-terminals: spawn_on_pty). Returns 0 or a negative code
 * (recorded with mg_agent_error). */
static int spawn_worker(struct mg_agent *ag, struct worker *w)
{
    int out[2], err[2], keep[MG_AGENT_RANKMEM_MAX];
    int nkeep = lent_fds(ag, w, keep);
    struct mg_spawned sp;

    if (w->has_pty) {
        int rc = spawn_on_pty(ag, w);
        if (rc)
            return rc;
        goto started;
    }
    if (pipe2(out, O_CLOEXEC) < 0)
        goto no_pipes;
    if (pipe2(err, O_CLOEXEC) < 0) {
        int e = errno;
        close(out[0]);
        close(out[1]);
        errno = e;
        goto no_pipes;
    }
    struct mg_spawn_req req = {
        .path = ag->cfg.exec_path,
        .argv = w->argv ? w->argv : ag->cfg.argv,
        .envp = w->envp,
        .stdin_fd = ag->cfg.stdin_fd,
        .stdout_fd = out[1],
        .stderr_fd = err[1],
        .sentinel_fd = ag->sent.fd,
        .reset = &ag->reset_set,
        .numa = ag->cfg.numa ? &ag->cfg.numa[w->local_rank] : NULL,
        .keep_fds = keep,
        .nkeep = nkeep,
    };
    int rc = mg_spawn(&req, &sp);
    close(out[1]);
    close(err[1]);
    if (rc) {
        close(out[0]);
        close(err[0]);
        mg_agent_error(ag, rc, "cannot start local rank %d", w->local_rank);
        return rc;
    }
    w->pid = sp.pid;
    w->exec_errno = sp.exec_errno;
    w->out.fd = out[0];
    w->err.fd = err[0];
    fcntl(w->out.fd, F_SETFL, O_NONBLOCK);
    fcntl(w->err.fd, F_SETFL, O_NONBLOCK);
started:
    mg_oom_watch_start(&w->oom, NULL, (int)w->pid);
    w->outcome = W_RUNNING;
    w->start_ms = mg_now_ms();
    ag->running++;
    ag->open_pipes += 2;
    struct mg_ev_worker e = {ag->attempt, w->local_rank, w->rank, w->pid};
    mg_event_worker_start(&ag->rd, &e);
    return 0;
no_pipes:
    mg_agent_error(ag, -errno, "cannot create pipes for local rank %d", w->local_rank);
    return -1;
}

void mg_workers_spawn(struct mg_agent *ag)
{
    for (int i = 0; i < ag->nproc && !ag->res.error; i++) {
        struct worker *w = &ag->w[i];
        if (spawn_worker(ag, w))
            break;
        cleanup_worker_setup(w);
        if (w->exec_errno)
            break; /* the others would fail the same way: it is reaped as a failure */
    }
    for (int i = 0; i < ag->nproc; i++)
        cleanup_worker_setup(&ag->w[i]);
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
        cleanup_worker_setup(w);
    }
    mg_tty_restore(&ag->tty);
}
