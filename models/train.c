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
#include "trainer.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXIT_USAGE 2

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
    mg_error_file_record(error_dist, TRAIN_PROG, msg);
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
    struct train_options *o;
    struct dist dist;
    struct mg_backend *be;
    struct mg_dataset train, test;
    struct mg_model model;
    struct mg_trainer trainer;
    long total_steps;
    long epochs_total;
    struct progress prog;
};

/* What libmg has to say while the ranks find each other: a wait that lasts
 * (with its reason), or a warning about an open store. */
static void dist_progress(void *ctx, const char *msg)
{
    (void)ctx;
    fprintf(stderr, TRAIN_PROG ": %s\n", msg);
}

/* The launcher's environment (world size 1 without one): joins the other
 * ranks, then sets the per-process batch and learning rate from the world size. */
static int setup_dist(struct run *r)
{
    struct train_options *o = r->o;
    struct mg_dist_opts dopts = {.progress = dist_progress};
    char err[1024];
    memset(&r->dist, 0, sizeof(r->dist));
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
    struct train_options *o = r->o;
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

/* When to resume (docs/train.md, "Resume"): --resume; a restart by the
 * launcher (TORCHELASTIC_RESTART_COUNT > 0); or, under a launcher, a
 * checkpoint this job wrote (same TORCHELASTIC_RUN_ID): a group re-formed
 * after a membership change restarts its workers with a restart count of 0. */
static int resume(struct run *r)
{
    struct train_options *o = r->o;
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
            fprintf(stderr, TRAIN_PROG ": warning: skipping a corrupt checkpoint: %s\n",
                    rep.skipped[i]);
        if (rc < 0) {
            fail("cannot resume: %s", err);
            return rc;
        }
        if (rep.other_run) {
            if (r->dist.rank == 0)
                fprintf(stderr,
                        TRAIN_PROG ": warning: '%s' holds another run's checkpoints (newest: step "
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
            fprintf(stderr, TRAIN_PROG ": warning: cannot remove old checkpoints in '%s': %s\n",
                    dir, mg_strerror(prc));
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

/* The progress line and the train metrics record: loss and accuracy since the
 * last report, over all ranks (every rank calls this: the sums are reduced). */
static int report(struct run *r, struct tally *k, const struct mg_step_stats *st)
{
    const struct mg_trainer *t = &r->trainer;
    double sums[3] = {k->log_loss, k->log_correct, k->log_samples};
    if (r->dist.hooks.reduce_sums) {
        int rc = r->dist.hooks.reduce_sums(r->dist.hooks.ctx, sums, 3);
        if (rc < 0) {
            fail("step %ld: cannot reduce the loss over the ranks: %s", t->step, why(r, rc));
            return rc;
        }
    }
    double now = mg_seconds();
    double rate = sums[2] / (now - k->log_t0 > 1e-9 ? now - k->log_t0 : 1e-9);
    k->last_loss = sums[2] > 0 ? sums[0] / sums[2] : 0.0;
    double acc = sums[2] > 0 ? sums[1] / sums[2] : 0.0;
    if (r->dist.rank == 0) {
        if (!r->prog.tty)
            say(&r->prog, "step %ld/%ld epoch %ld loss %.4f accuracy %.4f lr %.6g %.0f samples/s",
                t->step, r->total_steps, t->epoch + 1, k->last_loss, acc, st->lr, rate);
        metrics_line(&r->prog,
                     "{\"type\":\"train\",\"step\":%ld,\"epoch\":%ld,\"loss\":%.6f,"
                     "\"accuracy\":%.6f,\"lr\":%.9g,\"samples_per_s\":%.1f,"
                     "\"time_s\":%.3f}",
                     t->step, t->epoch + 1, k->last_loss, acc, st->lr, rate, now - k->t0);
    }
    k->log_loss = k->log_correct = k->log_samples = 0.0;
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
    metrics_line(&r->prog,
                 "{\"type\":\"summary\",\"step\":%ld,\"epoch\":%ld,\"test_loss\":%.6f,"
                 "\"test_accuracy\":%.6f,\"samples\":%.0f,\"train_time_s\":%.3f,"
                 "\"samples_per_s\":%.1f,\"wall_time_s\":%.3f,\"param_hash\":\"%016" PRIx64 "\"}",
                 t->step, t->epoch + 1, loss, acc, k->total_samples, k->train_time, rate, wall,
                 hash);
}

static int run(struct run *r)
{
    const struct train_options *o = r->o;
    struct mg_trainer *t = &r->trainer;
    struct tally k = {.t0 = mg_seconds(), .start_step = t->step};
    struct mg_eval_sums ev = {0};
    int evaluated_now = 0, rc;

    k.log_t0 = k.t0;
    if (r->dist.rank == 0)
        announce(r);
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
        rc = train_step(r, &st);
        if (rc < 0)
            return rc;
        double s1 = mg_seconds();
        k.train_time += s1 - s0;
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

int main(int argc, char **argv)
{
    struct train_options o;
    struct run r;
    char err[1024];
    int rc;

    if (train_args_parse(&o, argc, argv, err, sizeof(err)) < 0) {
        fprintf(stderr, TRAIN_PROG ": %s (see " TRAIN_PROG " --help)\n", err);
        mg_error_file_record(NULL, TRAIN_PROG, err);
        return EXIT_USAGE;
    }
    if (o.help) {
        train_usage(stdout);
        return 0;
    }
    if (o.version) {
        printf(TRAIN_PROG " (mg) %s\n", MG_VERSION);
        return 0;
    }
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
