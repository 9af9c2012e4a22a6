/* The dashboard's answers (see dashboard.h): who may ask, the runs as
 * `mglaunch logs` models them (cached, an event log read again only when it
 * changed), a rank's log in bounded chunks at byte offsets, and the plot of a
 * run's metrics, fed only what its files gained since the last request. No
 * HTTP here: main.c hands requests in and responses out. */
#include "dashboard.h"
#include "fs.h"
#include "json.h"
#include "logdir.h"
#include "logs_internal.h"
#include "mg_err.h"
#include "plot.h"
#include "sha256.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define JSON_MAX     (64u << 20)
#define LATEST_BYTES 8192
#define METRICS_FILE "metrics.jsonl"
#define MAX_ATTEMPT  1000000000L

/* ---- the run cache --------------------------------------------------------------------- */

struct plot_file {
    int attempt;
    long long off;
    ino_t ino;
};

struct crun {
    char id[256];
    struct lrun r;
    int loaded;
    /* what the model was built from: read again when one changes */
    long long ev_size, ev_mtime_ns, dir_mtime_ns;
    ino_t ev_ino;
    unsigned long used;
    /* the plot, fed as its files grow */
    struct mg_plot *plot;
    struct plot_file *pf;
    int npf;
    /* the job's runs drawn, earliest first, this one last (logs_internal.h) */
    char (*job)[256];
    int njob;
    int job_pending; /* no metrics yet when the plot began: which job is not known */
    int dirty;
    char *svg;
    size_t svg_len;
    unsigned long gen;
};

struct dash_cache {
    struct crun *runs[DASH_MAX_RUNS];
    int n;
    unsigned long tick;
};

int dash_cache_new(struct dash_cache **out)
{
    *out = calloc(1, sizeof(**out));
    return *out ? 0 : -ENOMEM;
}

static void drop_plot(struct crun *c)
{
    mg_plot_free(c->plot);
    c->plot = NULL;
    free(c->pf);
    c->pf = NULL;
    c->npf = 0;
    free(c->job);
    c->job = NULL;
    c->njob = 0;
    free(c->svg);
    c->svg = NULL;
    c->svg_len = 0;
}

static void free_run(struct crun *c)
{
    drop_plot(c);
    mg_logs_run_free(&c->r);
    free(c);
}

void dash_cache_free(struct dash_cache *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n; i++)
        free_run(c->runs[i]);
    free(c);
}

static long long mtime_ns(const struct stat *st)
{
    return (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
}

/* A run id as a directory name of the log directory, nothing else. */
static int id_ok(const char *id)
{
    size_t n = id ? strlen(id) : 0;
    return n > 0 && n < 256 && !strchr(id, '/') && strcmp(id, ".") && strcmp(id, "..") &&
           id[0] != '.';
}

/* rel (a path under base) opened for reading, one component at a time with
 * O_NOFOLLOW, so that no component is a symbolic link when it is opened: the
 * dashboard serves the log directory's own files, never what a link there
 * points to (another user's file, /etc/...), even one swapped in between a
 * check and the open (a FIFO there does not block: O_NONBLOCK, and the
 * caller serves regular files only). -1 when a component is missing, a link, "." or "..". */
static int open_beneath(const char *base, const char *rel)
{
    int dir = open(base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    char name[256];
    for (const char *p = rel; dir >= 0;) {
        size_t k = strcspn(p, "/");
        int last = p[k] == '\0', fd = -1;
        if (k > 0 && k < sizeof(name)) {
            memcpy(name, p, k);
            name[k] = '\0';
            if (strcmp(name, ".") && strcmp(name, ".."))
                fd = openat(dir, name,
                            O_RDONLY | O_CLOEXEC | O_NOFOLLOW |
                                (last ? O_NONBLOCK | O_NOCTTY : O_DIRECTORY));
        }
        close(dir);
        if (last || fd < 0)
            return fd;
        dir = fd;
        p += k + 1;
    }
    return -1;
}

/* Whether nothing in the tree at path (depth levels down) is a symbolic
 * link. path has room for cap bytes and is given back as it came. */
static int tree_real(char *path, size_t cap, int depth)
{
    DIR *dir = opendir(path);
    struct dirent *e;
    struct stat st;
    size_t n = strlen(path);
    int ok = dir != NULL, entries = 0;
    while (ok && (e = readdir(dir))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (++entries > 100000 || mg_fmt(path + n, cap - n, "/%s", e->d_name) < 0) {
            ok = 0; /* a bound on what one request reads */
            break;
        }
        ok = lstat(path, &st) == 0 && !S_ISLNK(st.st_mode);
        if (ok && S_ISDIR(st.st_mode) && depth > 1)
            ok = tree_real(path, cap, depth - 1);
        path[n] = '\0';
    }
    if (dir)
        closedir(dir);
    return ok;
}

/* A run's directory and what the run's page reads below it (the event log,
 * attempts, ranks, error files, metrics) are its own, none a link. */
static int run_dir_real(const char *base, const char *id)
{
    char path[PATH_MAX + 300];
    struct stat st;
    mg_fmt(path, sizeof(path), "%s/%s", base, id);
    return lstat(path, &st) == 0 && S_ISDIR(st.st_mode) && tree_real(path, sizeof(path), 3);
}

/* The run, from the cache or read now; NULL when there is no such run. */
static struct crun *get_run(struct dash *d, const char *id)
{
    struct dash_cache *cc = d->cache;
    char path[PATH_MAX + 300];
    struct stat st, ev;
    struct crun *c = NULL;
    if (!id_ok(id))
        return NULL;
    mg_fmt(path, sizeof(path), "%s/%s", d->dir, id);
    if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode) || !run_dir_real(d->dir, id))
        return NULL;
    for (int i = 0; i < cc->n && !c; i++)
        if (strcmp(cc->runs[i]->id, id) == 0)
            c = cc->runs[i];
    if (!c) {
        if (cc->n == DASH_MAX_RUNS) { /* the one used longest ago goes */
            int old = 0;
            for (int i = 1; i < cc->n; i++)
                if (cc->runs[i]->used < cc->runs[old]->used)
                    old = i;
            free_run(cc->runs[old]);
            cc->runs[old] = cc->runs[--cc->n];
        }
        if (!(c = calloc(1, sizeof(*c))))
            return NULL;
        mg_fmt(c->id, sizeof(c->id), "%s", id);
        cc->runs[cc->n++] = c;
    }
    c->used = ++cc->tick;
    mg_fmt(path, sizeof(path), "%s/%s/%s", d->dir, id, MG_EVENTS_FILE);
    int has_ev = stat(path, &ev) == 0;
    long long size = has_ev ? (long long)ev.st_size : -1, evm = has_ev ? mtime_ns(&ev) : 0;
    ino_t ino = has_ev ? ev.st_ino : 0;
    if (!c->loaded || size != c->ev_size || evm != c->ev_mtime_ns || ino != c->ev_ino ||
        mtime_ns(&st) != c->dir_mtime_ns) {
        if (mg_logs_load_run(&c->r, d->dir, id) < 0)
            return NULL;
        c->loaded = 1;
        c->ev_size = size;
        c->ev_mtime_ns = evm;
        c->ev_ino = ino;
        c->dir_mtime_ns = mtime_ns(&st);
    } else if (c->r.has_events && !c->r.ended) {
        c->r.alive = mg_logs_launcher_alive(&c->r); /* it may have died without a word */
    }
    return c;
}

/* ---- JSON responses ------------------------------------------------------------------------ */

typedef void (*json_fn)(struct mg_jsonw *w, void *arg);

/* Builds a JSON body, growing the buffer until it fits. */
static void json_resp(struct dash_resp *rs, int status, json_fn fn, void *arg)
{
    for (size_t cap = 16384; cap <= JSON_MAX; cap *= 4) {
        struct mg_jsonw w;
        char *buf = malloc(cap);
        if (!buf)
            break;
        mg_jsonw_init(&w, buf, cap);
        fn(&w, arg);
        int n = mg_jsonw_finish(&w);
        if (n >= 0) {
            rs->status = status;
            rs->type = "application/json";
            rs->body = buf;
            rs->len = (size_t)n;
            return;
        }
        free(buf);
    }
    rs->status = 500;
    rs->type = "text/plain; charset=utf-8";
    rs->body = (char *)"out of memory\n";
    rs->len = strlen(rs->body);
    rs->body_static = DASH_BODY_STATIC;
}

static void error_fn(struct mg_jsonw *w, void *arg)
{
    mg_jsonw_obj_begin(w);
    mg_jsonw_kstr(w, "error", arg);
    mg_jsonw_obj_end(w);
}

static void fail(struct dash_resp *rs, int status, const char *msg)
{
    json_resp(rs, status, error_fn, (void *)msg);
}

static void add_header(struct dash_resp *rs, const char *name, long long v)
{
    if (rs->nhdr >= 4)
        return;
    rs->hdr_name[rs->nhdr] = name;
    snprintf(rs->hdr_value[rs->nhdr], sizeof(rs->hdr_value[0]), "%lld", v);
    rs->nhdr++;
}

/* "running", "succeeded", "failed", "died", "unknown": for the page's colours. */
static const char *state_of(const struct lrun *r)
{
    if (!r->has_events)
        return "unknown";
    if (r->ended)
        return strcmp(r->result, "succeeded") == 0 ? "succeeded" : "failed";
    return r->alive ? "running" : "died";
}

/* ---- /api/runs ------------------------------------------------------------------------------- */

struct runs_arg {
    struct crun **v;
    int n;
    const char *dir;
};

static int newest_first(const void *a, const void *b)
{
    const struct crun *x = *(struct crun *const *)a, *y = *(struct crun *const *)b;
    if (x->r.start_ms != y->r.start_ms)
        return x->r.start_ms > y->r.start_ms ? -1 : 1;
    return strcmp(x->id, y->id);
}

static void runs_fn(struct mg_jsonw *w, void *arg)
{
    struct runs_arg *a = arg;
    mg_jsonw_obj_begin(w);
    mg_jsonw_kstr(w, "dir", a->dir);
    mg_jsonw_key(w, "runs");
    mg_jsonw_arr_begin(w);
    for (int i = 0; i < a->n; i++) {
        const struct lrun *r = &a->v[i]->r;
        char st[160];
        mg_logs_run_status(r, st, sizeof(st));
        mg_jsonw_obj_begin(w);
        mg_jsonw_kstr(w, "id", a->v[i]->id);
        mg_jsonw_kint(w, "started_ms", r->start_ms);
        mg_jsonw_kstr(w, "state", state_of(r));
        mg_jsonw_kstr(w, "status", st);
        mg_jsonw_kint(w, "attempts", r->na);
        mg_jsonw_obj_end(w);
    }
    mg_jsonw_arr_end(w);
    mg_jsonw_obj_end(w);
}

static int newer_dir(const void *a, const void *b)
{
    const struct run_ent *x = a, *y = b;
    return x->start_ms > y->start_ms ? -1 : x->start_ms < y->start_ms;
}

static void api_runs(struct dash *d, struct dash_resp *rs)
{
    struct run_ent *ents = NULL;
    struct crun *v[DASH_MAX_RUNS];
    int n = 0, k = 0;
    int rc = mg_logs_list_runs(d->dir, &ents, &n);
    if (rc < 0 && rc != -ENOENT) {
        char msg[PATH_MAX + 64];
        mg_fmt(msg, sizeof(msg), "cannot read '%s': %s", d->dir, mg_strerror(rc));
        fail(rs, 500, msg);
        return;
    }
    /* the newest directories when there are more runs than the cache holds */
    qsort(ents, (size_t)n, sizeof(*ents), newer_dir);
    for (int i = 0; i < n && k < DASH_MAX_RUNS; i++) {
        struct crun *c = get_run(d, ents[i].id);
        if (c)
            v[k++] = c;
    }
    free(ents);
    qsort(v, (size_t)k, sizeof(v[0]), newest_first);
    struct runs_arg a = {v, k, d->dir};
    json_resp(rs, 200, runs_fn, &a);
}

/* ---- /api/run ---------------------------------------------------------------------------- */

struct run_arg {
    const struct crun *c;
    char *root; /* the root cause block, or NULL */
    char latest[LATEST_BYTES];
    int latest_attempt;
    const char *dir;
};

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* A rank's stacks, as `mglaunch logs` lists them: the watchdog's of a hang
 * (stacks.txt) and those of mglaunch dump (dump-<time>.txt), by their
 * stream names ("stacks", "dump-1795857000"), oldest first. */
#define STACK_FILES_MAX 32

static int stack_name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Whether name is a stacks stream: "stacks", or "dump-" and digits or
 * dashes (the time, "-2" for a second dump within a second). */
static int stack_stream_ok(const char *name)
{
    size_t n = strlen(name);
    if (!strcmp(name, "stacks"))
        return 1;
    return n > 5 && n < 40 && !strncmp(name, "dump-", 5) &&
           strspn(name + 5, "0123456789-") == n - 5 && name[5] != '-';
}

static void stack_files(struct mg_jsonw *w, const char *dir)
{
    char *names[STACK_FILES_MAX];
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && n < STACK_FILES_MAX && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".txt"))
            continue;
        char stem[64];
        if (len - 4 >= sizeof(stem))
            continue;
        memcpy(stem, e->d_name, len - 4);
        stem[len - 4] = '\0';
        if (stack_stream_ok(stem) && (names[n] = strdup(stem)))
            n++;
    }
    if (d)
        closedir(d);
    qsort(names, (size_t)n, sizeof(*names), stack_name_cmp);
    mg_jsonw_key(w, "stacks");
    mg_jsonw_arr_begin(w);
    for (int i = 0; i < n; i++) {
        mg_jsonw_str(w, names[i]);
        free(names[i]);
    }
    mg_jsonw_arr_end(w);
}

static void run_fn(struct mg_jsonw *w, void *arg)
{
    struct run_arg *a = arg;
    const struct lrun *r = &a->c->r;
    char st[160], path[PATH_MAX + 400];
    mg_logs_run_status(r, st, sizeof(st));
    mg_jsonw_obj_begin(w);
    mg_jsonw_kstr(w, "id", a->c->id);
    mg_jsonw_kstr(w, "dir", r->dir);
    mg_jsonw_kstr(w, "state", state_of(r));
    mg_jsonw_kstr(w, "status", st);
    mg_jsonw_kint(w, "started_ms", r->start_ms);
    mg_jsonw_kstr(w, "host", r->host[0] ? r->host : NULL);
    mg_jsonw_kint(w, "pid", r->pid);
    mg_jsonw_kstr(w, "error", r->error[0] ? r->error : NULL);
    mg_jsonw_key(w, "attempts");
    mg_jsonw_arr_begin(w);
    for (int i = 0; i < r->na; i++) {
        const struct lattempt *at = &r->a[i];
        mg_jsonw_obj_begin(w);
        mg_jsonw_kint(w, "attempt", at->attempt);
        mg_jsonw_kint(w, "restart", at->restart_count);
        mg_jsonw_kint(w, "started_ms", at->start_ms);
        mg_jsonw_kstr(w, "state",
                      at->ended       ? at->result
                      : r->alive      ? "running"
                      : r->has_events ? "not finished"
                                      : "unknown");
        mg_jsonw_kint(w, "duration_ms", at->duration_ms);
        mg_fmt(path, sizeof(path), "%s/attempt_%d/" METRICS_FILE, r->dir, at->attempt);
        mg_jsonw_kbool(w, "metrics", file_exists(path));
        mg_jsonw_key(w, "ranks");
        mg_jsonw_arr_begin(w);
        for (int k = 0; k < at->nw; k++) {
            const struct lworker *wk = &at->w[k];
            char ws[256];
            mg_logs_worker_state(r, wk, ws, sizeof(ws));
            mg_jsonw_obj_begin(w);
            mg_jsonw_kint(w, "local_rank", wk->local_rank);
            mg_jsonw_kint(w, "rank", wk->rank);
            mg_jsonw_kint(w, "pid", wk->pid);
            mg_jsonw_kstr(w, "outcome", wk->exited ? wk->outcome : NULL);
            mg_jsonw_kstr(w, "state", ws);
            mg_jsonw_kstr(w, "message", wk->message[0] ? wk->message : NULL);
            mg_fmt(path, sizeof(path), "%s/attempt_%d/%d/stdout.log", r->dir, at->attempt,
                   wk->local_rank);
            mg_jsonw_kbool(w, "stdout", file_exists(path));
            mg_fmt(path, sizeof(path), "%s/attempt_%d/%d/stderr.log", r->dir, at->attempt,
                   wk->local_rank);
            mg_jsonw_kbool(w, "stderr", file_exists(path));
            mg_fmt(path, sizeof(path), "%s/attempt_%d/%d", r->dir, at->attempt, wk->local_rank);
            stack_files(w, path);
            mg_jsonw_obj_end(w);
        }
        mg_jsonw_arr_end(w);
        mg_jsonw_obj_end(w);
    }
    mg_jsonw_arr_end(w);
    mg_jsonw_kstr(w, "root_cause", a->root);
    const struct lroot *x = r->has_root ? &r->root : r->has_first_fail ? &r->first_fail : NULL;
    if (x) { /* where to look first */
        mg_jsonw_kint(w, "root_attempt", x->attempt);
        mg_jsonw_kint(w, "root_local_rank", x->local_rank);
    }
    mg_jsonw_kstr(w, "latest", a->latest[0] ? a->latest : NULL);
    mg_jsonw_kint(w, "latest_attempt", a->latest_attempt);
    mg_jsonw_obj_end(w);
}

/* The last train record of the newest attempt that has metrics, from the
 * last LATEST_BYTES of its file: the page's "now" line. */
static void latest_record(const struct lrun *r, struct run_arg *a)
{
    char buf[LATEST_BYTES + 1], path[PATH_MAX + 64];
    a->latest[0] = '\0';
    a->latest_attempt = -1;
    for (int i = r->na - 1; i >= 0; i--) {
        mg_fmt(path, sizeof(path), "%s/attempt_%d/" METRICS_FILE, r->dir, r->a[i].attempt);
        int fd = mg_open_regular(path);
        if (fd < 0)
            continue;
        off_t end = lseek(fd, 0, SEEK_END);
        off_t from = end > LATEST_BYTES ? end - LATEST_BYTES : 0;
        ssize_t n = end > 0 ? pread(fd, buf, (size_t)(end - from), from) : 0;
        close(fd);
        if (n <= 0)
            continue;
        buf[n] = '\0';
        /* whole lines, newest first */
        char *endl = memrchr(buf, '\n', (size_t)n);
        while (endl) {
            *endl = '\0';
            char *start = memrchr(buf, '\n', (size_t)(endl - buf));
            char *line = start ? start + 1 : buf;
            if (!start && from > 0)
                break; /* a piece of a line */
            if (strstr(line, "\"type\":\"train\"") == line + 1) {
                mg_fmt(a->latest, sizeof(a->latest), "%s", line);
                a->latest_attempt = r->a[i].attempt;
                return;
            }
            endl = start;
        }
        return; /* the newest file with metrics says it */
    }
}

static void api_run(struct dash *d, const struct dash_req *rq, struct dash_resp *rs)
{
    struct crun *c = get_run(d, rq->arg(rq->ctx, "run"));
    if (!c) {
        fail(rs, 404, "no such run");
        return;
    }
    struct run_arg *a = calloc(1, sizeof(*a));
    if (!a) {
        fail(rs, 500, "out of memory");
        return;
    }
    a->c = c;
    size_t len = 0;
    FILE *f = open_memstream(&a->root, &len);
    if (f) {
        int any = mg_logs_print_root(f, &c->r);
        fclose(f);
        if (!any) {
            free(a->root);
            a->root = NULL;
        }
    }
    latest_record(&c->r, a);
    json_resp(rs, 200, run_fn, a);
    free(a->root);
    free(a);
}

/* ---- /api/log ----------------------------------------------------------------------------- */

static int num_arg(const struct dash_req *rq, const char *name, long min, long max, long *out)
{
    const char *s = rq->arg(rq->ctx, name);
    char *end;
    if (!s || !*s)
        return -EINVAL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*end || errno || v < min || v > max)
        return -EINVAL;
    *out = v;
    return 0;
}

static void api_log(struct dash *d, const struct dash_req *rq, struct dash_resp *rs)
{
    const char *id = rq->arg(rq->ctx, "run"), *stream = rq->arg(rq->ctx, "stream");
    long attempt, rank, offset = -1;
    if (!id_ok(id) || num_arg(rq, "attempt", 0, MAX_ATTEMPT, &attempt) ||
        num_arg(rq, "rank", 0, 65535, &rank) || !stream ||
        (strcmp(stream, "stdout") && strcmp(stream, "stderr") && !stack_stream_ok(stream)) ||
        (rq->arg(rq->ctx, "offset") && num_arg(rq, "offset", -1, LONG_MAX, &offset))) {
        fail(rs, 400,
             "want run, attempt, rank, stream (stdout, stderr, stacks or dump-<time>) and offset");
        return;
    }
    char rel[400];
    int log = !strcmp(stream, "stdout") || !strcmp(stream, "stderr");
    mg_fmt(rel, sizeof(rel), "%s/attempt_%ld/%ld/%s.%s", id, attempt, rank, stream,
           log ? "log" : "txt");
    int fd = open_beneath(d->dir, rel);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0)
            close(fd);
        fail(rs, 404, "no such log file");
        return;
    }
    long long size = st.st_size, from = offset, cut_start = 0;
    if (from < 0 || from > size) {
        /* the tail (or, past the end, nothing more) */
        from = offset < 0 ? (size > DASH_LOG_CHUNK ? size - DASH_LOG_CHUNK : 0) : size;
        cut_start = offset < 0 && from > 0;
    }
    size_t want = (size_t)(size - from < DASH_LOG_CHUNK ? size - from : DASH_LOG_CHUNK);
    char *buf = malloc(want + 1);
    ssize_t n = 0;
    while (buf && (size_t)n < want) {
        ssize_t k = pread(fd, buf + n, want - (size_t)n, (off_t)(from + n));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        n += k;
    }
    close(fd);
    if (!buf) {
        fail(rs, 500, "out of memory");
        return;
    }
    size_t skip = 0, len = (size_t)n;
    if (cut_start) { /* the tail starts at a line */
        char *nl = memchr(buf, '\n', len);
        if (nl && (size_t)(nl - buf) + 1 < len)
            skip = (size_t)(nl - buf) + 1;
    }
    if (from + n < size && len > skip) { /* more to come: end at a line when there is one */
        char *nl = memrchr(buf + skip, '\n', len - skip);
        if (nl)
            len = (size_t)(nl - buf) + 1;
    }
    memmove(buf, buf + skip, len - skip);
    rs->status = 200;
    rs->type = "text/plain; charset=utf-8";
    rs->body = buf;
    rs->len = len - skip;
    add_header(rs, "X-Log-Start", from + (long long)skip);
    add_header(rs, "X-Log-End", from + (long long)len);
    add_header(rs, "X-Log-Size", size);
}

/* ---- /api/plot.svg ------------------------------------------------------------------------ */

/* The job's earlier runs, drawn first (docs/logs.md, "The plot"): only those
 * whose directories pass the checks a run's page does; read whole, once. */
static int plot_job(const char *base, struct crun *c)
{
    int files = 0, n;
    c->job = malloc(MG_LOGS_JOB_RUNS * sizeof(*c->job));
    if (!c->job)
        return -ENOMEM;
    n = mg_logs_job_runs(base, c->id, c->job, MG_LOGS_JOB_RUNS);
    /* earliest first: keep the runs from the last one that fails the checks on */
    int from = 0;
    for (int k = 0; k + 1 < n; k++)
        if (!id_ok(c->job[k]) || !run_dir_real(base, c->job[k]))
            from = k + 1;
    memmove(c->job, c->job + from, (size_t)(n - from) * sizeof(*c->job));
    c->njob = n - from;
    int rc = c->njob > 1 ? mg_logs_plot_earlier(c->plot, base, c->job, c->njob, NULL, &files) : 0;
    return rc == -MG_ETOOBIG ? 0 : rc;
}

/* Whether any attempt of the run has a metrics file yet (the first that
 * does holds the start record that names the run it resumed). */
static int has_metrics(const struct lrun *r)
{
    char path[PATH_MAX + 64];
    for (int i = 0; i < r->na; i++) {
        mg_fmt(path, sizeof(path), "%s/attempt_%d/" METRICS_FILE, r->dir, r->a[i].attempt);
        if (access(path, R_OK) == 0)
            return 1;
    }
    return 0;
}

/* Feeds the plot what each attempt's metrics file gained; starts over when a
 * file was replaced or shrank. */
static int refresh_plot(const char *base, struct dash_cache *cc, struct crun *c)
{
    const struct lrun *r = &c->r;
    char path[PATH_MAX + 64];
    if (c->plot && c->job_pending && has_metrics(r))
        drop_plot(c); /* its start record says now which job it continues */
    if (!c->plot) {
        int plots = 0, old = -1;
        for (int i = 0; i < cc->n; i++)
            if (cc->runs[i]->plot) {
                plots++;
                if (old < 0 || cc->runs[i]->used < cc->runs[old]->used)
                    old = i;
            }
        if (plots >= DASH_MAX_PLOTS)
            drop_plot(cc->runs[old]);
        if (mg_plot_new(&c->plot) < 0)
            return -ENOMEM;
        c->dirty = 1;
        c->job_pending = !has_metrics(r);
        int rc = plot_job(base, c);
        if (rc < 0)
            return rc;
    }
    for (int i = 0; i < r->na; i++) {
        struct stat st;
        struct plot_file *pf = NULL;
        mg_fmt(path, sizeof(path), "%s/attempt_%d/" METRICS_FILE, r->dir, r->a[i].attempt);
        if (stat(path, &st) < 0)
            continue;
        for (int k = 0; k < c->npf && !pf; k++)
            if (c->pf[k].attempt == r->a[i].attempt)
                pf = &c->pf[k];
        if (pf && (pf->ino != st.st_ino || st.st_size < pf->off)) {
            drop_plot(c); /* replaced: read every file again */
            return refresh_plot(base, cc, c);
        }
        if (!pf) {
            struct plot_file *v = realloc(c->pf, (size_t)(c->npf + 1) * sizeof(*v));
            if (!v)
                return -ENOMEM;
            c->pf = v;
            pf = &c->pf[c->npf++];
            pf->attempt = r->a[i].attempt;
            pf->off = 0;
            pf->ino = st.st_ino;
            if (c->njob > 1) {
                char label[64];
                mg_fmt(label, sizeof(label), "run %d attempt %d", c->njob, pf->attempt);
                if (mg_plot_label(c->plot, mg_logs_plot_number(c->njob - 1, pf->attempt), label) <
                    0)
                    return -ENOMEM;
            }
        }
        if (st.st_size > pf->off) {
            long long before = pf->off;
            int number = c->njob > 1 ? mg_logs_plot_number(c->njob - 1, pf->attempt) : pf->attempt;
            int rc = mg_plot_add_file(c->plot, path, number, &pf->off, DASH_METRICS_STEP, 0);
            if (rc < 0 && rc != -MG_ETOOBIG && rc != -ENOENT)
                return rc;
            c->dirty |= pf->off != before;
        }
    }
    if (c->dirty || !c->svg) {
        char title[MG_LOGS_JOB_RUNS * 260 + 64], *svg = NULL;
        size_t len = 0;
        if (c->njob > 1)
            mg_logs_plot_title(title, sizeof(title), c->job, c->njob);
        else
            mg_fmt(title, sizeof(title), "run %s", c->id);
        struct mg_plot_opts po = {.title = title};
        int rc = mg_plot_svg(c->plot, &po, &svg, &len);
        if (rc < 0)
            return rc;
        free(c->svg);
        c->svg = svg;
        c->svg_len = len;
        c->gen++;
        c->dirty = 0;
    }
    return 0;
}

static void api_plot(struct dash *d, const struct dash_req *rq, struct dash_resp *rs)
{
    struct crun *c = get_run(d, rq->arg(rq->ctx, "run"));
    char etag[64];
    if (!c) {
        fail(rs, 404, "no such run");
        return;
    }
    int rc = refresh_plot(d->dir, d->cache, c);
    if (rc < 0) {
        char msg[200];
        mg_fmt(msg, sizeof(msg), "cannot draw the plot: %s", mg_strerror(rc));
        fail(rs, 500, msg);
        return;
    }
    mg_fmt(etag, sizeof(etag), "\"%lu-%ld\"", c->gen, mg_plot_records(c->plot));
    const char *inm = rq->header(rq->ctx, "If-None-Match");
    rs->hdr_name[rs->nhdr] = "ETag";
    mg_fmt(rs->hdr_value[rs->nhdr++], sizeof(rs->hdr_value[0]), "%s", etag);
    add_header(rs, "X-Plot-Records", mg_plot_records(c->plot));
    if (inm && strcmp(inm, etag) == 0) {
        rs->status = 304;
        rs->type = "image/svg+xml";
        return;
    }
    rs->status = 200;
    rs->type = "image/svg+xml";
    rs->body = c->svg;
    rs->len = c->svg_len;
    rs->body_static = DASH_BODY_COPY; /* the cache's: the next request may replace it */
}

/* ---- who may ask -------------------------------------------------------------------------- */

/* A page elsewhere can make a browser send requests to 127.0.0.1, and a
 * rebound DNS name can even read the answers: on loopback, only requests
 * for a loopback name are answered. */
static int host_ok(const struct dash *d, const char *host)
{
    static const char *const names[] = {"127.0.0.1", "localhost", "[::1]"};
    if (!d->loopback || d->token[0])
        return 1;
    if (!host)
        return 0;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        size_t n = strlen(names[i]);
        char port[16];
        snprintf(port, sizeof(port), ":%d", d->port);
        if (strncmp(host, names[i], n) == 0 && (!host[n] || strcmp(host + n, port) == 0))
            return 1;
    }
    return 0;
}

static int token_ok(const struct dash *d, const struct dash_req *rq)
{
    if (!d->token[0])
        return 1;
    const char *t = rq->header(rq->ctx, "X-MG-Token");
    if (!t)
        t = rq->arg(rq->ctx, "token");
    size_t n = strlen(d->token);
    return t && strlen(t) == n && mg_memeq_ct(t, d->token, n);
}

void dash_handle(struct dash *d, const struct dash_req *rq, struct dash_resp *rs)
{
    memset(rs, 0, sizeof(*rs));
    if (!host_ok(d, rq->header(rq->ctx, "Host"))) {
        fail(rs, 403, "this dashboard answers requests for 127.0.0.1, localhost or [::1] only");
        return;
    }
    if (!token_ok(d, rq)) {
        fail(rs, 401, "a token is needed: open the address mglaunch dashboard printed");
        return;
    }
    if (strcmp(rq->path, "/") == 0 || strcmp(rq->path, "/index.html") == 0) {
        rs->status = 200;
        rs->type = "text/html; charset=utf-8";
        rs->body = (char *)mg_dash_page;
        rs->len = mg_dash_page_len;
        rs->body_static = DASH_BODY_STATIC;
    } else if (strcmp(rq->path, "/api/runs") == 0) {
        api_runs(d, rs);
    } else if (strcmp(rq->path, "/api/run") == 0) {
        api_run(d, rq, rs);
    } else if (strcmp(rq->path, "/api/log") == 0) {
        api_log(d, rq, rs);
    } else if (strcmp(rq->path, "/api/plot.svg") == 0) {
        api_plot(d, rq, rs);
    } else {
        fail(rs, 404, "no such page");
    }
}
