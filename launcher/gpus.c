/* GPUs without CUDA (see gpus.h). */
#include "gpus.h"
#include "mg_err.h"
#include "proc.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

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

/* Entries of a comma-separated device list ("0,1", "GPU-8f3...,GPU-2c1..."):
 * their count, or -EINVAL for an empty entry. */
static int count_list(const char *v)
{
    int n = 0;
    for (const char *p = v;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        while (len && *p == ' ')
            p++, len--;
        while (len && p[len - 1] == ' ')
            len--;
        if (len == 0)
            return -EINVAL;
        n++;
        if (!c)
            return n;
        p = c + 1;
    }
}

/* The NVIDIA device plugin's "volume-mounts" strategy: one file per device
 * under the directory NVIDIA_VISIBLE_DEVICES names. */
static int count_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    if (!d)
        return -errno;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

static int from_cuda(const char *v, const char *proc_dir, const char *dev_dir, char *how,
                     size_t cap)
{
    int sys = mg_gpu_count_system(proc_dir, dev_dir);
    int n = mg_gpu_count_visible(v, sys);
    if (n > 0)
        snprintf(how, cap, "CUDA_VISIBLE_DEVICES=%s", v);
    else if (sys == 0)
        snprintf(how, cap,
                 "CUDA_VISIBLE_DEVICES='%s', but no NVIDIA GPU in /proc/driver/nvidia/gpus or "
                 "/dev/nvidia*",
                 v);
    else
        snprintf(how, cap, "CUDA_VISIBLE_DEVICES='%s' hides all %d GPU%s", v, sys,
                 sys == 1 ? "" : "s");
    return n;
}

static int from_nvidia(const char *v, const char *proc_dir, const char *dev_dir, char *how,
                       size_t cap)
{
    int n;
    if (!*v || strcmp(v, "none") == 0 || strcmp(v, "void") == 0) {
        snprintf(how, cap, "NVIDIA_VISIBLE_DEVICES='%s': the container was given no GPU", v);
        return 0;
    }
    if (strcmp(v, "all") == 0) {
        n = mg_gpu_count_system(proc_dir, dev_dir);
        snprintf(how, cap, "NVIDIA_VISIBLE_DEVICES=all: %s",
                 n ? "every GPU in /dev" : "no GPU in /dev");
        return n;
    }
    if (v[0] == '/') {
        n = count_dir(v);
        if (n < 0)
            return mg_seterr(how, cap, -EINVAL, "NVIDIA_VISIBLE_DEVICES=%s: cannot list it: %s", v,
                             strerror(-n));
        snprintf(how, cap, "NVIDIA_VISIBLE_DEVICES=%s (%d device%s)", v, n, n == 1 ? "" : "s");
        return n;
    }
    n = count_list(v);
    if (n < 0)
        return mg_seterr(how, cap, -EINVAL,
                         "NVIDIA_VISIBLE_DEVICES='%s': expected all, none, void or a list of GPU "
                         "indices or UUIDs",
                         v);
    snprintf(how, cap, "NVIDIA_VISIBLE_DEVICES=%s", v);
    return n;
}

/* What Slurm gave the step (--gpus, --gpus-per-node, --gres=gpu:N): the
 * step's GPU list, its count on this node, the job's list. */
static int from_slurm(char *const *env, char *how, size_t cap)
{
    static const char *const vars[] = {"SLURM_STEP_GPUS", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = mg_env_lookup(env, vars[i]);
        int n;
        if (!v || !*v)
            continue;
        if (strcmp(vars[i], "SLURM_GPUS_ON_NODE") == 0) {
            char *end;
            long c = strtol(v, &end, 10);
            if (*end || end == v || c < 0 || c > MG_MAX_NPROC)
                return mg_seterr(how, cap, -EINVAL, "%s='%s': expected a GPU count", vars[i], v);
            n = (int)c;
        } else if ((n = count_list(v)) < 0) {
            return mg_seterr(how, cap, -EINVAL, "%s='%s': expected GPU indices like 0,1", vars[i],
                             v);
        }
        snprintf(how, cap, "%s=%s", vars[i], v);
        return n;
    }
    return -ENOENT;
}

int mg_gpu_count_given(char *const *env, const char *proc_dir, const char *dev_dir, char *how,
                       size_t cap)
{
    const char *v;
    int n;

    if ((v = mg_env_lookup(env, "CUDA_VISIBLE_DEVICES")))
        return from_cuda(v, proc_dir, dev_dir, how, cap);
    if ((v = mg_env_lookup(env, "NVIDIA_VISIBLE_DEVICES")))
        return from_nvidia(v, proc_dir, dev_dir, how, cap);
    if ((n = from_slurm(env, how, cap)) != -ENOENT)
        return n;
    n = mg_gpu_count_system(proc_dir, dev_dir);
    if (n > 0)
        snprintf(how, cap, "%d in /proc/driver/nvidia/gpus or /dev/nvidia*", n);
    else
        snprintf(how, cap,
                 "no NVIDIA GPU: none in /proc/driver/nvidia/gpus or /dev/nvidia*, and no "
                 "CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES or SLURM_*GPUS* to say otherwise");
    return n;
}

int mg_gpu_count_usable(char *why, size_t cap)
{
    return mg_gpu_count_given(environ, NULL, NULL, why, cap);
}

void mg_gpu_visible_devices(const struct mg_launch_opts *o, int nproc, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    if (!o->ngpu_ids)
        return;
    for (int i = 0; i < nproc; i++) {
        char id[MG_GPU_ID_LEN];
        if (mg_opts_gpu_id(o, i, id, sizeof(id)))
            break;
        int k = mg_fmt(buf + len, cap - len, "%s%s", i ? "," : "", id);
        if (k < 0)
            break;
        len += (size_t)k;
    }
}
