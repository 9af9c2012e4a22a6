/* Native stacks with eu-stack or gdb (see stacks.h). */
#include "stacks.h"
#include "mg_err.h"
#include "net.h"
#include "spawn.h"
#include "workerenv.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int mg_stacks_find(const char *path_env, struct mg_stack_tool *t)
{
    memset(t, 0, sizeof(*t));
    if (mg_path_search("eu-stack", path_env, t->path, sizeof(t->path)) == 0)
        return 0;
    if (mg_path_search("gdb", path_env, t->path, sizeof(t->path)) == 0) {
        t->gdb = 1;
        return 0;
    }
    t->path[0] = '\0';
    return -ENOENT;
}

int mg_stacks_start(const struct mg_stack_tool *t, int pid, const char *out, const char *header,
                    char *const *envp, pid_t *child)
{
    char ps[24];
    struct mg_spawned sp;
    int rc;
    mg_fmt(ps, sizeof(ps), "%d", pid);
    char *eu[] = {"eu-stack", "-p", ps, NULL};
    char *gdb[] = {"gdb", "-nx", "-batch", "-p", ps, "-ex", "thread apply all bt", NULL};
    int fd = open(out, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    if (header && mg_write_full(fd, header, strlen(header), -1) < 0) {
        rc = -EIO;
        goto close_fd;
    }
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    struct mg_spawn_req req = {
        .path = t->path,
        .argv = t->gdb ? gdb : eu,
        .envp = envp,
        .stdin_fd = null,
        .stdout_fd = fd,
        .stderr_fd = fd,
        .sentinel_fd = -1,
    };
    rc = mg_spawn(&req, &sp);
    if (null >= 0)
        close(null);
    if (rc == 0 && sp.exec_errno) {
        waitpid(sp.pid, NULL, 0);
        rc = -sp.exec_errno;
    }
    if (rc == 0)
        *child = sp.pid;
close_fd:
    close(fd);
    return rc;
}

int mg_stacks_kernel(int pid, const char *out, const char *header)
{
    char path[64], buf[8192];
    int rc = 0;
    mg_fmt(path, sizeof(path), "/proc/%d/stack", pid);
    int fd = open(out, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    int in = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = in >= 0 ? read(in, buf, sizeof(buf) - 1) : -1;
    if (n < 0) {
        rc = -errno;
        n = snprintf(buf, sizeof(buf), "(cannot read %s: %s)\n", path, strerror(errno));
    }
    if (in >= 0)
        close(in);
    if (mg_write_full(fd, header, strlen(header), -1) < 0 ||
        mg_write_full(fd, buf, (size_t)n, -1) < 0)
        rc = rc ? rc : -EIO;
    close(fd);
    return rc;
}

int mg_stacks_done(pid_t child)
{
    int st;
    pid_t r = waitpid(child, &st, WNOHANG);
    return r == child || (r < 0 && errno == ECHILD);
}

int mg_stacks_check(const char *out, char *why, size_t cap)
{
    char line[1024];
    int refused = 0, frames = 0;
    FILE *f = fopen(out, "r");
    if (!f) {
        mg_fmt(why, cap, "no file");
        return -ENOENT;
    }
    /* line by line: a Python traceback may come first, of any length */
    while (fgets(line, sizeof(line), f)) {
        refused |= strstr(line, "Operation not permitted") || !strncmp(line, "ptrace: ", 8);
        /* eu-stack numbers frames "#0  0x...", gdb "#0  0x... in"; the
         * kernel's stack "[<0>] function+0x..." */
        frames |= !strncmp(line, "#0 ", 3) || !strncmp(line, "[<", 2);
    }
    fclose(f);
    if (refused) {
        mg_fmt(why, cap,
               "ptrace was refused (a container without CAP_SYS_PTRACE, "
               "kernel.yama.ptrace_scope 2 or 3 for a non-root user, or a worker that "
               "changed its own PR_SET_PTRACER)");
        return -EPERM;
    }
    if (!frames) {
        mg_fmt(why, cap, "no frames in what the tool printed");
        return -ENODATA;
    }
    return 0;
}
