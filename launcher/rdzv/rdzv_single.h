/* The single-node rendezvous (--nnodes 1, with --rdzv_backend static or c10d,
 * or --standalone): this node is group rank 0 of 1, WORLD_SIZE is nproc,
 * MASTER_ADDR is --master_addr (default 127.0.0.1), and MASTER_PORT is
 * --master_port or, by default, a free port it binds afresh each round and
 * hands to the agent (mg_group.master_fd), so that the port stays reserved
 * until the workers start. Nothing to meet, so no store and no network. */
#ifndef MG_RDZV_SINGLE_H
#define MG_RDZV_SINGLE_H

#include "agent.h"
#include "opts.h"

extern const struct mg_rdzv_ops mg_rdzv_single_ops;

/* Creates the backend: *ops is &mg_rdzv_single_ops. notice (NULL: none) is
 * kept for mg_rdzv_single_notice. 0 or -ENOMEM. */
int mg_rdzv_single_create(const struct mg_launch_opts *o, const char *notice,
                          const struct mg_rdzv_ops **ops, void **impl);
/* The notice given at creation, or NULL. */
const char *mg_rdzv_single_notice(void *impl);
/* The run id to use instead of mglaunch's own (a Slurm job's), or NULL. */
void mg_rdzv_single_set_run_id(void *impl, const char *id);
const char *mg_rdzv_single_run_id(void *impl);

#endif
