/* GPUs without CUDA (see gpus.h). */
#include "gpus.h"
#include "mg_err.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
