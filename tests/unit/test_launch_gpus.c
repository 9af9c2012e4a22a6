/* How many GPUs a node was given, source by source, without CUDA
 * (launcher/gpus.c): CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES as a pod's
 * container runtime sets it, Slurm's GPU variables, the machine's devices
 * last; and how --nproc_per_node gpu|auto uses the count (opts.c). The
 * machine is a directory of device files, as /dev would hold them. */
#include "gpus.h"
#include "opts.h"
#include "tap.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmp[] = "/tmp/mgtest-gpus.XXXXXX";
static char proc[300], dev[300], none[300];

static void touch(const char *dir, const char *name)
{
    char p[600];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0)
        close(fd);
}

/* The count for env on a machine with four GPUs (dev), how in how. */
static int count4(char *const *env, char *how, size_t cap)
{
    return mg_gpu_count_given(env, proc, dev, how, cap);
}

static void test_cuda(void)
{
    char how[512];
    char *two[] = {"CUDA_VISIBLE_DEVICES=2,3", "NVIDIA_VISIBLE_DEVICES=all", "SLURM_GPUS_ON_NODE=4",
                   NULL};
    is_int(count4(two, how, sizeof(how)), 2, "CUDA_VISIBLE_DEVICES first: 2 of 4");
    is_str(how, "CUDA_VISIBLE_DEVICES=2,3", "  says so");
    char *hide[] = {"CUDA_VISIBLE_DEVICES=", NULL};
    is_int(count4(hide, how, sizeof(how)), 0, "CUDA_VISIBLE_DEVICES='' hides them");
    ok(strstr(how, "hides all 4 GPUs") != NULL, "  says so: %s", how);
    char *nogpu[] = {"CUDA_VISIBLE_DEVICES=0", NULL};
    is_int(mg_gpu_count_given(nogpu, proc, none, how, sizeof(how)), 0,
           "CUDA_VISIBLE_DEVICES=0 on a machine without a GPU: none");
    ok(strstr(how, "no NVIDIA GPU") != NULL, "  says so: %s", how);
}

static void test_nvidia(void)
{
    char how[512], dir[400];
    char *uuids[] = {"NVIDIA_VISIBLE_DEVICES=GPU-8f3a1c2e-0000,GPU-2c1b0000-1111",
                     "SLURM_GPUS_ON_NODE=8", NULL};
    is_int(count4(uuids, how, sizeof(how)), 2, "a pod's two GPUs by UUID (the device plugin)");
    char *idx[] = {"NVIDIA_VISIBLE_DEVICES=1", NULL};
    is_int(count4(idx, how, sizeof(how)), 1, "one GPU by index");
    char *all[] = {"NVIDIA_VISIBLE_DEVICES=all", NULL};
    is_int(count4(all, how, sizeof(how)), 4, "all: the devices the container has");
    is_int(mg_gpu_count_given(all, proc, none, how, sizeof(how)), 0,
           "all in a container without GPUs (a CUDA image on a CPU node): none");
    ok(strstr(how, "NVIDIA_VISIBLE_DEVICES=all") != NULL, "  says so: %s", how);
    const char *nothing[] = {"none", "void", ""};
    for (size_t i = 0; i < 3; i++) {
        char var[64];
        snprintf(var, sizeof(var), "NVIDIA_VISIBLE_DEVICES=%s", nothing[i]);
        char *env[] = {var, NULL};
        is_int(count4(env, how, sizeof(how)), 0, "%s: no GPU", var);
        ok(strstr(how, "given no GPU") != NULL, "  says so: %s", how);
    }
    /* The device plugin's volume-mounts strategy. */
    snprintf(dir, sizeof(dir), "%s/nvidia-container-devices", tmp);
    mkdir(dir, 0755);
    touch(dir, "GPU-aaaa");
    touch(dir, "GPU-bbbb");
    touch(dir, "GPU-cccc");
    char var[500];
    snprintf(var, sizeof(var), "NVIDIA_VISIBLE_DEVICES=%s", dir);
    char *mounts[] = {var, NULL};
    is_int(count4(mounts, how, sizeof(how)), 3, "a directory of device files: 3");
    snprintf(var, sizeof(var), "NVIDIA_VISIBLE_DEVICES=%s/missing", tmp);
    is_int(count4(mounts, how, sizeof(how)), -EINVAL, "a directory that is not there: an error");
    ok(strstr(how, "cannot list it") != NULL, "  says why: %s", how);
    char *bad[] = {"NVIDIA_VISIBLE_DEVICES=0,,1", NULL};
    is_int(count4(bad, how, sizeof(how)), -EINVAL, "a malformed list: an error");
    ok(strstr(how, "NVIDIA_VISIBLE_DEVICES='0,,1'") != NULL, "  names it: %s", how);
}

static void test_slurm(void)
{
    char how[512];
    char *step[] = {"SLURM_STEP_GPUS=4,5,6", "SLURM_GPUS_ON_NODE=8",
                    "SLURM_JOB_GPUS=0,1,2,3,4,5,6,7", NULL};
    is_int(count4(step, how, sizeof(how)), 3, "the step's GPUs first");
    is_str(how, "SLURM_STEP_GPUS=4,5,6", "  says so");
    char *count[] = {"SLURM_GPUS_ON_NODE=8", "SLURM_JOB_GPUS=0,1", NULL};
    is_int(count4(count, how, sizeof(how)), 8, "SLURM_GPUS_ON_NODE (srun --gpus-per-node=8)");
    char *job[] = {"SLURM_JOB_GPUS=0,1", NULL};
    is_int(count4(job, how, sizeof(how)), 2, "the job's GPUs last");
    char *empty[] = {"SLURM_STEP_GPUS=", "SLURM_GPUS_ON_NODE=2", NULL};
    is_int(count4(empty, how, sizeof(how)), 2, "an empty one counts as unset");
    char *zero[] = {"SLURM_GPUS_ON_NODE=0", NULL};
    is_int(count4(zero, how, sizeof(how)), 0, "SLURM_GPUS_ON_NODE=0: none, though the node has 4");
    char *bad[] = {"SLURM_GPUS_ON_NODE=two", NULL};
    is_int(count4(bad, how, sizeof(how)), -EINVAL, "a count that is not one: an error");
    ok(strstr(how, "SLURM_GPUS_ON_NODE='two'") != NULL, "  names it: %s", how);
    char *badlist[] = {"SLURM_STEP_GPUS=0,", NULL};
    is_int(count4(badlist, how, sizeof(how)), -EINVAL, "a malformed list: an error");
}

static void test_machine(void)
{
    char how[512];
    char *env[] = {"PATH=/bin", NULL};
    is_int(count4(env, how, sizeof(how)), 4, "nothing set: the machine's devices");
    is_int(mg_gpu_count_given(env, proc, none, how, sizeof(how)), 0, "none on a CPU machine");
    ok(strstr(how, "no NVIDIA GPU") != NULL && strstr(how, "SLURM_") != NULL,
       "  says where it looked: %s", how);
}

/* --nproc_per_node gpu|auto with a host as gpus.c would describe it. */
static void test_nproc(void)
{
    struct mg_launch_opts o;
    char err[512];
    char *gpu[] = {"mglaunch", "--nproc_per_node", "gpu", "prog", NULL};
    char *autov[] = {"mglaunch", "--nproc_per_node", "auto", "prog", NULL};
    struct mg_host_info four = {.ncpu = 6, .ngpu = 4};
    struct mg_host_info zero = {.ncpu = 6, .ngpu = 0, .no_gpu_why = "SLURM_GPUS_ON_NODE=0"};
    struct mg_host_info bad = {
        .ncpu = 6, .ngpu = -EINVAL, .no_gpu_why = "SLURM_GPUS_ON_NODE='two': expected a GPU count"};

    if (mg_opts_parse(&o, 4, gpu, NULL, err, sizeof(err)))
        BAIL_OUT("options: %s", err);
    is_int(mg_opts_resolve(&o, &four, err, sizeof(err)), 0, "gpu with 4 GPUs");
    is_int(o.nproc, 4, "  4 workers");
    mg_opts_release(&o);
    mg_opts_parse(&o, 4, gpu, NULL, err, sizeof(err));
    is_int(mg_opts_resolve(&o, &zero, err, sizeof(err)), -EINVAL, "gpu without a GPU: an error");
    ok(strstr(err, "no GPU found (SLURM_GPUS_ON_NODE=0)") != NULL, "  says why: %s", err);
    mg_opts_release(&o);
    mg_opts_parse(&o, 4, gpu, NULL, err, sizeof(err));
    is_int(mg_opts_resolve(&o, &bad, err, sizeof(err)), -EINVAL, "gpu when they cannot be counted");
    ok(strstr(err, "cannot count the GPUs: SLURM_GPUS_ON_NODE='two'") != NULL, "  says why: %s",
       err);
    mg_opts_release(&o);

    mg_opts_parse(&o, 4, autov, NULL, err, sizeof(err));
    is_int(mg_opts_resolve(&o, &zero, err, sizeof(err)), 0, "auto without a GPU");
    is_int(o.nproc, 6, "  one worker per CPU");
    mg_opts_release(&o);
    mg_opts_parse(&o, 4, autov, NULL, err, sizeof(err));
    is_int(mg_opts_resolve(&o, &bad, err, sizeof(err)), -EINVAL,
           "auto when they cannot be counted: an error, not a guess");
    ok(strstr(err, "invalid value 'auto'") != NULL, "  says so: %s", err);
    mg_opts_release(&o);
}

int main(void)
{
    if (!mkdtemp(tmp))
        BAIL_OUT("mkdtemp");
    snprintf(proc, sizeof(proc), "%s/proc", tmp);
    snprintf(dev, sizeof(dev), "%s/dev", tmp);
    snprintf(none, sizeof(none), "%s/none", tmp);
    mkdir(proc, 0755);
    mkdir(dev, 0755);
    mkdir(none, 0755);
    const char *devs[] = {"nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"};
    for (size_t i = 0; i < sizeof(devs) / sizeof(devs[0]); i++)
        touch(dev, devs[i]);
    test_cuda();
    test_nvidia();
    test_slurm();
    test_machine();
    test_nproc();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        diag("could not remove %s", tmp);
    return done_testing();
}
