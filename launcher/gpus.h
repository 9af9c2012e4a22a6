/* GPUs as the launcher sees them, without loading CUDA: how many this node
 * was given (for --nproc_per_node gpu and auto): a pod's, a Slurm step's, the
 * machine's; and the CUDA_VISIBLE_DEVICES the workers get for --gpu_ids. */
#ifndef MG_GPUS_H
#define MG_GPUS_H

#include "opts.h"

#include <stddef.h>

/* GPUs on the machine, from /proc/driver/nvidia/gpus (one entry per GPU) or
 * else /dev/nvidiaN. The directories are parameters for the tests; NULL
 * selects the real ones. */
int mg_gpu_count_system(const char *proc_gpus_dir, const char *dev_dir);

/* GPUs a process sees under CUDA_VISIBLE_DEVICES=cvd on a machine with
 * system_count GPUs (-1: unknown): CUDA's rules, entries up to the first
 * invalid one (a negative or out-of-range index); GPU-/MIG- UUIDs count.
 * cvd NULL means unset: all of them. */
int mg_gpu_count_visible(const char *cvd, int system_count);

/* The GPUs this process was given, from the first of these that is set:
 * CUDA_VISIBLE_DEVICES (what CUDA will show; Slurm sets it for a step's
 * GPUs), NVIDIA_VISIBLE_DEVICES (what the NVIDIA container runtime exposes
 * to a pod: a list, all, none or void, or a directory of device files),
 * Slurm's SLURM_STEP_GPUS, SLURM_GPUS_ON_NODE and SLURM_JOB_GPUS, and last
 * the machine's (mg_gpu_count_system). env is the environment, the
 * directories as for mg_gpu_count_system. Returns the count with how saying
 * where it came from, or why there is none; or -EINVAL when a variable that
 * decides cannot be read, with how saying which and why. */
int mg_gpu_count_given(char *const *env, const char *proc_dir, const char *dev_dir, char *how,
                       size_t cap);

/* mg_gpu_count_given for this process and machine. */
int mg_gpu_count_usable(char *why, size_t cap);

/* CUDA_VISIBLE_DEVICES for the workers: the --gpu_ids of local ranks
 * 0..nproc-1 in that order, so the worker that opens device LOCAL_RANK gets
 * gpu_ids[LOCAL_RANK]. "" without --gpu_ids (the inherited value stays). */
void mg_gpu_visible_devices(const struct mg_launch_opts *o, int nproc, char *buf, size_t cap);

#endif
