/* The training loop (see train_internal.h): steps, the replica check,
 * progress reports with the step time spread over the ranks, evaluation,
 * checkpoints, and the opening and closing lines of rank 0. */
#include "progress.h"
#include "redact.h"
#include "rtutil.h"
#include "train_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The message for a failed step or evaluation: a collective's, when one failed. */
static const char *why(struct run *r, int rc)
{
    const char *m = mg_ddp_errmsg(r->dist.ddp);
    return m && *m ? m : mg_strerror(rc);
}

int train_read_sums(struct run *r, struct mg_train_sums *s, int reset)
{
    struct mg_trainer *t = &r->trainer;
    int rc = mg_trainer_sums(t, s, reset);
    if (rc < 0) {
        fail("training step %ld failed: %s", t->step, why(r, rc));
        return rc;
    }
    if (s->bad_step) {
        /* before any checkpoint or snapshot of it: the newest one stays a sane one */
        fail("training diverged at step %ld: the loss is %s (lr %g); lower --lr, or add "
             "--warmup",
             s->bad_step, isnan(s->bad_loss) ? "NaN" : "infinite",
             mg_schedule_lr(&t->cfg.sched, s->bad_step - 1));
        r->exit_code = EXIT_DIVERGED;
        return -ERANGE;
    }
    return 0;
}

static int evaluate(struct run *r, struct mg_eval_sums *ev)
{
    struct mg_train_sums sums;
    int rc = train_read_sums(r, &sums, 0); /* a diverged run is not evaluated */
    if (rc < 0)
        return rc;
    rc = mg_trainer_evaluate(&r->trainer, ev);
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
    struct mg_train_sums sums;
    int rc = train_read_sums(r, &sums, 0); /* never a checkpoint of a diverged run */
    if (rc < 0)
        return rc;
    mg_progress_phase(MG_PH_CHECKPOINT); /* bounded by the collective timeout, not by steps */
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
    double log_step_time; /* this rank's seconds in steps since the last report */
    long log_steps;
    double last_loss; /* of the last report, for the progress bar */
};

/* path as an absolute one (for a line to copy into another shell): the
 * working directory in front of a relative path. */
static void absolute(const char *path, char *out, size_t cap)
{
    char cwd[PATH_MAX];
    while (path[0] == '.' && path[1] == '/')
        path += 2;
    if (path[0] == '/' || !getcwd(cwd, sizeof(cwd)))
        mg_fmt(out, cap, "%s", path);
    else
        mg_fmt(out, cap, "%s/%s", cwd, strcmp(path, ".") ? path : "");
}

/* The file of m's under dir (TensorBoard's events file, CSV's metrics.csv
 * when name is given), or dir itself when m has none yet. */
static const char *file_under(struct mg_metrics *m, const char *dir, const char *name)
{
    const char *files[8];
    size_t n = strlen(dir);
    int k = mg_metrics_files(m, files, 8);
    for (int i = 0; i < k; i++) {
        const char *base = strrchr(files[i], '/');
        if (!strncmp(files[i], dir, n) && files[i][n] == '/' &&
            (!name || (base && !strcmp(base + 1, name))))
            return files[i];
    }
    return dir;
}

/* Rank 0's opening lines about where everything goes, each once, as
 * absolute paths or URLs without secrets (docs/train.md, "Output"). */
static void announce_outputs(struct run *r)
{
    const struct train_options *o = r->o;
    const struct train_out *to = &r->out;
    char a[PATH_MAX + 64], b[PATH_MAX + 64], line[3 * PATH_MAX];
    if (to->jsonl[0]) {
        absolute(to->jsonl, a, sizeof(a));
        say(&r->prog, TRAIN_PROG ": metrics: %s", a);
    }
    if (to->tb[0]) {
        absolute(file_under(to->metrics, to->tb, NULL), a, sizeof(a));
        absolute(to->tb, b, sizeof(b));
        say(&r->prog, TRAIN_PROG ": TensorBoard: %s (tensorboard --logdir %s)", a, b);
    }
    if (to->csv[0]) {
        absolute(file_under(to->metrics, to->csv, "metrics.csv"), a, sizeof(a));
        say(&r->prog, TRAIN_PROG ": CSV: %s", a);
    }
    if (o->checkpoint_dir) {
        char every[64], keep[64];
        absolute(o->checkpoint_dir, a, sizeof(a));
        if (o->checkpoint_every > 0)
            mg_fmt(every, sizeof(every), "every %ld step%s", o->checkpoint_every,
                   o->checkpoint_every == 1 ? "" : "s");
        else
            mg_fmt(every, sizeof(every), "after every epoch");
        if (o->keep_checkpoints > 0)
            mg_fmt(keep, sizeof(keep), "the newest %d kept", o->keep_checkpoints);
        else
            mg_fmt(keep, sizeof(keep), "all kept");
        say(&r->prog, TRAIN_PROG ": checkpoints: %s (%s and at the end; %s)", a, every, keep);
    }
    if (to->upload) {
        mg_fmt(line, sizeof(line), "%s", to->upload_shown);
        mg_redact_inplace(line, sizeof(line)); /* a command's token */
        say(&r->prog, TRAIN_PROG ": copies of the checkpoints and metrics: %s", line);
    }
}

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
    if (world > 1 || r->dist.ddp) /* one process with a test's forced communicator, too */
        say(&r->prog, TRAIN_PROG ": %d process%s, %s", world, world == 1 ? "" : "es",
            r->dist.d->comm->desc);
    if (world > 1 && o->zero) {
        const struct mg_trainer *t = &r->trainer;
        size_t whole = mg_trainer_state_count(t);
        say(&r->prog,
            TRAIN_PROG ": ZeRO-1: each process keeps the optimizer state of %zu of %zu "
                       "parameters: %.1f KiB instead of %.1f KiB",
            t->opt.n, r->model.nparams, (double)t->opt.state_count * sizeof(float) / 1024.0,
            (double)whole * sizeof(float) / 1024.0);
    }
    announce_outputs(r);
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
 * last report, over all ranks (every rank calls this: the sums are reduced).
 * On a device this is where the step loop waits for the GPU: the figures are
 * read back here (and before evaluations, checkpoints and snapshots), not
 * after every step. */
static int report(struct run *r, struct tally *k, const struct mg_step_stats *st)
{
    const struct mg_trainer *t = &r->trainer;
    struct mg_train_sums got;
    struct train_out_train rec = {0};
    int rc = train_read_sums(r, &got, 1);
    if (rc < 0)
        return rc;
    double sums[3] = {got.loss_sum, (double)got.correct, (double)got.samples};
    if (r->dist.hooks.reduce_sums) {
        rc = r->dist.hooks.reduce_sums(r->dist.hooks.ctx, sums, 3);
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
        if (train_out_status_news(&r->out, news, sizeof(news)))
            fprintf(stderr, TRAIN_PROG ": warning: %s\n", news);
        long done = t->step - k->start_step;
        train_out_status(
            &r->out, t->step, r->total_steps,
            done > 0 ? k->train_time / (double)done * (double)(r->total_steps - t->step) : -1.0,
            k->last_loss, acc, st->lr, 0);
        rec.step = t->step;
        rec.epoch = t->epoch + 1;
        rec.loss = k->last_loss;
        rec.accuracy = acc;
        rec.lr = st->lr;
        rec.samples_per_s = rate;
        rec.time_s = now - k->t0;
        check_output(r, train_out_train(&r->out, &rec));
    }
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
    /* after a resume, this start's figures and the job's total apart: the
     * samples and times are only this start's */
    char steps[96], total[64] = "";
    if (k->start_step > 0) {
        mg_fmt(steps, sizeof(steps), "%ld step%s since the resume at step %ld",
               t->step - k->start_step, t->step - k->start_step == 1 ? "" : "s", k->start_step);
        mg_fmt(total, sizeof(total), "; %ld steps in all", t->step);
    } else {
        mg_fmt(steps, sizeof(steps), "%ld steps", t->step);
    }
    say(&r->prog,
        TRAIN_PROG ": done: test accuracy %.4f (%ld/%ld), test loss %.4f; %s, %.0f samples in %.1f "
                   "s (%.0f samples/s), wall time %.1f s%s; param hash %016" PRIx64,
        acc, ev->correct, ev->count, loss, steps, k->total_samples, k->train_time, rate, wall,
        total, hash);
    if (r->snap_count)
        say(&r->prog,
            TRAIN_PROG ": %ld snapshots in memory, %.1f KiB and %.3f ms each (%.1f%% of the time "
                       "in steps)",
            r->snap_count, (double)r->snap_bytes / 1024.0, 1e3 * r->snap_time / r->snap_count,
            k->train_time > 0 ? 100.0 * r->snap_time / k->train_time : 0.0);
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
    train_out_status(&r->out, t->step, r->total_steps, 0.0, loss, acc, 0.0, 1);
}

int run(struct run *r)
{
    const struct train_options *o = r->o;
    struct mg_trainer *t = &r->trainer;
    struct tally k = {.t0 = mg_seconds(), .start_step = t->step};
    struct mg_eval_sums ev = {0};
    int evaluated_now = 0, rc;

    k.log_t0 = k.t0;
    r->snap_start = t->step;
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
    resume_record(r);
    /* a checkpoint of an earlier run of the job: its start record says
     * which, for the plot to draw that run's records first */
    const struct mg_resume_info *ri = &t->resumed;
    const char *from =
        ri->loaded && ri->run_id[0] && strcmp(ri->run_id, r->run_id) != 0 ? ri->run_id : NULL;
    if (r->out.metrics)
        check_output(r, mg_metrics_start_resumed(r->out.metrics, t->step, from));
    profile_mark(PH_SYNC);
    /* --stop-at-step: a segment of a replay (docs/train.md, "Replaying a
     * schedule"): the same run, cut after that step */
    if (o->stop_at > r->total_steps) {
        fail("--stop-at-step %ld is past this run's last step, %ld; leave it out to train to the "
             "end",
             o->stop_at, r->total_steps);
        return -EINVAL;
    }
    long end = o->stop_at > 0 ? o->stop_at : r->total_steps;
    if (end < r->total_steps && t->step >= end) {
        fail("--stop-at-step %ld: this run is already at step %ld", end, t->step);
        return -EINVAL;
    }
    while (t->step < end) {
        struct mg_step_stats st;
        double s0 = mg_seconds();
        rc = train_step(r, &st);
        if (rc < 0)
            return rc;
        if (r->be->device == MG_DEVICE_CPU) {
            /* reading costs nothing here: a diverged run stops at its step */
            struct mg_train_sums sums;
            if ((rc = train_read_sums(r, &sums, 0)) < 0)
                return rc;
        }
        int last = t->step == end;
        /* not the last: a restart from it would skip the final checkpoint */
        if (!last && (rc = snapshot_take(r, mg_seconds() - s0)) < 0)
            return rc;
        double s1 = mg_seconds();
        if (prof.on && !prof.printed) {
            profile_mark(PH_STEP);
            profile_print(r->dist.rank);
        }
        k.train_time += s1 - s0;
        k.log_step_time += s1 - s0;
        k.log_steps++;
        k.total_samples += (double)st.samples * r->dist.world;
        evaluated_now = 0;
        int epoch_done = t->batch_in_epoch >= t->pass_batches;

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
    if (end < r->total_steps) { /* nothing evaluated: a replay compares the weights */
        if (r->dist.rank == 0)
            say(&r->prog,
                TRAIN_PROG
                ": stopped after step %ld of %ld (--stop-at-step), param hash %016" PRIx64,
                t->step, r->total_steps, mg_model_param_hash(&r->model));
        return 0;
    }
    if (!evaluated_now) {
        rc = evaluate(r, &ev);
        if (rc < 0)
            return rc;
    }
    summarize(r, &k, &ev);
    return 0;
}
