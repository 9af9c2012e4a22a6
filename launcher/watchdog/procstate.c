/* A process's state from /proc (see procstate.h). */
#include "procstate.h"
#include "mg_err.h"
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

int mg_procenv_get(int pid, const char *name, char *out, size_t cap)
{
    /* bounded by the kernel's argument space (a few MiB) */
    enum {
        ENV_MAX = 8 << 20
    };
    char path[64];
    mg_fmt(path, sizeof(path), "/proc/%d/environ", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t room = 1 << 16, n = 0, nlen = strlen(name);
    char *env = malloc(room + 1);
    ssize_t got = 0;
    while (env && (got = read(fd, env + n, room - n)) > 0) {
        n += (size_t)got;
        if (n == room && room < ENV_MAX) {
            char *more = realloc(env, room * 2 + 1);
            if (!more)
                break;
            env = more;
            room *= 2;
        } else if (n == room) {
            break;
        }
    }
    close(fd);
    if (!env)
        return -ENOMEM;
    env[n] = '\0';
    int rc = -ENOENT;
    for (char *p = env; p < env + n; p += strlen(p) + 1)
        if (strncmp(p, name, nlen) == 0 && p[nlen] == '=') {
            size_t len = strlen(p + nlen + 1);
            rc = len < cap ? 0 : -ENAMETOOLONG;
            if (rc == 0)
                memcpy(out, p + nlen + 1, len + 1);
        }
    free(env);
    return rc;
}
