/* `mglaunch logs --plot FILE.svg`: the loss and accuracy of a run's attempts,
 * drawn by plot.c from the metrics files train's rank 0 leaves in each
 * attempt directory (<run>/attempt_<n>/metrics.jsonl; docs/logs.md). The
 * attempt number comes from the directory's name, as the plot wants. */
#include "logs_internal.h"
#include "mg_err.h"
#include "plot.h"

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

/* The attempts to draw: every one, or the one --attempt names. */
static int wanted(const struct logs_opts *lo, const struct lrun *r, int i)
{
    if (!lo->attempt_given || lo->attempt == -2)
        return 1;
    if (lo->attempt == -1)
        return i == r->na - 1;
    return r->a[i].attempt == lo->attempt;
}

static int plot_run(FILE *out, const struct logs_opts *lo, const struct lrun *r, char *err,
                    size_t cap)
{
    struct mg_plot *p = NULL;
    char *svg = NULL, title[300];
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
    for (int i = 0; i < r->na && rc >= 0; i++) {
        char path[PATH_MAX + 64];
        long long off = 0;
        if (!wanted(lo, r, i))
            continue;
        mg_fmt(path, sizeof(path), "%s/attempt_%d/" METRICS_FILE, r->dir, r->a[i].attempt);
        rc = mg_plot_add_file(p, path, r->a[i].attempt, &off, 0, 1);
        if (rc == -ENOENT) {
            rc = 0;
            continue;
        }
        if (rc == -MG_ETOOBIG) /* what fitted is drawn; say so below */
            break;
        if (rc < 0)
            mg_seterr(err, cap, rc, "cannot read '%s': %s", path, mg_strerror(rc));
        files++;
    }
    if (rc == 0 && files == 0)
        rc = mg_seterr(err, cap, -ENOENT,
                       "run '%s' has no metrics in '%s': train's rank 0 writes "
                       "attempt_<n>/" METRICS_FILE " there on the node it runs on (look on that "
                       "node; a program other than train, or train --metrics FILE, writes none)",
                       r->id, r->dir);
    int cut = rc == -MG_ETOOBIG;
    if (rc >= 0 || cut) {
        mg_fmt(title, sizeof(title), "run %s", r->id);
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
    int n = 0, rc = mg_logs_runs(dir, &runs, &n, err, cap);
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
        rc = plot_run(out, lo, &r, err, cap);
    mg_logs_run_free(&r);
    free(runs);
    return rc;
}
