/* The order of new nodes in a round: the index the scheduler gave the node
 * (JOB_COMPLETION_INDEX, SLURM_NODEID, SKYPILOT_NODE_RANK, VC_TASK_INDEX, a
 * pod name's ordinal), then its host name in natural order (mg-train-2
 * before mg-train-10). Schedulers that place by topology (Kueue, Slurm's
 * topology plugin) number nodes so that neighbouring indexes sit close
 * together; ranks that follow them keep ring neighbours close in the network.
 * docs/rendezvous.md#forming-the-group-rounds. */
#ifndef MG_RDZV_NODE_ORDER_H
#define MG_RDZV_NODE_ORDER_H

#include <stddef.h>

#define MG_NODE_INDEX_MAX 1000000 /* larger indexes are refused as malformed */

/* Compares host names as people number machines: runs of digits by value
 * (leading zeros ignored), the rest byte by byte; names equal that way
 * (node01, node1) by strcmp, so the order is total. */
int mg_rdzv_natcmp(const char *a, const char *b);

/* This node's scheduler index from env (NULL: the process environment) and
 * hostname: the first of JOB_COMPLETION_INDEX, SLURM_NODEID,
 * SKYPILOT_NODE_RANK, VC_TASK_INDEX that is set and not empty, else, in a
 * Kubernetes pod (KUBERNETES_SERVICE_HOST set), the ordinal that ends the pod's
 * host name ("mg-train-3": 3). Returns the index, -1 when there is none, or
 * -EINVAL for a variable that is not an integer from 0 to
 * MG_NODE_INDEX_MAX, with a message in err. *src names where the index came
 * from (a variable's name, "the pod name"); NULL allowed. */
int mg_rdzv_sched_index(char *const *env, const char *hostname, const char **src, char *err,
                        size_t errlen);

#endif
