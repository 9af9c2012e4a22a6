/* The train program's command line (docs/train.md): its options with their
 * defaults, the flags table, the usage text, and the checks between flags.
 *
 * Part of the program, not of libmg, but shaped like the launcher's opts.c:
 * parsing returns an error with its message instead of printing, and main
 * prints it once (a usage error: exit status 2). */
#ifndef MG_TRAIN_ARGS_H
#define MG_TRAIN_ARGS_H

#include "backend.h"
#include "data.h"
#include "models.h"
#include "optim.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define TRAIN_PROG        "train"
#define TRAIN_MAX_BATCH   65536 /* per process, --batch-size or its share of --global-batch-size */
#define TRAIN_MAX_THREADS 1024  /* --threads, and OMP_NUM_THREADS */

struct train_options {
    const char *model;
    struct mg_model_options model_opts;
    enum mg_data_kind data;
    const char *data_dir;
    long train_samples, test_samples;
    const char *data_cache; /* --data-cache DIR or "off"; NULL: MG_DATA_CACHE or the default */
    long epochs, steps;
    int batch_size, accum_steps;
    double lr;
    int lr_set;
    enum mg_optim_kind optimizer;
    double momentum, weight_decay, beta1, beta2, eps;
    int momentum_set, weight_decay_set, nesterov;
    enum mg_sched_kind schedule;
    long warmup, step_size;
    double gamma, min_lr;
    uint64_t seed;
    int threads;
    long eval_every;
    const char *checkpoint_dir;
    long checkpoint_every;
    int keep_checkpoints;
    long snapshot_every; /* in-memory snapshots every N steps, 0 off, -1 auto (train_snapshot.c) */
    int snapshot_set;
    const char *resume;
    long stop_at; /* --stop-at-step: the run ends after this step (0: at its end) */
    long log_every;
    int profile_startup; /* --profile-startup: where the time to the first step goes */
    const char *metrics;
    /* --tensorboard [DIR], --csv [DIR]: NULL off, "" the run's directory
     * under mglaunch ($MG_RUN_LOG_DIR/tensorboard, .../csv) */
    const char *tensorboard, *csv;
    /* remote copies (docs/train.md, "Remote copies"): --upload DEST or
     * --upload-cmd CMD, and the wait for them at the end */
    const char *upload, *upload_cmd;
    long upload_wait;
    enum mg_device device;
    int device_auto; /* --device auto: setup asks the driver (device is then set) */
    int drop_last;
    /* distributed (docs/distributed.md) */
    long global_batch;
    int batch_set;
    int scale_lr;
    long check_replicas;
    double bucket_cap_mb;
    int no_comm_thread;
    int zero; /* --zero 1 or MG_ZERO=1: ZeRO stage 1 (a sharded optimizer) */
    int zero_set;
    int tf32; /* --tf32 1 or MG_TF32=1: TF32 math on CUDA (cuBLAS and cuDNN) */
    int tf32_set;
    /* --help or --version: parsing stopped there, nothing else was checked */
    int help, version;
};

/* Fills o from argv[1..argc), with defaults for what is not given, and checks
 * the flags against each other. Both --flag value and --flag=value, and '_'
 * for '-' in names. Returns 0, or -EINVAL with a message in err (errlen
 * bytes). The strings in o point into argv. */
int train_args_parse(struct train_options *o, int argc, char **argv, char *err, size_t errlen);

/* Without --threads: the BLAS threads from OMP_NUM_THREADS (unset: leaves
 * o->threads 0, one thread). A value that is not a positive integer is
 * ignored and one over TRAIN_MAX_THREADS capped, as PyTorch does, with a
 * warning: returns 1 with its text in warn (len bytes), else 0. */
int train_threads_from_env(struct train_options *o, char *warn, size_t len);

/* The --help text. */
void train_usage(FILE *f);

#endif
