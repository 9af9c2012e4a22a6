/* The metrics object: checks each record once, stamps it with the wall time
 * and the replay mark, hands it to every sink that still works, and keeps the
 * first error. Also the helpers the sinks share, and the reader of a JSON
 * lines file's last step (for marking a restart's replayed steps). */
#include "metrics_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "json.h"

/* The JSON keys every record carries besides its fields: a field may not reuse them. */
static const char *const reserved_keys[] = {
    "type", "step", "wall_time", "run_id", "restart", "rank", "replay", "tag", "value",
};

static double real_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- helpers for the sinks ------------------------------------------------------------- */

int mg_metrics_fail(struct mg_metrics *m, struct mg_metrics_sink *s, int code, const char *fmt, ...)
{
    if (s)
        s->broken = 1;
    if (!m->err) {
        va_list ap;
        va_start(ap, fmt);
        mg_vseterr(m->errmsg, sizeof(m->errmsg), code, fmt, ap);
        va_end(ap);
        m->err = code;
    }
    return m->err;
}

int mg_metrics_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -EIO;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int mg_metrics_sync(int fd)
{
    if (fdatasync(fd) == 0 || errno == EINVAL || errno == EROFS || errno == ENOTSUP)
        return 0;
    return -errno;
}

double mg_metrics_round(double v, int digits)
{
    char b[48];
    if (digits <= 0 || digits >= 17 || !isfinite(v))
        return v;
    snprintf(b, sizeof(b), "%.*g", digits, v);
    return strtod(b, NULL);
}

void mg_metrics_fmt_real(char *buf, size_t cap, double v, int digits)
{
    if (isnan(v)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, cap, v > 0 ? "inf" : "-inf");
        return;
    }
    v = mg_metrics_round(v, digits);
    if (v == floor(v) && fabs(v) < 9007199254740992.0) { /* 2^53: 1280, not 1.28e+03 */
        snprintf(buf, cap, "%.0f", v == 0 ? 0.0 : v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

void mg_metrics_tag(char *buf, size_t cap, const struct mg_metrics_rec *r,
                    const struct mg_metric *f)
{
    if (r->tag)
        snprintf(buf, cap, "%s", r->tag);
    else if (strcmp(f->key, "epoch") == 0)
        snprintf(buf, cap, "epoch");
    else
        snprintf(buf, cap, "%s/%s", r->kind, f->key);
}

/* ---- checks ------------------------------------------------------------------------------ */

static int name_ok(const char *s, const char *extra)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > MG_METRICS_KEY_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
              (c && strchr(extra, c))))
            return 0;
    }
    return 1;
}

static int fields_ok(const struct mg_metric *f, int n)
{
    if (n < 0 || n > MG_METRICS_MAX_FIELDS || (n > 0 && !f))
        return 0;
    for (int i = 0; i < n; i++) {
        if (!name_ok(f[i].key, "ABCDEFGHIJKLMNOPQRSTUVWXYZ.-"))
            return 0;
        for (size_t k = 0; k < sizeof(reserved_keys) / sizeof(reserved_keys[0]); k++)
            if (strcmp(f[i].key, reserved_keys[k]) == 0)
                return 0;
        for (int j = 0; j < i; j++)
            if (strcmp(f[i].key, f[j].key) == 0)
                return 0;
        switch (f[i].type) {
        case MG_METRIC_REAL:
        case MG_METRIC_INT:
            break;
        case MG_METRIC_TEXT:
            if (!f[i].text || strlen(f[i].text) > MG_METRICS_TEXT_MAX)
                return 0;
            break;
        default:
            return 0;
        }
    }
    return 1;
}

/* ---- the API ----------------------------------------------------------------------------- */

static int add_sink(struct mg_metrics *m,
                    int (*open_sink)(struct mg_metrics *, const char *, struct mg_metrics_sink **,
                                     char *, size_t),
                    const char *where, char *err, size_t errlen)
{
    struct mg_metrics_sink *s = NULL;
    int rc = open_sink(m, where, &s, err, errlen);
    if (rc == 0)
        m->sinks[m->nsinks++] = s;
    return rc;
}

int mg_metrics_open(struct mg_metrics **out, const struct mg_metrics_config *cfg, char *err,
                    size_t errlen)
{
    struct mg_metrics *m;
    int rc = 0;

    *out = NULL;
    if (!cfg)
        return mg_seterr(err, errlen, -EINVAL, "no metrics configuration");
    m = calloc(1, sizeof(*m));
    if (!m)
        return mg_seterr(err, errlen, -ENOMEM, "out of memory");
    if (cfg->run_id) {
        if (strlen(cfg->run_id) >= sizeof(m->run_id)) {
            free(m);
            return mg_seterr(err, errlen, -ENAMETOOLONG, "run id '%.40s...' is over %d bytes",
                             cfg->run_id, MG_METRICS_ID_MAX - 1);
        }
        snprintf(m->run_id, sizeof(m->run_id), "%s", cfg->run_id);
        m->has_run_id = 1;
    }
    m->restart = cfg->restart;
    m->rank = cfg->rank;
    m->pid = getpid();
    if (cfg->host)
        snprintf(m->host, sizeof(m->host), "%s", cfg->host);
    else if (gethostname(m->host, sizeof(m->host)) < 0 || !m->host[0])
        snprintf(m->host, sizeof(m->host), "localhost");
    m->host[sizeof(m->host) - 1] = '\0';
    m->now = cfg->now ? cfg->now : real_now;
    m->prior_step = -1;
    if (cfg->prior_step_set) {
        m->prior_step = cfg->prior_step < 0 ? -1 : cfg->prior_step;
    } else if (cfg->jsonl_path && cfg->run_id) {
        long last;
        if (mg_metrics_last_step(cfg->jsonl_path, cfg->run_id, &last) == 0)
            m->prior_step = last;
    }

    if (cfg->jsonl_path)
        rc = add_sink(m, mg_metrics_jsonl_open, cfg->jsonl_path, err, errlen);
    if (rc == 0 && cfg->tb_dir && cfg->rank == 0)
        rc = add_sink(m, mg_metrics_tb_open, cfg->tb_dir, err, errlen);
    if (rc == 0 && cfg->csv_dir && cfg->rank == 0)
        rc = add_sink(m, mg_metrics_csv_open, cfg->csv_dir, err, errlen);
    if (rc < 0) {
        mg_metrics_close(m, NULL, 0);
        return rc;
    }
    *out = m;
    return 0;
}

int mg_metrics_start(struct mg_metrics *m, long step)
{
    return mg_metrics_start_resumed(m, step, NULL);
}

int mg_metrics_start_resumed(struct mg_metrics *m, long step, const char *from_run)
{
    if (!m || step < 0 || (from_run && strlen(from_run) >= sizeof(m->resumed_run)))
        return -EINVAL;
    snprintf(m->resumed_run, sizeof(m->resumed_run), "%s", from_run ? from_run : "");
    double now = m->now();
    for (int i = 0; i < m->nsinks; i++) {
        struct mg_metrics_sink *s = m->sinks[i];
        if (!s->broken && s->ops->start)
            s->ops->start(m, s, step, now);
    }
    return m->err;
}

static int dispatch(struct mg_metrics *m, const struct mg_metrics_rec *r, int hparams)
{
    for (int i = 0; i < m->nsinks; i++) {
        struct mg_metrics_sink *s = m->sinks[i];
        int (*op)(struct mg_metrics *, struct mg_metrics_sink *, const struct mg_metrics_rec *) =
            hparams ? s->ops->hparams : s->ops->record;
        if (!s->broken && op)
            op(m, s, r);
    }
    return m->err;
}

int mg_metrics_record(struct mg_metrics *m, const char *kind, long step,
                      const struct mg_metric *fields, int n)
{
    if (!m || !name_ok(kind, "") || step < 0 || !fields_ok(fields, n))
        return -EINVAL;
    struct mg_metrics_rec r = {
        .kind = kind,
        .step = step,
        .fields = fields,
        .n = n,
        .wall_time = m->now(),
        .replay = m->prior_step >= 0 && step <= m->prior_step,
    };
    return dispatch(m, &r, 0);
}

int mg_metrics_scalar(struct mg_metrics *m, long step, const char *tag, double value)
{
    /* "step" and "replay" are CSV's own columns. */
    if (!m || !name_ok(tag, "ABCDEFGHIJKLMNOPQRSTUVWXYZ.-/") || step < 0 ||
        strcmp(tag, "step") == 0 || strcmp(tag, "replay") == 0)
        return -EINVAL;
    struct mg_metric v = mg_metric_real("value", value, 0);
    struct mg_metrics_rec r = {
        .kind = "scalar",
        .tag = tag,
        .step = step,
        .fields = &v,
        .n = 1,
        .wall_time = m->now(),
        .replay = m->prior_step >= 0 && step <= m->prior_step,
    };
    return dispatch(m, &r, 0);
}

int mg_metrics_hparams(struct mg_metrics *m, const struct mg_metric *fields, int n)
{
    if (!m || !fields_ok(fields, n))
        return -EINVAL;
    struct mg_metrics_rec r = {
        .kind = "hparams",
        .fields = fields,
        .n = n,
        .wall_time = m->now(),
    };
    return dispatch(m, &r, 1);
}

int mg_metrics_flush(struct mg_metrics *m)
{
    if (!m)
        return -EINVAL;
    for (int i = 0; i < m->nsinks; i++) {
        struct mg_metrics_sink *s = m->sinks[i];
        if (!s->broken && s->ops->flush)
            s->ops->flush(m, s);
    }
    return m->err;
}

int mg_metrics_files(const struct mg_metrics *m, const char **paths, int max)
{
    int n = 0;
    for (int i = 0; m && i < m->nsinks; i++)
        for (int k = 0; k < 2; k++)
            if (m->sinks[i]->files[k] && n < max)
                paths[n++] = m->sinks[i]->files[k];
    return n;
}

const char *mg_metrics_errmsg(const struct mg_metrics *m)
{
    return m && m->err ? m->errmsg : "";
}

int mg_metrics_close(struct mg_metrics *m, char *err, size_t errlen)
{
    if (!m)
        return 0;
    /* Every sink is closed, a broken one too: its descriptor must go. */
    for (int i = 0; i < m->nsinks; i++)
        m->sinks[i]->ops->close(m, m->sinks[i]);
    int rc = m->err;
    if (rc && err && errlen)
        snprintf(err, errlen, "%s", m->errmsg);
    free(m);
    return rc;
}

/* ---- the last step a run recorded ------------------------------------------------------ */

#define TAIL_BYTES (1 << 20)

/* The step of one JSON line when it is a metrics record of run_id, else -1. */
static long line_step(const char *line, size_t len, const char *run_id)
{
    struct mg_json_tok toks[2 * (MG_METRICS_MAX_FIELDS + 12) + 1];
    struct mg_json doc;
    char buf[MG_METRICS_ID_MAX];
    long long step;
    if (mg_json_parse(&doc, line, len, toks, (int)(sizeof(toks) / sizeof(toks[0]))) < 1 ||
        toks[0].type != MG_JSON_OBJECT)
        return -1;
    int t = mg_json_get(&doc, 0, "run_id");
    if (t < 0 || mg_json_str(&doc, t, buf, sizeof(buf)) < 0 || strcmp(buf, run_id) != 0)
        return -1;
    t = mg_json_get(&doc, 0, "type");
    if (t < 0 || mg_json_str(&doc, t, buf, sizeof(buf)) < 0 || strcmp(buf, "start") == 0 ||
        strcmp(buf, "hparams") == 0)
        return -1;
    t = mg_json_get(&doc, 0, "step");
    if (t < 0 || mg_json_int(&doc, t, &step) < 0 || step < 0)
        return -1;
    return (long)step;
}

int mg_metrics_last_step(const char *path, const char *run_id, long *step)
{
    struct stat st;
    int rc = -MG_ENOKEY;
    long best = -1;
    if (!path || !run_id || !step)
        return -EINVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? -MG_ENOKEY : -errno;
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        goto out_fd;
    }
    if (!S_ISREG(st.st_mode))
        goto out_fd; /* a pipe or a device has no past records */
    off_t off = st.st_size > TAIL_BYTES ? st.st_size - TAIL_BYTES : 0;
    size_t want = (size_t)(st.st_size - off);
    char *buf = malloc(want + 1);
    if (!buf) {
        rc = -ENOMEM;
        goto out_fd;
    }
    size_t got = 0;
    while (got < want) {
        ssize_t n = pread(fd, buf + got, want - got, off + (off_t)got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    /* From the middle of the file, the first line is a piece: skip it. */
    char *p = buf, *end = buf + got;
    if (off > 0) {
        char *nl = memchr(p, '\n', got);
        p = nl ? nl + 1 : end;
    }
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl)
            break; /* a record still being written */
        long s = line_step(p, (size_t)(nl - p), run_id);
        if (s > best)
            best = s;
        p = nl + 1;
    }
    free(buf);
    if (best >= 0) {
        *step = best;
        rc = 0;
    }
out_fd:
    close(fd);
    return rc;
}
