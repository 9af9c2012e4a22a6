/* The train program's command line (see train_args.h): the flags table, the
 * usage text, parsing, and the checks between flags. */
#include "train_args.h"
#include "mg_err.h"
#include "redact.h"
#include "upload/upload.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_EPOCHS 1000000

void train_usage(FILE *f)
{
    fprintf(f,
            "usage: " TRAIN_PROG " [options]\n"
            "Trains a model with libmg and reports its test accuracy. See docs/train.md.\n"
            "\n"
            "model and data:\n"
            "  --model NAME            mlp or cnn (default mlp)\n"
            "  --hidden N[,N...]       mlp hidden layer sizes (default 256)\n"
            "  --dropout P             mlp: dropout after each hidden layer (default 0)\n"
            "  --data NAME             fashion-mnist, mnist or synthetic (default fashion-mnist)\n"
            "  --data-dir DIR          directory of the IDX files\n"
            "                          (default /usr/share/datasets/<data>)\n"
            "  --train-samples N       use the first N training samples (0 = all)\n"
            "  --test-samples N        use the first N test samples (0 = all)\n"
            "  --data-cache DIR|off    decoded datasets, shared by the processes of a host\n"
            "                          (default $MG_DATA_CACHE, else ~/.cache/mg/data)\n"
            "length and batch:\n"
            "  --epochs N              passes over the training set (default 1)\n"
            "  --steps N               optimizer steps instead of epochs\n"
            "  --batch-size N          samples per micro-batch and process (default 64)\n"
            "  --accum-steps N         micro-batches per optimizer step (default 1)\n"
            "  --drop-last             drop the tail that does not divide among processes\n"
            "optimizer:\n"
            "  --optimizer NAME        sgd or adamw (default sgd)\n"
            "  --lr LR                 learning rate (default 0.05 mlp, 0.02 cnn; adamw 0.001)\n"
            "  --momentum M            sgd momentum (default 0.9)\n"
            "  --nesterov              sgd with Nesterov momentum\n"
            "  --weight-decay WD       default 0 for sgd, 0.01 for adamw\n"
            "  --betas B1,B2           adamw betas (default 0.9,0.999)\n"
            "  --eps E                 adamw epsilon (default 1e-8)\n"
            "  --schedule NAME         constant, step or cosine (default constant)\n"
            "  --warmup N              linear warmup over the first N steps (default 0)\n"
            "  --step-size N           step schedule: steps between decays (default: one epoch)\n"
            "  --gamma G               step schedule: decay factor (default 0.1)\n"
            "  --min-lr LR             cosine schedule: final learning rate (default 0)\n"
            "run:\n"
            "  --seed N                seed for initialization, shuffling, dropout (default 0)\n"
            "  --device cpu|cuda|auto  compute device (default cpu); cuda is GPU LOCAL_RANK,\n"
            "                          auto: cuda when one is usable, else cpu\n"
            "  --tf32 0|1              1: TF32 tensor cores on the GPU for matrix products\n"
            "                          and convolutions (default $MG_TF32, else 0: FP32,\n"
            "                          closer to the CPU's bits)\n"
            "  --threads N             BLAS threads (default $OMP_NUM_THREADS, else 1)\n"
            "  --eval-every N          evaluate every N steps (default 0: after each epoch)\n"
            "  --log-every N           a progress line every N steps (default 100)\n"
            "  --profile-startup       print where the time to the first step went (stderr)\n"
            "  --metrics FILE          append JSON lines (train, eval, summary records); under\n"
            "                          mglaunch rank 0 writes them to the run's attempt\n"
            "                          directory without it (docs/metrics.md)\n"
            "  --tensorboard [DIR]     TensorBoard event files in DIR (default under mglaunch:\n"
            "                          the run's log directory, tensorboard/)\n"
            "  --csv [DIR]             Lightning-style DIR/version_N/metrics.csv (default under\n"
            "                          mglaunch: the run's log directory, csv/)\n"
            "  --upload DEST           copy checkpoints, metrics and the final model to DEST\n"
            "                          (s3://BUCKET/PREFIX or http(s)://...) in the background\n"
            "  --upload-cmd 'CMD {}'   or run CMD with each file's path instead\n"
            "  --upload-wait S         at the end, wait up to S seconds for copies (default 300)\n"
            "  --checkpoint-dir DIR    where checkpoints go\n"
            "  --checkpoint-every N    checkpoint every N steps (default 0: after each epoch)\n"
            "  --keep-checkpoints N    keep the run's N newest checkpoints (default 3, 0 = all)\n"
            "  --snapshot-every N|auto under mglaunch, keep the state of every Nth step in memory\n"
            "                          that outlives the worker, and resume a restart from it;\n"
            "                          auto (default): every step, or as often as costs at\n"
            "                          most 3%% of the time; 0 = off (docs/train.md)\n"
            "  --resume auto|PATH      auto: this run's newest intact checkpoint in\n"
            "                          --checkpoint-dir, if any, or another run's, taking the\n"
            "                          directory over; PATH: a checkpoint file or a directory\n"
            "                          of them. A --checkpoint-dir of this run's (same\n"
            "                          TORCHELASTIC_RUN_ID, or without one the same settings)\n"
            "                          resumes without it; another world size reshards\n"
            "                          (docs/train.md)\n"
            "  --stop-at-step N        stop after step N with a checkpoint in --checkpoint-dir,\n"
            "                          the run's length and schedule unchanged (a replay's\n"
            "                          segment)\n"
            "distributed (under mglaunch or torchrun; see docs/distributed.md):\n"
            "  --global-batch-size G   total batch per optimizer micro-step: each of the W\n"
            "                          processes takes ceil(G / W) (instead of --batch-size)\n"
            "  --scale-lr linear|none  linear: multiply the learning rate by the world size\n"
            "  --check-replicas N      check every N steps that all ranks hold identical weights\n"
            "  --bucket-cap-mb MB      gradient bucket size (default 25; the first one 1)\n"
            "  --no-comm-thread        average gradients after backward, not during it\n"
            "  --zero 0|1              1: ZeRO-1, the optimizer state sharded over the\n"
            "                          processes (default $MG_ZERO, else 0; same results)\n"
            "  --help, --version\n");
}

/* Where a usage error's message goes. */
struct parse {
    char *err;
    size_t errlen;
};

__attribute__((format(printf, 2, 3))) static int bad(struct parse *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mg_vseterr(p->err, p->errlen, -EINVAL, fmt, ap);
    va_end(ap);
    /* a usage error echoes the argument: never its secrets */
    mg_redact_inplace(p->err, p->errlen);
    return -EINVAL;
}

static int parse_long(struct parse *p, const char *flag, const char *s, long min, long max,
                      long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno)
        return bad(p, "%s: '%s' is not an integer", flag, s);
    if (v < min || v > max)
        return bad(p, "%s: %ld is out of range (%ld..%ld)", flag, v, min, max);
    *out = v;
    return 0;
}

static int parse_int(struct parse *p, const char *flag, const char *s, int min, int max, int *out)
{
    long v;
    int rc = parse_long(p, flag, s, min, max, &v);
    if (rc == 0)
        *out = (int)v;
    return rc;
}

static int parse_double(struct parse *p, const char *flag, const char *s, double min, double max,
                        double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v))
        return bad(p, "%s: '%s' is not a number", flag, s);
    if (v < min || v > max)
        return bad(p, "%s: %g is out of range (%g..%g)", flag, v, min, max);
    *out = v;
    return 0;
}

static int parse_hidden(struct parse *p, const char *s, struct mg_model_options *mo)
{
    char item[64];
    mo->nhidden = 0;
    /* every item a size: "64," and "64,,32" are mistakes, not 64 and 64,32 */
    for (const char *q = s;; q++) {
        size_t len = strcspn(q, ",");
        if (len == 0)
            return bad(p, "--hidden: empty size in '%s' (want N[,N...])", s);
        if (len >= sizeof(item))
            return bad(p, "--hidden: '%.*s...' is not a size", 20, q);
        if (mo->nhidden == MG_MLP_MAX_HIDDEN)
            return bad(p, "--hidden: at most %d layers", MG_MLP_MAX_HIDDEN);
        memcpy(item, q, len);
        item[len] = '\0';
        int rc = parse_int(p, "--hidden", item, 1, 1 << 20, &mo->hidden[mo->nhidden++]);
        if (rc < 0)
            return rc;
        q += len;
        if (!*q)
            return 0;
    }
}

static int parse_betas(struct parse *p, const char *s, struct train_options *o)
{
    const char *comma = strchr(s, ',');
    char b1[64];
    if (!comma || (size_t)(comma - s) >= sizeof(b1))
        return bad(p, "--betas: want B1,B2, got '%s'", s);
    memcpy(b1, s, (size_t)(comma - s));
    b1[comma - s] = 0;
    int rc = parse_double(p, "--betas", b1, 0.0, 0.999999999, &o->beta1);
    if (rc == 0)
        rc = parse_double(p, "--betas", comma + 1, 0.0, 0.999999999, &o->beta2);
    return rc;
}

static int parse_seed(struct parse *p, const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long s = strtoull(v, &end, 10);
    if (!*v || *end || errno || *v == '-')
        return bad(p, "--seed: '%s' is not a non-negative integer", v);
    *out = s;
    return 0;
}

#define ARG_OPTIONAL 2

enum flag_id {
    F_MODEL,
    F_HIDDEN,
    F_DROPOUT,
    F_DATA,
    F_DATA_DIR,
    F_TRAIN_SAMPLES,
    F_TEST_SAMPLES,
    F_DATA_CACHE,
    F_EPOCHS,
    F_STEPS,
    F_BATCH,
    F_ACCUM,
    F_DROP_LAST,
    F_OPTIMIZER,
    F_LR,
    F_MOMENTUM,
    F_NESTEROV,
    F_WD,
    F_BETAS,
    F_EPS,
    F_SCHEDULE,
    F_WARMUP,
    F_STEP_SIZE,
    F_GAMMA,
    F_MIN_LR,
    F_SEED,
    F_DEVICE,
    F_THREADS,
    F_EVAL_EVERY,
    F_LOG_EVERY,
    F_PROFILE_STARTUP,
    F_METRICS,
    F_TENSORBOARD,
    F_CSV,
    F_UPLOAD,
    F_UPLOAD_CMD,
    F_UPLOAD_WAIT,
    F_CKPT_DIR,
    F_CKPT_EVERY,
    F_KEEP,
    F_SNAP_EVERY,
    F_RESUME,
    F_STOP_AT,
    F_GLOBAL_BATCH,
    F_SCALE_LR,
    F_CHECK_REPLICAS,
    F_BUCKET_CAP,
    F_NO_COMM_THREAD,
    F_ZERO,
    F_TF32,
    F_HELP,
    F_VERSION,
};

static const struct {
    const char *name;
    enum flag_id id;
    int has_arg; /* 0 none, 1 a value, ARG_OPTIONAL: a value unless the next
                    argument is a flag (train takes no other arguments) */
} flags[] = {
    {"model", F_MODEL, 1},
    {"hidden", F_HIDDEN, 1},
    {"dropout", F_DROPOUT, 1},
    {"data", F_DATA, 1},
    {"data-dir", F_DATA_DIR, 1},
    {"train-samples", F_TRAIN_SAMPLES, 1},
    {"test-samples", F_TEST_SAMPLES, 1},
    {"data-cache", F_DATA_CACHE, 1},
    {"epochs", F_EPOCHS, 1},
    {"steps", F_STEPS, 1},
    {"batch-size", F_BATCH, 1},
    {"accum-steps", F_ACCUM, 1},
    {"drop-last", F_DROP_LAST, 0},
    {"optimizer", F_OPTIMIZER, 1},
    {"lr", F_LR, 1},
    {"momentum", F_MOMENTUM, 1},
    {"nesterov", F_NESTEROV, 0},
    {"weight-decay", F_WD, 1},
    {"betas", F_BETAS, 1},
    {"eps", F_EPS, 1},
    {"schedule", F_SCHEDULE, 1},
    {"warmup", F_WARMUP, 1},
    {"step-size", F_STEP_SIZE, 1},
    {"gamma", F_GAMMA, 1},
    {"min-lr", F_MIN_LR, 1},
    {"seed", F_SEED, 1},
    {"device", F_DEVICE, 1},
    {"threads", F_THREADS, 1},
    {"eval-every", F_EVAL_EVERY, 1},
    {"log-every", F_LOG_EVERY, 1},
    {"profile-startup", F_PROFILE_STARTUP, 0},
    {"metrics", F_METRICS, 1},
    {"tensorboard", F_TENSORBOARD, ARG_OPTIONAL},
    {"csv", F_CSV, ARG_OPTIONAL},
    {"upload", F_UPLOAD, 1},
    {"upload-cmd", F_UPLOAD_CMD, 1},
    {"upload-wait", F_UPLOAD_WAIT, 1},
    {"checkpoint-dir", F_CKPT_DIR, 1},
    {"checkpoint-every", F_CKPT_EVERY, 1},
    {"keep-checkpoints", F_KEEP, 1},
    {"snapshot-every", F_SNAP_EVERY, 1},
    {"resume", F_RESUME, 1},
    {"stop-at-step", F_STOP_AT, 1},
    {"global-batch-size", F_GLOBAL_BATCH, 1},
    {"scale-lr", F_SCALE_LR, 1},
    {"check-replicas", F_CHECK_REPLICAS, 1},
    {"bucket-cap-mb", F_BUCKET_CAP, 1},
    {"no-comm-thread", F_NO_COMM_THREAD, 0},
    {"zero", F_ZERO, 1},
    {"tf32", F_TF32, 1},
    {"help", F_HELP, 0},
    {"version", F_VERSION, 0},
};

/* "--batch_size" and "--batch-size" are the same flag. */
static int flag_match(const char *arg, size_t len, const char *name)
{
    if (strlen(name) != len)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = arg[i] == '_' ? '-' : arg[i];
        if (c != name[i])
            return 0;
    }
    return 1;
}

static void set_defaults(struct train_options *o)
{
    memset(o, 0, sizeof(*o));
    o->model = "mlp";
    o->data = MG_DATA_FASHION_MNIST;
    o->epochs = 1;
    o->batch_size = 64;
    o->accum_steps = 1;
    o->optimizer = MG_OPTIM_SGD;
    o->momentum = 0.9;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->eps = 1e-8;
    o->schedule = MG_SCHED_CONSTANT;
    o->gamma = 0.1;
    o->keep_checkpoints = 3;
    o->snapshot_every = -1; /* auto */
    o->log_every = 100;
    o->upload_wait = 300;
    o->device = MG_DEVICE_CPU;
}

/* One flag's value v (NULL for a flag without one) into o. */
static int apply_flag(struct parse *p, struct train_options *o, enum flag_id id, const char *flag,
                      const char *v)
{
    double d;
    switch (id) {
    case F_MODEL:
        if (strcmp(v, "mlp") && strcmp(v, "cnn"))
            return bad(p, "--model: unknown model '%s' (known: %s)", v, mg_model_names());
        o->model = v;
        return 0;
    case F_HIDDEN:
        return parse_hidden(p, v, &o->model_opts);
    case F_DROPOUT:
        if (parse_double(p, flag, v, 0.0, 0.99, &d) < 0)
            return -EINVAL;
        o->model_opts.dropout = (float)d;
        return 0;
    case F_DATA:
        if (mg_data_parse(v, &o->data) < 0)
            return bad(p, "--data: unknown dataset '%s' (known: fashion-mnist, mnist, synthetic)",
                       v);
        return 0;
    case F_DATA_DIR:
        o->data_dir = v;
        return 0;
    case F_TRAIN_SAMPLES:
        return parse_long(p, flag, v, 0, INT_MAX, &o->train_samples);
    case F_TEST_SAMPLES:
        return parse_long(p, flag, v, 0, INT_MAX, &o->test_samples);
    case F_DATA_CACHE:
        if (!*v)
            return bad(p, "--data-cache: empty path (off turns the cache off)");
        o->data_cache = v;
        return 0;
    case F_EPOCHS:
        return parse_long(p, flag, v, 1, MAX_EPOCHS, &o->epochs);
    case F_STEPS:
        return parse_long(p, flag, v, 1, LONG_MAX / 2, &o->steps);
    case F_BATCH:
        o->batch_set = 1;
        return parse_int(p, flag, v, 1, TRAIN_MAX_BATCH, &o->batch_size);
    case F_ACCUM:
        return parse_int(p, flag, v, 1, 1 << 16, &o->accum_steps);
    case F_DROP_LAST:
        o->drop_last = 1;
        return 0;
    case F_OPTIMIZER:
        if (mg_optim_parse(v, &o->optimizer) < 0)
            return bad(p, "--optimizer: unknown optimizer '%s' (known: sgd, adamw)", v);
        return 0;
    case F_LR:
        o->lr_set = 1;
        return parse_double(p, flag, v, 0.0, 1e6, &o->lr);
    case F_MOMENTUM:
        o->momentum_set = 1;
        return parse_double(p, flag, v, 0.0, 0.999999, &o->momentum);
    case F_NESTEROV:
        o->nesterov = 1;
        return 0;
    case F_WD:
        o->weight_decay_set = 1;
        return parse_double(p, flag, v, 0.0, 1e6, &o->weight_decay);
    case F_BETAS:
        return parse_betas(p, v, o);
    case F_EPS:
        return parse_double(p, flag, v, 1e-30, 1.0, &o->eps);
    case F_SCHEDULE:
        if (mg_sched_parse(v, &o->schedule) < 0)
            return bad(p, "--schedule: unknown schedule '%s' (known: constant, step, cosine)", v);
        return 0;
    case F_WARMUP:
        return parse_long(p, flag, v, 0, LONG_MAX / 2, &o->warmup);
    case F_STEP_SIZE:
        return parse_long(p, flag, v, 1, LONG_MAX / 2, &o->step_size);
    case F_GAMMA:
        return parse_double(p, flag, v, 0.0, 1e6, &o->gamma);
    case F_MIN_LR:
        return parse_double(p, flag, v, 0.0, 1e6, &o->min_lr);
    case F_SEED:
        return parse_seed(p, v, &o->seed);
    case F_DEVICE:
        o->device_auto = !strcmp(v, "auto");
        if (o->device_auto)
            o->device = MG_DEVICE_CPU; /* until setup asks the driver */
        else if (mg_device_parse(v, &o->device) < 0)
            return bad(p, "--device: unknown device '%s' (known: cpu, cuda, auto)", v);
        return 0;
    case F_THREADS:
        return parse_int(p, flag, v, 1, TRAIN_MAX_THREADS, &o->threads);
    case F_EVAL_EVERY:
        return parse_long(p, flag, v, 0, LONG_MAX / 2, &o->eval_every);
    case F_LOG_EVERY:
        return parse_long(p, flag, v, 1, LONG_MAX / 2, &o->log_every);
    case F_PROFILE_STARTUP:
        o->profile_startup = 1;
        return 0;
    case F_METRICS:
        o->metrics = v;
        return 0;
    case F_TENSORBOARD:
    case F_CSV:
        if (v && !*v)
            return bad(p, "%s: empty directory name", flag);
        *(id == F_CSV ? &o->csv : &o->tensorboard) = v ? v : "";
        return 0;
    case F_UPLOAD: {
        char why[MG_ERRMSG_LEN];
        if (mg_upload_check_dest(v, why, sizeof(why)) < 0)
            return bad(p, "--upload %s", why);
        o->upload = v;
        return 0;
    }
    case F_UPLOAD_CMD:
        if (!*v)
            return bad(p, "--upload-cmd: an empty command");
        o->upload_cmd = v;
        return 0;
    case F_UPLOAD_WAIT:
        return parse_long(p, flag, v, 0, 7 * 24 * 3600, &o->upload_wait);
    case F_CKPT_DIR:
        o->checkpoint_dir = v;
        return 0;
    case F_CKPT_EVERY:
        return parse_long(p, flag, v, 0, LONG_MAX / 2, &o->checkpoint_every);
    case F_KEEP:
        return parse_int(p, flag, v, 0, 1000000, &o->keep_checkpoints);
    case F_SNAP_EVERY:
        o->snapshot_set = 1;
        if (strcmp(v, "auto") == 0) {
            o->snapshot_every = -1;
            return 0;
        }
        if (parse_long(p, flag, v, 0, LONG_MAX / 2, &o->snapshot_every) < 0)
            return bad(p, "%s: '%s' is neither auto nor a number of steps (0: none)", flag, v);
        return 0;
    case F_RESUME:
        if (!*v)
            return bad(p, "--resume: empty path");
        o->resume = v;
        return 0;
    case F_STOP_AT:
        return parse_long(p, flag, v, 1, LONG_MAX / 2, &o->stop_at);
    case F_GLOBAL_BATCH:
        return parse_long(p, flag, v, 1, (long)TRAIN_MAX_BATCH * 65536, &o->global_batch);
    case F_SCALE_LR:
        if (strcmp(v, "linear") && strcmp(v, "none"))
            return bad(p, "--scale-lr: unknown rule '%s' (known: linear, none)", v);
        o->scale_lr = !strcmp(v, "linear");
        return 0;
    case F_CHECK_REPLICAS:
        return parse_long(p, flag, v, 0, LONG_MAX / 2, &o->check_replicas);
    case F_BUCKET_CAP:
        return parse_double(p, flag, v, 0.001, 1024.0, &o->bucket_cap_mb);
    case F_NO_COMM_THREAD:
        o->no_comm_thread = 1;
        return 0;
    case F_ZERO:
        o->zero_set = 1;
        return parse_int(p, flag, v, 0, 1, &o->zero);
    case F_TF32:
        o->tf32_set = 1;
        return parse_int(p, flag, v, 0, 1, &o->tf32);
    case F_HELP:
        o->help = 1;
        return 0;
    case F_VERSION:
        o->version = 1;
        return 0;
    }
    return 0;
}

/* Defaults that depend on other flags, and flags that exclude each other. */
static int check(struct parse *p, struct train_options *o, int epochs_set, int steps_set)
{
    if (epochs_set && steps_set)
        return bad(p, "--epochs and --steps cannot be used together");
    const char *z = getenv("MG_ZERO");
    if (!o->zero_set && z && *z) {
        if (strcmp(z, "0") && strcmp(z, "1"))
            return bad(p, "MG_ZERO='%.32s': expected 0 or 1", z);
        o->zero = *z == '1';
    }
    const char *tf = getenv("MG_TF32");
    if (!o->tf32_set && tf && *tf) {
        if (strcmp(tf, "0") && strcmp(tf, "1"))
            return bad(p, "MG_TF32='%.32s': expected 0 or 1", tf);
        o->tf32 = *tf == '1';
    }
    if (!o->lr_set)
        o->lr = o->optimizer == MG_OPTIM_ADAMW ? 0.001 : !strcmp(o->model, "cnn") ? 0.02 : 0.05;
    if (!o->weight_decay_set)
        o->weight_decay = o->optimizer == MG_OPTIM_ADAMW ? 0.01 : 0.0;
    if (o->optimizer == MG_OPTIM_ADAMW && (o->momentum_set || o->nesterov))
        return bad(p, "--momentum and --nesterov apply to sgd, not adamw (use --betas)");
    if (o->nesterov && o->momentum == 0.0)
        return bad(p, "--nesterov needs a momentum > 0");
    if (o->resume && !strcmp(o->resume, "auto") && !o->checkpoint_dir)
        return bad(p, "--resume auto needs --checkpoint-dir");
    if (o->stop_at && !o->checkpoint_dir)
        return bad(p, "--stop-at-step needs --checkpoint-dir: the step it stops after is "
                      "saved there for the next segment to resume from");
    if (strcmp(o->model, "mlp") && (o->model_opts.nhidden || o->model_opts.dropout > 0.0f))
        return bad(p, "--hidden and --dropout apply to the mlp model");
    if (o->device == MG_DEVICE_CUDA && !mg_device_available(MG_DEVICE_CUDA))
        return bad(p, "--device cuda: this build of mg has no CUDA plugin (it was built without "
                      "nvcc, cuDNN and NCCL; see docs/gpu.md); use --device cpu or auto");
    if ((o->data == MG_DATA_SYNTHETIC) && o->data_dir)
        return bad(p, "--data-dir does not apply to --data synthetic");
    if (o->global_batch && o->batch_set)
        return bad(p, "--batch-size and --global-batch-size cannot be used together");
    if (o->upload && o->upload_cmd)
        return bad(p, "--upload and --upload-cmd cannot be used together");
    const char *run_dir = getenv("MG_RUN_LOG_DIR");
    if (!(run_dir && *run_dir) && ((o->tensorboard && !*o->tensorboard) || (o->csv && !*o->csv)))
        return bad(p,
                   "%s without a directory writes into the run's log directory under mglaunch "
                   "(MG_RUN_LOG_DIR); outside it, give one: %s DIR",
                   o->tensorboard && !*o->tensorboard ? "--tensorboard" : "--csv",
                   o->tensorboard && !*o->tensorboard ? "--tensorboard" : "--csv");
    return 0;
}

int train_threads_from_env(struct train_options *o, char *warn, size_t len)
{
    const char *v = getenv("OMP_NUM_THREADS");
    if (o->threads || !v || !*v)
        return 0;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    /* libgomp's syntax: a number, or a list whose first item is this level's */
    if (end == v || errno || n < 1 || (*end && *end != ',')) {
        o->threads = 1;
        snprintf(warn, len,
                 "OMP_NUM_THREADS='%.40s' is not a positive integer: ignored, 1 BLAS thread "
                 "(--threads N sets it)",
                 v);
        return 1;
    }
    if (n > TRAIN_MAX_THREADS) {
        o->threads = TRAIN_MAX_THREADS;
        snprintf(warn, len, "OMP_NUM_THREADS=%ld: more than %d threads; using %d", n,
                 TRAIN_MAX_THREADS, TRAIN_MAX_THREADS);
        return 1;
    }
    o->threads = (int)n;
    return 0;
}

int train_args_parse(struct train_options *o, int argc, char **argv, char *err, size_t errlen)
{
    struct parse p = {err, errlen};
    int epochs_set = 0, steps_set = 0;
    set_defaults(o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || !a[2])
            return bad(&p, "unexpected argument '%s'", a);
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        int f = -1;
        for (size_t k = 0; k < sizeof(flags) / sizeof(flags[0]); k++)
            if (flag_match(name, len, flags[k].name)) {
                f = (int)k;
                break;
            }
        if (f < 0)
            return bad(&p, "unknown option '--%.*s'", (int)len, name);
        char flag[64];
        snprintf(flag, sizeof(flag), "--%s", flags[f].name);
        const char *v = NULL;
        if (flags[f].has_arg == ARG_OPTIONAL) {
            if (eq)
                v = eq + 1;
            else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
                v = argv[++i];
        } else if (flags[f].has_arg) {
            if (eq)
                v = eq + 1;
            else if (i + 1 < argc)
                v = argv[++i];
            else
                return bad(&p, "%s needs a value", flag);
        } else if (eq) {
            return bad(&p, "%s takes no value", flag);
        }
        int rc = apply_flag(&p, o, flags[f].id, flag, v);
        if (rc < 0)
            return rc;
        if (o->help || o->version)
            return 0;
        epochs_set |= flags[f].id == F_EPOCHS;
        steps_set |= flags[f].id == F_STEPS;
    }
    return check(&p, o, epochs_set, steps_set);
}
