/* An attempt's workers before they run: each one's directory, log files,
 * argv and environment, then the fork and exec, on pipes or on the
 * terminal's pseudo-terminals (see agent_internal.h). What becomes of them
 * is workers.c's. */
#include "agent_internal.h"
#include "events.h"
#include "gpus.h"
#include "mg_err.h"
#include "net.h"
#include "proc.h"
#include "spawn.h"
#include "workerenv.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void mg_worker_dir(const struct mg_agent *ag, int local_rank, char *buf, size_t cap)
{
    mg_fmt(buf, cap, "%s/%d", ag->attempt_dir, local_rank);
}

/* TORCHELASTIC_ERROR_FILE of a worker: error.json in its directory. */
void mg_worker_errfile_path(const struct mg_agent *ag, int local_rank, char *buf, size_t cap)
{
    mg_fmt(buf, cap, "%s/%d/error.json", ag->attempt_dir, local_rank);
}

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

void mg_worker_setup_release(struct worker *w)
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
    mg_worker_dir(ag, i, dir, sizeof(dir));
    mg_worker_errfile_path(ag, i, ef, sizeof(ef));
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

/* Starts a worker on two pseudo-terminals: stdin+stdout and stderr. req:
 * all but its standard streams. */
static int spawn_on_pty(struct mg_agent *ag, struct worker *w, struct mg_spawn_req *req)
{
    struct mg_spawned sp;
    int rc;
    if ((rc = mg_pty_open(&w->pty[0], ag->tty.fd)) || (rc = mg_pty_open(&w->pty[1], ag->tty.fd))) {
        mg_pty_close(&w->pty[0]);
        mg_agent_error(ag, rc, "cannot open a pseudo-terminal for local rank %d", w->local_rank);
        return rc;
    }
    req->tty_fd = w->pty[0].slave;
    req->stderr_fd = w->pty[1].slave;
    rc = mg_spawn(req, &sp);
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
    struct mg_spawned sp;
    /* the memories this rank is lent stay open across exec */
    for (int k = 0; k < ag->nrankmem; k++)
        keep[k] = ag->rankmem[k].m[w->local_rank].fd;
    struct mg_spawn_req req = {
        .path = ag->cfg.exec_path,
        .argv = w->argv ? w->argv : ag->cfg.argv,
        .envp = w->envp,
        .stdin_fd = -1,
        .stdout_fd = -1,
        .stderr_fd = -1,
        .sentinel_fd = ag->sent.fd,
        .reset = &ag->reset_set,
        .numa = ag->cfg.numa ? &ag->cfg.numa[w->local_rank] : NULL,
        .keep_fds = keep,
        .nkeep = ag->nrankmem,
        .nofile_soft = mg_nofile_given(),
    };

    if (w->has_pty) {
        int rc = spawn_on_pty(ag, w, &req);
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
    req.stdin_fd = ag->cfg.stdin_fd;
    req.stdout_fd = out[1];
    req.stderr_fd = err[1];
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
        mg_worker_setup_release(w);
        if (w->exec_errno)
            break; /* the others would fail the same way: it is reaped as a failure */
    }
    for (int i = 0; i < ag->nproc; i++)
        mg_worker_setup_release(&ag->w[i]);
}
