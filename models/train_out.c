/* train's metrics (see train_out.h): where they go, the replayed steps of a
 * restart, and the records train writes, field by field (docs/metrics.md). */
#include "train_out.h"
#include "mg_err.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The launcher's word on where this attempt's files go: both variables, or
 * neither (a worker of torchrun, or train on its own). */
static void read_env(struct train_out *to)
{
    const char *dir = getenv("MG_RUN_LOG_DIR"), *att = getenv("MG_ATTEMPT");
    char *end;
    to->run_dir[0] = '\0';
    to->attempt = -1;
    if (!dir || !*dir || !att || !*att)
        return;
    errno = 0;
    long a = strtol(att, &end, 10);
    if (*end || errno || a < 0 || a > 1000000000 || strlen(dir) >= sizeof(to->run_dir) - 64)
        return;
    snprintf(to->run_dir, sizeof(to->run_dir), "%s", dir);
    to->attempt = (int)a;
}

/* The highest step run_id recorded in the metrics files of the attempts
 * before this one (on this node), -1 when none: a restart resumes from its
 * last checkpoint and trains the steps after it again. */
static long prior_step(const struct train_out *to, const char *run_id)
{
    long best = -1;
    DIR *d = opendir(to->run_dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char *end, path[PATH_MAX + 300];
        long s;
        if (strncmp(e->d_name, "attempt_", 8) != 0)
            continue;
        long a = strtol(e->d_name + 8, &end, 10);
        if (*end || end == e->d_name + 8 || a >= to->attempt)
            continue;
        mg_fmt(path, sizeof(path), "%s/%s/metrics.jsonl", to->run_dir, e->d_name);
        if (mg_metrics_last_step(path, run_id, &s) == 0 && s > best)
            best = s;
    }
    if (d)
        closedir(d);
    return best;
}

/* A directory given, or the run directory's sub-directory for "". */
static int where(char *out, size_t cap, const char *given, const struct train_out *to,
                 const char *sub)
{
    if (!given) {
        out[0] = '\0';
        return 0;
    }
    if (*given)
        return mg_fmt(out, cap, "%s", given) < 0 ? -ENAMETOOLONG : 0;
    return mg_fmt(out, cap, "%s/%s", to->run_dir, sub) < 0 ? -ENAMETOOLONG : 0;
}

int train_out_open(struct train_out *to, const struct train_options *o,
                   const struct train_out_ident *id, char *err, size_t errlen)
{
    memset(to, 0, sizeof(*to));
    to->prior_step = -1;
    read_env(to);
    if (id->rank != 0)
        return 0;
    int rc = where(to->tb, sizeof(to->tb), o->tensorboard, to, "tensorboard");
    if (rc == 0)
        rc = where(to->csv, sizeof(to->csv), o->csv, to, "csv");
    if (rc == 0 && o->metrics)
        rc = mg_fmt(to->jsonl, sizeof(to->jsonl), "%s", o->metrics) < 0 ? -ENAMETOOLONG : 0;
    else if (rc == 0 && to->attempt >= 0)
        rc = mg_fmt(to->jsonl, sizeof(to->jsonl), "%s/attempt_%d/metrics.jsonl", to->run_dir,
                    to->attempt) < 0
                 ? -ENAMETOOLONG
                 : 0;
    if (rc < 0)
        return mg_seterr(err, errlen, rc, "a metrics path is too long");
    if (!to->jsonl[0] && !to->tb[0] && !to->csv[0])
        return 0;

    struct mg_metrics_config cfg = {
        .jsonl_path = to->jsonl[0] ? to->jsonl : NULL,
        .tb_dir = to->tb[0] ? to->tb : NULL,
        .csv_dir = to->csv[0] ? to->csv : NULL,
        .run_id = id->run_id,
        .restart = id->restart,
        .rank = id->rank,
    };
    /* A file of its own per attempt: the earlier attempts' files say what
     * was recorded before. An appended --metrics file says it itself. */
    if (!o->metrics && to->attempt >= 0 && id->run_id) {
        to->prior_step = prior_step(to, id->run_id);
        cfg.prior_step_set = 1;
        cfg.prior_step = to->prior_step;
    }
    return mg_metrics_open(&to->metrics, &cfg, err, errlen);
}

int train_out_hparams(struct train_out *to, const struct train_options *o, int world,
                      long total_steps)
{
    if (!to->metrics)
        return 0;
    struct mg_metric f[] = {
        mg_metric_text("model", o->model),
        mg_metric_text("data", mg_data_name(o->data)),
        mg_metric_text("optimizer", mg_optim_name(o->optimizer)),
        mg_metric_real("lr", o->lr, 0),
        mg_metric_text("schedule", mg_sched_name(o->schedule)),
        mg_metric_int("batch_size", o->batch_size),
        mg_metric_int("accum_steps", o->accum_steps),
        mg_metric_int("world_size", world),
        mg_metric_int("global_batch", (long long)o->batch_size * world * o->accum_steps),
        mg_metric_int("steps", total_steps),
        mg_metric_int("seed", (long long)o->seed),
        mg_metric_text("device", o->device == MG_DEVICE_CUDA ? "cuda" : "cpu"),
    };
    return mg_metrics_hparams(to->metrics, f, (int)(sizeof(f) / sizeof(f[0])));
}

int train_out_train(struct train_out *to, const struct train_out_train *t)
{
    if (!to->metrics)
        return 0;
    struct mg_metric f[] = {
        mg_metric_int("epoch", t->epoch),
        mg_metric_real("loss", t->loss, 7),
        mg_metric_real("accuracy", t->accuracy, 6),
        mg_metric_real("lr", t->lr, 9),
        mg_metric_real("samples_per_s", t->samples_per_s, 6),
        mg_metric_real("time_s", t->time_s, 7),
        mg_metric_real("step_time_s", t->step_time_s, 6),
        mg_metric_real("step_time_min_s", t->step_time_min_s, 6),
        mg_metric_real("step_time_max_s", t->step_time_max_s, 6),
        mg_metric_int("slowest_rank", t->slowest_rank),
    };
    return mg_metrics_record(to->metrics, "train", t->step, f, (int)(sizeof(f) / sizeof(f[0])));
}

int train_out_eval(struct train_out *to, long step, long epoch, double loss, double accuracy,
                   long samples)
{
    if (!to->metrics)
        return 0;
    struct mg_metric f[] = {
        mg_metric_int("epoch", epoch),
        mg_metric_real("test_loss", loss, 7),
        mg_metric_real("test_accuracy", accuracy, 6),
        mg_metric_int("test_samples", samples),
    };
    return mg_metrics_record(to->metrics, "eval", step, f, (int)(sizeof(f) / sizeof(f[0])));
}

int train_out_summary(struct train_out *to, const struct train_out_summary *s)
{
    if (!to->metrics)
        return 0;
    struct mg_metric f[] = {
        mg_metric_int("epoch", s->epoch),
        mg_metric_real("test_loss", s->test_loss, 7),
        mg_metric_real("test_accuracy", s->test_accuracy, 6),
        mg_metric_real("samples", s->samples, 0),
        mg_metric_real("train_time_s", s->train_time_s, 7),
        mg_metric_real("samples_per_s", s->samples_per_s, 6),
        mg_metric_real("wall_time_s", s->wall_time_s, 7),
        mg_metric_text("param_hash", s->param_hash),
    };
    return mg_metrics_record(to->metrics, "summary", s->step, f, (int)(sizeof(f) / sizeof(f[0])));
}

int train_out_close(struct train_out *to, char *err, size_t errlen)
{
    int rc = mg_metrics_close(to->metrics, err, errlen);
    to->metrics = NULL;
    return rc;
}
