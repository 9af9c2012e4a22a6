/* The watchdog's side in the agent (see watch.h). */
#include "watch.h"
#include "agent_internal.h"
#include "mg_err.h"
#include "net.h"
#include "proc.h"
#include "progress_rec.h"
#include "stacks.h"
#include "events.h"
#include "summary.h"
#include "watchdog.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* How often the records are read: a tenth of the floor, within 20-500 ms.
 * A read is a copy of a few KB per rank: nothing a run notices. */
static int64_t interval_ms(const struct mg_watch *wd)
{
    double ms = wd->kind >= 0 ? wd->floor_s * 100.0 : 500;
    if (wd->dump.active) /* waiting for the tracebacks and the stack tools */
        ms = 20;
    if (wd->ft.fd >= 0 && ms > 100) /* torch's server checks every 0.1 s */
        ms = 100;
    return ms < 20 ? 20 : ms > 500 ? 500 : (int64_t)ms;
}

static void check(struct mg_agent *ag, void *ctx);

static void arm(struct mg_agent *ag, struct mg_watch *wd)
{
    if (wd->armed || (wd->kind < 0 && wd->ft.fd < 0))
        return;
    if (mg_agent_add_timer(ag, mg_now_ms() + interval_ms(wd), check, wd) >= 0)
        wd->armed = 1;
}

void mg_watch_setup(struct mg_agent *ag, struct mg_watch *wd, char *warn, size_t cap)
{
    wd->kind = -1;
    wd->py_kind = -1;
    wd->py_dir[0] = '\0';
    wd->floor_s = ag->o->hang_timeout;
    wd->armed = 0;
    warn[0] = '\0';
    if (wd->floor_s <= 0)
        return;
    int k = mg_agent_rankmem_add(ag, "MG_PROGRESS_FD", "progress", MG_PROGRESS_BYTES);
    if (k < 0) {
        mg_fmt(warn, cap, "warning: no progress watchdog (cannot create its records: %s)",
               mg_strerror(k));
        return;
    }
    wd->kind = k;
}

void mg_watch_attempt_start(struct mg_agent *ag, struct mg_watch *wd)
{
    /* The timers of the last attempt's workers went with them. */
    if (wd->ft.fd >= 0)
        mg_filetimer_clear(&wd->ft);
    wd->ft_bad_said = 0;
    for (int i = 0; wd->kind >= 0 && i < ag->nproc; i++) {
        struct mg_rankmem *m = mg_agent_rankmem(ag, wd->kind, i);
        if (m && m->map)
            __atomic_store_n(&((struct mg_progress *)m->map)->magic, 0, __ATOMIC_RELEASE);
    }
    wd->said_remote = 0;
    wd->said_resume = 0;
    mg_ticker_reset(&wd->ticker);
    arm(ag, wd);
}

/* Local rank i's record when its worker of this attempt started it (the
 * agent voids them at the attempt's start), else NULL. */
static const struct mg_progress *record(struct mg_agent *ag, const struct mg_watch *wd, int i)
{
    struct mg_rankmem *m = wd->kind >= 0 ? mg_agent_rankmem(ag, wd->kind, i) : NULL;
    if (!m || !m->map)
        return NULL;
    const struct mg_progress *p = m->map;
    return __atomic_load_n(&p->magic, __ATOMIC_ACQUIRE) == MG_PROGRESS_MAGIC ? p : NULL;
}

void mg_watch_resume_event(struct mg_agent *ag, struct mg_watch *wd)
{
    for (int i = 0; i < ag->nproc && !wd->said_resume; i++) {
        const struct mg_progress *p = record(ag, wd, i);
        if (!p)
            continue;
        unsigned from = __atomic_load_n(&p->resume.from, __ATOMIC_ACQUIRE);
        const char *name = mg_progress_from_name(from);
        if (!name)
            continue;
        char path[MG_PROGRESS_PATH_MAX];
        memcpy(path, p->resume.path, sizeof(path));
        path[sizeof(path) - 1] = '\0';
        struct mg_ev_resume e = {
            .attempt = ag->attempt,
            .rank = ag->w[i].rank,
            .world_size = ag->group.world_size,
            .from = name,
            .step = p->resume.step,
            .epoch = p->resume.epoch,
            .source = from != MG_FROM_MEMORY                   ? NULL
                      : p->resume.src_rank >= 0                ? "rank"
                      : p->resume.src_rank == MG_RESUME_SHARDS ? "shards"
                                                               : "own",
            .source_rank = from == MG_FROM_MEMORY ? p->resume.src_rank : -1,
            .source_world_size = p->resume.src_world,
            .checkpoint = from == MG_FROM_DISK && path[0] ? path : NULL,
        };
        mg_event_resume(&ag->rd, &e);
        wd->said_resume = 1;
    }
}

int64_t mg_watch_lowest_step(struct mg_agent *ag, const struct mg_watch *wd)
{
    int64_t step = -1;
    for (int i = 0; i < ag->nproc; i++) {
        const struct mg_progress *p = record(ag, wd, i);
        int64_t s = p ? __atomic_load_n(&p->step, __ATOMIC_RELAXED) : -1;
        if (s >= 0 && (step < 0 || s < step))
            step = s;
    }
    return step;
}

int mg_watch_ticker_setup(struct mg_agent *ag, struct mg_watch *wd, char *err, size_t cap)
{
    int rc = mg_ticker_init(&wd->ticker, ag->cfg.environ);
    if (rc < 0)
        mg_fmt(err, cap,
               "MG_NODE_PROGRESS_EVERY='%s' is not a number of seconds from 0 (off) to 86400",
               mg_env_get(ag->cfg.environ, "MG_NODE_PROGRESS_EVERY"));
    return rc;
}

/* A line now and then on the nodes other than node rank 0: where this
 * node's ranks are (their lowest step). */
static void tick(struct mg_agent *ag, struct mg_watch *wd)
{
    const struct mg_group *g = &ag->group;
    char who[96], line[256];
    int64_t step = -1;
    if (g->group_world_size <= 1 || g->group_rank <= 0 || wd->ticker.every_ms <= 0)
        return;
    for (int i = 0; i < ag->nproc; i++) {
        struct mg_rankmem *m = mg_agent_rankmem(ag, wd->kind, i);
        if (ag->w[i].outcome != W_RUNNING || !m || !m->map)
            continue;
        const struct mg_progress *p = m->map;
        if (__atomic_load_n(&p->magic, __ATOMIC_ACQUIRE) != MG_PROGRESS_MAGIC)
            return; /* a rank not started yet: the lowest is not known */
        int64_t s = __atomic_load_n(&p->step, __ATOMIC_RELAXED);
        step = step < 0 || s < step ? s : step;
    }
    if (ag->nproc > 1)
        mg_fmt(who, sizeof(who), "ranks %d-%d here (node rank %d of %d)", g->rank_offset,
               g->rank_offset + ag->nproc - 1, g->group_rank, g->group_world_size);
    else
        mg_fmt(who, sizeof(who), "rank %d here (node rank %d of %d)", g->rank_offset, g->group_rank,
               g->group_world_size);
    if (mg_ticker_due(&wd->ticker, step, mg_now_ms(), who, line, sizeof(line)))
        mg_agent_note(ag, "%s", line);
}

void mg_watch_python_setup(struct mg_agent *ag, struct mg_watch *wd, char *warn, size_t cap)
{
    const char *off = mg_env_get(ag->cfg.environ, "MG_PYTHON_TRACEBACKS");
    char *pp = NULL, *spec = NULL;
    int rc;
    warn[0] = '\0';
    if ((off && !strcmp(off, "0")) ||
        !(ag->cfg.python || (ag->cfg.exec_path && mg_pytb_is_python(ag->cfg.exec_path))))
        return;
    if ((rc = mg_pytb_hook_create(mg_env_get(ag->cfg.environ, "TMPDIR"), wd->py_dir,
                                  sizeof(wd->py_dir))) < 0) {
        mg_fmt(warn, cap, "warning: no Python tracebacks (cannot write the hook's directory: %s)",
               mg_strerror(rc));
        return;
    }
    /* the memory first: without the variables, a descriptor nobody uses */
    int k = mg_agent_rankmem_add(ag, MG_PYTB_FD_ENV, "pytraceback", 0);
    rc = k < 0 ? k : mg_pytb_env(wd->py_dir, mg_env_get(ag->cfg.environ, "PYTHONPATH"), &pp, &spec);
    if (rc == 0 && ag->nextra_env + 2 > MG_AGENT_EXTRA_ENV_MAX)
        rc = -ENOSPC;
    if (rc < 0) {
        free(pp);
        free(spec);
        mg_pytb_hook_remove(wd->py_dir);
        wd->py_dir[0] = '\0';
        mg_fmt(warn, cap, "warning: no Python tracebacks (%s)", mg_strerror(rc));
        return;
    }
    mg_agent_env_add(ag, pp);
    mg_agent_env_add(ag, spec);
    wd->py_kind = k;
}

static void check_progress(struct mg_agent *ag, struct mg_watch *wd);
static void ft_expire(struct mg_agent *ag, struct mg_watch *wd);

static void check(struct mg_agent *ag, void *ctx)
{
    struct mg_watch *wd = ctx;
    wd->armed = 0;
    /* Only while an attempt runs and nobody stops it; the next attempt
     * arms it again. */
    if (ag->state != ST_RUNNING || ag->stopping || ag->running == 0) {
        if (wd->dump.active) /* the attempt ended another way meanwhile */
            mg_watch_stacks_step(ag, wd, 1);
        return;
    }
    if (wd->dump.active) {
        if (!mg_watch_stacks_step(ag, wd, 0)) {
            if (mg_agent_add_timer(ag, mg_now_ms() + 20, check, wd) >= 0)
                wd->armed = 1;
            return;
        }
        arm(ag, wd);
        return;
    }
    if (wd->ft.fd >= 0)
        ft_expire(ag, wd);
    if (wd->kind >= 0 && !ag->stopping && !wd->dump.active)
        check_progress(ag, wd);
    if (wd->kind >= 0 && !ag->stopping && !wd->dump.active)
        tick(ag, wd);
    if (!wd->said_resume)
        mg_watch_resume_event(ag, wd);
    arm(ag, wd);
}

static void check_progress(struct mg_agent *ag, struct mg_watch *wd)
{
    struct mg_watch_rank *r = calloc((size_t)ag->nproc, sizeof(*r));
    if (!r)
        return;
    int64_t now = mg_now_us();
    int any = 0;
    for (int i = 0; i < ag->nproc; i++) {
        const struct worker *w = &ag->w[i];
        struct mg_rankmem *m = mg_agent_rankmem(ag, wd->kind, i);
        r[i].local_rank = i;
        r[i].rank = w->rank;
        r[i].pid = (int)w->pid;
        if (w->outcome != W_RUNNING || !m || !m->map)
            continue;
        const struct mg_progress *p = m->map;
        if (__atomic_load_n(&p->magic, __ATOMIC_ACQUIRE) != MG_PROGRESS_MAGIC)
            continue;
        memcpy(&r[i].rec, p, sizeof(r[i].rec));
        /* The worker itself, or a program it started (a wrapper script that
         * runs train without exec): its process group is the worker's. */
        r[i].live = r[i].rec.version == MG_PROGRESS_VERSION && r[i].rec.pid > 0 &&
                    (r[i].rec.pid == (int32_t)w->pid || getpgid(r[i].rec.pid) == w->pid);
        if (r[i].live)
            r[i].pid = r[i].rec.pid;
        if (r[i].live && mg_watch_stale(&r[i], wd->floor_s, now)) {
            mg_procstate_read(NULL, r[i].pid, &r[i].ps);
            any = 1;
        }
    }
    struct mg_hang_verdict v;
    if (any && mg_watch_judge(r, ag->nproc, ag->group.group_world_size > 1, wd->floor_s, now,
                              ag->cfg.hostname, &v)) {
        if (v.remote) {
            if (!wd->said_remote)
                mg_agent_note(ag, "watchdog: %s", v.line);
            wd->said_remote = 1;
        } else {
            mg_agent_note(ag, "watchdog: %s", v.line);
            int *pids = calloc((size_t)ag->nproc, sizeof(*pids));
            for (int i = 0; pids && i < ag->nproc; i++)
                pids[i] = r[i].pid;
            /* killed with its process group */
            mg_watch_stacks_begin(ag, wd, v.culprit, pids, SIGKILL, (int)ag->w[v.culprit].pid,
                                  "hung", "was hung", v.why);
            free(pids);
        }
    }
    free(r);
}

/* ---- torch's file timer ------------------------------------------------------------ */

#define FT_BAD_SAID_MAX 5

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

struct bad_ctx {
    struct mg_agent *ag;
    struct mg_watch *wd;
};

static void ft_bad(void *ctx, const char *why, const char *line)
{
    struct bad_ctx *b = ctx;
    if (b->wd->ft_bad_said < FT_BAD_SAID_MAX)
        mg_agent_note(b->ag, "file timer: ignored a request (%s): %.200s", why, line);
    else if (b->wd->ft_bad_said == FT_BAD_SAID_MAX)
        mg_agent_note(b->ag, "file timer: more bad requests ignored, not shown");
    b->wd->ft_bad_said++;
}

static int ft_fill(void *ctx, struct pollfd *fds, int max)
{
    struct mg_watch *wd = ctx;
    if (wd->ft.fd < 0)
        return 0;
    if (max < 1)
        return -ENOSPC;
    fds[0].fd = wd->ft.fd;
    fds[0].events = POLLIN;
    return 1;
}

static struct mg_agent *ft_agent; /* the poller's context is the watch; one agent per process */

static int ft_process(void *ctx, const struct pollfd *fds, int n)
{
    struct mg_watch *wd = ctx;
    if (n < 1 || !(fds[0].revents & (POLLIN | POLLHUP | POLLERR)))
        return 0;
    struct bad_ctx b = {ft_agent, wd};
    int rc = mg_filetimer_read(&wd->ft, wall_s(), ft_bad, &b);
    if (rc < 0)
        mg_agent_note(ft_agent, "file timer: cannot read '%s': %s", wd->ft.path, mg_strerror(rc));
    return 0;
}

/* The local rank whose worker is pid or has pid in its process group, or -1. */
static int worker_of(const struct mg_agent *ag, int pid)
{
    for (int i = 0; i < ag->nproc; i++)
        if (ag->w[i].outcome == W_RUNNING && ag->w[i].pid == pid)
            return i;
    pid_t g = getpgid(pid);
    for (int i = 0; g > 0 && i < ag->nproc; i++)
        if (ag->w[i].outcome == W_RUNNING && ag->w[i].pid == g)
            return i;
    return -1;
}

/* Acts on the timers that expired: the signal each asked for, to its pid
 * (torch's FileTimerServer), and the worker is the attempt's failure. */
static void ft_expire(struct mg_agent *ag, struct mg_watch *wd)
{
    struct mg_filetimer_entry e;
    double now = wall_s();
    char sig[32], why[512];
    while (mg_filetimer_take_expired(&wd->ft, now, &e)) {
        int i = worker_of(ag, e.pid);
        double late = now - e.expires, had = e.expires - e.set_at;
        if (i < 0) {
            mg_agent_note(ag,
                          "file timer: scope '%s' of pid %d expired, and pid %d is no worker of "
                          "this run (or has exited): ignored",
                          e.scope, e.pid, e.pid);
            continue;
        }
        const struct worker *w = &ag->w[i];
        if (e.sig <= 0) {
            mg_agent_note(
                ag,
                "file timer: scope '%s' of rank %d (local rank %d, pid %d) expired %.1f s "
                "ago; its request asked for no signal: left running",
                e.scope, w->rank, w->local_rank, e.pid, late);
            continue;
        }
        mg_signame(e.sig, sig, sizeof(sig));
        mg_agent_note(ag,
                      "file timer: scope '%s' of rank %d (local rank %d, host %s, pid %d) expired: "
                      "it was given %.1f s (torch's FileTimerClient); sending %s",
                      e.scope, w->rank, w->local_rank, ag->cfg.hostname, e.pid, had, sig);
        mg_fmt(why, sizeof(why), "file timer expired: scope '%s', given %.1f s; sent %s", e.scope,
               had, sig);
        /* its stacks first, as of a hung rank; the signal after them */
        int *pids = calloc((size_t)ag->nproc, sizeof(*pids));
        if (pids)
            pids[i] = e.pid;
        mg_watch_stacks_begin(ag, wd, i, pids, e.sig, e.pid, "file timer",
                              "overstayed its file timer", why);
        free(pids);
        return; /* one at a time: the others are stopped with this attempt */
    }
}

int mg_watch_filetimer_setup(struct mg_agent *ag, struct mg_watch *wd, char *err, size_t cap)
{
    const char *on = mg_env_get(ag->cfg.environ, "TORCHELASTIC_ENABLE_FILE_TIMER");
    const char *path = mg_env_get(ag->cfg.environ, "TORCHELASTIC_TIMER_FILE");
    wd->ft.fd = -1;
    wd->ft_poller = -1;
    if (!on || strcmp(on, "1") != 0)
        return 0;
    int rc = mg_filetimer_open(&wd->ft, path && *path ? path : NULL,
                               mg_env_get(ag->cfg.environ, "TMPDIR"), err, cap);
    if (rc)
        return rc;
    if (!(path && *path)) { /* the workers learn where it is */
        char *e = NULL;
        rc = asprintf(&e, "TORCHELASTIC_TIMER_FILE=%s", wd->ft.path) < 0 ? -ENOMEM
                                                                         : mg_agent_env_add(ag, e);
        if (rc < 0) {
            mg_fmt(err, cap, "cannot give the workers the timer FIFO's path: %s", mg_strerror(rc));
            mg_filetimer_release(&wd->ft);
            return rc;
        }
    }
    ft_agent = ag;
    struct mg_agent_poller p = {.fill = ft_fill, .process = ft_process, .ctx = wd};
    if ((wd->ft_poller = mg_agent_add_poller(ag, &p)) < 0) {
        rc = wd->ft_poller;
        mg_fmt(err, cap, "cannot watch the timer FIFO: %s", mg_strerror(rc));
        mg_filetimer_release(&wd->ft);
        return rc;
    }
    return 0;
}

void mg_watch_release(struct mg_agent *ag, struct mg_watch *wd)
{
    if (wd->dump.active && wd->dump.child)
        mg_watch_stacks_step(ag, wd, 1);
    free(wd->dump.child);
    free(wd->dump.pids);
    free(wd->dump.py);
    wd->dump.child = NULL;
    wd->dump.pids = NULL;
    wd->dump.py = NULL;
    if (wd->py_dir[0])
        mg_pytb_hook_remove(wd->py_dir);
    wd->py_dir[0] = '\0';
    if (wd->ft.fd >= 0 || wd->ft.created || wd->ft.dir[0])
        mg_filetimer_release(&wd->ft);
}
