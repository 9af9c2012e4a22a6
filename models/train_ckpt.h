/* The train program's side of "checkpoints belong to a run" (docs/train.md):
 * what identifies a run, whose --checkpoint-dir is, and whether it still is.
 * The records themselves (owner record, markers) are runtime/checkpoint.h's.
 *
 * Part of the program, not of libmg, but shaped like it: the functions
 * return a code and write their message into err (errlen bytes); the
 * program's own files (train_internal.h) print it. */
#ifndef MG_TRAIN_CKPT_H
#define MG_TRAIN_CKPT_H

#include "checkpoint.h"
#include "dist.h"
#include "train_args.h"

#include <stddef.h>
#include <stdint.h>

/* The lines a run's checkpoints record in CONFIG and a resume compares
 * (everything that must stay the same for a checkpoint to continue the run;
 * not the length, the world size or where the data lives), into config; and
 * the run's id into run_id: the launcher's run id, or for a run without one
 * (no launcher, or torchrun's default "none") "config-" and a hash of those
 * lines, so that the same command is the same run. train_n is the training
 * set's size; lr_scale what --scale-lr multiplied o->lr by. */
void train_describe_run(const struct train_options *o, int train_n, double lr_scale,
                        const struct mg_dist_env *env, char *config, size_t clen, char *run_id,
                        size_t idlen);

enum train_dir_claim {
    TRAIN_DIR_OURS,      /* this run's, or nothing of another run's in it */
    TRAIN_DIR_TAKE_OVER, /* another run's, and --resume said to continue it */
    TRAIN_DIR_OTHER_RUN, /* another run's, no --resume: this job's only when its
                            owner's newest checkpoint fits this run (the resume checks) */
    TRAIN_DIR_REFUSED,   /* whose cannot be told: the message in err says what to do */
};

/* Whose dir is, for the run (run hash, run id) started with --resume resume
 * (NULL: none). Fills own with the owner record to write once the run has
 * resumed: this run, with what it takes over (on TRAIN_DIR_OTHER_RUN, the
 * owner's runs: their checkpoints are the ones to check and continue). On
 * TRAIN_DIR_TAKE_OVER and TRAIN_DIR_OTHER_RUN, took_from names the earlier
 * owner and its newest step. Returns a train_dir_claim, or a negative code
 * with a message. Every rank decides the same from the same files, and what
 * rank 0 then writes leads to the same decision. */
int train_claim_dir(const char *dir, const char *resume, uint64_t run, const char *run_id,
                    struct mg_ckpt_owner *own, char *took_from, size_t tlen, char *err,
                    size_t errlen);

/* Before each checkpoint: 0 when dir's owner record still names own's run
 * (written again when someone removed it); -MG_ECONFIG with a message when
 * another run took the directory over or the record is unreadable. */
int train_dir_still_ours(const char *dir, const struct mg_ckpt_owner *own, char *err,
                         size_t errlen);

#endif
