/* --numa-binding from sysfs (see numa.h). */
#include "numa.h"
#include "gpus.h"
#include "mg_err.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MPOL_PREFERRED_ 1 /* linux/mempolicy.h, without libnuma */
#define MAX_UNITS       CPU_SETSIZE

static const char *path_of(const char *root, char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static const char *path_of(const char *root, char *buf, size_t cap, const char *fmt, ...)
{
    char rel[PATH_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rel, sizeof(rel), fmt, ap);
    va_end(ap);
    mg_fmt(buf, cap, "%s%s", root && strcmp(root, "/") ? root : "", rel);
    return buf;
}

static int read_text(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -errno;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

/* "0-3,8,10-11" into s. 0 or -EINVAL. */
static int parse_cpulist(const char *text, cpu_set_t *s)
{
    CPU_ZERO(s);
    const char *p = text;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b;
        if (end == p || a < 0 || a >= CPU_SETSIZE)
            return -EINVAL;
        b = a;
        if (*end == '-') {
            p = end + 1;
            b = strtol(p, &end, 10);
            if (end == p || b < a || b >= CPU_SETSIZE)
                return -EINVAL;
        }
        for (long c = a; c <= b; c++)
            CPU_SET((int)c, s);
        p = end;
        if (*p == ',')
            p++;
        else if (*p)
            return -EINVAL;
    }
    return 0;
}

static int read_cpulist(const char *path, cpu_set_t *s)
{
    char buf[8192];
    int rc = read_text(path, buf, sizeof(buf));
    return rc ? rc : parse_cpulist(buf, s);
}

void mg_numa_cpus_text(const cpu_set_t *s, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int c = 0; c < CPU_SETSIZE && n < cap; c++) {
        if (!CPU_ISSET(c, s))
            continue;
        int e = c;
        while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, s))
            e++;
        n += (size_t)snprintf(buf + n, cap - n, e > c ? "%s%d-%d" : "%s%d", n ? "," : "", c, e);
        c = e;
    }
}

static int int_file(const char *path, int *out)
{
    char buf[64];
    int rc = read_text(path, buf, sizeof(buf));
    if (rc)
        return rc;
    char *end;
    long v = strtol(buf, &end, 10);
    if (end == buf)
        return -EINVAL;
    *out = (int)v;
    return 0;
}

/* ---- which GPU each worker has ------------------------------------------------ */

/* The i-th entry of a comma-separated list. */
static int list_entry(const char *list, int i, char *buf, size_t cap)
{
    const char *p = list;
    for (; i > 0 && p; i--) {
        p = strchr(p, ',');
        if (p)
            p++;
    }
    if (!p || !*p)
        return -ENOENT;
    size_t n = strcspn(p, ",");
    while (n && p[n - 1] == ' ')
        n--;
    while (*p == ' ' && n) {
        p++;
        n--;
    }
    if (n == 0 || n >= cap)
        return -ENOENT;
    memcpy(buf, p, n);
    buf[n] = '\0';
    return 0;
}

int mg_numa_gpus(const char *root, const struct mg_launch_opts *o, int nproc, const char *cvd,
                 char (*pci)[32], char *err, size_t cap)
{
    char list[8][32], why[200];
    if (mg_gpu_pci_list(root, list, 8) == 0) {
        char path[PATH_MAX];
        mg_fmt(why, sizeof(why), "no NVIDIA GPU in %s",
               path_of(root, path, sizeof(path), "/proc/driver/nvidia/gpus or /sys/bus/pci"));
        return mg_seterr(err, cap, -ENODEV,
                         "--numa-binding: %s; the binding follows each worker's GPU, so it needs "
                         "GPUs (leave it out on a machine without them)",
                         why);
    }
    for (int i = 0; i < nproc; i++) {
        char id[MG_GPU_ID_LEN];
        const char *from;
        if (o->ngpu_ids) {
            mg_opts_gpu_id(o, i, id, sizeof(id));
            from = "--gpu_ids";
        } else if (cvd) {
            if (list_entry(cvd, i, id, sizeof(id)))
                return mg_seterr(err, cap, -ENOENT,
                                 "--numa-binding: local rank %d has no GPU: "
                                 "CUDA_VISIBLE_DEVICES='%s' lists fewer than %d",
                                 i, cvd, nproc);
            from = "CUDA_VISIBLE_DEVICES";
        } else {
            mg_fmt(id, sizeof(id), "%d", i);
            from = "its local rank";
        }
        int rc = mg_gpu_pci_of(root, id, pci[i], sizeof(pci[i]));
        if (rc == -EINVAL)
            return mg_seterr(err, cap, rc,
                             "--numa-binding: local rank %d's GPU %s is a MIG instance; bind its "
                             "parent GPU's index instead",
                             i, id);
        if (rc)
            return mg_seterr(err, cap, rc,
                             "--numa-binding: local rank %d's GPU %s (from %s) is not on this "
                             "machine",
                             i, id, from);
    }
    return 0;
}

/* ---- placing them --------------------------------------------------------------- */

static int gpu_node(const char *root, const char *pci)
{
    char path[PATH_MAX];
    int node = -1;
    int_file(path_of(root, path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", pci), &node);
    if (node < 0) /* one node, or the firmware did not say: the first node */
        node = 0;
    return node;
}

static int node_cpus(const char *root, int node, cpu_set_t *s)
{
    char path[PATH_MAX];
    int rc = read_cpulist(
        path_of(root, path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", node), s);
    if (rc && node == 0) /* no NUMA in sysfs: every online CPU */
        rc = read_cpulist(path_of(root, path, sizeof(path), "/sys/devices/system/cpu/online"), s);
    return rc;
}

static int first_cpu(const cpu_set_t *s)
{
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, s))
            return c;
    return -1;
}

/* Every online CPU of the socket that holds cpu. */
static int socket_cpus(const char *root, int cpu, cpu_set_t *s)
{
    char path[PATH_MAX];
    cpu_set_t online;
    int pkg, other;
    int rc = int_file(path_of(root, path, sizeof(path),
                              "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu),
                      &pkg);
    if (rc == 0)
        rc = read_cpulist(path_of(root, path, sizeof(path), "/sys/devices/system/cpu/online"),
                          &online);
    if (rc)
        return rc;
    CPU_ZERO(s);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &online) &&
            int_file(path_of(root, path, sizeof(path),
                             "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", c),
                     &other) == 0 &&
            other == pkg)
            CPU_SET(c, s);
    return 0;
}

/* The groups of CPUs in set that share a core (thread_siblings_list) or, with
 * l3, an L3 cache: units[0..n-1] in the order of their first CPU. */
static int units_of(const char *root, const cpu_set_t *set, int l3, cpu_set_t *units, int *n)
{
    char path[PATH_MAX];
    cpu_set_t seen;
    CPU_ZERO(&seen);
    *n = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, set) || CPU_ISSET(c, &seen))
            continue;
        cpu_set_t u;
        int rc = -ENOENT;
        if (!l3) {
            rc = read_cpulist(path_of(root, path, sizeof(path),
                                      "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list",
                                      c),
                              &u);
        } else {
            for (int idx = 0; idx < 8 && rc; idx++) {
                int level = 0;
                if (int_file(path_of(root, path, sizeof(path),
                                     "/sys/devices/system/cpu/cpu%d/cache/index%d/level", c, idx),
                             &level) == 0 &&
                    level == 3)
                    rc = read_cpulist(path_of(root, path, sizeof(path),
                                              "/sys/devices/system/cpu/cpu%d/cache/index%d/"
                                              "shared_cpu_list",
                                              c, idx),
                                      &u);
            }
        }
        if (rc) { /* no topology: the CPU alone */
            CPU_ZERO(&u);
            CPU_SET(c, &u);
        }
        CPU_AND(&u, &u, set);
        CPU_SET(c, &u);
        CPU_OR(&seen, &seen, &u);
        if (*n < MAX_UNITS)
            units[(*n)++] = u;
    }
    return 0;
}

int mg_numa_plan(const char *root, enum mg_numa_mode mode, int nproc, char (*pci)[32],
                 struct mg_numa_place *out, char *err, size_t cap)
{
    int *node = calloc((size_t)nproc, sizeof(int));
    cpu_set_t *units = NULL;
    int rc = 0;
    if (!node)
        return -ENOMEM;
    for (int i = 0; i < nproc; i++)
        node[i] = gpu_node(root, pci[i]);
    for (int i = 0; i < nproc && !rc; i++) {
        struct mg_numa_place *p = &out[i];
        cpu_set_t cpus;
        p->node = node[i];
        if (node_cpus(root, node[i], &cpus) || CPU_COUNT(&cpus) == 0) {
            rc = mg_seterr(err, cap, -EINVAL,
                           "--numa-binding: NUMA node %d of local rank %d's GPU (%s) has no CPUs",
                           node[i], i, pci[i]);
            break;
        }
        /* This worker's place among those that share its node. */
        int k = 0, m = 0;
        for (int j = 0; j < nproc; j++)
            if (node[j] == node[i]) {
                k += j < i;
                m++;
            }
        switch (mode) {
        case MG_NUMA_NONE:
        case MG_NUMA_NODE:
            p->cpus = cpus;
            break;
        case MG_NUMA_SOCKET:
            if (socket_cpus(root, first_cpu(&cpus), &p->cpus) || CPU_COUNT(&p->cpus) == 0)
                p->cpus = cpus;
            break;
        case MG_NUMA_EXCLUSIVE:
        case MG_NUMA_CORE_COMPLEX: {
            int n;
            if (!units && !(units = malloc(MAX_UNITS * sizeof(*units)))) {
                rc = -ENOMEM;
                break;
            }
            units_of(root, &cpus, mode == MG_NUMA_CORE_COMPLEX, units, &n);
            CPU_ZERO(&p->cpus);
            if (mode == MG_NUMA_CORE_COMPLEX) {
                p->cpus = units[k % n];
                break;
            }
            if (n < m) {
                rc = mg_seterr(err, cap, -EINVAL,
                               "--numa-binding exclusive: NUMA node %d has %d core%s for %d "
                               "workers; use node or socket",
                               node[i], n, n == 1 ? "" : "s", m);
                break;
            }
            for (int u = k * n / m; u < (k + 1) * n / m; u++)
                CPU_OR(&p->cpus, &p->cpus, &units[u]);
            break;
        }
        }
    }
    free(units);
    free(node);
    return rc;
}

void mg_numa_apply(const struct mg_numa_place *p)
{
    sched_setaffinity(0, sizeof(p->cpus), &p->cpus);
    if (p->node >= 0 && p->node < 1024) {
        unsigned long mask[1024 / (8 * sizeof(unsigned long))] = {0};
        mask[p->node / (8 * sizeof(unsigned long))] |= 1ul
                                                       << (p->node % (8 * sizeof(unsigned long)));
        syscall(SYS_set_mempolicy, MPOL_PREFERRED_, mask, 1024ul);
    }
}
