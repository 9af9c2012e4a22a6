/* The CSV sink, in PyTorch Lightning's CSVLogger layout, for people who open
 * results in a spreadsheet or pandas:
 *
 *   <dir>/version_<N>/metrics.csv    one row per record
 *   <dir>/version_<N>/hparams.yaml   the run's settings (mg_metrics_hparams)
 *
 * N is one more than the highest version_* already there, claimed with
 * mkdir, so every process (each restart too) gets its own. As in Lightning,
 * the header is the sorted union of the keys seen so far, with a "step"
 * column, and a row leaves empty the columns its record does not have. When a
 * record brings a new key, the file is rewritten with the new header (to a
 * temporary file, then renamed, so a reader sees the old or the new file);
 * that happens a few times per run (the first evaluation, the summary). Rows
 * are written as they come, one write() each. */
#include "metrics_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs.h"
#include "json.h"

#define MAX_COLS  512
#define NAME_MAX_ (2 * MG_METRICS_KEY_MAX + 2)
#define CELL_MAX  (2 * MG_METRICS_TEXT_MAX + 3) /* every byte a doubled quote, plus two */
#define ROW_MAX   (MAX_COLS + (MG_METRICS_MAX_FIELDS + 2) * CELL_MAX + 2)
#define LINE_CAP  (1 << 20) /* a line read back longer than this is not ours */

struct cell {
    const char *name;
    char text[CELL_MAX];
};

struct csv {
    struct mg_metrics_sink head;
    int fd; /* metrics.csv, -1 until the first record */
    char dir[PATH_MAX];
    char path[PATH_MAX];
    char tmp[PATH_MAX];
    char yaml[PATH_MAX];
    char **keys; /* the header, sorted */
    int nkeys;
    char row[ROW_MAX];
    struct cell cells[MG_METRICS_MAX_FIELDS + 2];
    char names[MG_METRICS_MAX_FIELDS][NAME_MAX_];
};

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int find_key(char **keys, int n, const char *name)
{
    char **hit = bsearch(&name, keys, (size_t)n, sizeof(*keys), cmp_str);
    return hit ? (int)(hit - keys) : -1;
}

/* A text value as a CSV cell (RFC 4180): line breaks become spaces, and it is
 * quoted when it holds a comma, a quote or an edge space. */
static void text_cell(char *out, const char *s)
{
    size_t n = strlen(s), k = 0;
    int quote = n && (s[0] == ' ' || s[n - 1] == ' ');
    for (size_t i = 0; i < n; i++)
        if (s[i] == ',' || s[i] == '"')
            quote = 1;
    if (quote)
        out[k++] = '"';
    for (size_t i = 0; i < n; i++) {
        char c = (s[i] == '\n' || s[i] == '\r') ? ' ' : s[i];
        if (c == '"')
            out[k++] = '"';
        out[k++] = c;
    }
    if (quote)
        out[k++] = '"';
    out[k] = '\0';
}

static int write_header(int fd, char **keys, int n)
{
    char line[MAX_COLS * (NAME_MAX_ + 1) + 1];
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(line + len, sizeof(line) - len, "%s%s", i ? "," : "", keys[i]);
    line[len++] = '\n';
    return mg_metrics_write_all(fd, line, len);
}

/* Splits a row we wrote into at most max cells (quoted cells kept whole,
 * quotes and all): the cell count, or -1 when the line has more. */
static int split_row(char *line, size_t len, const char **cell, size_t *clen, int max)
{
    int n = 0;
    size_t i = 0;
    for (;;) {
        size_t start = i;
        int inq = 0;
        while (i < len && (inq || line[i] != ',')) {
            if (line[i] == '"')
                inq = !inq;
            i++;
        }
        if (n == max)
            return -1;
        cell[n] = line + start;
        clen[n++] = i - start;
        if (i >= len)
            return n;
        i++; /* the comma */
    }
}

/* Copies metrics.csv under the header keys[0..nkeys), its rows' cells moved
 * from the old columns old[0..nold), then renames the copy over it. */
static int rewrite(struct csv *c, char **old, int nold)
{
    int map[MAX_COLS], rc = 0;
    const char *cell[MAX_COLS];
    size_t clen[MAX_COLS];
    char *line = NULL;
    size_t cap = 0;
    FILE *in = NULL;
    int out = -1;

    for (int j = 0; j < c->nkeys; j++)
        map[j] = -1;
    for (int i = 0; i < nold; i++)
        map[find_key(c->keys, c->nkeys, old[i])] = i;
    in = fopen(c->path, "re");
    if (!in)
        return -errno;
    out = open(c->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        rc = -errno;
        goto out_in;
    }
    rc = write_header(out, c->keys, c->nkeys);
    ssize_t got;
    int first = 1;
    while (rc == 0 && (got = getline(&line, &cap, in)) >= 0) {
        if (got > LINE_CAP || got == 0 || line[got - 1] != '\n') {
            rc = -MG_EFORMAT;
            break;
        }
        if (first) { /* the old header */
            first = 0;
            continue;
        }
        int n = split_row(line, (size_t)got - 1, cell, clen, nold);
        if (n < 0) {
            rc = -MG_EFORMAT;
            break;
        }
        size_t len = 0;
        for (int j = 0; j < c->nkeys && rc == 0; j++) {
            size_t k = map[j] >= 0 && map[j] < n ? clen[map[j]] : 0;
            if (len + k + 2 > sizeof(c->row)) { /* a comma and the line end */
                rc = -MG_EFORMAT;
                break;
            }
            if (j)
                c->row[len++] = ',';
            memcpy(c->row + len, k ? cell[map[j]] : "", k);
            len += k;
        }
        c->row[len++] = '\n';
        if (rc == 0)
            rc = mg_metrics_write_all(out, c->row, len);
    }
    if (rc == 0 && ferror(in))
        rc = -EIO;
    if (close(out) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(c->tmp, c->path) < 0)
        rc = -errno;
    if (rc < 0)
        unlink(c->tmp);
out_in:
    fclose(in);
    free(line);
    if (rc == 0) {
        /* The old descriptor points at the replaced file. */
        close(c->fd);
        c->fd = open(c->path, O_WRONLY | O_APPEND | O_CLOEXEC);
        if (c->fd < 0)
            rc = -errno;
    }
    return rc;
}

/* Adds the names in cells that the header lacks; rewrites the file when it
 * already exists, creates it otherwise. */
static int add_keys(struct mg_metrics *m, struct csv *c, const struct cell *cells, int ncells)
{
    char *old[MAX_COLS];
    int nold = c->nkeys, added = 0, rc;
    memcpy(old, c->keys, (size_t)nold * sizeof(*old));
    for (int i = 0; i < ncells; i++) {
        if (find_key(old, nold, cells[i].name) >= 0)
            continue;
        int dup = 0;
        for (int k = nold; k < c->nkeys; k++)
            dup |= strcmp(c->keys[k], cells[i].name) == 0;
        if (dup)
            continue;
        if (c->nkeys == MAX_COLS)
            return mg_metrics_fail(m, &c->head, -MG_ETOOBIG, "CSV file '%s': more than %d columns",
                                   c->path, MAX_COLS);
        char *k = strdup(cells[i].name);
        if (!k)
            return mg_metrics_fail(m, &c->head, -ENOMEM, "CSV file '%s': out of memory", c->path);
        c->keys[c->nkeys++] = k;
        added = 1;
    }
    if (!added)
        return 0;
    qsort(c->keys, (size_t)c->nkeys, sizeof(*c->keys), cmp_str);
    if (c->fd >= 0) {
        rc = rewrite(c, old, nold);
        if (rc < 0)
            return mg_metrics_fail(m, &c->head, rc, "cannot rewrite CSV file '%s': %s", c->path,
                                   mg_strerror(rc));
        return 0;
    }
    c->fd = open(c->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (c->fd < 0)
        return mg_metrics_fail(m, &c->head, -errno, "cannot create CSV file '%s': %s", c->path,
                               strerror(errno));
    rc = write_header(c->fd, c->keys, c->nkeys);
    if (rc < 0)
        return mg_metrics_fail(m, &c->head, rc, "cannot write CSV file '%s': %s", c->path,
                               mg_strerror(rc));
    return 0;
}

static int csv_record(struct mg_metrics *m, struct mg_metrics_sink *s,
                      const struct mg_metrics_rec *r)
{
    struct csv *c = (struct csv *)s;
    struct cell *cells = c->cells;
    int n = 0;

    cells[n].name = "step";
    snprintf(cells[n++].text, CELL_MAX, "%ld", r->step);
    for (int i = 0; i < r->n; i++) {
        const struct mg_metric *f = &r->fields[i];
        mg_metrics_tag(c->names[i], sizeof(c->names[i]), r, f);
        cells[n].name = c->names[i];
        if (f->type == MG_METRIC_REAL)
            mg_metrics_fmt_real(cells[n].text, CELL_MAX, f->real, f->digits);
        else if (f->type == MG_METRIC_INT)
            snprintf(cells[n].text, CELL_MAX, "%lld", f->i);
        else
            text_cell(cells[n].text, f->text);
        n++;
    }
    if (r->replay) {
        cells[n].name = "replay";
        snprintf(cells[n++].text, CELL_MAX, "1");
    }
    int rc = add_keys(m, c, cells, n);
    if (rc < 0)
        return rc;

    size_t len = 0;
    for (int j = 0; j < c->nkeys; j++) {
        if (j)
            c->row[len++] = ',';
        for (int i = 0; i < n; i++) {
            if (strcmp(cells[i].name, c->keys[j]) == 0) {
                size_t k = strlen(cells[i].text);
                memcpy(c->row + len, cells[i].text, k);
                len += k;
                break;
            }
        }
    }
    c->row[len++] = '\n';
    rc = mg_metrics_write_all(c->fd, c->row, len);
    if (rc < 0)
        return mg_metrics_fail(m, s, rc, "cannot write CSV file '%s': %s", c->path,
                               mg_strerror(rc));
    return 0;
}

static int cmp_field(const void *a, const void *b)
{
    return strcmp(((const struct mg_metric *)a)->key, ((const struct mg_metric *)b)->key);
}

/* hparams.yaml as yaml.dump writes a flat dict: sorted "key: value" lines;
 * texts double-quoted (JSON's escapes are YAML's), so no text can pass for a
 * number or a boolean. Replaced whole (temporary file, rename). */
static int csv_hparams(struct mg_metrics *m, struct mg_metrics_sink *s,
                       const struct mg_metrics_rec *r)
{
    struct csv *c = (struct csv *)s;
    struct mg_metric sorted[MG_METRICS_MAX_FIELDS];
    char yaml_path[PATH_MAX], tmp[PATH_MAX + 8];
    enum {
        VALUE_MAX = 6 * MG_METRICS_TEXT_MAX + 8,
        LINE = MG_METRICS_KEY_MAX + VALUE_MAX + 4
    };
    size_t len = 0, cap = (size_t)r->n * LINE + 8;
    int rc = 0;

    char *yaml = malloc(cap);
    if (!yaml)
        return mg_metrics_fail(m, s, -ENOMEM, "hparams.yaml: out of memory");
    memcpy(sorted, r->fields, (size_t)r->n * sizeof(*sorted));
    qsort(sorted, (size_t)r->n, sizeof(*sorted), cmp_field);
    if (r->n == 0)
        len = (size_t)snprintf(yaml, cap, "{}\n");
    for (int i = 0; i < r->n; i++) {
        const struct mg_metric *f = &sorted[i];
        char v[VALUE_MAX];
        if (f->type == MG_METRIC_REAL && isnan(f->real))
            snprintf(v, sizeof(v), ".nan");
        else if (f->type == MG_METRIC_REAL && isinf(f->real))
            snprintf(v, sizeof(v), f->real > 0 ? ".inf" : "-.inf");
        else if (f->type == MG_METRIC_REAL)
            mg_metrics_fmt_real(v, sizeof(v), f->real, f->digits);
        else if (f->type == MG_METRIC_INT)
            snprintf(v, sizeof(v), "%lld", f->i);
        else {
            struct mg_jsonw w;
            mg_jsonw_init(&w, v, sizeof(v));
            mg_jsonw_str(&w, f->text);
            mg_jsonw_finish(&w);
        }
        len += (size_t)snprintf(yaml + len, cap - len, "%s: %s\n", f->key, v);
    }
    /* The lengths were checked when the directory was made. */
    mg_fmt(yaml_path, sizeof(yaml_path), "%s", c->yaml);
    mg_fmt(tmp, sizeof(tmp), "%s.tmp", yaml_path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        rc = -errno;
    if (rc == 0)
        rc = mg_metrics_write_all(fd, yaml, len);
    free(yaml);
    if (fd >= 0 && close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, yaml_path) < 0)
        rc = -errno;
    if (rc < 0) {
        unlink(tmp);
        return mg_metrics_fail(m, s, rc, "cannot write '%s': %s", yaml_path, mg_strerror(rc));
    }
    return 0;
}

static int csv_flush(struct mg_metrics *m, struct mg_metrics_sink *s)
{
    struct csv *c = (struct csv *)s;
    int rc = c->fd >= 0 ? mg_metrics_sync(c->fd) : 0;
    if (rc < 0)
        return mg_metrics_fail(m, s, rc, "cannot write CSV file '%s': %s", c->path,
                               mg_strerror(rc));
    return 0;
}

static int csv_close(struct mg_metrics *m, struct mg_metrics_sink *s)
{
    struct csv *c = (struct csv *)s;
    if (!s->broken)
        csv_flush(m, s);
    if (c->fd >= 0 && close(c->fd) < 0 && errno != EINTR && !s->broken)
        mg_metrics_fail(m, s, -errno, "cannot write CSV file '%s': %s", c->path, strerror(errno));
    for (int i = 0; i < c->nkeys; i++)
        free(c->keys[i]);
    free(c->keys);
    free(c);
    return m->err;
}

static const struct mg_metrics_sink_ops csv_ops = {
    .record = csv_record,
    .hparams = csv_hparams,
    .flush = csv_flush,
    .close = csv_close,
};

/* One more than the highest version_<N> in dir (0 when none). */
static long next_version(const char *dir)
{
    long next = 0;
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *p = e->d_name;
        if (strncmp(p, "version_", 8) != 0 || !p[8])
            continue;
        char *end;
        errno = 0;
        long v = strtol(p + 8, &end, 10);
        if (*end || errno || v < 0 || p[8] < '0' || p[8] > '9')
            continue;
        if (v >= next)
            next = v + 1;
    }
    closedir(d);
    return next;
}

int mg_metrics_csv_open(struct mg_metrics *m, const char *dir, struct mg_metrics_sink **out,
                        char *err, size_t errlen)
{
    (void)m;
    int rc = mg_mkdir_p(dir, 0755);
    if (rc < 0)
        return mg_seterr(err, errlen, rc, "cannot create CSV directory '%s': %s", dir,
                         mg_strerror(rc));
    if (strlen(dir) + 64 > PATH_MAX)
        return mg_seterr(err, errlen, -ENAMETOOLONG, "CSV directory '%s': name too long", dir);
    struct csv *c = calloc(1, sizeof(*c));
    if (!c || !(c->keys = calloc(MAX_COLS, sizeof(*c->keys)))) {
        free(c);
        return mg_seterr(err, errlen, -ENOMEM, "out of memory");
    }
    c->head.ops = &csv_ops;
    c->fd = -1;
    rc = -EEXIST;
    for (long v = next_version(dir), tries = 0; rc == -EEXIST && tries < 1000; v++, tries++) {
        mg_fmt(c->dir, sizeof(c->dir), "%s/version_%ld", dir, v);
        rc = mkdir(c->dir, 0755) == 0 ? 0 : -errno;
    }
    if (rc < 0) {
        mg_seterr(err, errlen, rc, "cannot create CSV directory '%s': %s", c->dir, strerror(-rc));
        free(c->keys);
        free(c);
        return rc;
    }
    mg_fmt(c->path, sizeof(c->path), "%s/metrics.csv", c->dir);
    mg_fmt(c->tmp, sizeof(c->tmp), "%s/metrics.csv.tmp", c->dir);
    mg_fmt(c->yaml, sizeof(c->yaml), "%s/hparams.yaml", c->dir);
    c->head.files[0] = c->path;
    c->head.files[1] = c->yaml;
    *out = &c->head;
    return 0;
}
