/* The store server (store.h, docs/store-protocol.md): one poll() loop over
 * non-blocking sockets, either driven by the caller's loop (the launcher) or
 * by a background thread (the runtime's rank 0). Blocking requests are parked
 * and answered when a change satisfies them or at their deadline; ephemeral
 * keys die with their connection or its lease. Every buffer that grows on a
 * client's input is bounded, and a misbehaving client is dropped alone. */
#include "store.h"
#include "mg_err.h"
#include "net.h"
#include "sha256.h"
#include "store_proto.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/queue.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define DEF_MAX_CLIENTS  4096
#define DEF_MAX_STORE    (1ull << 30)
#define DEF_MAX_BUFFER   (1ull << 30)
#define DEF_MAX_WAITERS  65536
#define DEF_HANDSHAKE_MS 10000
#define DEF_FRAME_MS     60000
#define MAX_HANDSHAKING  256        /* connections still in the handshake (oldest evicted) */
#define MAX_CONN_WAITERS 64         /* parked requests per connection */
#define MAX_TOMBSTONES   16384      /* deleted keys whose revision is remembered */
#define IBUF_MIN         4096       /* input buffer kept between frames */
#define OUT_HIGH         (1u << 20) /* queued reply bytes above which input is not read */
#define READ_BUDGET      (4u << 20) /* bytes read from one connection per loop turn (default) */
#define ACCEPT_BURST     64         /* connections accepted per loop turn */
#define CLOSE_LINGER_MS  1000       /* to flush a final error before closing */
#define ENTRY_OVERHEAD   64         /* charged per key besides its bytes */

struct blob {
    size_t refs;
    size_t len;
    uint8_t data[];
};

struct entry;
struct waiter;
struct conn;

/* One key of a parked request, linked into that key's entry. */
struct wkey {
    struct entry *e;
    struct waiter *w;
    LIST_ENTRY(wkey) link; /* the entry's parked keys */
};

struct waiter {
    struct conn *conn;
    uint32_t id;
    uint8_t op;
    int ready;
    int64_t since; /* WATCH */
    int64_t deadline_ms;
    size_t heap_idx;
    size_t charge;
    LIST_ENTRY(waiter) clink; /* the connection's parked requests */
    struct waiter *rnext;     /* satisfied, to answer */
    int nkeys;
    struct wkey keys[];
};

/* A key. val NULL means absent: a tombstone (tomb set, rev = deletion) or a
 * placeholder that only anchors parked requests. */
struct entry {
    struct entry *hnext;
    uint64_t hash;
    struct blob *val;
    int64_t rev;
    struct conn *owner;      /* of an ephemeral key */
    LIST_ENTRY(entry) olink; /* the owner's ephemeral keys */
    int tomb;
    TAILQ_ENTRY(entry) tlink; /* tombstones, oldest first */
    LIST_HEAD(, wkey) waiters;
    size_t klen;
    uint8_t key[];
};

/* One queued reply (or handshake message): head bytes, then an optional value. */
struct oseg {
    struct oseg *next;
    struct blob *blob;
    size_t hlen, off;
    uint8_t data[];
};

enum conn_state {
    ST_HELLO,
    ST_AUTH,
    ST_READY
};
enum conn_close {
    CL_OPEN,
    CL_AFTER_FLUSH,
    CL_DEAD
};

struct conn {
    struct mg_store_server *srv;
    int fd;
    enum conn_state state;
    enum conn_close closing;
    int dirty;
    uint8_t cnonce[MG_SP_NONCE_LEN], snonce[MG_SP_NONCE_LEN];
    uint32_t lease_ms;
    int64_t last_rx_ms;
    int64_t deadline_ms; /* handshake, or lingering close */
    int64_t frame_start_ms;
    uint8_t *ibuf;
    size_t ipos, ilen, icap;
    struct oseg *ohead, *otail;
    size_t obytes;
    LIST_HEAD(, entry) eph;
    LIST_HEAD(, waiter) waiters;
    int nwaiters;
    LIST_ENTRY(conn) link;    /* all live connections */
    TAILQ_ENTRY(conn) hslink; /* still handshaking, oldest first */
    int in_hs;
    struct conn *dnext; /* dirty list: has new output to flush */
    struct conn *knext; /* dead list: to tear down */
};

struct mg_store_server {
    pthread_mutex_t lock;
    int lfd, own_lfd, wakefd, port;
    char *token;
    int max_clients, max_waiters, handshake_ms, frame_ms;
    size_t max_store, max_buffer, read_budget;
    uint64_t sipkey[2];

    struct entry **table;
    size_t nbuckets, nentries, nlive;
    int64_t rev, compact_rev;
    TAILQ_HEAD(, entry) tombs;
    size_t ntombs;

    struct waiter **heap;
    size_t nheap, heapcap;
    int nwaiters;

    LIST_HEAD(, conn) conns;
    TAILQ_HEAD(, conn) hs;
    int nconns, nhs;
    struct conn **byfd;
    int byfd_cap;
    struct conn *dirty, *dead;

    size_t stored, buffered;
    uint64_t dropped, leases_expired;
    int64_t accept_pause_until;

    struct conn *local; /* owns the hosting process's ephemeral keys (never polled) */

    pthread_t thread;
    int has_thread, stop;
    struct pollfd *tfds;
    int tfds_cap;
};

/* ---- hashing (SipHash-2-4: keys come from clients, so the table must not be
 * open to collision flooding) ------------------------------------------------------ */

static inline uint64_t rotl(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

#define SIPROUND                                                                                   \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = rotl(v1, 13);                                                                         \
        v1 ^= v0;                                                                                  \
        v0 = rotl(v0, 32);                                                                         \
        v2 += v3;                                                                                  \
        v3 = rotl(v3, 16);                                                                         \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = rotl(v3, 21);                                                                         \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = rotl(v1, 17);                                                                         \
        v1 ^= v2;                                                                                  \
        v2 = rotl(v2, 32);                                                                         \
    } while (0)

static uint64_t siphash(const uint64_t k[2], const uint8_t *in, size_t len)
{
    uint64_t v0 = 0x736f6d6570736575ull ^ k[0], v1 = 0x646f72616e646f6dull ^ k[1];
    uint64_t v2 = 0x6c7967656e657261ull ^ k[0], v3 = 0x7465646279746573ull ^ k[1];
    uint64_t b = (uint64_t)len << 56;
    const uint8_t *end = in + (len & ~(size_t)7);
    for (; in != end; in += 8) {
        uint64_t m = mg_sp_get64(in);
        v3 ^= m;
        SIPROUND;
        SIPROUND;
        v0 ^= m;
    }
    for (size_t i = 0; i < (len & 7); i++)
        b |= (uint64_t)in[i] << (8 * i);
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* ---- memory accounting ------------------------------------------------------------- */

static int charge(struct mg_store_server *s, size_t n)
{
    if (n > s->max_store || s->stored > s->max_store - n)
        return -ENOSPC;
    s->stored += n;
    return 0;
}

static void uncharge(struct mg_store_server *s, size_t n)
{
    s->stored -= n;
}

/* A new value for a key whose value is now old (NULL: none). The old one's
 * bytes count as free when this key holds its only reference: it is about to
 * be replaced. */
static struct blob *blob_new(struct mg_store_server *s, const void *data, size_t len,
                             const struct blob *old)
{
    size_t need = sizeof(struct blob) + len;
    size_t credit = old && old->refs == 1 ? sizeof(struct blob) + old->len : 0;
    if (need > s->max_store || s->stored > s->max_store - need + credit)
        return NULL;
    struct blob *b = malloc(need);
    if (!b)
        return NULL;
    s->stored += need;
    b->refs = 1;
    b->len = len;
    if (len)
        memcpy(b->data, data, len);
    return b;
}

static void blob_unref(struct mg_store_server *s, struct blob *b)
{
    if (b && --b->refs == 0) {
        uncharge(s, sizeof(struct blob) + b->len);
        free(b);
    }
}

/* ---- the key table ----------------------------------------------------------------- */

static struct entry *entry_find(struct mg_store_server *s, const uint8_t *key, size_t klen,
                                uint64_t h)
{
    for (struct entry *e = s->table[h & (s->nbuckets - 1)]; e; e = e->hnext)
        if (e->hash == h && e->klen == klen && memcmp(e->key, key, klen) == 0)
            return e;
    return NULL;
}

static struct entry *lookup(struct mg_store_server *s, const uint8_t *key, size_t klen)
{
    return entry_find(s, key, klen, siphash(s->sipkey, key, klen));
}

static void table_grow(struct mg_store_server *s)
{
    size_t nb = s->nbuckets * 2;
    struct entry **t = calloc(nb, sizeof(*t));
    if (!t)
        return; /* keep the longer chains */
    for (size_t i = 0; i < s->nbuckets; i++) {
        struct entry *e = s->table[i], *next;
        for (; e; e = next) {
            next = e->hnext;
            e->hnext = t[e->hash & (nb - 1)];
            t[e->hash & (nb - 1)] = e;
        }
    }
    free(s->table);
    s->table = t;
    s->nbuckets = nb;
}

static struct entry *entry_get(struct mg_store_server *s, const uint8_t *key, size_t klen)
{
    uint64_t h = siphash(s->sipkey, key, klen);
    struct entry *e = entry_find(s, key, klen, h);
    if (e)
        return e;
    if (charge(s, ENTRY_OVERHEAD + klen))
        return NULL;
    e = calloc(1, sizeof(*e) + klen);
    if (!e) {
        uncharge(s, ENTRY_OVERHEAD + klen);
        return NULL;
    }
    e->hash = h;
    e->klen = klen;
    memcpy(e->key, key, klen);
    e->hnext = s->table[h & (s->nbuckets - 1)];
    s->table[h & (s->nbuckets - 1)] = e;
    if (++s->nentries > s->nbuckets)
        table_grow(s);
    return e;
}

static void tomb_unlink(struct mg_store_server *s, struct entry *e)
{
    if (!e->tomb)
        return;
    TAILQ_REMOVE(&s->tombs, e, tlink);
    e->tomb = 0;
    s->ntombs--;
}

static void entry_free(struct mg_store_server *s, struct entry *e)
{
    struct entry **pp = &s->table[e->hash & (s->nbuckets - 1)];
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    s->nentries--;
    uncharge(s, ENTRY_OVERHEAD + e->klen);
    free(e);
}

/* Frees an absent key once nothing needs it: no tombstone, no parked request. */
static void entry_maybe_free(struct mg_store_server *s, struct entry *e)
{
    if (!e->val && !e->tomb && LIST_EMPTY(&e->waiters))
        entry_free(s, e);
}

/* The revision of a key's last change. For an absent key without a tombstone
 * that is unknown, but no later than compact_rev (the newest forgotten one). */
static int64_t entry_rev(const struct mg_store_server *s, const struct entry *e)
{
    if (e && (e->val || e->tomb))
        return e->rev;
    return s->compact_rev;
}

static void owner_unlink(struct entry *e)
{
    if (!e->owner)
        return;
    LIST_REMOVE(e, olink);
    e->owner = NULL;
}

static void owner_link(struct entry *e, struct conn *c)
{
    e->owner = c;
    LIST_INSERT_HEAD(&c->eph, e, olink);
}

static void wake(struct mg_store_server *s, struct entry *e);

/* Stores b (taking the caller's reference) at e. owner: the connection for an
 * ephemeral set, NULL for a persistent one; keep_owner: add and compare_set
 * leave the ownership as it was. */
static void entry_store(struct mg_store_server *s, struct entry *e, struct blob *b,
                        struct conn *owner, int keep_owner)
{
    blob_unref(s, e->val);
    if (!e->val)
        s->nlive++;
    e->val = b;
    e->rev = ++s->rev;
    tomb_unlink(s, e);
    if (!keep_owner && e->owner != owner) {
        owner_unlink(e);
        if (owner)
            owner_link(e, owner);
    }
    wake(s, e);
}

static void entry_delete(struct mg_store_server *s, struct entry *e)
{
    if (!e->val)
        return;
    blob_unref(s, e->val);
    e->val = NULL;
    s->nlive--;
    e->rev = ++s->rev;
    owner_unlink(e);
    e->tomb = 1;
    TAILQ_INSERT_TAIL(&s->tombs, e, tlink);
    s->ntombs++;
    wake(s, e);
    /* wake() may have freed nothing here: e is a tombstone. Forget the oldest
     * tombstones past the cap; their keys then report compact_rev. */
    while (s->ntombs > MAX_TOMBSTONES) {
        struct entry *old = TAILQ_FIRST(&s->tombs);
        if (old->rev > s->compact_rev)
            s->compact_rev = old->rev;
        tomb_unlink(s, old);
        entry_maybe_free(s, old);
    }
}

/* ---- replies ------------------------------------------------------------------------- */

static void mark_dirty(struct conn *c)
{
    if (!c->dirty && c->closing != CL_DEAD) {
        c->dirty = 1;
        c->dnext = c->srv->dirty;
        c->srv->dirty = c;
    }
}

static void conn_kill(struct conn *c);

/* Queues hlen bytes of head, to be written by the caller into the returned
 * space, then the optional tail blob. NULL: the connection is gone (or was
 * dropped for want of memory). */
static uint8_t *queue_seg(struct conn *c, size_t hlen, struct blob *tail)
{
    if (c->closing == CL_DEAD)
        return NULL;
    struct oseg *o = malloc(sizeof(*o) + hlen);
    if (!o) {
        conn_kill(c);
        return NULL;
    }
    o->next = NULL;
    o->blob = tail;
    if (tail)
        tail->refs++;
    o->hlen = hlen;
    o->off = 0;
    if (c->otail)
        c->otail->next = o;
    else
        c->ohead = o;
    c->otail = o;
    c->obytes += hlen + (tail ? tail->len : 0);
    c->srv->buffered += hlen;
    mark_dirty(c);
    return o->data;
}

static void queue_raw(struct conn *c, const void *head, size_t hlen, struct blob *tail)
{
    uint8_t *p = queue_seg(c, hlen, tail);
    if (p)
        memcpy(p, head, hlen);
}

/* Queues a reply, encoded straight into its queue segment; the value (GET,
 * CAS, WATCH) goes out from the stored blob. */
static void reply(struct conn *c, struct mg_sp_reply *y, struct blob *val)
{
    if (val && y->status == MG_SP_OK) {
        y->val = val->data;
        y->vlen = val->len;
    } else {
        val = NULL;
    }
    uint8_t *p = queue_seg(c, mg_sp_reply_head_size(y), val);
    if (p)
        mg_sp_reply_encode(p, y, 0);
}

static void reply_status(struct conn *c, uint8_t op, uint32_t id, uint16_t status)
{
    struct mg_sp_reply y = {.op = op, .id = id, .status = status};
    reply(c, &y, NULL);
}

/* ---- parked requests -------------------------------------------------------------- */

static int heap_less(struct waiter *a, struct waiter *b)
{
    return a->deadline_ms < b->deadline_ms;
}

static void heap_set(struct mg_store_server *s, size_t i, struct waiter *w)
{
    s->heap[i] = w;
    w->heap_idx = i;
}

static void heap_up(struct mg_store_server *s, size_t i)
{
    struct waiter *w = s->heap[i];
    while (i > 0 && heap_less(w, s->heap[(i - 1) / 2])) {
        heap_set(s, i, s->heap[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    heap_set(s, i, w);
}

static void heap_down(struct mg_store_server *s, size_t i)
{
    struct waiter *w = s->heap[i];
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        struct waiter *mw = w;
        if (l < s->nheap && heap_less(s->heap[l], mw))
            m = l, mw = s->heap[l];
        if (l + 1 < s->nheap && heap_less(s->heap[l + 1], mw))
            m = l + 1, mw = s->heap[l + 1];
        if (m == i)
            break;
        heap_set(s, i, mw);
        i = m;
    }
    heap_set(s, i, w);
}

static void heap_remove(struct mg_store_server *s, struct waiter *w)
{
    size_t i = w->heap_idx;
    struct waiter *last = s->heap[--s->nheap];
    if (last != w) {
        heap_set(s, i, last);
        heap_up(s, i);
        heap_down(s, last->heap_idx);
    }
}

/* Unlinks the first n keys of w, one at a time: a key named twice keeps its
 * entry alive until its last link goes. */
static void wkeys_release(struct mg_store_server *s, struct waiter *w, int n)
{
    for (int i = 0; i < n; i++) {
        struct wkey *k = &w->keys[i];
        LIST_REMOVE(k, link);
        entry_maybe_free(s, k->e);
    }
}

static void waiter_free(struct mg_store_server *s, struct waiter *w)
{
    wkeys_release(s, w, w->nkeys);
    heap_remove(s, w);
    LIST_REMOVE(w, clink);
    w->conn->nwaiters--;
    s->nwaiters--;
    uncharge(s, w->charge);
    free(w);
}

static int waiter_satisfied(struct mg_store_server *s, struct waiter *w)
{
    switch (w->op) {
    case MG_SP_WATCH:
        return entry_rev(s, w->keys[0].e) > w->since;
    default: /* GET, WAIT: every key exists */
        for (int i = 0; i < w->nkeys; i++)
            if (!w->keys[i].e->val)
                return 0;
        return 1;
    }
}

/* Answers a request (parked or not) whose condition holds, or that timed out. */
static void answer(struct mg_store_server *s, struct conn *c, uint8_t op, uint32_t id,
                   struct entry *e, uint16_t status)
{
    struct mg_sp_reply y = {.op = op, .id = id, .status = status};
    if (status != MG_SP_OK || op == MG_SP_WAIT) {
        reply(c, &y, NULL);
        return;
    }
    y.rev = entry_rev(s, e);
    if (e && e->val)
        y.flags = MG_SP_F_PRESENT;
    reply(c, &y, e ? e->val : NULL);
}

static void wake(struct mg_store_server *s, struct entry *e)
{
    struct waiter *ready = NULL;
    struct wkey *k;
    LIST_FOREACH(k, &e->waiters, link) {
        struct waiter *w = k->w;
        if (!w->ready && waiter_satisfied(s, w)) {
            w->ready = 1;
            w->rnext = ready;
            ready = w;
        }
    }
    /* The entry may be freed below (a placeholder losing its last waiter):
     * each answer is built before its waiter is freed. */
    while (ready) {
        struct waiter *w = ready;
        ready = w->rnext;
        answer(s, w->conn, w->op, w->id, w->keys[0].e, MG_SP_OK);
        waiter_free(s, w);
    }
}

/* Parks a request on keys (packed, or the single key). 0 or a status. */
static uint16_t park(struct mg_store_server *s, struct conn *c, const struct mg_sp_req *q)
{
    int nkeys = q->nkeys ? q->nkeys : 1;
    size_t size = sizeof(struct waiter) + (size_t)nkeys * sizeof(struct wkey);
    if (c->nwaiters >= MAX_CONN_WAITERS || s->nwaiters >= s->max_waiters)
        return MG_SP_BUSY;
    if (s->nheap == s->heapcap) {
        size_t cap = s->heapcap ? s->heapcap * 2 : 64;
        struct waiter **h = realloc(s->heap, cap * sizeof(*h));
        if (!h)
            return MG_SP_NOSPACE;
        s->heap = h;
        s->heapcap = cap;
    }
    if (charge(s, size))
        return MG_SP_NOSPACE;
    struct waiter *w = calloc(1, size);
    if (!w) {
        uncharge(s, size);
        return MG_SP_NOSPACE;
    }
    w->conn = c;
    w->id = q->id;
    w->op = q->op;
    w->since = q->num;
    w->charge = size;
    w->deadline_ms = mg_now_ms() + q->timeout_ms;
    const uint8_t *p = q->keys, *end = q->keys + q->keys_len;
    for (int i = 0; i < nkeys; i++) {
        const uint8_t *key = q->key;
        size_t klen = q->klen;
        if (q->nkeys)
            mg_sp_keys_next(&p, end, &key, &klen);
        struct entry *e = entry_get(s, key, klen);
        if (!e) {
            wkeys_release(s, w, i);
            uncharge(s, size);
            free(w);
            return MG_SP_NOSPACE;
        }
        /* Linked at once, so the placeholder stays while later keys are made. */
        struct wkey *k = &w->keys[i];
        k->e = e;
        k->w = w;
        LIST_INSERT_HEAD(&e->waiters, k, link);
    }
    w->nkeys = nkeys;
    LIST_INSERT_HEAD(&c->waiters, w, clink);
    c->nwaiters++;
    s->nwaiters++;
    s->heap[s->nheap] = w;
    w->heap_idx = s->nheap++;
    heap_up(s, w->heap_idx);
    return MG_SP_OK;
}

/* ---- requests ------------------------------------------------------------------------ */

/* ADD: the stored value must be a decimal int64 (missing = 0). */
static int parse_int(const struct blob *b, int64_t *out)
{
    char buf[24];
    if (!b) {
        *out = 0;
        return 0;
    }
    if (b->len == 0 || b->len >= sizeof(buf))
        return -ERANGE;
    memcpy(buf, b->data, b->len);
    buf[b->len] = '\0';
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || *end || !(buf[0] == '-' || (buf[0] >= '0' && buf[0] <= '9')))
        return -ERANGE;
    *out = v;
    return 0;
}

static int all_present(struct mg_store_server *s, const struct mg_sp_req *q)
{
    const uint8_t *p = q->keys, *end = q->keys + q->keys_len, *key;
    size_t klen;
    while (mg_sp_keys_next(&p, end, &key, &klen) > 0) {
        struct entry *e = lookup(s, key, klen);
        if (!e || !e->val)
            return 0;
    }
    return 1;
}

static int key_cmp(const void *a, const void *b)
{
    const struct entry *x = *(struct entry *const *)a, *y = *(struct entry *const *)b;
    size_t n = x->klen < y->klen ? x->klen : y->klen;
    int c = memcmp(x->key, y->key, n);
    return c ? c : (x->klen > y->klen) - (x->klen < y->klen);
}

/* The operations themselves, shared by the protocol's requests and the
 * hosting process's local calls, so that both see one set of rules. Each
 * returns a protocol status (MG_SP_OK or an error). */

/* The live keys starting with prefix, sorted: *out (malloc'd, NULL when
 * none) holds all *total of them. */
static uint16_t op_list(struct mg_store_server *s, const uint8_t *prefix, size_t plen,
                        struct entry ***out, size_t *total)
{
    struct entry **all = NULL;
    size_t n = 0;
    *out = NULL;
    *total = 0;
    if (s->nlive) {
        all = malloc(s->nlive * sizeof(*all));
        if (!all)
            return MG_SP_NOSPACE;
    }
    for (size_t i = 0; i < s->nbuckets; i++)
        for (struct entry *e = s->table[i]; e; e = e->hnext)
            if (e->val && e->klen >= plen && memcmp(e->key, prefix, plen) == 0)
                all[n++] = e;
    if (n > 1)
        qsort(all, n, sizeof(*all), key_cmp);
    if (n == 0) {
        free(all);
        all = NULL;
    }
    *out = all;
    *total = n;
    return MG_SP_OK;
}

/* owner: the connection for an ephemeral set, NULL for a persistent one.
 * *ep: the key's entry, which survives (it holds a value). */
static uint16_t op_set(struct mg_store_server *s, const uint8_t *key, size_t klen, const void *val,
                       size_t vlen, struct conn *owner, struct entry **ep)
{
    struct entry *e = entry_get(s, key, klen);
    struct blob *b = NULL;
    if (e) {
        b = blob_new(s, val, vlen, e->val);
    }
    if (!b) {
        if (e)
            entry_maybe_free(s, e);
        return MG_SP_NOSPACE;
    }
    entry_store(s, e, b, owner, 0);
    *ep = e;
    return MG_SP_OK;
}

static uint16_t op_add(struct mg_store_server *s, const uint8_t *key, size_t klen, int64_t delta,
                       int64_t *sum, struct entry **ep)
{
    struct entry *e = entry_get(s, key, klen);
    int64_t cur;
    char text[24];
    if (!e)
        return MG_SP_NOSPACE;
    if (parse_int(e->val, &cur) || __builtin_add_overflow(cur, delta, sum)) {
        entry_maybe_free(s, e);
        return MG_SP_RANGE;
    }
    int n = snprintf(text, sizeof(text), "%lld", (long long)*sum);
    struct blob *b = blob_new(s, text, (size_t)n, e->val);
    if (!b) {
        entry_maybe_free(s, e);
        return MG_SP_NOSPACE;
    }
    entry_store(s, e, b, NULL, 1);
    *ep = e;
    return MG_SP_OK;
}

/* absent: the key must not exist (else its value must equal expected).
 * *ep: the key's entry afterwards (NULL when the key never existed),
 * *swapped whether it was set. */
static uint16_t op_cas(struct mg_store_server *s, const uint8_t *key, size_t klen, int absent,
                       const void *expected, size_t elen, const void *desired, size_t dlen,
                       struct entry **ep, int *swapped)
{
    struct entry *e = lookup(s, key, klen);
    int match;
    *swapped = 0;
    if (absent)
        match = !e || !e->val;
    else
        match = e && e->val && e->val->len == elen && memcmp(e->val->data, expected, elen) == 0;
    if (match) {
        if (!e)
            e = entry_get(s, key, klen);
        struct blob *b = e ? blob_new(s, desired, dlen, e->val) : NULL;
        if (!b) {
            if (e)
                entry_maybe_free(s, e);
            return MG_SP_NOSPACE;
        }
        entry_store(s, e, b, NULL, 1);
        *swapped = 1;
    }
    *ep = e;
    return MG_SP_OK;
}

/* 1 when the key existed (and is now deleted). */
static int op_delete(struct mg_store_server *s, const uint8_t *key, size_t klen)
{
    struct entry *e = lookup(s, key, klen);
    if (!e || !e->val)
        return 0;
    entry_delete(s, e);
    return 1;
}

static void do_list(struct mg_store_server *s, struct conn *c, const struct mg_sp_req *q)
{
    struct mg_sp_reply y = {.op = MG_SP_LIST, .id = q->id};
    struct entry **all;
    uint8_t *keys = NULL;
    size_t n, bytes = 0;
    uint16_t st = op_list(s, q->key, q->klen, &all, &n);
    if (st) {
        reply_status(c, MG_SP_LIST, q->id, st);
        return;
    }
    size_t take = n < q->max ? n : q->max;
    for (size_t i = 0; i < take; i++)
        bytes += 2 + all[i]->klen;
    if (bytes) {
        keys = malloc(bytes);
        if (!keys) {
            free(all);
            reply_status(c, MG_SP_LIST, q->id, MG_SP_NOSPACE);
            return;
        }
    }
    uint8_t *p = keys;
    for (size_t i = 0; i < take; i++)
        p += mg_sp_keys_put(p, all[i]->key, all[i]->klen);
    y.total = (uint32_t)n;
    y.nkeys = (uint32_t)take;
    y.keys = keys;
    y.keys_len = bytes;
    reply(c, &y, NULL);
    free(keys);
    free(all);
}

static void do_set(struct mg_store_server *s, struct conn *c, const struct mg_sp_req *q)
{
    struct mg_sp_reply y = {.op = MG_SP_SET, .id = q->id};
    struct entry *e;
    uint16_t st =
        op_set(s, q->key, q->klen, q->val, q->vlen, (q->flags & MG_SP_F_EPHEMERAL) ? c : NULL, &e);
    if (st) {
        reply_status(c, MG_SP_SET, q->id, st);
        return;
    }
    y.rev = e->rev;
    reply(c, &y, NULL);
}

static void do_add(struct mg_store_server *s, struct conn *c, const struct mg_sp_req *q)
{
    struct mg_sp_reply y = {.op = MG_SP_ADD, .id = q->id};
    struct entry *e;
    int64_t sum;
    uint16_t st = op_add(s, q->key, q->klen, q->num, &sum, &e);
    if (st) {
        reply_status(c, MG_SP_ADD, q->id, st);
        return;
    }
    y.rev = e->rev;
    y.num = sum;
    reply(c, &y, NULL);
}

static void do_cas(struct mg_store_server *s, struct conn *c, const struct mg_sp_req *q)
{
    struct mg_sp_reply y = {.op = MG_SP_CAS, .id = q->id};
    struct entry *e;
    int swapped;
    uint16_t st = op_cas(s, q->key, q->klen, !!(q->flags & MG_SP_F_EXPECT_ABSENT), q->val, q->vlen,
                         q->val2, q->vlen2, &e, &swapped);
    if (st) {
        reply_status(c, MG_SP_CAS, q->id, st);
        return;
    }
    if (swapped)
        y.flags |= MG_SP_F_SWAPPED;
    y.rev = entry_rev(s, e);
    if (e && e->val)
        y.flags |= MG_SP_F_PRESENT;
    reply(c, &y, e ? e->val : NULL);
}

/* A request that must wait: answered `now` at once when it may not wait (timeout
 * 0), else parked; a refusal to park (too many waiters) is its answer. */
static void park_or_answer(struct mg_store_server *s, struct conn *c, const struct mg_sp_req *q,
                           uint16_t now)
{
    uint16_t st = q->timeout_ms == 0 ? now : park(s, c, q);
    if (st)
        reply_status(c, q->op, q->id, st);
}

static void handle_request(struct mg_store_server *s, struct conn *c, const struct mg_sp_hdr *h,
                           const uint8_t *body)
{
    struct mg_sp_req q;
    int rc = mg_sp_req_decode(h, body, &q);
    if (rc) {
        reply_status(c, h->op, h->id, mg_sp_err_status(rc));
        return;
    }
    struct mg_sp_reply y = {.op = q.op, .id = q.id};
    struct entry *e;
    switch (q.op) {
    case MG_SP_PING:
        y.rev = s->rev;
        reply(c, &y, NULL);
        break;
    case MG_SP_SET:
        do_set(s, c, &q);
        break;
    case MG_SP_GET:
        e = lookup(s, q.key, q.klen);
        if (e && e->val)
            answer(s, c, q.op, q.id, e, MG_SP_OK);
        else
            park_or_answer(s, c, &q, MG_SP_NOKEY);
        break;
    case MG_SP_ADD:
        do_add(s, c, &q);
        break;
    case MG_SP_CAS:
        do_cas(s, c, &q);
        break;
    case MG_SP_WAIT:
        if (all_present(s, &q))
            reply(c, &y, NULL);
        else
            park_or_answer(s, c, &q, MG_SP_TIMEDOUT);
        break;
    case MG_SP_CHECK:
        y.flags = all_present(s, &q) ? MG_SP_F_PRESENT : 0;
        reply(c, &y, NULL);
        break;
    case MG_SP_DELETE:
        if (op_delete(s, q.key, q.klen))
            y.flags = MG_SP_F_PRESENT;
        y.rev = s->rev;
        reply(c, &y, NULL);
        break;
    case MG_SP_WATCH:
        e = lookup(s, q.key, q.klen);
        if (q.num < 0 || entry_rev(s, e) > q.num)
            answer(s, c, q.op, q.id, e, MG_SP_OK);
        else
            park_or_answer(s, c, &q, MG_SP_TIMEDOUT);
        break;
    case MG_SP_LIST:
        do_list(s, c, &q);
        break;
    }
}

/* ---- connections --------------------------------------------------------------------- */

static void hs_unlink(struct conn *c)
{
    struct mg_store_server *s = c->srv;
    if (!c->in_hs)
        return;
    c->in_hs = 0;
    TAILQ_REMOVE(&s->hs, c, hslink);
    s->nhs--;
}

/* Drops a connection now. The teardown (ephemeral keys, parked requests)
 * happens in reap(), outside whatever loop is running. */
static void conn_kill(struct conn *c)
{
    if (c->closing == CL_DEAD)
        return;
    c->closing = CL_DEAD;
    c->knext = c->srv->dead;
    c->srv->dead = c;
}

/* A protocol or policy failure: counted, then dropped. */
static void conn_drop(struct conn *c)
{
    if (c->closing != CL_DEAD)
        c->srv->dropped++;
    conn_kill(c);
}

/* Sends what is queued, then closes. */
static void conn_close_after_flush(struct conn *c)
{
    if (c->closing != CL_OPEN)
        return;
    c->srv->dropped++;
    c->closing = CL_AFTER_FLUSH;
    c->deadline_ms = mg_now_ms() + CLOSE_LINGER_MS;
    mark_dirty(c);
}

static void conn_teardown(struct conn *c)
{
    struct mg_store_server *s = c->srv;
    if (c->dirty) {
        struct conn **pp = &s->dirty;
        while (*pp != c)
            pp = &(*pp)->dnext;
        *pp = c->dnext;
        c->dirty = 0;
    }
    while (!LIST_EMPTY(&c->eph))
        entry_delete(s, LIST_FIRST(&c->eph));
    while (!LIST_EMPTY(&c->waiters))
        waiter_free(s, LIST_FIRST(&c->waiters));
    for (struct oseg *o = c->ohead, *next; o; o = next) {
        next = o->next;
        s->buffered -= o->hlen;
        blob_unref(s, o->blob);
        free(o);
    }
    hs_unlink(c);
    LIST_REMOVE(c, link);
    s->nconns--;
    s->buffered -= c->icap;
    free(c->ibuf);
    if (c->fd >= 0 && c->fd < s->byfd_cap)
        s->byfd[c->fd] = NULL;
    close(c->fd);
    free(c);
}

static int backpressured(const struct conn *c)
{
    return c->obytes > OUT_HIGH || c->closing != CL_OPEN;
}

static size_t process_input(struct mg_store_server *s, struct conn *c);

static void conn_flush(struct conn *c)
{
    struct iovec iov[64];
    while (c->ohead && c->closing != CL_DEAD) {
        int n = 0;
        for (struct oseg *o = c->ohead; o && n < 62; o = o->next) {
            size_t off = o->off;
            if (off < o->hlen) {
                iov[n].iov_base = o->data + off;
                iov[n++].iov_len = o->hlen - off;
                off = 0;
            } else {
                off -= o->hlen;
            }
            if (o->blob && off < o->blob->len) {
                iov[n].iov_base = o->blob->data + off;
                iov[n++].iov_len = o->blob->len - off;
            }
        }
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                conn_kill(c);
            return;
        }
        c->obytes -= (size_t)w;
        while (w > 0) {
            struct oseg *o = c->ohead;
            size_t total = o->hlen + (o->blob ? o->blob->len : 0), left = total - o->off;
            if ((size_t)w < left) {
                o->off += (size_t)w;
                break;
            }
            w -= (ssize_t)left;
            c->ohead = o->next;
            if (!c->ohead)
                c->otail = NULL;
            c->srv->buffered -= o->hlen;
            blob_unref(c->srv, o->blob);
            free(o);
        }
    }
    if (!c->ohead && c->closing == CL_AFTER_FLUSH)
        conn_kill(c);
    /* Requests that arrived while the replies were piling up wait in the
     * input buffer: with room again, serve them now, not on the next read
     * (the client may be sending nothing until it has its replies). */
    if (c->ilen > c->ipos && !backpressured(c))
        process_input(c->srv, c);
}

static void send_shello(struct conn *c, uint16_t status, uint32_t flags)
{
    struct mg_sp_shello h = {.version = MG_SP_WIRE_VERSION, .status = status, .flags = flags};
    uint8_t out[MG_SP_SHELLO_LEN];
    memcpy(h.nonce, c->snonce, sizeof(h.nonce));
    mg_sp_shello_encode(out, &h);
    queue_raw(c, out, sizeof(out), NULL);
}

static void become_ready(struct conn *c)
{
    hs_unlink(c);
    c->state = ST_READY;
    c->last_rx_ms = mg_now_ms();
    c->deadline_ms = 0;
}

static void handle_hello(struct mg_store_server *s, struct conn *c, const uint8_t *in)
{
    struct mg_sp_hello h;
    if (mg_sp_hello_decode(in, &h)) {
        conn_drop(c); /* not our protocol: no answer */
        return;
    }
    memcpy(c->cnonce, h.nonce, sizeof(c->cnonce));
    if (h.version != MG_SP_WIRE_VERSION) {
        send_shello(c, MG_SP_VERSION, 0);
        conn_close_after_flush(c);
    } else if (h.lease_ms > MG_SP_MAX_LEASE_MS || (h.flags & ~MG_SP_HELLO_AUTH)) {
        send_shello(c, MG_SP_INVAL, 0);
        conn_close_after_flush(c);
    } else if (s->token && !(h.flags & MG_SP_HELLO_AUTH)) {
        send_shello(c, MG_SP_AUTH, MG_SP_HELLO_AUTH);
        conn_close_after_flush(c);
    } else if (s->token) {
        c->lease_ms = h.lease_ms;
        if (getrandom(c->snonce, sizeof(c->snonce), 0) != (ssize_t)sizeof(c->snonce)) {
            conn_drop(c);
            return;
        }
        send_shello(c, MG_SP_OK, MG_SP_HELLO_AUTH);
        c->state = ST_AUTH;
    } else {
        c->lease_ms = h.lease_ms;
        send_shello(c, MG_SP_OK, 0);
        become_ready(c);
    }
}

static void handle_auth(struct mg_store_server *s, struct conn *c, const uint8_t *in)
{
    uint8_t want[MG_SP_PROOF_LEN], out[MG_SP_AUTH_REPLY_LEN];
    mg_sp_client_proof(s->token, c->cnonce, c->snonce, want);
    if (!mg_memeq_ct(want, in, MG_SP_PROOF_LEN)) {
        mg_sp_auth_reply_encode(out, MG_SP_AUTH, NULL);
        queue_raw(c, out, sizeof(out), NULL);
        conn_close_after_flush(c);
        return;
    }
    mg_sp_server_proof(s->token, c->cnonce, c->snonce, want);
    mg_sp_auth_reply_encode(out, MG_SP_OK, want);
    queue_raw(c, out, sizeof(out), NULL);
    become_ready(c);
}

/* Handles every complete message in the input buffer. Returns the bytes the
 * message in progress still needs (0 when unknown). */
static size_t process_input(struct mg_store_server *s, struct conn *c)
{
    size_t need = 0;
    while (c->closing == CL_OPEN && !backpressured(c)) {
        size_t avail = c->ilen - c->ipos;
        const uint8_t *p = c->ibuf + c->ipos;
        if (c->state == ST_HELLO || c->state == ST_AUTH) {
            size_t len = c->state == ST_HELLO ? MG_SP_HELLO_LEN : MG_SP_AUTH_LEN;
            if (avail < len) {
                need = len - avail;
                break;
            }
            if (c->state == ST_HELLO)
                handle_hello(s, c, p);
            else
                handle_auth(s, c, p);
            c->ipos += len;
            continue;
        }
        if (avail < MG_SP_HDR_LEN) {
            need = MG_SP_HDR_LEN - avail;
            break;
        }
        struct mg_sp_hdr h;
        mg_sp_hdr_decode(p, &h);
        if (mg_sp_hdr_check(&h, 0)) {
            /* An oversized length: the stream cannot be followed any further. */
            reply_status(c, MG_SP_ERROR, h.id, MG_SP_TOOBIG);
            conn_close_after_flush(c);
            break;
        }
        if (avail < MG_SP_HDR_LEN + (size_t)h.len) {
            need = MG_SP_HDR_LEN + (size_t)h.len - avail;
            break;
        }
        handle_request(s, c, &h, p + MG_SP_HDR_LEN);
        c->ipos += MG_SP_HDR_LEN + h.len;
        c->frame_start_ms = 0;
    }
    if (c->ipos == c->ilen) {
        c->ipos = c->ilen = 0;
    } else if (c->ipos > 0 && (need || c->ipos >= c->icap / 2)) {
        memmove(c->ibuf, c->ibuf + c->ipos, c->ilen - c->ipos);
        c->ilen -= c->ipos;
        c->ipos = 0;
    }
    if (c->ilen > c->ipos && !c->frame_start_ms)
        c->frame_start_ms = mg_now_ms();
    else if (c->ilen == c->ipos)
        c->frame_start_ms = 0;
    return need;
}

static int ibuf_resize(struct mg_store_server *s, struct conn *c, size_t cap)
{
    if (cap > c->icap && s->buffered + (cap - c->icap) > s->max_buffer)
        return -ENOSPC;
    uint8_t *p = realloc(c->ibuf, cap);
    if (!p)
        return -ENOMEM;
    s->buffered = s->buffered - c->icap + cap;
    c->ibuf = p;
    c->icap = cap;
    return 0;
}

static void conn_read(struct mg_store_server *s, struct conn *c)
{
    size_t budget = s->read_budget, need = 0;
    while (c->closing == CL_OPEN && !backpressured(c) && budget) {
        if (c->ilen == c->icap) {
            /* Grow only towards what the message in progress needs, and in
             * steps, so a declared length costs nothing until bytes arrive. */
            size_t want = c->ilen + (need ? need : IBUF_MIN);
            size_t step = c->icap < 65536 ? 65536 : c->icap * 2;
            if (want > step)
                want = step;
            if (ibuf_resize(s, c, want)) {
                reply_status(c, MG_SP_ERROR, 0, MG_SP_NOSPACE);
                conn_close_after_flush(c);
                return;
            }
        }
        size_t room = c->icap - c->ilen;
        if (room > budget)
            room = budget;
        ssize_t n = recv(c->fd, c->ibuf + c->ilen, room, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                conn_kill(c);
            break;
        }
        if (n == 0) {
            conn_kill(c);
            break;
        }
        c->ilen += (size_t)n;
        budget -= (size_t)n;
        c->last_rx_ms = mg_now_ms();
        need = process_input(s, c);
    }
    /* Give back a large buffer once its frame is done. */
    if (c->closing != CL_DEAD && c->icap > IBUF_MIN && c->ilen - c->ipos <= IBUF_MIN / 2 && !need) {
        if (c->ipos) {
            memmove(c->ibuf, c->ibuf + c->ipos, c->ilen - c->ipos);
            c->ilen -= c->ipos;
            c->ipos = 0;
        }
        ibuf_resize(s, c, IBUF_MIN);
    }
}

static int byfd_put(struct mg_store_server *s, int fd, struct conn *c)
{
    if (fd >= s->byfd_cap) {
        int cap = s->byfd_cap ? s->byfd_cap : 64;
        while (cap <= fd)
            cap *= 2;
        struct conn **t = realloc(s->byfd, (size_t)cap * sizeof(*t));
        if (!t)
            return -ENOMEM;
        memset(t + s->byfd_cap, 0, (size_t)(cap - s->byfd_cap) * sizeof(*t));
        s->byfd = t;
        s->byfd_cap = cap;
    }
    s->byfd[fd] = c;
    return 0;
}

static void accept_some(struct mg_store_server *s)
{
    for (int i = 0; i < ACCEPT_BURST && s->nconns < s->max_clients; i++) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                s->accept_pause_until = mg_now_ms() + 100;
            return;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        struct conn *c = calloc(1, sizeof(*c));
        if (!c) {
            close(fd);
            continue;
        }
        if (byfd_put(s, fd, c) || ibuf_resize(s, c, IBUF_MIN)) {
            if (fd < s->byfd_cap)
                s->byfd[fd] = NULL;
            s->buffered -= c->icap;
            free(c->ibuf);
            free(c);
            close(fd);
            continue;
        }
        /* Too many half-open handshakes: the oldest makes room. */
        if (s->nhs >= MAX_HANDSHAKING && !TAILQ_EMPTY(&s->hs)) {
            struct conn *old = TAILQ_FIRST(&s->hs);
            hs_unlink(old);
            conn_drop(old);
        }
        c->srv = s;
        c->fd = fd;
        c->state = ST_HELLO;
        c->deadline_ms = mg_now_ms() + s->handshake_ms;
        LIST_INSERT_HEAD(&s->conns, c, link);
        s->nconns++;
        c->in_hs = 1;
        TAILQ_INSERT_TAIL(&s->hs, c, hslink);
        s->nhs++;
    }
}

/* Flushes the connections that got output and tears down the dead ones, until
 * neither list has anything (a teardown wakes other connections' waiters). */
static void settle(struct mg_store_server *s)
{
    while (s->dirty || s->dead) {
        while (s->dirty) {
            struct conn *c = s->dirty;
            s->dirty = c->dnext;
            c->dirty = 0;
            if (c->closing != CL_DEAD)
                conn_flush(c);
        }
        while (s->dead) {
            struct conn *c = s->dead;
            s->dead = c->knext;
            conn_teardown(c);
        }
    }
}

static void run_timers(struct mg_store_server *s)
{
    int64_t now = mg_now_ms();
    while (s->nheap && s->heap[0]->deadline_ms <= now) {
        struct waiter *w = s->heap[0];
        answer(s, w->conn, w->op, w->id, NULL, MG_SP_TIMEDOUT);
        waiter_free(s, w);
    }
    struct conn *c;
    LIST_FOREACH(c, &s->conns, link) {
        if (c->closing == CL_DEAD)
            continue;
        if (c->deadline_ms && now >= c->deadline_ms) {
            conn_drop(c); /* handshake too slow, or a final error nobody reads */
        } else if (c->state == ST_READY && c->lease_ms &&
                   now - c->last_rx_ms >= (int64_t)c->lease_ms) {
            /* Bytes that arrived after poll() returned are not silence. */
            int pending = 0;
            if (ioctl(c->fd, FIONREAD, &pending) == 0 && pending > 0) {
                c->last_rx_ms = now;
                continue;
            }
            s->leases_expired++;
            conn_drop(c);
        } else if (c->frame_start_ms && !backpressured(c) &&
                   now - c->frame_start_ms >= s->frame_ms) {
            conn_drop(c); /* a frame begun and never finished */
        }
    }
}

static int timeout_locked(const struct mg_store_server *s)
{
    int64_t next = -1, now = mg_now_ms();
#define CONSIDER(t)                                                                                \
    do {                                                                                           \
        int64_t t_ = (t);                                                                          \
        if (next < 0 || t_ < next)                                                                 \
            next = t_;                                                                             \
    } while (0)
    if (s->nheap)
        CONSIDER(s->heap[0]->deadline_ms);
    if (s->accept_pause_until > now)
        CONSIDER(s->accept_pause_until);
    const struct conn *c;
    LIST_FOREACH(c, &s->conns, link) {
        if (c->deadline_ms)
            CONSIDER(c->deadline_ms);
        if (c->state == ST_READY && c->lease_ms)
            CONSIDER(c->last_rx_ms + c->lease_ms);
        if (c->frame_start_ms && !backpressured(c))
            CONSIDER(c->frame_start_ms + s->frame_ms);
    }
#undef CONSIDER
    if (next < 0)
        return -1;
    if (next <= now)
        return 0;
    return next - now > 1000000 ? 1000000 : (int)(next - now);
}

/* ---- public API --------------------------------------------------------------------- */

static void lock(const struct mg_store_server *s)
{
    pthread_mutex_lock((pthread_mutex_t *)&s->lock);
}

static void unlock(const struct mg_store_server *s)
{
    pthread_mutex_unlock((pthread_mutex_t *)&s->lock);
}

int mg_store_server_start(struct mg_store_server **out, const struct mg_store_server_opts *o)
{
    struct mg_store_server *s;
    int rc;

    *out = NULL;
    if (o->token && strlen(o->token) > MG_STORE_MAX_TOKEN)
        return -MG_ETOOBIG;
    s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->lfd = s->wakefd = -1;
    TAILQ_INIT(&s->tombs);
    TAILQ_INIT(&s->hs);
    s->max_clients = o->max_clients > 0 ? o->max_clients : DEF_MAX_CLIENTS;
    s->max_waiters = o->max_waiters > 0 ? o->max_waiters : DEF_MAX_WAITERS;
    s->max_store = o->max_store_bytes ? o->max_store_bytes : DEF_MAX_STORE;
    s->max_buffer = o->max_buffer_bytes ? o->max_buffer_bytes : DEF_MAX_BUFFER;
    s->handshake_ms = o->handshake_timeout_ms > 0 ? o->handshake_timeout_ms : DEF_HANDSHAKE_MS;
    s->frame_ms = o->frame_timeout_ms > 0 ? o->frame_timeout_ms : DEF_FRAME_MS;
    s->read_budget = o->read_bytes_per_turn ? o->read_bytes_per_turn : READ_BUDGET;
    if (o->token && *o->token && !(s->token = strdup(o->token))) {
        rc = -ENOMEM;
        goto fail_free;
    }
    if (getrandom(s->sipkey, sizeof(s->sipkey), 0) != (ssize_t)sizeof(s->sipkey)) {
        rc = -errno;
        goto fail_free;
    }
    s->nbuckets = 256;
    s->table = calloc(s->nbuckets, sizeof(*s->table));
    if (!s->table) {
        rc = -ENOMEM;
        goto fail_free;
    }
    if ((rc = pthread_mutex_init(&s->lock, NULL))) {
        rc = -rc;
        goto fail_free;
    }
    s->local = calloc(1, sizeof(*s->local));
    if (!s->local) {
        rc = -ENOMEM;
        goto fail_mutex;
    }
    s->local->srv = s;
    s->local->fd = -1;
    s->local->state = ST_READY;
    s->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->wakefd < 0) {
        rc = -errno;
        goto fail_local;
    }
    if (o->listen_fd > 0) {
        s->lfd = o->listen_fd;
        rc = mg_set_nonblock(s->lfd, 1);
        if (rc)
            goto fail_wake;
        int port = mg_sock_local_port(s->lfd);
        if (port > 0)
            s->port = port;
    } else {
        rc = mg_listen_tcp(o->host, o->port, 1024, &s->port);
        if (rc < 0)
            goto fail_wake;
        s->lfd = rc;
        s->own_lfd = 1;
        rc = mg_set_nonblock(s->lfd, 1);
        if (rc)
            goto fail_listen;
    }
    *out = s;
    return 0;

fail_listen:
    close(s->lfd);
fail_wake:
    close(s->wakefd);
fail_local:
    free(s->local);
fail_mutex:
    pthread_mutex_destroy(&s->lock);
fail_free:
    free(s->table);
    free(s->token);
    free(s);
    return rc;
}

int mg_store_server_port(const struct mg_store_server *srv)
{
    return srv->port;
}

int mg_store_server_nfds(const struct mg_store_server *s)
{
    lock(s);
    int n = 2 + s->nconns;
    unlock(s);
    return n;
}

static int pollfds_locked(struct mg_store_server *s, struct pollfd *fds, int max)
{
    int n = 0;
    if (max < 2 + s->nconns)
        return -ENOSPC;
    fds[n++] = (struct pollfd){.fd = s->wakefd, .events = POLLIN};
    if (s->nconns < s->max_clients && mg_now_ms() >= s->accept_pause_until)
        fds[n++] = (struct pollfd){.fd = s->lfd, .events = POLLIN};
    struct conn *c;
    LIST_FOREACH(c, &s->conns, link) {
        short ev = 0;
        if (c->closing == CL_DEAD)
            continue;
        if (!backpressured(c))
            ev |= POLLIN;
        if (c->ohead)
            ev |= POLLOUT;
        fds[n++] = (struct pollfd){.fd = c->fd, .events = ev};
    }
    return n;
}

int mg_store_server_pollfds(struct mg_store_server *s, struct pollfd *fds, int max)
{
    lock(s);
    int n = pollfds_locked(s, fds, max);
    unlock(s);
    return n;
}

static void process_locked(struct mg_store_server *s, const struct pollfd *fds, int n)
{
    int accept_ready = 0;
    for (int i = 0; i < n; i++) {
        short re = fds[i].revents;
        int fd = fds[i].fd;
        if (!re || fd < 0)
            continue;
        if (fd == s->wakefd) {
            uint64_t v;
            while (read(s->wakefd, &v, sizeof(v)) > 0)
                ;
            continue;
        }
        if (fd == s->lfd) {
            accept_ready = 1; /* after the clients: no fd is reused under their events */
            continue;
        }
        struct conn *c = fd < s->byfd_cap ? s->byfd[fd] : NULL;
        if (!c || c->closing == CL_DEAD)
            continue;
        if (re & POLLOUT)
            conn_flush(c);
        if (re & (POLLERR | POLLNVAL)) {
            conn_kill(c);
            continue;
        }
        if (re & (POLLIN | POLLHUP)) {
            if (backpressured(c) && (re & POLLHUP))
                conn_kill(c);
            else
                conn_read(s, c);
        }
    }
    if (accept_ready)
        accept_some(s);
    run_timers(s);
    settle(s);
}

int mg_store_server_process(struct mg_store_server *s, const struct pollfd *fds, int n)
{
    lock(s);
    process_locked(s, fds, n);
    unlock(s);
    return 0;
}

int mg_store_server_timeout_ms(const struct mg_store_server *s)
{
    lock(s);
    int t = timeout_locked(s);
    unlock(s);
    return t;
}

/* After a change made outside the loop (a local set, or release), the loop
 * may need to watch for POLLOUT: wake it so it rebuilds its pollfds. */
static void wake_loop(struct mg_store_server *s)
{
    uint64_t one = 1;
    ssize_t rc = write(s->wakefd, &one, sizeof(one));
    (void)rc;
}

static void *serve(void *arg)
{
    struct mg_store_server *s = arg;
    for (;;) {
        lock(s);
        if (s->stop) {
            unlock(s);
            break;
        }
        int need = 2 + s->nconns;
        if (need > s->tfds_cap) {
            int cap = need * 2;
            struct pollfd *p = realloc(s->tfds, (size_t)cap * sizeof(*p));
            if (p) {
                s->tfds = p;
                s->tfds_cap = cap;
            }
        }
        int n = pollfds_locked(s, s->tfds, s->tfds_cap);
        int timeout = timeout_locked(s);
        unlock(s);
        if (n < 0) { /* out of memory for the pollfds: retry shortly */
            poll(NULL, 0, 10);
            continue;
        }
        int rc = poll(s->tfds, (nfds_t)n, timeout);
        if (rc < 0 && errno != EINTR) {
            poll(NULL, 0, 10);
            continue;
        }
        lock(s);
        process_locked(s, s->tfds, rc > 0 ? n : 0);
        unlock(s);
    }
    return NULL;
}

int mg_store_server_start_thread(struct mg_store_server *s)
{
    if (s->has_thread)
        return -EBUSY;
    int rc = pthread_create(&s->thread, NULL, serve, s);
    if (rc)
        return -rc;
    s->has_thread = 1;
    return 0;
}

/* ---- local calls (the hosting process) ------------------------------------------------- */

/* Checks a key from a local caller; its length in *klen. */
static int local_key(const char *key, size_t *klen, int is_prefix)
{
    if (!key)
        return -EINVAL;
    *klen = strlen(key);
    return mg_sp_key_check((const uint8_t *)key, *klen, is_prefix);
}

static int local_value(const void *val, size_t len)
{
    if (len > MG_STORE_MAX_VALUE)
        return -MG_ETOOBIG;
    return len && !val ? -EINVAL : 0;
}

/* After a local change: send what it queued for the clients it woke. A
 * serving thread may then need to watch for POLLOUT: wake it so it rebuilds
 * its pollfds (a caller's loop rebuilds them every turn anyway). */
static void local_done(struct mg_store_server *s)
{
    settle(s);
    struct conn *c;
    LIST_FOREACH(c, &s->conns, link)
        if (c->ohead) {
            wake_loop(s);
            break;
        }
}

static int copy_out(const struct blob *b, void **val, size_t *len)
{
    if (!val)
        return 0;
    size_t n = b ? b->len : 0;
    char *p = malloc(n + 1);
    if (!p)
        return -ENOMEM;
    if (n)
        memcpy(p, b->data, n);
    p[n] = '\0';
    *val = p;
    if (len)
        *len = n;
    return 0;
}

int mg_store_server_set(struct mg_store_server *s, const char *key, const void *val, size_t len)
{
    return mg_store_server_local_set(s, key, val, len, 0);
}

int mg_store_server_get(struct mg_store_server *s, const char *key, void *buf, size_t cap,
                        size_t *len)
{
    size_t klen;
    int rc = local_key(key, &klen, 0);
    if (rc)
        return rc;
    lock(s);
    struct entry *e = lookup(s, (const uint8_t *)key, klen);
    if (!e || !e->val) {
        rc = -MG_ENOKEY;
    } else {
        if (len)
            *len = e->val->len;
        if (e->val->len > cap)
            rc = -ENOSPC;
        else if (e->val->len)
            memcpy(buf, e->val->data, e->val->len);
    }
    unlock(s);
    return rc;
}

int mg_store_server_local_set(struct mg_store_server *s, const char *key, const void *val,
                              size_t len, int flags)
{
    size_t klen;
    struct entry *e;
    int rc = local_key(key, &klen, 0);
    if (!rc)
        rc = local_value(val, len);
    if (!rc && (flags & ~MG_STORE_EPHEMERAL))
        rc = -EINVAL;
    if (rc)
        return rc;
    lock(s);
    uint16_t st = op_set(s, (const uint8_t *)key, klen, val, len,
                         (flags & MG_STORE_EPHEMERAL) ? s->local : NULL, &e);
    local_done(s);
    unlock(s);
    return mg_sp_status_err(st);
}

int mg_store_server_local_get(struct mg_store_server *s, const char *key, void **val, size_t *len,
                              int64_t *rev)
{
    size_t klen;
    int rc = local_key(key, &klen, 0);
    if (rc)
        return rc;
    lock(s);
    struct entry *e = lookup(s, (const uint8_t *)key, klen);
    if (rev)
        *rev = entry_rev(s, e);
    if (e && e->val)
        rc = copy_out(e->val, val, len);
    else
        rc = -MG_ENOKEY;
    unlock(s);
    return rc;
}

int mg_store_server_local_add(struct mg_store_server *s, const char *key, int64_t delta,
                              int64_t *result)
{
    size_t klen;
    struct entry *e;
    int64_t sum = 0;
    int rc = local_key(key, &klen, 0);
    if (rc)
        return rc;
    lock(s);
    uint16_t st = op_add(s, (const uint8_t *)key, klen, delta, &sum, &e);
    local_done(s);
    unlock(s);
    if (!st && result)
        *result = sum;
    return mg_sp_status_err(st);
}

int mg_store_server_local_compare_set(struct mg_store_server *s, const char *key,
                                      const void *expected, size_t expected_len,
                                      const void *desired, size_t desired_len, void **current,
                                      size_t *current_len)
{
    size_t klen;
    struct entry *e;
    int swapped = 0;
    int rc = local_key(key, &klen, 0);
    if (!rc)
        rc = local_value(desired, desired_len);
    if (!rc && expected)
        rc = local_value(expected, expected_len);
    if (rc)
        return rc;
    if (current)
        *current = NULL;
    if (current_len)
        *current_len = 0;
    lock(s);
    uint16_t st = op_cas(s, (const uint8_t *)key, klen, !expected, expected, expected_len, desired,
                         desired_len, &e, &swapped);
    if (!st && current && e && e->val)
        rc = copy_out(e->val, current, current_len);
    local_done(s);
    unlock(s);
    if (st)
        return mg_sp_status_err(st);
    return rc ? rc : swapped;
}

int mg_store_server_local_delete(struct mg_store_server *s, const char *key)
{
    size_t klen;
    int rc = local_key(key, &klen, 0);
    if (rc)
        return rc;
    lock(s);
    rc = op_delete(s, (const uint8_t *)key, klen);
    local_done(s);
    unlock(s);
    return rc;
}

int mg_store_server_local_list(struct mg_store_server *s, const char *prefix, int max, char ***keys,
                               int *nkeys)
{
    struct entry **all = NULL;
    size_t plen, n = 0;
    char **out = NULL;
    int rc = local_key(prefix ? prefix : "", &plen, 1), take = 0;
    *keys = NULL;
    *nkeys = 0;
    if (rc)
        return rc;
    if (max < 0 || max > MG_STORE_MAX_LIST)
        max = MG_STORE_MAX_LIST;
    lock(s);
    uint16_t st = op_list(s, (const uint8_t *)(prefix ? prefix : ""), plen, &all, &n);
    if (st) {
        rc = mg_sp_status_err(st);
        goto out;
    }
    take = n < (size_t)max ? (int)n : max;
    out = calloc(take ? (size_t)take : 1, sizeof(*out));
    if (!out) {
        rc = -ENOMEM;
        goto out;
    }
    for (int i = 0; i < take; i++) {
        out[i] = strndup((const char *)all[i]->key, all[i]->klen);
        if (!out[i]) {
            mg_store_free_list(out, i);
            out = NULL;
            rc = -ENOMEM;
            goto out;
        }
    }
    *keys = out;
    *nkeys = take;
    rc = n > INT32_MAX ? INT32_MAX : (int)n;
out:
    unlock(s);
    free(all);
    return rc;
}

/* An address and port, with IPv4-mapped IPv6 addresses (a dual-stack
 * listener's view of an IPv4 peer) as IPv4, for comparisons. */
static int endpoint_of(const struct sockaddr_storage *ss, uint8_t addr[16], int *port)
{
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    memset(addr, 0, 16);
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        memcpy(addr + 12, &a->sin_addr, 4);
        *port = ntohs(a->sin_port);
        return 4;
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        memcpy(addr, &a->sin6_addr, 16);
        *port = ntohs(a->sin6_port);
        if (memcmp(addr, mapped, 12) == 0) {
            memset(addr, 0, 12);
            return 4;
        }
        return 6;
    }
    return -1;
}

int mg_store_server_is_own_peer(struct mg_store_server *s, int fd, int timeout_ms)
{
    struct sockaddr_storage me, peer;
    socklen_t len = sizeof(me);
    uint8_t a[16], b[16];
    int pa, pb, fa, found = 0;
    int64_t deadline = mg_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);

    if (getsockname(fd, (struct sockaddr *)&me, &len) < 0)
        return -errno;
    fa = endpoint_of(&me, a, &pa);
    for (;;) {
        lock(s);
        accept_some(s);
        struct conn *c;
        LIST_FOREACH(c, &s->conns, link) {
            len = sizeof(peer);
            if (c->closing == CL_DEAD || getpeername(c->fd, (struct sockaddr *)&peer, &len) < 0)
                continue;
            found = endpoint_of(&peer, b, &pb) == fa && pa == pb && memcmp(a, b, 16) == 0;
            if (found)
                break;
        }
        unlock(s);
        if (found || mg_now_ms() >= deadline)
            return found;
        struct pollfd p = {.fd = s->lfd, .events = POLLIN};
        poll(&p, 1, mg_ms_until(deadline));
    }
}

void mg_store_server_local_drop(struct mg_store_server *s)
{
    lock(s);
    while (!LIST_EMPTY(&s->local->eph))
        entry_delete(s, LIST_FIRST(&s->local->eph));
    local_done(s);
    unlock(s);
}

int64_t mg_store_server_revision(const struct mg_store_server *s)
{
    lock(s);
    int64_t rev = s->rev;
    unlock(s);
    return rev;
}

void mg_store_server_stats(struct mg_store_server *s, struct mg_store_server_stats *st)
{
    lock(s);
    st->clients = s->nconns;
    st->waiters = s->nwaiters;
    st->keys = s->nlive;
    st->stored_bytes = s->stored;
    st->buffer_bytes = s->buffered;
    st->revision = s->rev;
    st->dropped = s->dropped;
    st->leases_expired = s->leases_expired;
    unlock(s);
}

void mg_store_server_release(struct mg_store_server *s)
{
    if (!s)
        return;
    if (s->has_thread) {
        lock(s);
        s->stop = 1;
        unlock(s);
        wake_loop(s);
        pthread_join(s->thread, NULL);
    }
    /* Tear down without waking anyone: every connection goes. */
    while (!LIST_EMPTY(&s->conns)) {
        struct conn *c = LIST_FIRST(&s->conns);
        while (!LIST_EMPTY(&c->eph))
            owner_unlink(LIST_FIRST(&c->eph));
        while (!LIST_EMPTY(&c->waiters))
            waiter_free(s, LIST_FIRST(&c->waiters));
        c->closing = CL_DEAD;
        conn_teardown(c);
    }
    for (size_t i = 0; i < s->nbuckets; i++) {
        for (struct entry *e = s->table[i], *next; e; e = next) {
            next = e->hnext;
            blob_unref(s, e->val);
            free(e);
        }
    }
    free(s->local);
    free(s->table);
    free(s->heap);
    free(s->byfd);
    free(s->tfds);
    free(s->token);
    if (s->own_lfd)
        close(s->lfd);
    close(s->wakefd);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
