/* Out-of-memory kills from the kernel's own records (see oom.h). */
#include "oom.h"
#include "mg_err.h"
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

long long mg_oom_count(const char *text)
{
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, "oom_kill ", 9) == 0)
            return strtoll(p + 9, NULL, 10);
    return -1;
}

static long long read_count(const char *path)
{
    char buf[4096];
    if (mg_read_small(path, buf, sizeof(buf)) <= 0)
        return -1;
    return mg_oom_count(buf);
}

void mg_oom_watch_start(struct mg_oom_watch *w, const char *root, int pid)
{
    char path[512], line[1024];
    const char *r = root && strcmp(root, "/") ? root : "";
    memset(w, 0, sizeof(*w));
    w->base = -1;
    mg_fmt(path, sizeof(path), "%s/proc/%d/cgroup", r, pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    /* "0::/path" (v2) or "N:memory:/path" (v1); v1's memory line wins, as
     * a hybrid machine accounts memory there. */
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
        if (!b)
            continue;
        *b = '\0';
        const char *ctl = a + 1, *cg = b + 1;
        if (strcmp(cg, "/") == 0)
            cg = "";
        if (strcmp(ctl, "memory") == 0) {
            mg_fmt(w->path, sizeof(w->path), "%s/sys/fs/cgroup/memory%s/memory.oom_control", r, cg);
            w->v1 = 1;
            break;
        }
        if (!*ctl && !w->path[0])
            mg_fmt(w->path, sizeof(w->path), "%s/sys/fs/cgroup%s/memory.events", r, cg);
    }
    fclose(f);
    if (w->path[0] && (w->base = read_count(w->path)) < 0)
        w->path[0] = '\0'; /* no memory controller there */
}

int mg_oom_kmsg_line(const char *line, int pid)
{
    char want[48];
    if (!strcasestr(line, "out of memory"))
        return 0;
    mg_fmt(want, sizeof(want), "Killed process %d ", pid);
    return strstr(line, want) != NULL;
}

/* Searches the kernel log for the OOM killer's line about pid. */
static int from_kmsg(const char *dev, int pid, char *why, size_t cap)
{
    char rec[8192];
    int found = 0;
    int fd = open(dev ? dev : "/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return 0;
    for (int i = 0; i < 1000000; i++) { /* one record per read */
        ssize_t n = read(fd, rec, sizeof(rec) - 1);
        if (n < 0 && errno == EPIPE)
            continue; /* records overwritten while reading */
        if (n <= 0)
            break;
        rec[n] = '\0';
        const char *msg = strchr(rec, ';');
        msg = msg ? msg + 1 : rec;
        if (mg_oom_kmsg_line(msg, pid)) {
            char text[200];
            mg_fmt(text, sizeof(text), "%.*s", (int)strcspn(msg, "\n"), msg);
            mg_fmt(why, cap, "kernel log: %s", text);
            found = 1;
        }
    }
    close(fd);
    return found;
}

int mg_oom_check(const struct mg_oom_watch *w, int pid, const char *kmsg, char *why, size_t cap)
{
    if (w->path[0]) {
        long long now = read_count(w->path);
        if (now > w->base && w->base >= 0) {
            mg_fmt(why, cap, "%s: oom_kill %lld -> %lld", w->path, w->base, now);
            return 1;
        }
    }
    return from_kmsg(kmsg, pid, why, cap);
}
