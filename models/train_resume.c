/* Where a run goes on from (see train_internal.h, docs/train.md "Resume"):
 * the checkpoint --resume names, or the newest of this job's in
 * --checkpoint-dir (fetched from --upload's destination when the machine has
 * none), the claim on that directory, and what changed when the world size
 * did. */
#include "train_internal.h"
#include "progress.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

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

/* The load's message about path without the path in front of it. */
static const char *without_path(const char *msg, const char *path)
{
    size_t n = strlen(path);
    if (msg[0] == '\'' && !strncmp(msg + 1, path, n) && !strncmp(msg + 1 + n, "': ", 3))
        return msg + n + 4;
    return msg;
}

/* A directory of another run whose newest checkpoint is not this job's
 * (docs/train.md, "Checkpoints belong to a job"): what differs, and the
 * ways out. weights: the checkpoint would load as this model's. */
static void refuse_other_job(struct run *r, const char *why, const char *path, int weights)
{
    char out[MG_CKPT_PATH_MAX + 100] = "";
    if (weights)
        snprintf(out, sizeof(out),
                 " (or start from its weights: --resume %s with another --checkpoint-dir)", path);
    fail_alike(r,
               "'%s' holds the checkpoints of another job, run %s: %s. To continue that job, run "
               "it with its settings; to start this one, use another --checkpoint-dir%s",
               r->o->checkpoint_dir, r->took_from, why, out);
}

/* A resumed checkpoint must continue this run: what differs in its
 * configuration (lr, schedule, optimizer settings...) stops an automatic or
 * --resume auto resume; --resume PATH takes the weights on purpose and is
 * only warned. (Shapes, batch, seed and data were checked by the load.)
 * other_run: the checkpoint is another run's that this one continues only
 * when it is the same job, which a file without CONFIG cannot show. */
static int check_fit(struct run *r, const char *path, int explicit_path, int other_run)
{
    const char *diff = r->trainer.resumed.config_diff;
    char why[MG_ERRMSG_LEN + 64];
    if (other_run && (diff[0] || !r->trainer.resumed.has_config)) {
        if (diff[0])
            snprintf(why, sizeof(why), "written with %s", diff);
        else
            snprintf(why, sizeof(why),
                     "written before checkpoints recorded their configuration, so whether it is "
                     "this job cannot be told (--resume auto continues it)");
        refuse_other_job(r, why, path, 1);
        return -MG_ECONFIG;
    }
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
    fail_alike(r,
               "cannot resume: '%s' does not fit this run: written with %s. Run with its "
               "settings, or start from its weights with --resume %s and another "
               "--checkpoint-dir",
               path, diff, path);
    return -MG_ECONFIG;
}

/* Loads what --resume says (or, with quiet, this run's newest checkpoint in
 * --checkpoint-dir, saying nothing when there is none) and says where the run
 * goes on from. own: the runs whose checkpoints in --checkpoint-dir count;
 * claim: how --checkpoint-dir was claimed (train_dir_claim): with
 * TRAIN_DIR_OTHER_RUN its checkpoints are another run's, continued when they
 * are this job's. *continued: 1 when it said that this job's checkpoints of
 * an earlier run are continued (a take-over by --resume auto of the same job
 * too: no warning is due then). */
static int load_checkpoint(struct run *r, const char *what, const struct mg_ckpt_owner *own,
                           int quiet, int claim, int *continued)
{
    int other_run = claim == TRAIN_DIR_OTHER_RUN;
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
        if (rc < 0 && other_run && (rc == -MG_ECONFIG || rc == -MG_ESHAPE)) {
            /* the path the load names is the owner's newest intact checkpoint */
            char path[MG_CKPT_PATH_MAX] = "";
            if (err[0] == '\'' && strchr(err + 1, '\''))
                snprintf(path, sizeof(path), "%.*s", (int)(strchr(err + 1, '\'') - err - 1),
                         err + 1);
            refuse_other_job(r, path[0] ? without_path(err, path) : err, path,
                             rc == -MG_ECONFIG && path[0]);
            return rc;
        }
        if (rc < 0) {
            if (rc == -MG_ECONFIG || rc == -MG_ESHAPE)
                fail_alike(r, "cannot resume: %s", err);
            else
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
            if (rc == -MG_ECONFIG || rc == -MG_ESHAPE)
                fail_alike(r, "cannot resume: %s", err);
            else
                fail("cannot resume: %s", err);
            return rc;
        }
    }
    rc = check_fit(r, what, explicit_path, other_run);
    if (rc < 0)
        return rc;
    const struct mg_resume_info *ri = &r->trainer.resumed;
    *continued = other_run || (claim == TRAIN_DIR_TAKE_OVER && !explicit_path && ri->has_config &&
                               !ri->config_diff[0]);
    r->res_from = MG_FROM_DISK;
    r->res_src_world = ri->world;
    snprintf(r->res_path, sizeof(r->res_path), "%s", what);
    resume_said(r, what, *continued);
    return 0;
}

void resume_record(struct run *r)
{
    const struct mg_trainer *t = &r->trainer;
    int from = r->res_from == MG_FROM_UNSAID ? MG_FROM_START : r->res_from;
    mg_progress_resumed((enum mg_progress_from)from, t->step,
                        from == MG_FROM_START ? 1 : t->resumed.epoch + 1, r->res_src_rank,
                        r->res_src_world, from == MG_FROM_DISK ? r->res_path : NULL);
}

void resume_said(struct run *r, const char *what, int continued)
{
    struct train_options *o = r->o;
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
        if (continued)
            say(&r->prog, TRAIN_PROG ": continuing this job's checkpoints in '%s', from run %s",
                o->checkpoint_dir, r->took_from);
        if (t->resumed.resharded)
            warn_reshard(r);
        say(&r->prog, TRAIN_PROG ": resumed from %s (step %ld, epoch %ld), param hash %016" PRIx64,
            what, t->step, t->resumed.epoch + 1, mg_model_param_hash(&r->model));
        if (moved)
            say(&r->prog, TRAIN_PROG ": %ld epoch%s now end at step %ld", o->epochs,
                o->epochs == 1 ? "" : "s", total);
    }
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
 * --checkpoint-dir of this job's, from its newest checkpoint (a restart, an
 * elastic re-formation, or the same command again, under a new run id or
 * not). Another job's directory is refused unless told (train_claim_dir). */
int resume(struct run *r)
{
    struct train_options *o = r->o;
    char err[MG_ERRMSG_LEN];
    const char *what = o->resume, *dir = o->checkpoint_dir;
    const struct mg_ckpt_owner *only = NULL;
    int quiet = 0, from_memory = 0, claim = TRAIN_DIR_OURS, continued = 0, rc;
    rc = snapshot_open(r);
    if (rc == 0)
        rc = snapshot_resume(r, &from_memory);
    if (rc < 0)
        return rc;
    if (from_memory)
        what = NULL; /* the snapshot is newer than anything on disk */
    else if (dir && what && strcmp(what, "auto") == 0 && o->upload) {
        rc = fetch_remote(r, dir);
        if (rc < 0)
            return rc;
    }
    if (dir) {
        rc = train_claim_dir(dir, o->resume, r->trainer.cfg.run_id_hash, r->run_id, &r->owner,
                             r->took_from, sizeof(r->took_from), err, sizeof(err));
        if (rc < 0) {
            fail("%s", err);
            return rc;
        }
        if (rc == TRAIN_DIR_REFUSED) {
            fail_alike(r, "%s", err);
            return -MG_ECONFIG;
        }
        claim = rc;
        only = &r->owner;
        if (!what && !from_memory) {
            what = "auto";
            quiet = 1;
        }
    }
    if (what) {
        rc = load_checkpoint(r, what, only, quiet, claim, &continued);
        if (rc < 0)
            return rc;
    }
    if (dir && r->dist.rank == 0) {
        rc = mg_ckpt_owner_write(dir, &r->owner, err);
        if (rc < 0) {
            fail("cannot claim checkpoint directory: %s", err);
            return rc;
        }
        if (r->took_from[0] && !continued && claim == TRAIN_DIR_TAKE_OVER)
            fprintf(stderr,
                    TRAIN_PROG ": warning: this run ('%s') took '%s' over from run %s: its "
                               "checkpoints count as this run's from now on\n",
                    r->run_id, dir, r->took_from);
    }
    return 0;
}

/* Every rank must continue from the same point with the same state (after
 * the parameter broadcast, which checked that the models agree). */
int check_resume(struct run *r)
{
    if (!r->dist.ddp)
        return 0;
    int rc = mg_ddp_check_resume(r->dist.ddp, &r->trainer);
    if (rc < 0)
        fail("cannot resume: %s", mg_ddp_errmsg(r->dist.ddp));
    return rc;
}
