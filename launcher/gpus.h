/* GPUs as the launcher sees them, without loading CUDA: how many this node
 * was given (for --nproc_per_node gpu and auto): a pod's, a Slurm step's, the
 * machine's; which PCI device each one is (for --numa-binding), the
 * CUDA_VISIBLE_DEVICES the workers get for --gpu_ids, and Intel GPUs for
 * --nproc_per_node xpu. */
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

/* --virtual-local-rank (torchrun 2.x): every worker has LOCAL_RANK 0 and sees
 * only its own GPU, as device 0. Local rank i's CUDA_VISIBLE_DEVICES: its
 * --gpu_ids entry, else the i-th entry of the inherited cvd (NULL: unset),
 * else "i". -ENOENT when cvd lists fewer than i+1 (torchrun refuses that
 * too). */
int mg_virtual_device(const struct mg_launch_opts *o, const char *cvd, int i, char *buf,
                      size_t cap);

/* The NVIDIA GPUs' PCI addresses ("0000:3b:00.0") in PCI bus order, which is
 * CUDA's device order with CUDA_DEVICE_ORDER=PCI_BUS_ID and, on machines of
 * one GPU model, its default order too: the entries of
 * <root>/proc/driver/nvidia/gpus, else the <root>/sys/bus/pci/devices of
 * vendor 0x10de and a display class. root NULL: "/". Returns how many (at
 * most max). */
int mg_gpu_pci_list(const char *root, char (*pci)[32], int max);

/* The PCI address of the GPU an id names: an index into mg_gpu_pci_list's
 * order, or a GPU- UUID (matched in /proc/driver/nvidia/gpus/<pci>/information).
 * 0, -ENOENT, or -EINVAL for an id that cannot be placed (a MIG- one). */
int mg_gpu_pci_of(const char *root, const char *id, char *pci, size_t cap);

/* Intel GPUs (torchrun's --nproc-per-node xpu): the <root>/sys/class/drm/cardN
 * bound to the i915 or xe driver. When there are none, why gets the reason. */
int mg_xpu_count(const char *root, char *why, size_t cap);

#endif
