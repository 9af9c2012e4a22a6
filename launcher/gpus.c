/* GPUs without CUDA (see gpus.h). */
#include "gpus.h"
#include "mg_err.h"
#include "proc.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

int mg_virtual_device(const struct mg_launch_opts *o, const char *cvd, int i, char *buf, size_t cap)
{
    if (o->ngpu_ids)
        return mg_opts_gpu_id(o, i, buf, cap);
    if (!cvd)
        return mg_fmt(buf, cap, "%d", i) < 0 ? -ENAMETOOLONG : 0;
    const char *p = cvd;
    for (int k = i; k > 0 && p; k--) {
        p = strchr(p, ',');
        if (p)
            p++;
    }
    size_t n = p ? strcspn(p, ",") : 0;
    while (n && p[0] == ' ') {
        p++;
        n--;
    }
    while (n && p[n - 1] == ' ')
        n--;
    if (!n || n >= cap)
        return -ENOENT;
    memcpy(buf, p, n);
    buf[n] = '\0';
    return 0;
}

static const char *rooted(const char *root, const char *path, char *buf, size_t cap)
{
    if (!root || !*root || strcmp(root, "/") == 0)
        return path;
    mg_fmt(buf, cap, "%s%s", root, path);
    return buf;
}

/* The first line of a small file, without its newline. 0 or -errno. */
static int read_line(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -errno;
    if (!fgets(buf, (int)cap, f))
        buf[0] = '\0';
    fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(a, b);
}

int mg_gpu_pci_list(const char *root, char (*pci)[32], int max)
{
    char path[PATH_MAX], buf[256];
    int n = 0;
    DIR *d = opendir(rooted(root, "/proc/driver/nvidia/gpus", path, sizeof(path)));
    struct dirent *de;
    if (d) {
        while ((de = readdir(d)) && n < max)
            if (de->d_name[0] != '.' && strlen(de->d_name) < 32)
                mg_fmt(pci[n++], 32, "%s", de->d_name);
        closedir(d);
    }
    if (n == 0 && (d = opendir(rooted(root, "/sys/bus/pci/devices", path, sizeof(path))))) {
        while ((de = readdir(d)) && n < max) {
            char p[PATH_MAX + 64];
            if (de->d_name[0] == '.' || strlen(de->d_name) >= 32)
                continue;
            mg_fmt(p, sizeof(p), "%s/%s/vendor", path, de->d_name);
            if (read_line(p, buf, sizeof(buf)) || strcmp(buf, "0x10de"))
                continue;
            mg_fmt(p, sizeof(p), "%s/%s/class", path, de->d_name);
            /* 0x03xxxx: display controllers (VGA 0x0300, 3D 0x0302) */
            if (read_line(p, buf, sizeof(buf)) || strncmp(buf, "0x03", 4))
                continue;
            mg_fmt(pci[n++], 32, "%s", de->d_name);
        }
        closedir(d);
    }
    qsort(pci, (size_t)n, sizeof(pci[0]), cmp_str);
    return n;
}

int mg_gpu_pci_of(const char *root, const char *id, char *pci, size_t cap)
{
    char list[256][32];
    int n = mg_gpu_pci_list(root, list, 256);
    if (strncmp(id, "MIG-", 4) == 0)
        return -EINVAL;
    if (strncmp(id, "GPU-", 4) == 0) {
        char path[PATH_MAX], line[256];
        for (int i = 0; i < n; i++) {
            char p[PATH_MAX + 64];
            mg_fmt(p, sizeof(p), "%s/%s/information",
                   rooted(root, "/proc/driver/nvidia/gpus", path, sizeof(path)), list[i]);
            FILE *f = fopen(p, "r");
            if (!f)
                continue;
            int found = 0;
            while (!found && fgets(line, sizeof(line), f)) {
                const char *u = strstr(line, "GPU-");
                found = strncmp(line, "GPU UUID", 8) == 0 && u && strncmp(u, id, strlen(id)) == 0;
            }
            fclose(f);
            if (found)
                return mg_fmt(pci, cap, "%s", list[i]) < 0 ? -ENAMETOOLONG : 0;
        }
        return -ENOENT;
    }
    char *end;
    long k = strtol(id, &end, 10);
    if (*id == '\0' || *end || k < 0 || k >= n)
        return -ENOENT;
    return mg_fmt(pci, cap, "%s", list[k]) < 0 ? -ENAMETOOLONG : 0;
}

int mg_xpu_count(const char *root, char *why, size_t cap)
{
    char path[PATH_MAX], link[PATH_MAX];
    int n = 0;
    const char *dir = rooted(root, "/sys/class/drm", path, sizeof(path));
    DIR *d = opendir(dir);
    struct dirent *de;
    if (!d) {
        mg_fmt(why, cap, "no %s: no GPU driver loaded", dir);
        return 0;
    }
    while ((de = readdir(d))) {
        const char *s = de->d_name;
        if (strncmp(s, "card", 4) || !s[4] || strspn(s + 4, "0123456789") != strlen(s + 4))
            continue; /* cardN only, not its connectors (card0-HDMI-A-1) */
        char p[PATH_MAX + 300];
        mg_fmt(p, sizeof(p), "%s/%s/device/driver", dir, s);
        ssize_t k = readlink(p, link, sizeof(link) - 1);
        if (k <= 0)
            continue;
        link[k] = '\0';
        const char *drv = strrchr(link, '/');
        drv = drv ? drv + 1 : link;
        if (strcmp(drv, "i915") == 0 || strcmp(drv, "xe") == 0)
            n++;
    }
    closedir(d);
    if (n == 0)
        mg_fmt(why, cap, "no card in %s is bound to the i915 or xe driver", dir);
    return n;
}
