/* train: trains a model from the zoo (models.h) on Fashion-MNIST, MNIST or a
 * synthetic dataset with libmg. The command line is documented in docs/train.md
 * and parsed in train_args.c.
 *
 * This file is the outline, and the one that ends with an exit status:
 * train_args_parse() -> setup() (train_setup.c: backend, data, model,
 * trainer) -> the outputs (train_out.c) -> resume() (train_resume.c) -> run()
 * (train_loop.c: steps, progress, evaluation, checkpoints, summary) -> the
 * end, where the ranks leave together and the outputs are closed.
 * Everything a distributed run changes goes through struct dist (rank, world,
 * hooks; train_internal.h). */
#include "mg_config.h"
#include "progress.h"
#include "train_internal.h"
#include "redact.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* For the error file of fail() (rank, host). */
struct mg_dist *error_dist;

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

__attribute__((format(printf, 1, 0))) static void vfail(const char *fmt, va_list ap)
{
    char msg[2048];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    mg_redact_inplace(msg, sizeof(msg)); /* an upload's error may name its URL */
    if (error_dist && error_dist->world > 1)
        fprintf(stderr, TRAIN_PROG ": rank %d: %s\n", error_dist->rank, msg);
    else
        fprintf(stderr, TRAIN_PROG ": %s\n", msg);
    record_error(error_dist, msg);
}

/* Errors are printed once and, under a launcher, recorded in the error file
 * (TORCHELASTIC_ERROR_FILE) so that its summary shows the real cause. */
__attribute__((format(printf, 1, 2))) void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(fmt, ap);
    va_end(ap);
}

/* A failure every rank meets alike, from the same files and flags: said once,
 * by rank 0 (without the rank: it is the job's). The others say nothing and
 * wait in the closing barrier, which rank 0 never enters, until rank 0 has
 * gone (its exit breaks the barrier), so that the launcher's root cause is
 * rank 0's line; stopped by the launcher meanwhile, as usual. A rank whose
 * wait ends otherwise (rank 0 went on: the ranks disagreed) says it after
 * all. */
/* How long a rank other than 0 leaves rank 0 to report a failure they share
 * (rank 0 may flush an upload first: up to 30 s). */
#define FAIL_ALIKE_WAIT_MS 35000

__attribute__((format(printf, 2, 3))) void fail_alike(struct run *r, const char *fmt, ...)
{
    va_list ap;
    struct mg_dist *d = r->dist.d;
    if (d && d->world > 1 && d->rank != 0) {
        /* Rank 0 says it and exits, which ends this wait at once. Ranks that
         * disagree (node-local checkpoint directories) leave rank 0 going on
         * into a collective: say it here after a short wait rather than after
         * the whole collective timeout. */
        int rc = mg_dist_finalize(d, FAIL_ALIKE_WAIT_MS);
        if (rc != 0 && rc != -ETIMEDOUT)
            return;
    }
    va_start(ap, fmt);
    if (d && d->world > 1 && d->rank == 0) {
        char msg[2048];
        vsnprintf(msg, sizeof(msg), fmt, ap);
        mg_redact_inplace(msg, sizeof(msg));
        fprintf(stderr, TRAIN_PROG ": %s\n", msg);
        record_error(error_dist, msg);
    } else {
        vfail(fmt, ap);
    }
    va_end(ap);
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
    if (r->dist.rank == 0 && (rc = train_out_upload_open(&r->out, r->o, err, sizeof(err))) < 0) {
        fail("--upload%s: %s", r->o->upload_cmd ? "-cmd" : "", err);
        return rc;
    }
    if (r->dist.rank == 0 && train_out_status_open(&r->out, err, sizeof(err)))
        fprintf(stderr, TRAIN_PROG ": warning: %s\n", err);
    return 0;
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
    /* the last report (100 %, the test figures) gets a moment; the run's
     * outcome does not depend on it */
    if (train_out_status_close(&r->out, failed ? 0 : 3000, err, sizeof(err)))
        fprintf(stderr, TRAIN_PROG ": warning: %s\n", err);
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
    mg_progress_phase(MG_PH_DONE); /* the closing barrier waits for the slowest rank */
    /* rank 0 hosts the store: everyone leaves together */
    if (rc == 0 && r.dist.d && mg_dist_finalize(r.dist.d, MG_COMM_DEFAULT_TIMEOUT) < 0) {
        fail("%s", mg_comm_errmsg(r.dist.d->comm));
        rc = -MG_EPEER;
    }
    int complete = close_outputs(&r, rc < 0);
    flush_stdout(&r.prog);
    snapshot_close(&r);
    mg_trainer_release(&r.trainer);
    mg_ddp_release(r.dist.ddp);
    mg_model_release(&r.model);
    mg_dataset_release(&r.train);
    mg_dataset_release(&r.test);
    mg_backend_release(r.be);
    error_dist = NULL;
    mg_dist_release(r.dist.d);
    /* A configuration that does not fit (a checkpoint of another model or
     * settings, a directory of another run) is met again by every retry:
     * the do-not-retry status, as a bad command line's. */
    if (rc < 0)
        return r.exit_code                             ? r.exit_code
               : rc == -MG_ECONFIG || rc == -MG_ESHAPE ? EXIT_USAGE
                                                       : EXIT_FAILURE_RUN;
    return r.prog.stdout_lost || !complete ? EXIT_INCOMPLETE : 0;
}
