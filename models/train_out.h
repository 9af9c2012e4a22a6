/* What train writes besides the console and its checkpoints: rank 0's
 * metrics through libmg's metrics module (JSON lines, TensorBoard, CSV; see
 * docs/metrics.md), where they go by default under mglaunch, and which
 * earlier steps a restart replays. It also keeps rank 0's remote copies
 * (--upload, --upload-cmd; libmg's runtime/upload) fed: every complete
 * checkpoint, the metrics files and, at the end, the final checkpoint, laid
 * out at the destination as
 *   checkpoints/ckpt-<step>.mgc, checkpoints/ckpt-<step>.done, checkpoints/LATEST
 *   metrics/attempt_<n>/metrics.jsonl (or metrics/<name of --metrics FILE>)
 *   tensorboard/events.out.tfevents.*   csv/version_<N>/{metrics.csv,hparams.yaml}
 * and fetches the newest checkpoint back for --resume auto. Part of the
 * program, like train_args.c: it returns errors with their messages and
 * the program's own files (train_internal.h) print them.
 *
 * Under mglaunch (MG_RUN_LOG_DIR and MG_ATTEMPT set), rank 0 writes
 *   $MG_RUN_LOG_DIR/attempt_$MG_ATTEMPT/metrics.jsonl   (unless --metrics FILE)
 *   $MG_RUN_LOG_DIR/tensorboard/                        (--tensorboard without DIR)
 *   $MG_RUN_LOG_DIR/csv/version_<N>/                    (--csv without DIR)
 * one metrics file per attempt, never appended to by another, so `mglaunch
 * logs --plot` and the dashboard know each record's attempt. */
#ifndef MG_TRAIN_OUT_H
#define MG_TRAIN_OUT_H

#include "status/trainer_status.h"
#include "metrics/metrics.h"
#include "train_args.h"
#include "upload/upload.h"

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

struct train_out {
    struct mg_metrics *metrics;                        /* NULL: this rank writes no metrics */
    char jsonl[PATH_MAX], tb[PATH_MAX], csv[PATH_MAX]; /* "" when off */
    char run_dir[PATH_MAX];                            /* MG_RUN_LOG_DIR, "" outside mglaunch */
    int attempt;                                       /* MG_ATTEMPT, -1 outside mglaunch */
    long prior_step;            /* highest step earlier attempts recorded, -1 none */
    struct mg_upload *upload;   /* rank 0 with --upload or --upload-cmd */
    char upload_shown[512];     /* the destination, without secrets */
    int upload_failed_seen;     /* failures already said */
    struct mg_tstatus *tstatus; /* rank 0 in a Kubeflow TrainJob with TrainJobStatus */
};

/* Who is writing: the launcher's run id (NULL outside a launcher), the
 * restart count, the rank. */
struct train_out_ident {
    const char *run_id;
    int restart;
    int rank;
};

/* Opens rank 0's metrics (other ranks get none and no error). 0, or a
 * negative code with the reason in err. */
int train_out_open(struct train_out *to, const struct train_options *o,
                   const struct train_out_ident *id, char *err, size_t errlen);

/* The run's settings as an hparams record. */
int train_out_hparams(struct train_out *to, const struct train_options *o, int world,
                      long total_steps);

/* The train record of a --log-every step: the figures since the last one
 * and the per-rank step time spread (who is the straggler). */
struct train_out_train {
    long step, epoch;
    double loss, accuracy, lr, samples_per_s, time_s;
    double step_time_s, step_time_min_s, step_time_max_s; /* mean over ranks, min, max */
    int slowest_rank;
};
int train_out_train(struct train_out *to, const struct train_out_train *t);

int train_out_eval(struct train_out *to, long step, long epoch, double loss, double accuracy,
                   long samples);

struct train_out_summary {
    long step, epoch;
    double test_loss, test_accuracy, samples, train_time_s, samples_per_s, wall_time_s;
    const char *param_hash;
};
int train_out_summary(struct train_out *to, const struct train_out_summary *s);

/* Every call above returns 0 or the first write error of the metrics (sticky:
 * the run goes on; mg_metrics_errmsg(to->metrics) says what). */

/* Closes the metrics; 0, or the first error with its message in err. */
int train_out_close(struct train_out *to, char *err, size_t errlen);

/* ---- Kubeflow Trainer's progress (runtime/status/trainer_status.h) ---- */

/* Rank 0, when the controller gave the status server's address: starts the
 * reports. A failure is a warning in msg (1), never the run's end. */
int train_out_status_open(struct train_out *to, char *msg, size_t cap);

/* The progress after step of total, the time left (< 0: unknown) and the
 * figures so far; test figures at the end (test >= 0). Never waits. */
void train_out_status(struct train_out *to, long step, long total, double eta_s, double loss,
                      double accuracy, double lr, int test);

/* A failure to report (or a recovery) since the last call: 1 and msg. */
int train_out_status_news(struct train_out *to, char *msg, size_t cap);

/* Sends what waits (waiting at most wait_ms) and stops; 1 with msg when
 * that last report failed (its warning not said yet). */
int train_out_status_close(struct train_out *to, int wait_ms, char *msg, size_t cap);

/* ---- remote copies ---- */

/* The upload configuration of o; 0 when o asks for none. */
int train_out_upload_config(const struct train_options *o, struct mg_upload_config *cfg);

/* Starts rank 0's sender (train_out_open does not). 0, or a negative code
 * with err set (a bad destination, missing credentials, no libcurl). */
int train_out_upload_open(struct train_out *to, const struct train_options *o, char *err,
                          size_t errlen);

/* Queues the checkpoint of step in dir (file, completion marker, the LATEST
 * pointer: one copy) and the metrics files as they are now. */
void train_out_upload_checkpoint(struct train_out *to, const char *dir, long step);

/* Queues the metrics files as they are now (at the end). */
void train_out_upload_metrics(struct train_out *to);

/* A copy given up since the last call: 1 with its message in msg. */
int train_out_upload_news(struct train_out *to, char *msg, size_t cap);

/* Waits up to wait_s for the copies, stops the sender, and fills st.
 * Returns 0 when everything queued was copied, -EIO otherwise, 1 without
 * uploads. */
int train_out_upload_close(struct train_out *to, long wait_s, struct mg_upload_stats *st);

/* --resume auto on an empty checkpoint directory: fetches the checkpoint
 * that the destination's checkpoints/LATEST names into dir, checks it reads
 * back whole and marks it complete as run's. 1 fetched (its path in path), 0 the
 * destination has none, or a negative code with err set. */
int train_out_fetch_latest(const struct train_options *o, const char *dir, uint64_t run, char *path,
                           size_t pathlen, char *err, size_t errlen);

#endif
