/* What opts.c (the option table, reading argv and the environment) and
 * opts_check.c (turning the values into fields, the checks between them)
 * share. */
#ifndef MG_OPTS_INTERNAL_H
#define MG_OPTS_INTERNAL_H

#include "opts.h"

#include <stddef.h>

enum opt_id {
    O_NNODES,
    O_NPROC,
    O_RDZV_BACKEND,
    O_RDZV_ENDPOINT,
    O_RDZV_ID,
    O_RDZV_CONF,
    O_STANDALONE,
    O_MAX_RESTARTS,
    O_MONITOR_INTERVAL,
    O_START_METHOD,
    O_ROLE,
    O_MODULE,
    O_NO_PYTHON,
    O_RUN_PATH,
    O_LOG_DIR,
    O_REDIRECTS,
    O_TEE,
    O_NODE_RANK,
    O_MASTER_ADDR,
    O_MASTER_PORT,
    O_LOCAL_ADDR,
    O_LOGS_SPECS,
    O_RANKS_FILTER,
    O_PREFIX_TMPL,
    O_GPU_IDS,
    O_SHUTDOWN_TIMEOUT,
    O_STOP_GROUP_DELAY,
    O_EXIT_BARRIER_TIMEOUT,
    O_HANG_TIMEOUT,
    O_SIGNALS_TO_HANDLE,
    O_VIRTUAL_LOCAL_RANK,
    O_NUMA_BINDING,
    O_EVENT_LOG_HANDLER,
    O_DUP_STDOUT,
    O_DUP_STDERR,
    O_HELP,
    O_VERSION,
    O_COUNT
};

struct seen {
    int set;
    int from_env;
    const char *val;
    char src[64]; /* the spelling used: "--nproc-per-node", "-r", "PET_TEE" */
};

struct parse {
    struct mg_launch_opts *o;
    struct seen s[O_COUNT];
    char *err;
    size_t errcap;
};

/* Sets p's error (-EINVAL) and returns -EINVAL. */
__attribute__((format(printf, 2, 3))) int mg_opts_fail(struct parse *p, const char *fmt, ...);
/* "--nproc_per_node" or "PET_NPROC_PER_NODE (--nproc_per_node)": how the
 * user gave option id. */
const char *mg_opts_label(struct parse *p, int id, char *buf, size_t cap);
/* "invalid value 'VAL' for LABEL: WHY"; returns -EINVAL. */
int mg_opts_bad_value(struct parse *p, int id, const char *val, const char *why);
/* Strict decimal numbers in [min, max]: 0, or -EINVAL. */
int mg_opts_parse_int(const char *s, long min, long max, int *out);
int mg_opts_parse_double(const char *s, double min, double max, double *out);

/* Turns the recorded strings into p->o's values, in the order of the table
 * (opts_check.c). 0, or a negative code with p's error set. */
int mg_opts_check_values(struct parse *p);

#endif
