/* What the store's requests mean (store_server_internal.h): the operations
 * (mg_ss_op_*) that the protocol's requests and the hosting process's local
 * calls share, the replies, and the parked requests (GET, WAIT, WATCH that
 * must wait) with their deadline heap. It keeps: one set of rules for remote
 * and local callers; a parked request is charged against max_store, bounded
 * per connection and per server, linked into its connection, the timer heap and
 * each of its keys, and leaves all of them at once, answered exactly once;
 * a reply's value goes out from the stored blob, never copied. */
#include "store_server_internal.h"
#include "net.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- replies ------------------------------------------------------------------------- */

void mg_ss_mark_dirty(struct conn *c)
{
    if (!c->dirty && c->closing != CL_DEAD) {
        c->dirty = 1;
        TAILQ_INSERT_TAIL(&c->srv->dirty, c, dlink);
    }
}

/* Queues hlen bytes of head, to be written by the caller into the returned
 * space, then the optional tail blob. NULL: the connection is gone (or was
 * dropped for want of memory). */
static uint8_t *queue_seg(struct conn *c, size_t hlen, struct blob *tail)
{
    if (c->closing == CL_DEAD)
        return NULL;
    struct oseg *o = malloc(sizeof(*o) + hlen);
    if (!o) {
        mg_ss_conn_kill(c);
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
    mg_ss_mark_dirty(c);
    return o->data;
}

void mg_ss_queue_raw(struct conn *c, const void *head, size_t hlen, struct blob *tail)
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

void mg_ss_reply_status(struct conn *c, uint8_t op, uint32_t id, uint16_t status)
{
    struct mg_sp_reply y = {.op = op, .id = id, .status = status};
    reply(c, &y, NULL);
}

/* ---- parked requests -------------------------------------------------------------- */

/* Unlinks the first n keys of w, one at a time: a key named twice keeps its
 * entry alive until its last link goes. */
static void wkeys_release(struct mg_store_server *s, struct waiter *w, int n)
{
    for (int i = 0; i < n; i++) {
        struct wkey *k = &w->keys[i];
        LIST_REMOVE(k, link);
        mg_ss_entry_maybe_free(s, k->e);
    }
}

void mg_ss_waiter_free(struct mg_store_server *s, struct waiter *w)
{
    wkeys_release(s, w, w->nkeys);
    mg_theap_remove(&s->wtimers, &w->timer);
    LIST_REMOVE(w, clink);
    w->conn->nwaiters--;
    s->nwaiters--;
    mg_ss_uncharge(s, w->charge);
    free(w);
}

static int waiter_satisfied(struct mg_store_server *s, struct waiter *w)
{
    switch (w->op) {
    case MG_SP_WATCH:
        return mg_ss_entry_rev(s, w->keys[0].e) > w->since;
    default: /* GET, WAIT: every key exists */
        for (int i = 0; i < w->nkeys; i++)
            if (!w->keys[i].e->val)
                return 0;
        return 1;
    }
}

/* Answers a request (parked or not) whose condition holds, or that timed out. */
void mg_ss_answer(struct mg_store_server *s, struct conn *c, uint8_t op, uint32_t id,
                  struct entry *e, uint16_t status)
{
    struct mg_sp_reply y = {.op = op, .id = id, .status = status};
    if (status != MG_SP_OK || op == MG_SP_WAIT) {
        reply(c, &y, NULL);
        return;
    }
    y.rev = mg_ss_entry_rev(s, e);
    if (e && e->val)
        y.flags = MG_SP_F_PRESENT;
    reply(c, &y, e ? e->val : NULL);
}

void mg_ss_wake(struct mg_store_server *s, struct entry *e)
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
        mg_ss_answer(s, w->conn, w->op, w->id, w->keys[0].e, MG_SP_OK);
        mg_ss_waiter_free(s, w);
        s->turn.woken++;
    }
}

/* Parks a request on keys (packed, or the single key). 0 or a status. */
static uint16_t park(struct mg_store_server *s, struct conn *c, const struct mg_sp_req *q)
{
    int nkeys = q->nkeys ? q->nkeys : 1;
    size_t size = sizeof(struct waiter) + (size_t)nkeys * sizeof(struct wkey);
    if (c->nwaiters >= MAX_CONN_WAITERS || s->nwaiters >= s->max_waiters)
        return MG_SP_BUSY;
    if (mg_theap_reserve(&s->wtimers, s->wtimers.n + 1))
        return MG_SP_NOSPACE; /* so that the push below cannot fail */
    if (mg_ss_charge(s, size))
        return MG_SP_NOSPACE;
    struct waiter *w = calloc(1, size);
    if (!w) {
        mg_ss_uncharge(s, size);
        return MG_SP_NOSPACE;
    }
    w->conn = c;
    w->id = q->id;
    w->op = q->op;
    w->since = q->num;
    w->charge = size;
    /* GET and WATCH carry one key and no packed list (q->keys is NULL, and
     * NULL + 0 is undefined behaviour). */
    const uint8_t *p = q->keys, *end = q->nkeys ? q->keys + q->keys_len : NULL;
    for (int i = 0; i < nkeys; i++) {
        const uint8_t *key = q->key;
        size_t klen = q->klen;
        if (q->nkeys)
            mg_sp_keys_next(&p, end, &key, &klen);
        struct entry *e = mg_ss_entry_get(s, key, klen);
        if (!e) {
            wkeys_release(s, w, i);
            mg_ss_uncharge(s, size);
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
    mg_theap_push(&s->wtimers, &w->timer, mg_now_ms() + q->timeout_ms);
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
        struct entry *e = mg_ss_lookup(s, key, klen);
        if (!e || !e->val)
            return 0;
    }
    return 1;
}

/* The operations themselves, shared by the protocol's requests and the
 * hosting process's local calls, so that both see one set of rules. Each
 * returns a protocol status (MG_SP_OK or an error). */

/* The live keys starting with prefix, sorted: *out (malloc'd, NULL when
 * none) holds all *total of them. */
uint16_t mg_ss_op_list(struct mg_store_server *s, const uint8_t *prefix, size_t plen,
                       struct entry ***out, size_t *total)
{
    return mg_ss_index_prefix(s, prefix, plen, out, total) ? MG_SP_NOSPACE : MG_SP_OK;
}

/* owner: the connection for an ephemeral set, NULL for a persistent one.
 * *ep: the key's entry, which survives (it holds a value). */
uint16_t mg_ss_op_set(struct mg_store_server *s, const uint8_t *key, size_t klen, const void *val,
                      size_t vlen, struct conn *owner, struct entry **ep)
{
    if (vlen > s->max_value)
        return MG_SP_TOOBIG;
    struct entry *e = mg_ss_entry_get(s, key, klen);
    struct blob *b = NULL;
    if (e) {
        b = mg_ss_blob_new(s, val, vlen, e->val);
    }
    if (!b) {
        if (e)
            mg_ss_entry_maybe_free(s, e);
        return MG_SP_NOSPACE;
    }
    mg_ss_entry_store(s, e, b, owner, 0);
    *ep = e;
    return MG_SP_OK;
}

uint16_t mg_ss_op_add(struct mg_store_server *s, const uint8_t *key, size_t klen, int64_t delta,
                      int64_t *sum, struct entry **ep)
{
    struct entry *e = mg_ss_entry_get(s, key, klen);
    int64_t cur;
    char text[24];
    if (!e)
        return MG_SP_NOSPACE;
    if (parse_int(e->val, &cur) || __builtin_add_overflow(cur, delta, sum)) {
        mg_ss_entry_maybe_free(s, e);
        return MG_SP_RANGE;
    }
    int n = snprintf(text, sizeof(text), "%lld", (long long)*sum);
    struct blob *b = mg_ss_blob_new(s, text, (size_t)n, e->val);
    if (!b) {
        mg_ss_entry_maybe_free(s, e);
        return MG_SP_NOSPACE;
    }
    mg_ss_entry_store(s, e, b, NULL, 1);
    *ep = e;
    return MG_SP_OK;
}

/* absent: the key must not exist (else its value must equal expected).
 * *ep: the key's entry afterwards (NULL when the key never existed),
 * *swapped whether it was set. */
uint16_t mg_ss_op_cas(struct mg_store_server *s, const uint8_t *key, size_t klen, int absent,
                      const void *expected, size_t elen, const void *desired, size_t dlen,
                      struct entry **ep, int *swapped)
{
    struct entry *e = mg_ss_lookup(s, key, klen);
    int match;
    *swapped = 0;
    *ep = NULL;
    if (dlen > s->max_value)
        return MG_SP_TOOBIG;
    if (absent)
        match = !e || !e->val;
    else
        match = e && e->val && e->val->len == elen && memcmp(e->val->data, expected, elen) == 0;
    if (match) {
        if (!e)
            e = mg_ss_entry_get(s, key, klen);
        struct blob *b = e ? mg_ss_blob_new(s, desired, dlen, e->val) : NULL;
        if (!b) {
            if (e)
                mg_ss_entry_maybe_free(s, e);
            return MG_SP_NOSPACE;
        }
        mg_ss_entry_store(s, e, b, NULL, 1);
        *swapped = 1;
    }
    *ep = e;
    return MG_SP_OK;
}

/* 1 when the key existed (and is now deleted). */
int mg_ss_op_delete(struct mg_store_server *s, const uint8_t *key, size_t klen)
{
    struct entry *e = mg_ss_lookup(s, key, klen);
    if (!e || !e->val)
        return 0;
    mg_ss_entry_delete(s, e);
    return 1;
}

/* A LIST reply's keys, built once per prefix, limit and revision: the nodes
 * of a round list the same members at the same revision, thousands of times,
 * and each reply then sends the one blob, as a GET sends the stored value.
 * NULL with *st set: no memory. */
static struct blob *list_keys(struct mg_store_server *s, const struct mg_sp_req *q, uint32_t *total,
                              uint32_t *take, uint16_t *st)
{
    struct mg_ss_list_cache *lc = &s->list_cache;
    if (lc->keys && lc->rev == s->rev && lc->max == q->max && lc->plen == q->klen &&
        memcmp(lc->prefix, q->key, q->klen) == 0) {
        *total = lc->total;
        *take = lc->take;
        return lc->keys;
    }
    struct entry **all;
    size_t n, bytes = 0;
    if ((*st = mg_ss_op_list(s, q->key, q->klen, &all, &n)))
        return NULL;
    size_t k = n < q->max ? n : q->max;
    for (size_t i = 0; i < k; i++)
        bytes += 2 + all[i]->klen;
    uint8_t *prefix = malloc(q->klen ? q->klen : 1);
    struct blob *b = NULL;
    if (prefix && !mg_ss_charge(s, sizeof(*b) + bytes)) {
        b = malloc(sizeof(*b) + bytes);
        if (!b)
            mg_ss_uncharge(s, sizeof(*b) + bytes);
    }
    if (!b) {
        free(prefix);
        free(all);
        *st = MG_SP_NOSPACE;
        return NULL;
    }
    b->refs = 1;
    b->len = bytes;
    uint8_t *p = b->data;
    for (size_t i = 0; i < k; i++)
        p += mg_sp_keys_put(p, all[i]->key, all[i]->klen);
    free(all);
    mg_ss_blob_unref(s, lc->keys);
    free(lc->prefix);
    if (q->klen)
        memcpy(prefix, q->key, q->klen);
    *lc = (struct mg_ss_list_cache){.keys = b,
                                    .prefix = prefix,
                                    .plen = q->klen,
                                    .rev = s->rev,
                                    .max = q->max,
                                    .total = (uint32_t)n,
                                    .take = (uint32_t)k};
    *total = lc->total;
    *take = lc->take;
    return b;
}

static void do_list(struct mg_store_server *s, struct conn *c, const struct mg_sp_req *q)
{
    struct mg_sp_reply y = {.op = MG_SP_LIST, .id = q->id};
    uint16_t st = MG_SP_OK;
    struct blob *keys = list_keys(s, q, &y.total, &y.nkeys, &st);
    if (!keys) {
        mg_ss_reply_status(c, MG_SP_LIST, q->id, st);
        return;
    }
    y.keys_len = keys->len;
    uint8_t *p = queue_seg(c, mg_sp_reply_head_size(&y), keys->len ? keys : NULL);
    if (p)
        mg_sp_reply_encode(p, &y, 0);
}

static void do_set(struct mg_store_server *s, struct conn *c, const struct mg_sp_req *q)
{
    struct mg_sp_reply y = {.op = MG_SP_SET, .id = q->id};
    struct entry *e;
    uint16_t st = mg_ss_op_set(s, q->key, q->klen, q->val, q->vlen,
                               (q->flags & MG_SP_F_EPHEMERAL) ? c : NULL, &e);
    if (st) {
        mg_ss_reply_status(c, MG_SP_SET, q->id, st);
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
    uint16_t st = mg_ss_op_add(s, q->key, q->klen, q->num, &sum, &e);
    if (st) {
        mg_ss_reply_status(c, MG_SP_ADD, q->id, st);
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
    uint16_t st = mg_ss_op_cas(s, q->key, q->klen, !!(q->flags & MG_SP_F_EXPECT_ABSENT), q->val,
                               q->vlen, q->val2, q->vlen2, &e, &swapped);
    if (st) {
        mg_ss_reply_status(c, MG_SP_CAS, q->id, st);
        return;
    }
    if (swapped)
        y.flags |= MG_SP_F_SWAPPED;
    y.rev = mg_ss_entry_rev(s, e);
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
        mg_ss_reply_status(c, q->op, q->id, st);
}

void mg_ss_handle_request(struct mg_store_server *s, struct conn *c, const struct mg_sp_hdr *h,
                          const uint8_t *body)
{
    struct mg_sp_req q;
    s->requests++;
    s->turn.requests++;
    int rc = mg_sp_req_decode(h, body, &q);
    if (rc) {
        mg_ss_reply_status(c, h->op, h->id, mg_sp_err_status(rc));
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
        e = mg_ss_lookup(s, q.key, q.klen);
        if (e && e->val)
            mg_ss_answer(s, c, q.op, q.id, e, MG_SP_OK);
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
        if (mg_ss_op_delete(s, q.key, q.klen))
            y.flags = MG_SP_F_PRESENT;
        y.rev = s->rev;
        reply(c, &y, NULL);
        break;
    case MG_SP_WATCH:
        e = mg_ss_lookup(s, q.key, q.klen);
        if (q.num < 0 || mg_ss_entry_rev(s, e) > q.num)
            mg_ss_answer(s, c, q.op, q.id, e, MG_SP_OK);
        else
            park_or_answer(s, c, &q, MG_SP_TIMEDOUT);
        break;
    case MG_SP_LIST:
        do_list(s, c, &q);
        break;
    }
}
