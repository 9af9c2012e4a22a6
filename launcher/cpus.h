/* The cores this process may use (its CPU affinity, and its cgroup's CPU
 * quota), and the warning when more CPU-training workers are asked for
 * than there are cores (docs/cli.md, --nproc_per_node). */
#ifndef MG_CPUS_H
#define MG_CPUS_H

#include <stddef.h>

/* The usable cores: the CPUs in our affinity mask, fewer when the cgroup's
 * quota (v2 cpu.max along the cgroup's path, v1 cpu.cfs_quota_us) allows
 * less, rounded up. how gets where the figure comes from. At least 1. */
int mg_cpus_usable(const char *cgroup_root, char *how, size_t cap);

/* The one-line warning for nproc CPU-training workers on cpus usable cores
 * ("" when they fit). */
void mg_cpus_oversubscribed(int nproc, int cpus, const char *how, char *buf, size_t cap);

#endif
