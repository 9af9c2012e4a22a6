/* The store server's key table (store_server_internal.h): a SipHash-2-4 hash
 * table under a random per-server key, the ordered index of the live keys
 * that LIST reads, the memory accounting every stored byte goes through
 * (max_store), and the tombstones that keep a deleted key's revision for
 * watchers. It keeps: a key is in the index exactly while it has a value; an entry lives while it has a value, a
 * tombstone or a parked request; at most MAX_TOMBSTONES deletions are
 * remembered and a forgotten one raises compact_rev, so a key's revision
 * never goes backwards; every change raises the store's revision and wakes
 * the key's parked requests (mg_ss_wake). */
#include "store_server_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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

int mg_ss_charge(struct mg_store_server *s, size_t n)
{
    if (n > s->max_store || s->stored > s->max_store - n)
        return -ENOSPC;
    s->stored += n;
    return 0;
}

void mg_ss_uncharge(struct mg_store_server *s, size_t n)
{
    s->stored -= n;
}

/* A new value for a key whose value is now old (NULL: none). The old one's
 * bytes count as free when this key holds its only reference: it is about to
 * be replaced. */
struct blob *mg_ss_blob_new(struct mg_store_server *s, const void *data, size_t len,
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

void mg_ss_blob_unref(struct mg_store_server *s, struct blob *b)
{
    if (b && --b->refs == 0) {
        mg_ss_uncharge(s, sizeof(struct blob) + b->len);
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

struct entry *mg_ss_lookup(struct mg_store_server *s, const uint8_t *key, size_t klen)
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

struct entry *mg_ss_entry_get(struct mg_store_server *s, const uint8_t *key, size_t klen)
{
    uint64_t h = siphash(s->sipkey, key, klen);
    struct entry *e = entry_find(s, key, klen, h);
    if (e)
        return e;
    if (mg_ss_charge(s, ENTRY_OVERHEAD + klen))
        return NULL;
    e = calloc(1, sizeof(*e) + klen);
    if (!e) {
        mg_ss_uncharge(s, ENTRY_OVERHEAD + klen);
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
    mg_ss_uncharge(s, ENTRY_OVERHEAD + e->klen);
    free(e);
}

/* Frees an absent key once nothing needs it: no tombstone, no parked request. */
void mg_ss_entry_maybe_free(struct mg_store_server *s, struct entry *e)
{
    if (!e->val && !e->tomb && LIST_EMPTY(&e->waiters))
        entry_free(s, e);
}

/* The revision of a key's last change. For an absent key without a tombstone
 * that is unknown, but no later than compact_rev (the newest forgotten one). */
int64_t mg_ss_entry_rev(const struct mg_store_server *s, const struct entry *e)
{
    if (e && (e->val || e->tomb))
        return e->rev;
    return s->compact_rev;
}

/* ---- the ordered index ---------------------------------------------------------------
 * A treap of the live keys in byte order, each node's priority its keyed
 * hash: clients cannot predict it, so the tree stays about 2 log2(N) deep
 * whatever keys they choose. A LIST then costs the depth plus what it
 * returns, not every key of the store: at 10,000 nodes each listing the
 * members of a round, the difference is the whole join. */

static int key_order(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    int c = memcmp(a, b, alen < blen ? alen : blen);
    return c ? c : (alen > blen) - (alen < blen);
}

static struct entry *tree_insert(struct entry *t, struct entry *e)
{
    if (!t)
        return e;
    if (key_order(e->key, e->klen, t->key, t->klen) < 0) {
        t->tl = tree_insert(t->tl, e);
        if (t->tl->hash > t->hash) { /* rotate right */
            struct entry *l = t->tl;
            t->tl = l->tr;
            l->tr = t;
            return l;
        }
    } else {
        t->tr = tree_insert(t->tr, e);
        if (t->tr->hash > t->hash) { /* rotate left */
            struct entry *r = t->tr;
            t->tr = r->tl;
            r->tl = t;
            return r;
        }
    }
    return t;
}

static struct entry *tree_merge(struct entry *a, struct entry *b)
{
    if (!a || !b)
        return a ? a : b;
    if (a->hash > b->hash) {
        a->tr = tree_merge(a->tr, b);
        return a;
    }
    b->tl = tree_merge(a, b->tl);
    return b;
}

static struct entry *tree_remove(struct entry *t, struct entry *e)
{
    if (!t)
        return NULL;
    if (t == e) {
        struct entry *m = tree_merge(t->tl, t->tr);
        e->tl = e->tr = NULL;
        return m;
    }
    if (key_order(e->key, e->klen, t->key, t->klen) < 0)
        t->tl = tree_remove(t->tl, e);
    else
        t->tr = tree_remove(t->tr, e);
    return t;
}

/* The keys starting with the prefix form one run of the order: a key below
 * the prefix has its matches to the right, a key past the run to the left. */
static int tree_prefix(const struct entry *t, const uint8_t *prefix, size_t plen,
                       struct entry ***all, size_t *n, size_t *cap)
{
    while (t) {
        int below = key_order(t->key, t->klen, prefix, plen) < 0;
        int match = !below && t->klen >= plen && memcmp(t->key, prefix, plen) == 0;
        if (below) {
            t = t->tr;
            continue;
        }
        if (tree_prefix(t->tl, prefix, plen, all, n, cap))
            return -ENOMEM;
        if (!match)
            return 0;
        if (*n == *cap) {
            size_t c = *cap ? *cap * 2 : 64;
            struct entry **p = realloc(*all, c * sizeof(*p));
            if (!p)
                return -ENOMEM;
            *all = p;
            *cap = c;
        }
        (*all)[(*n)++] = (struct entry *)t;
        t = t->tr;
    }
    return 0;
}

int mg_ss_index_prefix(struct mg_store_server *s, const uint8_t *prefix, size_t plen,
                       struct entry ***out, size_t *n)
{
    size_t cap = 0;
    *out = NULL;
    *n = 0;
    if (tree_prefix(s->tree, prefix, plen, out, n, &cap)) {
        free(*out);
        *out = NULL;
        *n = 0;
        return -ENOMEM;
    }
    return 0;
}

/* ---- values, owners ------------------------------------------------------------------ */

void mg_ss_owner_unlink(struct entry *e)
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

/* Stores b (taking the caller's reference) at e. owner: the connection for an
 * ephemeral set, NULL for a persistent one; keep_owner: add and compare_set
 * leave the ownership as it was. */
void mg_ss_entry_store(struct mg_store_server *s, struct entry *e, struct blob *b,
                       struct conn *owner, int keep_owner)
{
    mg_ss_blob_unref(s, e->val);
    if (!e->val) {
        s->nlive++;
        s->tree = tree_insert(s->tree, e);
    }
    e->val = b;
    e->rev = ++s->rev;
    tomb_unlink(s, e);
    if (!keep_owner && e->owner != owner) {
        mg_ss_owner_unlink(e);
        if (owner)
            owner_link(e, owner);
    }
    mg_ss_wake(s, e);
}

void mg_ss_entry_delete(struct mg_store_server *s, struct entry *e)
{
    if (!e->val)
        return;
    mg_ss_blob_unref(s, e->val);
    e->val = NULL;
    s->nlive--;
    s->tree = tree_remove(s->tree, e);
    e->rev = ++s->rev;
    mg_ss_owner_unlink(e);
    e->tomb = 1;
    TAILQ_INSERT_TAIL(&s->tombs, e, tlink);
    s->ntombs++;
    mg_ss_wake(s, e);
    /* mg_ss_wake() may have freed nothing here: e is a tombstone. Forget the oldest
     * tombstones past the cap; their keys then report compact_rev. */
    while (s->ntombs > MAX_TOMBSTONES) {
        struct entry *old = TAILQ_FIRST(&s->tombs);
        if (old->rev > s->compact_rev)
            s->compact_rev = old->rev;
        tomb_unlink(s, old);
        mg_ss_entry_maybe_free(s, old);
    }
}
