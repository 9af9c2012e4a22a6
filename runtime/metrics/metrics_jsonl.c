/* The JSON lines sink (train --metrics FILE): one object per record, appended
 * with one write() each, so a reader never sees half a line unless the disk
 * filled up in the middle of one (then nothing follows it). The fields of
 * today's records come first, in the caller's order, then the wall time and
 * the run's identity (docs/metrics.md). */
#include "metrics_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"

/* Room for MG_METRICS_MAX_FIELDS fields of the longest key and text, each
 * byte of text escaped as \u00XX at worst. */
#define LINE_MAX_BYTES                                                                             \
    (MG_METRICS_MAX_FIELDS * (MG_METRICS_KEY_MAX + 6 * MG_METRICS_TEXT_MAX + 8) + 1024)

struct jsonl {
    struct mg_metrics_sink head;
    int fd;
    char *path;
    char line[LINE_MAX_BYTES];
};

/* A number rounded to digits; a whole one as an integer, since the writer's
 * shortest form would print 1700000000 as 1.7e+09. */
static void put_real(struct mg_jsonw *w, double v, int digits)
{
    v = mg_metrics_round(v, digits);
    if (isfinite(v) && v == floor(v) && fabs(v) < 9007199254740992.0) /* 2^53 */
        mg_jsonw_int(w, (long long)v);
    else
        mg_jsonw_double(w, v);
}

static void put_fields(struct mg_jsonw *w, const struct mg_metric *f, int n)
{
    for (int i = 0; i < n; i++) {
        mg_jsonw_key(w, f[i].key);
        switch (f[i].type) {
        case MG_METRIC_REAL:
            put_real(w, f[i].real, f[i].digits);
            break;
        case MG_METRIC_INT:
            mg_jsonw_int(w, f[i].i);
            break;
        case MG_METRIC_TEXT:
            mg_jsonw_str(w, f[i].text);
            break;
        }
    }
}

static void put_identity(struct mg_jsonw *w, const struct mg_metrics *m, double wall_time)
{
    mg_jsonw_key(w, "wall_time");
    put_real(w, wall_time, 16); /* microseconds */
    mg_jsonw_kstr(w, "run_id", m->has_run_id ? m->run_id : NULL);
    mg_jsonw_kint(w, "restart", m->restart);
    mg_jsonw_kint(w, "rank", m->rank);
}

static int emit(struct mg_metrics *m, struct jsonl *j, struct mg_jsonw *w)
{
    mg_jsonw_obj_end(w);
    int len = mg_jsonw_finish(w);
    if (len < 0) /* bounded by the checks on records: a bug if it happens */
        return mg_metrics_fail(m, &j->head, len, "metrics file '%s': a record is over %d bytes",
                               j->path, LINE_MAX_BYTES);
    j->line[len] = '\n';
    int rc = mg_metrics_write_all(j->fd, j->line, (size_t)len + 1);
    if (rc < 0)
        return mg_metrics_fail(m, &j->head, rc, "cannot write metrics file '%s': %s", j->path,
                               mg_strerror(rc));
    return 0;
}

static int jsonl_record(struct mg_metrics *m, struct mg_metrics_sink *s,
                        const struct mg_metrics_rec *r)
{
    struct jsonl *j = (struct jsonl *)s;
    struct mg_jsonw w;
    mg_jsonw_init(&w, j->line, sizeof(j->line) - 1); /* room for the '\n' */
    mg_jsonw_obj_begin(&w);
    mg_jsonw_kstr(&w, "type", r->kind);
    mg_jsonw_kint(&w, "step", r->step);
    if (r->tag)
        mg_jsonw_kstr(&w, "tag", r->tag);
    put_fields(&w, r->fields, r->n);
    put_identity(&w, m, r->wall_time);
    if (r->replay)
        mg_jsonw_kbool(&w, "replay", 1);
    return emit(m, j, &w);
}

static int jsonl_start(struct mg_metrics *m, struct mg_metrics_sink *s, long step, double wall_time)
{
    struct jsonl *j = (struct jsonl *)s;
    struct mg_jsonw w;
    mg_jsonw_init(&w, j->line, sizeof(j->line) - 1);
    mg_jsonw_obj_begin(&w);
    mg_jsonw_kstr(&w, "type", "start");
    mg_jsonw_kint(&w, "step", step);
    if (m->prior_step >= 0)
        mg_jsonw_kint(&w, "prior_step", m->prior_step);
    if (m->resumed_run[0])
        mg_jsonw_kstr(&w, "resumed_run", m->resumed_run);
    mg_jsonw_kstr(&w, "host", m->host);
    mg_jsonw_kint(&w, "pid", m->pid);
    put_identity(&w, m, wall_time);
    return emit(m, j, &w);
}

static int jsonl_hparams(struct mg_metrics *m, struct mg_metrics_sink *s,
                         const struct mg_metrics_rec *r)
{
    struct jsonl *j = (struct jsonl *)s;
    struct mg_jsonw w;
    mg_jsonw_init(&w, j->line, sizeof(j->line) - 1);
    mg_jsonw_obj_begin(&w);
    mg_jsonw_kstr(&w, "type", "hparams");
    put_fields(&w, r->fields, r->n);
    put_identity(&w, m, r->wall_time);
    return emit(m, j, &w);
}

static int jsonl_flush(struct mg_metrics *m, struct mg_metrics_sink *s)
{
    struct jsonl *j = (struct jsonl *)s;
    int rc = mg_metrics_sync(j->fd);
    if (rc < 0)
        return mg_metrics_fail(m, s, rc, "cannot write metrics file '%s': %s", j->path,
                               mg_strerror(rc));
    return 0;
}

static int jsonl_close(struct mg_metrics *m, struct mg_metrics_sink *s)
{
    struct jsonl *j = (struct jsonl *)s;
    if (!s->broken)
        jsonl_flush(m, s);
    /* NFS reports some write errors only here. */
    if (close(j->fd) < 0 && errno != EINTR && !s->broken)
        mg_metrics_fail(m, s, -errno, "cannot write metrics file '%s': %s", j->path,
                        strerror(errno));
    free(j->path);
    free(j);
    return m->err;
}

static const struct mg_metrics_sink_ops jsonl_ops = {
    .record = jsonl_record,
    .start = jsonl_start,
    .hparams = jsonl_hparams,
    .flush = jsonl_flush,
    .close = jsonl_close,
};

/* Whether the regular file at path ends in the middle of a line: a record
 * torn by a crash, which would swallow the next one unless its line is ended. */
static int torn(const char *path)
{
    struct stat st;
    char last = '\n';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
        pread(fd, &last, 1, st.st_size - 1) != 1)
        last = '\n';
    close(fd);
    return last != '\n';
}

int mg_metrics_jsonl_open(struct mg_metrics *m, const char *path, struct mg_metrics_sink **out,
                          char *err, size_t errlen)
{
    (void)m;
    struct jsonl *j = calloc(1, sizeof(*j));
    if (!j || !(j->path = strdup(path))) {
        free(j);
        return mg_seterr(err, errlen, -ENOMEM, "out of memory");
    }
    j->fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (j->fd < 0) {
        int rc = -errno;
        free(j->path);
        free(j);
        return mg_seterr(err, errlen, rc, "cannot open metrics file '%s': %s", path, strerror(-rc));
    }
    if (torn(path)) {
        int rc = mg_metrics_write_all(j->fd, "\n", 1);
        if (rc < 0) {
            close(j->fd);
            free(j->path);
            free(j);
            return mg_seterr(err, errlen, rc, "cannot write metrics file '%s': %s", path,
                             mg_strerror(rc));
        }
    }
    j->head.ops = &jsonl_ops;
    j->head.files[0] = j->path;
    *out = &j->head;
    return 0;
}
