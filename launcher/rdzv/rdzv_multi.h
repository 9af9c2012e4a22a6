/* The multi-node rendezvous as the agent's backend (struct mg_rdzv_ops in
 * agent.h): static across nodes, c10d on mg's store, etcd. It turns the
 * command line (and, when the flags are absent, SLURM_*) into a rendezvous,
 * drives the protocol (rdzv_proto.h) from the agent's timers, and maps its
 * events onto the agent's calls: group formed, restart (counted or not),
 * fail, and the exit barrier. docs/rendezvous.md is the user's guide. */
#ifndef MG_RDZV_MULTI_H
#define MG_RDZV_MULTI_H

#include "agent.h"
#include "opts.h"

#include <stddef.h>
#include <stdio.h>

/* 1 when the options (or a Slurm allocation of several nodes, when --nnodes
 * is absent) ask for more than the single-node backend; 0 otherwise. */
int mg_rdzv_multi_wanted(const struct mg_launch_opts *o, char *const *env);

/* Creates the backend: checks --rdzv_conf, derives what Slurm provides,
 * connects to etcd or the store (hosting it on the endpoint host), retrying
 * name resolution and refused connections until join_timeout. status (NULL:
 * none) is the launcher's console (rdzv.h). -EINVAL for a bad setting, other
 * codes for a backend that cannot be reached; err says which endpoint and
 * what failed. */
int mg_rdzv_multi_create(const struct mg_launch_opts *o, char *const *env, FILE *status,
                         const struct mg_rdzv_ops **ops, void **impl, char *err, size_t errcap);

/* Checks --rdzv_conf alone (a single-node run does not use it, but a
 * mistake in it is still an error). notes gets what the user should be told
 * about keys accepted without effect ("" when nothing; lines without the
 * "mglaunch: " prefix). 0 or -EINVAL with err set. */
int mg_rdzv_multi_check_conf(const struct mg_launch_opts *o, char *const *env, char *notes,
                             size_t notescap, char *err, size_t errcap);

/* A warning or note for the user about the settings (no --rdzv_id, values
 * taken from Slurm), or NULL. */
const char *mg_rdzv_multi_notice(void *impl);
/* The run id all nodes use (TORCHELASTIC_RUN_ID). */
const char *mg_rdzv_multi_run_id(void *impl);

#endif
