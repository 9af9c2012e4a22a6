/* mglaunch's command line: torchrun's flags with torchrun's meanings, mg's own
 * flags, PET_<FLAG> environment fallbacks, and the checks that turn a bad value
 * into a one-line error (docs/cli.md is the user-facing reference).
 *
 * Parsing is pure: it reads argv and the given environment array and never
 * prints. Errors come back as a negative code plus a message in err (without
 * the "mglaunch: " prefix); main prints it and exits 2. */
#ifndef MG_OPTS_H
#define MG_OPTS_H

#define MG_HANG_TIMEOUT_DEFAULT 10.0

#include "mg_err.h"
#include "net.h"

#include <stddef.h>

#define MG_MAX_NPROC       4096
#define MG_MAX_NNODES      65536
#define MG_STDMAP_MAX      256  /* entries in a per-rank -r/-t map */
#define MG_RUN_ID_MAX      128  /* run ids become directory names */
#define MG_GPU_IDS_MAX     4096 /* bytes of all --gpu_ids values joined */
#define MG_GPU_ID_LEN      96   /* one id: an index or a GPU-/MIG- UUID */
#define MG_PREFIX_TMPL_MAX 256

/* Which standard streams a -r/-t setting selects (torchrun's Std flags). */
enum mg_std {
    MG_STD_NONE = 0,
    MG_STD_OUT = 1,
    MG_STD_ERR = 2,
    MG_STD_ALL = 3,
};

/* A -r/-t value: one setting for every local rank ("3"), or a map
 * ("0:3,1:1"); ranks missing from a map get MG_STD_NONE. */
struct mg_stdmap {
    int is_map;
    int all;
    int n;
    struct {
        int rank;
        int val;
    } e[MG_STDMAP_MAX];
};

int mg_stdmap_parse(const char *s, struct mg_stdmap *m);
int mg_stdmap_get(const struct mg_stdmap *m, int local_rank);

enum mg_nproc_kind {
    MG_NPROC_NUM,
    MG_NPROC_CPU,
    MG_NPROC_GPU,
    MG_NPROC_XPU, /* torchrun 2.x: one per Intel GPU */
    MG_NPROC_AUTO,
};

/* --numa-binding (torchrun 2.x's AffinityMode): how a worker is bound to the
 * CPUs near its GPU (launcher/numa.h). */
enum mg_numa_mode {
    MG_NUMA_NONE,
    MG_NUMA_NODE,         /* every CPU of the GPU's NUMA node */
    MG_NUMA_SOCKET,       /* every CPU of the socket holding that node */
    MG_NUMA_EXCLUSIVE,    /* a share of the node's cores no other worker gets */
    MG_NUMA_CORE_COMPLEX, /* the CPUs of one L3 cache (core complex) in the node */
};

#define MG_MAX_SIGNALS 16 /* --signals-to-handle entries */
#define MG_MAX_FILTERS 64 /* --duplicate-std*-filters entries */

/* Everything the command line said, checked for syntax. */
struct mg_launch_opts {
    enum mg_nproc_kind nproc_kind;
    int nproc; /* MG_NPROC_NUM: the number; after mg_opts_resolve: always */
    int nnodes_min, nnodes_max;
    int nnodes_given; /* --nnodes (or PET_NNODES) was given: no Slurm default */
    const char *rdzv_backend;
    const char *rdzv_endpoint;
    const char *rdzv_id;   /* NULL: generated at start */
    const char *rdzv_conf; /* NULL: none (checked by launcher/rdzv/rdzv_conf.c) */
    int standalone;
    int max_restarts;
    double monitor_interval;
    const char *start_method;
    const char *role;
    int module, no_python;
    const char *log_dir; /* NULL: the private default (docs/logs.md) */
    struct mg_stdmap redirects, tee;
    int node_rank;
    int node_rank_given;
    const char *master_addr; /* NULL: 127.0.0.1; "[v6]" given: without the brackets */
    const char *local_addr;  /* NULL: this node's advertised address is found out */
    int master_port;         /* -1 or 0: a free port chosen per attempt */
    int *ranks_filter;       /* --local_ranks_filter, NULL = every rank */
    int nranks_filter;
    const char *prefix_template;  /* NULL: "[${role_name}${local_rank}]:" */
    char gpu_ids[MG_GPU_IDS_MAX]; /* --gpu_ids values joined with ',' ("" = none) */
    int ngpu_ids;
    double shutdown_timeout; /* seconds before SIGKILL */
    /* A stop signal reaches the worker process first and the rest of its
     * process group (DataLoader workers, a writer's subprocess) this much
     * later, so that its helpers live while it saves; 0: all at once. */
    double stop_group_delay;
    /* torchrun's --exit-barrier-timeout (pytorch/pytorch#195543): how long a
     * finished node waits for the others; -1: --rdzv_conf's (300 s). */
    double exit_barrier_timeout;
    /* --hang-timeout: the watchdog's floor in seconds (0: off); a rank is
     * hung after max(this, MG_HANG_STEPS x its slowest recent step) without
     * progress (launcher/watchdog/). */
    double hang_timeout;
    /* --signals-to-handle: the signals that stop the workers (passed on,
     * SIGKILL after the grace period) and end the run with 128+N. */
    int signals[MG_MAX_SIGNALS];
    int nsignals;
    int signals_given;      /* given explicitly (then a signal ignored at start is handled too) */
    int virtual_local_rank; /* LOCAL_RANK=0, one GPU visible per worker */
    enum mg_numa_mode numa_binding; /* --numa-binding */
    const char *event_log_handler;  /* torchrun 2.x's; "null" by default, no effect */
    int run_path;                   /* --run_path: the program runs under python3 */
    char *dup_filters[2];           /* --duplicate-stdout/stderr-filters, '\0'-separated */
    int ndup_filters[2];
    int help, version;

    char **prog_argv; /* the program and its arguments (points into argv) */
    int prog_argc;

    /* Where a value came from, for messages ("--nproc-per-node", "PET_NPROC_PER_NODE"). */
    char nproc_src[192];
    char gpu_ids_src[192];
    char filter_src[192];
    char master_addr_buf[MG_HOST_MAX]; /* the addresses without their brackets */
    char local_addr_buf[MG_HOST_MAX];
};

/* What the machine has, for nproc cpu/gpu/auto and the GPU checks. */
struct mg_host_info {
    int ncpu;
    int ngpu;               /* GPUs this node was given (gpus.h); < 0: cannot be told */
    const char *no_gpu_why; /* when ngpu <= 0, why (for the message) */
    int nxpu;               /* Intel GPUs (nproc xpu) */
    const char *no_xpu_why;
};

/* Parses argv (argv[0] is the program name). env: the environment for PET_*
 * fallbacks (NULL = none). Returns 0, or -EINVAL (bad input) /
 * -MG_EUNSUPPORTED (a torchrun feature not implemented yet) with err set.
 * --help and --version set o->help / o->version and stop parsing. */
int mg_opts_parse(struct mg_launch_opts *o, int argc, char **argv, char **env, char *err,
                  size_t errcap);

/* Second step, once the host is known: fixes nproc for cpu/gpu/auto, checks
 * the GPU id list and the rank filter against nproc. */
int mg_opts_resolve(struct mg_launch_opts *o, const struct mg_host_info *host, char *err,
                    size_t errcap);

/* The i-th filter of --duplicate-stdout-filters (stream 0) or
 * --duplicate-stderr-filters (stream 1), or NULL past the last. */
const char *mg_opts_dup_filter(const struct mg_launch_opts *o, int stream, int i);

/* 1 when local_rank's output may reach the console (--local_ranks_filter). */
int mg_opts_rank_shown(const struct mg_launch_opts *o, int local_rank);

/* The i-th GPU id of o->gpu_ids into buf. Returns 0 or -ENOENT. */
int mg_opts_gpu_id(const struct mg_launch_opts *o, int i, char *buf, size_t cap);

void mg_opts_release(struct mg_launch_opts *o);

#endif
