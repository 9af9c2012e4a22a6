/* A process's state from /proc (see procstate.h). */
#include "procstate.h"
#include "mg_err.h"
#include "proc.h"

#include <errno.h>
#include <string.h>

int mg_procstate_read(const char *root, int pid, struct mg_procstate *ps)
{
    char path[256], buf[1024];
    const char *r = root && strcmp(root, "/") ? root : "";
    memset(ps, 0, sizeof(*ps));
    mg_fmt(path, sizeof(path), "%s/proc/%d/stat", r, pid);
    if (mg_read_small(path, buf, sizeof(buf)) <= 0)
        return -ESRCH;
    /* "pid (comm) S ...": comm may hold spaces and parentheses */
    const char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ' || !p[2])
        return -ESRCH;
    ps->state = p[2];
    mg_fmt(path, sizeof(path), "%s/proc/%d/wchan", r, pid);
    if (mg_read_small(path, ps->wchan, sizeof(ps->wchan)) > 0) {
        ps->wchan[strcspn(ps->wchan, "\n")] = '\0';
        if (strcmp(ps->wchan, "0") == 0) /* not sleeping, or hidden */
            ps->wchan[0] = '\0';
    } else {
        ps->wchan[0] = '\0';
    }
    return 0;
}

int mg_procstate_stopped(const struct mg_procstate *ps)
{
    return ps->state == 'T' || ps->state == 't';
}

const char *mg_procstate_text(const struct mg_procstate *ps, char *buf, size_t cap)
{
    const char *in = ps->wchan[0] ? ps->wchan : NULL;
    switch (ps->state) {
    case 'R':
        mg_fmt(buf, cap, "running (R: on a CPU, in its own code)");
        break;
    case 'S':
        mg_fmt(buf, cap, "sleeping in the kernel (S%s%s)", in ? ", in " : "", in ? in : "");
        break;
    case 'D':
        mg_fmt(buf, cap, "in uninterruptible sleep in the kernel (D%s%s)", in ? ", in " : "",
               in ? in : "");
        break;
    case 'T':
        mg_fmt(buf, cap, "stopped (T: SIGSTOP, SIGTSTP or a job control stop)");
        break;
    case 't':
        mg_fmt(buf, cap, "stopped by a debugger (t: ptrace)");
        break;
    case 'Z':
        mg_fmt(buf, cap, "exited, not yet reaped (Z)");
        break;
    case 0:
        mg_fmt(buf, cap, "gone");
        break;
    default:
        mg_fmt(buf, cap, "in state %c", ps->state);
        break;
    }
    return buf;
}
