/* Python tracebacks through faulthandler (see pytb.h). */
#include "pytb.h"
#include "fs.h"
#include "mg_err.h"
#include "net.h"
#include "proc.h"
#include "procstate.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* sitecustomize.py, made into an array by the Makefile */
extern const unsigned char mg_pytb_hook[];
extern const size_t mg_pytb_hook_len;

#define QUIET_MS 40 /* faulthandler writes a thread at a time: done when it stays quiet */

int mg_pytb_hook_create(const char *tmpdir, char *dir, size_t cap)
{
    char path[PATH_MAX + 32];
    mg_fmt(dir, cap, "%s/mglaunch-py-XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    if (!mkdtemp(dir)) {
        int rc = -errno;
        dir[0] = '\0';
        return rc;
    }
    mg_fmt(path, sizeof(path), "%s/sitecustomize.py", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    int rc = fd < 0 ? -errno : mg_write_full(fd, mg_pytb_hook, mg_pytb_hook_len, -1);
    if (fd >= 0)
        close(fd);
    if (rc < 0) {
        mg_pytb_hook_remove(dir);
        return rc;
    }
    return 0;
}

void mg_pytb_hook_remove(const char *dir)
{
    char path[PATH_MAX + 48];
    if (!dir || !dir[0])
        return;
    /* what Python may have left: the module's bytecode cache */
    const char *files[] = {"sitecustomize.py", "__pycache__"};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        mg_fmt(path, sizeof(path), "%s/%s", dir, files[i]);
        if (i == 1) {
            DIR *d = opendir(path);
            struct dirent *e;
            char f[PATH_MAX + 320];
            while (d && (e = readdir(d)))
                if (e->d_name[0] != '.') {
                    mg_fmt(f, sizeof(f), "%s/%s", path, e->d_name);
                    unlink(f);
                }
            if (d)
                closedir(d);
            rmdir(path);
        } else {
            unlink(path);
        }
    }
    rmdir(dir);
}

int mg_pytb_env(const char *dir, const char *user_pythonpath, char **pythonpath, char **spec)
{
    int had = user_pythonpath != NULL;
    int n = had && *user_pythonpath ? asprintf(pythonpath, "PYTHONPATH=%s:%s", dir, user_pythonpath)
                                    : asprintf(pythonpath, "PYTHONPATH=%s", dir);
    if (n < 0) {
        *pythonpath = NULL;
        return -ENOMEM;
    }
    if (asprintf(spec, "%s=%d:%d", MG_PYTB_ENV, MG_PYTB_SIGNAL, had) < 0) {
        free(*pythonpath);
        *pythonpath = *spec = NULL;
        return -ENOMEM;
    }
    return 0;
}

int mg_pytb_is_python(const char *path)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    if (!strncmp(b, "pypy", 4))
        b += 4;
    else if (!strncmp(b, "python", 6))
        b += 6;
    else
        return 0;
    return b[strspn(b, "0123456789.")] == '\0';
}

/* A signal mask from a /proc status line ("SigCgt:\t0000000000004a02"). */
static int mask_has(const char *status, const char *field, int sig)
{
    const char *p = strstr(status, field);
    if (!p)
        return -1;
    uint64_t m = strtoull(p + strlen(field), NULL, 16);
    return (m >> (sig - 1)) & 1;
}

/* Whether every thread of pid blocks sig. */
static int blocked_everywhere(int pid, int sig)
{
    char path[64], st[2048];
    mg_fmt(path, sizeof(path), "/proc/%d/task", pid);
    DIR *d = opendir(path);
    struct dirent *e;
    int threads = 0, blocked = 0;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        mg_fmt(path, sizeof(path), "/proc/%d/task/%.20s/status", pid, e->d_name);
        if (mg_read_small(path, st, sizeof(st)) <= 0)
            continue;
        threads++;
        blocked += mask_has(st, "SigBlk:", sig) == 1;
    }
    if (d)
        closedir(d);
    return threads > 0 && blocked == threads;
}

int mg_pytb_start(struct mg_pytb_take *t, int pid, int fd, int sig, int64_t now_ms)
{
    char path[64], st[4096], sname[48], state[160];
    struct stat sb;
    memset(t, 0, sizeof(*t));
    t->fd = fd;
    t->pid = pid;
    t->done = 1;
    if (sig >= SIGRTMIN && sig <= SIGRTMAX)
        mg_fmt(sname, sizeof(sname), "signal %d (SIGRTMAX-%d)", sig, SIGRTMAX - sig);
    else
        mg_signame(sig, sname, sizeof(sname));
    mg_fmt(path, sizeof(path), "/proc/%d/status", pid);
    struct mg_procstate ps;
    if (mg_read_small(path, st, sizeof(st)) <= 0 || mg_procstate_read(NULL, pid, &ps) < 0) {
        mg_fmt(t->why, sizeof(t->why), "the process is gone");
        return t->rc = -ESRCH;
    }
    if (mask_has(st, "SigCgt:", sig) != 1) {
        /* what the hook wrote when faulthandler would not register */
        char said[200] = "";
        ssize_t n = fd >= 0 ? pread(fd, said, sizeof(said) - 1, 0) : -1;
        if (n > 0 && !strncmp(said, "mglaunch: ", 10)) {
            said[n] = '\0';
            said[strcspn(said, "\n")] = '\0';
            mg_fmt(t->why, sizeof(t->why), "%s", said + 10);
        } else {
            mg_fmt(t->why, sizeof(t->why),
                   "its Python does not catch %s, so faulthandler was not registered (a "
                   "Python run with -I, -E or -S, a wrapper that did not exec Python, a "
                   "program that replaced the handler, or one still starting)",
                   sname);
        }
        return t->rc = -ENOTSUP;
    }
    if (mask_has(st, "SigIgn:", sig) == 1 || blocked_everywhere(pid, sig)) {
        mg_fmt(t->why, sizeof(t->why), "every thread of the worker blocks %s (pthread_sigmask)",
               sname);
        return t->rc = -EAGAIN;
    }
    if (mask_has(st, "ShdPnd:", sig) == 1) {
        mg_fmt(t->why, sizeof(t->why), "an earlier %s is still pending, not handled", sname);
        return t->rc = -EBUSY;
    }
    if (mg_procstate_stopped(&ps) || ps.state == 'D' || ps.state == 'Z') {
        mg_fmt(t->why, sizeof(t->why), "it is %s, so its handler cannot run",
               mg_procstate_text(&ps, state, sizeof(state)));
        return t->rc = -EAGAIN;
    }
    if (fstat(fd, &sb) < 0) {
        t->rc = -errno;
        mg_fmt(t->why, sizeof(t->why), "cannot read its traceback memory: %s", strerror(errno));
        return t->rc;
    }
    t->start = t->size = sb.st_size;
    if (kill(pid, sig) < 0) {
        t->rc = -errno;
        mg_fmt(t->why, sizeof(t->why), "cannot send %s: %s", sname, strerror(errno));
        return t->rc;
    }
    t->since_ms = now_ms;
    t->deadline_ms = now_ms + MG_PYTB_TIMEOUT_MS;
    t->done = 0;
    t->rc = 0;
    return 0;
}

int mg_pytb_poll(struct mg_pytb_take *t, int64_t now_ms)
{
    struct stat sb;
    if (t->done)
        return 1;
    if (fstat(t->fd, &sb) == 0 && sb.st_size != t->size) {
        t->size = sb.st_size;
        t->since_ms = now_ms;
    }
    char last = 0;
    if (t->size > t->start && pread(t->fd, &last, 1, t->size - 1) != 1)
        last = 0;
    if (t->size > t->start && last == '\n' && now_ms - t->since_ms >= QUIET_MS) {
        t->done = 1;
        return 1;
    }
    if (now_ms >= t->deadline_ms) {
        t->done = 1;
        if (t->size > t->start)
            return 1; /* what came, cut short */
        t->rc = -ETIMEDOUT;
        mg_fmt(t->why, sizeof(t->why), "nothing written in %d s after the signal",
               MG_PYTB_TIMEOUT_MS / 1000);
        return 1;
    }
    return 0;
}

char *mg_pytb_text(const struct mg_pytb_take *t)
{
    if (t->rc < 0 || t->size <= t->start)
        return NULL;
    size_t n = (size_t)(t->size - t->start);
    if (n > MG_PYTB_TEXT_MAX)
        n = MG_PYTB_TEXT_MAX;
    char *s = malloc(n + 1);
    ssize_t got = s ? pread(t->fd, s, n, t->start) : -1;
    if (got < 0) {
        free(s);
        return NULL;
    }
    s[got] = '\0';
    return s;
}

int mg_pytb_open(int pid, int *sig, int *fd)
{
    char val[64], path[64];
    int rc = mg_procenv_get(pid, MG_PYTB_ENV, val, sizeof(val));
    if (rc < 0)
        return rc == -ENAMETOOLONG ? -ENOENT : rc;
    *sig = atoi(val);
    if ((rc = mg_procenv_get(pid, MG_PYTB_FD_ENV, val, sizeof(val))) < 0)
        return rc == -ENAMETOOLONG ? -ENOENT : rc;
    mg_fmt(path, sizeof(path), "/proc/%d/fd/%d", pid, atoi(val));
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    return *fd < 0 ? -errno : 0;
}
