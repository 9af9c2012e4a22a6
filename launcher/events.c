/* The event log's writers and its parser (see events.h, docs/logs.md). */
#include "events.h"
#include "fs.h"
#include "redact.h"
#include "json.h"
#include "mg_err.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EV_TOKS 512 /* run_start, the widest event, needs about 160 */

int64_t mg_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- writing ---------------------------------------------------------------------------- */

struct ev {
    struct mg_jsonw w;
    char buf[32768]; /* every field is capped well under this */
};

static void ev_begin(struct ev *e, const char *name)
{
    mg_jsonw_init(&e->w, e->buf, sizeof(e->buf));
    mg_jsonw_obj_begin(&e->w);
    mg_jsonw_kstr(&e->w, "event", name);
    mg_jsonw_kint(&e->w, "time_ms", mg_wall_ms());
}

static void ev_end(struct mg_rundir *rd, struct ev *e)
{
    mg_jsonw_obj_end(&e->w);
    int n = mg_jsonw_finish(&e->w);
    if (n > 0)
        mg_rundir_event(rd, e->buf, (size_t)n);
}

/* An optional string: left out when NULL. */
static void opt_str(struct ev *e, const char *key, const char *s)
{
    if (s)
        mg_jsonw_kstr(&e->w, key, s);
}

static void worker_fields(struct ev *e, const struct mg_ev_worker *w)
{
    mg_jsonw_kint(&e->w, "attempt", w->attempt);
    mg_jsonw_kint(&e->w, "local_rank", w->local_rank);
    mg_jsonw_kint(&e->w, "rank", w->rank);
    mg_jsonw_kint(&e->w, "pid", w->pid);
}

void mg_event_run_start(struct mg_rundir *rd, const struct mg_ev_run_start *x)
{
    struct ev e;
    size_t total = 0;
    ev_begin(&e, "run_start");
    mg_jsonw_kstr(&e.w, "run_id", x->run_id);
    mg_jsonw_kstr(&e.w, "host", x->host);
    mg_jsonw_kint(&e.w, "pid", x->pid);
    mg_jsonw_kint(&e.w, "proc_start", x->proc_start);
    mg_jsonw_kstr(&e.w, "version", x->version);
    mg_jsonw_kint(&e.w, "nproc", x->nproc);
    mg_jsonw_kint(&e.w, "max_restarts", x->max_restarts);
    mg_jsonw_kstr(&e.w, "role", x->role);
    mg_jsonw_kstr(&e.w, "rdzv_backend", x->rdzv_backend);
    mg_jsonw_kbool(&e.w, "logs_saved", x->logs_saved);
    mg_jsonw_key(&e.w, "argv");
    mg_jsonw_arr_begin(&e.w);
    for (int i = 0; i < x->argc; i++) {
        /* The one place the command line is recorded: its secrets stay out
         * (a password in --upload's URL, a token=, an AWS key). */
        char arg[MG_EV_ARGV_BYTES + 2]; /* one over the bound: "..." */
        mg_redact_arg(i ? x->argv[i - 1] : NULL, x->argv[i], arg, sizeof(arg));
        size_t n = strlen(arg);
        if (i >= MG_EV_ARGV_MAX || total + n > MG_EV_ARGV_BYTES) {
            mg_jsonw_str(&e.w, "...");
            break;
        }
        total += n;
        mg_jsonw_str(&e.w, arg);
    }
    mg_jsonw_arr_end(&e.w);
    ev_end(rd, &e);
}

void mg_event_attempt_start(struct mg_rundir *rd, const struct mg_ev_attempt_start *x)
{
    struct ev e;
    ev_begin(&e, "attempt_start");
    mg_jsonw_kint(&e.w, "attempt", x->attempt);
    mg_jsonw_kint(&e.w, "restart_count", x->restart_count);
    mg_jsonw_kint(&e.w, "round", x->round);
    mg_jsonw_kint(&e.w, "nproc", x->nproc);
    mg_jsonw_kint(&e.w, "world_size", x->world_size);
    mg_jsonw_kint(&e.w, "group_rank", x->group_rank);
    mg_jsonw_kint(&e.w, "group_world_size", x->group_world_size);
    if (x->first_rank >= 0)
        mg_jsonw_kint(&e.w, "first_rank", x->first_rank);
    mg_jsonw_kstr(&e.w, "master_addr", x->master_addr);
    mg_jsonw_kint(&e.w, "master_port", x->master_port);
    mg_jsonw_kstr(&e.w, "dir", x->dir);
    ev_end(rd, &e);
}

void mg_event_worker_start(struct mg_rundir *rd, const struct mg_ev_worker *x)
{
    struct ev e;
    ev_begin(&e, "worker_start");
    worker_fields(&e, x);
    ev_end(rd, &e);
}

void mg_event_worker_exit(struct mg_rundir *rd, const struct mg_ev_worker_exit *x)
{
    struct ev e;
    ev_begin(&e, "worker_exit");
    worker_fields(&e, &x->w);
    mg_jsonw_kstr(&e.w, "outcome", x->outcome);
    mg_jsonw_kint(&e.w, "exit_code", x->exit_code);
    opt_str(&e, "signal", x->signal);
    opt_str(&e, "exec_error", x->exec_error);
    mg_jsonw_kint(&e.w, "duration_ms", x->duration_ms);
    if (x->message) {
        mg_jsonw_key(&e.w, "message");
        mg_jsonw_strn(&e.w, x->message, strnlen(x->message, MG_EV_MESSAGE_MAX));
    }
    opt_str(&e, "oom", x->oom);
    ev_end(rd, &e);
}

void mg_event_worker_logs(struct mg_rundir *rd, const struct mg_ev_worker_logs *x)
{
    struct ev e;
    ev_begin(&e, "worker_logs");
    worker_fields(&e, &x->w);
    mg_jsonw_kstr(&e.w, "stdout", x->out);
    mg_jsonw_kstr(&e.w, "stderr", x->err);
    opt_str(&e, "stderr_tail", x->stderr_tail);
    ev_end(rd, &e);
}

void mg_event_logs_note(const char *out, const char *err, char *buf, size_t cap)
{
    static const char cut[] = "cut short: ";
    const char *why[2] = {out, err}, *name[2] = {"stdout.log", "stderr.log"};
    int is[2];
    for (int k = 0; k < 2; k++) {
        is[k] = why[k] && strncmp(why[k], cut, sizeof(cut) - 1) == 0;
        why[k] = is[k] ? why[k] + sizeof(cut) - 1 : NULL;
    }
    const char *w = is[1] ? why[1] : why[0];
    buf[0] = '\0';
    if (!is[0] && !is[1])
        return;
    mg_fmt(buf, cap, "%s%s%s cut short: %s", is[0] ? name[0] : "", is[0] && is[1] ? " and " : "",
           is[1] ? name[1] : "", strcmp(w, strerror(ENOSPC)) == 0 ? "disk full" : w);
}

void mg_event_signal(struct mg_rundir *rd, const struct mg_ev_signal *x)
{
    struct ev e;
    ev_begin(&e, "signal");
    mg_jsonw_kstr(&e.w, "signal", x->signal);
    if (x->forwarded_only)
        mg_jsonw_kbool(&e.w, "forwarded_only", 1);
    ev_end(rd, &e);
}

void mg_event_kill(struct mg_rundir *rd, const struct mg_ev_kill *x)
{
    struct ev e;
    ev_begin(&e, "kill");
    mg_jsonw_kint(&e.w, "attempt", x->attempt);
    mg_jsonw_kint(&e.w, "workers", x->workers);
    mg_jsonw_kstr(&e.w, "reason", x->reason);
    ev_end(rd, &e);
}

void mg_event_attempt_end(struct mg_rundir *rd, const struct mg_ev_attempt_end *x)
{
    struct ev e;
    ev_begin(&e, "attempt_end");
    mg_jsonw_kint(&e.w, "attempt", x->attempt);
    mg_jsonw_kstr(&e.w, "result", x->result);
    mg_jsonw_kint(&e.w, "failed", x->failed);
    mg_jsonw_kint(&e.w, "stopped", x->stopped);
    mg_jsonw_kint(&e.w, "duration_ms", x->duration_ms);
    if (x->step >= 0)
        mg_jsonw_kint(&e.w, "step", x->step);
    ev_end(rd, &e);
}

void mg_event_resume(struct mg_rundir *rd, const struct mg_ev_resume *x)
{
    struct ev e;
    ev_begin(&e, "resume");
    mg_jsonw_kint(&e.w, "attempt", x->attempt);
    mg_jsonw_kint(&e.w, "rank", x->rank);
    mg_jsonw_kint(&e.w, "world_size", x->world_size);
    mg_jsonw_kstr(&e.w, "from", x->from);
    mg_jsonw_kint(&e.w, "step", x->step);
    mg_jsonw_kint(&e.w, "epoch", x->epoch);
    opt_str(&e, "source", x->source);
    if (x->source_rank >= 0)
        mg_jsonw_kint(&e.w, "source_rank", x->source_rank);
    if (x->source_world_size > 0)
        mg_jsonw_kint(&e.w, "source_world_size", x->source_world_size);
    opt_str(&e, "checkpoint", x->checkpoint);
    ev_end(rd, &e);
}

void mg_event_restart(struct mg_rundir *rd, const struct mg_ev_restart *x)
{
    struct ev e;
    ev_begin(&e, "restart");
    mg_jsonw_kint(&e.w, "restart_count", x->restart_count);
    mg_jsonw_kint(&e.w, "max_restarts", x->max_restarts);
    mg_jsonw_kint(&e.w, "backoff_ms", x->backoff_ms);
    mg_jsonw_kstr(&e.w, "reason", x->reason);
    ev_end(rd, &e);
}

/* The fields root_cause and remote_cause share, in one writer: attempt < 0
 * (remote: not this node's attempt), node NULL and nranks 0 are left out. */
struct cause {
    int attempt, rank, local_rank, pid, exit_code;
    const char *signal, *host, *node;
    int64_t time_ms;
    int first_rank, nranks;
    const char *message;
};

static void cause_fields(struct ev *e, const char *key, const struct cause *c)
{
    mg_jsonw_key(&e->w, key);
    mg_jsonw_obj_begin(&e->w);
    if (c->attempt >= 0)
        mg_jsonw_kint(&e->w, "attempt", c->attempt);
    mg_jsonw_kint(&e->w, "rank", c->rank);
    mg_jsonw_kint(&e->w, "local_rank", c->local_rank);
    mg_jsonw_kint(&e->w, "pid", c->pid);
    mg_jsonw_kint(&e->w, "exit_code", c->exit_code);
    opt_str(e, "signal", c->signal);
    mg_jsonw_kstr(&e->w, "host", c->host);
    opt_str(e, "node", c->node);
    mg_jsonw_kint(&e->w, "time_ms", c->time_ms);
    if (c->nranks > 0) {
        mg_jsonw_kint(&e->w, "first_rank", c->first_rank);
        mg_jsonw_kint(&e->w, "nranks", c->nranks);
    }
    opt_str(e, "message", c->message);
    mg_jsonw_obj_end(&e->w);
}

void mg_event_run_end(struct mg_rundir *rd, const struct mg_ev_run_end *x)
{
    struct ev e;
    ev_begin(&e, "run_end");
    mg_jsonw_kstr(&e.w, "result", x->result);
    mg_jsonw_kint(&e.w, "exit_code", x->exit_code);
    mg_jsonw_kint(&e.w, "rounds", x->rounds);
    mg_jsonw_kint(&e.w, "restarts", x->restarts);
    opt_str(&e, "signal", x->signal);
    opt_str(&e, "error", x->error);
    if (x->has_root) {
        const struct mg_ev_root_cause *rc = &x->root;
        struct cause c = {rc->attempt, rc->rank,   rc->local_rank, rc->pid,     rc->exit_code,
                          rc->signal,  rc->host,   NULL,           rc->time_ms, 0,
                          0,           rc->message};
        cause_fields(&e, "root_cause", &c);
    }
    if (x->has_remote) {
        const struct mg_ev_remote_cause *rc = &x->remote;
        struct cause c = {-1,         rc->rank,   rc->local_rank, rc->pid,     rc->exit_code,
                          rc->signal, rc->host,   rc->node,       rc->time_ms, rc->first_rank,
                          rc->nranks, rc->message};
        cause_fields(&e, "remote_cause", &c);
    }
    ev_end(rd, &e);
}

/* ---- reading ---------------------------------------------------------------------------- */

struct parse {
    const struct mg_json *d;
    struct mg_event_reader *r;
    size_t used; /* bytes of r->strs taken by this event's strings */
};

static const char *str_at(struct parse *p, int t)
{
    size_t room = MG_EV_LINE_MAX - p->used;
    char *s = p->r->strs + p->used;
    if (t < 0 || p->d->toks[t].type != MG_JSON_STRING || room < 1)
        return NULL;
    int n = mg_json_str(p->d, t, s, room);
    if (n < 0)
        return NULL;
    p->used += (size_t)n < room ? (size_t)n + 1 : room;
    return s;
}

static const char *str(struct parse *p, int obj, const char *key)
{
    return str_at(p, mg_json_get(p->d, obj, key));
}

static long long num(struct parse *p, int obj, const char *key, long long dflt)
{
    long long v;
    int t = mg_json_get(p->d, obj, key);
    return t >= 0 && mg_json_int(p->d, t, &v) == 0 ? v : dflt;
}

/* A number that must fit an int: a value beyond one (a damaged or hostile
 * file) is taken as missing, never cut to another number. */
static int inum(struct parse *p, int obj, const char *key, int dflt)
{
    long long v = num(p, obj, key, dflt);
    return v < INT_MIN || v > INT_MAX ? dflt : (int)v;
}

/* An attempt number: as a directory name allows (mg_attempt_number), else -1. */
static int attempt_of(struct parse *p, int obj)
{
    int v = inum(p, obj, "attempt", -1);
    return v < 0 || v > MG_ATTEMPT_MAX ? -1 : v;
}

static int flag(struct parse *p, int obj, const char *key)
{
    int v = 0;
    int t = mg_json_get(p->d, obj, key);
    if (t >= 0)
        mg_json_bool(p->d, t, &v);
    return v;
}

static void read_worker(struct parse *p, struct mg_ev_worker *w)
{
    w->attempt = attempt_of(p, 0);
    w->local_rank = inum(p, 0, "local_rank", -1);
    w->rank = inum(p, 0, "rank", -1);
    w->pid = inum(p, 0, "pid", 0);
}

static void read_run_start(struct parse *p, struct mg_ev_run_start *x)
{
    x->run_id = str(p, 0, "run_id");
    x->host = str(p, 0, "host");
    x->pid = inum(p, 0, "pid", 0);
    x->proc_start = num(p, 0, "proc_start", 0);
    x->version = str(p, 0, "version");
    x->nproc = inum(p, 0, "nproc", 0);
    x->max_restarts = inum(p, 0, "max_restarts", 0);
    x->role = str(p, 0, "role");
    x->rdzv_backend = str(p, 0, "rdzv_backend");
    x->logs_saved = flag(p, 0, "logs_saved");
    int arr = mg_json_get(p->d, 0, "argv");
    x->argc = 0;
    for (int i = 0; arr >= 0 && i <= MG_EV_ARGV_MAX; i++) {
        const char *a = str_at(p, mg_json_at(p->d, arr, i));
        if (!a)
            break;
        p->r->argv[x->argc++] = (char *)a;
    }
    p->r->argv[x->argc] = NULL;
    x->argv = p->r->argv;
}

static void read_attempt_start(struct parse *p, struct mg_ev_attempt_start *x)
{
    x->attempt = attempt_of(p, 0);
    x->restart_count = inum(p, 0, "restart_count", 0);
    x->round = inum(p, 0, "round", 0);
    x->nproc = inum(p, 0, "nproc", 0);
    x->world_size = inum(p, 0, "world_size", 0);
    x->group_rank = inum(p, 0, "group_rank", 0);
    x->group_world_size = inum(p, 0, "group_world_size", 0);
    x->first_rank = inum(p, 0, "first_rank", -1);
    x->master_addr = str(p, 0, "master_addr");
    x->master_port = inum(p, 0, "master_port", 0);
    x->dir = str(p, 0, "dir");
}

static void read_worker_exit(struct parse *p, struct mg_ev_worker_exit *x)
{
    read_worker(p, &x->w);
    x->outcome = str(p, 0, "outcome");
    x->exit_code = inum(p, 0, "exit_code", 0);
    x->signal = str(p, 0, "signal");
    x->exec_error = str(p, 0, "exec_error");
    x->duration_ms = num(p, 0, "duration_ms", 0);
    x->message = str(p, 0, "message");
    x->oom = str(p, 0, "oom");
}

static void read_run_end(struct parse *p, struct mg_ev_run_end *x)
{
    x->result = str(p, 0, "result");
    x->exit_code = inum(p, 0, "exit_code", 0);
    x->rounds = inum(p, 0, "rounds", 0);
    x->restarts = inum(p, 0, "restarts", 0);
    x->signal = str(p, 0, "signal");
    x->error = str(p, 0, "error");
    int rm = mg_json_get(p->d, 0, "remote_cause");
    x->has_remote = rm >= 0;
    if (x->has_remote) {
        struct mg_ev_remote_cause *m = &x->remote;
        m->rank = inum(p, rm, "rank", -1);
        m->local_rank = inum(p, rm, "local_rank", -1);
        m->pid = inum(p, rm, "pid", 0);
        m->exit_code = inum(p, rm, "exit_code", 0);
        m->signal = str(p, rm, "signal");
        m->host = str(p, rm, "host");
        m->node = str(p, rm, "node");
        m->time_ms = num(p, rm, "time_ms", 0);
        m->first_rank = inum(p, rm, "first_rank", 0);
        m->nranks = inum(p, rm, "nranks", 0);
        m->message = str(p, rm, "message");
    }
    int rc = mg_json_get(p->d, 0, "root_cause");
    x->has_root = rc >= 0;
    if (!x->has_root)
        return;
    struct mg_ev_root_cause *c = &x->root;
    c->attempt = attempt_of(p, rc);
    c->rank = inum(p, rc, "rank", -1);
    c->local_rank = inum(p, rc, "local_rank", -1);
    c->pid = inum(p, rc, "pid", 0);
    c->exit_code = inum(p, rc, "exit_code", 0);
    c->signal = str(p, rc, "signal");
    c->host = str(p, rc, "host");
    c->time_ms = num(p, rc, "time_ms", 0);
    c->message = str(p, rc, "message");
}

static const char *const kind_names[] = {
    [MG_EV_RUN_START] = "run_start",
    [MG_EV_ATTEMPT_START] = "attempt_start",
    [MG_EV_WORKER_START] = "worker_start",
    [MG_EV_WORKER_EXIT] = "worker_exit",
    [MG_EV_SIGNAL] = "signal",
    [MG_EV_KILL] = "kill",
    [MG_EV_ATTEMPT_END] = "attempt_end",
    [MG_EV_RESTART] = "restart",
    [MG_EV_RUN_END] = "run_end",
    [MG_EV_WORKER_LOGS] = "worker_logs",
    [MG_EV_RESUME] = "resume",
};

/* One line, without its '\n': 0, or -MG_EFORMAT when it is not a JSON object. */
static int parse_line(struct mg_event_reader *r, const char *line, size_t len, struct mg_event *ev)
{
    struct mg_json d;
    struct parse p = {.d = &d, .r = r};

    memset(ev, 0, sizeof(*ev));
    if (mg_json_parse(&d, line, len, r->toks, EV_TOKS) <= 0 || d.toks[0].type != MG_JSON_OBJECT)
        return -MG_EFORMAT;
    ev->name = str(&p, 0, "event");
    ev->time_ms = num(&p, 0, "time_ms", 0);
    ev->kind = MG_EV_OTHER;
    for (size_t k = 1; ev->name && k < sizeof(kind_names) / sizeof(kind_names[0]); k++)
        if (strcmp(ev->name, kind_names[k]) == 0)
            ev->kind = (enum mg_event_kind)k;
    switch (ev->kind) {
    case MG_EV_RUN_START:
        read_run_start(&p, &ev->u.run_start);
        break;
    case MG_EV_ATTEMPT_START:
        read_attempt_start(&p, &ev->u.attempt_start);
        break;
    case MG_EV_WORKER_START:
        read_worker(&p, &ev->u.worker_start);
        break;
    case MG_EV_WORKER_EXIT:
        read_worker_exit(&p, &ev->u.worker_exit);
        break;
    case MG_EV_SIGNAL:
        ev->u.signal.signal = str(&p, 0, "signal");
        ev->u.signal.forwarded_only = flag(&p, 0, "forwarded_only");
        break;
    case MG_EV_KILL:
        ev->u.kill.attempt = attempt_of(&p, 0);
        ev->u.kill.workers = inum(&p, 0, "workers", 0);
        ev->u.kill.reason = str(&p, 0, "reason");
        break;
    case MG_EV_ATTEMPT_END:
        ev->u.attempt_end.attempt = attempt_of(&p, 0);
        ev->u.attempt_end.result = str(&p, 0, "result");
        ev->u.attempt_end.failed = inum(&p, 0, "failed", 0);
        ev->u.attempt_end.stopped = inum(&p, 0, "stopped", 0);
        ev->u.attempt_end.duration_ms = num(&p, 0, "duration_ms", 0);
        ev->u.attempt_end.step = num(&p, 0, "step", -1);
        break;
    case MG_EV_RESUME: {
        struct mg_ev_resume *x = &ev->u.resume;
        x->attempt = attempt_of(&p, 0);
        x->rank = inum(&p, 0, "rank", -1);
        x->world_size = inum(&p, 0, "world_size", 0);
        x->from = str(&p, 0, "from");
        x->step = num(&p, 0, "step", -1);
        x->epoch = num(&p, 0, "epoch", 0);
        x->source = str(&p, 0, "source");
        x->source_rank = inum(&p, 0, "source_rank", -1);
        x->source_world_size = inum(&p, 0, "source_world_size", 0);
        x->checkpoint = str(&p, 0, "checkpoint");
        break;
    }
    case MG_EV_RESTART:
        ev->u.restart.restart_count = inum(&p, 0, "restart_count", 0);
        ev->u.restart.max_restarts = inum(&p, 0, "max_restarts", 0);
        ev->u.restart.backoff_ms = num(&p, 0, "backoff_ms", 0);
        ev->u.restart.reason = str(&p, 0, "reason");
        break;
    case MG_EV_RUN_END:
        read_run_end(&p, &ev->u.run_end);
        break;
    case MG_EV_WORKER_LOGS:
        read_worker(&p, &ev->u.worker_logs.w);
        ev->u.worker_logs.out = str(&p, 0, "stdout");
        ev->u.worker_logs.err = str(&p, 0, "stderr");
        ev->u.worker_logs.stderr_tail = str(&p, 0, "stderr_tail");
        break;
    case MG_EV_OTHER:
        break;
    }
    return 0;
}

int mg_event_reader_open(struct mg_event_reader *r, const char *path)
{
    memset(r, 0, sizeof(*r));
    r->line = malloc(MG_EV_LINE_MAX);
    r->strs = malloc(MG_EV_LINE_MAX);
    r->toks = malloc(EV_TOKS * sizeof(*r->toks));
    if (!r->line || !r->strs || !r->toks) {
        mg_event_reader_close(r);
        return -ENOMEM;
    }
    int fd = mg_open_regular(path); /* a FIFO there would hold the reader */
    if (fd < 0 || !(r->f = fdopen(fd, "r"))) {
        int rc = fd < 0 ? fd : -errno;
        if (fd >= 0)
            close(fd);
        mg_event_reader_close(r);
        return rc;
    }
    return 0;
}

int mg_event_read(struct mg_event_reader *r, struct mg_event *ev)
{
    int skipping = 0;
    while (fgets(r->line, MG_EV_LINE_MAX, r->f)) {
        size_t n = strlen(r->line);
        int whole = n && r->line[n - 1] == '\n';
        if (skipping || !whole) { /* too long, or cut at the end of the file */
            skipping = !whole;
            continue;
        }
        if (parse_line(r, r->line, n - 1, ev) == 0)
            return 1;
    }
    return 0;
}

void mg_event_reader_close(struct mg_event_reader *r)
{
    if (r->f)
        fclose(r->f);
    free(r->line);
    free(r->strs);
    free(r->toks);
    memset(r, 0, sizeof(*r));
}
