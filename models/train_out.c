/* train's metrics (see train_out.h): where they go, the replayed steps of a
 * restart, and the records train writes, field by field (docs/metrics.md). */
#include "train_out.h"
#include "checkpoint.h"
#include "fs.h"
#include "mg_err.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* ---- Kubeflow Trainer's progress ---------------------------------------------------------- */

int train_out_status_open(struct train_out *to, char *msg, size_t cap)
{
    struct mg_tstatus_config c;
    char err[MG_ERRMSG_LEN];
    if (!mg_tstatus_config_from_env(&c))
        return 0;
    int rc = mg_tstatus_open(&to->tstatus, &c, err, sizeof(err));
    if (rc < 0) {
        mg_fmt(msg, cap, "cannot report progress to Kubeflow Trainer: %s; training goes on", err);
        return 1;
    }
    return 0;
}

void train_out_status(struct train_out *to, long step, long total, double eta_s, double loss,
                      double accuracy, double lr, int test)
{
    struct mg_tstatus_report r = {0};
    if (!to->tstatus)
        return;
    r.percent = total > 0 ? (int)(step * 100 / total) : 0;
    r.eta_s = eta_s >= 0 && eta_s < 1e12 ? (long long)(eta_s + 0.5) : -1;
    static const char *const names[2][2] = {{"loss", "accuracy"}, {"test_loss", "test_accuracy"}};
    double v[3] = {loss, accuracy, lr};
    for (int i = 0; i < (test ? 2 : 3); i++) {
        snprintf(r.metrics[r.nmetrics].name, sizeof(r.metrics[0].name), "%s",
                 i < 2 ? names[test != 0][i] : "learning_rate");
        r.metrics[r.nmetrics++].value = v[i];
    }
    mg_tstatus_update(to->tstatus, &r);
}

int train_out_status_news(struct train_out *to, char *msg, size_t cap)
{
    return mg_tstatus_news(to->tstatus, msg, cap);
}

int train_out_status_close(struct train_out *to, int wait_ms, char *msg, size_t cap)
{
    if (!to->tstatus)
        return 0;
    mg_tstatus_flush(to->tstatus, wait_ms);
    int news = mg_tstatus_news(to->tstatus, msg, cap);
    mg_tstatus_close(to->tstatus);
    to->tstatus = NULL;
    return news;
}

/* ---- remote copies ------------------------------------------------------------------------ */

int train_out_upload_config(const struct train_options *o, struct mg_upload_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->dest = o->upload;
    cfg->cmd = o->upload_cmd;
    return o->upload || o->upload_cmd;
}

int train_out_upload_open(struct train_out *to, const struct train_options *o, char *err,
                          size_t errlen)
{
    struct mg_upload_config cfg;
    if (!train_out_upload_config(o, &cfg))
        return 0;
    if (o->upload)
        mg_upload_describe(o->upload, to->upload_shown, sizeof(to->upload_shown));
    else
        mg_fmt(to->upload_shown, sizeof(to->upload_shown), "command '%s'", o->upload_cmd);
    return mg_upload_open(&to->upload, &cfg, err, errlen);
}

/* The name of a metrics file at the destination. */
static int remote_metrics_name(const struct train_out *to, const char *path, char *name, size_t cap)
{
    size_t tb = strlen(to->tb), csv = strlen(to->csv);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (strcmp(path, to->jsonl) == 0 && to->attempt >= 0 && to->run_dir[0] &&
        strncmp(path, to->run_dir, strlen(to->run_dir)) == 0)
        return mg_fmt(name, cap, "metrics/attempt_%d/%s", to->attempt, base);
    if (strcmp(path, to->jsonl) == 0)
        return mg_fmt(name, cap, "metrics/%s", base);
    if (tb && strncmp(path, to->tb, tb) == 0 && path[tb] == '/')
        return mg_fmt(name, cap, "tensorboard/%s", path + tb + 1);
    if (csv && strncmp(path, to->csv, csv) == 0 && path[csv] == '/')
        return mg_fmt(name, cap, "csv/%s", path + csv + 1);
    return mg_fmt(name, cap, "metrics/%s", base);
}

void train_out_upload_metrics(struct train_out *to)
{
    const char *files[8];
    char name[MG_UPLOAD_NAME_MAX];
    if (!to->upload)
        return;
    int n = mg_metrics_files(to->metrics, files, 8);
    for (int i = 0; i < n; i++) {
        if (remote_metrics_name(to, files[i], name, sizeof(name)) < 0)
            continue;
        struct mg_upload_part p = {.name = name, .path = files[i]};
        /* a newer snapshot replaces one still waiting; a file not made yet is skipped */
        mg_upload_queue(to->upload, &p, 1, 1);
    }
}

void train_out_upload_checkpoint(struct train_out *to, const char *dir, long step)
{
    char file[MG_CKPT_PATH_MAX], marker[MG_CKPT_PATH_MAX], n1[300], n2[300], latest[64];
    if (!to->upload)
        return;
    mg_ckpt_path(dir, (uint64_t)step, file, sizeof(file));
    mg_ckpt_marker_path(dir, (uint64_t)step, marker, sizeof(marker));
    const char *b1 = strrchr(file, '/'), *b2 = strrchr(marker, '/');
    b1 = b1 ? b1 + 1 : file;
    b2 = b2 ? b2 + 1 : marker;
    mg_fmt(n1, sizeof(n1), "checkpoints/%s", b1);
    mg_fmt(n2, sizeof(n2), "checkpoints/%s", b2);
    mg_fmt(latest, sizeof(latest), "%s\n", b1);
    struct mg_upload_part parts[3] = {
        {.name = n1, .path = file},
        {.name = n2, .path = marker},
        {.name = "checkpoints/LATEST", .text = latest},
    };
    mg_upload_queue(to->upload, parts, 3, 0);
    train_out_upload_metrics(to);
}

int train_out_upload_news(struct train_out *to, char *msg, size_t cap)
{
    struct mg_upload_stats st;
    if (!to->upload)
        return 0;
    mg_upload_stats(to->upload, &st);
    int failed = st.failed + st.dropped;
    if (failed <= to->upload_failed_seen)
        return 0;
    mg_fmt(msg, cap, "upload to %s: %d cop%s given up so far; the last: %s", to->upload_shown,
           failed, failed == 1 ? "y" : "ies", st.nlist ? st.list[st.nlist - 1] : st.last_error);
    to->upload_failed_seen = failed;
    return 1;
}

int train_out_upload_close(struct train_out *to, long wait_s, struct mg_upload_stats *st)
{
    if (!to->upload)
        return 1;
    int rc = mg_upload_close(to->upload, (int)(wait_s * 1000), st);
    to->upload = NULL;
    return rc;
}

/* "ckpt-<12 digits>.mgc": the only names LATEST may hold. */
static long ckpt_step_of(const char *name)
{
    if (strlen(name) != 21 || strncmp(name, "ckpt-", 5) != 0 || strcmp(name + 17, ".mgc") != 0)
        return -1;
    long step = 0;
    for (int i = 5; i < 17; i++) {
        if (name[i] < '0' || name[i] > '9')
            return -1;
        step = step * 10 + (name[i] - '0');
    }
    return step;
}

int train_out_fetch_latest(const struct train_options *o, const char *dir, uint64_t run, char *path,
                           size_t pathlen, char *err, size_t errlen)
{
    struct mg_upload_config cfg;
    char tmp[PATH_MAX], name[64] = "", remote[128], e2[MG_ERRMSG_LEN];
    if (!train_out_upload_config(o, &cfg) || !o->upload)
        return 0;
    int rc = mg_mkdir_p(dir, 0755);
    if (rc < 0)
        return mg_seterr(err, errlen, rc, "cannot create '%s': %s", dir, mg_strerror(rc));
    if (mg_fmt(tmp, sizeof(tmp), "%s/.LATEST.fetch", dir) < 0)
        return mg_seterr(err, errlen, -ENAMETOOLONG, "'%s': name too long", dir);
    rc = mg_upload_fetch(&cfg, "checkpoints/LATEST", tmp, err, errlen);
    if (rc == -ENOENT)
        return 0;
    if (rc < 0)
        return rc;
    FILE *f = fopen(tmp, "re");
    if (f) {
        if (!fgets(name, sizeof(name), f))
            name[0] = '\0';
        fclose(f);
    }
    unlink(tmp);
    name[strcspn(name, "\r\n")] = '\0';
    long step = ckpt_step_of(name);
    if (step < 0)
        return mg_seterr(err, errlen, -MG_EFORMAT,
                         "checkpoints/LATEST at the destination names no checkpoint ('%.40s')",
                         name);
    mg_fmt(remote, sizeof(remote), "checkpoints/%s", name);
    mg_ckpt_path(dir, (uint64_t)step, path, pathlen);
    rc = mg_upload_fetch(&cfg, remote, path, err, errlen);
    if (rc == -ENOENT)
        return mg_seterr(err, errlen, -ENOENT, "checkpoints/LATEST names %s, which is not there",
                         name);
    if (rc < 0)
        return rc;
    /* whole, or nothing: a bad copy is not marked complete */
    struct mg_ckpt_file cf;
    rc = mg_ckpt_read(path, &cf, e2);
    if (rc < 0) {
        unlink(path);
        return mg_seterr(err, errlen, rc, "the copy of %s does not read back: %s", name, e2);
    }
    mg_ckpt_file_release(&cf);
    rc = mg_ckpt_mark_complete(dir, (uint64_t)step, run, e2);
    if (rc < 0)
        return mg_seterr(err, errlen, rc, "%s", e2);
    return 1;
}
