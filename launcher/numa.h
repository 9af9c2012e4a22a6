/* --numa-binding (torchrun 2.x): each worker runs on the CPUs nearest its
 * GPU, and prefers that NUMA node's memory. Everything comes from sysfs, so
 * no CUDA and no libnuma are needed: the GPU's PCI device gives its NUMA node
 * (numa_node), the node its CPUs (cpulist), the CPUs their socket
 * (physical_package_id), their cores (thread_siblings_list) and their L3
 * cache (cache/index*, level 3). The plan is made once, before the first
 * worker starts; the child applies its part with two system calls between
 * fork and exec. */
#ifndef MG_NUMA_H
#define MG_NUMA_H

#include "opts.h"

#include <sched.h>
#include <stddef.h>

struct mg_numa_place {
    cpu_set_t cpus; /* the worker's CPU affinity */
    int node;       /* its preferred memory node, or -1 */
};

/* The PCI address of each local rank's GPU: --gpu_ids when given, else the
 * entries of cvd (the inherited CUDA_VISIBLE_DEVICES, NULL: unset), else
 * local rank i is GPU i, in PCI bus order (gpus.h). root is the file system
 * root sysfs and procfs are read under (NULL: "/"; the tests give a fixture).
 * 0, or a negative code with err saying which rank's GPU was not found, or
 * that the machine has none. */
int mg_numa_gpus(const char *root, const struct mg_launch_opts *o, int nproc, const char *cvd,
                 char (*pci)[32], char *err, size_t cap);

/* Places nproc workers whose GPUs are pci[0..nproc-1] (mode as in opts.h).
 * exclusive: the workers that share a node split its cores, in local-rank
 * order, each core with its hardware threads; core-complex: they take the
 * node's L3 domains in turn. 0, or -EINVAL with err set (fewer cores than
 * workers for exclusive, a node without CPUs). */
int mg_numa_plan(const char *root, enum mg_numa_mode mode, int nproc, char (*pci)[32],
                 struct mg_numa_place *out, char *err, size_t cap);

/* In the child, between fork and exec: system calls only. */
void mg_numa_apply(const struct mg_numa_place *p);

/* "0-3,8" for a CPU set (for messages and tests). */
void mg_numa_cpus_text(const cpu_set_t *s, char *buf, size_t cap);

#endif
