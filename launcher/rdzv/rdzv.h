/* The rendezvous: how the agent forms the group of workers at each round.
 * mg_rdzv_create picks the backend for the options: the single-node one
 * (rdzv_single.h) for --nnodes 1 or --standalone, the multi-node one
 * (rdzv_multi.h: static across nodes, c10d on mg's store, etcd) for several
 * nodes, etcd, or a Slurm allocation of several nodes. Both implement struct
 * mg_rdzv_ops (agent.h), which the agent drives; the calls below are what
 * mglaunch asks of the chosen backend besides. */
#ifndef MG_RDZV_H
#define MG_RDZV_H

#include "agent.h"
#include "opts.h"

#include <stdio.h>

/* Picks and creates the backend for the options, after refusing the Slurm
 * shapes that cannot work (mg_slurm_check: -EINVAL). status is the launcher's
 * console for its own messages, as mg_agent_config.status (NULL: none): the
 * backend tells it, in "mglaunch: ..." lines, that an endpoint is still out of
 * reach while this call retries it, and what a join waits for. err gets a
 * message. */
int mg_rdzv_create(const struct mg_launch_opts *o, FILE *status, const struct mg_rdzv_ops **ops,
                   void **impl, char *err, size_t errcap);
/* A note or warning about the rendezvous settings for mglaunch to print, or NULL. */
const char *mg_rdzv_notice(const struct mg_rdzv_ops *ops, void *impl);
/* The run id the nodes agreed on (TORCHELASTIC_RUN_ID, the log directory),
 * when the backend chose one (multi-node: --rdzv_id, the Slurm job, "none";
 * one node: the Slurm job), or NULL to keep mglaunch's own. */
const char *mg_rdzv_run_id(const struct mg_rdzv_ops *ops, void *impl);

#endif
