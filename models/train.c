/* train: trains a model from the zoo (models.h) on Fashion-MNIST, MNIST or a
 * synthetic dataset with libmg. The command line is documented in docs/train.md
 * and parsed in train_args.c.
 *
 * Structure: train_args_parse() -> setup() (backend, data, model, trainer)
 * -> resume() -> run() (steps, progress, evaluation, checkpoints, summary).
 * Everything a distributed run changes goes through struct dist (rank, world,
 * hooks). */
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
#include "train_args.h"
#include "train_ckpt.h"
#include "train_out.h"
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
#include <time.h>
#include <unistd.h>

/* Exit statuses (docs/train.md, "Output"). */
#define EXIT_FAILURE_RUN 1 /* a failure while running */
#define EXIT_USAGE       2 /* a bad command line */
#define EXIT_INCOMPLETE  3 /* trained to the end, but some output could not be written */
#define EXIT_DIVERGED    4 /* the loss became NaN or infinite */

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

/* The error file for the launcher's summary; one that cannot be written is
 * said once (the launcher then reports the exit status alone). */
static void record_error(const struct mg_dist *d, const char *msg)
{
    static int reported;
    int rc = mg_error_file_record(d, TRAIN_PROG, msg);
    if (rc < 0 && !reported) {
        reported = 1;
        fprintf(stderr, TRAIN_PROG ": cannot write the error file '%s': %s\n",
                getenv("TORCHELASTIC_ERROR_FILE"), mg_strerror(rc));
    }
}

/* Errors are printed once and, under a launcher, recorded in the error file
 * (TORCHELASTIC_ERROR_FILE) so that its summary shows the real cause. */
__attribute__((format(printf, 1, 2))) static void fail(const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (error_dist && error_dist->world > 1)
        fprintf(stderr, TRAIN_PROG ": rank %d: %s\n", error_dist->rank, msg);
    else
        fprintf(stderr, TRAIN_PROG ": %s\n", msg);
    record_error(error_dist, msg);
}

/* ---- output ---------------------------------------------------------------------------- */

struct progress {
    int tty;
    double last_draw;
    int stdout_lost; /* a write to stdout failed (reported) */
};

/* The first failed write of a stream is reported, once, with the file and
 * the reason; the run goes on (its checkpoints are its real output) and
 * exits with EXIT_INCOMPLETE. */
static void lost_stdout(struct progress *p, int err)
{
    if (p->stdout_lost)
        return;
    p->stdout_lost = 1;
    fprintf(stderr,
            TRAIN_PROG ": cannot write to standard output: %s (progress and results from here "
                       "on are lost; the exit status will be %d)\n",
            strerror(err), EXIT_INCOMPLETE);
}

static void flush_stdout(struct progress *p)
{
    if (fflush(stdout) == EOF || ferror(stdout)) {
        int e = errno ? errno : EIO;
        clearerr(stdout);
        lost_stdout(p, e);
    }
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
    flush_stdout(p);
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
    flush_stdout(p);
}

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
static const char *const phase_names[PH_COUNT] = {"dist",       "backend", "data",      "model",
                                                  "checkpoint", "sync",    "first step"};

struct profile {
    int on, printed;
    double wall0; /* main() on the real-time clock, seconds since the epoch */
    double t0;    /* main() on the monotonic clock */
    double mark;  /* end of the last phase */
    double ms[PH_COUNT];
};

static struct profile prof;

static void profile_start(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    prof.t0 = prof.mark = mg_seconds();
    prof.wall0 = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The time since the last mark goes to phase ph. */
static void profile_mark(enum phase ph)
{
    double now = mg_seconds();
    prof.ms[ph] += (now - prof.mark) * 1e3;
    prof.mark = now;
}

/* One line on stderr, on every rank, once the first step is done: the wall
 * clock times let a benchmark line it up with the launcher's events. */
static void profile_print(int rank)
{
    char buf[512];
    int n = 0;
    if (!prof.on || prof.printed)
        return;
    prof.printed = 1;
    for (int i = 0; i < PH_COUNT; i++)
        n += snprintf(buf + n, sizeof(buf) - (size_t)n, "%s%s %.1f ms", i ? ", " : "",
                      phase_names[i], prof.ms[i]);
    double total = (prof.mark - prof.t0) * 1e3;
    fprintf(stderr,
            TRAIN_PROG ": startup: rank %d: %s; total %.1f ms (main at %.6f, first step done at "
                       "%.6f, unix time)\n",
            rank, buf, total, prof.wall0, prof.wall0 + total / 1e3);
}

/* ---- setup ------------------------------------------------------------------------------ */

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
};

/* The first failed metrics write is said when it happens; the training goes
 * on (its checkpoints are its real output) and exits with EXIT_INCOMPLETE. */
static void check_output(struct run *r, int rc)
{
    if (rc >= 0 || r->out_failed)
        return;
    r->out_failed = 1;
    fprintf(stderr,
            TRAIN_PROG ": %s (no more records are written there; the exit status will be %d)\n",
            mg_metrics_errmsg(r->out.metrics), EXIT_INCOMPLETE);
}

/* The launcher's environment (world size 1 without one): joins the other
 * ranks, then sets the per-process batch and learning rate from the world size. */
static int setup_dist(struct run *r)
{
    struct train_options *o = r->o;
    char err[1024];
    memset(&r->dist, 0, sizeof(r->dist));
    struct mg_dist_opts dopts = {.backend = r->be,
                                 .device_index = r->device_index,
                                 .device_auto = o->device_auto,
                                 .auto_why = r->auto_why};
    int rc = mg_dist_init(&r->dist.d, &dopts, err, sizeof(err));
    if (rc < 0) {
        fail("%s", err);
        return rc;
    }
    error_dist = r->dist.d;
    r->dist.rank = r->dist.d->rank;
    r->dist.world = r->dist.d->world;
    if (o->global_batch) {
        long per = (o->global_batch + r->dist.world - 1) / r->dist.world;
        if (per > TRAIN_MAX_BATCH) {
            fail("--global-batch-size %ld over %d processes is %ld per process: at most %d",
                 o->global_batch, r->dist.world, per, TRAIN_MAX_BATCH);
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
    struct train_options *o = r->o;
    char err[1024];
    if (r->dist.world == 1)
        return 0;
    struct mg_ddp_opts dopts = {
        .bucket_cap = o->bucket_cap_mb > 0 ? (size_t)(o->bucket_cap_mb * 1048576.0) : 0,
        .no_thread = o->no_comm_thread,
        .zero = o->zero,
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

/* Both sets' images must be what the models take: a wrong one is named. */
static int check_images(const struct run *r)
{
    const struct mg_dataset *sets[2] = {&r->train, &r->test};
    for (int i = 0; i < 2; i++) {
        const struct mg_dataset *d = sets[i];
        if (d->h == MG_MODEL_INPUT_H && d->w == MG_MODEL_INPUT_W)
            continue;
        fail("%s: '%s' holds %dx%d images; the models take %dx%d", mg_data_name(r->o->data),
             d->images[0] ? d->images : d->name, d->h, d->w, MG_MODEL_INPUT_H, MG_MODEL_INPUT_W);
        return -MG_ESHAPE;
    }
    return 0;
}

/* The compute device, before the communicator that follows it: CUDA device
 * LOCAL_RANK (within the CUDA_VISIBLE_DEVICES mglaunch sets from --gpu_ids),
 * for --device cuda, or for auto when the driver shows it usable. A GPU that
 * cannot be used (no plugin, library, driver or device) is a one-line error
 * with exit status 2, as a bad flag is. */
static int setup_backend(struct run *r)
{
    struct train_options *o = r->o;
    struct mg_dist_env env;
    char err[MG_ERRMSG_LEN];
    int rc = mg_dist_env_read(&env, err, sizeof(err));
    if (rc < 0) {
        fail("%s", err);
        return rc;
    }
    r->device_index = env.local_rank;
    if (o->device_auto)
        o->device = mg_device_auto(r->device_index, r->auto_why, sizeof(r->auto_why));
    struct mg_backend_opts bo = {.threads = o->threads, .device_index = r->device_index};
    rc = mg_backend_open(o->device, &bo, &r->be, err, sizeof(err));
    if (rc < 0) {
        fail("cannot start the %s backend: %s", o->device == MG_DEVICE_CUDA ? "cuda" : "cpu", err);
        if (rc == -MG_EUNSUPPORTED || rc == -ENOENT || rc == -MG_EFORMAT || rc == -MG_EVERSION ||
            rc == -ENXIO || rc == -ENODEV)
            r->exit_code = EXIT_USAGE;
    }
    return rc;
}

/* The training and test sets, through the dataset cache unless it is off.
 * What the cache could not do is said once per host (it is no error). */
static int load_data(struct run *r, char *err)
{
    const struct train_options *o = r->o;
    char dir[PATH_MAX] = "";
    if (o->data_cache)
        snprintf(dir, sizeof(dir), "%s", strcmp(o->data_cache, "off") ? o->data_cache : "");
    else if (mg_data_cache_dir(dir, sizeof(dir)) < 0)
        dir[0] = '\0';
    int rc = mg_dataset_load_cached(&r->train, o->data, o->data_dir, 1, o->train_samples, dir, err);
    if (rc == 0)
        rc = mg_dataset_load_cached(&r->test, o->data, o->data_dir, 0, o->test_samples, dir, err);
    if (rc < 0)
        return rc;
    const struct mg_dataset *sets[2] = {&r->train, &r->test};
    for (int i = 0; i < 2; i++) {
        int st = sets[i]->cache;
        if ((st == MG_DATA_CACHE_BYPASSED || st == MG_DATA_CACHE_REBUILT) &&
            r->dist.d->local_rank == 0)
            fprintf(stderr, TRAIN_PROG ": warning: %s\n", sets[i]->cache_note);
        else if (st == MG_DATA_CACHE_BUILT && prof.on)
            fprintf(stderr, TRAIN_PROG ": %s\n", sets[i]->cache_note);
    }
    return 0;
}

static int setup(struct run *r)
{
    struct train_options *o = r->o;
    char err[MG_ERRMSG_LEN];
    int rc;

    rc = setup_backend(r);
    if (rc < 0)
        return rc;
    profile_mark(PH_BACKEND);
    rc = setup_dist(r);
    if (rc < 0)
        return rc;
    profile_mark(PH_DIST);
    rc = load_data(r, err);
    if (rc < 0) {
        fail("cannot load %s: %s", mg_data_name(o->data), err);
        return rc;
    }
    rc = check_images(r);
    if (rc < 0)
        return rc;
    profile_mark(PH_DATA);
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
    train_describe_run(o, r->train.n, r->dist.lr_scale, &r->dist.d->env, r->run_config,
                       sizeof(r->run_config), r->run_id, sizeof(r->run_id));
    cfg.run_id = r->run_id;
    cfg.run_id_hash = mg_run_id_hash(r->run_id);
    cfg.run_config = r->run_config;
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
    profile_mark(PH_MODEL);
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
    const struct train_options *o = r->o;
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
            TRAIN_PROG
            ": warning: resharding a checkpoint of %d process%s: world size %d -> %d, "
            "effective batch %ld -> %ld (%d per process x %d x %d accum), lr %g -> %g; %s\n",
            ri->world, ri->world == 1 ? "" : "es", ri->world, r->dist.world, was, now,
            o->batch_size, r->dist.world, o->accum_steps, ri->lr, o->lr, where);
    long g = ri->global_batch ? ri->global_batch : (long)ri->batch_size * ri->world;
    if (was != now && !o->global_batch)
        fprintf(stderr,
                TRAIN_PROG
                ": warning: --batch-size is per process, so the effective batch follows the "
                "world size; --global-batch-size %ld keeps it (each process takes ceil(%ld / "
                "%d))%s\n",
                g, g, r->dist.world,
                o->scale_lr ? "" : "; --scale-lr linear scales the lr with the world size");
}

/* A resumed checkpoint must continue this run: what differs in its
 * configuration (lr, schedule, optimizer settings...) stops an automatic or
 * --resume auto resume; --resume PATH takes the weights on purpose and is
 * only warned. (Shapes, batch, seed and data were checked by the load.) */
static int check_fit(struct run *r, const char *path, int explicit_path)
{
    const char *diff = r->trainer.resumed.config_diff;
    if (!diff[0])
        return 0;
    if (explicit_path) {
        if (r->dist.rank == 0)
            fprintf(stderr,
                    TRAIN_PROG ": warning: '%s' was written with another configuration: %s; "
                               "going on with this run's\n",
                    path, diff);
        return 0;
    }
    fail("cannot resume: '%s' does not fit this run: written with %s. Run with its settings, "
         "or start from its weights with --resume %s and another --checkpoint-dir",
         path, diff, path);
    return -MG_ECONFIG;
}

/* Loads what --resume says (or, with quiet, this run's newest checkpoint in
 * --checkpoint-dir, saying nothing when there is none) and says where the run
 * goes on from. own: the runs whose checkpoints in --checkpoint-dir count. */
static int load_checkpoint(struct run *r, const char *what, const struct mg_ckpt_owner *own,
                           int quiet)
{
    struct train_options *o = r->o;
    char err[MG_ERRMSG_LEN];
    static struct mg_resume_report rep;
    int rc, explicit_path = strcmp(what, "auto") != 0;
    if (!explicit_path || is_dir(what)) {
        const char *dir = explicit_path ? what : o->checkpoint_dir;
        rc = mg_trainer_resume_latest(&r->trainer, dir, explicit_path ? NULL : own, &rep, err);
        for (int i = 0; i < rep.nskipped && r->dist.rank == 0; i++)
            fprintf(stderr, TRAIN_PROG ": warning: skipping a corrupt checkpoint: %s\n",
                    rep.skipped[i]);
        if (rc < 0) {
            fail("cannot resume: %s", err);
            return rc;
        }
        if (!rep.found) {
            if (explicit_path) {
                fail("cannot resume: no complete checkpoint in '%s'", dir);
                return -ENOENT;
            }
            if (!quiet && r->dist.rank == 0)
                say(&r->prog, TRAIN_PROG ": no checkpoint in '%s' yet: starting from step 0", dir);
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
    rc = check_fit(r, what, explicit_path);
    if (rc < 0)
        return rc;
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
        say(&r->prog, TRAIN_PROG ": resumed from %s (step %ld, epoch %ld), param hash %016" PRIx64,
            what, t->step, t->resumed.epoch + 1, mg_model_param_hash(&r->model));
        if (moved)
            say(&r->prog, TRAIN_PROG ": %ld epoch%s now end at step %ld", o->epochs,
                o->epochs == 1 ? "" : "s", total);
    }
    return 0;
}

/* --resume auto with --upload, and no complete checkpoint here (a new
 * machine after a preemption): rank 0 fetches the newest one the
 * destination has, marked as this run's (--resume auto takes a directory
 * over); the others wait for it. */
static int fetch_remote(struct run *r, const char *dir)
{
    char err[MG_ERRMSG_LEN], path[MG_CKPT_PATH_MAX], shown[512];
    uint64_t step;
    int rc = 0;
    if (r->dist.rank == 0 && mg_ckpt_list(dir, &step, 1) == 0) {
        mg_upload_describe(r->o->upload, shown, sizeof(shown));
        rc = train_out_fetch_latest(r->o, dir, r->trainer.cfg.run_id_hash, path, sizeof(path), err,
                                    sizeof(err));
        if (rc < 0) {
            fail("cannot fetch the newest checkpoint from %s: %s", shown, err);
            return rc;
        }
        if (rc > 0)
            say(&r->prog, TRAIN_PROG ": no checkpoint in '%s': fetched %s from %s", dir, path,
                shown);
    }
    if (r->dist.ddp && (rc = mg_ddp_barrier(r->dist.ddp)) < 0) {
        fail("cannot resume: %s", mg_ddp_errmsg(r->dist.ddp));
        return rc;
    }
    return 0;
}

/* When to resume (docs/train.md, "Resume"): --resume; or, with a
 * --checkpoint-dir of this run's, from its newest checkpoint (a restart, an
 * elastic re-formation, or the same command again). Another run's directory
 * is refused unless told (train_claim_dir). */
static int resume(struct run *r)
{
    struct train_options *o = r->o;
    char err[MG_ERRMSG_LEN];
    const char *what = o->resume, *dir = o->checkpoint_dir;
    const struct mg_ckpt_owner *only = NULL;
    int quiet = 0, rc;
    if (dir && what && strcmp(what, "auto") == 0 && o->upload) {
        rc = fetch_remote(r, dir);
        if (rc < 0)
            return rc;
    }
    if (dir) {
        rc = train_claim_dir(dir, o->resume, r->trainer.cfg.run_id_hash, r->run_id, &r->owner,
                             r->took_from, sizeof(r->took_from), err, sizeof(err));
        if (rc < 0 || rc == TRAIN_DIR_REFUSED) {
            fail("%s", err);
            return rc < 0 ? rc : -MG_ECONFIG;
        }
        only = &r->owner;
        if (!what) {
            what = "auto";
            quiet = 1;
        }
    }
    if (what) {
        rc = load_checkpoint(r, what, only, quiet);
        if (rc < 0)
            return rc;
    }
    if (dir && r->dist.rank == 0) {
        rc = mg_ckpt_owner_write(dir, &r->owner, err);
        if (rc < 0) {
            fail("cannot claim checkpoint directory: %s", err);
            return rc;
        }
        if (r->took_from[0])
            fprintf(stderr,
                    TRAIN_PROG ": warning: this run ('%s') took '%s' over from run %s: its "
                               "checkpoints count as this run's from now on\n",
                    r->run_id, dir, r->took_from);
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
        check_output(r, train_out_eval(&r->out, r->trainer.step, epoch, loss, acc, ev->count));
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
        rc = mg_trainer_gather_state(&r->trainer); /* a sharded optimizer's state */
        if (rc < 0) {
            fail("cannot write a checkpoint: %s",
                 rc == -ENOMEM ? "out of memory for the whole optimizer state"
                               : mg_ddp_errmsg(r->dist.ddp));
            return rc;
        }
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
        rc = train_dir_still_ours(dir, &r->owner, err, sizeof(err));
        if (rc < 0) {
            fail("cannot write a checkpoint: %s", err);
            goto out;
        }
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
        rc = mg_ckpt_mark_complete(dir, (uint64_t)r->trainer.step, r->owner.run, err);
        if (rc < 0) {
            fail("cannot write a checkpoint: %s", err);
            goto out;
        }
        int prc = mg_ckpt_prune(dir, r->o->keep_checkpoints, &r->owner);
        if (prc < 0)
            fprintf(stderr, TRAIN_PROG ": warning: cannot remove old checkpoints in '%s': %s\n",
                    dir, mg_strerror(prc));
        /* the metrics as durable as the checkpoint they go with */
        if (r->out.metrics)
            check_output(r, mg_metrics_flush(r->out.metrics));
        train_out_upload_checkpoint(&r->out, dir, r->trainer.step);
    }
out:
    free(states);
    return rc;
}

/* What the loop counts: since the last progress report (this rank's figures,
 * summed over the ranks when reported) and over the whole run. */
struct tally {
    double t0;            /* the loop's start */
    long start_step;      /* the step it started from (after a resume) */
    double train_time;    /* seconds in steps, without evaluation and checkpoints */
    double total_samples; /* over every rank */
    double log_t0;        /* start of the report interval, less evaluation and checkpoints */
    double log_loss, log_correct, log_samples;
    double log_step_time; /* this rank's seconds in steps since the last report */
    long log_steps;
    double last_loss; /* of the last report, for the progress bar */
};

/* Rank 0's opening lines: what is trained on what, and how. */
static void announce(struct run *r)
{
    const struct train_options *o = r->o;
    int world = r->dist.world;
    say(&r->prog,
        TRAIN_PROG ": model %s (%zu parameters), data %s (%d train / %d test samples), %s",
        o->model, r->model.nparams, mg_data_name(o->data), r->train.n, r->test.n, r->be->name);
    if (o->device_auto && r->be->device == MG_DEVICE_CPU)
        say(&r->prog, TRAIN_PROG ": --device auto: computing on the CPU (%s)", r->auto_why);
    say(&r->prog,
        TRAIN_PROG ": %s lr %g%s, schedule %s, batch %d per process x %d process%s x %d accum = "
                   "%d, %ld steps (%ld epoch%s)",
        mg_optim_name(o->optimizer), o->lr,
        o->optimizer == MG_OPTIM_SGD ? (o->nesterov ? " nesterov momentum" : " momentum") : "",
        mg_sched_name(o->schedule), o->batch_size, world, world == 1 ? "" : "es", o->accum_steps,
        o->batch_size * world * o->accum_steps, r->total_steps, r->epochs_total,
        r->epochs_total == 1 ? "" : "s");
    if (r->dist.lr_scale > 1.0)
        say(&r->prog, TRAIN_PROG ": lr %g = %g x %d processes (--scale-lr linear)", o->lr,
            o->lr / r->dist.lr_scale, world);
    if (world > 1)
        say(&r->prog, TRAIN_PROG ": %d processes, %s", world, r->dist.d->comm->desc);
    if (world > 1 && o->zero) {
        const struct mg_trainer *t = &r->trainer;
        size_t whole = mg_trainer_state_count(t);
        say(&r->prog,
            TRAIN_PROG ": ZeRO-1: each process keeps the optimizer state of %zu of %zu "
                       "parameters: %.1f KiB instead of %.1f KiB",
            t->opt.n, r->model.nparams, (double)t->opt.state_count * sizeof(float) / 1024.0,
            (double)whole * sizeof(float) / 1024.0);
    }
}

/* One optimizer step, and the replica check when one is due. */
static int train_step(struct run *r, struct mg_step_stats *st)
{
    struct mg_trainer *t = &r->trainer;
    int rc = mg_trainer_step(t, st);
    if (rc < 0) {
        fail("training step %ld failed: %s", t->step + 1, why(r, rc));
        return rc;
    }
    if (r->dist.ddp && r->o->check_replicas > 0 && t->step % r->o->check_replicas == 0) {
        rc = mg_ddp_check_replicas(r->dist.ddp, t->step);
        if (rc < 0) {
            fail("%s", mg_ddp_errmsg(r->dist.ddp));
            return rc;
        }
    }
    return 0;
}

/* Every rank's mean step time since the last report (one small allgather):
 * the mean over the ranks, the fastest, the slowest and who that is. */
static int step_spread(struct run *r, const struct tally *k, struct train_out_train *rec)
{
    int world = r->dist.world;
    double mine = k->log_steps ? k->log_step_time / (double)k->log_steps : 0.0, one = mine;
    double *all = world > 1 ? calloc((size_t)world, sizeof(double)) : &one;
    if (!all) {
        fail("step %ld: out of memory", r->trainer.step);
        return -ENOMEM;
    }
    if (world > 1) {
        /* through DDP: on NCCL, host values go through device memory */
        int rc = mg_ddp_allgather(r->dist.ddp, &mine, all, sizeof(mine));
        if (rc < 0) {
            fail("step %ld: cannot gather the step times of the ranks: %s", r->trainer.step,
                 mg_ddp_errmsg(r->dist.ddp));
            free(all);
            return rc;
        }
    }
    double sum = 0.0;
    rec->step_time_min_s = rec->step_time_max_s = all[0];
    rec->slowest_rank = 0;
    for (int i = 0; i < world; i++) {
        sum += all[i];
        if (all[i] < rec->step_time_min_s)
            rec->step_time_min_s = all[i];
        if (all[i] > rec->step_time_max_s) {
            rec->step_time_max_s = all[i];
            rec->slowest_rank = i;
        }
    }
    rec->step_time_s = sum / (double)world;
    if (world > 1)
        free(all);
    return 0;
}

/* The progress line and the train metrics record: loss and accuracy since the
 * last report, over all ranks (every rank calls this: the sums are reduced). */
static int report(struct run *r, struct tally *k, const struct mg_step_stats *st)
{
    const struct mg_trainer *t = &r->trainer;
    double sums[3] = {k->log_loss, k->log_correct, k->log_samples};
    struct train_out_train rec = {0};
    if (r->dist.hooks.reduce_sums) {
        int rc = r->dist.hooks.reduce_sums(r->dist.hooks.ctx, sums, 3);
        if (rc < 0) {
            fail("step %ld: cannot reduce the loss over the ranks: %s", t->step, why(r, rc));
            return rc;
        }
    }
    int src = step_spread(r, k, &rec);
    if (src < 0)
        return src;
    double now = mg_seconds();
    double rate = sums[2] / (now - k->log_t0 > 1e-9 ? now - k->log_t0 : 1e-9);
    k->last_loss = sums[2] > 0 ? sums[0] / sums[2] : 0.0;
    double acc = sums[2] > 0 ? sums[1] / sums[2] : 0.0;
    if (r->dist.rank == 0) {
        char news[1024];
        if (!r->prog.tty)
            say(&r->prog, "step %ld/%ld epoch %ld loss %.4f accuracy %.4f lr %.6g %.0f samples/s",
                t->step, r->total_steps, t->epoch + 1, k->last_loss, acc, st->lr, rate);
        if (train_out_upload_news(&r->out, news, sizeof(news)))
            fprintf(stderr, TRAIN_PROG ": warning: %s\n", news);
        rec.step = t->step;
        rec.epoch = t->epoch + 1;
        rec.loss = k->last_loss;
        rec.accuracy = acc;
        rec.lr = st->lr;
        rec.samples_per_s = rate;
        rec.time_s = now - k->t0;
        check_output(r, train_out_train(&r->out, &rec));
    }
    k->log_loss = k->log_correct = k->log_samples = 0.0;
    k->log_step_time = 0.0;
    k->log_steps = 0;
    k->log_t0 = mg_seconds();
    return 0;
}

/* The progress bar on a terminal: overall speed and the time left. */
static void draw_progress(struct run *r, const struct tally *k, const struct mg_step_stats *st,
                          double now)
{
    const struct mg_trainer *t = &r->trainer;
    double rate = k->train_time > 0 ? k->total_samples / k->train_time : 0.0;
    double per_step = k->train_time / (double)(t->step - k->start_step);
    draw_bar(&r->prog, t->step, r->total_steps, t->epoch + 1, r->epochs_total, k->last_loss, st->lr,
             rate, per_step * (double)(r->total_steps - t->step));
    r->prog.last_draw = now;
}

/* The last lines: test figures, speed, and the parameter hash that tells runs apart. */
static void summarize(struct run *r, const struct tally *k, const struct mg_eval_sums *ev)
{
    const struct mg_trainer *t = &r->trainer;
    double wall = mg_seconds() - k->t0;
    double rate = k->train_time > 0 ? k->total_samples / k->train_time : 0.0;
    double acc = ev->count ? (double)ev->correct / (double)ev->count : 0.0;
    double loss = ev->count ? ev->loss_sum / (double)ev->count : 0.0;
    uint64_t hash = mg_model_param_hash(&r->model);
    if (r->dist.rank != 0)
        return;
    say(&r->prog,
        TRAIN_PROG ": done: test accuracy %.4f (%ld/%ld), test loss %.4f; %ld steps, %.0f samples "
                   "in %.1f s (%.0f samples/s), wall time %.1f s; param hash %016" PRIx64,
        acc, ev->correct, ev->count, loss, t->step, k->total_samples, k->train_time, rate, wall,
        hash);
    char hex[17];
    snprintf(hex, sizeof(hex), "%016" PRIx64, hash);
    struct train_out_summary s = {
        .step = t->step,
        .epoch = t->epoch + 1,
        .test_loss = loss,
        .test_accuracy = acc,
        .samples = k->total_samples,
        .train_time_s = k->train_time,
        .samples_per_s = rate,
        .wall_time_s = wall,
        .param_hash = hex,
    };
    check_output(r, train_out_summary(&r->out, &s));
}

static int run(struct run *r)
{
    const struct train_options *o = r->o;
    struct mg_trainer *t = &r->trainer;
    struct tally k = {.t0 = mg_seconds(), .start_step = t->step};
    struct mg_eval_sums ev = {0};
    int evaluated_now = 0, rc;

    k.log_t0 = k.t0;
    if (r->dist.rank == 0) {
        announce(r);
        check_output(r, train_out_hparams(&r->out, o, r->dist.world, r->total_steps));
    }
    rc = mg_trainer_start(t);
    if (rc < 0) {
        fail("cannot synchronize the initial parameters: %s", why(r, rc));
        return rc;
    }
    rc = check_resume(r);
    if (rc < 0)
        return rc;
    if (r->out.metrics)
        check_output(r, mg_metrics_start(r->out.metrics, t->step));
    profile_mark(PH_SYNC);
    while (t->step < r->total_steps) {
        struct mg_step_stats st;
        double s0 = mg_seconds();
        rc = train_step(r, &st);
        if (rc < 0)
            return rc;
        if (!isfinite(st.loss_sum)) {
            /* before any checkpoint of it: the newest one stays a sane one */
            fail("training diverged at step %ld: the loss is %s (lr %g); lower --lr, or add "
                 "--warmup",
                 t->step, isnan(st.loss_sum) ? "NaN" : "infinite", st.lr);
            r->exit_code = EXIT_DIVERGED;
            return -ERANGE;
        }
        double s1 = mg_seconds();
        if (prof.on && !prof.printed) {
            profile_mark(PH_STEP);
            profile_print(r->dist.rank);
        }
        k.train_time += s1 - s0;
        k.log_step_time += s1 - s0;
        k.log_steps++;
        k.total_samples += (double)st.samples * r->dist.world;
        k.log_loss += st.loss_sum;
        k.log_correct += (double)st.correct;
        k.log_samples += (double)st.samples;
        evaluated_now = 0;
        int epoch_done = t->batch_in_epoch >= t->pass_batches;
        int last = t->step == r->total_steps;

        if (t->step % o->log_every == 0 || last) {
            rc = report(r, &k, &st);
            if (rc < 0)
                return rc;
        }
        if (r->prog.tty && r->dist.rank == 0 && (s1 - r->prog.last_draw > 0.1 || last))
            draw_progress(r, &k, &st, s1);
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
        k.log_t0 += mg_seconds() - s1; /* evaluation and checkpoints are not training time */
    }
    if (o->checkpoint_dir && t->step > k.start_step) {
        rc = checkpoint(r);
        if (rc < 0)
            return rc;
    }
    if (!evaluated_now) {
        rc = evaluate(r, &ev);
        if (rc < 0)
            return rc;
    }
    summarize(r, &k, &ev);
    return 0;
}

/* Rank 0's metrics and remote copies, once the rank and the run are known. */
static int open_outputs(struct run *r)
{
    char err[MG_ERRMSG_LEN];
    const struct mg_dist_env *env = &r->dist.d->env;
    struct train_out_ident id = {
        .run_id = env->launched ? env->run_id : NULL,
        .restart = env->restart_count,
        .rank = r->dist.rank,
    };
    int rc = train_out_open(&r->out, r->o, &id, err, sizeof(err));
    if (rc < 0) {
        fail("%s", err);
        return rc;
    }
    if (r->dist.rank == 0 && (rc = train_out_upload_open(&r->out, r->o, err, sizeof(err))) < 0)
        fail("--upload%s: %s", r->o->upload_cmd ? "-cmd" : "", err);
    return rc;
}

/* The bounded wait for the remote copies, and what was and was not copied.
 * Returns 1 when everything was. */
static int close_upload(struct run *r, int failed)
{
    struct mg_upload_stats st;
    if (!r->out.upload)
        return 1;
    train_out_upload_metrics(&r->out);
    long wait = failed && r->o->upload_wait > 30 ? 30 : r->o->upload_wait;
    int rc = train_out_upload_close(&r->out, wait, &st);
    char copied[200];
    snprintf(copied, sizeof(copied), "%d of %d cop%s made (%.1f MB)", st.copied,
             st.queued + st.dropped, st.queued + st.dropped == 1 ? "y" : "ies",
             (double)st.bytes / 1e6);
    if (rc == 0) {
        say(&r->prog, TRAIN_PROG ": upload to %s: %s; %d failed tr%s tried again",
            r->out.upload_shown, copied, st.retries, st.retries == 1 ? "y was" : "ies were");
        return 1;
    }
    char list[4096] = "";
    size_t n = 0;
    for (int i = 0; i < st.nlist && n < sizeof(list); i++)
        n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", i ? "; " : "", st.list[i]);
    fail("upload to %s: %s, %d given up, %d dropped (queue full), %d not sent in %ld s; %d failed "
         "tr%s tried again; not copied: %s; the last error: %s (the exit status will be %d)",
         r->out.upload_shown, copied, st.failed, st.dropped, st.pending, wait, st.retries,
         st.retries == 1 ? "y was" : "ies were", list, st.last_error[0] ? st.last_error : "none",
         EXIT_INCOMPLETE);
    return 0;
}

/* Returns 1 when every output was written whole. */
static int close_outputs(struct run *r, int failed)
{
    char err[MG_ERRMSG_LEN];
    if (!close_upload(r, failed))
        r->out_failed = 1;
    if (train_out_close(&r->out, err, sizeof(err)) < 0 && !r->out_failed) {
        r->out_failed = 1;
        fprintf(stderr, TRAIN_PROG ": %s (the exit status will be %d)\n", err, EXIT_INCOMPLETE);
    }
    return !r->out_failed;
}

int main(int argc, char **argv)
{
    struct train_options o;
    struct run r;
    char err[1024];
    int rc;

    profile_start();
    if (train_args_parse(&o, argc, argv, err, sizeof(err)) < 0) {
        fprintf(stderr, TRAIN_PROG ": %s (see " TRAIN_PROG " --help)\n", err);
        record_error(NULL, err);
        return EXIT_USAGE;
    }
    memset(&r, 0, sizeof(r));
    if (o.help || o.version) {
        if (o.help)
            train_usage(stdout);
        else
            printf(TRAIN_PROG " (mg) %s\n", MG_VERSION);
        flush_stdout(&r.prog);
        return r.prog.stdout_lost ? EXIT_INCOMPLETE : 0;
    }
    r.o = &o;
    r.prog.tty = isatty(STDOUT_FILENO);
    if (train_threads_from_env(&o, err, sizeof(err)))
        fprintf(stderr, TRAIN_PROG ": warning: %s\n", err);
    prof.on = o.profile_startup;
    rc = setup(&r);
    if (rc == 0)
        rc = open_outputs(&r);
    if (rc == 0) {
        rc = resume(&r);
        profile_mark(PH_RESUME);
    }
    if (rc == 0)
        rc = run(&r);
    /* rank 0 hosts the store: everyone leaves together */
    if (rc == 0 && r.dist.d && mg_dist_finalize(r.dist.d, MG_COMM_DEFAULT_TIMEOUT) < 0) {
        fail("%s", mg_comm_errmsg(r.dist.d->comm));
        rc = -MG_EPEER;
    }
    int complete = close_outputs(&r, rc < 0);
    flush_stdout(&r.prog);
    mg_trainer_release(&r.trainer);
    mg_ddp_release(r.dist.ddp);
    mg_model_release(&r.model);
    mg_dataset_release(&r.train);
    mg_dataset_release(&r.test);
    mg_backend_release(r.be);
    error_dist = NULL;
    mg_dist_release(r.dist.d);
    if (rc < 0)
        return r.exit_code ? r.exit_code : EXIT_FAILURE_RUN;
    return r.prog.stdout_lost || !complete ? EXIT_INCOMPLETE : 0;
}
