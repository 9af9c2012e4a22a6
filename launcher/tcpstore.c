/* torch's TCPStore protocol for the agent store (see tcpstore.h). Requests
 * are parsed whole from a client's input before anything is done, so a
 * request cut by the network is simply waited for; replies queue in the
 * client's output and go out as the socket takes them. */
#include "tcpstore.h"
#include "mg_err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define VALIDATE_MAGIC 0x3C85F7CEu
#define READ_PER_TURN  (256u << 10) /* per client per loop turn: the loop stays responsive */
#define MAX_INPUT      (MG_TCPSTORE_MAX_VALUE + (1u << 20))
#define MAX_OUTPUT     (256u << 20)

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
};

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
 * a). 0, or -ENOSPC / -ENOMEM. */
static int put_key(struct mg_tcpstore *t, const void *k, size_t kn, const void *a, size_t an,
                   const void *b, size_t bn)
{
    uint64_t h = hash_of(k, kn);
    struct entry **s = slot_of(t, k, kn, h), *e = *s;
    size_t old = e ? e->vlen : 0, add = an + bn;
    if (an + bn > MG_TCPSTORE_MAX_VALUE ||
        t->bytes - old + add + (e ? 0 : kn) > MG_TCPSTORE_MAX_BYTES)
        return -ENOSPC;
    uint8_t *v = malloc(add ? add : 1);
    if (!v)
        return -ENOMEM;
    if (an)
        memcpy(v, a, an);
    if (bn)
        memcpy(v + an, b, bn);
    if (!e) {
        if (!(e = calloc(1, sizeof(*e))) || !(e->key = malloc(kn ? kn : 1))) {
            free(e);
            free(v);
            return -ENOMEM;
        }
        memcpy(e->key, k, kn);
        e->klen = kn;
        e->hash = h;
        *s = e;
        t->nkeys++;
        t->bytes += kn;
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
    t->bytes -= e->klen + e->vlen;
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

static void put(struct client *c, const void *p, size_t n)
{
    if (c->dead || n == 0) /* an empty value's p may be NULL */
        return;
    if (c->olen + n > c->ocap) {
        size_t cap = c->ocap ? c->ocap : 4096;
        while (cap < c->olen + n)
            cap *= 2;
        uint8_t *o = cap <= MAX_OUTPUT ? realloc(c->out, cap) : NULL;
        if (!o) {
            c->dead = 1; /* a client that does not read its replies */
            return;
        }
        c->out = o;
        c->ocap = cap;
    }
    memcpy(c->out + c->olen, p, n);
    c->olen += n;
}

static void put_u8(struct client *c, uint8_t v)
{
    put(c, &v, 1);
}

static void put_u64(struct client *c, uint64_t v)
{
    put(c, &v, 8); /* the native byte order, as TCPStore sends it */
}

static void put_bytes(struct client *c, const void *p, size_t n)
{
    put_u64(c, n);
    put(c, p, n);
}

static void flush_out(struct client *c)
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
}

/* ---- waits ------------------------------------------------------------------------------ */

static void end_wait(struct client *c)
{
    for (int i = 0; i < c->nwait; i++)
        free((void *)c->wait[i].p);
    free(c->wait);
    c->wait = NULL;
    c->nwait = 0;
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
            end_wait(c);
            put_u8(c, WAIT_STOP);
        }
    }
}

/* ---- requests ---------------------------------------------------------------------------- */

struct cur {
    const uint8_t *p;
    size_t n, off;
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

static int rd_span(struct cur *c, size_t max, struct span *s)
{
    uint64_t len;
    int r = rd(c, &len, 8);
    if (r <= 0)
        return r;
    if (len > max)
        return -1;
    if (c->n - c->off < len)
        return 0;
    s->p = c->p + c->off;
    s->n = (size_t)len;
    c->off += (size_t)len;
    return 1;
}

static int room_for(struct mg_tcpstore *t, uint64_t n)
{
    if (n > MG_TCPSTORE_MAX_KEYS)
        return -1;
    if (n <= t->kcap)
        return 1;
    struct span *k = realloc(t->keys, n * sizeof(*k)), *v;
    if (!k)
        return -1;
    t->keys = k;
    if (!(v = realloc(t->vals, n * sizeof(*v))))
        return -1;
    t->vals = v;
    t->kcap = n;
    return 1;
}

#define NEED(expr)                                                                                 \
    do {                                                                                           \
        int r_ = (expr);                                                                           \
        if (r_ <= 0)                                                                               \
            return r_;                                                                             \
    } while (0)

/* Handles one request if buf (len bytes of the client's input) holds a
 * whole one. Returns the bytes it took, 0 when more are needed, -1 to drop
 * the client. */
static long one_request(struct mg_tcpstore *t, struct client *c, const uint8_t *buf, size_t len)
{
    struct cur in = {buf, len, 0};
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
        if (u32 != VALIDATE_MAGIC)
            return -1;
        break;
    case OP_PING:
        NEED(rd(&in, &u32, 4));
        put(c, &u32, 4);
        break;
    case OP_SET:
        NEED(rd_span(&in, MG_TCPSTORE_MAX_KEY, &k));
        NEED(rd_span(&in, MG_TCPSTORE_MAX_VALUE, &a));
        if (put_key(t, k.p, k.n, a.p, a.n, NULL, 0))
            return -1;
        wake(t);
        break;
    case OP_APPEND: {
        NEED(rd_span(&in, MG_TCPSTORE_MAX_KEY, &k));
        NEED(rd_span(&in, MG_TCPSTORE_MAX_VALUE, &a));
        struct entry *e = lookup(t, k.p, k.n);
        if (put_key(t, k.p, k.n, e ? e->val : NULL, e ? e->vlen : 0, a.p, a.n))
            return -1;
        wake(t);
        break;
    }
    case OP_COMPARE_SET: {
        NEED(rd_span(&in, MG_TCPSTORE_MAX_KEY, &k));
        NEED(rd_span(&in, MG_TCPSTORE_MAX_VALUE, &a)); /* expected */
        NEED(rd_span(&in, MG_TCPSTORE_MAX_VALUE, &b)); /* desired */
        struct entry *e = lookup(t, k.p, k.n);
        if (!e && a.n == 0) { /* no key and nothing expected: create it */
            if (put_key(t, k.p, k.n, b.p, b.n, NULL, 0))
                return -1;
            put_bytes(c, b.p, b.n);
            wake(t);
        } else if (!e) {
            put_bytes(c, a.p, a.n); /* TCPStore's answer when the key is missing */
        } else {
            if (e->vlen == a.n && memcmp(e->val, a.p, a.n) == 0 &&
                put_key(t, k.p, k.n, b.p, b.n, NULL, 0))
                return -1;
            e = lookup(t, k.p, k.n);
            put_bytes(c, e->val, e->vlen);
        }
        break;
    }
    case OP_GET: {
        NEED(rd_span(&in, MG_TCPSTORE_MAX_KEY, &k));
        struct entry *e = lookup(t, k.p, k.n);
        put_bytes(c, e ? e->val : NULL, e ? e->vlen : 0);
        break;
    }
    case OP_ADD: {
        NEED(rd_span(&in, MG_TCPSTORE_MAX_KEY, &k));
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
        if (put_key(t, k.p, k.n, text, (size_t)tn, NULL, 0))
            return -1;
        put(c, &num, 8);
        wake(t);
        break;
    }
    case OP_CHECK:
    case OP_WAIT:
    case OP_MULTI_GET: {
        NEED(rd(&in, &n, 8));
        if (room_for(t, n) < 0)
            return -1;
        for (uint64_t i = 0; i < n; i++)
            NEED(rd_span(&in, MG_TCPSTORE_MAX_KEY, &t->keys[i]));
        if (op == OP_MULTI_GET) {
            for (uint64_t i = 0; i < n; i++) {
                struct entry *e = lookup(t, t->keys[i].p, t->keys[i].n);
                put_bytes(c, e ? e->val : NULL, e ? e->vlen : 0);
            }
            break;
        }
        int all = 1;
        for (uint64_t i = 0; all && i < n; i++)
            all = lookup(t, t->keys[i].p, t->keys[i].n) != NULL;
        if (op == OP_CHECK) {
            put_u8(c, all ? CHECK_READY : CHECK_NOT_READY);
        } else if (all) {
            put_u8(c, WAIT_STOP);
        } else { /* parked until the keys exist */
            end_wait(c);
            if (!(c->wait = calloc(n, sizeof(*c->wait))))
                return -1;
            for (uint64_t i = 0; i < n; i++) {
                void *p = malloc(t->keys[i].n ? t->keys[i].n : 1);
                if (!p)
                    return -1;
                memcpy(p, t->keys[i].p, t->keys[i].n);
                c->wait[i] = (struct span){p, t->keys[i].n};
                c->nwait++;
            }
        }
        break;
    }
    case OP_CANCEL_WAIT:
        end_wait(c);
        put_u8(c, WAIT_CANCELED);
        break;
    case OP_NUMKEYS:
        num = (int64_t)t->nkeys;
        put(c, &num, 8);
        break;
    case OP_DELETE:
        NEED(rd_span(&in, MG_TCPSTORE_MAX_KEY, &k));
        num = del_key(t, k.p, k.n);
        put(c, &num, 8);
        break;
    case OP_MULTI_SET:
        NEED(rd(&in, &n, 8));
        if (room_for(t, n) < 0)
            return -1;
        for (uint64_t i = 0; i < n; i++) {
            NEED(rd_span(&in, MG_TCPSTORE_MAX_KEY, &t->keys[i]));
            NEED(rd_span(&in, MG_TCPSTORE_MAX_VALUE, &t->vals[i]));
        }
        for (uint64_t i = 0; i < n; i++)
            if (put_key(t, t->keys[i].p, t->keys[i].n, t->vals[i].p, t->vals[i].n, NULL, 0))
                return -1;
        wake(t);
        break;
    case OP_UNSERVED:
        return -1;
    }
    return (long)in.off;
}

/* ---- clients ---------------------------------------------------------------------------- */

static void drop(struct mg_tcpstore *t, int i)
{
    struct client *c = t->c[i];
    end_wait(c);
    close(c->fd);
    free(c->in);
    free(c->out);
    free(c);
    t->c[i] = t->c[--t->nc];
}

static int append_input(struct client *c, const void *p, size_t n)
{
    if (c->ilen + n > c->icap) {
        size_t cap = c->icap ? c->icap : 4096;
        while (cap < c->ilen + n)
            cap *= 2;
        uint8_t *b = cap <= MAX_INPUT ? realloc(c->in, cap) : NULL;
        if (!b)
            return -1;
        c->in = b;
        c->icap = cap;
    }
    memcpy(c->in + c->ilen, p, n);
    c->ilen += n;
    return 0;
}

/* Every whole request in the client's input. */
static void serve(struct mg_tcpstore *t, struct client *c)
{
    size_t off = 0;
    while (!c->dead && c->ilen > off) {
        long k = one_request(t, c, c->in + off, c->ilen - off);
        if (k < 0)
            c->dead = 1;
        if (k <= 0)
            break;
        off += (size_t)k;
    }
    memmove(c->in, c->in + off, c->ilen - off);
    c->ilen -= off;
}

int mg_tcpstore_adopt(void *vt, int fd, const void *bytes, size_t n)
{
    struct mg_tcpstore *t = vt;
    struct client *c = NULL;
    if (t->nc == MG_TCPSTORE_MAX_CLIENTS || !(c = calloc(1, sizeof(*c))))
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
    if (n && append_input(c, bytes, n) < 0)
        goto fail;
    t->c[t->nc++] = c;
    serve(t, c);
    flush_out(c);
    return 0;
fail:
    if (c) {
        free(c->in);
        free(c);
    }
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
        if (t->c[i]->olen)
            fds[i].events |= POLLOUT;
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
                if (append_input(c, buf, (size_t)r) < 0)
                    c->dead = 1;
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
    /* Replies (also to clients a key written by another one woke), then the dead. */
    for (int i = 0; i < t->nc; i++)
        if (t->c[i]->olen)
            flush_out(t->c[i]);
    for (int i = t->nc - 1; i >= 0; i--)
        if (t->c[i]->dead)
            drop(t, i);
    return 0;
}

int mg_tcpstore_new(struct mg_tcpstore **out)
{
    struct mg_tcpstore *t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
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
