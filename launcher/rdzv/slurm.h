/* Slurm support: hostlist expansion ("node[01-04,07],gpu[1-2]-ib"), the
 * multi-node settings derived from SLURM_* when the flags are absent, and the
 * shapes of a job that cannot work (more than one mglaunch per node,
 * mglaunch in the batch script of a multi-node job). */
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
    int in_step;                   /* SLURM_STEP_ID is set: a task of srun, not the batch script */
    int step_tasks;                /* SLURM_STEP_NUM_TASKS, 0 when unknown */
    /* "slurm", or "skypilot": SkyPilot sets SKYPILOT_NUM_NODES,
     * SKYPILOT_NODE_RANK and SKYPILOT_NODE_IPS (one address a line, node 0's
     * first) on each node of a cluster as Slurm sets its variables, and they
     * are read the same way, into the same fields (job_id: SKYPILOT_TASK_ID,
     * its characters outside [A-Za-z0-9._-] made '_'). */
    char scheduler[16];
    const char *vars; /* for messages: "SLURM_*" or "SKYPILOT_*" */
};

/* The first port of the per-job range and its size: a static rendezvous
 * under Slurm listens on MG_SLURM_PORT_BASE + the job id's last four digits
 * unless --master_port says otherwise, as PyTorch Lightning does, so that
 * jobs sharing a node do not all want 29500. */
#define MG_SLURM_PORT_BASE  15000
#define MG_SLURM_PORT_RANGE 10000

/* Reads the Slurm variables from env (NULL = the process environment).
 * Returns 1 and fills out when running under Slurm with a node list, or, when
 * not, on a SkyPilot cluster (see scheduler above); 0 when under neither (no
 * SLURM_NODEID or no node count, no SKYPILOT_NODE_RANK or
 * SKYPILOT_NUM_NODES), -EINVAL with a message in err when the variables are
 * inconsistent. */
int mg_slurm_detect(char *const *env, struct mg_slurm *out, char *err, size_t errlen);

/* Refuses the shapes in which mglaunch cannot do what the user wants: a step
 * with more tasks than nodes (each task would start its own workers: two
 * trainings, or agents clashing on one port), and, when the node layout is
 * to come from Slurm (layout_given 0: no --nnodes), the batch script of a
 * job of several nodes (it runs on the first node only, and the others would
 * never come). 0, or -EINVAL with err naming the srun line to use. */
int mg_slurm_check(const struct mg_slurm *s, int layout_given, char *err, size_t errlen);

/* The job's default port for a static rendezvous (MG_SLURM_PORT_BASE), or 0
 * without a numeric job id. */
int mg_slurm_default_port(const struct mg_slurm *s);

#endif
