/* The workers of an attempt: preparing and spawning them, reaping them,
 * stopping them, the bookkeeping of their exits and failures, and their
 * output on its way to the log files and the console (see agent_internal.h). */
#include "agent_internal.h"
#include "errfile.h"
#include "events.h"
#include "mg_err.h"
#include "net.h"
#include "proc.h"
#include "spawn.h"
#include "summary.h"
#include "workerenv.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_SENTINEL_RESTARTS 10

/* ---- the console ---------------------------------------------------------------------- */

static void console_flush(struct console *c)
{
    size_t off = 0;
    while (off < c->len && !c->broken) {
        ssize_t n = write(c->fd, c->buf + off, c->len - off);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) { /* someone made our stdout non-blocking */
            struct pollfd p = {.fd = c->fd, .events = POLLOUT};
            poll(&p, 1, 1000);
            continue;
        }
        c->broken = 1; /* EPIPE and friends: stop writing to the console */
    }
    c->len = 0;
}

static void console_put(struct console *c, const char *a, size_t n)
{
    if (c->broken || !c->buf)
        return;
    while (n) {
        if (c->len == CONSOLE_BUF)
            console_flush(c);
        size_t k = CONSOLE_BUF - c->len;
        if (k > n)
            k = n;
        memcpy(c->buf + c->len, a, k);
        c->len += k;
        a += k;
        n -= k;
    }
}

void mg_workers_flush(struct mg_agent *ag)
{
    console_flush(&ag->con[0]);
    console_flush(&ag->con[1]);
}

void mg_agent_note(struct mg_agent *ag, const char *fmt, ...)
{
    va_list ap;
    if (!ag->cfg.status)
        return;
    mg_workers_flush(ag);
    fputs("mglaunch: ", ag->cfg.status);
    va_start(ap, fmt);
    vfprintf(ag->cfg.status, fmt, ap);
    va_end(ap);
    fputc('\n', ag->cfg.status);
    fflush(ag->cfg.status);
}

/* ---- stopping ----------------------------------------------------------------------- */

void mg_workers_signal(struct mg_agent *ag, int sig)
{
    for (int i = 0; i < ag->nproc; i++)
        if (ag->w[i].outcome == W_RUNNING)
            kill(-ag->w[i].pid, sig);
}

void mg_workers_stop(struct mg_agent *ag, int sig)
{
    int64_t grace = (int64_t)(ag->o->shutdown_timeout * 1000.0);
    for (int i = 0; i < ag->nproc; i++) {
        struct worker *w = &ag->w[i];
        if (w->outcome != W_RUNNING)
            continue;
        kill(-w->pid, grace > 0 ? sig : SIGKILL);
        w->stop_sent = 1;
    }
    if (!ag->stopping)
        ag->kill_deadline = mg_now_ms() + grace;
    ag->stopping = 1;
}

void mg_workers_kill(struct mg_agent *ag, const char *why)
{
    int n = 0;
    for (int i = 0; i < ag->nproc; i++)
        if (ag->w[i].outcome == W_RUNNING) {
            kill(-ag->w[i].pid, SIGKILL);
            ag->w[i].stop_sent = 1;
            n++;
        }
    if (n) {
        struct mg_ev_kill e = {.attempt = ag->attempt, .workers = n, .reason = why};
        mg_event_kill(&ag->rd, &e);
    }
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

static void describe_exit(const struct worker *w, char *buf, size_t cap)
{
    char sig[32];
    if (w->exec_errno)
        mg_fmt(buf, cap, "could not be executed (%s), exit code %d", strerror(w->exec_errno),
               mg_status_code(w->wstatus));
    else if (WIFSIGNALED(w->wstatus))
        mg_fmt(buf, cap, "was killed by %s", mg_signame(WTERMSIG(w->wstatus), sig, sizeof(sig)));
    else
        mg_fmt(buf, cap, "exited with code %d", mg_status_code(w->wstatus));
}

static void record_failure(struct mg_agent *ag, struct worker *w, const struct mg_errfile *ef,
                           int has_ef)
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
    if (has_ef)
        mg_fmt(f->message, sizeof(f->message), "%s", ef->message);
    w->failure = r->nfailures++;
}

/* Fills the root cause once the attempt is over and its output drained. */
static void fill_root_cause(struct mg_agent *ag, struct worker *w)
{
    struct mg_root_cause *rc = &ag->res.root;
    if (w->failure != 0)
        return; /* only the very first failure of the run */
    rc->f = ag->res.failures[0];
    mg_fmt(rc->host, sizeof(rc->host), "%s", ag->cfg.hostname);
    worker_dir(ag, w->local_rank, rc->log_path, sizeof(rc->log_path));
    error_file_path(ag, w->local_rank, rc->error_file, sizeof(rc->error_file));
    rc->logs_saved = w->out.file_fd != -2 || w->err.file_fd != -2;
    if (w->exec_errno) {
        mg_fmt(rc->exec_error, sizeof(rc->exec_error), "%s", strerror(w->exec_errno));
        mg_fmt(rc->message, sizeof(rc->message), "cannot execute '%s': %s", ag->cfg.exec_path,
               rc->exec_error);
        rc->error_file[0] = '\0';
    } else {
        mg_root_cause_errfile(rc);
    }
    if (w->tail)
        mg_tail_lines(w->tail, w->tail_len, w->tail_cut, MG_STDERR_TAIL_LINES, rc->stderr_tail,
                      sizeof(rc->stderr_tail));
}

/* ---- worker exit --------------------------------------------------------------------- */

static void worker_exited(struct mg_agent *ag, struct worker *w, int wstatus)
{
    char how[256], sig[32];
    struct mg_errfile ef;
    int has_ef = 0;

    w->wstatus = wstatus;
    w->end_ms = mg_now_ms();
    ag->running--;
    /* Anything the worker left behind in its process group goes with it. */
    kill(-w->pid, SIGKILL);
    if (ag->sent.fd >= 0)
        mg_sentinel_forget(&ag->sent, w->pid);

    if (wstatus == 0) {
        w->outcome = W_SUCCEEDED; /* even when asked to stop: it finished cleanly */
    } else if (w->stop_sent) {
        w->outcome = W_STOPPED;
    } else {
        char ef_path[PATH_MAX + 16];
        w->outcome = W_FAILED;
        error_file_path(ag, w->local_rank, ef_path, sizeof(ef_path));
        has_ef = !w->exec_errno && mg_errfile_read(ef_path, &ef) == 0;
        record_failure(ag, w, &ef, has_ef);
        ag->attempt_failed = 1;
        if (w->exec_errno)
            ag->attempt_fatal = 1;
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
    };
    mg_event_worker_exit(&ag->rd, &e);

    if (w->outcome == W_FAILED && !ag->stopping) {
        describe_exit(w, how, sizeof(how));
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

/* ---- output ------------------------------------------------------------------------- */

struct line_ctx {
    struct mg_agent *ag;
    struct worker *w;
    struct stream *s;
};

static void on_line(void *vctx, const char *text, size_t len, enum mg_line_end end)
{
    struct line_ctx *c = vctx;
    struct console *con = &c->ag->con[c->s->console];
    if (end == MG_LINE_CRLF) {
        /* Ends this stream's '\r' line, unless another stream wrote since: then
         * its line already moved on, and an empty line would only add noise. */
        if (con->last == c->s)
            console_put(con, "\n", 1);
        con->last = NULL;
        return;
    }
    con->last = c->s;
    if (c->s->prefixed)
        console_put(con, c->w->prefix, c->w->prefix_len);
    console_put(con, text, len);
    console_put(con, end == MG_LINE_CR ? "\r" : "\n", 1);
}

static void tail_add(struct worker *w, const char *p, size_t n)
{
    if (!w->tail && !(w->tail = malloc(MG_STDERR_TAIL_BYTES)))
        return;
    if (n >= MG_STDERR_TAIL_BYTES) {
        memcpy(w->tail, p + n - MG_STDERR_TAIL_BYTES, MG_STDERR_TAIL_BYTES);
        w->tail_len = MG_STDERR_TAIL_BYTES;
        w->tail_cut = 1;
        return;
    }
    if (w->tail_len + n > MG_STDERR_TAIL_BYTES) {
        size_t drop = w->tail_len + n - MG_STDERR_TAIL_BYTES;
        memmove(w->tail, w->tail + drop, w->tail_len - drop);
        w->tail_len -= drop;
        w->tail_cut = 1;
    }
    memcpy(w->tail + w->tail_len, p, n);
    w->tail_len += n;
}

static void close_stream(struct mg_agent *ag, struct worker *w, struct stream *s)
{
    if (s->fd < 0)
        return;
    if (s->console != CON_NONE) {
        struct line_ctx c = {ag, w, s};
        mg_linebuf_flush(&s->lb, on_line, &c);
    }
    mg_linebuf_release(&s->lb);
    close(s->fd);
    s->fd = -1;
    ag->open_pipes--;
}

/* Reads one chunk; returns bytes read, 0 at EOF (stream closed), -1 when none ready. */
static ssize_t read_stream(struct mg_agent *ag, struct worker *w, struct stream *s, int is_err)
{
    ssize_t n = read(s->fd, ag->rbuf, READ_CHUNK);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return -1;
    if (n <= 0) {
        close_stream(ag, w, s);
        return 0;
    }
    int wrc = s->file_fd >= 0 ? mg_write_full(s->file_fd, ag->rbuf, (size_t)n, -1) : 0;
    if (wrc < 0) {
        mg_agent_note(ag, "warning: cannot write the log of local rank %d (%s): %s; it stops here",
                      w->local_rank, is_err ? "stderr" : "stdout", strerror(-wrc));
        close(s->file_fd);
        s->file_fd = -1;
    }
    if (is_err)
        tail_add(w, ag->rbuf, (size_t)n);
    if (s->console != CON_NONE) {
        struct line_ctx c = {ag, w, s};
        mg_linebuf_feed(&s->lb, ag->rbuf, (size_t)n, on_line, &c);
    }
    return n;
}

/* ---- attempts ------------------------------------------------------------------------ */

static int open_log(const char *dir, const char *name)
{
    char path[PATH_MAX + 32];
    mg_fmt(path, sizeof(path), "%s/%s", dir, name);
    return open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
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

    worker_dir(ag, i, dir, sizeof(dir));
    error_file_path(ag, i, ef, sizeof(ef));
    struct mg_worker_env we = {
        .local_rank = i,
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
        .cuda_visible_devices = ag->cvd[0] ? ag->cvd : NULL,
        .store_token = g->store_token,
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
}

void mg_workers_prepare(struct mg_agent *ag)
{
    for (int i = 0; i < ag->nproc; i++) {
        struct worker *w = &ag->w[i];
        memset(w, 0, sizeof(*w));
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

/* Starts one prepared worker with its stdout and stderr on pipes to us.
 * Returns 0 or a negative code (recorded with mg_agent_error). */
static int spawn_worker(struct mg_agent *ag, struct worker *w)
{
    int out[2], err[2];
    struct mg_spawned sp;

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
    w->outcome = W_RUNNING;
    w->start_ms = mg_now_ms();
    w->out.fd = out[0];
    w->err.fd = err[0];
    fcntl(w->out.fd, F_SETFL, O_NONBLOCK);
    fcntl(w->err.fd, F_SETFL, O_NONBLOCK);
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

void mg_workers_end(struct mg_agent *ag, struct mg_attempt_tally *t)
{
    int first = -1;

    t->nfailed = t->nstopped = 0;
    /* Whatever is still in the pipes (their writers are dead or escaped). */
    for (int i = 0; i < ag->nproc; i++) {
        struct worker *w = &ag->w[i];
        for (int k = 0; k < 64 && w->out.fd >= 0 && read_stream(ag, w, &w->out, 0) > 0; k++)
            ;
        for (int k = 0; k < 64 && w->err.fd >= 0 && read_stream(ag, w, &w->err, 1) > 0; k++)
            ;
        close_stream(ag, w, &w->out);
        close_stream(ag, w, &w->err);
    }
    mg_workers_flush(ag);
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
    if (first >= 0)
        fill_root_cause(ag, &ag->w[first]);
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
}

/* ---- the pipes in the loop -------------------------------------------------------------- */

int mg_workers_fill(void *ctx, struct pollfd *fds, int max)
{
    struct mg_agent *ag = ctx;
    int n = 0;
    if (ag->state != ST_RUNNING)
        return 0;
    if (ag->open_pipes > max)
        return -ENOSPC;
    for (int i = 0; i < ag->nproc; i++) {
        struct worker *w = &ag->w[i];
        if (w->out.fd >= 0) {
            fds[n].fd = w->out.fd;
            fds[n].events = POLLIN;
            ag->pipe_owner[n++] = i * 2;
        }
        if (w->err.fd >= 0) {
            fds[n].fd = w->err.fd;
            fds[n].events = POLLIN;
            ag->pipe_owner[n++] = i * 2 + 1;
        }
    }
    return n;
}

int mg_workers_process(void *ctx, const struct pollfd *fds, int n)
{
    struct mg_agent *ag = ctx;
    for (int i = 0; i < n; i++) {
        int own = ag->pipe_owner[i];
        if (!fds[i].revents)
            continue;
        struct worker *w = &ag->w[own / 2];
        struct stream *s = own % 2 ? &w->err : &w->out;
        if (s->fd == fds[i].fd)
            read_stream(ag, w, s, own % 2);
    }
    mg_workers_flush(ag);
    return 0;
}

void mg_workers_release(struct mg_agent *ag)
{
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
        free(w->tail);
        cleanup_worker_setup(w);
    }
}
