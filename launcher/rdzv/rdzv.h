/* Rendezvous backends: how the agent forms the group at each round.
 *
 * Implemented here: "local", the single-node case (--nnodes 1 with
 * --rdzv_backend static or c10d, or --standalone): this node is group rank 0
 * of 1, WORLD_SIZE is nproc, MASTER_ADDR is --master_addr (default
 * 127.0.0.1), and MASTER_PORT is --master_port or, by default, a free port
 * the backend binds and hands to the agent (mg_group.master_fd) so it stays
 * reserved until the workers start.
 *
 * Multi-node backends (static across nodes, c10d on mg's store, etcd) add a
 * case to mg_rdzv_create and implement struct mg_rdzv_ops (agent.h). */
#ifndef MG_RDZV_H
#define MG_RDZV_H

#include "agent.h"
#include "opts.h"

/* Picks and creates the backend for the options. err gets a message. */
int mg_rdzv_create(const struct mg_launch_opts *o, const struct mg_rdzv_ops **ops, void **impl,
                   char *err, size_t errcap);
/* A note or warning about the rendezvous settings for mglaunch to print, or NULL. */
const char *mg_rdzv_notice(const struct mg_rdzv_ops *ops, void *impl);
/* The run id the nodes agreed on (TORCHELASTIC_RUN_ID, the log directory),
 * when the backend chose one (multi-node: --rdzv_id, the Slurm job, "none"),
 * or NULL to keep mglaunch's own. */
const char *mg_rdzv_run_id(const struct mg_rdzv_ops *ops, void *impl);

#endif
