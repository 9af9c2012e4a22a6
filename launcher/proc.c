/* Environment lookups, signal names, exit codes and start times (see proc.h). */
#include "proc.h"
#include "mg_err.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- environments ------------------------------------------------------------------ */

const char *mg_env_get(char *const *env, const char *name)
{
    size_t n = strlen(name);
    for (char *const *e = env; e && *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

const char *mg_env_lookup(char *const *env, const char *name)
{
    return env ? mg_env_get(env, name) : getenv(name);
}

/* ---- processes ---------------------------------------------------------------------- */

ssize_t mg_read_small(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n < 0)
        return -1;
    buf[n] = '\0';
    return n;
}

long long mg_proc_stat_field(int pid, int field)
{
    char path[64], buf[1024];
    mg_fmt(path, sizeof(path), "/proc/%d/stat", pid);
    if (field < 4 || mg_read_small(path, buf, sizeof(buf)) <= 0)
        return -1;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    /* fields after the name start at 3 (the state) */
    int at = 2;
    for (; p && *p && at < field; p++)
        if (*p == ' ')
            at++;
    return p && *p ? strtoll(p, NULL, 10) : -1;
}

int mg_proc_group_alive(int pgid)
{
    /* kill(-pgid, 0) counts zombies, and an orphan's zombie waits for an
     * init that may never reap it (a container's): look at the states. */
    if (kill(-pgid, 0) < 0 && errno == ESRCH)
        return 0;
    DIR *d = opendir("/proc");
    if (!d)
        return 1;
    int alive = 0;
    for (struct dirent *e; !alive && (e = readdir(d));) {
        char path[64], buf[1024];
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        mg_fmt(path, sizeof(path), "/proc/%s/stat", e->d_name);
        if (mg_read_small(path, buf, sizeof(buf)) <= 0)
            continue;
        char *p = strrchr(buf, ')');
        char state;
        int ppid, pgrp;
        if (p && sscanf(p + 1, " %c %d %d", &state, &ppid, &pgrp) == 3 && pgrp == pgid &&
            state != 'Z' && state != 'X')
            alive = 1;
    }
    closedir(d);
    return alive;
}

long long mg_proc_start_time(int pid)
{
    return mg_proc_stat_field(pid, 22);
}

int mg_proc_exiting(int pid)
{
    long long flags = mg_proc_stat_field(pid, 9);
    return flags < 0 ? -1 : (flags & 0x4) != 0; /* PF_EXITING, include/linux/sched.h */
}

/* ---- statuses ---------------------------------------------------------------------- */

const char *mg_signame(int sig, char *buf, size_t cap)
{
    const char *abbr = sig > 0 ? sigabbrev_np(sig) : NULL;
    if (abbr)
        mg_fmt(buf, cap, "SIG%s", abbr);
    else
        mg_fmt(buf, cap, "SIG%d", sig);
    return buf;
}

int mg_signum(const char *name)
{
    if (name[0] >= '0' && name[0] <= '9') {
        char *end;
        long v = strtol(name, &end, 10);
        return *end || v <= 0 || v >= NSIG ? -EINVAL : (int)v;
    }
    if (strncmp(name, "SIG", 3) == 0)
        name += 3;
    for (int s = 1; s < NSIG; s++) {
        const char *abbr = sigabbrev_np(s);
        if (abbr && strcmp(abbr, name) == 0)
            return s;
    }
    return -EINVAL;
}

int mg_status_code(int wstatus)
{
    if (WIFEXITED(wstatus))
        return WEXITSTATUS(wstatus);
    if (WIFSIGNALED(wstatus))
        return 128 + WTERMSIG(wstatus);
    return 1;
}
