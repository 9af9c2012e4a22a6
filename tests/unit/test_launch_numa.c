/* --numa-binding's placement (launcher/numa.c) and the GPU facts it rests on
 * (launcher/gpus.c: PCI order, UUIDs, Intel GPUs for nproc xpu, the device
 * of --virtual-local-rank), against a sysfs/procfs tree built here: a
 * machine with 4 GPUs on 2 NUMA nodes of one socket, 16 CPUs as 8 cores with
 * 2 threads, and 2 L3 caches per node. This machine has no GPU, so the
 * placement cannot be checked on the real sysfs; the files read are the
 * ones the kernel provides, with the kernel's formats.
 * timeout: 30 */
#include "gpus.h"
#include "numa.h"
#include "opts.h"
#include "tap.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[512];

/* dst = a + b, cut to cap (paths here are short). */
static void join(char *dst, size_t cap, const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    if (na >= cap)
        na = cap - 1;
    if (na + nb >= cap)
        nb = cap - 1 - na;
    memmove(dst, a, na);
    memcpy(dst + na, b, nb);
    dst[na + nb] = '\0';
}

static void put(const char *text, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Writes text to root/<path>, making the directories on the way. */
static void put(const char *text, const char *fmt, ...)
{
    char rel[512], path[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rel, sizeof(rel), fmt, ap);
    va_end(ap);
    snprintf(path, sizeof(path), "%s%s", root, rel);
    for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
        *p = '\0';
        mkdir(path, 0755);
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%s\n", text);
        fclose(f);
    }
}

static const char *const gpus[] = {"0000:1a:00.0", "0000:3b:00.0", "0000:86:00.0", "0000:af:00.0"};

static void build_machine(void)
{
    char text[64];
    for (int g = 0; g < 4; g++) {
        snprintf(text, sizeof(text), "Model: \t NVIDIA H100\nGPU UUID: \t GPU-%c%c%c%c-1111",
                 'a' + g, 'a' + g, 'a' + g, 'a' + g);
        put(text, "/proc/driver/nvidia/gpus/%s/information", gpus[g]);
        put(g < 2 ? "0" : "1", "/sys/bus/pci/devices/%s/numa_node", gpus[g]);
        put("0x10de", "/sys/bus/pci/devices/%s/vendor", gpus[g]);
    }
    put("0-3,8-11", "/sys/devices/system/node/node0/cpulist");
    put("4-7,12-15", "/sys/devices/system/node/node1/cpulist");
    put("0-15", "/sys/devices/system/cpu/online");
    for (int c = 0; c < 16; c++) {
        int core = c % 8;
        /* one socket holding both nodes (AMD's NPS2 looks like this) */
        put("0", "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", c);
        snprintf(text, sizeof(text), "%d,%d", core, core + 8);
        put(text, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
        put("1", "/sys/devices/system/cpu/cpu%d/cache/index0/level", c);
        put(text, "/sys/devices/system/cpu/cpu%d/cache/index0/shared_cpu_list", c);
        put("2", "/sys/devices/system/cpu/cpu%d/cache/index2/level", c);
        put(text, "/sys/devices/system/cpu/cpu%d/cache/index2/shared_cpu_list", c);
        int cc = core / 2 * 2; /* two cores per L3 */
        snprintf(text, sizeof(text), "%d-%d,%d-%d", cc, cc + 1, cc + 8, cc + 9);
        put("3", "/sys/devices/system/cpu/cpu%d/cache/index3/level", c);
        put(text, "/sys/devices/system/cpu/cpu%d/cache/index3/shared_cpu_list", c);
    }
}

static const char *cpus(const struct mg_numa_place *p)
{
    static char buf[8][128];
    static int k;
    k = (k + 1) % 8;
    mg_numa_cpus_text(&p->cpus, buf[k], sizeof(buf[k]));
    return buf[k];
}

static struct mg_launch_opts o;
static char err[512];

static int opts(const char *gpu_ids)
{
    char *argv[] = {"mglaunch", "--gpu_ids", (char *)gpu_ids, "prog", NULL};
    char *argv0[] = {"mglaunch", "prog", NULL};
    mg_opts_release(&o);
    return gpu_ids ? mg_opts_parse(&o, 4, argv, NULL, err, sizeof(err))
                   : mg_opts_parse(&o, 2, argv0, NULL, err, sizeof(err));
}

int main(void)
{
    char pci[8][32], list[8][32], one[32], dev[64];
    struct mg_numa_place pl[8];

    snprintf(root, sizeof(root), "%s/mgnuma.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(root))
        skip_all("no temporary directory");
    build_machine();

    is_int(mg_gpu_pci_list(root, list, 8), 4, "4 GPUs in /proc/driver/nvidia/gpus");
    ok(strcmp(list[0], gpus[0]) == 0 && strcmp(list[3], gpus[3]) == 0, "in PCI bus order");
    is_int(mg_gpu_pci_of(root, "2", one, sizeof(one)), 0, "GPU index 2");
    is_str(one, gpus[2], "  is the third in bus order");
    is_int(mg_gpu_pci_of(root, "GPU-bbbb-1111", one, sizeof(one)), 0, "a GPU- UUID");
    is_str(one, gpus[1], "  matched in the information file");
    is_int(mg_gpu_pci_of(root, "MIG-1234", one, sizeof(one)), -EINVAL, "a MIG instance");
    is_int(mg_gpu_pci_of(root, "4", one, sizeof(one)), -ENOENT, "index 4 is not there");

    /* which GPU each rank has */
    opts(NULL);
    is_int(mg_numa_gpus(root, &o, 4, NULL, pci, err, sizeof(err)), 0, "ranks 0-3, no variables");
    is_str(pci[3], gpus[3], "  rank 3 on GPU 3");
    is_int(mg_numa_gpus(root, &o, 2, "3, 2", pci, err, sizeof(err)), 0,
           "CUDA_VISIBLE_DEVICES=3, 2");
    ok(strcmp(pci[0], gpus[3]) == 0 && strcmp(pci[1], gpus[2]) == 0, "  rank 0 on GPU 3, 1 on 2");
    is_int(mg_numa_gpus(root, &o, 3, "3,2", pci, err, sizeof(err)), -ENOENT, "3 ranks, 2 GPUs");
    ok(strstr(err, "local rank 2 has no GPU: CUDA_VISIBLE_DEVICES='3,2'") != NULL, "  %s", err);
    opts("1,GPU-dddd-1111");
    is_int(mg_numa_gpus(root, &o, 2, "0", pci, err, sizeof(err)), 0, "--gpu_ids wins");
    ok(strcmp(pci[0], gpus[1]) == 0 && strcmp(pci[1], gpus[3]) == 0, "  by index and by UUID");
    opts("7");
    is_int(mg_numa_gpus(root, &o, 1, NULL, pci, err, sizeof(err)), -ENOENT, "--gpu_ids 7");
    ok(strstr(err, "local rank 0's GPU 7 (from --gpu_ids) is not on this machine") != NULL, "  %s",
       err);

    /* placements: ranks 0,1 on node 0, ranks 2,3 on node 1 */
    opts(NULL);
    mg_numa_gpus(root, &o, 4, NULL, pci, err, sizeof(err));
    is_int(mg_numa_plan(root, MG_NUMA_NODE, 4, pci, pl, err, sizeof(err)), 0, "node");
    is_str(cpus(&pl[0]), "0-3,8-11", "  rank 0: node 0's CPUs");
    is_str(cpus(&pl[3]), "4-7,12-15", "  rank 3: node 1's CPUs");
    ok(pl[0].node == 0 && pl[3].node == 1, "  memory from the GPU's node");
    is_int(mg_numa_plan(root, MG_NUMA_SOCKET, 4, pci, pl, err, sizeof(err)), 0, "socket");
    is_str(cpus(&pl[0]), "0-15", "  rank 0: the whole socket (both nodes)");
    ok(pl[2].node == 1, "  memory still from the GPU's node");
    is_int(mg_numa_plan(root, MG_NUMA_EXCLUSIVE, 4, pci, pl, err, sizeof(err)), 0, "exclusive");
    is_str(cpus(&pl[0]), "0-1,8-9", "  rank 0: the first half of node 0's cores, with threads");
    is_str(cpus(&pl[1]), "2-3,10-11", "  rank 1: the other half");
    is_str(cpus(&pl[2]), "4-5,12-13", "  rank 2: the first half of node 1's");
    is_int(mg_numa_plan(root, MG_NUMA_CORE_COMPLEX, 4, pci, pl, err, sizeof(err)), 0,
           "core-complex");
    is_str(cpus(&pl[0]), "0-1,8-9", "  rank 0: node 0's first L3");
    is_str(cpus(&pl[1]), "2-3,10-11", "  rank 1: its second L3");
    is_str(cpus(&pl[3]), "6-7,14-15", "  rank 3: node 1's second L3");
    {
        char same[5][32];
        for (int i = 0; i < 5; i++)
            snprintf(same[i], sizeof(same[i]), "%s", gpus[0]);
        is_int(mg_numa_plan(root, MG_NUMA_EXCLUSIVE, 5, same, pl, err, sizeof(err)), -EINVAL,
               "exclusive: 5 workers on a node of 4 cores");
        ok(strstr(err, "NUMA node 0 has 4 cores for 5 workers") != NULL, "  %s", err);
        is_int(mg_numa_plan(root, MG_NUMA_CORE_COMPLEX, 5, same, pl, err, sizeof(err)), 0,
               "core-complex: 5 workers share node 0's 2 L3 caches");
        is_str(cpus(&pl[4]), "0-1,8-9", "  rank 4 goes round to the first again");
    }

    /* a GPU whose device does not say its node, on a machine without NUMA in sysfs */
    {
        char saved[512];
        join(saved, sizeof(saved), root, "");
        join(root, sizeof(root), saved, "/flat");
        mkdir(root, 0755);
        put("-1", "/sys/bus/pci/devices/%s/numa_node", gpus[0]);
        put("x", "/proc/driver/nvidia/gpus/%s/information", gpus[0]);
        put("0-5", "/sys/devices/system/cpu/online");
        is_int(mg_numa_gpus(root, &o, 1, NULL, pci, err, sizeof(err)), 0, "one GPU, no NUMA");
        is_int(mg_numa_plan(root, MG_NUMA_NODE, 1, pci, pl, err, sizeof(err)), 0, "node");
        is_str(cpus(&pl[0]), "0-5", "  every online CPU");
        join(root, sizeof(root), saved, "");
    }

    /* no GPU at all: say so */
    {
        char none[600];
        join(none, sizeof(none), root, "/none");
        mkdir(none, 0755);
        is_int(mg_numa_gpus(none, &o, 1, NULL, pci, err, sizeof(err)), -ENODEV, "no GPU");
        ok(strstr(err, "no NVIDIA GPU in") && strstr(err, "the binding follows each worker's GPU"),
           "  %s", err);
    }

    /* --nproc_per_node xpu: DRM cards bound to i915 or xe */
    {
        char path[600];
        put("x", "/sys/bus/pci/drivers/i915/uevent");
        put("x", "/sys/bus/pci/drivers/xe/uevent");
        put("x", "/sys/bus/pci/drivers/nouveau/uevent");
        const char *cards[] = {"card0", "card1", "card2"};
        const char *drv[] = {"i915", "xe", "nouveau"};
        for (int i = 0; i < 3; i++) {
            put("x", "/sys/class/drm/%s/uevent", cards[i]);
            snprintf(path, sizeof(path), "%s/sys/class/drm/%s/device", root, cards[i]);
            mkdir(path, 0755);
            char target[600];
            snprintf(target, sizeof(target), "%s/sys/bus/pci/drivers/%s", root, drv[i]);
            snprintf(path, sizeof(path), "%s/sys/class/drm/%s/device/driver", root, cards[i]);
            ok(symlink(target, path) == 0, "%s bound to %s", cards[i], drv[i]);
        }
        put("x", "/sys/class/drm/card0-HDMI-A-1/uevent");
        char why[200] = "";
        is_int(mg_xpu_count(root, why, sizeof(why)), 2, "2 Intel GPUs (i915, xe), not nouveau");
        char none[600];
        join(none, sizeof(none), root, "/none");
        is_int(mg_xpu_count(none, why, sizeof(why)), 0, "none on an empty tree");
        ok(strstr(why, "/sys/class/drm: no GPU driver loaded") != NULL, "  %s", why);
    }

    /* --virtual-local-rank's device per worker */
    opts(NULL);
    is_int(mg_virtual_device(&o, NULL, 2, dev, sizeof(dev)), 0, "no CUDA_VISIBLE_DEVICES");
    is_str(dev, "2", "  local rank 2 sees GPU 2");
    is_int(mg_virtual_device(&o, "5, 7", 1, dev, sizeof(dev)), 0, "CUDA_VISIBLE_DEVICES=5, 7");
    is_str(dev, "7", "  local rank 1 sees 7");
    is_int(mg_virtual_device(&o, "5", 1, dev, sizeof(dev)), -ENOENT, "too few entries");
    opts("GPU-x,3");
    is_int(mg_virtual_device(&o, "5", 1, dev, sizeof(dev)), 0, "--gpu_ids wins");
    is_str(dev, "3", "  local rank 1 sees its --gpu_ids entry");
    mg_opts_release(&o);

    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    if (system(cmd) != 0)
        diag("could not remove %s", root);
    return done_testing();
}
