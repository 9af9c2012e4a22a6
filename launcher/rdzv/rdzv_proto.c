/* The multi-node rendezvous protocol's records and the plumbing its phases
 * share: node descriptors, the state record, failure records, the live-agent
 * list, heartbeats and waiting for a change; creating and releasing the
 * rendezvous. rdzv_proto.h has the keys and the rules; forming a round is in
 * rdzv_round.c, watching it in rdzv_watch.c. */
#include "rdzv_internal.h"
#include "node_order.h"
#include "mg_err.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* ---- descriptors ------------------------------------------------------------ */

int mg_rdzv_desc_format(const struct mg_rdzv_desc *d, char *buf, size_t len)
{
    int n = snprintf(buf, len, "id=%s host=%s addr=%s port=%d nproc=%d prev=%d fixed=%d idx=%d",
                     d->id, d->host, d->addr, d->port, d->nproc, d->prev, d->fixed, d->idx);
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
    d->idx = -1; /* an agent from before idx= */
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
        else if (IS("idx"))
            rc = field_int(v, vn, -1, MG_NODE_INDEX_MAX, &d->idx);
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
    /* 2. the scheduler's index: placement, fixed for a node's life, so the
     * survivors of a round keep their relative order */
    if (x->idx != y->idx) {
        if (x->idx < 0 || y->idx < 0)
            return x->idx < 0 ? 1 : -1;
        return x->idx < y->idx ? -1 : 1;
    }
    /* 3. members of the previous round keep their relative order */
    if (x->prev != y->prev) {
        if (x->prev < 0 || y->prev < 0)
            return x->prev < 0 ? 1 : -1;
        return x->prev < y->prev ? -1 : 1;
    }
    /* 4. newcomers by host name in natural order (node2 before node10), then
     * agent id */
    int c = mg_rdzv_natcmp(x->host, y->host);
    return c ? c : strcmp(x->id, y->id);
}

void mg_rdzv_rank_order(struct mg_rdzv_desc *d, int n)
{
    qsort(d, (size_t)n, sizeof(*d), desc_cmp);
}

void rdzv_my_desc(const struct mg_rdzv *r, struct mg_rdzv_desc *d)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->id, sizeof(d->id), "%s", r->id);
    snprintf(d->host, sizeof(d->host), "%s", r->host);
    snprintf(d->addr, sizeof(d->addr), "%s", r->addr);
    d->port = r->port;
    d->nproc = r->nproc;
    d->prev = r->prev_rank;
    d->fixed = r->fixed;
    d->idx = r->idx;
}

/* ---- state --------------------------------------------------------------------- */

static void state_format(struct rdzv_state *s)
{
    snprintf(s->raw, sizeof(s->raw), "%" PRId64 " %" PRId64 " %c %c", s->round, s->restarts,
             s->status, s->cause);
}

static int state_parse(struct rdzv_state *s, const char *v)
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
int rdzv_state_read(struct mg_rdzv *r, struct rdzv_state *s)
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
int rdzv_state_cas(struct mg_rdzv *r, struct rdzv_state *from, struct rdzv_state *to)
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
            rc = rdzv_state_read(r, from);
            return rc < 0 ? rc : 0;
        }
    }
    free(cur);
    return rc;
}

/* ---- failure records ----------------------------------------------------------- */

int rdzv_fail_format(const struct mg_rdzv_failure *f, char *buf, size_t len)
{
    /* node= and ranks= come after host: an older parser reads the seven
     * fields it knows and skips the rest of the line */
    return snprintf(buf, len,
                    "rank=%d local_rank=%d exit=%d signal=%d pid=%ld time=%.3f host=%s node=%s "
                    "ranks=%d+%d\n%s",
                    f->rank, f->local_rank, f->exit_code, f->signal, f->pid, f->time,
                    f->host[0] ? f->host : "?", f->node[0] ? f->node : "?", f->first_rank,
                    f->nranks, f->message);
}

int rdzv_fail_parse(const char *v, struct mg_rdzv_failure *f)
{
    char host[MG_HOST_MAX];
    memset(f, 0, sizeof(*f));
    if (sscanf(v, "rank=%d local_rank=%d exit=%d signal=%d pid=%ld time=%lf host=%255s", &f->rank,
               &f->local_rank, &f->exit_code, &f->signal, &f->pid, &f->time, host) != 7)
        return -MG_EFORMAT;
    snprintf(f->host, sizeof(f->host), "%s", host);
    const char *nl = strchr(v, '\n'), *p = strstr(v, " node=");
    char node[MG_RDZV_ID_MAX];
    if (p && (!nl || p < nl) &&
        sscanf(p, " node=%127s ranks=%d+%d", node, &f->first_rank, &f->nranks) == 3 &&
        strcmp(node, "?") != 0)
        snprintf(f->node, sizeof(f->node), "%s", node);
    if (f->nranks < 0 || f->first_rank < 0)
        f->first_rank = f->nranks = 0;
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
        r->have_fail = rdzv_fail_parse(v, &r->fail) == 0;
        free(v);
    }
}

void rdzv_say_failed(struct mg_rdzv *r)
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
int rdzv_mark_failed(struct mg_rdzv *r, struct rdzv_state *st, const struct mg_rdzv_failure *f)
{
    char k[KEY_MAX], rec[1024];
    struct mg_rdzv_failure mine = *f;
    if (!mine.node[0]) /* a failure of this node's */
        snprintf(mine.node, sizeof(mine.node), "%s", r->id);
    int n = rdzv_fail_format(&mine, rec, sizeof(rec));
    if (n < 0 || (size_t)n >= sizeof(rec))
        n = (int)strlen(rec);
    key(r, k, "fail");
    int rc = r->kv->ops->cas(r->kv, k, NULL, 0, rec, (size_t)n, 0, NULL, NULL);
    if (rc < 0)
        return kvfail(r, "recording the failure", rc);
    for (int i = 0; i < CAS_TRIES && st->status == 'r'; i++) {
        struct rdzv_state to = *st;
        to.status = 'f';
        rc = rdzv_state_cas(r, st, &to);
        if (rc < 0)
            return rc;
        if (rc == 1)
            break;
    }
    rdzv_say_failed(r);
    return 0;
}

int rdzv_member_ranks(struct mg_rdzv *r, int i, int *n, char *buf, size_t cap)
{
    const struct mg_rdzv_desc *m;
    *n = 0;
    if (rdzv_member(r, i, &m) < 0) {
        snprintf(buf, cap, "ranks unknown");
        return -1;
    }
    /* the block's base, and the members before i in it */
    const struct rdzv_block *b = &r->mblk[i / r->mblock];
    int first = b->base;
    for (int k = 0; k < i % r->mblock; k++)
        first += b->d[k].nproc;
    *n = m->nproc;
    if (*n <= 1)
        snprintf(buf, cap, "rank %d", first);
    else
        snprintf(buf, cap, "ranks %d-%d", first, first + *n - 1);
    return first;
}

int mg_rdzv_failure_elsewhere(const struct mg_rdzv *r)
{
    return r->have_fail && r->fail.node[0] && strcmp(r->fail.node, r->id) != 0;
}

/* Member "dead" of the last formed round died and fewer than MIN agents are
 * left: the job cannot go on. Records that as the root cause. */
void rdzv_below_min(struct mg_rdzv *r, struct rdzv_state *st, int dead, int na)
{
    static const struct mg_rdzv_desc unknown = {.id = "?", .host = "?"};
    const struct mg_rdzv_desc *m;
    if (rdzv_member(r, dead, &m) < 0)
        m = &unknown; /* its block is gone: the failure is still recorded */
    struct mg_rdzv_failure f = {.rank = -1, .local_rank = -1, .exit_code = 1};
    char ranks[64];
    snprintf(f.host, sizeof(f.host), "%s", m->host);
    snprintf(f.node, sizeof(f.node), "%s", m->id);
    f.first_rank = rdzv_member_ranks(r, dead, &f.nranks, ranks, sizeof(ranks));
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    f.time = (double)ts.tv_sec + ts.tv_nsec / 1e9;
    mg_fmt(f.message, sizeof(f.message),
           "node %s (node rank %d: %s; %s) stopped sending heartbeats; %d node(s) left, fewer "
           "than the minimum %d of --nnodes",
           m->host, dead, ranks, m->id, na, r->min);
    rdzv_mark_failed(r, st, &f);
}

/* ---- set-up ----------------------------------------------------------------------- */

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

int64_t mg_rdzv_first_tick_ms(uint64_t rnd, int64_t interval_ms)
{
    if (interval_ms <= 1)
        return interval_ms > 0 ? interval_ms : 0;
    return 1 + (int64_t)(rnd % (uint64_t)interval_ms);
}

int64_t rdzv_first_tick(const struct mg_rdzv *r)
{
    uint64_t rnd;
    if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != (ssize_t)sizeof(rnd))
        rnd = (uint64_t)mg_now_us() * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)r;
    return mg_rdzv_first_tick_ms(rnd, r->conf.heartbeat_interval_ms);
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
    r->idx = o->has_sched_index && o->sched_index >= 0 ? o->sched_index : -1;
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
    rdzv_roster_free(r);
    free(r);
}

/* A free port for MASTER_PORT, held until the workers start. */
int rdzv_reserve_port(struct mg_rdzv *r)
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

int rdzv_publish_alive(struct mg_rdzv *r)
{
    char k[KEY_MAX], v[1024];
    struct mg_rdzv_desc d;
    rdzv_my_desc(r, &d);
    int n = mg_rdzv_desc_format(&d, v, sizeof(v));
    if (n < 0)
        return n;
    key(r, k, "a/%s", r->id);
    int rc = r->kv->ops->set(r->kv, k, v, (size_t)n, MG_KV_EPHEMERAL);
    if (rc < 0)
        return kvfail(r, "announcing this node", rc);
    /* that request renewed the lease: no heartbeat due before an interval */
    r->next_tick = mg_now_ms() + r->conf.heartbeat_interval_ms;
    return 0;
}

/* ---- membership and waiting --------------------------------------------------------- */

/* Keeps this agent's lease alive while it waits (joining, in the barrier). */
int rdzv_heartbeat_due(struct mg_rdzv *r)
{
    int64_t now = mg_now_ms();
    if (now < r->next_tick)
        return 0;
    r->next_tick = now + r->conf.heartbeat_interval_ms;
    int rc = r->kv->ops->keepalive(r->kv);
    if (rc == -EKEYEXPIRED)
        return rdzv_publish_alive(r); /* dropped while waiting: announce again */
    return rc < 0 ? kvfail(r, "heartbeat", rc) : 0;
}

int64_t rdzv_earlier(int64_t a, int64_t b)
{
    return a < 0 ? b : b < 0 ? a : a < b ? a : b;
}

int64_t rdzv_later(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

int rdzv_in_list(const struct mg_kv_entry *e, int n, size_t skip, const char *id)
{
    /* Lists are sorted (kv.h) and share the prefix: a binary search, since
     * the heartbeat and the close look up every member (thousands). */
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strlen(e[mid].key) >= skip ? strcmp(e[mid].key + skip, id) : -1;
        if (c == 0)
            return 1;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return 0;
}

/* Lists NS/a/ (keys only): the live agents. */
int rdzv_list_alive(struct mg_rdzv *r, struct mg_kv_entry **e, int *n, size_t *skip)
{
    char k[KEY_MAX];
    key(r, k, "a/");
    *skip = strlen(k);
    int rc = r->kv->ops->list(r->kv, k, MG_RDZV_MAX_NODES, 0, e, n);
    return rc < 0 ? kvfail(r, "listing the live nodes", rc) : 0;
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

/* The longest a wait stays parked on a store (see rdzv_wait_change). */
#define PARK_MAX_MS 30000

/* The end of a step that found nothing to do: waits, at most max_block ms
 * and not past the step's deadlines, for key to change after since_rev
 * (0: to exist), and notes when the next step is due without a change.
 * With a backend that parks waits (kv.h's watch), the request stays open on
 * its side until the step's deadlines, and the next step's wait takes it
 * up: a node waiting in slices of 100 ms then sends a request per heartbeat
 * rather than ten a second (thousands of waiting nodes made the store of a
 * 10,000-node round answer 100,000 requests a second). *val (optional)
 * receives the key's value on a change (NULL: absent, or not read). */
int rdzv_wait_change(struct mg_rdzv *r, const char *k, int64_t since_rev, int64_t deadline,
                     int64_t other, int max_block, const char *what, char **val, size_t *len)
{
    int rc, t = slice_ms(deadline, other, max_block);
    r->wake_at = rdzv_earlier(deadline, other);
    if (val)
        *val = NULL;
    if (r->kv->ops->watch && t > 0) {
        int64_t park = r->wake_at - mg_now_ms();
        if (park > PARK_MAX_MS)
            park = PARK_MAX_MS;
        char *v = NULL;
        size_t n = 0;
        rc = r->kv->ops->watch(r->kv, k, since_rev, t, park > t ? (int)park : t, &v, &n);
        if (rc == 1 && val) {
            *val = v;
            if (len)
                *len = n;
        } else {
            free(v);
        }
    } else {
        rc = r->kv->ops->wait(r->kv, k, since_rev, t);
    }
    if (rc < 0)
        return kvfail(r, what, rc);
    if (rc == 1)
        r->wake_at = mg_now_ms(); /* changed already: step again at once */
    return rc == 1;
}

/* ---- what the caller asks ------------------------------------------------------------- */

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

int mg_rdzv_take_note(struct mg_rdzv *r, char *buf, size_t len)
{
    if (!r->note[0])
        return 0;
    snprintf(buf, len, "%s", r->note);
    r->note[0] = '\0';
    return 1;
}

int64_t mg_rdzv_dropped_ms(const struct mg_rdzv *r)
{
    return r->dropped_ms;
}

int mg_rdzv_failure_info(const struct mg_rdzv *r, struct mg_rdzv_failure *f)
{
    if (!r->have_fail)
        return -MG_ENOKEY;
    *f = r->fail;
    return 0;
}
