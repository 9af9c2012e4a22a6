/* The watchdog's side in the agent (see watch.h). */
#include "watch.h"
#include "agent_internal.h"
#include "mg_err.h"
#include "net.h"
#include "progress_rec.h"
#include "watchdog.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* How often the records are read: a tenth of the floor, within 20-500 ms.
 * A read is a copy of a few KB per rank: nothing a run notices. */
static int64_t interval_ms(const struct mg_watch *wd)
{
    double ms = wd->floor_s * 100.0;
    return ms < 20 ? 20 : ms > 500 ? 500 : (int64_t)ms;
}

static void check(struct mg_agent *ag, void *ctx);

static void arm(struct mg_agent *ag, struct mg_watch *wd)
{
    if (wd->armed || wd->kind < 0)
        return;
    if (mg_agent_add_timer(ag, mg_now_ms() + interval_ms(wd), check, wd) >= 0)
        wd->armed = 1;
}

void mg_watch_setup(struct mg_agent *ag, struct mg_watch *wd, char *warn, size_t cap)
{
    wd->kind = -1;
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
    if (wd->kind < 0)
        return;
    for (int i = 0; i < ag->nproc; i++) {
        struct mg_rankmem *m = mg_agent_rankmem(ag, wd->kind, i);
        if (m && m->map)
            __atomic_store_n(&((struct mg_progress *)m->map)->magic, 0, __ATOMIC_RELEASE);
    }
    wd->said_remote = 0;
    arm(ag, wd);
}

static void check(struct mg_agent *ag, void *ctx)
{
    struct mg_watch *wd = ctx;
    wd->armed = 0;
    /* Only while an attempt runs and nobody stops it; the next attempt
     * arms it again. */
    if (ag->state != ST_RUNNING || ag->stopping || ag->running == 0)
        return;
    struct mg_watch_rank *r = calloc((size_t)ag->nproc, sizeof(*r));
    if (!r) {
        arm(ag, wd);
        return;
    }
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
        r[i].live = r[i].rec.pid == (int32_t)w->pid && r[i].rec.version == MG_PROGRESS_VERSION;
        if (r[i].live && mg_watch_stale(&r[i], wd->floor_s, now)) {
            mg_procstate_read(NULL, (int)w->pid, &r[i].ps);
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
            mg_workers_hung(ag, v.culprit, v.why);
        }
    }
    free(r);
    arm(ag, wd);
}
