/* `mglaunch logs`' model of a run: what its event log says, and for a run
 * without one (torchrun's, or an mg run whose log is gone) what its attempt
 * directories and error files say; the run's status from it (see
 * logs_internal.h, docs/logs.md). */
#include "errfile.h"
#include "events.h"
#include "logdir.h"
#include "logs_internal.h"
#include "mg_err.h"
#include "proc.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void mg_logs_run_free(struct lrun *r)
{
    for (int i = 0; i < r->na; i++) {
        for (int k = 0; k < r->a[i].nw; k++)
            free(r->a[i].w[k].stderr_tail);
        free(r->a[i].w);
    }
    free(r->a);
    r->a = NULL;
    r->na = r->acap = 0;
}

struct lattempt *mg_logs_find_attempt(struct lrun *r, int attempt, int create)
{
    if (attempt < 0) /* missing, or out of range in the event log */
        return NULL;
    for (int i = 0; i < r->na; i++)
        if (r->a[i].attempt == attempt)
            return &r->a[i];
    if (!create || r->na >= 100000) /* a cap against a corrupt event log */
        return NULL;
    if (r->na == r->acap) {
        int ncap = r->acap ? r->acap * 2 : 8;
        struct lattempt *a = realloc(r->a, (size_t)ncap * sizeof(*a));
        if (!a)
            return NULL;
        r->a = a;
        r->acap = ncap;
    }
    struct lattempt *a = &r->a[r->na++];
    memset(a, 0, sizeof(*a));
    a->attempt = attempt;
    return a;
}

static struct lworker *find_worker(struct lattempt *a, int local_rank, int create)
{
    for (int i = 0; i < a->nw; i++)
        if (a->w[i].local_rank == local_rank)
            return &a->w[i];
    if (!create || a->nw >= 65536)
        return NULL;
    if (a->nw == a->cap) {
        int ncap = a->cap ? a->cap * 2 : 8;
        struct lworker *w = realloc(a->w, (size_t)ncap * sizeof(*w));
        if (!w)
            return NULL;
        a->w = w;
        a->cap = ncap;
    }
    struct lworker *w = &a->w[a->nw++];
    memset(w, 0, sizeof(*w));
    w->local_rank = local_rank;
    w->rank = local_rank;
    return w;
}

/* Copies an event's string (NULL when absent) into a field of the model. */
static void put(char *buf, size_t cap, const char *s)
{
    if (s)
        mg_fmt(buf, cap, "%s", s);
}

static void set_root(struct lroot *y, const struct mg_ev_root_cause *c)
{
    memset(y, 0, sizeof(*y));
    y->attempt = c->attempt;
    y->rank = c->rank;
    y->local_rank = c->local_rank;
    y->pid = c->pid;
    y->exit_code = c->exit_code;
    put(y->signal, sizeof(y->signal), c->signal);
    put(y->message, sizeof(y->message), c->message);
    put(y->host, sizeof(y->host), c->host);
    y->time_ms = c->time_ms;
}

static void apply_worker_exit(struct lrun *r, struct lattempt *a, struct lworker *w,
                              const struct mg_ev_worker_exit *x, int64_t t)
{
    w->exited = 1;
    put(w->outcome, sizeof(w->outcome), x->outcome);
    w->exit_code = x->exit_code;
    put(w->signal, sizeof(w->signal), x->signal);
    put(w->message, sizeof(w->message), x->message);
    put(w->exec_error, sizeof(w->exec_error), x->exec_error);
    put(w->oom, sizeof(w->oom), x->oom);
    w->duration_ms = x->duration_ms;
    if (strcmp(w->outcome, "failed") == 0 && !r->has_first_fail) {
        struct mg_ev_root_cause c = {
            .attempt = a->attempt,
            .rank = w->rank,
            .local_rank = w->local_rank,
            .pid = w->pid,
            .exit_code = w->exit_code,
            .signal = w->signal,
            .host = r->host,
            .time_ms = t,
            .message = w->message,
        };
        set_root(&r->first_fail, &c);
        r->has_first_fail = 1;
    }
}

static void apply_run_end(struct lrun *r, const struct mg_ev_run_end *x)
{
    r->ended = 1;
    put(r->result, sizeof(r->result), x->result);
    r->exit_code = x->exit_code;
    put(r->signal, sizeof(r->signal), x->signal);
    put(r->error, sizeof(r->error), x->error);
    if (x->has_root) {
        set_root(&r->root, &x->root);
        r->has_root = 1;
    }
    memset(&r->remote, 0, sizeof(r->remote));
    if (x->has_remote) {
        const struct mg_ev_remote_cause *m = &x->remote;
        r->remote.set = 1;
        r->remote.rank = m->rank;
        r->remote.local_rank = m->local_rank;
        r->remote.pid = m->pid;
        r->remote.exit_code = m->exit_code;
        r->remote.signo = m->signal ? mg_signum(m->signal) : 0;
        r->remote.signo = r->remote.signo > 0 ? r->remote.signo : 0;
        r->remote.wall_ms = m->time_ms;
        r->remote.first_rank = m->first_rank;
        r->remote.nranks = m->nranks;
        put(r->remote.host, sizeof(r->remote.host), m->host);
        put(r->remote.node, sizeof(r->remote.node), m->node);
        put(r->remote.message, sizeof(r->remote.message), m->message);
    }
}

static void apply_event(struct lrun *r, const struct mg_event *ev)
{
    int64_t t = ev->time_ms;
    struct lattempt *a;
    struct lworker *w;

    switch (ev->kind) {
    case MG_EV_RUN_START: {
        const struct mg_ev_run_start *x = &ev->u.run_start;
        if (!r->invocations++)
            r->start_ms = t;
        r->pid = x->pid;
        r->proc_start = x->proc_start;
        put(r->host, sizeof(r->host), x->host);
        r->nproc = x->nproc;
        r->max_restarts = x->max_restarts;
        r->logs_saved = x->logs_saved;
        mg_logs_set_command(r, x->argv, x->argc);
        r->ended = 0;
        r->has_root = 0;
        r->remote.set = 0;
        r->has_first_fail = 0;
        r->error[0] = r->signal[0] = '\0';
        break;
    }
    case MG_EV_ATTEMPT_START:
        if (!(a = mg_logs_find_attempt(r, ev->u.attempt_start.attempt, 1)))
            return;
        a->restart_count = ev->u.attempt_start.restart_count;
        a->nproc = ev->u.attempt_start.nproc;
        a->start_ms = t;
        break;
    case MG_EV_WORKER_START:
    case MG_EV_WORKER_EXIT: {
        const struct mg_ev_worker *x =
            ev->kind == MG_EV_WORKER_START ? &ev->u.worker_start : &ev->u.worker_exit.w;
        a = mg_logs_find_attempt(r, x->attempt, 1);
        w = a ? find_worker(a, x->local_rank, 1) : NULL;
        if (!w)
            return;
        w->rank = x->rank >= 0 ? x->rank : w->local_rank;
        w->pid = x->pid;
        if (ev->kind == MG_EV_WORKER_START)
            w->start_ms = t;
        else
            apply_worker_exit(r, a, w, &ev->u.worker_exit, t);
        break;
    }
    case MG_EV_WORKER_LOGS: {
        const struct mg_ev_worker_logs *x = &ev->u.worker_logs;
        a = mg_logs_find_attempt(r, x->w.attempt, 1);
        if (!(w = a ? find_worker(a, x->w.local_rank, 1) : NULL))
            return;
        w->logs_known = 1;
        put(w->out_log, sizeof(w->out_log), x->out);
        put(w->err_log, sizeof(w->err_log), x->err);
        free(w->stderr_tail);
        w->stderr_tail = x->stderr_tail ? strdup(x->stderr_tail) : NULL;
        break;
    }
    case MG_EV_ATTEMPT_END:
        if (!(a = mg_logs_find_attempt(r, ev->u.attempt_end.attempt, 1)))
            return;
        a->ended = 1;
        put(a->result, sizeof(a->result), ev->u.attempt_end.result);
        a->duration_ms = ev->u.attempt_end.duration_ms;
        break;
    case MG_EV_RUN_END:
        apply_run_end(r, &ev->u.run_end);
        break;
    default:
        break;
    }
}

int mg_logs_launcher_alive(const struct lrun *r)
{
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    if (r->pid <= 0 || strcmp(host, r->host) != 0)
        return 0;
    if (kill(r->pid, 0) < 0 && errno != EPERM)
        return 0;
    return mg_proc_start_time(r->pid) == r->proc_start;
}

/* torchrun's run directories are tempfile.mkdtemp(prefix=f"{run_id}_") in
 * --log_dir: the run id, "_", and 8 characters of [a-z0-9_]. */
int mg_logs_torchrun_dir_name(const char *name, char *run_id, size_t cap)
{
    size_t n = strlen(name);
    if (n < 10 || name[n - 9] != '_')
        return 0;
    for (size_t i = n - 8; i < n; i++)
        if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9') ||
              name[i] == '_'))
            return 0;
    mg_fmt(run_id, cap, "%.*s", (int)(n - 9), name);
    return 1;
}

/* Without an event log (a torchrun log directory, or an mg run whose log
 * is gone), the error files are what says who failed: each worker with one
 * failed, and the earliest by its timestamp is the root cause. */
static void read_error_files(struct lrun *r)
{
    int64_t best = INT64_MAX;
    for (int i = 0; i < r->na; i++) {
        struct lattempt *a = &r->a[i];
        char ad[PATH_MAX + 32];
        struct stat ast;
        mg_fmt(ad, sizeof(ad), "%s/attempt_%d", r->dir, a->attempt);
        if (!a->start_ms && stat(ad, &ast) == 0)
            a->start_ms = (int64_t)ast.st_mtime * 1000;
        if (r->torchrun)
            a->restart_count = a->attempt; /* torchrun numbers attempts by restart */
        for (int k = 0; k < a->nw; k++) {
            struct lworker *w = &a->w[k];
            char p[PATH_MAX + 96];
            struct mg_errfile ef;
            struct stat st;
            mg_fmt(p, sizeof(p), "%s/attempt_%d/%d/error.json", r->dir, a->attempt, w->local_rank);
            if (w->exited || mg_errfile_read(p, &ef) < 0)
                continue;
            if (!a->ended) { /* what can be known of the attempt: it failed */
                a->ended = 1;
                mg_fmt(a->result, sizeof(a->result), "failed");
            }
            w->exited = w->from_errfile = 1;
            mg_fmt(w->outcome, sizeof(w->outcome), "failed");
            w->exit_code = ef.error_code;
            if (ef.rank >= 0)
                w->rank = ef.rank;
            mg_fmt(w->message, sizeof(w->message), "%s", ef.message);
            r->errfiles++;
            int64_t t = ef.timestamp > 0    ? ef.timestamp * 1000
                        : stat(p, &st) == 0 ? (int64_t)st.st_mtime * 1000
                                            : 0;
            if (t < best) { /* ties: the lower attempt, then the lower rank, came first */
                struct mg_ev_root_cause c = {
                    .attempt = a->attempt,
                    .rank = w->rank,
                    .local_rank = w->local_rank,
                    .exit_code = ef.error_code,
                    .host = ef.hostname[0] ? ef.hostname : r->host,
                    .time_ms = t,
                    .message = ef.message,
                };
                set_root(&r->first_fail, &c);
                r->first_fail.exit_unknown = 1;
                r->has_first_fail = 1;
                best = t;
            }
        }
    }
}

int mg_logs_load_run(struct lrun *r, const char *base, const char *id)
{
    char path[PATH_MAX + 32];
    struct stat st;

    mg_logs_run_free(r);
    memset(r, 0, sizeof(*r));
    mg_fmt(r->id, sizeof(r->id), "%s", id);
    if ((size_t)mg_fmt(r->dir, sizeof(r->dir), "%s/%s", base, id) >= sizeof(r->dir))
        return -ENAMETOOLONG;
    if (stat(r->dir, &st) < 0)
        return -errno;
    if (!S_ISDIR(st.st_mode))
        return -ENOTDIR;
    r->start_ms = (int64_t)st.st_mtime * 1000;
    mg_fmt(path, sizeof(path), "%s/%s", r->dir, MG_EVENTS_FILE);
    struct mg_event_reader er;
    struct mg_event ev;
    int rc = mg_event_reader_open(&er, path);
    if (rc == -ENOMEM)
        return rc;
    if (rc == 0) {
        r->has_events = 1;
        while (mg_event_read(&er, &ev))
            apply_event(r, &ev);
        mg_event_reader_close(&er);
    }
    /* Attempts the event log does not mention (no event log, or a torn one). */
    DIR *d = opendir(r->dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char *end;
        int v = mg_attempt_number(de->d_name);
        if (v < 0)
            continue;
        struct lattempt *a = mg_logs_find_attempt(r, v, 1);
        if (a && a->nw == 0) {
            char ad[PATH_MAX + 64];
            mg_fmt(ad, sizeof(ad), "%s/%s", r->dir, de->d_name);
            DIR *rd = opendir(ad);
            struct dirent *re;
            while (rd && (re = readdir(rd))) {
                long lr = strtol(re->d_name, &end, 10);
                if (re->d_name[0] >= '0' && re->d_name[0] <= '9' && !*end && lr < 65536)
                    find_worker(a, (int)lr, 1);
            }
            if (rd)
                closedir(rd);
        }
    }
    if (d)
        closedir(d);
    /* attempts in order */
    for (int i = 1; i < r->na; i++)
        for (int j = i; j > 0 && r->a[j - 1].attempt > r->a[j].attempt; j--) {
            struct lattempt t = r->a[j];
            r->a[j] = r->a[j - 1];
            r->a[j - 1] = t;
        }
    for (int i = 0; i < r->na; i++)
        for (int k = 1; k < r->a[i].nw; k++)
            for (int j = k; j > 0 && r->a[i].w[j - 1].local_rank > r->a[i].w[j].local_rank; j--) {
                struct lworker t = r->a[i].w[j];
                r->a[i].w[j] = r->a[i].w[j - 1];
                r->a[i].w[j - 1] = t;
            }
    if (!r->has_events) {
        r->torchrun = mg_logs_torchrun_dir_name(id, r->torchrun_id, sizeof(r->torchrun_id));
        read_error_files(r);
    }

    r->alive = r->has_events && !r->ended && mg_logs_launcher_alive(r);
    return 0;
}

void mg_logs_run_status(const struct lrun *r, char *buf, size_t cap)
{
    if (!r->has_events && r->torchrun)
        mg_fmt(buf, cap, r->errfiles ? "failed (torchrun's log)" : "no error file (torchrun's)");
    else if (!r->has_events && r->errfiles)
        mg_fmt(buf, cap, "failed (no event log)");
    else if (!r->has_events)
        mg_fmt(buf, cap, "unknown (no event log)");
    else if (r->ended && strcmp(r->result, "succeeded") == 0)
        mg_fmt(buf, cap, "succeeded");
    else if (r->ended && r->signal[0])
        mg_fmt(buf, cap, "stopped by %s (exit %d)", r->signal, r->exit_code);
    else if (r->ended)
        mg_fmt(buf, cap, "%s (exit %d)", r->result, r->exit_code);
    else if (r->alive)
        mg_fmt(buf, cap, "running");
    else
        mg_fmt(buf, cap, "launcher died");
}
