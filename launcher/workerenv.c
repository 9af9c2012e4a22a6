/* Program lookup and the workers' environment (see workerenv.h). */
#include "workerenv.h"
#include "mg_err.h"
#include "proc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
    int python =
        req->module || req->run_path || (!req->no_python && ends_with(req->program, ".py"));
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
    "MG_RUN_LOG_DIR",
    "MG_ATTEMPT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "MG_AGENT_STORE",
    "MG_AGENT_STORE_TOKEN",
};

#define NMANAGED         (sizeof(managed) / sizeof(managed[0]))
#define MG_ENV_MAX_BYTES (4u << 20) /* the kernel's ARG_MAX is usually 2 MiB */

static int is_managed(const char *entry, int cvd, char *const *extra)
{
    for (size_t i = 0; i < NMANAGED; i++) {
        size_t n = strlen(managed[i]);
        if (strncmp(entry, managed[i], n) == 0 && entry[n] == '=')
            return 1;
    }
    for (char *const *x = extra; x && *x; x++) {
        size_t n = strcspn(*x, "=");
        if (strncmp(entry, *x, n) == 0 && entry[n] == '=')
            return 1;
    }
    return cvd && strncmp(entry, "CUDA_VISIBLE_DEVICES=", 21) == 0;
}

int mg_env_build(char *const *base, const struct mg_worker_env *we, char ***out)
{
    /* Values are pointed to, not copied: a long --gpu_ids list or error file
     * path goes through whole. Only the numbers are formatted here. */
    char nums[NMANAGED][24];
    /* every managed name, and CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS and
     * MG_STORE_TOKEN, which are not managed (one to spare) */
    const char *names[NMANAGED + 4], *vals[NMANAGED + 4];
    int nv = 0, nn = 0;
    const char *nccl = mg_env_get(base, "NCCL_ASYNC_ERROR_HANDLING");
    const char *tnccl = mg_env_get(base, "TORCH_NCCL_ASYNC_ERROR_HANDLING");

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
    SETS("TORCHELASTIC_USE_AGENT_STORE", we->use_agent_store ? "True" : "False");
    if (we->use_agent_store)
        SETS("MG_AGENT_STORE", "mg");
    if (we->use_agent_store && we->agent_store_token && *we->agent_store_token)
        SETS("MG_AGENT_STORE_TOKEN", we->agent_store_token);
    SETS("TORCHELASTIC_ERROR_FILE", we->error_file);
    SETS("NCCL_ASYNC_ERROR_HANDLING", nccl ? nccl : "1");
    if (we->run_log_dir)
        SETS("MG_RUN_LOG_DIR", we->run_log_dir);
    if (we->attempt >= 0)
        SETI("MG_ATTEMPT", we->attempt);
    SETS("TORCH_NCCL_ASYNC_ERROR_HANDLING", tnccl ? tnccl : "1"); /* torchrun 2.x's name */
    if (we->cuda_visible_devices)
        SETS("CUDA_VISIBLE_DEVICES", we->cuda_visible_devices);
    if (we->local_world_size > 1 && !mg_env_get(base, "OMP_NUM_THREADS"))
        SETS("OMP_NUM_THREADS", "1");
    if (we->store_token && *we->store_token && !mg_env_get(base, "MG_STORE_TOKEN"))
        SETS("MG_STORE_TOKEN", we->store_token);
#undef SETI
#undef SETS

    size_t count = 0, bytes = 0;
    for (char *const *e = base; e && *e; e++) {
        if (is_managed(*e, we->cuda_visible_devices != NULL, we->extra))
            continue;
        count++;
        bytes += strlen(*e) + 1;
    }
    for (int i = 0; i < nv; i++)
        bytes += strlen(names[i]) + 1 + strlen(vals[i]) + 1;
    count += (size_t)nv;
    for (char *const *x = we->extra; x && *x; x++) {
        count++;
        bytes += strlen(*x) + 1;
    }
    if (bytes > MG_ENV_MAX_BYTES)
        return -E2BIG;

    size_t ptrs = (count + 1) * sizeof(char *);
    char **env = malloc(ptrs + bytes);
    if (!env)
        return -ENOMEM;
    char *s = (char *)env + ptrs;
    size_t k = 0;
    for (char *const *e = base; e && *e; e++) {
        if (is_managed(*e, we->cuda_visible_devices != NULL, we->extra))
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
    for (char *const *x = we->extra; x && *x; x++) {
        size_t n = strlen(*x) + 1;
        memcpy(s, *x, n);
        env[k++] = s;
        s += n;
    }
    env[k] = NULL;
    *out = env;
    return 0;
}
