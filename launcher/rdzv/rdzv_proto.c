/* The multi-node rendezvous protocol over the key-value interface (see rdzv.h
 * for the keys and rules, docs/rendezvous.md for the user's view). */
#include "rdzv_proto.h"
#include "mg_err.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define KEY_MAX         MG_KV_MAX_KEY
#define CLOSE_MAX_BYTES (MG_KV_MAX_VALUE - 1)
#define CAS_TRIES       64
#define STEP_AGAIN_SAME 3 /* continue at once, same phase */

struct state {
    int64_t round, restarts;
    char status; /* 'r' running, 'd' done, 'f' failed */
    char cause;  /* why the round last moved: '-' start, 'f' failure, 'x' node died, 'j' node
                    waiting to join, 'l' lease lost */
    int64_t rev;
    char raw[64];
};

struct mg_rdzv {
    struct mg_kv *kv;
    char ns[KEY_MAX / 2];
    int min, max, fixed, nproc, max_restarts;
    struct mg_rdzv_conf conf;
    char id[MG_RDZV_ID_MAX];
    char host[MG_HOST_MAX];
    char addr[MG_HOST_MAX];
    int prev_rank;
    /* the reserved port of this round */
    int listen_fd, port;
    /* the formed round */
    int formed;
    int64_t round, restarts;
    struct mg_rdzv_desc *members;
    int nmembers;
    int64_t next_tick, last_ok;
    /* joining */
    enum {
        J_IDLE,
        J_TOP,
        J_ROUND
    } jstate;
    int64_t jround, jdeadline, last_call;
    int64_t jcount; /* nodes seen in round jround, -1 before the first count */
    /* exit barrier, close */
    int64_t bdeadline, cdeadline;
    /* after a step that waited: when the next one has something to do even
     * if the backend does not change */
    int64_t wake_at;
    enum mg_rdzv_reason reason;
    char msg[MG_RDZV_MSG_MAX];
    int have_fail;
    struct mg_rdzv_failure fail;
};

__attribute__((format(printf, 2, 3))) static void say(struct mg_rdzv *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof(r->msg), fmt, ap);
    va_end(ap);
}

/* A backend failure: the message is the backend's (it names the endpoint). */
static int kvfail(struct mg_rdzv *r, const char *what, int rc)
{
    const char *e = mg_kv_error(r->kv);
    say(r, "%s: %s", what, e[0] ? e : mg_strerror(rc));
    return rc;
}

static void key(const struct mg_rdzv *r, char *buf, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void key(const struct mg_rdzv *r, char *buf, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(buf, KEY_MAX, "%s/", r->ns);
    va_start(ap, fmt);
    vsnprintf(buf + n, (size_t)(KEY_MAX - n), fmt, ap);
    va_end(ap);
}

/* ---- descriptors ------------------------------------------------------------ */

int mg_rdzv_desc_format(const struct mg_rdzv_desc *d, char *buf, size_t len)
{
    int n = snprintf(buf, len, "id=%s host=%s addr=%s port=%d nproc=%d prev=%d fixed=%d", d->id,
                     d->host, d->addr, d->port, d->nproc, d->prev, d->fixed);
    return n < 0 || (size_t)n >= len ? -MG_ETOOBIG : n;
}

static int field_str(const char *v, size_t n, char *dst, size_t cap)
{
    if (n == 0 || n >= cap)
        return -MG_EFORMAT;
    memcpy(dst, v, n);
    dst[n] = 0;
    return 0;
}

static int field_int(const char *v, size_t n, int lo, int hi, int *out)
{
    char tmp[16], *end;
    if (n == 0 || n >= sizeof(tmp))
        return -MG_EFORMAT;
    memcpy(tmp, v, n);
    tmp[n] = 0;
    errno = 0;
    long x = strtol(tmp, &end, 10);
    if (errno || *end || x < lo || x > hi)
        return -MG_EFORMAT;
    *out = (int)x;
    return 0;
}

int mg_rdzv_desc_parse(const char *text, struct mg_rdzv_desc *d)
{
    const char *p = text;
    unsigned seen = 0;

    memset(d, 0, sizeof(*d));
    while (*p && *p != '\n') {
        const char *end = p, *eq;
        while (*end && *end != ' ' && *end != '\n')
            end++;
        eq = memchr(p, '=', (size_t)(end - p));
        if (!eq)
            return -MG_EFORMAT;
        size_t kn = (size_t)(eq - p), vn = (size_t)(end - eq - 1);
        const char *v = eq + 1;
        int rc = 0;
#define IS(name) (kn == sizeof(name) - 1 && memcmp(p, name, kn) == 0)
        if (IS("id"))
            rc = field_str(v, vn, d->id, sizeof(d->id)), seen |= 1;
        else if (IS("host"))
            rc = field_str(v, vn, d->host, sizeof(d->host)), seen |= 2;
        else if (IS("addr"))
            rc = field_str(v, vn, d->addr, sizeof(d->addr)), seen |= 4;
        else if (IS("port"))
            rc = field_int(v, vn, 0, 65535, &d->port), seen |= 8;
        else if (IS("nproc"))
            rc = field_int(v, vn, 1, 1 << 20, &d->nproc), seen |= 16;
        else if (IS("prev"))
            rc = field_int(v, vn, -1, MG_RDZV_MAX_NODES, &d->prev), seen |= 32;
        else if (IS("fixed"))
            rc = field_int(v, vn, -1, MG_RDZV_MAX_NODES, &d->fixed), seen |= 64;
            /* unknown fields are skipped: newer agents may add some */
#undef IS
        if (rc < 0)
            return rc;
        p = *end == ' ' ? end + 1 : end;
    }
    return seen == 127 ? 0 : -MG_EFORMAT;
}

static int desc_cmp(const void *a, const void *b)
{
    const struct mg_rdzv_desc *x = a, *y = b;
    /* 1. a fixed --node_rank (static backend) */
    if (x->fixed != y->fixed) {
        if (x->fixed < 0 || y->fixed < 0)
            return x->fixed < 0 ? 1 : -1;
        return x->fixed < y->fixed ? -1 : 1;
    }
    /* 2. members of the previous round keep their relative order */
    if (x->prev != y->prev) {
        if (x->prev < 0 || y->prev < 0)
            return x->prev < 0 ? 1 : -1;
        return x->prev < y->prev ? -1 : 1;
    }
    /* 3. newcomers by host name, then agent id */
    int c = strcmp(x->host, y->host);
    return c ? c : strcmp(x->id, y->id);
}

void mg_rdzv_rank_order(struct mg_rdzv_desc *d, int n)
{
    qsort(d, (size_t)n, sizeof(*d), desc_cmp);
}

static void my_desc(const struct mg_rdzv *r, struct mg_rdzv_desc *d)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->id, sizeof(d->id), "%s", r->id);
    snprintf(d->host, sizeof(d->host), "%s", r->host);
    snprintf(d->addr, sizeof(d->addr), "%s", r->addr);
    d->port = r->port;
    d->nproc = r->nproc;
    d->prev = r->prev_rank;
    d->fixed = r->fixed;
}

/* ---- state --------------------------------------------------------------------- */

static void state_format(struct state *s)
{
    snprintf(s->raw, sizeof(s->raw), "%" PRId64 " %" PRId64 " %c %c", s->round, s->restarts,
             s->status, s->cause);
}

static int state_parse(struct state *s, const char *v)
{
    char st, cause = '-';
    long long a, b;
    int n = sscanf(v, "%lld %lld %c %c", &a, &b, &st, &cause);
    if (n < 3 || a < 0 || b < 0 || (st != 'r' && st != 'd' && st != 'f'))
        return -MG_EFORMAT;
    s->round = a;
    s->restarts = b;
    s->status = st;
    s->cause = cause;
    state_format(s);
    return 0;
}

/* Reads NS/state, creating "0 0 r" when the run is new. */
static int state_read(struct mg_rdzv *r, struct state *s)
{
    char k[KEY_MAX], *v = NULL;
    size_t len;
    int rc;

    key(r, k, "state");
    for (int i = 0; i < CAS_TRIES; i++) {
        rc = r->kv->ops->get(r->kv, k, &v, &len, &s->rev);
        if (rc == 0) {
            rc = state_parse(s, v);
            if (rc < 0)
                say(r,
                    "rendezvous key %s holds '%.40s', not a state: does another program use "
                    "this run id?",
                    k, v);
            free(v);
            return rc;
        }
        if (rc != -MG_ENOKEY)
            return kvfail(r, "reading the rendezvous state", rc);
        rc = r->kv->ops->cas(r->kv, k, NULL, 0, "0 0 r -", 7, 0, NULL, NULL);
        if (rc < 0)
            return kvfail(r, "creating the rendezvous state", rc);
    }
    say(r, "cannot read or create %s", k);
    return -EAGAIN;
}

/* Moves the state from *from to *to. 1 when this call did it, 0 when the
 * state had already changed (then *from holds the new one). */
static int state_cas(struct mg_rdzv *r, struct state *from, struct state *to)
{
    char k[KEY_MAX], *cur = NULL;
    size_t len;
    int rc;

    key(r, k, "state");
    state_format(to);
    rc = r->kv->ops->cas(r->kv, k, from->raw, strlen(from->raw), to->raw, strlen(to->raw), 0, &cur,
                         &len);
    if (rc < 0)
        return kvfail(r, "updating the rendezvous state", rc);
    if (rc == 0) {
        if (!cur || state_parse(from, cur) < 0) {
            free(cur);
            rc = state_read(r, from);
            return rc < 0 ? rc : 0;
        }
    }
    free(cur);
    return rc;
}

/* ---- failure records ----------------------------------------------------------- */

static int fail_format(const struct mg_rdzv_failure *f, char *buf, size_t len)
{
    return snprintf(buf, len,
                    "rank=%d local_rank=%d exit=%d signal=%d pid=%ld time=%.3f host=%s\n%s",
                    f->rank, f->local_rank, f->exit_code, f->signal, f->pid, f->time,
                    f->host[0] ? f->host : "?", f->message);
}

static int fail_parse(const char *v, struct mg_rdzv_failure *f)
{
    char host[MG_HOST_MAX];
    memset(f, 0, sizeof(*f));
    if (sscanf(v, "rank=%d local_rank=%d exit=%d signal=%d pid=%ld time=%lf host=%255s", &f->rank,
               &f->local_rank, &f->exit_code, &f->signal, &f->pid, &f->time, host) != 7)
        return -MG_EFORMAT;
    snprintf(f->host, sizeof(f->host), "%s", host);
    const char *nl = strchr(v, '\n');
    if (nl)
        snprintf(f->message, sizeof(f->message), "%s", nl + 1);
    return 0;
}

static void load_fail(struct mg_rdzv *r)
{
    char k[KEY_MAX], *v = NULL;
    size_t len;
    key(r, k, "fail");
    r->have_fail = 0;
    if (r->kv->ops->get(r->kv, k, &v, &len, NULL) == 0) {
        r->have_fail = fail_parse(v, &r->fail) == 0;
        free(v);
    }
}

static void say_failed(struct mg_rdzv *r)
{
    load_fail(r);
    if (r->have_fail) {
        const struct mg_rdzv_failure *f = &r->fail;
        if (f->rank < 0)
            say(r, "the job failed on %s: %s", f->host, f->message);
        else
            say(r, "the job failed: rank %d (local rank %d) on %s exited with code %d%s%s", f->rank,
                f->local_rank, f->host, f->exit_code, f->message[0] ? ": " : "", f->message);
    } else {
        say(r, "the job failed on another node");
    }
}

/* Records the root cause (the first one wins) and marks the job failed. */
static int mark_failed(struct mg_rdzv *r, struct state *st, const struct mg_rdzv_failure *f)
{
    char k[KEY_MAX], rec[1024];
    int n = fail_format(f, rec, sizeof(rec));
    if (n < 0 || (size_t)n >= sizeof(rec))
        n = (int)strlen(rec);
    key(r, k, "fail");
    int rc = r->kv->ops->cas(r->kv, k, NULL, 0, rec, (size_t)n, 0, NULL, NULL);
    if (rc < 0)
        return kvfail(r, "recording the failure", rc);
    for (int i = 0; i < CAS_TRIES && st->status == 'r'; i++) {
        struct state to = *st;
        to.status = 'f';
        rc = state_cas(r, st, &to);
        if (rc < 0)
            return rc;
        if (rc == 1)
            break;
    }
    say_failed(r);
    return 0;
}

/* ---- setup ----------------------------------------------------------------------- */

static void make_id(struct mg_rdzv *r)
{
    char h[65];
    size_t n = 0;
    unsigned rnd = 0;

    /* Host names become part of keys: keep them to a safe alphabet. */
    for (const char *p = r->host; *p && n < sizeof(h) - 1; p++)
        h[n++] = (char)((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                                (*p >= '0' && *p <= '9') || *p == '.' || *p == '-'
                            ? *p
                            : '_');
    h[n] = 0;
    if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != (ssize_t)sizeof(rnd))
        rnd = (unsigned)mg_now_us() ^ (unsigned)getpid() * 2654435761u;
    snprintf(r->id, sizeof(r->id), "%s-%d-%08x", n ? h : "node", (int)getpid(), rnd);
}

int mg_rdzv_new(struct mg_rdzv **out, const struct mg_rdzv_opts *o, char *err, size_t errlen)
{
    struct mg_rdzv *r;

    *out = NULL;
    if (!o->kv || !o->ns || !o->conf || o->min_nodes < 1 || o->max_nodes < o->min_nodes ||
        o->max_nodes > MG_RDZV_MAX_NODES || o->nproc < 1 || o->node_rank >= o->max_nodes ||
        strlen(o->ns) >= KEY_MAX / 2) {
        snprintf(err, errlen, "rendezvous: invalid settings");
        return -EINVAL;
    }
    r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    r->kv = o->kv;
    snprintf(r->ns, sizeof(r->ns), "%s", o->ns);
    r->min = o->min_nodes;
    r->max = o->max_nodes;
    r->fixed = o->node_rank;
    r->nproc = o->nproc;
    r->max_restarts = o->max_restarts;
    r->conf = *o->conf;
    snprintf(r->host, sizeof(r->host), "%s", o->hostname && *o->hostname ? o->hostname : "node");
    snprintf(r->addr, sizeof(r->addr), "%s",
             o->advertise && *o->advertise ? o->advertise : r->host);
    r->prev_rank = -1;
    r->listen_fd = -1;
    r->round = -1;
    make_id(r);
    *out = r;
    return 0;
}

void mg_rdzv_release(struct mg_rdzv *r)
{
    if (!r)
        return;
    if (r->listen_fd >= 0)
        close(r->listen_fd);
    if (r->kv)
        r->kv->ops->release(r->kv);
    free(r->members);
    free(r);
}

/* A free port for MASTER_PORT, held until the workers start. */
static int reserve_port(struct mg_rdzv *r)
{
    if (r->listen_fd >= 0)
        return 0;
    int fd = mg_listen_tcp(NULL, 0, 16, &r->port);
    if (fd < 0) {
        say(r, "cannot reserve a port for MASTER_PORT: %s", mg_strerror(fd));
        return fd;
    }
    r->listen_fd = fd;
    return 0;
}

static int publish_alive(struct mg_rdzv *r)
{
    char k[KEY_MAX], v[1024];
    struct mg_rdzv_desc d;
    my_desc(r, &d);
    int n = mg_rdzv_desc_format(&d, v, sizeof(v));
    if (n < 0)
        return n;
    key(r, k, "a/%s", r->id);
    int rc = r->kv->ops->set(r->kv, k, v, (size_t)n, MG_KV_EPHEMERAL);
    return rc < 0 ? kvfail(r, "announcing this node", rc) : 0;
}

/* ---- forming a round -------------------------------------------------------------- */

/* Keeps this agent's lease alive while it waits (joining, in the barrier). */
static int heartbeat_due(struct mg_rdzv *r)
{
    int64_t now = mg_now_ms();
    if (now < r->next_tick)
        return 0;
    r->next_tick = now + r->conf.heartbeat_interval_ms;
    int rc = r->kv->ops->keepalive(r->kv);
    if (rc == -EKEYEXPIRED)
        return publish_alive(r); /* dropped while waiting: announce again */
    return rc < 0 ? kvfail(r, "heartbeat", rc) : 0;
}

static int64_t earlier(int64_t a, int64_t b)
{
    return a < 0 ? b : b < 0 ? a : a < b ? a : b;
}

/* Parses a close record into members; 0, or -MG_EFORMAT. */
static int close_parse(const char *v, int64_t *restarts, struct mg_rdzv_desc **out, int *n)
{
    long long round, k;
    int nn, world;
    const char *p;

    if (sscanf(v, "round=%lld restarts=%lld nnodes=%d world=%d", &round, &k, &nn, &world) != 4 ||
        nn < 1 || nn > MG_RDZV_MAX_NODES)
        return -MG_EFORMAT;
    struct mg_rdzv_desc *d = calloc((size_t)nn, sizeof(*d));
    if (!d)
        return -ENOMEM;
    p = strchr(v, '\n');
    for (int i = 0; i < nn; i++) {
        if (!p || mg_rdzv_desc_parse(p + 1, &d[i]) < 0) {
            free(d);
            return -MG_EFORMAT;
        }
        p = strchr(p + 1, '\n');
    }
    *restarts = k;
    *out = d;
    *n = nn;
    return 0;
}

static int find_member(const struct mg_rdzv_desc *m, int n, const char *id)
{
    for (int i = 0; i < n; i++)
        if (strcmp(m[i].id, id) == 0)
            return i;
    return -1;
}

static int in_list(const struct mg_kv_entry *e, int n, size_t skip, const char *id)
{
    for (int i = 0; i < n; i++)
        if (strlen(e[i].key) > skip && strcmp(e[i].key + skip, id) == 0)
            return 1;
    return 0;
}

/* Lists NS/a/ (keys only): the live agents. */
static int list_alive(struct mg_rdzv *r, struct mg_kv_entry **e, int *n, size_t *skip)
{
    char k[KEY_MAX];
    key(r, k, "a/");
    *skip = strlen(k);
    int rc = r->kv->ops->list(r->kv, k, MG_RDZV_MAX_NODES, 0, e, n);
    return rc < 0 ? kvfail(r, "listing the live nodes", rc) : 0;
}

/* Deletes what is left of an old round (best effort). */
static void forget_round(struct mg_rdzv *r, int64_t round)
{
    char k[KEY_MAX];
    struct mg_kv_entry *e = NULL;
    int n = 0;
    key(r, k, "r/%" PRId64 "/", round);
    if (r->kv->ops->list(r->kv, k, MG_RDZV_MAX_NODES * 2 + 8, 0, &e, &n) < 0)
        return;
    for (int i = 0; i < n; i++)
        r->kv->ops->del(r->kv, e[i].key);
    mg_kv_free_list(e, n);
}

static int read_close(struct mg_rdzv *r, int64_t round, int64_t *restarts, struct mg_rdzv_desc **m,
                      int *n);

/* A round that follows a worker failure (cause f) decides whether the
 * restart counts: it does when every member of the failed round is back, and
 * not when one is gone (its death made the workers fail: a membership
 * change). Past --max_restarts the job fails with the recorded root cause.
 * Returns 1 to go on closing (st updated), 0 when the state moved on, < 0. */
static int count_restart(struct mg_rdzv *r, int64_t round, struct state *st,
                         const struct mg_rdzv_desc *d, int nd)
{
    struct mg_rdzv_desc *prev = NULL;
    int64_t k_prev;
    int np = 0, all, rc;

    if (st->cause != 'f' || round == 0)
        return 1;
    rc = read_close(r, round - 1, &k_prev, &prev, &np);
    if (rc < 0)
        return rc;
    all = 1;
    for (int i = 0; i < np && all; i++)
        all = find_member(d, nd, prev[i].id) >= 0;
    free(prev);
    struct state to = *st;
    to.restarts += all;
    to.cause = all ? 'c' : 'm';
    if (to.restarts > r->max_restarts) {
        struct mg_rdzv_failure f;
        char k[KEY_MAX], *v = NULL;
        size_t len;
        key(r, k, "r/%" PRId64 "/failure", round - 1);
        if (r->kv->ops->get(r->kv, k, &v, &len, NULL) != 0 || fail_parse(v, &f) < 0) {
            memset(&f, 0, sizeof(f));
            f.rank = f.local_rank = -1;
            f.exit_code = 1;
            snprintf(f.host, sizeof(f.host), "?");
            snprintf(f.message, sizeof(f.message), "a worker failed and no restarts are left");
        }
        free(v);
        rc = mark_failed(r, st, &f);
        return rc < 0 ? rc : -MG_EPEER;
    }
    rc = state_cas(r, st, &to);
    if (rc != 1)
        return rc;
    *st = to;
    return 1;
}

/* Closes round R with the live agents that joined it, if there are enough.
 * Returns 0 (closed by us or someone else, or not closable yet), or < 0. */
static int try_close(struct mg_rdzv *r, int64_t round, struct state *st)
{
    char k[KEY_MAX];
    struct mg_kv_entry *joined = NULL, *alive = NULL;
    struct mg_rdzv_desc *d = NULL;
    int nj = 0, na = 0, nd = 0, rc;
    size_t askip, jskip;
    char *rec = NULL;

    key(r, k, "r/%" PRId64 "/j/", round);
    jskip = strlen(k);
    rc = r->kv->ops->list(r->kv, k, MG_RDZV_MAX_NODES, 1, &joined, &nj);
    if (rc < 0) {
        rc = kvfail(r, "listing the joined nodes", rc);
        goto out;
    }
    rc = list_alive(r, &alive, &na, &askip);
    if (rc < 0)
        goto out;
    d = calloc((size_t)(nj ? nj : 1), sizeof(*d));
    if (!d) {
        rc = -ENOMEM;
        goto out;
    }
    for (int i = 0; i < nj; i++) {
        if (!in_list(alive, na, askip, joined[i].key + jskip))
            continue; /* joined, then died */
        if (!joined[i].val || mg_rdzv_desc_parse(joined[i].val, &d[nd]) < 0)
            continue;
        nd++;
    }
    if (nd < r->min) {
        rc = 0;
        goto out;
    }
    mg_rdzv_rank_order(d, nd);
    if (nd > r->max)
        nd = r->max; /* the rest wait for a later round */
    rc = count_restart(r, round, st, d, nd);
    if (rc != 1)
        goto out; /* the job failed, or the state moved on */
    if (r->fixed >= 0) {
        /* static: every rank 0..N-1 exactly once */
        for (int i = 0; i < nd; i++) {
            if (d[i].fixed != i) {
                struct mg_rdzv_failure f = {.rank = -1, .local_rank = -1, .exit_code = 1};
                snprintf(f.host, sizeof(f.host), "%s", d[i].host);
                if (i > 0 && d[i].fixed == d[i - 1].fixed)
                    snprintf(f.message, sizeof(f.message),
                             "--node_rank %d given to two nodes: %.200s and %.200s", d[i].fixed,
                             d[i - 1].host, d[i].host);
                else
                    snprintf(f.message, sizeof(f.message),
                             "no node has --node_rank %d (of --nnodes %d)", i, r->max);
                rc = mark_failed(r, st, &f);
                if (rc == 0)
                    rc = -MG_EPEER;
                goto out;
            }
        }
    }
    {
        size_t cap = 128 + (size_t)nd * 1024, off;
        int world = 0;
        rec = malloc(cap);
        if (!rec) {
            rc = -ENOMEM;
            goto out;
        }
        for (int i = 0; i < nd; i++)
            world += d[i].nproc;
        off =
            (size_t)snprintf(rec, cap, "round=%" PRId64 " restarts=%" PRId64 " nnodes=%d world=%d",
                             round, st->restarts, nd, world);
        for (int i = 0; i < nd && off < cap; i++) {
            rec[off++] = '\n';
            int w = mg_rdzv_desc_format(&d[i], rec + off, cap - off);
            if (w < 0) {
                rc = w;
                goto out;
            }
            off += (size_t)w;
        }
        if (off >= CLOSE_MAX_BYTES) {
            say(r, "round %" PRId64 ": the membership record is too large", round);
            rc = -MG_ETOOBIG;
            goto out;
        }
        key(r, k, "r/%" PRId64 "/close", round);
        rc = r->kv->ops->cas(r->kv, k, NULL, 0, rec, off, 0, NULL, NULL);
        if (rc < 0) {
            rc = kvfail(r, "closing the round", rc);
            goto out;
        }
        if (rc == 1 && round >= 2)
            forget_round(r, round - 2);
        rc = 0;
    }
out:
    free(rec);
    free(d);
    mg_kv_free_list(joined, nj);
    mg_kv_free_list(alive, na);
    return rc;
}

static void take_round(struct mg_rdzv *r, int64_t round, int64_t restarts, struct mg_rdzv_desc *m,
                       int n, int me, struct mg_rdzv_world *w)
{
    memset(w, 0, sizeof(*w));
    w->round = (int)round;
    w->restart_count = (int)restarts;
    w->node_rank = me;
    w->nnodes = n;
    for (int i = 0; i < n; i++) {
        if (i < me)
            w->rank_base += m[i].nproc;
        w->world_size += m[i].nproc;
    }
    snprintf(w->master_addr, sizeof(w->master_addr), "%s", m[0].addr);
    w->master_port = m[0].port;
    w->master_fd = -1;
    if (me == 0) {
        w->master_fd = r->listen_fd;
    } else if (r->listen_fd >= 0) {
        close(r->listen_fd);
    }
    r->listen_fd = -1;
    free(r->members);
    r->members = m;
    r->nmembers = n;
    r->round = round;
    r->restarts = restarts;
    r->prev_rank = me;
    r->formed = 1;
    r->last_ok = mg_now_ms();
    r->next_tick = r->last_ok + r->conf.heartbeat_interval_ms;
}

/* Reads NS/r/R/close. 1 and the members when it exists, 0 when not. */
static int read_close(struct mg_rdzv *r, int64_t round, int64_t *restarts, struct mg_rdzv_desc **m,
                      int *n)
{
    char k[KEY_MAX], *v = NULL;
    size_t len;
    key(r, k, "r/%" PRId64 "/close", round);
    int rc = r->kv->ops->get(r->kv, k, &v, &len, NULL);
    if (rc == -MG_ENOKEY)
        return 0;
    if (rc < 0)
        return kvfail(r, "reading the round", rc);
    rc = close_parse(v, restarts, m, n);
    free(v);
    if (rc < 0) {
        say(r, "round %" PRId64 ": malformed membership record", round);
        return rc;
    }
    return 1;
}

static int64_t get_count(struct mg_rdzv *r, int64_t round, int *rcp)
{
    char k[KEY_MAX], *v = NULL;
    size_t len;
    key(r, k, "r/%" PRId64 "/n", round);
    *rcp = r->kv->ops->get(r->kv, k, &v, &len, NULL);
    if (*rcp == -MG_ENOKEY) {
        *rcp = 0;
        return 0;
    }
    if (*rcp < 0) {
        kvfail(r, "reading the join count", *rcp);
        return 0;
    }
    int64_t c = strtoll(v, NULL, 10);
    free(v);
    return c;
}

static int slice_ms(int64_t deadline, int64_t other, int max_block)
{
    int64_t now = mg_now_ms(), t = max_block < MG_RDZV_SLICE_MS ? max_block : MG_RDZV_SLICE_MS;
    if (deadline - now < t)
        t = deadline - now;
    if (other >= 0 && other - now < t)
        t = other - now;
    return t < 0 ? 0 : (int)t;
}

/* The end of a step that found nothing to do: waits, at most max_block ms
 * and not past the step's deadlines, for key to change after since_rev
 * (0: to exist), and notes when the next step is due without a change. */
static int wait_change(struct mg_rdzv *r, const char *k, int64_t since_rev, int64_t deadline,
                       int64_t other, int max_block, const char *what)
{
    r->wake_at = earlier(deadline, other);
    int rc = r->kv->ops->wait(r->kv, k, since_rev, slice_ms(deadline, other, max_block));
    if (rc < 0)
        return kvfail(r, what, rc);
    if (rc == 1)
        r->wake_at = mg_now_ms(); /* changed already: step again at once */
    return 0;
}

/* Member "dead" of the last formed round died and fewer than MIN agents are
 * left: the job cannot go on. Records that as the root cause. */
static void below_min(struct mg_rdzv *r, struct state *st, int dead, int na)
{
    const struct mg_rdzv_desc *m = &r->members[dead];
    struct mg_rdzv_failure f = {.rank = -1, .local_rank = -1, .exit_code = 1};
    snprintf(f.host, sizeof(f.host), "%s", m->host);
    snprintf(f.message, sizeof(f.message),
             "node %s (rank %d, %s) stopped sending heartbeats; %d node(s) left, fewer than "
             "the minimum %d of --nnodes",
             m->host, dead, m->id, na, r->min);
    mark_failed(r, st, &f);
}

/* One pass of the wait for round R, after joining it. Returns 1 formed (*w
 * filled), STEP_AGAIN when the round went on without us or the state moved
 * (start over), STEP_WAITED after waiting up to max_block ms, < 0 error. */
#define STEP_WAITED 0
#define STEP_AGAIN  2

static int round_iter(struct mg_rdzv *r, struct mg_rdzv_world *w, int max_block)
{
    char k[KEY_MAX];
    struct mg_rdzv_desc *m = NULL;
    struct state st;
    int64_t restarts, round = r->jround;
    int rc, n;

    rc = read_close(r, round, &restarts, &m, &n);
    if (rc < 0)
        return rc;
    if (rc == 1) {
        int me = find_member(m, n, r->id);
        if (me < 0) {
            free(m);
            return STEP_AGAIN;
        }
        take_round(r, round, restarts, m, n, me, w);
        return 1;
    }
    rc = state_read(r, &st);
    if (rc < 0)
        return rc;
    if (st.round != round || st.status != 'r')
        return STEP_AGAIN;
    if (mg_now_ms() >= r->jdeadline) {
        int got;
        int64_t c = get_count(r, round, &got);
        say(r,
            "round %" PRId64 " did not form within join_timeout (%gs): %" PRId64
            " node(s) joined, --nnodes needs at least %d",
            round, r->conf.join_timeout_ms / 1000.0, c, r->min);
        return -ETIMEDOUT;
    }

    int64_t c = get_count(r, round, &rc);
    if (rc < 0)
        return rc;
    r->jcount = c;
    if (c < r->min && round > 0 && r->nmembers > 0) {
        /* A re-formation that cannot reach MIN because a member died: fail
         * now rather than at join_timeout (a replacement would be a new job). */
        struct mg_kv_entry *alive = NULL;
        int na = 0, dead = -1;
        size_t skip;
        rc = list_alive(r, &alive, &na, &skip);
        if (rc < 0)
            return rc;
        for (int i = 0; i < r->nmembers && dead < 0; i++)
            if (!in_list(alive, na, skip, r->members[i].id))
                dead = i;
        mg_kv_free_list(alive, na);
        if (dead >= 0 && na < r->min) {
            below_min(r, &st, dead, na); /* mark_failed says why */
            return -MG_EPEER;
        }
    }
    int close_now = c >= r->max;
    if (!close_now && c >= r->min) {
        int64_t now = mg_now_ms();
        if (r->last_call < 0)
            r->last_call = now + r->conf.last_call_timeout_ms;
        if (now >= r->last_call)
            close_now = 1;
        if (!close_now && round > 0) {
            /* A re-formation: no need to wait once every live agent joined. */
            struct mg_kv_entry *alive = NULL;
            int na = 0;
            size_t skip;
            rc = list_alive(r, &alive, &na, &skip);
            mg_kv_free_list(alive, na);
            if (rc < 0)
                return rc;
            close_now = c >= na;
        }
    }
    if (close_now) {
        rc = try_close(r, round, &st);
        if (rc < 0)
            return rc;
        rc = read_close(r, round, &restarts, &m, &n);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            free(m);
            return STEP_AGAIN_SAME; /* formed: the next pass takes it */
        }
        /* Not enough live joiners: give the last call another period. */
        r->last_call = mg_now_ms() + r->conf.last_call_timeout_ms;
    }
    key(r, k, "r/%" PRId64 "/close", round);
    rc = wait_change(r, k, 0, r->jdeadline, earlier(r->last_call, r->next_tick), max_block,
                     "waiting for the round to form");
    return rc < 0 ? rc : STEP_WAITED;
}

/* One pass of the outer join loop: find the open round and join it, or wait
 * as a spare, or ask for a new round. Same returns as round_iter. */
static int join_iter(struct mg_rdzv *r, struct mg_rdzv_world *w, int max_block)
{
    char k[KEY_MAX], v[1024];
    struct mg_rdzv_desc *m = NULL;
    struct state st;
    int64_t restarts, c;
    int rc, n;

    if (mg_now_ms() >= r->jdeadline) {
        say(r, "no round could take this node within join_timeout (%gs)",
            r->conf.join_timeout_ms / 1000.0);
        return -ETIMEDOUT;
    }
    rc = state_read(r, &st);
    if (rc < 0)
        return rc;
    if (st.status == 'd') {
        say(r,
            "the rendezvous of this run id already finished (round %" PRId64
            "); use a new --rdzv_id for a new job",
            st.round);
        return -MG_ECLOSED;
    }
    if (st.status == 'f') {
        say_failed(r);
        return -MG_EPEER;
    }
    rc = read_close(r, st.round, &restarts, &m, &n);
    if (rc < 0)
        return rc;
    if (rc == 1) {
        int me = find_member(m, n, r->id);
        if (me >= 0) {
            take_round(r, st.round, restarts, m, n, me, w);
            return 1;
        }
        free(m);
        if (n < r->max) {
            /* The round runs without us and has room: ask for a new one. */
            struct state to = st;
            to.round++;
            to.cause = 'j';
            rc = state_cas(r, &st, &to);
            return rc < 0 ? rc : STEP_AGAIN;
        }
        /* Full: wait as a spare for the next round. */
        key(r, k, "state");
        rc = wait_change(r, k, st.rev, r->jdeadline, r->next_tick, max_block,
                         "waiting for a place in the job");
        return rc < 0 ? rc : STEP_WAITED;
    }
    /* Round st.round is open: join it. */
    struct mg_rdzv_desc d;
    my_desc(r, &d);
    int len = mg_rdzv_desc_format(&d, v, sizeof(v));
    if (len < 0)
        return len;
    key(r, k, "r/%" PRId64 "/j/%s", st.round, r->id);
    rc = r->kv->ops->set(r->kv, k, v, (size_t)len, 0);
    if (rc < 0)
        return kvfail(r, "joining the round", rc);
    key(r, k, "r/%" PRId64 "/n", st.round);
    rc = r->kv->ops->add(r->kv, k, 1, &c);
    if (rc < 0)
        return kvfail(r, "joining the round", rc);
    r->jround = st.round;
    r->last_call = -1;
    r->jstate = J_ROUND;
    return STEP_AGAIN_SAME;
}

int mg_rdzv_join_begin(struct mg_rdzv *r)
{
    int rc;

    r->formed = 0;
    r->jstate = J_TOP;
    r->jcount = -1;
    r->jdeadline = mg_now_ms() + r->conf.join_timeout_ms;
    rc = reserve_port(r);
    if (rc < 0)
        return rc;
    return publish_alive(r);
}

void mg_rdzv_join_progress(const struct mg_rdzv *r, struct mg_rdzv_progress *p)
{
    p->round = r->jround;
    p->joined = r->jstate == J_TOP ? -1 : r->jcount;
    p->min = r->min;
    p->max = r->max;
    p->left_ms = mg_ms_until(r->jdeadline);
}

int mg_rdzv_join_step(struct mg_rdzv *r, struct mg_rdzv_world *w, int max_block_ms)
{
    for (;;) {
        int rc = heartbeat_due(r);
        if (rc < 0)
            return rc;
        rc = r->jstate == J_TOP ? join_iter(r, w, max_block_ms) : round_iter(r, w, max_block_ms);
        if (rc == STEP_AGAIN) {
            r->jstate = J_TOP;
            continue;
        }
        if (rc == STEP_AGAIN_SAME)
            continue;
        if (rc == 1)
            r->jstate = J_IDLE;
        return rc; /* 1 formed, 0 waited, < 0 error */
    }
}

/* ---- while the workers run ---------------------------------------------------- */

int mg_rdzv_timeout_ms(const struct mg_rdzv *r)
{
    if (!r->formed)
        return -1;
    return mg_ms_until(r->next_tick);
}

/* The state moved on while this node runs round r->round. */
static enum mg_rdzv_event state_moved(struct mg_rdzv *r, const struct state *st)
{
    if (st->status == 'f') {
        say_failed(r);
        r->formed = 0;
        return MG_RDZV_FAILED;
    }
    if (st->round != r->round) {
        if (st->restarts > r->restarts || st->cause == 'f') {
            r->reason = MG_RDZV_R_FAILURE;
            say(r, "a worker failed on another node (round %" PRId64 ")", st->round);
        } else if (st->cause == 'x') {
            r->reason = MG_RDZV_R_NODE_DIED;
            say(r, "a node stopped sending heartbeats (round %" PRId64 ")", st->round);
        } else {
            r->reason = MG_RDZV_R_NODE_JOINED;
            say(r, "a node is waiting to join (round %" PRId64 ")", st->round);
        }
        r->formed = 0;
        return MG_RDZV_RESTART;
    }
    if (st->status == 'd') {
        say(r, "every node finished");
        r->formed = 0;
        return MG_RDZV_DONE;
    }
    return MG_RDZV_NONE;
}

/* A backend error during the run: tolerated until heartbeat_timeout. */
static enum mg_rdzv_event run_error(struct mg_rdzv *r, int rc)
{
    if (rc == -EKEYEXPIRED) {
        r->reason = MG_RDZV_R_LEASE_LOST;
        say(r, "this node was declared dead (%s); rejoining", mg_kv_error(r->kv));
        r->formed = 0;
        return MG_RDZV_RESTART;
    }
    if (mg_now_ms() - r->last_ok >= r->conf.heartbeat_timeout_ms || rc == -MG_ECLOSED ||
        rc == -ECONNRESET || rc == -EPIPE) {
        char tmp[MG_RDZV_MSG_MAX];
        snprintf(tmp, sizeof(tmp), "%s", r->msg);
        say(r, "lost the rendezvous backend: %s", tmp);
        r->formed = 0;
        return MG_RDZV_FAILED;
    }
    return MG_RDZV_NONE;
}

enum mg_rdzv_event mg_rdzv_tick(struct mg_rdzv *r)
{
    struct mg_kv_entry *alive = NULL;
    struct state st;
    int na = 0, rc, dead = -1;
    size_t skip;

    if (!r->formed)
        return MG_RDZV_NONE;
    int64_t now = mg_now_ms();
    if (now < r->next_tick)
        return MG_RDZV_NONE;
    r->next_tick = now + r->conf.heartbeat_interval_ms;

    rc = r->kv->ops->keepalive(r->kv);
    if (rc < 0)
        return run_error(r, kvfail(r, "heartbeat", rc));
    rc = state_read(r, &st);
    if (rc < 0)
        return run_error(r, rc);
    enum mg_rdzv_event ev = state_moved(r, &st);
    if (ev != MG_RDZV_NONE)
        return ev;
    rc = list_alive(r, &alive, &na, &skip);
    if (rc < 0)
        return run_error(r, rc);
    r->last_ok = mg_now_ms();
    for (int i = 0; i < r->nmembers && dead < 0; i++)
        if (!in_list(alive, na, skip, r->members[i].id))
            dead = i;
    mg_kv_free_list(alive, na);
    if (dead < 0)
        return MG_RDZV_NONE;

    /* A member is gone. */
    r->reason = MG_RDZV_R_NODE_DIED;
    const struct mg_rdzv_desc *m = &r->members[dead];
    if (dead == find_member(r->members, r->nmembers, r->id)) {
        /* Our own key vanished: the backend dropped us. */
        return run_error(r, -EKEYEXPIRED);
    }
    if (na < r->min) {
        below_min(r, &st, dead, na);
        r->formed = 0;
        return MG_RDZV_FAILED;
    }
    struct state to = st;
    to.round++;
    to.cause = 'x';
    rc = state_cas(r, &st, &to);
    if (rc < 0)
        return run_error(r, rc);
    say(r, "node %s (rank %d) stopped sending heartbeats", m->host, dead);
    r->formed = 0;
    if (rc == 0) {
        /* Someone else moved the state first: follow it. */
        ev = state_moved(r, &st);
        if (ev == MG_RDZV_FAILED || ev == MG_RDZV_DONE)
            return ev;
        r->reason = MG_RDZV_R_NODE_DIED;
    }
    return MG_RDZV_RESTART;
}

enum mg_rdzv_event mg_rdzv_worker_failed(struct mg_rdzv *r, const struct mg_rdzv_failure *f)
{
    char k[KEY_MAX], rec[1024];
    struct state st;
    int rc = state_read(r, &st), n;

    if (rc < 0) {
        r->formed = 0;
        return MG_RDZV_FAILED;
    }
    /* This round's first failure: the root cause, should the job end on it. */
    n = fail_format(f, rec, sizeof(rec));
    if (n < 0 || (size_t)n >= sizeof(rec))
        n = (int)strlen(rec);
    key(r, k, "r/%" PRId64 "/failure", r->round);
    r->kv->ops->cas(r->kv, k, NULL, 0, rec, (size_t)n, 0, NULL, NULL);
    for (int i = 0; i < CAS_TRIES; i++) {
        if (st.status != 'r' || st.round != r->round) {
            /* Something else already restarted or ended the job. */
            enum mg_rdzv_event ev = state_moved(r, &st);
            return ev == MG_RDZV_NONE ? MG_RDZV_RESTART : ev;
        }
        /* Re-form first: the next round counts the restart when every node
         * comes back, and not when the workers failed because a node died. */
        struct state to = st;
        to.round++;
        to.cause = 'f';
        rc = state_cas(r, &st, &to);
        if (rc < 0) {
            r->formed = 0;
            return MG_RDZV_FAILED;
        }
        if (rc == 1) {
            r->reason = MG_RDZV_R_FAILURE;
            say(r, "a worker failed here (round %" PRId64 ")", r->round);
            r->formed = 0;
            return MG_RDZV_RESTART;
        }
    }
    r->formed = 0;
    return MG_RDZV_FAILED;
}

int mg_rdzv_finish_begin(struct mg_rdzv *r)
{
    char k[KEY_MAX];
    int rc;

    r->bdeadline = mg_now_ms() + r->conf.exit_barrier_timeout_ms;
    key(r, k, "r/%" PRId64 "/done/%s", r->round, r->id);
    rc = r->kv->ops->set(r->kv, k, "1", 1, 0);
    return rc < 0 ? kvfail(r, "announcing that this node finished", rc) : 0;
}

int mg_rdzv_finish_step(struct mg_rdzv *r, int max_block_ms)
{
    struct mg_kv_entry *alive = NULL, *done = NULL;
    int na = 0, nd = 0, waiting = 0, rc;
    size_t askip, dskip;
    struct state st;
    char k[KEY_MAX], first[MG_HOST_MAX] = "";
    int64_t round = r->round;

    rc = heartbeat_due(r);
    if (rc < 0)
        return rc;
    rc = state_read(r, &st);
    if (rc < 0)
        return rc;
    if (st.round != round || st.status != 'r') {
        enum mg_rdzv_event ev = state_moved(r, &st);
        if (ev != MG_RDZV_NONE)
            return ev;
    }
    rc = list_alive(r, &alive, &na, &askip);
    if (rc < 0)
        return rc;
    key(r, k, "r/%" PRId64 "/done/", round);
    dskip = strlen(k);
    rc = r->kv->ops->list(r->kv, k, MG_RDZV_MAX_NODES, 0, &done, &nd);
    if (rc < 0) {
        mg_kv_free_list(alive, na);
        return kvfail(r, "reading the exit barrier", rc);
    }
    for (int i = 0; i < r->nmembers; i++) {
        const char *id = r->members[i].id;
        /* A dead node is not waited for. */
        if (!in_list(done, nd, dskip, id) && in_list(alive, na, askip, id)) {
            if (!waiting++)
                snprintf(first, sizeof(first), "%s", r->members[i].host);
        }
    }
    mg_kv_free_list(alive, na);
    mg_kv_free_list(done, nd);
    if (!waiting) {
        struct state to = st;
        to.status = 'd';
        rc = state_cas(r, &st, &to);
        if (rc < 0)
            return rc;
        if (rc == 0 && (st.round != round || st.status != 'd')) {
            enum mg_rdzv_event ev = state_moved(r, &st);
            return ev != MG_RDZV_NONE ? (int)ev : MG_RDZV_NONE;
        }
        say(r, "every node finished");
        r->formed = 0;
        return MG_RDZV_DONE;
    }
    if (mg_now_ms() >= r->bdeadline) {
        say(r,
            "exit barrier: still waiting for %d node(s) (%s%s) after exit_barrier_timeout "
            "(%gs); leaving",
            waiting, first, waiting > 1 ? ", ..." : "", r->conf.exit_barrier_timeout_ms / 1000.0);
        r->formed = 0;
        return -ETIMEDOUT;
    }
    key(r, k, "state");
    rc = wait_change(r, k, st.rev, r->bdeadline, r->next_tick, max_block_ms,
                     "waiting in the exit barrier");
    return rc < 0 ? rc : MG_RDZV_NONE;
}

void mg_rdzv_leave(struct mg_rdzv *r)
{
    char k[KEY_MAX];
    key(r, k, "a/%s", r->id);
    r->kv->ops->del(r->kv, k);
    r->formed = 0;
}

int mg_rdzv_close_begin(struct mg_rdzv *r, int hosting, const char *why)
{
    struct state st;

    r->formed = 0;
    r->jstate = J_IDLE;
    if (!hosting) {
        mg_rdzv_leave(r);
        return 1;
    }
    r->cdeadline = mg_now_ms() + r->conf.close_timeout_ms;
    if (state_read(r, &st) < 0)
        return 1;
    if (st.status == 'r') {
        struct mg_rdzv_failure f = {.rank = -1, .local_rank = -1, .exit_code = 1};
        snprintf(f.host, sizeof(f.host), "%s", r->host);
        snprintf(f.message, sizeof(f.message), "the agent hosting the rendezvous store exited%s%s",
                 why && *why ? ": " : "", why ? why : "");
        char keep[MG_RDZV_MSG_MAX];
        snprintf(keep, sizeof(keep), "%s", r->msg);
        mark_failed(r, &st, &f);
        snprintf(r->msg, sizeof(r->msg), "%s", keep);
    }
    mg_rdzv_leave(r);
    return mg_rdzv_close_step(r);
}

int mg_rdzv_close_step(struct mg_rdzv *r)
{
    struct mg_kv_entry *alive = NULL;
    int na = 0;
    size_t skip;

    /* The store goes away with this process: let the others read the outcome. */
    if (mg_now_ms() >= r->cdeadline || list_alive(r, &alive, &na, &skip) < 0)
        return 1;
    mg_kv_free_list(alive, na);
    r->wake_at = r->cdeadline;
    return na == 0;
}

int mg_rdzv_wait_ms(const struct mg_rdzv *r)
{
    int t = mg_ms_until(r->wake_at);
    return t < 0 || t > MG_RDZV_SLICE_MS ? MG_RDZV_SLICE_MS : t;
}

enum mg_rdzv_reason mg_rdzv_last_reason(const struct mg_rdzv *r)
{
    return r->reason;
}

const char *mg_rdzv_message(const struct mg_rdzv *r)
{
    return r->msg;
}

int mg_rdzv_failure_info(const struct mg_rdzv *r, struct mg_rdzv_failure *f)
{
    if (!r->have_fail)
        return -MG_ENOKEY;
    *f = r->fail;
    return 0;
}
