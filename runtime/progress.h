/* libmg's side of the progress record (common/progress_rec.h): where the worker
 * tells mglaunch's watchdog that it moves, and its flight recorder of
 * collectives. The record is the memory mglaunch lends the rank
 * (MG_PROGRESS_FD); without it (another launcher, mglaunch --hang-timeout 0)
 * every call here returns at once. A call costs a few stores and a read of
 * the vDSO clock: no system call. */
#ifndef MG_RT_PROGRESS_H
#define MG_RT_PROGRESS_H

#include "progress_rec.h"

#include <stdint.h>

/* Maps the record from MG_PROGRESS_FD, once per process. 0 (also when the
 * variable is unset: nothing is recorded), or -EINVAL for a value that names
 * no usable descriptor (the watchdog then sees no record). */
int mg_progress_open(void);
/* Who writes it, and the collective timeout (the watchdog's last resort). */
void mg_progress_identify(int rank, int coll_timeout_ms);
void mg_progress_phase(enum mg_progress_phase ph);
/* The step (optimizer update) begins / ends: the watchdog's bound follows
 * the slowest recent steps. */
void mg_progress_step_begin(void);
void mg_progress_step_end(int64_t steps_done);
/* Progress without a change of phase (an evaluation batch, a checkpoint's
 * section). */
void mg_progress_beat(void);
/* Where this attempt's training goes on from, once, after the resume:
 * src_rank / src_world / path as struct mg_progress_resume has them (path
 * NULL unless from disk). The agent writes it into its event log. */
void mg_progress_resumed(enum mg_progress_from from, int64_t step, int64_t epoch, int src_rank,
                         int src_world, const char *path);
/* DDP's bucket of the next collective (-1: none). */
void mg_progress_next_bucket(int bucket);
/* A collective starts: its sequence number for mg_progress_coll_end (0
 * without a record). */
uint64_t mg_progress_coll_begin(enum mg_progress_op op, uint64_t bytes);
void mg_progress_coll_end(uint64_t seq, int rc);

#endif
