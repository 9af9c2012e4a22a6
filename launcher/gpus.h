/* GPUs as the launcher sees them, without loading CUDA: how many the machine
 * has and how many CUDA_VISIBLE_DEVICES leaves (for --nproc_per_node gpu),
 * and the CUDA_VISIBLE_DEVICES the workers get for --gpu_ids. */
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

/* GPUs this process may use (the system's, under its own
 * CUDA_VISIBLE_DEVICES). When there are none, why gets the reason. */
int mg_gpu_count_usable(char *why, size_t cap);

/* CUDA_VISIBLE_DEVICES for the workers: the --gpu_ids of local ranks
 * 0..nproc-1 in that order, so the worker that opens device LOCAL_RANK gets
 * gpu_ids[LOCAL_RANK]. "" without --gpu_ids (the inherited value stays). */
void mg_gpu_visible_devices(const struct mg_launch_opts *o, int nproc, char *buf, size_t cap);

#endif
