/* Worker processes: program lookup, environment, GPU counting, spawning (see proc.h). */
#include "proc.h"
#include "mg_err.h"
#include "output.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- the program ---------------------------------------------------------------- */

static int is_exec_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

int mg_path_search(const char *name, const char *path_env, char *out, size_t cap)
{
    const char *p = path_env && *path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
    size_t nlen = strlen(name);
    while (*p) {
        const char *c = strchr(p, ':');
        size_t dlen = c ? (size_t)(c - p) : strlen(p);
        if (dlen == 0) { /* an empty PATH entry means the current directory */
            if (nlen + 3 <= cap) {
                mg_fmt(out, cap, "./%s", name);
                if (is_exec_file(out))
                    return 0;
            }
        } else if (dlen + 1 + nlen < cap) {
            memcpy(out, p, dlen);
            out[dlen] = '/';
            memcpy(out + dlen + 1, name, nlen + 1);
            if (is_exec_file(out))
                return 0;
        }
        p += dlen + (c ? 1 : 0);
    }
    out[0] = '\0';
    return -ENOENT;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* A name with a '/' is used as is; otherwise PATH, then next to mglaunch.
 * -ENOENT when nothing by that name exists: a usage error the launcher reports
 * before starting anyone. Something that exists but cannot be executed is left
 * for exec to report (126, or 127 for a missing script interpreter). */
static int find_program(const char *name, const struct mg_prog_req *req, char *out, size_t cap)
{
    if (strchr(name, '/')) {
        mg_fmt(out, cap, "%s", name);
        return access(out, F_OK) == 0 ? 0 : -ENOENT;
    }
    if (mg_path_search(name, req->path_env, out, cap) == 0)
        return 0;
    if (req->self_dir && strlen(req->self_dir) + strlen(name) + 2 <= cap) {
        mg_fmt(out, cap, "%s/%s", req->self_dir, name);
        if (is_exec_file(out))
            return 0;
    }
    mg_fmt(out, cap, "%s", name);
    return access(out, F_OK) == 0 ? 0 : -ENOENT;
}

int mg_prog_resolve(const struct mg_prog_req *req, struct mg_prog *out)
{
    memset(out, 0, sizeof(*out));
    if (!req->program || !*req->program)
        return -EINVAL;
    int python = req->module || (!req->no_python && ends_with(req->program, ".py"));
    if (!python)
        return find_program(req->program, req, out->path, sizeof(out->path));
    const char *py = req->python && *req->python ? req->python : "python3";
    int rc = find_program(py, req, out->path, sizeof(out->path));
    mg_fmt(out->lead_buf, sizeof(out->lead_buf), "%s", py);
    out->lead[out->nlead++] = out->lead_buf;
    out->lead[out->nlead++] = "-u";
    if (req->module)
        out->lead[out->nlead++] = "-m";
    return rc;
}

/* ---- the environment ------------------------------------------------------------- */

static const char *const managed[] = {
    "LOCAL_RANK",
    "RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "NCCL_ASYNC_ERROR_HANDLING",
};

#define NMANAGED         (sizeof(managed) / sizeof(managed[0]))
#define MG_ENV_MAX_BYTES (4u << 20) /* the kernel's ARG_MAX is usually 2 MiB */

const char *mg_env_get(char *const *env, const char *name)
{
    size_t n = strlen(name);
    for (char *const *e = env; e && *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

long long mg_proc_start_time(int pid)
{
    char path[64], buf[1024];
    mg_fmt(path, sizeof(path), "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    /* fields after the name start at 3 (state); starttime is field 22 */
    int field = 2;
    for (; p && *p && field < 22; p++)
        if (*p == ' ')
            field++;
    return p ? strtoll(p, NULL, 10) : -1;
}

const char *mg_env_lookup(char *const *env, const char *name)
{
    return env ? mg_env_get(env, name) : getenv(name);
}

static int is_managed(const char *entry, int cvd)
{
    for (size_t i = 0; i < NMANAGED; i++) {
        size_t n = strlen(managed[i]);
        if (strncmp(entry, managed[i], n) == 0 && entry[n] == '=')
            return 1;
    }
    return cvd && strncmp(entry, "CUDA_VISIBLE_DEVICES=", 21) == 0;
}

int mg_env_build(char *const *base, const struct mg_worker_env *we, char ***out)
{
    /* Values are pointed to, not copied: a long --gpu_ids list or error file
     * path goes through whole. Only the numbers are formatted here. */
    char nums[NMANAGED][24];
    const char *names[NMANAGED + 2], *vals[NMANAGED + 2];
    int nv = 0, nn = 0;
    const char *nccl = mg_env_get(base, "NCCL_ASYNC_ERROR_HANDLING");

#define SETS(name, v) (names[nv] = (name), vals[nv++] = (v) ? (v) : "")
#define SETI(name, x) (snprintf(nums[nn], sizeof(nums[nn]), "%d", (x)), SETS(name, nums[nn]), nn++)
    SETI("LOCAL_RANK", we->local_rank);
    SETI("RANK", we->rank);
    SETI("GROUP_RANK", we->group_rank);
    SETI("ROLE_RANK", we->role_rank);
    SETS("ROLE_NAME", we->role_name);
    SETI("LOCAL_WORLD_SIZE", we->local_world_size);
    SETI("WORLD_SIZE", we->world_size);
    SETI("GROUP_WORLD_SIZE", we->group_world_size);
    SETI("ROLE_WORLD_SIZE", we->role_world_size);
    SETS("MASTER_ADDR", we->master_addr);
    SETI("MASTER_PORT", we->master_port);
    SETI("TORCHELASTIC_RESTART_COUNT", we->restart_count);
    SETI("TORCHELASTIC_MAX_RESTARTS", we->max_restarts);
    SETS("TORCHELASTIC_RUN_ID", we->run_id);
    SETS("TORCHELASTIC_USE_AGENT_STORE", "False");
    SETS("TORCHELASTIC_ERROR_FILE", we->error_file);
    SETS("NCCL_ASYNC_ERROR_HANDLING", nccl ? nccl : "1");
    if (we->cuda_visible_devices)
        SETS("CUDA_VISIBLE_DEVICES", we->cuda_visible_devices);
    if (we->local_world_size > 1 && !mg_env_get(base, "OMP_NUM_THREADS"))
        SETS("OMP_NUM_THREADS", "1");
#undef SETI
#undef SETS

    size_t count = 0, bytes = 0;
    for (char *const *e = base; e && *e; e++) {
        if (is_managed(*e, we->cuda_visible_devices != NULL))
            continue;
        count++;
        bytes += strlen(*e) + 1;
    }
    for (int i = 0; i < nv; i++)
        bytes += strlen(names[i]) + 1 + strlen(vals[i]) + 1;
    count += (size_t)nv;
    if (bytes > MG_ENV_MAX_BYTES)
        return -E2BIG;

    size_t ptrs = (count + 1) * sizeof(char *);
    char **env = malloc(ptrs + bytes);
    if (!env)
        return -ENOMEM;
    char *s = (char *)env + ptrs;
    size_t k = 0;
    for (char *const *e = base; e && *e; e++) {
        if (is_managed(*e, we->cuda_visible_devices != NULL))
            continue;
        size_t n = strlen(*e) + 1;
        memcpy(s, *e, n);
        env[k++] = s;
        s += n;
    }
    for (int i = 0; i < nv; i++) {
        env[k++] = s;
        s += sprintf(s, "%s=%s", names[i], vals[i]) + 1;
    }
    env[k] = NULL;
    *out = env;
    return 0;
}

/* ---- GPUs ------------------------------------------------------------------------ */

int mg_gpu_count_system(const char *proc_gpus_dir, const char *dev_dir)
{
    int n = 0;
    DIR *d = opendir(proc_gpus_dir ? proc_gpus_dir : "/proc/driver/nvidia/gpus");
    struct dirent *de;
    if (d) {
        while ((de = readdir(d)))
            if (de->d_name[0] != '.')
                n++;
        closedir(d);
        if (n)
            return n;
    }
    d = opendir(dev_dir ? dev_dir : "/dev");
    if (!d)
        return 0;
    while ((de = readdir(d))) {
        const char *s = de->d_name;
        if (strncmp(s, "nvidia", 6) || !s[6])
            continue;
        s += 6;
        while (*s >= '0' && *s <= '9')
            s++;
        if (!*s)
            n++;
    }
    closedir(d);
    return n;
}

int mg_gpu_count_visible(const char *cvd, int system_count)
{
    if (!cvd)
        return system_count < 0 ? 0 : system_count;
    int n = 0;
    const char *p = cvd;
    while (*p) {
        while (*p == ' ')
            p++;
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        while (len && p[len - 1] == ' ')
            len--;
        if (len == 0)
            break;
        if (strncmp(p, "GPU-", 4) == 0 || strncmp(p, "MIG-", 4) == 0) {
            n++;
        } else {
            char *end;
            long v = strtol(p, &end, 10);
            if (end != p + len || v < 0 || (system_count >= 0 && v >= system_count))
                break;
            n++;
        }
        if (!c)
            break;
        p = c + 1;
    }
    return n;
}

/* ---- spawning -------------------------------------------------------------------- */

/* The child side, between vfork and exec: system calls only. It shares the
 * parent's memory until it execs, so the parent learns of an exec failure
 * through *err as soon as vfork returns. */
static __attribute__((noinline, noreturn)) void spawn_child(const struct mg_spawn_req *req,
                                                            pid_t parent, volatile int *err)
{
    sigset_t none;
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    int e;

    setpgid(0, 0);
    /* Die with the launcher; if it already died, do not start at all. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) {
        *err = ESRCH;
        _exit(137);
    }
    if (req->sentinel_fd >= 0) {
        int pgid = (int)getpid();
        ssize_t rc = write(req->sentinel_fd, &pgid, sizeof(pgid));
        (void)rc;
    }
    if ((req->stdin_fd >= 0 && dup2(req->stdin_fd, 0) < 0) ||
        (req->stdout_fd >= 0 && dup2(req->stdout_fd, 1) < 0) ||
        (req->stderr_fd >= 0 && dup2(req->stderr_fd, 2) < 0)) {
        e = errno;
        goto fail;
    }
    sigaction(SIGPIPE, &dfl, NULL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (!req->path || !*req->path) {
        e = ENOENT;
        goto fail;
    }
    execve(req->path, req->argv, req->envp);
    e = errno;
fail:
    *err = e;
    _exit(e == ENOENT || e == ENOTDIR ? 127 : 126);
}

int mg_spawn(const struct mg_spawn_req *req, struct mg_spawned *out)
{
    volatile int err = 0;
    pid_t parent = getpid();

    /* vfork: no page tables to copy and nothing to copy on write; the parent
     * waits only until the child has exec'd (or failed to). */
    pid_t pid = vfork();
    if (pid < 0)
        return -errno;
    if (pid == 0)
        spawn_child(req, parent, &err);
    /* Also from this side, so the group exists before we ever signal it. */
    setpgid(pid, pid);
    out->pid = pid;
    out->exec_errno = err;
    return 0;
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
