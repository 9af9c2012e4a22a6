/* GPUs without CUDA (see gpus.h). */
#include "gpus.h"
#include "mg_err.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

int mg_gpu_count_usable(char *why, size_t cap)
{
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    int sys = mg_gpu_count_system(NULL, NULL);
    int n = mg_gpu_count_visible(cvd, sys);
    if (n == 0 && sys == 0)
        snprintf(why, cap, "no NVIDIA GPU in /proc/driver/nvidia/gpus or /dev/nvidia*");
    else if (n == 0)
        snprintf(why, cap, "CUDA_VISIBLE_DEVICES='%s' hides all %d GPU%s", cvd ? cvd : "", sys,
                 sys == 1 ? "" : "s");
    return n;
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
