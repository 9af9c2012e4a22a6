/* torch's TCPStore protocol for the agent store (see tcpstore.h). Requests
 * are parsed whole from a client's input before anything is done, so a
 * request cut by the network is simply waited for; replies queue in the
 * client's output and go out as the socket takes them. */
#include "tcpstore.h"
#include "mg_err.h"
#include "net.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define VALIDATE_MAGIC  0x3C85F7CEu
#define READ_PER_TURN   (256u << 10) /* per client per loop turn: the loop stays responsive */
#define REQUEST_SLACK   (1u << 20)   /* a request's key and lengths, beside its value */
#define PAUSE_OUTPUT    (1u << 20)   /* a client's unsent replies past which its requests wait */
#define ENTRY_COST      (sizeof(struct entry) + 32) /* a key's bookkeeping, with malloc's */
#define REPORT_EVERY_MS 1000

enum op {
    OP_VALIDATE,
    OP_SET,
    OP_COMPARE_SET,
    OP_GET,
    OP_ADD,
    OP_CHECK,
    OP_WAIT,
    OP_NUMKEYS,
    OP_DELETE,
    OP_APPEND,
    OP_MULTI_GET,
    OP_MULTI_SET,
    OP_CANCEL_WAIT,
    OP_PING,
    OP_UNSERVED, /* watch_key, the queue operations */
};

/* The query numbers of torch 1.13 to 2.1 (TCPStore.cpp QueryType)... */
static const enum op legacy_ops[] = {
    OP_SET,      OP_COMPARE_SET, OP_GET,    OP_ADD,       OP_CHECK,     OP_WAIT,        OP_NUMKEYS,
    OP_UNSERVED, OP_DELETE,      OP_APPEND, OP_MULTI_GET, OP_MULTI_SET, OP_CANCEL_WAIT,
};
/* ...and of later torch, which added VALIDATE in front and dropped WATCH_KEY
 * (TCPStoreBackend.hpp QueryType). */
static const enum op validated_ops[] = {
    OP_VALIDATE, OP_SET,    OP_COMPARE_SET, OP_GET,       OP_ADD,       OP_CHECK,       OP_WAIT,
    OP_NUMKEYS,  OP_DELETE, OP_APPEND,      OP_MULTI_GET, OP_MULTI_SET, OP_CANCEL_WAIT, OP_PING,
};

enum {
    CHECK_READY = 0,
    CHECK_NOT_READY = 1
};
enum {
    WAIT_STOP = 0,
    WAIT_CANCELED = 1
};

struct entry {
    struct entry *next;
    uint64_t hash;
    char *key;
    size_t klen;
    uint8_t *val;
    size_t vlen;
};

struct span {
    const uint8_t *p;
    size_t n;
};

struct client {
    int fd;
    int proto; /* 0 not known yet, 1 legacy, 2 validated */
    int dead;
    char peer[80]; /* host:port, for the agent's log */
    char why[200]; /* why it was refused, when it was */
    size_t wbytes; /* its parked wait's copied keys */
    int paused;    /* whole requests wait for replies to drain (serve) */
    uint8_t *in;
    size_t ilen, icap;
    uint8_t *out;
    size_t olen, ocap;
    struct span *wait; /* a parked WAIT's keys (copied), or NULL */
    int nwait;
};

struct mg_tcpstore {
    struct entry **tab;
    size_t nbuckets, nkeys, bytes;
    struct client **c;
    int nc, cap;
    int *owner; /* per pollfd: the client's index */
    int ocap;
    struct span *keys; /* a request's keys and values, while it is handled */
    struct span *vals;
    size_t kcap;
    struct mg_tcpstore_limits lim;
    size_t in_total;  /* every client's input and parked keys (lim.max_buffered) */
    size_t out_total; /* every client's unsent replies (lim.max_pending) */
    mg_tcpstore_report_fn report;
    void *report_ctx;
    int64_t reported_ms;
    long unreported;
};

void mg_tcpstore_limits_for(struct mg_tcpstore_limits *l, int world)
{
    size_t w = world < 1 ? 1 : world > (1 << 20) ? (1 << 20) : (size_t)world;
    l->max_value = 4u << 20;
    l->max_keys = 16384 + 256 * w;
    l->max_bytes = (32u << 20) + (128u << 10) * w;
    l->max_clients = (int)(64 + 8 * w < 65536 ? 64 + 8 * w : 65536);
    l->max_buffered = (32u << 20) + (32u << 10) * w;
    l->max_pending = (32u << 20) + (32u << 10) * w;
}

/* Marks the client to be dropped, keeping the first reason. */
__attribute__((format(printf, 2, 3))) static void refuse(struct client *c, const char *fmt, ...)
{
    c->dead = 1;
    if (c->why[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof(c->why), fmt, ap);
    va_end(ap);
}

/* One line for the agent's log, at most one a second: a stranger on the port
 * must not flood it. */
static void report(struct mg_tcpstore *t, const char *peer, const char *why)
{
    int64_t now = mg_now_ms();
    if (!t->report)
        return;
    if (t->reported_ms && now - t->reported_ms < REPORT_EVERY_MS) {
        t->unreported++;
        return;
    }
    char line[512], more[80] = "";
    if (t->unreported)
        snprintf(more, sizeof(more), " (and %ld more refused since the last such line)",
                 t->unreported);
    snprintf(line, sizeof(line),
             "agent store (torch's TCPStore protocol): refused %s: %s; connection closed "
             "(limits: docs/store-protocol.md#limits)%s",
             peer, why, more);
    t->reported_ms = now;
    t->unreported = 0;
    t->report(t->report_ctx, line);
}

/* ---- the keys ---------------------------------------------------------------------------- */

static uint64_t hash_of(const void *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ull;
    return h;
}

static struct entry **slot_of(struct mg_tcpstore *t, const void *k, size_t n, uint64_t h)
{
    struct entry **e = &t->tab[h % t->nbuckets];
    while (*e && !((*e)->hash == h && (*e)->klen == n && memcmp((*e)->key, k, n) == 0))
        e = &(*e)->next;
    return e;
}

static struct entry *lookup(struct mg_tcpstore *t, const void *k, size_t n)
{
    return *slot_of(t, k, n, hash_of(k, n));
}

static void grow_table(struct mg_tcpstore *t)
{
    size_t nb = t->nbuckets * 2;
    struct entry **tab = calloc(nb, sizeof(*tab));
    if (!tab)
        return; /* longer chains: still correct */
    for (size_t i = 0; i < t->nbuckets; i++)
        for (struct entry *e = t->tab[i], *next; e; e = next) {
            next = e->next;
            e->next = tab[e->hash % nb];
            tab[e->hash % nb] = e;
        }
    free(t->tab);
    t->tab = tab;
    t->nbuckets = nb;
}

/* Sets key to the concatenation of a and b (append passes the old value as
 * a). 0, or -ENOSPC / -ENOMEM with the client refused. */
static int put_key(struct mg_tcpstore *t, struct client *c, const void *k, size_t kn, const void *a,
                   size_t an, const void *b, size_t bn)
{
    uint64_t h = hash_of(k, kn);
    struct entry **s = slot_of(t, k, kn, h), *e = *s;
    size_t old = e ? e->vlen : 0, add = an + bn;
    if (add > t->lim.max_value) {
        refuse(c, "a value of %zu bytes, over the limit of %zu", add, t->lim.max_value);
        return -ENOSPC;
    }
    if (!e && t->nkeys >= t->lim.max_keys) {
        refuse(c, "a new key with %zu keys held, the limit", t->nkeys);
        return -ENOSPC;
    }
    if (t->bytes - old + add + (e ? 0 : kn + ENTRY_COST) > t->lim.max_bytes) {
        refuse(c, "storing %zu more bytes with %zu held: over the limit of %zu",
               add + (e ? 0 : kn + ENTRY_COST) - old, t->bytes, t->lim.max_bytes);
        return -ENOSPC;
    }
    uint8_t *v = malloc(add ? add : 1);
    if (!v) {
        refuse(c, "out of memory");
        return -ENOMEM;
    }
    if (an)
        memcpy(v, a, an);
    if (bn)
        memcpy(v + an, b, bn);
    if (!e) {
        if (!(e = calloc(1, sizeof(*e))) || !(e->key = malloc(kn ? kn : 1))) {
            free(e);
            free(v);
            refuse(c, "out of memory");
            return -ENOMEM;
        }
        memcpy(e->key, k, kn);
        e->klen = kn;
        e->hash = h;
        *s = e;
        t->nkeys++;
        t->bytes += kn + ENTRY_COST;
        if (t->nkeys > t->nbuckets * 2)
            grow_table(t);
    }
    t->bytes = t->bytes - e->vlen + add;
    free(e->val);
    e->val = v;
    e->vlen = add;
    return 0;
}

static int del_key(struct mg_tcpstore *t, const void *k, size_t n)
{
    struct entry **s = slot_of(t, k, n, hash_of(k, n)), *e = *s;
    if (!e)
        return 0;
    *s = e->next;
    t->nkeys--;
    t->bytes -= e->klen + ENTRY_COST + e->vlen;
    free(e->key);
    free(e->val);
    free(e);
    return 1;
}

void mg_tcpstore_clear(struct mg_tcpstore *t)
{
    for (size_t i = 0; i < t->nbuckets; i++)
        while (t->tab[i]) {
            struct entry *e = t->tab[i];
            t->tab[i] = e->next;
            free(e->key);
            free(e->val);
            free(e);
        }
    t->nkeys = t->bytes = 0;
}

/* ---- replies --------------------------------------------------------------------------- */

static void put(struct mg_tcpstore *t, struct client *c, const void *p, size_t n)
{
    /* Requests wait while replies are pending (serve), so a client that reads
     * holds at most a pause's worth and one request's replies (a value, or a
     * multi_get within max_pending); past that it is not reading at all. */
    size_t most = PAUSE_OUTPUT + t->lim.max_pending + t->lim.max_value + 4096;
    if (c->dead || n == 0) /* an empty value's p may be NULL */
        return;
    if (c->olen + n > most) {
        refuse(c, "replies of %zu bytes it does not read", c->olen + n);
        return;
    }
    if (c->olen + n > c->ocap) {
        size_t cap = c->ocap ? c->ocap : 4096;
        while (cap < c->olen + n)
            cap *= 2;
        uint8_t *o = realloc(c->out, cap < most ? cap : most);
        if (!o) {
            refuse(c, "out of memory");
            return;
        }
        c->out = o;
        c->ocap = cap < most ? cap : most;
    }
    memcpy(c->out + c->olen, p, n);
    c->olen += n;
    t->out_total += n;
}

static void put_u8(struct mg_tcpstore *t, struct client *c, uint8_t v)
{
    put(t, c, &v, 1);
}

static void put_u64(struct mg_tcpstore *t, struct client *c, uint64_t v)
{
    put(t, c, &v, 8); /* the native byte order, as TCPStore sends it */
}

static void put_bytes(struct mg_tcpstore *t, struct client *c, const void *p, size_t n)
{
    put_u64(t, c, n);
    put(t, c, p, n);
}

static void flush_out(struct mg_tcpstore *t, struct client *c)
{
    size_t off = 0;
    while (off < c->olen && !c->dead) {
        ssize_t w = send(c->fd, c->out + off, c->olen - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0)
            off += (size_t)w;
        else if (w < 0 && errno == EINTR)
            continue;
        else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        else
            c->dead = 1;
    }
    if (off == 0)
        return; /* nothing sent (c->out may still be NULL): memmove's arguments must not be */
    memmove(c->out, c->out + off, c->olen - off);
    c->olen -= off;
    t->out_total -= off;
}

/* ---- waits ------------------------------------------------------------------------------ */

static void end_wait(struct mg_tcpstore *t, struct client *c)
{
    for (int i = 0; i < c->nwait; i++)
        free((void *)c->wait[i].p);
    free(c->wait);
    c->wait = NULL;
    c->nwait = 0;
    t->in_total -= c->wbytes;
    c->wbytes = 0;
}

/* After a key appeared: every parked WAIT whose keys all exist now ends. */
static void wake(struct mg_tcpstore *t)
{
    for (int i = 0; i < t->nc; i++) {
        struct client *c = t->c[i];
        int all = c->wait != NULL;
        for (int k = 0; all && k < c->nwait; k++)
            all = lookup(t, c->wait[k].p, c->wait[k].n) != NULL;
        if (all) {
            end_wait(t, c);
            put_u8(t, c, WAIT_STOP);
        }
    }
}

/* ---- requests ---------------------------------------------------------------------------- */

struct cur {
    const uint8_t *p;
    size_t n, off;
    const char *over; /* what was over its bound, when rd_span says -1 */
    uint64_t over_len;
    size_t over_max;
};

/* 1: read; 0: more bytes needed; -1: over a bound (the client is dropped). */
static int rd(struct cur *c, void *v, size_t n)
{
    if (c->n - c->off < n)
        return 0;
    memcpy(v, c->p + c->off, n);
    c->off += n;
    return 1;
}

static int rd_span(struct cur *c, const char *what, size_t max, struct span *s)
{
    uint64_t len;
    int r = rd(c, &len, 8);
    if (r <= 0)
        return r;
    if (len > max) {
        c->over = what;
        c->over_len = len;
        c->over_max = max;
        return -1;
    }
    if (c->n - c->off < len)
        return 0;
    s->p = c->p + c->off;
    s->n = (size_t)len;
    c->off += (size_t)len;
    return 1;
}

static int room_for(struct mg_tcpstore *t, struct client *c, uint64_t n)
{
    if (n > MG_TCPSTORE_MAX_KEYS) {
        refuse(c, "a request naming %llu keys, over the limit of %d", (unsigned long long)n,
               MG_TCPSTORE_MAX_KEYS);
        return -1;
    }
    if (n <= t->kcap)
        return 1;
    struct span *k = realloc(t->keys, n * sizeof(*k)), *v;
    if (!k)
        goto oom;
    t->keys = k;
    if (!(v = realloc(t->vals, n * sizeof(*v))))
        goto oom;
    t->vals = v;
    t->kcap = n;
    return 1;
oom:
    refuse(c, "out of memory");
    return -1;
}

/* A read that is not whole yet returns 0 (wait for more bytes); one over a
 * bound refuses the client. */
#define NEED(expr)                                                                                 \
    do {                                                                                           \
        int r_ = (expr);                                                                           \
        if (r_ < 0 && in.over)                                                                     \
            refuse(c, "a %s of %llu bytes, over the limit of %zu", in.over,                        \
                   (unsigned long long)in.over_len, in.over_max);                                  \
        if (r_ <= 0)                                                                               \
            return r_;                                                                             \
    } while (0)

/* Handles one request if buf (len bytes of the client's input) holds a
 * whole one. Returns the bytes it took, 0 when more are needed, -1 to drop
 * the client. */
static long one_request(struct mg_tcpstore *t, struct client *c, const uint8_t *buf, size_t len)
{
    struct cur in = {buf, len, 0, NULL, 0, 0};
    uint8_t q;
    struct span k, a, b;
    uint64_t n;
    int64_t num;
    uint32_t u32;

    if (c->proto == 0) {
        /* Later torch opens with VALIDATE (0) and the magic; torch <= 2.1's first
         * query is never 0 followed by these bytes (a key length of 3.7 GB). */
        if (len < 5 && buf[0] == 0)
            return 0;
        u32 = 0;
        if (len >= 5)
            memcpy(&u32, buf + 1, sizeof(u32));
        c->proto = buf[0] == 0 && u32 == VALIDATE_MAGIC ? 2 : 1;
    }
    NEED(rd(&in, &q, 1));
    enum op op = OP_UNSERVED;
    if (c->proto == 1 && q < sizeof(legacy_ops) / sizeof(legacy_ops[0]))
        op = legacy_ops[q];
    else if (c->proto == 2 && q < sizeof(validated_ops) / sizeof(validated_ops[0]))
        op = validated_ops[q];

    switch (op) {
    case OP_VALIDATE:
        NEED(rd(&in, &u32, 4));
        if (u32 != VALIDATE_MAGIC) {
            refuse(c, "a VALIDATE without TCPStore's magic number");
            return -1;
        }
        break;
    case OP_PING:
        NEED(rd(&in, &u32, 4));
        put(t, c, &u32, 4);
        break;
    case OP_SET:
        NEED(rd_span(&in, "key", MG_TCPSTORE_MAX_KEY, &k));
        NEED(rd_span(&in, "value", t->lim.max_value, &a));
        if (put_key(t, c, k.p, k.n, a.p, a.n, NULL, 0))
            return -1;
        wake(t);
        break;
    case OP_APPEND: {
        NEED(rd_span(&in, "key", MG_TCPSTORE_MAX_KEY, &k));
        NEED(rd_span(&in, "value", t->lim.max_value, &a));
        struct entry *e = lookup(t, k.p, k.n);
        if (put_key(t, c, k.p, k.n, e ? e->val : NULL, e ? e->vlen : 0, a.p, a.n))
            return -1;
        wake(t);
        break;
    }
    case OP_COMPARE_SET: {
        NEED(rd_span(&in, "key", MG_TCPSTORE_MAX_KEY, &k));
        NEED(rd_span(&in, "value", t->lim.max_value, &a)); /* expected */
        NEED(rd_span(&in, "value", t->lim.max_value, &b)); /* desired */
        struct entry *e = lookup(t, k.p, k.n);
        if (!e && a.n == 0) { /* no key and nothing expected: create it */
            if (put_key(t, c, k.p, k.n, b.p, b.n, NULL, 0))
                return -1;
            put_bytes(t, c, b.p, b.n);
            wake(t);
        } else if (!e) {
            put_bytes(t, c, a.p, a.n); /* TCPStore's answer when the key is missing */
        } else {
            if (e->vlen == a.n && memcmp(e->val, a.p, a.n) == 0 &&
                put_key(t, c, k.p, k.n, b.p, b.n, NULL, 0))
                return -1;
            e = lookup(t, k.p, k.n);
            put_bytes(t, c, e->val, e->vlen);
        }
        break;
    }
    case OP_GET: {
        NEED(rd_span(&in, "key", MG_TCPSTORE_MAX_KEY, &k));
        struct entry *e = lookup(t, k.p, k.n);
        put_bytes(t, c, e ? e->val : NULL, e ? e->vlen : 0);
        break;
    }
    case OP_ADD: {
        NEED(rd_span(&in, "key", MG_TCPSTORE_MAX_KEY, &k));
        NEED(rd(&in, &num, 8));
        struct entry *e = lookup(t, k.p, k.n);
        if (e) {
            char digits[32];
            size_t dn = e->vlen < sizeof(digits) - 1 ? e->vlen : sizeof(digits) - 1;
            memcpy(digits, e->val, dn);
            digits[dn] = '\0';
            num += strtoll(digits, NULL, 10);
        }
        char text[32];
        int tn = mg_fmt(text, sizeof(text), "%lld", (long long)num);
        if (put_key(t, c, k.p, k.n, text, (size_t)tn, NULL, 0))
            return -1;
        put(t, c, &num, 8);
        wake(t);
        break;
    }
    case OP_CHECK:
    case OP_WAIT:
    case OP_MULTI_GET: {
        NEED(rd(&in, &n, 8));
        if (room_for(t, c, n) < 0)
            return -1;
        for (uint64_t i = 0; i < n; i++)
            NEED(rd_span(&in, "key", MG_TCPSTORE_MAX_KEY, &t->keys[i]));
        if (op == OP_MULTI_GET) {
            size_t sum = 0;
            for (uint64_t i = 0; i < n; i++) {
                struct entry *e = lookup(t, t->keys[i].p, t->keys[i].n);
                sum += 8 + (e ? e->vlen : 0);
            }
            if (sum > t->lim.max_pending) {
                refuse(c, "a multi_get of %zu bytes, over the limit of %zu", sum,
                       t->lim.max_pending);
                return -1;
            }
            for (uint64_t i = 0; i < n; i++) {
                struct entry *e = lookup(t, t->keys[i].p, t->keys[i].n);
                put_bytes(t, c, e ? e->val : NULL, e ? e->vlen : 0);
            }
            break;
        }
        int all = 1;
        for (uint64_t i = 0; all && i < n; i++)
            all = lookup(t, t->keys[i].p, t->keys[i].n) != NULL;
        if (op == OP_CHECK) {
            put_u8(t, c, all ? CHECK_READY : CHECK_NOT_READY);
        } else if (all) {
            put_u8(t, c, WAIT_STOP);
        } else { /* parked until the keys exist */
            end_wait(t, c);
            size_t need = n * sizeof(*c->wait);
            for (uint64_t i = 0; i < n; i++)
                need += t->keys[i].n;
            if (t->in_total + need > t->lim.max_buffered) {
                refuse(c,
                       "a wait for %zu bytes of keys, with %zu bytes buffered, over the limit "
                       "of %zu",
                       need, t->in_total, t->lim.max_buffered);
                return -1;
            }
            if (!(c->wait = calloc(n, sizeof(*c->wait)))) {
                refuse(c, "out of memory");
                return -1;
            }
            c->wbytes = need; /* end_wait gives it back, whatever was copied */
            t->in_total += need;
            for (uint64_t i = 0; i < n; i++) {
                void *p = malloc(t->keys[i].n ? t->keys[i].n : 1);
                if (!p) {
                    refuse(c, "out of memory");
                    return -1;
                }
                memcpy(p, t->keys[i].p, t->keys[i].n);
                c->wait[i] = (struct span){p, t->keys[i].n};
                c->nwait++;
            }
        }
        break;
    }
    case OP_CANCEL_WAIT:
        end_wait(t, c);
        put_u8(t, c, WAIT_CANCELED);
        break;
    case OP_NUMKEYS:
        num = (int64_t)t->nkeys;
        put(t, c, &num, 8);
        break;
    case OP_DELETE:
        NEED(rd_span(&in, "key", MG_TCPSTORE_MAX_KEY, &k));
        num = del_key(t, k.p, k.n);
        put(t, c, &num, 8);
        break;
    case OP_MULTI_SET:
        NEED(rd(&in, &n, 8));
        if (room_for(t, c, n) < 0)
            return -1;
        for (uint64_t i = 0; i < n; i++) {
            NEED(rd_span(&in, "key", MG_TCPSTORE_MAX_KEY, &t->keys[i]));
            NEED(rd_span(&in, "value", t->lim.max_value, &t->vals[i]));
        }
        for (uint64_t i = 0; i < n; i++)
            if (put_key(t, c, t->keys[i].p, t->keys[i].n, t->vals[i].p, t->vals[i].n, NULL, 0))
                return -1;
        wake(t);
        break;
    case OP_UNSERVED:
        refuse(c,
               "query type %u, which the agent store does not serve (watch_key and the queue "
               "operations are not)",
               q);
        return -1;
    }
    return (long)in.off;
}

/* ---- clients ---------------------------------------------------------------------------- */

static void drop(struct mg_tcpstore *t, int i)
{
    struct client *c = t->c[i];
    end_wait(t, c);
    t->in_total -= c->ilen;
    t->out_total -= c->olen;
    close(c->fd);
    free(c->in);
    free(c->out);
    free(c);
    t->c[i] = t->c[--t->nc];
}

static int append_input(struct mg_tcpstore *t, struct client *c, const void *p, size_t n)
{
    size_t most = t->lim.max_value + REQUEST_SLACK;
    if (c->ilen + n > most) {
        refuse(c, "a request of over %zu bytes, the limit (a value of at most %zu)", most,
               t->lim.max_value);
        return -1;
    }
    if (t->in_total + n > t->lim.max_buffered) {
        refuse(c, "%zu bytes of requests buffered from every client, the limit",
               t->lim.max_buffered);
        return -1;
    }
    if (c->ilen + n > c->icap) {
        size_t cap = c->icap ? c->icap : 4096;
        while (cap < c->ilen + n)
            cap *= 2;
        uint8_t *b = realloc(c->in, cap);
        if (!b) {
            refuse(c, "out of memory");
            return -1;
        }
        c->in = b;
        c->icap = cap;
    }
    memcpy(c->in + c->ilen, p, n);
    c->ilen += n;
    t->in_total += n;
    return 0;
}

/* Every whole request in the client's input, while replies are not piling
 * up: past PAUSE_OUTPUT for this client, or lim.max_pending for all, the
 * rest waits until replies go out (process serves it again). */
static void serve(struct mg_tcpstore *t, struct client *c)
{
    size_t off = 0;
    while (!c->dead && c->ilen > off && c->olen <= PAUSE_OUTPUT &&
           t->out_total <= t->lim.max_pending) {
        long k = one_request(t, c, c->in + off, c->ilen - off);
        if (k < 0)
            c->dead = 1;
        if (k <= 0)
            break;
        off += (size_t)k;
    }
    /* Stopped for the replies, not for want of bytes: the loop must come
     * back when they drain, though the socket may say nothing new. */
    c->paused =
        !c->dead && c->ilen > off && (c->olen > PAUSE_OUTPUT || t->out_total > t->lim.max_pending);
    if (off == 0)
        return;
    memmove(c->in, c->in + off, c->ilen - off);
    c->ilen -= off;
    t->in_total -= off;
}

static void peer_of(int fd, char *buf, size_t cap)
{
    struct sockaddr_storage sa;
    socklen_t sl = sizeof(sa);
    char host[NI_MAXHOST], port[NI_MAXSERV];
    if (getpeername(fd, (struct sockaddr *)&sa, &sl) < 0 ||
        (sa.ss_family != AF_INET && sa.ss_family != AF_INET6) ||
        getnameinfo((struct sockaddr *)&sa, sl, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0 ||
        mg_format_hostport(buf, cap, host, atoi(port)) < 0)
        snprintf(buf, cap, "a client");
}

int mg_tcpstore_adopt(void *vt, int fd, const void *bytes, size_t n)
{
    struct mg_tcpstore *t = vt;
    struct client *c = NULL;
    if (t->nc >= t->lim.max_clients) {
        char peer[80], why[96];
        peer_of(fd, peer, sizeof(peer));
        snprintf(why, sizeof(why), "%d connections open, the limit", t->nc);
        report(t, peer, why);
        /* A reset, not a FIN: torch's client takes an orderly close it did
         * not expect for a reason to wait, and only a reset fails it at once. */
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        close(fd);
        return -EMFILE;
    }
    if (!(c = calloc(1, sizeof(*c))))
        goto fail;
    if (t->nc == t->cap) {
        int cap = t->cap ? t->cap * 2 : 16;
        struct client **v = realloc(t->c, (size_t)cap * sizeof(*v));
        if (!v)
            goto fail;
        t->c = v;
        t->cap = cap;
    }
    c->fd = fd;
    fcntl(fd, F_SETFL, O_NONBLOCK);
    peer_of(fd, c->peer, sizeof(c->peer));
    t->c[t->nc++] = c;
    if (n && append_input(t, c, bytes, n) < 0) {
        /* a few bytes of handshake: only the buffered limit refuses them */
        report(t, c->peer, c->why);
        drop(t, t->nc - 1);
        return -ENOSPC;
    }
    serve(t, c);
    flush_out(t, c);
    return 0;
fail:
    free(c);
    close(fd);
    return -ENOMEM;
}

int mg_tcpstore_pollfds(void *vt, struct pollfd *fds, int max)
{
    struct mg_tcpstore *t = vt;
    if (t->nc > max)
        return -ENOSPC;
    if (t->nc > t->ocap) {
        int *o = realloc(t->owner, (size_t)t->nc * 2 * sizeof(*o));
        if (!o)
            return -ENOSPC;
        t->owner = o;
        t->ocap = t->nc * 2;
    }
    for (int i = 0; i < t->nc; i++) {
        fds[i] = (struct pollfd){.fd = t->c[i]->fd, .events = POLLIN};
        if (t->c[i]->olen || (t->c[i]->paused && t->c[i]->olen <= PAUSE_OUTPUT &&
                              t->out_total <= t->lim.max_pending))
            fds[i].events |= POLLOUT; /* POLLOUT alone: to serve a paused one */
        t->owner[i] = i;
    }
    return t->nc;
}

int mg_tcpstore_process(void *vt, const struct pollfd *fds, int n)
{
    struct mg_tcpstore *t = vt;
    uint8_t buf[65536];
    for (int i = 0; i < n && i < t->nc; i++) {
        struct client *c = t->c[t->owner[i]];
        if (!fds[i].revents || c->fd != fds[i].fd)
            continue;
        size_t got = 0;
        while (!c->dead && got < READ_PER_TURN) {
            ssize_t r = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
            if (r > 0) {
                got += (size_t)r;
                if (append_input(t, c, buf, (size_t)r) < 0)
                    break;
                continue;
            }
            if (r < 0 && errno == EINTR)
                continue;
            if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
                c->dead = 1;
            break;
        }
        serve(t, c);
    }
    /* Replies (also to clients a key written by another one woke), then
     * requests that waited for replies to drain, then the dead. */
    for (int i = 0; i < t->nc; i++)
        if (t->c[i]->olen)
            flush_out(t, t->c[i]);
    for (int i = 0; i < t->nc; i++)
        if (t->c[i]->ilen && !t->c[i]->dead) {
            serve(t, t->c[i]);
            flush_out(t, t->c[i]);
        }
    for (int i = t->nc - 1; i >= 0; i--)
        if (t->c[i]->dead) {
            if (t->c[i]->why[0])
                report(t, t->c[i]->peer, t->c[i]->why);
            drop(t, i);
        }
    return 0;
}

int mg_tcpstore_new(struct mg_tcpstore **out, const struct mg_tcpstore_limits *limits,
                    mg_tcpstore_report_fn report_fn, void *report_ctx)
{
    struct mg_tcpstore *t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    if (limits)
        t->lim = *limits;
    else
        mg_tcpstore_limits_for(&t->lim, 1);
    t->report = report_fn;
    t->report_ctx = report_ctx;
    t->nbuckets = 256;
    if (!(t->tab = calloc(t->nbuckets, sizeof(*t->tab)))) {
        free(t);
        return -ENOMEM;
    }
    *out = t;
    return 0;
}

void mg_tcpstore_release(struct mg_tcpstore *t)
{
    if (!t)
        return;
    while (t->nc)
        drop(t, t->nc - 1);
    mg_tcpstore_clear(t);
    free(t->tab);
    free(t->c);
    free(t->owner);
    free(t->keys);
    free(t->vals);
    free(t);
}

long mg_tcpstore_nkeys(const struct mg_tcpstore *t)
{
    return (long)t->nkeys;
}

int mg_tcpstore_nclients(const struct mg_tcpstore *t)
{
    return t->nc;
}
