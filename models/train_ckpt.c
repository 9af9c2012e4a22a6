/* Run identity and checkpoint directory ownership for train (train_ckpt.h,
 * docs/train.md "Checkpoints belong to a run"). */
#include "train_ckpt.h"
#include "mg_err.h"
#include "rtutil.h"
#include "trainer.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void train_describe_run(const struct train_options *o, int train_n, double lr_scale,
                        const struct mg_dist_env *env, char *config, size_t clen, char *run_id,
                        size_t idlen)
{
    size_t n = 0;
#define LINE(...)                                                                                  \
    (n += (size_t)snprintf(n < clen ? config + n : config, n < clen ? clen - n : 0, __VA_ARGS__))
    LINE("model %s\n", o->model);
    if (!strcmp(o->model, "mlp")) {
        LINE("hidden ");
        for (int i = 0; i < (o->model_opts.nhidden ? o->model_opts.nhidden : 1); i++)
            LINE("%s%d", i ? "," : "", o->model_opts.nhidden ? o->model_opts.hidden[i] : 256);
        LINE("\ndropout %.9g\n", (double)o->model_opts.dropout);
    }
    LINE("data %s\ntrain_samples %d\nseed %" PRIu64 "\n", mg_data_name(o->data), train_n, o->seed);
    LINE("optimizer %s\nlr %.9g\nscale_lr %s\n", mg_optim_name(o->optimizer), o->lr / lr_scale,
         o->scale_lr ? "linear" : "none");
    if (o->optimizer == MG_OPTIM_SGD)
        LINE("momentum %.9g\nnesterov %d\n", o->momentum, o->nesterov);
    else
        LINE("betas %.9g,%.9g\neps %.9g\n", o->beta1, o->beta2, o->eps);
    LINE("weight_decay %.9g\nschedule %s\nwarmup %ld\n", o->weight_decay,
         mg_sched_name(o->schedule), o->warmup);
    if (o->schedule == MG_SCHED_STEP) {
        if (o->step_size)
            LINE("step_size %ld\n", o->step_size);
        else
            LINE("step_size epoch\n");
        LINE("gamma %.9g\n", o->gamma);
    }
    if (o->schedule == MG_SCHED_COSINE)
        LINE("min_lr %.9g\n", o->min_lr);
    if (o->global_batch)
        LINE("batch global %ld\n", o->global_batch);
    else
        LINE("batch %d per process\n", o->batch_size);
    LINE("accum %d\ndrop_last %d\n", o->accum_steps, o->drop_last);
#undef LINE
    if (env->launched && mg_run_id_hash(env->run_id) != 0)
        snprintf(run_id, idlen, "%s", env->run_id);
    else
        snprintf(run_id, idlen, "config-%016" PRIx64, mg_hash64(config, strlen(config)));
}

/* The name of a run for messages: its id when the record has one. */
static void run_name(const struct mg_ckpt_owner *o, char *buf, size_t len)
{
    if (o->run_id[0])
        snprintf(buf, len, "'%s'", o->run_id);
    else if (o->run)
        snprintf(buf, len, "%016" PRIx64, o->run);
    else
        snprintf(buf, len, "(no run id: written before checkpoints recorded their run)");
}

/* 1 when path is dir or a file directly in it. */
static int inside(const char *path, const char *dir)
{
    char a[PATH_MAX], b[PATH_MAX], parent[PATH_MAX];
    if (!realpath(dir, b))
        return 0;
    if (realpath(path, a) && strcmp(a, b) == 0)
        return 1;
    snprintf(parent, sizeof(parent), "%s", path);
    char *slash = strrchr(parent, '/');
    if (!slash)
        snprintf(parent, sizeof(parent), ".");
    else if (slash == parent)
        parent[1] = '\0';
    else
        *slash = '\0';
    return realpath(parent, a) && strcmp(a, b) == 0;
}

/* This run's when its record names it, or when it holds no complete
 * checkpoint of another run. Otherwise another run's: with --resume auto (or
 * --resume PATH inside it) this run takes it over; without, it is this job's
 * when the owner's newest checkpoint fits this run, which the resume decides
 * (TRAIN_DIR_OTHER_RUN). */
int train_claim_dir(const char *dir, const char *resume, uint64_t run, const char *run_id,
                    struct mg_ckpt_owner *own, char *took_from, size_t tlen, char *err,
                    size_t errlen)
{
    struct mg_ckpt_owner cur;
    char why[MG_ERRMSG_LEN], who[MG_CKPT_RUN_ID_MAX + 64], newest[64] = "";
    struct mg_ckpt_entry *list = calloc(MG_CKPT_MAX_LIST, sizeof(*list));
    int res = TRAIN_DIR_OURS;

    memset(own, 0, sizeof(*own));
    own->run = run;
    snprintf(own->run_id, sizeof(own->run_id), "%s", run_id);
    took_from[0] = '\0';
    if (!list)
        return mg_seterr(err, errlen, -ENOMEM, "cannot look into '%s': out of memory", dir);
    int has = mg_ckpt_owner_read(dir, &cur, why);
    if (has == 1 && cur.run == run) {
        *own = cur; /* with what it took over */
        snprintf(own->run_id, sizeof(own->run_id), "%s", run_id);
        goto out;
    }
    int n = mg_ckpt_list_runs(dir, NULL, list, MG_CKPT_MAX_LIST);
    if (n < 0) {
        res = mg_seterr(err, errlen, n, "cannot list checkpoint directory '%s': %s", dir,
                        mg_strerror(n));
        goto out;
    }
    int others = 0;
    for (int i = 0; i < n; i++)
        others += list[i].run != run;
    if (has >= 0 && others == 0)
        goto out; /* nothing of another run's to lose */
    if (has < 0) {
        mg_seterr(err, errlen, -MG_ECONFIG,
                  "'%s' holds checkpoints, and %s; cannot tell whose they are: pass --resume auto "
                  "to continue from them (this run then takes the directory over), or use another "
                  "--checkpoint-dir",
                  dir, why);
        res = TRAIN_DIR_REFUSED;
        goto out;
    }
    int explicit = resume && (!strcmp(resume, "auto") || inside(resume, dir));
    /* Taken over, its checkpoints (and what it had taken over) become this
     * run's. Without --resume, only the owner's: another run's file copied
     * in is no part of the job. A directory without a record (written
     * before there were any) is its checkpoints' runs'. */
    if (has == 1) {
        run_name(&cur, who, sizeof(who));
        mg_ckpt_owner_adopt(own, cur.run);
        for (int i = 0; i < cur.nadopted; i++)
            mg_ckpt_owner_adopt(own, cur.adopted[i]);
    } else {
        struct mg_ckpt_owner last = {.run = n ? list[0].run : 0};
        run_name(&last, who, sizeof(who));
    }
    int first = -1;
    for (int i = 0; i < n; i++) {
        if (explicit || has == 0)
            mg_ckpt_owner_adopt(own, list[i].run);
        if (first < 0 && mg_ckpt_owner_has(own, list[i].run))
            first = i;
    }
    if (first >= 0)
        snprintf(newest, sizeof(newest), " (newest: step %" PRIu64 ")", list[first].step);
    snprintf(took_from, tlen, "%s%s", who, newest);
    res = explicit ? TRAIN_DIR_TAKE_OVER : TRAIN_DIR_OTHER_RUN;
    if (resume && !explicit) {
        /* --resume PATH from elsewhere starts a job from those weights: not
         * in a directory that another run's checkpoints fill */
        mg_seterr(err, errlen, -MG_ECONFIG,
                  "'%s' holds the checkpoints of another run, %s; this run is '%s' and starts from "
                  "'%s'. Use another --checkpoint-dir, or pass --resume auto to continue from "
                  "them (this run then takes the directory over)",
                  dir, took_from, run_id, resume);
        res = TRAIN_DIR_REFUSED;
    }
out:
    free(list);
    return res;
}

/* Another run may have taken the directory over (--resume auto) since this
 * one started: then this one stops rather than overwrite or prune that run's
 * checkpoints. */
int train_dir_still_ours(const char *dir, const struct mg_ckpt_owner *own, char *err, size_t errlen)
{
    struct mg_ckpt_owner cur;
    char why[MG_ERRMSG_LEN], who[MG_CKPT_RUN_ID_MAX + 64];
    int has = mg_ckpt_owner_read(dir, &cur, why);
    if (has == 1 && cur.run == own->run)
        return 0;
    if (has == 0) {
        /* removed by hand: this run's again */
        int rc = mg_ckpt_owner_write(dir, own, why);
        return rc < 0 ? mg_seterr(err, errlen, rc, "%s", why) : 0;
    }
    if (has < 0)
        return mg_seterr(err, errlen, -MG_ECONFIG,
                         "%s; stopping rather than write into a directory that may be another "
                         "run's",
                         why);
    run_name(&cur, who, sizeof(who));
    return mg_seterr(err, errlen, -MG_ECONFIG,
                     "run %s took '%s' over; stopping so as not to overwrite its checkpoints", who,
                     dir);
}
