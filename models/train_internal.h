/* What the parts of the train program share, and nobody else: the run being
 * trained (struct run) and the console and error helpers every part uses.
 * train.c is the outline (main: set-up, outputs, resume, loop, the end) and
 * prints errors; train_setup.c builds the run (backend, distributed context,
 * data, model, trainer); train_resume.c decides where it goes on from;
 * train_loop.c trains it (steps, reports, evaluation, checkpoints, the
 * summary); train_console.c holds the progress output and --profile-startup.
 * train_args.c, train_ckpt.c and train_out.c are the command line, the
 * checkpoint directory's ownership and the metrics, shaped like library code. */
#ifndef MG_TRAIN_INTERNAL_H
#define MG_TRAIN_INTERNAL_H

#include "backend.h"
#include "checkpoint.h"
#include "data.h"
#include "ddp.h"
#include "dist.h"
#include "mg_err.h"
#include "model.h"
#include "progress_rec.h"
#include "train_args.h"
#include "train_ckpt.h"
#include "train_out.h"
#include "trainer.h"
#include "snapshot/snapshot.h"

/* Exit statuses (docs/train.md, "Output"). */
#define EXIT_FAILURE_RUN 1 /* a failure while running */
#define EXIT_USAGE       2 /* a bad command line or configuration: do not retry */
#define EXIT_INCOMPLETE  3 /* trained to the end, but some output could not be written */
#define EXIT_DIVERGED    4 /* the loss became NaN or infinite */

#define SNAP_PROBES 16 /* --snapshot-every auto's timed steps, at most */

/* What a distributed run changes; a single process is rank 0 of 1 with no hooks. */
struct dist {
    int rank, world;
    struct mg_train_hooks hooks;
    struct mg_dist *d;  /* launcher environment, store, communicator */
    struct mg_ddp *ddp; /* NULL at world size 1 (unless MG_TEST_COMM_THREAD=1) */
    double lr_scale;    /* --scale-lr linear: the world size */
};

struct progress {
    int tty;
    double last_draw;
    int stdout_lost; /* a write to stdout failed (reported) */
};

/* ---- --profile-startup ------------------------------------------------------------------ */

/* Where the time between main() and the end of the first step goes, phase by
 * phase: what a restart pays again on every rank (docs/train.md). */
enum phase {
    PH_DIST,
    PH_BACKEND,
    PH_DATA,
    PH_MODEL,
    PH_RESUME,
    PH_SYNC,
    PH_STEP,
    PH_COUNT
};

struct profile {
    int on, printed;
    double wall0; /* main() on the real-time clock, seconds since the epoch */
    double t0;    /* main() on the monotonic clock */
    double mark;  /* end of the last phase */
    double ms[PH_COUNT];
};

struct run {
    struct train_options *o;
    struct dist dist;
    struct mg_backend *be;
    struct mg_dataset train, test;
    struct mg_model model;
    struct mg_trainer trainer;
    long total_steps;
    long epochs_total;
    struct progress prog;
    /* Who this run is (docs/train.md, "Checkpoints belong to a run") */
    char run_id[MG_CKPT_RUN_ID_MAX + 1];
    char run_config[MG_RUN_CONFIG_MAX];
    struct mg_ckpt_owner owner;              /* of --checkpoint-dir once resume() has claimed it */
    char took_from[MG_CKPT_RUN_ID_MAX + 96]; /* the run whose directory this one took over */
    int exit_code;                           /* a failure's own status (EXIT_DIVERGED), else 0 */
    int device_index;                        /* CUDA: LOCAL_RANK */
    char auto_why[MG_ERRMSG_LEN];            /* --device auto chose the CPU: why */
    struct train_out out;                    /* metrics and remote copies (train_out.h) */
    int out_failed;                          /* an output was lost (said once) */
    /* in-memory snapshots (train_snapshot*.c) */
    struct mg_snap snap;
    int snap_on;
    char snap_off[400];  /* when not on: why (told to the other ranks) */
    uint64_t snap_bytes; /* one snapshot's payload */
    double snap_time;    /* seconds spent copying them */
    long snap_count;
    long snap_every; /* the interval in force (--snapshot-every auto: decided early on) */
    long snap_start; /* the step this attempt began at */
    double snap_probe[SNAP_PROBES],
        step_probe[SNAP_PROBES]; /* auto: what early copies and steps took */
    /* ZeRO-1 on more than one node: each shard is copied to the next node too */
    int snap_peer_src;       /* the rank whose shard this rank keeps, or -1: no copies */
    uint64_t snap_shard;     /* bytes of a shard */
    unsigned char *snap_all; /* the exchange's room: this rank's shard (a shift), every rank's */
    long snap_test_stop;     /* MG_TEST_SNAPSHOT_STOP: the step whose ZeRO-1 copy stops, or -1 */
    /* where this attempt resumed from, for mglaunch's event log (resume_record) */
    int res_from;                    /* enum mg_progress_from; MG_FROM_UNSAID: step 0 */
    int res_src_rank, res_src_world; /* memory: whose snapshot (-1: each its own), at */
    char res_path[MG_CKPT_PATH_MAX]; /* disk: the checkpoint */
};

/* ---- train.c ---- */

extern struct mg_dist *error_dist; /* for the error file of fail() (rank, host) */
/* Says a failure once, on stderr, and records it in the launcher's error file. */
__attribute__((format(printf, 1, 2))) void fail(const char *fmt, ...);
struct run;
/* A failure every rank meets alike (a checkpoint directory of another job, a
 * checkpoint that does not fit): said once, by rank 0; the other ranks wait
 * for rank 0 to go, so that the launcher's root cause quotes its line. */
__attribute__((format(printf, 2, 3))) void fail_alike(struct run *r, const char *fmt, ...);

/* ---- train_console.c ---- */

extern struct profile prof;

void flush_stdout(struct progress *p);
__attribute__((format(printf, 2, 3))) void say(struct progress *p, const char *fmt, ...);
void draw_bar(struct progress *p, long step, long total, long epoch, long epochs, double loss,
              double lr, double rate, double eta);
void profile_start(void);
void profile_mark(enum phase ph);
void profile_print(int rank);
void check_output(struct run *r, int rc);

/* ---- train_setup.c ---- */

/* Builds r: backend, distributed context, data, model, DDP, trainer. */
/* DDP's options from the command line (the bucket caps decide ZeRO-1's layout). */
void train_ddp_opts(const struct run *r, struct mg_ddp_opts *d);
int setup(struct run *r);

/* ---- train_resume.c ---- */

int resume(struct run *r);
/* After a resume (from a checkpoint, or from memory): the step --epochs now
 * ends at, and on rank 0 what a reshard changed and "resumed from <what>"
 * (after "continuing this job's checkpoints" when continued). */
void resume_said(struct run *r, const char *what, int continued);
int check_resume(struct run *r);
/* Tells mglaunch (the progress record, MG_PROGRESS_FD) where this attempt
 * went on from, for its event log's "resume" event (docs/logs.md); once
 * every rank checked the resume (check_resume). */
void resume_record(struct run *r);

/* ---- train_snapshot.c (and train_snapshot_resume.c, train_snapshot_zero.c) ---- */

/* Maps the memory mglaunch lends this rank for snapshots, when --snapshot-every
 * is on and there is some; refuses (an error said) when two copies would be
 * more than allowed. */
int snapshot_open(struct run *r);
void snapshot_close(struct run *r);
/* After an optimizer step that took step_seconds: this rank's state into
 * memory, when one is due (with auto, the first steps also time it and the
 * ranks then agree on the interval: a collective at the same step on all). */
int snapshot_take(struct run *r, double step_seconds);
/* At the start of an attempt: resumes from the newest snapshot every rank
 * holds, when every rank's checks out and no checkpoint on disk is newer
 * (*resumed 1); otherwise says why once and leaves the resume to the disk. */
int snapshot_resume(struct run *r, int *resumed);

/* ---- train_loop.c ---- */

/* Trains to the end: steps, progress, evaluation, checkpoints, the summary. */
int run(struct run *r);
/* The loss sums since the last report (mg_trainer_sums), failing the run
 * (exit status 4) when a step's loss was NaN or infinite; reset: a report
 * takes them. */
int train_read_sums(struct run *r, struct mg_train_sums *s, int reset);

#endif
