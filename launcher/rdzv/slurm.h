/* Slurm support: hostlist expansion ("node[01-04,07],gpu[1-2]-ib") and the
 * multi-node settings derived from SLURM_* when the flags are absent. */
#ifndef MG_SLURM_H
#define MG_SLURM_H

#include "net.h"

#include <stddef.h>

#define MG_HOSTLIST_MAX_HOSTS 65536 /* hosts one list may expand to */
#define MG_HOSTLIST_MAX_TEXT  65536 /* longest hostlist text accepted */

/* Expands a hostlist into at most max host names (each < MG_HOST_MAX bytes).
 * *hosts is a malloc'd array of malloc'd strings, free with mg_hostlist_free.
 * Returns -EINVAL for a malformed list, -E2BIG past max hosts or a name over
 * MG_HOST_MAX, -ENOMEM. Several bracket groups in one name expand as a
 * product, the last group varying fastest, as Slurm does. */
int mg_hostlist_expand(const char *list, int max, char ***hosts, int *n);
void mg_hostlist_free(char **hosts, int n);

struct mg_slurm {
    int nnodes;    /* SLURM_STEP_NUM_NODES, else SLURM_NNODES / SLURM_JOB_NUM_NODES */
    int node_rank; /* SLURM_NODEID */
    char master_addr[MG_HOST_MAX]; /* first host of the step's (or job's) node list */
    char job_id[64];               /* SLURM_JOB_ID (a natural rendezvous id), "" if unset */
};

/* Reads the Slurm variables from env (NULL = the process environment).
 * Returns 1 and fills out when running under Slurm with a node list, 0 when
 * not under Slurm (no SLURM_NODEID or no node count), -EINVAL with a message
 * in err when the variables are inconsistent. */
int mg_slurm_detect(char *const *env, struct mg_slurm *out, char *err, size_t errlen);

#endif
