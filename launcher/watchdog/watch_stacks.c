/* Stacks of a hung job's ranks before the hung one is signalled (see
 * watch.h): each Python worker's traceback first (faulthandler, pytb.h),
 * then every thread's native frames (eu-stack or gdb as children,
 * stacks.h), into attempt_<n>/<local rank>/stacks.txt. Nothing here
 * blocks the agent's loop: the check timer calls mg_watch_stacks_step. */
#include "watch.h"
#include "agent_internal.h"
#include "mg_err.h"
#include "net.h"
#include "proc.h"
#include "procstate.h"
#include "stacks.h"
#include "events.h"
#include "summary.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Python tracebacks: sent to every running Python rank at once. 1 when at
 * least one is awaited. */
static int start_python(struct mg_agent *ag, struct mg_watch *wd)
{
    int64_t now = mg_now_ms();
    int any = 0;
    for (int i = 0; i < ag->nproc; i++) {
        struct mg_pytb_take *t = &wd->dump.py[i];
        struct mg_rankmem *m = mg_agent_rankmem(ag, wd->py_kind, i);
        memset(t, 0, sizeof(*t));
        t->done = 1;
        if (ag->w[i].outcome != W_RUNNING || !m || m->fd < 0)
            continue;
        if (mg_pytb_start(t, wd->dump.pids[i], m->fd, MG_PYTB_SIGNAL, now) == 0)
            any = 1;
    }
    return any;
}

/* The file's header: who, when, by what; the Python traceback when there
 * is one, or why there is none. malloc'd. */
static char *header(struct mg_agent *ag, struct mg_watch *wd, int i, const char *ts,
                    const struct mg_stack_tool *tool, const struct mg_procstate *ps)
{
    const struct worker *w = &ag->w[i];
    const struct mg_pytb_take *t = &wd->dump.py[i];
    char *py = wd->py_kind >= 0 ? mg_pytb_text(t) : NULL, *out = NULL;
    char by[64], pyline[400] = "";
    if (ps->state == 'D')
        mg_fmt(by, sizeof(by), "from /proc/%d/stack", wd->dump.pids[i]);
    else
        mg_fmt(by, sizeof(by), "%s",
               !tool->path[0] ? "no native stacks: no tool"
               : tool->gdb    ? "by gdb -batch"
                              : "by eu-stack");
    if (!py && t->rc < 0 && t->why[0])
        mg_fmt(pyline, sizeof(pyline), "# no Python traceback: %s\n", t->why);
    if (asprintf(&out, "# rank %d (local rank %d, host %s, pid %d)%s at %s, %s\n%s%s%s%s", w->rank,
                 i, ag->cfg.hostname, wd->dump.pids[i], i == wd->dump.culprit ? ", hung," : "", ts,
                 by, pyline, py ? "# Python threads, by faulthandler:\n" : "", py ? py : "",
                 py ? "# native threads:\n" : "") < 0)
        out = NULL;
    free(py);
    return out;
}

/* Writes a file that holds the header alone (no tool, or the kernel's
 * stack follows through mg_stacks_kernel). 0 or a negative errno. */
static int write_head(const char *path, const char *head)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    int rc = mg_write_full(fd, head, strlen(head), -1);
    close(fd);
    return rc < 0 ? rc : 0;
}

static void condemn(struct mg_agent *ag, struct mg_watch *wd)
{
    wd->dump.active = 0;
    mg_workers_condemn(ag, wd->dump.culprit, wd->dump.sig, wd->dump.pid, wd->dump.kind,
                       wd->dump.verdict, wd->dump.why);
}

/* The native stacks, the Python tracebacks in their headers. */
static void start_native(struct mg_agent *ag, struct mg_watch *wd)
{
    struct mg_stack_tool tool;
    char path[PATH_MAX + 32], ts[64];
    int started = 0, have_tool = mg_stacks_find(mg_env_get(ag->cfg.environ, "PATH"), &tool) == 0;
    if (!have_tool)
        mg_agent_note(ag,
                      "watchdog: no %sstacks taken: neither eu-stack (Debian's elfutils) nor gdb "
                      "is installed",
                      wd->py_kind >= 0 ? "native " : "");
    mg_format_time_ms(mg_wall_ms(), ts, sizeof(ts));
    for (int k = 0; k < ag->nproc; k++) {
        int i = (wd->dump.culprit + k) % ag->nproc, pid = wd->dump.pids[i];
        const struct mg_pytb_take *t = &wd->dump.py[i];
        wd->dump.child[i] = 0;
        if (ag->w[i].outcome != W_RUNNING)
            continue;
        if (wd->py_kind >= 0 && t->rc < 0 && t->why[0])
            mg_agent_note(ag, "watchdog: no Python traceback of local rank %d: %s", i, t->why);
        struct mg_procstate ps;
        mg_procstate_read(NULL, pid, &ps);
        char *head = header(ag, wd, i, ts, &tool, &ps);
        if (!head)
            continue;
        int rc, has_py = strstr(head, "# Python threads") != NULL;
        mg_fmt(path, sizeof(path), "%s/%d/stacks.txt", ag->attempt_dir, i);
        if (ps.state == 'D') {
            /* ptrace cannot stop a process in uninterruptible sleep: the
             * kernel's own record of where it waits instead */
            rc = mg_stacks_kernel(pid, path, head);
            if (rc == 0)
                mg_agent_note(ag,
                              "watchdog: local rank %d is in uninterruptible sleep: its "
                              "kernel stack is in %s",
                              i, path);
            else
                mg_agent_note(ag,
                              "watchdog: local rank %d is in uninterruptible sleep and its "
                              "kernel stack cannot be read (%s)",
                              i, mg_strerror(rc));
        } else if (!have_tool) {
            if (has_py && (rc = write_head(path, head)) == 0)
                mg_agent_note(ag, "watchdog: the Python traceback of local rank %d is in %s", i,
                              path);
        } else if ((rc = mg_stacks_start(&tool, pid, path, head, ag->cfg.environ,
                                         &wd->dump.child[i])) < 0) {
            mg_agent_note(ag, "watchdog: cannot take the stack of local rank %d into %s: %s", i,
                          path, mg_strerror(rc));
        } else {
            started++;
        }
        free(head);
    }
    if (!started) {
        condemn(ag, wd);
        return;
    }
    wd->dump.phase = 2;
    wd->dump.deadline = mg_now_ms() + MG_STACKS_TIMEOUT_MS;
}

void mg_watch_stacks_begin(struct mg_agent *ag, struct mg_watch *wd, int culprit, const int *pids,
                           int sig, int pid, const char *kind, const char *verdict, const char *why)
{
    size_t n = (size_t)ag->nproc;
    if (!wd->dump.child) {
        wd->dump.child = calloc(n, sizeof(*wd->dump.child));
        wd->dump.pids = calloc(n, sizeof(*wd->dump.pids));
        wd->dump.py = calloc(n, sizeof(*wd->dump.py));
    }
    wd->dump.culprit = culprit;
    wd->dump.sig = sig;
    wd->dump.pid = pid;
    wd->dump.kind = kind;
    wd->dump.verdict = verdict;
    mg_fmt(wd->dump.why, sizeof(wd->dump.why), "%s", why);
    if (!wd->dump.child || !wd->dump.pids || !wd->dump.py) {
        mg_agent_note(ag, "watchdog: no stacks taken: out of memory");
        mg_workers_condemn(ag, culprit, sig, pid, kind, verdict, why);
        return;
    }
    for (int i = 0; i < ag->nproc; i++) {
        wd->dump.pids[i] = pids && pids[i] > 0 ? pids[i] : (int)ag->w[i].pid;
        memset(&wd->dump.py[i], 0, sizeof(wd->dump.py[i]));
        wd->dump.py[i].done = 1;
    }
    wd->dump.active = 1;
    if (wd->py_kind >= 0 && start_python(ag, wd)) {
        wd->dump.phase = 1;
        return;
    }
    start_native(ag, wd);
}

int mg_watch_stacks_step(struct mg_agent *ag, struct mg_watch *wd, int give_up)
{
    char path[PATH_MAX + 32], why[200], ranks[256] = "";
    size_t len = 0;
    int64_t now = mg_now_ms();
    if (!wd->dump.active)
        return 1;
    if (wd->dump.phase == 1) {
        int waiting = 0;
        for (int i = 0; i < ag->nproc; i++)
            waiting += !mg_pytb_poll(&wd->dump.py[i], now);
        if (give_up) {
            wd->dump.active = 0;
            return 1;
        }
        if (waiting)
            return 0;
        start_native(ag, wd);
        return !wd->dump.active;
    }
    int late = !give_up && now >= wd->dump.deadline;
    for (int i = 0; i < ag->nproc; i++)
        if (wd->dump.child[i] && !mg_stacks_done(wd->dump.child[i])) {
            if (!give_up && !late)
                return 0;
            kill(-wd->dump.child[i], SIGKILL);
            mg_agent_note(ag, "watchdog: the stack of local rank %d took over %d s: given up", i,
                          MG_STACKS_TIMEOUT_MS / 1000);
            wd->dump.child[i] = 0;
        }
    for (int i = 0; i < ag->nproc; i++) {
        if (!wd->dump.child[i])
            continue;
        wd->dump.child[i] = 0;
        mg_fmt(path, sizeof(path), "%s/%d/stacks.txt", ag->attempt_dir, i);
        if (mg_stacks_check(path, why, sizeof(why)) < 0)
            mg_agent_note(ag, "watchdog: no stack of local rank %d: %s (see %s)", i, why, path);
        else if (len < sizeof(ranks))
            len += (size_t)snprintf(ranks + len, sizeof(ranks) - len, "%s%d", len ? "," : "", i);
    }
    if (ranks[0])
        mg_agent_note(ag, "watchdog: stacks of local rank%s %s in %s/<local rank>/stacks.txt",
                      strchr(ranks, ',') ? "s" : "", ranks, ag->attempt_dir);
    if (give_up)
        wd->dump.active = 0;
    else
        condemn(ag, wd);
    return 1;
}
