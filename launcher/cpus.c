/* Usable cores and the oversubscription warning (see cpus.h). */
#include "cpus.h"
#include "mg_err.h"

#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The cores a quota allows, rounded up; 0 when there is none. */
static int quota_cores(long long quota, long long period)
{
    if (quota <= 0 || period <= 0)
        return 0;
    return (int)((quota + period - 1) / period);
}

/* cgroup v2: cpu.max ("max 100000" or "200000 100000") of our cgroup and of
 * each parent (a parent's limit holds for its children), the smallest. */
static int v2_quota(const char *root, char *which, size_t cap)
{
    char line[PATH_MAX], path[PATH_MAX + 64];
    FILE *f = fopen("/proc/self/cgroup", "re");
    int best = 0;
    if (!f)
        return 0;
    char cg[PATH_MAX] = "";
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, "0::", 3) == 0) {
            mg_fmt(cg, sizeof(cg), "%s", line + 3);
            cg[strcspn(cg, "\n")] = '\0';
        }
    fclose(f);
    for (;;) {
        long long q = 0, p = 0;
        char qs[32] = "";
        mg_fmt(path, sizeof(path), "%s%s/cpu.max", root, strcmp(cg, "/") == 0 ? "" : cg);
        FILE *m = fopen(path, "re");
        if (m) {
            if (fscanf(m, "%31s %lld", qs, &p) == 2 && strcmp(qs, "max") != 0)
                q = atoll(qs);
            fclose(m);
        }
        int c = quota_cores(q, p);
        if (c > 0 && (best == 0 || c < best)) {
            best = c;
            mg_fmt(which, cap, "%s", path);
        }
        char *slash = strrchr(cg, '/');
        if (!slash || !cg[0] || strcmp(cg, "/") == 0)
            break;
        *slash = '\0';
        if (!cg[0])
            mg_fmt(cg, sizeof(cg), "/");
    }
    return best;
}

/* cgroup v1: the quota of our cgroup in the cpu controller (the line
 * "N:cpu,cpuacct:/path" of /proc/self/cgroup), mounted at <root>/cpu. */
static int v1_quota(const char *root, char *which, size_t cap)
{
    char line[PATH_MAX], cg[PATH_MAX] = "", path[2 * PATH_MAX];
    long long q = 0, p = 0;
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f)) {
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = '\0';
        for (char *t = strtok(c1 + 1, ","); t; t = strtok(NULL, ","))
            if (strcmp(t, "cpu") == 0) {
                mg_fmt(cg, sizeof(cg), "%s", c2 + 1);
                cg[strcspn(cg, "\n")] = '\0';
            }
    }
    fclose(f);
    if (!cg[0])
        return 0;
    mg_fmt(path, sizeof(path), "%s/cpu%s/cpu.cfs_quota_us", root, strcmp(cg, "/") == 0 ? "" : cg);
    if (!(f = fopen(path, "re")))
        return 0;
    if (fscanf(f, "%lld", &q) != 1)
        q = 0;
    fclose(f);
    mg_fmt(path + strlen(path) - strlen("quota_us"), 16, "period_us");
    if ((f = fopen(path, "re"))) {
        if (fscanf(f, "%lld", &p) != 1)
            p = 0;
        fclose(f);
    }
    mg_fmt(path + strlen(path) - strlen("period_us"), 16, "quota_us");
    int c = quota_cores(q, p);
    if (c > 0)
        mg_fmt(which, cap, "%s", path);
    return c;
}

int mg_cpus_usable(const char *cgroup_root, char *how, size_t cap)
{
    cpu_set_t set;
    int n = 0;
    char which[PATH_MAX] = "";
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        n = CPU_COUNT(&set);
    if (n <= 0)
        n = 1;
    mg_fmt(how, cap, "its CPU affinity");
    int q = v2_quota(cgroup_root, which, sizeof(which));
    if (q <= 0)
        q = v1_quota(cgroup_root, which, sizeof(which));
    if (q > 0 && q < n) {
        mg_fmt(how, cap, "the CPU quota of its cgroup, %s; %d in its CPU affinity", which, n);
        n = q;
    }
    return n;
}

void mg_cpus_oversubscribed(int nproc, int cpus, const char *how, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (nproc <= cpus)
        return;
    mg_fmt(buf, cap,
           "warning: --nproc_per_node %d on %d usable core%s (%s): with no GPU, the %d workers "
           "train on the CPU and take turns on %s core%s, so a step is no faster than with %d "
           "worker%s, and every rank waits in each collective for the ranks that are not running; "
           "each worker also holds its own model and data. --nproc_per_node %d fits",
           nproc, cpus, cpus == 1 ? "" : "s", how, nproc, cpus == 1 ? "one" : "those",
           cpus == 1 ? "" : "s", cpus, cpus == 1 ? "" : "s", cpus);
}
