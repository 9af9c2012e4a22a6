/* train: trains a model from the zoo (models.h) on Fashion-MNIST, MNIST or a
 * synthetic dataset with libmg. The command line is documented in docs/train.md.
 *
 * Structure: parse_args() -> setup() (backend, data, model, trainer, resume)
 * -> run() (steps, logging, evaluation, checkpoints) -> summary. Everything a
 * distributed run changes goes through struct dist (rank, world, hooks). */
#include "backend.h"
#include "checkpoint.h"
#include "data.h"
#include "ddp.h"
#include "dist.h"
#include "mg_config.h"
#include "mg_err.h"
#include "model.h"
#include "models.h"
#include "optim.h"
#include "rtutil.h"
#include "trainer.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROG       "train"
#define EXIT_USAGE 2
#define MAX_BATCH  65536
#define MAX_EPOCHS 1000000

struct options {
    const char *model;
    struct mg_model_options model_opts;
    enum mg_data_kind data;
    const char *data_dir;
    long train_samples, test_samples;
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
    const char *resume;
    long log_every;
    const char *metrics;
    enum mg_device device;
    int drop_last;
    /* distributed (docs/distributed.md) */
    long global_batch;
    int batch_set;
    int scale_lr;
    long check_replicas;
    double bucket_cap_mb;
    int no_comm_thread;
};

/* What a distributed run changes; a single process is rank 0 of 1 with no hooks. */
struct dist {
    int rank, world;
    struct mg_train_hooks hooks;
    struct mg_dist *d;  /* launcher environment, store, communicator */
    struct mg_ddp *ddp; /* NULL at world size 1 */
    double lr_scale;    /* --scale-lr linear: the world size */
};

/* For the error file of fail() (rank, host). */
static struct mg_dist *error_dist;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [options]\n"
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
            "  --device cpu|cuda       compute device (default cpu)\n"
            "  --threads N             BLAS threads (default $OMP_NUM_THREADS, else 1)\n"
            "  --eval-every N          evaluate every N steps (default 0: after each epoch)\n"
            "  --log-every N           a progress line every N steps (default 100)\n"
            "  --metrics FILE          append JSON lines (train, eval, summary records)\n"
            "  --checkpoint-dir DIR    where checkpoints go\n"
            "  --checkpoint-every N    checkpoint every N steps (default 0: after each epoch)\n"
            "  --keep-checkpoints N    keep the N newest checkpoints (default 3, 0 = all)\n"
            "  --resume auto|PATH      auto: newest intact checkpoint in --checkpoint-dir, if\n"
            "                          any; PATH: a checkpoint file or a directory of them.\n"
            "                          Under a launcher, a restart or a checkpoint of the same\n"
            "                          job (TORCHELASTIC_RUN_ID) resumes without it; another\n"
            "                          world size reshards (docs/train.md)\n"
            "distributed (under mglaunch or torchrun; see docs/distributed.md):\n"
            "  --global-batch-size G   total batch per optimizer micro-step: each of the W\n"
            "                          processes takes ceil(G / W) (instead of --batch-size)\n"
            "  --scale-lr linear|none  linear: multiply the learning rate by the world size\n"
            "  --check-replicas N      check every N steps that all ranks hold identical weights\n"
            "  --bucket-cap-mb MB      gradient bucket size (default 25; the first one 1)\n"
            "  --no-comm-thread        average gradients after backward, not during it\n"
            "  --help, --version\n");
}

/* Errors are printed once and, under a launcher, recorded in the error file
 * (TORCHELASTIC_ERROR_FILE) so that its summary shows the real cause. */
__attribute__((format(printf, 1, 2), noreturn)) static void usage_error(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, PROG ": %s (see " PROG " --help)\n", msg);
    mg_error_file_record(error_dist, PROG, msg);
    exit(EXIT_USAGE);
}

__attribute__((format(printf, 1, 2))) static void fail(const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (error_dist && error_dist->world > 1)
        fprintf(stderr, PROG ": rank %d: %s\n", error_dist->rank, msg);
    else
        fprintf(stderr, PROG ": %s\n", msg);
    mg_error_file_record(error_dist, PROG, msg);
}

static long parse_long(const char *flag, const char *s, long min, long max)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno)
        usage_error("%s: '%s' is not an integer", flag, s);
    if (v < min || v > max)
        usage_error("%s: %ld is out of range (%ld..%ld)", flag, v, min, max);
    return v;
}

static double parse_double(const char *flag, const char *s, double min, double max)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v))
        usage_error("%s: '%s' is not a number", flag, s);
    if (v < min || v > max)
        usage_error("%s: %g is out of range (%g..%g)", flag, v, min, max);
    return v;
}

static void parse_hidden(const char *s, struct mg_model_options *mo)
{
    char buf[256];
    if (strlen(s) >= sizeof(buf))
        usage_error("--hidden: list too long");
    strcpy(buf, s);
    mo->nhidden = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (mo->nhidden == MG_MLP_MAX_HIDDEN)
            usage_error("--hidden: at most %d layers", MG_MLP_MAX_HIDDEN);
        mo->hidden[mo->nhidden++] = (int)parse_long("--hidden", tok, 1, 1 << 20);
    }
    if (mo->nhidden == 0)
        usage_error("--hidden: empty list");
}

static void parse_betas(const char *s, struct options *o)
{
    const char *comma = strchr(s, ',');
    char b1[64];
    if (!comma || (size_t)(comma - s) >= sizeof(b1))
        usage_error("--betas: want B1,B2, got '%s'", s);
    memcpy(b1, s, (size_t)(comma - s));
    b1[comma - s] = 0;
    o->beta1 = parse_double("--betas", b1, 0.0, 0.999999999);
    o->beta2 = parse_double("--betas", comma + 1, 0.0, 0.999999999);
}

enum flag_id {
    F_MODEL,
    F_HIDDEN,
    F_DROPOUT,
    F_DATA,
    F_DATA_DIR,
    F_TRAIN_SAMPLES,
    F_TEST_SAMPLES,
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
    F_METRICS,
    F_CKPT_DIR,
    F_CKPT_EVERY,
    F_KEEP,
    F_RESUME,
    F_GLOBAL_BATCH,
    F_SCALE_LR,
    F_CHECK_REPLICAS,
    F_BUCKET_CAP,
    F_NO_COMM_THREAD,
    F_HELP,
    F_VERSION,
};

static const struct {
    const char *name;
    enum flag_id id;
    int has_arg;
} flags[] = {
    {"model", F_MODEL, 1},
    {"hidden", F_HIDDEN, 1},
    {"dropout", F_DROPOUT, 1},
    {"data", F_DATA, 1},
    {"data-dir", F_DATA_DIR, 1},
    {"train-samples", F_TRAIN_SAMPLES, 1},
    {"test-samples", F_TEST_SAMPLES, 1},
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
    {"metrics", F_METRICS, 1},
    {"checkpoint-dir", F_CKPT_DIR, 1},
    {"checkpoint-every", F_CKPT_EVERY, 1},
    {"keep-checkpoints", F_KEEP, 1},
    {"resume", F_RESUME, 1},
    {"global-batch-size", F_GLOBAL_BATCH, 1},
    {"scale-lr", F_SCALE_LR, 1},
    {"check-replicas", F_CHECK_REPLICAS, 1},
    {"bucket-cap-mb", F_BUCKET_CAP, 1},
    {"no-comm-thread", F_NO_COMM_THREAD, 0},
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

static void parse_args(int argc, char **argv, struct options *o)
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
    o->log_every = 100;
    o->device = MG_DEVICE_CPU;
    int epochs_set = 0, steps_set = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || !a[2])
            usage_error("unexpected argument '%s'", a);
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        int f = -1;
        for (size_t k = 0; k < sizeof(flags) / sizeof(flags[0]); k++)
            if (flag_match(name, len, flags[k].name)) {
                f = (int)k;
                break;
            }
        if (f < 0)
            usage_error("unknown option '--%.*s'", (int)len, name);
        char flag[64];
        snprintf(flag, sizeof(flag), "--%s", flags[f].name);
        const char *v = NULL;
        if (flags[f].has_arg) {
            if (eq)
                v = eq + 1;
            else if (i + 1 < argc)
                v = argv[++i];
            else
                usage_error("%s needs a value", flag);
        } else if (eq) {
            usage_error("%s takes no value", flag);
        }
        switch (flags[f].id) {
        case F_MODEL:
            if (strcmp(v, "mlp") && strcmp(v, "cnn"))
                usage_error("--model: unknown model '%s' (known: %s)", v, mg_model_names());
            o->model = v;
            break;
        case F_HIDDEN:
            parse_hidden(v, &o->model_opts);
            break;
        case F_DROPOUT:
            o->model_opts.dropout = (float)parse_double(flag, v, 0.0, 0.99);
            break;
        case F_DATA:
            if (mg_data_parse(v, &o->data) < 0)
                usage_error("--data: unknown dataset '%s' (known: fashion-mnist, mnist, "
                            "synthetic)",
                            v);
            break;
        case F_DATA_DIR:
            o->data_dir = v;
            break;
        case F_TRAIN_SAMPLES:
            o->train_samples = parse_long(flag, v, 0, INT_MAX);
            break;
        case F_TEST_SAMPLES:
            o->test_samples = parse_long(flag, v, 0, INT_MAX);
            break;
        case F_EPOCHS:
            o->epochs = parse_long(flag, v, 1, MAX_EPOCHS);
            epochs_set = 1;
            break;
        case F_STEPS:
            o->steps = parse_long(flag, v, 1, LONG_MAX / 2);
            steps_set = 1;
            break;
        case F_BATCH:
            o->batch_size = (int)parse_long(flag, v, 1, MAX_BATCH);
            o->batch_set = 1;
            break;
        case F_ACCUM:
            o->accum_steps = (int)parse_long(flag, v, 1, 1 << 16);
            break;
        case F_DROP_LAST:
            o->drop_last = 1;
            break;
        case F_OPTIMIZER:
            if (mg_optim_parse(v, &o->optimizer) < 0)
                usage_error("--optimizer: unknown optimizer '%s' (known: sgd, adamw)", v);
            break;
        case F_LR:
            o->lr = parse_double(flag, v, 0.0, 1e6);
            o->lr_set = 1;
            break;
        case F_MOMENTUM:
            o->momentum = parse_double(flag, v, 0.0, 0.999999);
            o->momentum_set = 1;
            break;
        case F_NESTEROV:
            o->nesterov = 1;
            break;
        case F_WD:
            o->weight_decay = parse_double(flag, v, 0.0, 1e6);
            o->weight_decay_set = 1;
            break;
        case F_BETAS:
            parse_betas(v, o);
            break;
        case F_EPS:
            o->eps = parse_double(flag, v, 1e-30, 1.0);
            break;
        case F_SCHEDULE:
            if (mg_sched_parse(v, &o->schedule) < 0)
                usage_error("--schedule: unknown schedule '%s' (known: constant, step, cosine)", v);
            break;
        case F_WARMUP:
            o->warmup = parse_long(flag, v, 0, LONG_MAX / 2);
            break;
        case F_STEP_SIZE:
            o->step_size = parse_long(flag, v, 1, LONG_MAX / 2);
            break;
        case F_GAMMA:
            o->gamma = parse_double(flag, v, 0.0, 1e6);
            break;
        case F_MIN_LR:
            o->min_lr = parse_double(flag, v, 0.0, 1e6);
            break;
        case F_SEED: {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (!*v || *end || errno || *v == '-')
                usage_error("--seed: '%s' is not a non-negative integer", v);
            o->seed = s;
            break;
        }
        case F_DEVICE:
            if (mg_device_parse(v, &o->device) < 0)
                usage_error("--device: unknown device '%s' (known: cpu, cuda)", v);
            break;
        case F_THREADS:
            o->threads = (int)parse_long(flag, v, 1, 1024);
            break;
        case F_EVAL_EVERY:
            o->eval_every = parse_long(flag, v, 0, LONG_MAX / 2);
            break;
        case F_LOG_EVERY:
            o->log_every = parse_long(flag, v, 1, LONG_MAX / 2);
            break;
        case F_METRICS:
            o->metrics = v;
            break;
        case F_CKPT_DIR:
            o->checkpoint_dir = v;
            break;
        case F_CKPT_EVERY:
            o->checkpoint_every = parse_long(flag, v, 0, LONG_MAX / 2);
            break;
        case F_KEEP:
            o->keep_checkpoints = (int)parse_long(flag, v, 0, 1000000);
            break;
        case F_RESUME:
            if (!*v)
                usage_error("--resume: empty path");
            o->resume = v;
            break;
        case F_GLOBAL_BATCH:
            o->global_batch = parse_long(flag, v, 1, (long)MAX_BATCH * 65536);
            break;
        case F_SCALE_LR:
            if (strcmp(v, "linear") && strcmp(v, "none"))
                usage_error("--scale-lr: unknown rule '%s' (known: linear, none)", v);
            o->scale_lr = !strcmp(v, "linear");
            break;
        case F_CHECK_REPLICAS:
            o->check_replicas = parse_long(flag, v, 0, LONG_MAX / 2);
            break;
        case F_BUCKET_CAP:
            o->bucket_cap_mb = parse_double(flag, v, 0.001, 1024.0);
            break;
        case F_NO_COMM_THREAD:
            o->no_comm_thread = 1;
            break;
        case F_HELP:
            usage(stdout);
            exit(0);
        case F_VERSION:
            printf(PROG " (mg) %s\n", MG_VERSION);
            exit(0);
        }
    }
    if (epochs_set && steps_set)
        usage_error("--epochs and --steps cannot be used together");
    if (!o->lr_set)
        o->lr = o->optimizer == MG_OPTIM_ADAMW ? 0.001 : !strcmp(o->model, "cnn") ? 0.02 : 0.05;
    if (!o->weight_decay_set)
        o->weight_decay = o->optimizer == MG_OPTIM_ADAMW ? 0.01 : 0.0;
    if (o->optimizer == MG_OPTIM_ADAMW && (o->momentum_set || o->nesterov))
        usage_error("--momentum and --nesterov apply to sgd, not adamw (use --betas)");
    if (o->nesterov && o->momentum == 0.0)
        usage_error("--nesterov needs a momentum > 0");
    if (o->resume && !strcmp(o->resume, "auto") && !o->checkpoint_dir)
        usage_error("--resume auto needs --checkpoint-dir");
    if (strcmp(o->model, "mlp") && (o->model_opts.nhidden || o->model_opts.dropout > 0.0f))
        usage_error("--hidden and --dropout apply to the mlp model");
    if (o->device == MG_DEVICE_CUDA && !mg_device_available(MG_DEVICE_CUDA))
        usage_error("--device cuda: this build of mg has no CUDA backend (built without nvcc "
                    "and CUDA sources); use --device cpu");
    if ((o->data == MG_DATA_SYNTHETIC) && o->data_dir)
        usage_error("--data-dir does not apply to --data synthetic");
    if (o->global_batch && o->batch_set)
        usage_error("--batch-size and --global-batch-size cannot be used together");
}

/* ---- output ---------------------------------------------------------------------------- */

struct progress {
    int tty;
    double last_draw;
    FILE *metrics;
};

static void metrics_line(struct progress *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void metrics_line(struct progress *p, const char *fmt, ...)
{
    if (!p->metrics)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(p->metrics, fmt, ap);
    va_end(ap);
    fputc('\n', p->metrics);
    fflush(p->metrics);
}

/* Prints a line above the progress bar (or just a line without a terminal). */
static void say(struct progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(struct progress *p, const char *fmt, ...)
{
    va_list ap;
    if (p->tty)
        fputs("\r\033[K", stdout);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    fflush(stdout);
    p->last_draw = 0;
}

static void draw_bar(struct progress *p, long step, long total, long epoch, long epochs,
                     double loss, double lr, double rate, double eta)
{
    char bar[31];
    int width = 30, fill = total ? (int)((double)step * width / (double)total) : width;
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '-';
    bar[width] = 0;
    long e = (long)(eta + 0.5);
    printf("\r\033[Kepoch %ld/%ld [%s] %3d%% step %ld/%ld loss %.4f lr %.4g %.0f samples/s "
           "eta %ld:%02ld",
           epoch, epochs, bar, total ? (int)(100.0 * (double)step / (double)total) : 100, step,
           total, loss, lr, rate, e / 60, e % 60);
    fflush(stdout);
}

/* ---- setup ------------------------------------------------------------------------------ */

struct run {
    struct options *o;
    struct dist dist;
    struct mg_backend *be;
    struct mg_dataset train, test;
    struct mg_model model;
    struct mg_trainer trainer;
    long total_steps;
    long epochs_total;
    struct progress prog;
};

/* The launcher's environment (world size 1 without one): joins the other
 * ranks, then sets the per-process batch and learning rate from the world size. */
static int setup_dist(struct run *r)
{
    struct options *o = r->o;
    char err[1024];
    memset(&r->dist, 0, sizeof(r->dist));
    int rc = mg_dist_init(&r->dist.d, NULL, err, sizeof(err));
    if (rc < 0) {
        fail("%s", err);
        return rc;
    }
    error_dist = r->dist.d;
    r->dist.rank = r->dist.d->rank;
    r->dist.world = r->dist.d->world;
    if (o->global_batch) {
        long per = (o->global_batch + r->dist.world - 1) / r->dist.world;
        if (per > MAX_BATCH) {
            fail("--global-batch-size %ld over %d processes is %ld per process: at most %d",
                 o->global_batch, r->dist.world, per, MAX_BATCH);
            return -EINVAL;
        }
        o->batch_size = (int)per;
    }
    r->dist.lr_scale = o->scale_lr ? (double)r->dist.world : 1.0;
    o->lr *= r->dist.lr_scale;
    return 0;
}

/* Gradient averaging, parameter broadcast and reduced figures over the ranks. */
static int setup_ddp(struct run *r)
{
    struct options *o = r->o;
    char err[1024];
    if (r->dist.world == 1)
        return 0;
    struct mg_ddp_opts dopts = {
        .bucket_cap = o->bucket_cap_mb > 0 ? (size_t)(o->bucket_cap_mb * 1048576.0) : 0,
        .no_thread = o->no_comm_thread,
    };
    int rc = mg_ddp_create(&r->dist.ddp, r->dist.d->comm, &r->model, &dopts, err, sizeof(err));
    if (rc < 0) {
        fail("cannot set up data parallelism: %s", err);
        return rc;
    }
    mg_ddp_hooks(r->dist.ddp, &r->dist.hooks);
    return 0;
}

/* The message for a failed step or evaluation: a collective's, when one failed. */
static const char *why(struct run *r, int rc)
{
    const char *m = mg_ddp_errmsg(r->dist.ddp);
    return m && *m ? m : mg_strerror(rc);
}

static int setup(struct run *r)
{
    struct options *o = r->o;
    char err[MG_ERRMSG_LEN];
    int rc;

    rc = setup_dist(r);
    if (rc < 0)
        return rc;
    struct mg_backend_opts bo = {.threads = o->threads};
    rc = mg_backend_create(o->device, &bo, &r->be);
    if (rc < 0) {
        fail("cannot start the %s backend: %s", o->device == MG_DEVICE_CUDA ? "cuda" : "cpu",
             mg_strerror(rc));
        return rc;
    }
    rc = mg_dataset_load(&r->train, o->data, o->data_dir, 1, o->train_samples, err);
    if (rc == 0)
        rc = mg_dataset_load(&r->test, o->data, o->data_dir, 0, o->test_samples, err);
    if (rc < 0) {
        fail("cannot load %s: %s", mg_data_name(o->data), err);
        return rc;
    }
    if (r->train.h != MG_MODEL_INPUT_H || r->train.w != MG_MODEL_INPUT_W ||
        r->test.h != MG_MODEL_INPUT_H || r->test.w != MG_MODEL_INPUT_W) {
        fail("%s: images are %dx%d, the models take %dx%d", mg_data_name(o->data), r->train.h,
             r->train.w, MG_MODEL_INPUT_H, MG_MODEL_INPUT_W);
        return -MG_ESHAPE;
    }
    rc = mg_model_create(&r->model, r->be, o->model, &o->model_opts, o->batch_size, err);
    if (rc < 0) {
        fail("cannot build model %s: %s", o->model, err);
        return rc;
    }
    rc = mg_model_init_params(&r->model, o->seed);
    if (rc < 0) {
        fail("cannot initialize the parameters: %s", mg_strerror(rc));
        return rc;
    }
    rc = setup_ddp(r);
    if (rc < 0)
        return rc;

    struct mg_train_config cfg = {
        .batch_size = o->batch_size,
        .accum_steps = o->accum_steps,
        .seed = o->seed,
        .rank = r->dist.rank,
        .world = r->dist.world,
        .drop_last = o->drop_last,
        .global_batch = o->global_batch,
        .run_id_hash = r->dist.d->env.launched ? mg_run_id_hash(r->dist.d->env.run_id) : 0,
    };
    if (r->train.n < r->dist.world) {
        fail("%d training samples cannot be shared by %d processes", r->train.n, r->dist.world);
        return -EINVAL;
    }
    long per_epoch =
        mg_steps_for_epochs(1, r->train.n, r->dist.world, o->drop_last, o->batch_size, 1);
    r->total_steps = o->steps ? o->steps
                              : mg_steps_for_epochs(o->epochs, r->train.n, r->dist.world,
                                                    o->drop_last, o->batch_size, o->accum_steps);
    r->epochs_total = (r->total_steps * o->accum_steps + per_epoch - 1) / per_epoch;
    cfg.total_steps = r->total_steps;
    mg_optim_defaults(&cfg.optim, o->optimizer);
    cfg.optim.momentum = o->optimizer == MG_OPTIM_SGD ? o->momentum : 0.0;
    cfg.optim.nesterov = o->nesterov;
    cfg.optim.weight_decay = o->weight_decay;
    cfg.optim.beta1 = o->beta1;
    cfg.optim.beta2 = o->beta2;
    cfg.optim.eps = o->eps;
    cfg.sched = (struct mg_schedule){
        .kind = o->schedule,
        .base_lr = o->lr,
        .warmup = o->warmup,
        .total = r->total_steps,
        .step_size =
            o->step_size ? o->step_size : (per_epoch + o->accum_steps - 1) / o->accum_steps,
        .gamma = o->gamma,
        .min_lr = o->min_lr,
    };
    rc = mg_trainer_init(&r->trainer, &r->model, &r->train, &r->test, &cfg, &r->dist.hooks, err);
    if (rc < 0) {
        fail("cannot set up training: %s", err);
        return rc;
    }
    return 0;
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* After a resume with another world size: what changed, as elastic torchrun
 * users would want to be told (docs/train.md, "Elastic resume"). */
static void warn_reshard(struct run *r)
{
    const struct options *o = r->o;
    const struct mg_resume_info *ri = &r->trainer.resumed;
    long was = (long)ri->batch_size * ri->world * ri->accum_steps;
    long now = (long)o->batch_size * r->dist.world * o->accum_steps;
    char where[256];
    if (ri->per_rank > 0)
        snprintf(where, sizeof(where),
                 "epoch %ld goes on from sample %ld of %d in its order: the %ld not yet taken "
                 "are shared by %d process%s, %ld each",
                 ri->epoch + 1, ri->position, r->train.n, ri->left, r->dist.world,
                 r->dist.world == 1 ? "" : "es", ri->per_rank);
    else if (ri->left > 0)
        snprintf(where, sizeof(where),
                 "the %ld samples left of epoch %ld are fewer than %d processes and dropped "
                 "(--drop-last); epoch %ld begins",
                 ri->left, ri->epoch, r->dist.world, ri->epoch + 1);
    else
        snprintf(where, sizeof(where), "epoch %ld begins", ri->epoch + 1);
    fprintf(stderr,
            PROG ": warning: resharding a checkpoint of %d process%s: world size %d -> %d, "
                 "effective batch %ld -> %ld (%d per process x %d x %d accum), lr %g -> %g; %s\n",
            ri->world, ri->world == 1 ? "" : "es", ri->world, r->dist.world, was, now,
            o->batch_size, r->dist.world, o->accum_steps, ri->lr, o->lr, where);
    long g = ri->global_batch ? ri->global_batch : (long)ri->batch_size * ri->world;
    if (was != now && !o->global_batch)
        fprintf(stderr,
                PROG ": warning: --batch-size is per process, so the effective batch follows the "
                     "world size; --global-batch-size %ld keeps it (each process takes ceil(%ld / "
                     "%d))%s\n",
                g, g, r->dist.world,
                o->scale_lr ? "" : "; --scale-lr linear scales the lr with the world size");
}

/* When to resume (docs/train.md, "Resume"): --resume; a restart by the
 * launcher (TORCHELASTIC_RESTART_COUNT > 0); or, under a launcher, a
 * checkpoint this job wrote (same TORCHELASTIC_RUN_ID): a group re-formed
 * after a membership change restarts its workers with a restart count of 0. */
static int resume(struct run *r)
{
    struct options *o = r->o;
    char err[MG_ERRMSG_LEN];
    const struct mg_dist_env *env = &r->dist.d->env;
    const char *what = o->resume;
    uint64_t only_run = 0;
    int quiet = 0;
    if (!what && o->checkpoint_dir) {
        what = "auto";
        if (env->restart_count == 0) {
            /* only this job's checkpoints; another run's get a warning, none nothing */
            only_run = r->trainer.cfg.run_id_hash ? r->trainer.cfg.run_id_hash : UINT64_MAX;
            quiet = 1;
        }
    }
    if (!what)
        return 0;
    int rc;
    static struct mg_resume_report rep;
    if (strcmp(what, "auto") == 0 || is_dir(what)) {
        const char *dir = strcmp(what, "auto") == 0 ? o->checkpoint_dir : what;
        rc = mg_trainer_resume_latest(&r->trainer, dir, only_run, &rep, err);
        for (int i = 0; i < rep.nskipped && r->dist.rank == 0; i++)
            fprintf(stderr, PROG ": warning: skipping a corrupt checkpoint: %s\n", rep.skipped[i]);
        if (rc < 0) {
            fail("cannot resume: %s", err);
            return rc;
        }
        if (rep.other_run) {
            if (r->dist.rank == 0)
                fprintf(stderr,
                        PROG ": warning: '%s' holds another run's checkpoints (newest: step "
                             "%" PRIu64 "); starting from step 0 (pass --resume auto to "
                             "continue from them, or use an empty directory)\n",
                        dir, rep.step);
            return 0;
        }
        if (!rep.found) {
            if (strcmp(what, "auto") != 0) {
                fail("cannot resume: no complete checkpoint in '%s'", dir);
                return -ENOENT;
            }
            if (!quiet && r->dist.rank == 0)
                say(&r->prog, PROG ": no checkpoint in '%s' yet: starting from step 0", dir);
            return 0;
        }
        what = rep.path;
    } else {
        rc = mg_trainer_load(&r->trainer, what, err);
        if (rc < 0) {
            fail("cannot resume: %s", err);
            return rc;
        }
    }
    struct mg_trainer *t = &r->trainer;
    /* --epochs counts from where the checkpoint left off, at this world size */
    long total = o->steps ? r->total_steps : mg_trainer_steps_for_epochs(t, o->epochs);
    int moved = total != r->total_steps;
    if (moved) {
        r->total_steps = total;
        t->cfg.total_steps = total;
        t->cfg.sched.total = total;
    }
    if (r->dist.rank == 0) {
        if (t->resumed.resharded)
            warn_reshard(r);
        say(&r->prog, PROG ": resumed from %s (step %ld, epoch %ld), param hash %016" PRIx64, what,
            t->step, t->resumed.epoch + 1, mg_model_param_hash(&r->model));
        if (moved)
            say(&r->prog, PROG ": %ld epoch%s now end at step %ld", o->epochs,
                o->epochs == 1 ? "" : "s", total);
    }
    return 0;
}

/* Every rank must continue from the same point with the same state (after
 * the parameter broadcast, which checked that the models agree). */
static int check_resume(struct run *r)
{
    if (!r->dist.ddp)
        return 0;
    int rc = mg_ddp_check_resume(r->dist.ddp, &r->trainer);
    if (rc < 0)
        fail("cannot resume: %s", mg_ddp_errmsg(r->dist.ddp));
    return rc;
}

/* ---- the loop --------------------------------------------------------------------------- */

static int evaluate(struct run *r, struct mg_eval_sums *ev)
{
    int rc = mg_trainer_evaluate(&r->trainer, ev);
    if (rc < 0) {
        fail("evaluation failed: %s", why(r, rc));
        return rc;
    }
    double acc = ev->count ? (double)ev->correct / (double)ev->count : 0.0;
    double loss = ev->count ? ev->loss_sum / (double)ev->count : 0.0;
    long epoch = r->trainer.epoch + 1;
    if (r->dist.rank == 0) {
        say(&r->prog, "eval step %ld epoch %ld: test loss %.4f accuracy %.4f (%ld/%ld)",
            r->trainer.step, epoch, loss, acc, ev->correct, ev->count);
        metrics_line(&r->prog,
                     "{\"type\":\"eval\",\"step\":%ld,\"epoch\":%ld,\"test_loss\":%.6f,"
                     "\"test_accuracy\":%.6f,\"test_samples\":%ld}",
                     r->trainer.step, epoch, loss, acc, ev->count);
    }
    return 0;
}

/* Rank 0 writes every rank's state; the completion marker follows a barrier,
 * so a checkpoint is complete only once every rank has reached it. */
static int checkpoint(struct run *r)
{
    char err[MG_ERRMSG_LEN];
    const char *dir = r->o->checkpoint_dir;
    struct mg_rank_state *states = NULL;
    int rc = 0;
    if (r->dist.ddp) {
        struct mg_rank_state mine;
        states = calloc((size_t)r->dist.world, sizeof(*states));
        if (!states) {
            fail("cannot write a checkpoint: out of memory");
            return -ENOMEM;
        }
        mg_trainer_rank_state(&r->trainer, &mine);
        rc = mg_ddp_gather_rank_states(r->dist.ddp, &mine, states);
        if (rc < 0) {
            fail("cannot write a checkpoint: %s", mg_ddp_errmsg(r->dist.ddp));
            goto out;
        }
    }
    if (r->dist.rank == 0) {
        rc = mg_trainer_save(&r->trainer, dir, states, states ? r->dist.world : 0, err);
        if (rc < 0) {
            fail("cannot write a checkpoint: %s", err);
            goto out;
        }
    }
    if (r->dist.ddp) {
        rc = mg_ddp_barrier(r->dist.ddp);
        if (rc < 0) {
            fail("cannot write a checkpoint: %s", mg_ddp_errmsg(r->dist.ddp));
            goto out;
        }
    }
    if (r->dist.rank == 0) {
        rc = mg_ckpt_mark_complete(dir, (uint64_t)r->trainer.step, err);
        if (rc < 0) {
            fail("cannot write a checkpoint: %s", err);
            goto out;
        }
        int prc = mg_ckpt_prune(dir, r->o->keep_checkpoints);
        if (prc < 0)
            fprintf(stderr, PROG ": warning: cannot remove old checkpoints in '%s': %s\n", dir,
                    mg_strerror(prc));
    }
out:
    free(states);
    return rc;
}

static int run(struct run *r)
{
    struct options *o = r->o;
    struct mg_trainer *t = &r->trainer;
    int world = r->dist.world, rc;
    double t0 = mg_seconds(), train_time = 0.0, log_t0 = t0, last_loss = 0.0;
    double log_loss = 0.0, log_correct = 0.0, log_samples = 0.0, total_samples = 0.0;
    long start_step = t->step;
    struct mg_eval_sums ev = {0};
    int evaluated_now = 0;

    if (r->dist.rank == 0) {
        say(&r->prog, PROG ": model %s (%zu parameters), data %s (%d train / %d test samples), %s",
            o->model, r->model.nparams, mg_data_name(o->data), r->train.n, r->test.n, r->be->name);
        say(&r->prog,
            PROG ": %s lr %g%s, schedule %s, batch %d per process x %d process%s x %d accum = %d, "
                 "%ld steps (%ld epoch%s)",
            mg_optim_name(o->optimizer), o->lr,
            o->optimizer == MG_OPTIM_SGD ? (o->nesterov ? " nesterov momentum" : " momentum") : "",
            mg_sched_name(o->schedule), o->batch_size, world, world == 1 ? "" : "es",
            o->accum_steps, o->batch_size * world * o->accum_steps, r->total_steps, r->epochs_total,
            r->epochs_total == 1 ? "" : "s");
        if (r->dist.lr_scale > 1.0)
            say(&r->prog, PROG ": lr %g = %g x %d processes (--scale-lr linear)", o->lr,
                o->lr / r->dist.lr_scale, world);
        if (world > 1)
            say(&r->prog, PROG ": %d processes, %s", world, r->dist.d->comm->desc);
    }
    rc = mg_trainer_start(t);
    if (rc < 0) {
        fail("cannot synchronize the initial parameters: %s", why(r, rc));
        return rc;
    }
    rc = check_resume(r);
    if (rc < 0)
        return rc;
    while (t->step < r->total_steps) {
        struct mg_step_stats st;
        double s0 = mg_seconds();
        rc = mg_trainer_step(t, &st);
        if (rc < 0) {
            fail("training step %ld failed: %s", t->step + 1, why(r, rc));
            return rc;
        }
        if (r->dist.ddp && o->check_replicas > 0 && t->step % o->check_replicas == 0) {
            rc = mg_ddp_check_replicas(r->dist.ddp, t->step);
            if (rc < 0) {
                fail("%s", mg_ddp_errmsg(r->dist.ddp));
                return rc;
            }
        }
        double s1 = mg_seconds();
        train_time += s1 - s0;
        total_samples += (double)st.samples * world;
        log_loss += st.loss_sum;
        log_correct += (double)st.correct;
        log_samples += (double)st.samples;
        evaluated_now = 0;
        int epoch_done = t->batch_in_epoch >= t->pass_batches;
        int last = t->step == r->total_steps;

        if (t->step % o->log_every == 0 || last) {
            double sums[3] = {log_loss, log_correct, log_samples};
            if (r->dist.hooks.reduce_sums) {
                rc = r->dist.hooks.reduce_sums(r->dist.hooks.ctx, sums, 3);
                if (rc < 0) {
                    fail("step %ld: cannot reduce the loss over the ranks: %s", t->step,
                         why(r, rc));
                    return rc;
                }
            }
            double now = mg_seconds();
            double rate = sums[2] / (now - log_t0 > 1e-9 ? now - log_t0 : 1e-9);
            last_loss = sums[2] > 0 ? sums[0] / sums[2] : 0.0;
            double acc = sums[2] > 0 ? sums[1] / sums[2] : 0.0;
            if (r->dist.rank == 0) {
                if (!r->prog.tty)
                    say(&r->prog,
                        "step %ld/%ld epoch %ld loss %.4f accuracy %.4f lr %.6g %.0f "
                        "samples/s",
                        t->step, r->total_steps, t->epoch + 1, last_loss, acc, st.lr, rate);
                metrics_line(&r->prog,
                             "{\"type\":\"train\",\"step\":%ld,\"epoch\":%ld,\"loss\":%.6f,"
                             "\"accuracy\":%.6f,\"lr\":%.9g,\"samples_per_s\":%.1f,"
                             "\"time_s\":%.3f}",
                             t->step, t->epoch + 1, last_loss, acc, st.lr, rate, now - t0);
            }
            log_loss = log_correct = log_samples = 0.0;
            log_t0 = mg_seconds();
        }
        if (r->prog.tty && r->dist.rank == 0 && (s1 - r->prog.last_draw > 0.1 || last)) {
            double rate = train_time > 0 ? total_samples / train_time : 0.0;
            double per_step = train_time / (double)(t->step - start_step);
            draw_bar(&r->prog, t->step, r->total_steps, t->epoch + 1, r->epochs_total, last_loss,
                     st.lr, rate, per_step * (double)(r->total_steps - t->step));
            r->prog.last_draw = s1;
        }
        if ((o->eval_every > 0 && t->step % o->eval_every == 0) ||
            (o->eval_every == 0 && epoch_done && !last)) {
            rc = evaluate(r, &ev);
            if (rc < 0)
                return rc;
            evaluated_now = 1;
        }
        if (o->checkpoint_dir && !last &&
            ((o->checkpoint_every > 0 && t->step % o->checkpoint_every == 0) ||
             (o->checkpoint_every == 0 && epoch_done))) {
            rc = checkpoint(r);
            if (rc < 0)
                return rc;
        }
        log_t0 += mg_seconds() - s1; /* evaluation and checkpoints are not training time */
    }
    if (o->checkpoint_dir && t->step > start_step) {
        rc = checkpoint(r);
        if (rc < 0)
            return rc;
    }
    if (!evaluated_now) {
        rc = evaluate(r, &ev);
        if (rc < 0)
            return rc;
    }
    double wall = mg_seconds() - t0;
    double rate = train_time > 0 ? total_samples / train_time : 0.0;
    double acc = ev.count ? (double)ev.correct / (double)ev.count : 0.0;
    double loss = ev.count ? ev.loss_sum / (double)ev.count : 0.0;
    uint64_t hash = mg_model_param_hash(&r->model);
    if (r->dist.rank == 0) {
        say(&r->prog,
            PROG ": done: test accuracy %.4f (%ld/%ld), test loss %.4f; %ld steps, %.0f samples "
                 "in %.1f s (%.0f samples/s), wall time %.1f s; param hash %016" PRIx64,
            acc, ev.correct, ev.count, loss, t->step, total_samples, train_time, rate, wall, hash);
        metrics_line(&r->prog,
                     "{\"type\":\"summary\",\"step\":%ld,\"epoch\":%ld,\"test_loss\":%.6f,"
                     "\"test_accuracy\":%.6f,\"samples\":%.0f,\"train_time_s\":%.3f,"
                     "\"samples_per_s\":%.1f,\"wall_time_s\":%.3f,\"param_hash\":\"%016" PRIx64
                     "\"}",
                     t->step, t->epoch + 1, loss, acc, total_samples, train_time, rate, wall, hash);
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct options o;
    struct run r;
    int rc;

    parse_args(argc, argv, &o);
    memset(&r, 0, sizeof(r));
    r.o = &o;
    r.prog.tty = isatty(STDOUT_FILENO);
    if (o.metrics) {
        r.prog.metrics = fopen(o.metrics, "a");
        if (!r.prog.metrics) {
            fail("cannot open metrics file '%s': %s", o.metrics, strerror(errno));
            return 1;
        }
    }
    rc = setup(&r);
    if (rc == 0)
        rc = resume(&r);
    if (rc == 0)
        rc = run(&r);
    /* rank 0 hosts the store: everyone leaves together */
    if (rc == 0 && r.dist.d && mg_dist_finalize(r.dist.d, MG_COMM_DEFAULT_TIMEOUT) < 0) {
        fail("%s", mg_comm_errmsg(r.dist.d->comm));
        rc = -MG_EPEER;
    }
    if (r.prog.tty)
        fflush(stdout);
    mg_trainer_release(&r.trainer);
    mg_ddp_release(r.dist.ddp);
    mg_model_release(&r.model);
    mg_dataset_release(&r.train);
    mg_dataset_release(&r.test);
    mg_backend_release(r.be);
    error_dist = NULL;
    mg_dist_release(r.dist.d);
    if (r.prog.metrics)
        fclose(r.prog.metrics);
    return rc < 0 ? 1 : 0;
}
