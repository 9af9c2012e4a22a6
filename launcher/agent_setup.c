/* The agent's life cycle: creating it from its configuration (its run
 * directory and event log, the sentinel, the loop, the watchdog), what
 * backends lend the workers (environment entries, memory per rank), and
 * releasing it (see agent.h). What it does between the two is agent.c's. */
#include "agent_internal.h"
#include "events.h"
#include "gpus.h"
#include "mg_config.h"
#include "mg_err.h"
#include "proc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int mg_agent_create(struct mg_agent **out, const struct mg_agent_config *cfg, char *err,
                    size_t errcap)
{
    struct mg_agent *ag;
    int rc;

    *out = NULL;
    ag = calloc(1, sizeof(*ag));
    if (!ag)
        return -ENOMEM;
    ag->cfg = *cfg;
    ag->o = cfg->opts;
    ag->watch.kind = -1;
    ag->watch.ft.fd = -1;
    ag->nproc = cfg->opts->nproc;
    ag->restarts_left = cfg->opts->max_restarts;
    ag->loop.sfd = -1;
    ag->rd.events_fd = -1;
    ag->sent.pid = -1;
    ag->sent.fd = -1;
    ag->res.root_failure = -1;
    ag->group.master_fd = -1;
    ag->filt_fd[0] = ag->filt_fd[1] = -1;
    ag->tty.fd = cfg->on_tty ? 0 : -1;
    ag->con[0].fd = cfg->out_fd;
    ag->con[1].fd = cfg->err_fd;
    mg_fmt(ag->res.run_id, sizeof(ag->res.run_id), "%s", cfg->run_id);

    ag->w = calloc((size_t)ag->nproc, sizeof(*ag->w));
    ag->pipe_owner = calloc((size_t)ag->nproc * 2 + 1, sizeof(*ag->pipe_owner));
    ag->rbuf = malloc(READ_CHUNK);
    ag->con[0].buf = malloc(CONSOLE_BUF);
    ag->con[1].buf = malloc(CONSOLE_BUF);
    if (!ag->w || !ag->pipe_owner || !ag->rbuf || !ag->con[0].buf || !ag->con[1].buf) {
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
    /* Saved logs can fill the disk; the events that say so must still fit
     * (a failed worker's stderr tail in worker_logs, run_end). */
    if (cfg->log_dir_given)
        mg_rundir_reserve(&ag->rd, 64 * 1024);

    if ((rc = mg_agent_loop_init(ag, err, errcap)))
        goto fail;
    char warn[256];
    mg_watch_setup(ag, &ag->watch, warn, sizeof(warn));
    if (warn[0])
        mg_agent_note(ag, "%s", warn);
    mg_watch_python_setup(ag, &ag->watch, warn, sizeof(warn));
    if (warn[0])
        mg_agent_note(ag, "%s", warn);
    if ((rc = mg_watch_filetimer_setup(ag, &ag->watch, err, errcap)) ||
        (rc = mg_watch_ticker_setup(ag, &ag->watch, err, errcap)))
        goto fail;
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

int mg_agent_env_add(struct mg_agent *ag, char *entry)
{
    if (ag->nextra_env >= MG_AGENT_EXTRA_ENV_MAX) {
        free(entry);
        return -ENOSPC;
    }
    ag->extra_env[ag->nextra_env++] = entry;
    return 0;
}

int mg_agent_rankmem_add(struct mg_agent *ag, const char *env, const char *name, size_t size)
{
    char mname[64];
    int rc = 0, k = ag->nrankmem;
    if (k >= MG_AGENT_RANKMEM_MAX)
        return -ENOSPC;
    if (!env || !*env || strchr(env, '=') || strlen(env) >= sizeof(ag->rankmem[k].env) || !name ||
        strlen(name) > 32)
        return -EINVAL;
    struct mg_rankmem *m = calloc((size_t)ag->nproc, sizeof(*m));
    if (!m)
        return -ENOMEM;
    for (int i = 0; i < ag->nproc; i++)
        m[i].fd = -1;
    for (int i = 0; i < ag->nproc && !rc; i++) {
        mg_fmt(mname, sizeof(mname), "mg-%s-%d", name, i);
        rc = mg_rankmem_create(&m[i], mname, size);
    }
    if (rc) {
        for (int i = 0; i < ag->nproc; i++)
            mg_rankmem_release(&m[i]);
        free(m);
        return rc;
    }
    mg_fmt(ag->rankmem[k].env, sizeof(ag->rankmem[k].env), "%s", env);
    ag->rankmem[k].m = m;
    ag->nrankmem++;
    return k;
}

struct mg_rankmem *mg_agent_rankmem(struct mg_agent *ag, int kind, int local_rank)
{
    if (kind < 0 || kind >= ag->nrankmem || local_rank < 0 || local_rank >= ag->nproc)
        return NULL;
    return &ag->rankmem[kind].m[local_rank];
}

const struct mg_agent_result *mg_agent_result(const struct mg_agent *ag)
{
    return &ag->res;
}

void mg_agent_release(struct mg_agent *ag)
{
    if (!ag)
        return;
    mg_workers_release(ag);
    mg_watch_release(ag, &ag->watch);
    if (ag->group.master_fd >= 0)
        close(ag->group.master_fd);
    mg_sentinel_stop(&ag->sent); /* it exits on EOF, after killing what is left */
    mg_loop_release(&ag->loop);
    mg_rundir_close(&ag->rd);
    for (int k = 0; k < ag->nrankmem; k++) {
        for (int i = 0; i < ag->nproc; i++)
            mg_rankmem_release(&ag->rankmem[k].m[i]);
        free(ag->rankmem[k].m);
    }
    for (int k = 0; k < ag->nextra_env; k++)
        free(ag->extra_env[k]);
    free(ag->w);
    free(ag->rbuf);
    free(ag->pipe_owner);
    free(ag->con[0].buf);
    free(ag->con[1].buf);
    free(ag->res.attempts);
    free(ag);
}
