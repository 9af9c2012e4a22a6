/* `mglaunch logs --plot FILE.svg`: the loss and accuracy of a run's attempts,
 * drawn by plot.c from the metrics files train's rank 0 leaves in each
 * attempt directory (<run>/attempt_<n>/metrics.jsonl; docs/logs.md). The
 * attempt number comes from the directory's name, as the plot wants. */
#include "logs_internal.h"
#include "fs.h"
#include "mg_err.h"
#include "plot.h"

#include "json.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define METRICS_FILE "metrics.jsonl"

/* Writes len bytes to path through a temporary name, so a reader (a browser
 * reloading it) never sees half a file; "-" is out. */
static int write_svg(FILE *out, const char *path, const char *svg, size_t len)
{
    char tmp[PATH_MAX];
    if (strcmp(path, "-") == 0)
        return fwrite(svg, 1, len, out) == len ? 0 : -EIO;
    if (mg_fmt(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) < 0)
        return -ENAMETOOLONG;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    int rc = 0;
    for (size_t done = 0; done < len && rc == 0;) {
        ssize_t n = write(fd, svg + done, len - done);
        if (n < 0 && errno != EINTR)
            rc = -errno;
        else if (n > 0)
            done += (size_t)n;
    }
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path) < 0)
        rc = -errno;
    if (rc < 0)
        unlink(tmp);
    return rc;
}

/* ---- a job's earlier runs ------------------------------------------------------------------ */

#define START_SCAN (64 * 1024) /* bytes of a metrics file searched for its start record */
#define RUN_SPAN   1000000     /* plot numbers per earlier run: attempts stay below it */

/* A directory name that stays inside base. */
static int plain_name(const char *id)
{
    return id[0] && strcmp(id, ".") && strcmp(id, "..") && !strchr(id, '/') && strlen(id) < 256;
}

/* The earliest attempt of base/id that has metrics: its number, or -1. */
static int first_attempt(const char *base, const char *id)
{
    char path[PATH_MAX + 300];
    int best = -1;
    mg_fmt(path, sizeof(path), "%s/%s", base, id);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));) {
        char *end;
        if (strncmp(e->d_name, "attempt_", 8) != 0)
            continue;
        long a = strtol(e->d_name + 8, &end, 10);
        if (*end || end == e->d_name + 8 || a < 0 || a >= RUN_SPAN || (best >= 0 && a >= best))
            continue;
        mg_fmt(path, sizeof(path), "%s/%s/%s/" METRICS_FILE, base, id, e->d_name);
        if (access(path, R_OK) == 0)
            best = (int)a;
    }
    closedir(d);
    return best;
}

/* The run whose checkpoint run id resumed: the first start record's
 * "resumed_run" in its earliest metrics file. 1 with it in out, else 0. */
static int resumed_from(const char *base, const char *id, char *out, size_t cap)
{
    char path[PATH_MAX + 300];
    int a = first_attempt(base, id), found = 0;
    if (a < 0)
        return 0;
    mg_fmt(path, sizeof(path), "%s/%s/attempt_%d/" METRICS_FILE, base, id, a);
    int fd = mg_open_regular(path);
    char *buf = fd >= 0 ? malloc(START_SCAN + 1) : NULL;
    ssize_t n = buf ? read(fd, buf, START_SCAN) : -1;
    if (fd >= 0)
        close(fd);
    for (ssize_t i = 0; n > 0 && i < n && !found;) {
        char *nl = memchr(buf + i, '\n', (size_t)(n - i));
        if (!nl)
            break;
        struct mg_json_tok toks[64];
        struct mg_json doc;
        char type[16];
        if (mg_json_parse(&doc, buf + i, (size_t)(nl - buf - i), toks, 64) >= 1 &&
            toks[0].type == MG_JSON_OBJECT) {
            int t = mg_json_get(&doc, 0, "type");
            if (t >= 0 && mg_json_str(&doc, t, type, sizeof(type)) >= 0 &&
                strcmp(type, "start") == 0) {
                t = mg_json_get(&doc, 0, "resumed_run");
                found = t >= 0 && mg_json_str(&doc, t, out, cap) >= 0 && plain_name(out);
                break; /* only the first start record says where the run began */
            }
        }
        i = nl - buf + 1;
    }
    free(buf);
    return found;
}

int mg_logs_job_runs(const char *base, const char *id, char (*ids)[256], int max)
{
    char chain[MG_LOGS_JOB_RUNS][256];
    int n = 0;
    mg_fmt(chain[n++], sizeof(chain[0]), "%s", id);
    while (n < max && n < MG_LOGS_JOB_RUNS) {
        char prev[256], dir[PATH_MAX + 300];
        struct stat st;
        int seen = 0;
        if (!resumed_from(base, chain[n - 1], prev, sizeof(prev)))
            break;
        for (int i = 0; i < n; i++)
            seen |= strcmp(chain[i], prev) == 0;
        mg_fmt(dir, sizeof(dir), "%s/%s", base, prev);
        if (seen || stat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
            break;
        mg_fmt(chain[n++], sizeof(chain[0]), "%s", prev);
    }
    for (int i = 0; i < n; i++) /* earliest first */
        mg_fmt(ids[i], sizeof(chain[0]), "%s", chain[n - 1 - i]);
    return n;
}

int mg_logs_plot_number(int k, int attempt)
{
    return k * RUN_SPAN + attempt;
}

void mg_logs_plot_title(char *buf, size_t cap, char (*ids)[256], int n)
{
    if (n <= 1) {
        mg_fmt(buf, cap, "run %s", ids[0]);
        return;
    }
    size_t used = 0;
    for (int i = 0; i < n && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? ", " : "runs ", ids[i]);
    if (used < cap)
        snprintf(buf + used, cap - used, " (one job, each run resuming the one before)");
}

int mg_logs_plot_earlier(struct mg_plot *p, const char *base, char (*ids)[256], int n,
                         const struct lrun *r, int *files)
{
    char label[64];
    int rc = 0;
    for (int k = 0; k + 1 < n && rc >= 0; k++) {
        struct lrun lr;
        memset(&lr, 0, sizeof(lr));
        if (mg_logs_load_run(&lr, base, ids[k]) < 0) {
            mg_logs_run_free(&lr);
            continue;
        }
        for (int i = 0; i < lr.na && rc >= 0; i++) {
            char path[PATH_MAX + 64];
            long long off = 0;
            int a = lr.a[i].attempt;
            if (a < 0 || a >= RUN_SPAN)
                continue;
            int number = mg_logs_plot_number(k, a);
            mg_fmt(path, sizeof(path), "%s/attempt_%d/" METRICS_FILE, lr.dir, a);
            rc = mg_plot_add_file(p, path, number, &off, 0, 1);
            if (rc == -ENOENT || rc == -MG_EFORMAT) { /* none, or not a file: left out */
                rc = 0;
                continue;
            }
            if (rc < 0 && rc != -MG_ETOOBIG)
                break;
            (*files)++;
            mg_fmt(label, sizeof(label), "run %d attempt %d", k + 1, a);
            if (mg_plot_label(p, number, label) < 0 && rc == 0)
                rc = -ENOMEM;
        }
        mg_logs_run_free(&lr);
    }
    for (int i = 0; n > 1 && r && i < r->na && rc >= 0; i++) {
        char path[PATH_MAX + 64];
        mg_fmt(path, sizeof(path), "%s/attempt_%d/" METRICS_FILE, r->dir, r->a[i].attempt);
        if (access(path, R_OK) != 0)
            continue;
        mg_fmt(label, sizeof(label), "run %d attempt %d", n, r->a[i].attempt);
        rc = mg_plot_label(p, mg_logs_plot_number(n - 1, r->a[i].attempt), label);
    }
    return rc;
}

/* The attempts to draw: every one, or the one --attempt names. */
static int wanted(const struct logs_opts *lo, const struct lrun *r, int i)
{
    if (!lo->attempt_given || lo->attempt == -2)
        return 1;
    if (lo->attempt == -1)
        return i == r->na - 1;
    return r->a[i].attempt == lo->attempt;
}

static int plot_run(FILE *out, const struct logs_opts *lo, const char *base, const struct lrun *r,
                    char *err, size_t cap)
{
    struct mg_plot *p = NULL;
    char *svg = NULL, title[MG_LOGS_JOB_RUNS * 260 + 64], job[MG_LOGS_JOB_RUNS][256];
    size_t len = 0;
    int files = 0, rc = mg_plot_new(&p);
    if (rc < 0)
        return mg_seterr(err, cap, rc, "out of memory");
    int any = 0;
    for (int i = 0; i < r->na; i++)
        any |= wanted(lo, r, i);
    if (!any) {
        mg_plot_free(p);
        return mg_seterr(err, cap, -ENOENT, "no attempt %d in run '%s'", lo->attempt, r->id);
    }
    /* the whole job: the earlier runs it continued first (not with --attempt) */
    int njob = lo->attempt_given ? 1 : mg_logs_job_runs(base, r->id, job, MG_LOGS_JOB_RUNS);
    if (njob == 1)
        mg_fmt(job[0], sizeof(job[0]), "%s", r->id);
    for (int i = 0; i < r->na && rc >= 0; i++) {
        char path[PATH_MAX + 64];
        long long off = 0;
        if (!wanted(lo, r, i))
            continue;
        mg_fmt(path, sizeof(path), "%s/attempt_%d/" METRICS_FILE, r->dir, r->a[i].attempt);
        rc = mg_plot_add_file(p, path, mg_logs_plot_number(njob - 1, r->a[i].attempt), &off, 0, 1);
        if (rc == -ENOENT) {
            rc = 0;
            continue;
        }
        if (rc == -MG_ETOOBIG) /* what fitted is drawn; say so below */
            break;
        if (rc < 0)
            mg_seterr(err, cap, rc, "cannot read '%s': %s", path,
                      rc == -MG_EFORMAT ? "not a regular file" : mg_strerror(rc));
        files++;
    }
    int earlier = 0;
    if (rc >= 0 && njob > 1) {
        int er = mg_logs_plot_earlier(p, base, job, njob, r, &earlier);
        if (er < 0 && er != -MG_ETOOBIG)
            rc = mg_seterr(err, cap, er, "cannot read the job's earlier runs: %s", mg_strerror(er));
        else if (er == -MG_ETOOBIG)
            rc = er;
    }
    if (rc == 0 && files == 0)
        rc = mg_seterr(err, cap, -ENOENT,
                       "run '%s' has no metrics in '%s': train's rank 0 writes "
                       "attempt_<n>/" METRICS_FILE " there on the node it runs on (look on that "
                       "node; a program other than train, or train --metrics FILE, writes none)",
                       r->id, r->dir);
    int cut = rc == -MG_ETOOBIG;
    if (rc >= 0 || cut) {
        mg_logs_plot_title(title, sizeof(title), job, njob);
        struct mg_plot_opts po = {.title = title};
        rc = mg_plot_svg(p, &po, &svg, &len);
        if (rc < 0)
            mg_seterr(err, cap, rc, "cannot draw the plot: %s", mg_strerror(rc));
    }
    if (rc == 0) {
        rc = write_svg(out, lo->plot, svg, len);
        if (rc < 0)
            mg_seterr(err, cap, rc, "cannot write '%s': %s", lo->plot, mg_strerror(rc));
    }
    if (rc == 0 && strcmp(lo->plot, "-") != 0) {
        fprintf(out, "%s: run %s, %ld records from %d attempt%s", lo->plot, r->id,
                mg_plot_records(p), files, files == 1 ? "" : "s");
        if (njob > 1) {
            fprintf(out, " and %d file%s of the job's earlier run%s (", earlier,
                    earlier == 1 ? "" : "s", njob > 2 ? "s" : "");
            for (int k = 0; k + 1 < njob; k++)
                fprintf(out, "%s%s", k ? ", " : "", job[k]);
            fputc(')', out);
        }
        if (mg_plot_skipped(p))
            fprintf(out, " (%ld lines that are not records skipped)", mg_plot_skipped(p));
        if (cut)
            fprintf(out, " (cut at %ld values: the rest is not drawn)", (long)MG_PLOT_MAX_POINTS);
        fputc('\n', out);
    }
    free(svg);
    mg_plot_free(p);
    return rc;
}

int mg_logs_plot(FILE *out, const struct logs_opts *lo, const char *dir, char *err, size_t cap)
{
    struct run_ent *runs = NULL;
    struct lrun r;
    int n = 0, rc = mg_logs_runs_matching(dir, lo, &runs, &n, err, cap);
    if (rc)
        return rc;
    const char *sel = lo->run ? lo->run : runs[n - 1].id;
    int found = 0;
    for (int i = 0; i < n; i++)
        found |= strcmp(runs[i].id, sel) == 0;
    memset(&r, 0, sizeof(r));
    if (!found)
        rc = mg_seterr(err, cap, -ENOENT, "no run '%s' in '%s'", sel, dir);
    else if ((rc = mg_logs_load_run(&r, dir, sel)) < 0)
        mg_seterr(err, cap, rc, "cannot read run '%s' in '%s': %s", sel, dir, mg_strerror(rc));
    else
        rc = plot_run(out, lo, dir, &r, err, cap);
    mg_logs_run_free(&r);
    free(runs);
    return rc;
}
