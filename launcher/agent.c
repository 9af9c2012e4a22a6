/* The agent's poll loop: rounds, spawning, supervision, signals, restarts,
 * output routing and the event log (see agent.h). */
#include "agent.h"
#include "errfile.h"
#include "events.h"
#include "logdir.h"
#include "mg_config.h"
#include "mg_err.h"
#include "net.h"
#include "output.h"
#include "gpus.h"
#include "proc.h"
#include "sentinel.h"
#include "spawn.h"
#include "summary.h"
#include "workerenv.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define READ_CHUNK            (64 * 1024)
#define CONSOLE_BUF           (64 * 1024)
#define DRAIN_MS              1000 /* how long pipes may stay open after every worker exited */
#define PREFIX_MAX            512
#define MAX_SENTINEL_RESTARTS 10

enum stream_console {
    CON_NONE = -1,
    CON_OUT = 0,
    CON_ERR = 1,
};

struct stream {
    int fd;      /* pipe read end, -1 once closed */
    int file_fd; /* stdout.log / stderr.log, or -1 */
    int console; /* enum stream_console */
    int prefixed;
    struct mg_linebuf lb;
};

enum outcome {
    W_IDLE,
    W_RUNNING,
    W_SUCCEEDED,
    W_FAILED,
    W_STOPPED,
};

struct worker {
    int local_rank, rank;
    pid_t pid;
    enum outcome outcome;
    int stop_sent;
    int wstatus;
    int exec_errno;
    int64_t start_ms, end_ms;
    struct stream out, err;
    char prefix[PREFIX_MAX];
    size_t prefix_len;
    char *tail; /* last MG_STDERR_TAIL_BYTES of stderr */
    size_t tail_len;
    int tail_cut;
    char **envp;
    char **argv; /* only when an argument uses ${local_rank} */
    int failure; /* index into the result's failures, or -1 */
};

struct console {
    int fd;
    char *buf;
    size_t len;
    int broken;
    const void *last; /* the stream that wrote the last piece */
};

struct poller_slot {
    int used;
    struct mg_agent_poller p;
    int first, n; /* its pollfds in this iteration */
};

struct timer_slot {
    int used;
    int64_t deadline;
    mg_agent_timer_fn fn;
    void *ctx;
};

enum state {
    ST_FORMING,
    ST_RUNNING,
    ST_BACKOFF,
    ST_HOLD, /* succeeded; the backend holds the exit (mg_agent_hold_exit) */
    ST_DONE,
};

struct mg_agent {
    struct mg_agent_config cfg;
    const struct mg_launch_opts *o;
    int nproc;
    struct worker *w;
    int sfd;
    sigset_t oldmask;
    struct mg_rundir rd;
    struct console con[2];
    char *rbuf;
    char cvd[MG_GPU_IDS_MAX]; /* CUDA_VISIBLE_DEVICES for --gpu_ids, "" = leave alone */
    struct mg_sentinel sent;
    int sentinel_restarts;

    enum state state;
    int group_ready;
    struct mg_group group;
    int round;
    int restarts_left;
    int attempt;
    char attempt_dir[PATH_MAX];
    int64_t attempt_start_ms;
    int running;    /* started and not yet reaped */
    int open_pipes; /* pipe read ends still open */
    int stopping;
    int64_t kill_deadline, drain_deadline, backoff_deadline;
    int attempt_failed, attempt_fatal;
    int restart_req, hold_req;
    enum mg_restart_kind restart_kind;
    char restart_reason[256];
    int term_sig, nterm;
    int fail_req, fail_code;
    struct mg_backoff backoff;
    int lingering; /* ST_DONE, but the backend still needs the loop (mg_agent_linger) */
    int64_t linger_deadline;

    struct poller_slot pollers[MG_AGENT_MAX_POLLERS];
    struct timer_slot timers[MG_AGENT_MAX_TIMERS];
    struct pollfd *pfd;
    int *pfd_owner; /* worker*2+stream for pipe fds */
    int pfd_cap;
    int poller_room;

    struct mg_agent_result res;
    int attempts_cap;
    long long proc_start; /* /proc/self/stat starttime, to tell a dead launcher */
};

/* ---- small helpers ------------------------------------------------------------------ */

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

static void flush_consoles(struct mg_agent *ag)
{
    console_flush(&ag->con[0]);
    console_flush(&ag->con[1]);
}

__attribute__((format(printf, 2, 3))) static void note(struct mg_agent *ag, const char *fmt, ...)
{
    va_list ap;
    if (!ag->cfg.status)
        return;
    flush_consoles(ag);
    fputs("mglaunch: ", ag->cfg.status);
    va_start(ap, fmt);
    vfprintf(ag->cfg.status, fmt, ap);
    va_end(ap);
    fputc('\n', ag->cfg.status);
    fflush(ag->cfg.status);
}

/* ---- signals ---------------------------------------------------------------------------- */

/* The signals the loop reads from its signalfd. One that was ignored when
 * mglaunch started (nohup, a background job of a script) stays ignored, by
 * mglaunch and, inheriting that, by the workers: it is left out. */
static void handled_signals(sigset_t *set)
{
    static const int wanted[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGTSTP};
    sigemptyset(set);
    sigaddset(set, SIGCHLD);
    sigaddset(set, SIGCONT);
    for (size_t i = 0; i < sizeof(wanted) / sizeof(wanted[0]); i++) {
        struct sigaction old;
        if (sigaction(wanted[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
            continue;
        sigaddset(set, wanted[i]);
    }
}

static void signal_workers(struct mg_agent *ag, int sig)
{
    for (int i = 0; i < ag->nproc; i++)
        if (ag->w[i].outcome == W_RUNNING)
            kill(-ag->w[i].pid, sig);
}

static void begin_stop(struct mg_agent *ag, int sig)
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

static void kill_all(struct mg_agent *ag, const char *why)
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

static void finish(struct mg_agent *ag, int code);

static void on_term_signal(struct mg_agent *ag, int sig)
{
    char name[32];
    struct mg_ev_signal e = {.signal = mg_signame(sig, name, sizeof(name))};
    mg_event_signal(&ag->rd, &e);
    if (++ag->nterm > 1) {
        note(ag, "%s again: killing the workers now", name);
        kill_all(ag, "second signal");
        return;
    }
    ag->term_sig = sig;
    if (ag->state == ST_RUNNING && ag->running > 0) {
        note(ag, "%s: stopping the workers (%g s grace period; send it again to kill them now)",
             name, ag->o->shutdown_timeout);
        if (ag->stopping)
            signal_workers(ag, sig); /* already asked to stop after a failure: pass it on */
        else
            begin_stop(ag, sig);
    } else if (ag->state != ST_RUNNING) {
        finish(ag, 128 + sig);
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
    struct mg_errfile ef;
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
    } else if (mg_errfile_read(rc->error_file, &ef) == 0) {
        mg_fmt(rc->message, sizeof(rc->message), "%s", ef.message);
        mg_fmt(rc->traceback, sizeof(rc->traceback), "%s", ef.traceback);
        if (ef.hostname[0])
            mg_fmt(rc->host, sizeof(rc->host), "%s", ef.hostname);
    } else {
        rc->error_file[0] = '\0';
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
        note(ag, "local rank %d (rank %d, pid %d) %s; stopping the other workers", w->local_rank,
             w->rank, (int)w->pid, how);
        begin_stop(ag, SIGTERM);
    }
    if (ag->running == 0)
        ag->drain_deadline = mg_now_ms() + DRAIN_MS;
}

static void start_sentinel_again(struct mg_agent *ag)
{
    mg_sentinel_stop(&ag->sent);
    ag->sent.pid = -1;
    if (++ag->sentinel_restarts > MAX_SENTINEL_RESTARTS || mg_sentinel_start(&ag->sent) < 0) {
        note(ag, "warning: the sentinel process died; worker children may outlive a killed "
                 "mglaunch");
        return;
    }
    for (int i = 0; i < ag->nproc; i++)
        if (ag->w[i].outcome == W_RUNNING)
            mg_sentinel_add(&ag->sent, ag->w[i].pid);
}

static void reap(struct mg_agent *ag)
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
        note(ag, "warning: cannot write the log of local rank %d (%s): %s; it stops here",
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

static void launcher_error(struct mg_agent *ag, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void launcher_error(struct mg_agent *ag, int err, const char *fmt, ...)
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
        /* the program name and the lead arguments are not user arguments */
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
            launcher_error(ag, -errno, "cannot create %s/%s", dir, file);
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

static void spawn_attempt(struct mg_agent *ag)
{
    const struct mg_launch_opts *o = ag->o;
    const struct mg_group *g = &ag->group;
    int pipes[2][2] = {{-1, -1}, {-1, -1}};
    int rc;

    ag->state = ST_RUNNING;
    ag->stopping = 0;
    ag->attempt_failed = ag->attempt_fatal = 0;
    ag->restart_req = 0;
    ag->running = 0;
    ag->open_pipes = 0;
    ag->attempt_start_ms = mg_now_ms();
    rc = mg_rundir_new_attempt(&ag->rd, ag->nproc, &ag->attempt, ag->attempt_dir,
                               sizeof(ag->attempt_dir));
    if (rc) {
        launcher_error(ag, rc, "cannot create an attempt directory in %s", ag->rd.dir);
        if (g->master_fd >= 0)
            close(g->master_fd);
        finish(ag, 1);
        return;
    }
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
        a->restart_count = o->max_restarts - ag->restarts_left;
        a->first_failure = -1;
    }
    ag->res.rounds = ag->round + 1;

    for (int i = 0; i < ag->nproc; i++) {
        struct worker *w = &ag->w[i];
        memset(w, 0, sizeof(*w));
        w->local_rank = i;
        w->rank = g->rank_offset + i;
        w->out.fd = w->err.fd = -1;
        w->out.file_fd = w->err.file_fd = -2;
        w->out.console = w->err.console = CON_NONE;
        w->failure = -1;
        w->outcome = W_IDLE;
    }
    /* Everything each worker needs, before the first fork. */
    for (int i = 0; i < ag->nproc && !ag->res.error; i++) {
        struct worker *w = &ag->w[i];
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
        };
        if ((rc = mg_env_build(ag->cfg.environ, &we, &w->envp))) {
            launcher_error(ag, rc, "cannot build the environment of local rank %d", i);
            break;
        }
        for (int k = 0; k < ag->cfg.argc; k++)
            if (strchr(ag->cfg.argv[k], '$')) {
                if ((rc = build_argv(ag, w)))
                    launcher_error(ag, rc, "cannot build the arguments of local rank %d", i);
                break;
            }
        struct mg_prefix_vars pv = {o->role, i, w->rank, ag->cfg.hostname};
        int n = mg_prefix_expand(o->prefix_template ? o->prefix_template : MG_PREFIX_DEFAULT, &pv,
                                 w->prefix, sizeof(w->prefix), NULL);
        w->prefix_len = n > 0 ? (size_t)n : 0;
        setup_stream(ag, w, &w->out, MG_STD_OUT, dir, "stdout.log");
        setup_stream(ag, w, &w->err, MG_STD_ERR, dir, "stderr.log");
    }

    struct mg_ev_attempt_start e = {
        .attempt = ag->attempt,
        .restart_count = o->max_restarts - ag->restarts_left,
        .round = ag->round,
        .nproc = ag->nproc,
        .world_size = g->world_size,
        .group_rank = g->group_rank,
        .group_world_size = g->group_world_size,
        .master_addr = g->master_addr,
        .master_port = g->master_port,
        .dir = ag->attempt_dir,
    };
    mg_event_attempt_start(&ag->rd, &e);

    /* The port was held until now so nobody else could take it. */
    if (g->master_fd >= 0) {
        close(g->master_fd);
        ag->group.master_fd = -1;
    }

    for (int i = 0; i < ag->nproc && !ag->res.error; i++) {
        struct worker *w = &ag->w[i];
        struct mg_spawned sp;
        if (pipe2(pipes[0], O_CLOEXEC) < 0 || pipe2(pipes[1], O_CLOEXEC) < 0) {
            launcher_error(ag, -errno, "cannot create pipes for local rank %d", i);
            break;
        }
        struct mg_spawn_req req = {
            .path = ag->cfg.exec_path,
            .argv = w->argv ? w->argv : ag->cfg.argv,
            .envp = w->envp,
            .stdin_fd = ag->cfg.stdin_fd,
            .stdout_fd = pipes[0][1],
            .stderr_fd = pipes[1][1],
            .sentinel_fd = ag->sent.fd,
        };
        rc = mg_spawn(&req, &sp);
        close(pipes[0][1]);
        close(pipes[1][1]);
        if (rc) {
            close(pipes[0][0]);
            close(pipes[1][0]);
            launcher_error(ag, rc, "cannot start local rank %d", i);
            break;
        }
        w->pid = sp.pid;
        w->exec_errno = sp.exec_errno;
        w->outcome = W_RUNNING;
        w->start_ms = mg_now_ms();
        w->out.fd = pipes[0][0];
        w->err.fd = pipes[1][0];
        fcntl(w->out.fd, F_SETFL, O_NONBLOCK);
        fcntl(w->err.fd, F_SETFL, O_NONBLOCK);
        ag->running++;
        ag->open_pipes += 2;
        cleanup_worker_setup(w);
        struct mg_ev_worker ws = {ag->attempt, w->local_rank, w->rank, w->pid};
        mg_event_worker_start(&ag->rd, &ws);
        if (w->exec_errno)
            break; /* the others would fail the same way: it is reaped as a failure */
    }
    for (int i = 0; i < ag->nproc; i++)
        cleanup_worker_setup(&ag->w[i]);
    if (ag->res.error) {
        /* Could not start the whole group: a launcher failure, not a worker's. */
        ag->attempt_fatal = 1;
        begin_stop(ag, SIGTERM);
        ag->fail_req = 1;
        ag->fail_code = 1;
    }
    if (ag->running == 0)
        ag->drain_deadline = mg_now_ms();
}

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
        launcher_error(ag, rc, "rendezvous (%s) failed", ag->cfg.rdzv->name);
        finish(ag, 1);
    }
}

static void finish(struct mg_agent *ag, int code)
{
    struct mg_agent_result *r = &ag->res;
    const struct mg_root_cause *rc = &r->root;
    char sig[32], rsig[32];

    if (ag->state == ST_DONE)
        return;
    ag->state = ST_DONE;
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
    };
    mg_event_run_end(&ag->rd, &e);
    mg_rundir_flush(&ag->rd);
    if (ag->cfg.rdzv->shutdown)
        ag->cfg.rdzv->shutdown(ag->cfg.rdzv_impl, ag, code);
}

static void after_attempt(struct mg_agent *ag, int64_t ran);

static void end_attempt(struct mg_agent *ag)
{
    struct mg_agent_result *r = &ag->res;
    int nfailed = 0, nstopped = 0, first = -1;

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
    flush_consoles(ag);
    for (int i = 0; i < ag->nproc; i++) {
        struct worker *w = &ag->w[i];
        if (w->outcome == W_FAILED) {
            nfailed++;
            if (first < 0 || (w->failure >= 0 && w->failure < ag->w[first].failure))
                first = i;
        } else if (w->outcome == W_STOPPED) {
            nstopped++;
        }
    }
    if (first >= 0)
        fill_root_cause(ag, &ag->w[first]);
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
    int64_t ran = mg_now_ms() - ag->attempt_start_ms;
    if (ag->round < ag->attempts_cap) {
        struct mg_attempt_summary *a = &r->attempts[ag->round];
        a->nfailed = nfailed;
        a->nstopped = nstopped;
        a->first_failure = first >= 0 ? ag->w[first].failure : -1;
        a->duration_ms = ran;
    }
    enum mg_round_result result = ag->attempt_failed           ? MG_ROUND_FAILED
                                  : (ag->stopping || nstopped) ? MG_ROUND_STOPPED
                                                               : MG_ROUND_SUCCEEDED;
    struct mg_ev_attempt_end e = {
        .attempt = ag->attempt,
        .result = result == MG_ROUND_FAILED    ? "failed"
                  : result == MG_ROUND_STOPPED ? "stopped"
                                               : "succeeded",
        .failed = nfailed,
        .stopped = nstopped,
        .duration_ms = ran,
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
        note(ag, "re-forming the group (%s)", ag->restart_reason);
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
    if (ag->attempt_fatal) {
        note(ag, "not restarting: the program could not be started");
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
        note(ag, "restarting the workers in %lld ms (restart %d of %d)", (long long)delay, done,
             o->max_restarts);
    else
        note(ag, "restarting the workers (restart %d of %d)", done, o->max_restarts);
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

/* One state transition if one is due; returns 1 when something happened. */
static int step(struct mg_agent *ag)
{
    int64_t now = mg_now_ms();
    switch (ag->state) {
    case ST_FORMING:
        if (!ag->group_ready)
            return 0;
        ag->group_ready = 0;
        spawn_attempt(ag);
        return 1;
    case ST_RUNNING:
        if (ag->stopping && ag->running > 0 && now >= ag->kill_deadline) {
            note(ag, "grace period over: killing the remaining workers");
            kill_all(ag, "grace period over");
            ag->kill_deadline = INT64_MAX;
            return 1;
        }
        if (ag->running == 0 && (ag->open_pipes == 0 || now >= ag->drain_deadline)) {
            end_attempt(ag);
            return 1;
        }
        return 0;
    case ST_BACKOFF:
        if (now < ag->backoff_deadline)
            return 0;
        start_round(ag);
        return 1;
    case ST_HOLD:
    case ST_DONE:
        return 0;
    }
    return 0;
}

/* ---- the loop ------------------------------------------------------------------------ */

static int next_timeout(struct mg_agent *ag)
{
    int64_t dl = -1;
#define CONSIDER(d)                                                                                \
    do {                                                                                           \
        int64_t d_ = (d);                                                                          \
        if (d_ >= 0 && (dl < 0 || d_ < dl))                                                        \
            dl = d_;                                                                               \
    } while (0)
    if (ag->state == ST_RUNNING) {
        if (ag->stopping && ag->running > 0 && ag->kill_deadline != INT64_MAX)
            CONSIDER(ag->kill_deadline);
        if (ag->running == 0)
            CONSIDER(ag->drain_deadline);
    }
    if (ag->state == ST_BACKOFF)
        CONSIDER(ag->backoff_deadline);
    if (ag->lingering)
        CONSIDER(ag->linger_deadline);
    for (int i = 0; i < MG_AGENT_MAX_TIMERS; i++)
        if (ag->timers[i].used)
            CONSIDER(ag->timers[i].deadline);
    int t = mg_ms_until(dl);
    for (int i = 0; i < MG_AGENT_MAX_POLLERS; i++)
        if (ag->pollers[i].used && ag->pollers[i].p.timeout_ms) {
            int pt = ag->pollers[i].p.timeout_ms(ag->pollers[i].p.ctx);
            if (pt >= 0 && (t < 0 || pt < t))
                t = pt;
        }
#undef CONSIDER
    return t;
}

static int ensure_pfd(struct mg_agent *ag, int need)
{
    if (need <= ag->pfd_cap)
        return 0;
    int cap = ag->pfd_cap ? ag->pfd_cap : 64;
    while (cap < need)
        cap *= 2;
    struct pollfd *p = realloc(ag->pfd, (size_t)cap * sizeof(*p));
    if (!p)
        return -ENOMEM;
    ag->pfd = p;
    int *o = realloc(ag->pfd_owner, (size_t)cap * sizeof(*o));
    if (!o)
        return -ENOMEM;
    ag->pfd_owner = o;
    ag->pfd_cap = cap;
    return 0;
}

static int build_pollfds(struct mg_agent *ag)
{
    int n = 0;
    if (ensure_pfd(ag, 1 + 2 * ag->nproc + ag->poller_room))
        return -ENOMEM;
    ag->pfd[n].fd = ag->sfd;
    ag->pfd[n].events = POLLIN;
    ag->pfd_owner[n++] = -1;
    for (int i = 0; i < ag->nproc; i++) {
        struct worker *w = &ag->w[i];
        if (ag->state != ST_RUNNING)
            break;
        if (w->out.fd >= 0) {
            ag->pfd[n].fd = w->out.fd;
            ag->pfd[n].events = POLLIN;
            ag->pfd_owner[n++] = i * 2;
        }
        if (w->err.fd >= 0) {
            ag->pfd[n].fd = w->err.fd;
            ag->pfd[n].events = POLLIN;
            ag->pfd_owner[n++] = i * 2 + 1;
        }
    }
    for (int k = 0; k < MG_AGENT_MAX_POLLERS; k++) {
        struct poller_slot *ps = &ag->pollers[k];
        if (!ps->used)
            continue;
        for (;;) {
            int room = ag->pfd_cap - n;
            int got = ps->p.fill(ps->p.ctx, ag->pfd + n, room);
            if (got == -ENOSPC) {
                if (ag->poller_room > (1 << 20) || ensure_pfd(ag, ag->pfd_cap * 2))
                    return -ENOMEM;
                ag->poller_room = ag->pfd_cap;
                continue;
            }
            ps->first = n;
            ps->n = got > 0 ? got : 0;
            for (int j = 0; j < ps->n; j++)
                ag->pfd_owner[n + j] = -2;
            n += ps->n;
            break;
        }
    }
    return n;
}

static void handle_signalfd(struct mg_agent *ag)
{
    struct signalfd_siginfo si[16];
    int chld = 0;
    for (;;) {
        ssize_t r = read(ag->sfd, si, sizeof(si));
        if (r <= 0)
            break;
        for (size_t k = 0; k < (size_t)r / sizeof(si[0]); k++) {
            int sig = (int)si[k].ssi_signo;
            switch (sig) {
            case SIGCHLD:
                chld = 1;
                break;
            case SIGINT:
            case SIGTERM:
            case SIGHUP:
            case SIGQUIT:
                if (ag->state == ST_DONE)
                    ag->lingering = 0; /* the run already ended: just stop waiting */
                else
                    on_term_signal(ag, sig);
                break;
            case SIGUSR1:
            case SIGUSR2: {
                char name[32];
                struct mg_ev_signal e = {mg_signame(sig, name, sizeof(name)), 1};
                signal_workers(ag, sig);
                mg_event_signal(&ag->rd, &e);
                break;
            }
            case SIGTSTP: /* Ctrl-Z: the workers are in other process groups */
                signal_workers(ag, SIGSTOP);
                flush_consoles(ag);
                mg_rundir_flush(&ag->rd);
                raise(SIGSTOP);
                break;
            case SIGCONT:
                signal_workers(ag, SIGCONT);
                break;
            }
        }
    }
    if (chld)
        reap(ag);
}

int mg_agent_run(struct mg_agent *ag)
{
    start_round(ag);
    while (ag->state != ST_DONE || ag->lingering) {
        while (step(ag))
            ;
        if (ag->state == ST_DONE && (!ag->lingering || mg_now_ms() >= ag->linger_deadline))
            break;
        mg_rundir_flush(&ag->rd);
        flush_consoles(ag);
        int n = build_pollfds(ag);
        if (n < 0) {
            launcher_error(ag, n, "poll set");
            kill_all(ag, "launcher error");
            finish(ag, 1);
            break;
        }
        int rc = poll(ag->pfd, (nfds_t)n, next_timeout(ag));
        if (rc < 0 && errno != EINTR) {
            launcher_error(ag, -errno, "poll");
            kill_all(ag, "launcher error");
            finish(ag, 1);
            break;
        }
        if (rc > 0) {
            for (int i = 1; i < n; i++) {
                int own = ag->pfd_owner[i];
                if (own < 0 || !ag->pfd[i].revents)
                    continue;
                struct worker *w = &ag->w[own / 2];
                struct stream *s = own % 2 ? &w->err : &w->out;
                if (s->fd == ag->pfd[i].fd)
                    read_stream(ag, w, s, own % 2);
            }
            flush_consoles(ag);
        } else {
            for (int i = 0; i < n; i++)
                ag->pfd[i].revents = 0;
        }
        /* Also after a timeout: a poller may have timers of its own (the
         * store's parked requests and leases). */
        for (int k = 0; k < MG_AGENT_MAX_POLLERS; k++) {
            struct poller_slot *ps = &ag->pollers[k];
            if (ps->used && ps->n)
                ps->p.process(ps->p.ctx, ag->pfd + ps->first, ps->n);
        }
        if (ag->pfd[0].revents)
            handle_signalfd(ag);
        int64_t now = mg_now_ms();
        for (int k = 0; k < MG_AGENT_MAX_TIMERS; k++) {
            struct timer_slot *t = &ag->timers[k];
            if (t->used && now >= t->deadline) {
                t->used = 0;
                t->fn(ag, t->ctx);
            }
        }
    }
    flush_consoles(ag);
    mg_rundir_flush(&ag->rd);
    return ag->res.exit_code;
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
        begin_stop(ag, SIGTERM);
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
        begin_stop(ag, SIGTERM);
    else if (ag->state != ST_RUNNING)
        finish(ag, exit_code);
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
    for (int i = 0; i < MG_AGENT_MAX_POLLERS; i++)
        if (!ag->pollers[i].used) {
            ag->pollers[i].used = 1;
            ag->pollers[i].p = *p;
            ag->pollers[i].n = 0;
            if (ag->poller_room < 64)
                ag->poller_room = 64;
            return i;
        }
    return -ENOSPC;
}

void mg_agent_remove_poller(struct mg_agent *ag, int id)
{
    if (id >= 0 && id < MG_AGENT_MAX_POLLERS) {
        ag->pollers[id].used = 0;
        ag->pollers[id].n = 0;
    }
}

int mg_agent_add_timer(struct mg_agent *ag, int64_t deadline_ms, mg_agent_timer_fn fn, void *ctx)
{
    for (int i = 0; i < MG_AGENT_MAX_TIMERS; i++)
        if (!ag->timers[i].used) {
            ag->timers[i] = (struct timer_slot){1, deadline_ms, fn, ctx};
            return i;
        }
    return -ENOSPC;
}

void mg_agent_cancel_timer(struct mg_agent *ag, int id)
{
    if (id >= 0 && id < MG_AGENT_MAX_TIMERS)
        ag->timers[id].used = 0;
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

/* ---- life cycle ------------------------------------------------------------------------ */

int mg_agent_create(struct mg_agent **out, const struct mg_agent_config *cfg, char *err,
                    size_t errcap)
{
    struct mg_agent *ag;
    sigset_t set;
    int rc;
    struct sigaction dfl = {.sa_handler = SIG_DFL}, ign = {.sa_handler = SIG_IGN};

    *out = NULL;
    ag = calloc(1, sizeof(*ag));
    if (!ag)
        return -ENOMEM;
    ag->cfg = *cfg;
    ag->o = cfg->opts;
    ag->nproc = cfg->opts->nproc;
    ag->restarts_left = cfg->opts->max_restarts;
    ag->sfd = -1;
    ag->rd.events_fd = -1;
    ag->sent.pid = -1;
    ag->sent.fd = -1;
    ag->group.master_fd = -1;
    ag->con[0].fd = cfg->out_fd;
    ag->con[1].fd = cfg->err_fd;
    mg_fmt(ag->res.run_id, sizeof(ag->res.run_id), "%s", cfg->run_id);

    ag->w = calloc((size_t)ag->nproc, sizeof(*ag->w));
    ag->rbuf = malloc(READ_CHUNK);
    ag->con[0].buf = malloc(CONSOLE_BUF);
    ag->con[1].buf = malloc(CONSOLE_BUF);
    if (!ag->w || !ag->rbuf || !ag->con[0].buf || !ag->con[1].buf) {
        rc = -ENOMEM;
        mg_fmt(err, errcap, "out of memory");
        goto fail;
    }
    for (int i = 0; i < ag->nproc; i++)
        ag->w[i].out.fd = ag->w[i].err.fd = -1;

    mg_gpu_visible_devices(ag->o, ag->nproc, ag->cvd, sizeof(ag->cvd));

    /* First, while we hold few descriptors (it closes them all anyway). */
    if (cfg->sentinel && (rc = mg_sentinel_start(&ag->sent))) {
        mg_fmt(err, errcap, "cannot start the sentinel process: %s", mg_strerror(rc));
        goto fail;
    }
    rc = mg_rundir_open(&ag->rd, cfg->log_dir, cfg->run_id);
    if (rc) {
        mg_fmt(err, errcap, "cannot create the log directory '%s/%s': %s", cfg->log_dir,
               cfg->run_id, mg_strerror(rc));
        goto fail;
    }
    mg_fmt(ag->res.run_dir, sizeof(ag->res.run_dir), "%s", ag->rd.dir);

    /* A parent that ignores SIGCHLD would make our children vanish unreaped. */
    sigaction(SIGCHLD, &dfl, NULL);
    sigaction(SIGPIPE, &ign, NULL);
    handled_signals(&set);
    sigprocmask(SIG_BLOCK, &set, &ag->oldmask);
    ag->sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (ag->sfd < 0) {
        rc = -errno;
        mg_fmt(err, errcap, "signalfd: %s", strerror(errno));
        sigprocmask(SIG_SETMASK, &ag->oldmask, NULL);
        goto fail;
    }
    long long started = mg_proc_start_time((int)getpid());
    ag->proc_start = started > 0 ? started : 0; /* 0: unknown, never matches a live check */

    struct mg_ev_run_start e = {
        .run_id = cfg->run_id,
        .host = cfg->hostname,
        .pid = getpid(),
        .proc_start = ag->proc_start,
        .version = MG_VERSION,
        .nproc = ag->nproc,
        .max_restarts = ag->o->max_restarts,
        .role = ag->o->role,
        .rdzv_backend = cfg->rdzv->name,
        .logs_saved = cfg->log_dir_given,
        .argv = cfg->argv,
        .argc = cfg->argc,
    };
    mg_event_run_start(&ag->rd, &e);
    if (mg_rundir_flush(&ag->rd) < 0) {
        rc = ag->rd.ev_err;
        mg_fmt(err, errcap, "cannot write the event log in '%s': %s", ag->rd.dir, mg_strerror(rc));
        goto fail;
    }
    *out = ag;
    return 0;
fail:
    mg_agent_release(ag);
    return rc;
}

const struct mg_agent_result *mg_agent_result(const struct mg_agent *ag)
{
    return &ag->res;
}

void mg_agent_release(struct mg_agent *ag)
{
    if (!ag)
        return;
    if (ag->w) {
        for (int i = 0; i < ag->nproc; i++) {
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
    if (ag->group.master_fd >= 0)
        close(ag->group.master_fd);
    mg_sentinel_stop(&ag->sent); /* it exits on EOF, after killing what is left */
    if (ag->sfd >= 0) {
        close(ag->sfd);
        sigprocmask(SIG_SETMASK, &ag->oldmask, NULL);
    }
    mg_rundir_close(&ag->rd);
    free(ag->w);
    free(ag->rbuf);
    free(ag->con[0].buf);
    free(ag->con[1].buf);
    free(ag->pfd);
    free(ag->pfd_owner);
    free(ag->res.attempts);
    free(ag);
}
