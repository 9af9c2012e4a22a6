/* The mg store (common/store.h) as a rendezvous key-value backend: the
 * client side of --rdzv_backend c10d and static. Ephemeral keys belong to
 * the connection, whose lease the keepalive op renews. */
#include "kv_store.h"
#include "mg_err.h"
#include "net.h"
#include "store.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kv_store {
    struct mg_kv kv; /* first */
    struct mg_store *st;
    struct mg_store_opts o;
    char host[MG_HOST_MAX];
    char token[MG_STORE_MAX_TOKEN + 1];
    char where[MG_HOST_MAX + 32];
    /* The watch kwatch left parked on the server, if any (see kv.h's watch):
     * its key and revision, and until when it stays parked. */
    int parked;
    int64_t park_since, park_until;
    char park_key[MG_KV_MAX_KEY + 1];
};

/* The client, told the current abort_fd. */
static struct mg_store *client(struct kv_store *s)
{
    mg_store_set_abort_fd(s->st, s->kv.abort_fd);
    s->parked = 0; /* any call drops the parked watch */
    return s->st;
}

static int fail(struct kv_store *s, const char *op, int rc)
{
    const char *why = mg_strerror(rc);
    if (rc == -EINTR)
        why = "interrupted (a signal)";
    else if (rc == -MG_ECLOSED)
        why = "the connection closed (did the agent hosting the store exit?)";
    else if (rc == -MG_EAUTH)
        why = "authentication failed (the rendezvous token differs)";
    snprintf(s->kv.err, sizeof(s->kv.err), "store %s: %s: %s", s->where, op, why);
    return rc;
}

static int kget(struct mg_kv *kv, const char *key, char **val, size_t *len, int64_t *rev)
{
    struct kv_store *s = (struct kv_store *)kv;
    void *v = NULL;
    size_t n = 0;
    int64_t r = 0;
    /* A watch from revision -1 answers at once, with the revision. */
    int rc = mg_store_watch(client(s), key, -1, 0, &r, &v, &n);
    if (rc < 0)
        return fail(s, "get", rc);
    if (!v) {
        snprintf(kv->err, sizeof(kv->err), "store %s: no key %s", s->where, key);
        return -MG_ENOKEY;
    }
    if (rev)
        *rev = r;
    if (val)
        *val = v;
    else
        free(v);
    if (len)
        *len = n;
    return 0;
}

static int kset(struct mg_kv *kv, const char *key, const void *val, size_t len, int flags)
{
    struct kv_store *s = (struct kv_store *)kv;
    int rc =
        mg_store_set(client(s), key, val, len, flags & MG_KV_EPHEMERAL ? MG_STORE_EPHEMERAL : 0);
    return rc < 0 ? fail(s, "set", rc) : 0;
}

static int kcas(struct mg_kv *kv, const char *key, const void *expected, size_t elen,
                const void *desired, size_t dlen, int flags, char **cur, size_t *curlen)
{
    struct kv_store *s = (struct kv_store *)kv;
    void *c = NULL;
    size_t cl = 0;
    int rc = mg_store_compare_set(client(s), key, expected, elen, desired, dlen, cur ? &c : NULL,
                                  cur ? &cl : NULL);
    if (rc < 0)
        return fail(s, "compare_set", rc);
    if (cur)
        *cur = c;
    if (curlen)
        *curlen = cl;
    return rc;
}

static int kadd(struct mg_kv *kv, const char *key, int64_t delta, int64_t *result)
{
    struct kv_store *s = (struct kv_store *)kv;
    int rc = mg_store_add(client(s), key, delta, result);
    if (rc == -ERANGE)
        rc = -EINVAL;
    return rc < 0 ? fail(s, "add", rc) : 0;
}

static int kdel(struct mg_kv *kv, const char *key)
{
    struct kv_store *s = (struct kv_store *)kv;
    int rc = mg_store_delete(client(s), key);
    return rc < 0 ? fail(s, "delete", rc) : rc;
}

static int klist(struct mg_kv *kv, const char *prefix, int max, int want_values,
                 struct mg_kv_entry **out, int *count)
{
    struct kv_store *s = (struct kv_store *)kv;
    char **keys = NULL;
    int n = 0, rc;

    *out = NULL;
    *count = 0;
    if (max > MG_STORE_MAX_LIST)
        max = MG_STORE_MAX_LIST;
    rc = mg_store_list(client(s), prefix, max, &keys, &n);
    if (rc < 0)
        return fail(s, "list", rc);
    return mg_kv_entries_from_keys(kv, keys, n, want_values, out, count);
}

static int kwait(struct mg_kv *kv, const char *key, int64_t since_rev, int timeout_ms)
{
    struct kv_store *s = (struct kv_store *)kv;
    int64_t deadline = mg_now_ms() + timeout_ms, rev = 0;

    for (;;) {
        void *v = NULL;
        size_t n;
        int left = mg_ms_until(deadline);
        int rc = mg_store_watch(client(s), key, since_rev, left, &rev, &v, &n);
        if (rc == -ETIMEDOUT)
            return 0;
        if (rc < 0)
            return fail(s, "watch", rc);
        int exists = v != NULL;
        free(v);
        if (since_rev > 0 || exists)
            return 1;
        /* Waiting for the key to exist, and it reported a past deletion. */
        since_rev = rev;
        if (left == 0)
            return 0;
    }
}

static int kcount(struct mg_kv *kv, const char *prefix, int *n)
{
    struct kv_store *s = (struct kv_store *)kv;
    char **keys = NULL;
    int got = 0;
    int rc = mg_store_list(client(s), prefix, 0, &keys, &got); /* max 0: the total only */
    mg_store_free_list(keys, got);
    if (rc < 0)
        return fail(s, "list", rc);
    *n = rc;
    return 0;
}

static int kget_many(struct mg_kv *kv, const char *const *keys, int n, char **vals, size_t *lens,
                     int64_t *revs)
{
    struct kv_store *s = (struct kv_store *)kv;
    int rc = mg_store_get_many(client(s), keys, n, (void **)vals, lens, revs);
    return rc < 0 ? fail(s, "get", rc) : 0;
}

static int kset_many(struct mg_kv *kv, const char *const *keys, const char *const *vals,
                     const size_t *lens, int n)
{
    struct kv_store *s = (struct kv_store *)kv;
    int rc = mg_store_set_many(client(s), keys, (const void *const *)vals, lens, n, 0);
    return rc < 0 ? fail(s, "set", rc) : 0;
}

static int kdel_many(struct mg_kv *kv, const char *const *keys, int n)
{
    struct kv_store *s = (struct kv_store *)kv;
    int rc = mg_store_delete_many(client(s), keys, n);
    return rc < 0 ? fail(s, "delete", rc) : 0;
}

/* A wait that returns the value, and leaves its request parked on the
 * server (until park_ms from when it was sent) for the next call to take up
 * when this one's timeout_ms ends first. */
static int kwatch(struct mg_kv *kv, const char *key, int64_t since_rev, int timeout_ms, int park_ms,
                  char **val, size_t *len)
{
    struct kv_store *s = (struct kv_store *)kv;
    int64_t deadline = mg_now_ms() + timeout_ms;

    *val = NULL;
    for (;;) {
        int64_t now = mg_now_ms();
        if (!s->parked || s->park_since != since_rev || strcmp(s->park_key, key) != 0 ||
            now >= s->park_until) {
            int park = park_ms > timeout_ms ? park_ms : timeout_ms;
            int rc = mg_store_watch_begin(client(s), key, since_rev, park);
            if (rc < 0)
                return fail(s, "watch", rc);
            s->parked = 1;
            s->park_since = since_rev;
            s->park_until = now + park;
            snprintf(s->park_key, sizeof(s->park_key), "%s", key);
        }
        int64_t rev = 0;
        void *v = NULL;
        size_t n = 0;
        mg_store_set_abort_fd(s->st, s->kv.abort_fd);
        int rc = mg_store_watch_end(s->st, mg_ms_until(deadline), &rev, &v, &n);
        if (rc == -EAGAIN || rc == -EINTR)
            return rc == -EINTR ? fail(s, "watch", rc) : 0; /* still parked */
        s->parked = 0;
        if (rc == -ETIMEDOUT) {
            if (mg_now_ms() < deadline)
                continue; /* the server's part ended first: ask again */
            return 0;
        }
        if (rc < 0)
            return fail(s, "watch", rc);
        if (since_rev > 0 || v) {
            *val = v;
            if (len)
                *len = n;
            return 1;
        }
        /* Waiting for the key to exist, and it reported a past deletion. */
        free(v);
        since_rev = rev;
        if (mg_now_ms() >= deadline)
            return 0;
    }
}

static int kkeepalive(struct mg_kv *kv)
{
    struct kv_store *s = (struct kv_store *)kv;
    int rc = mg_store_ping(client(s));
    if (rc == -MG_ECLOSED) {
        /* Dropped (a lease that ran out while this agent stalled) or the
         * server is gone: reconnecting tells which. */
        struct mg_store *n = NULL;
        struct mg_store_opts o = s->o;
        o.connect_timeout_ms = 1000;
        int crc = mg_store_connect(&n, &o);
        if (crc == 0) {
            mg_store_release(s->st);
            s->st = n;
            snprintf(kv->err, sizeof(kv->err),
                     "store %s: the store dropped this agent's connection (its lease ran out)",
                     s->where);
            return -EKEYEXPIRED;
        }
        const char *why = mg_strerror(crc);
        if (crc == -ECONNREFUSED)
            why = "connection refused (nothing listens there)";
        else if (crc == -MG_EAUTH)
            why = "authentication failed (the rendezvous token differs)";
        snprintf(kv->err, sizeof(kv->err),
                 "store %s: the connection closed, and connecting again failed: %s", s->where, why);
        return rc;
    }
    return rc < 0 ? fail(s, "heartbeat", rc) : 0;
}

static void krelease(struct mg_kv *kv)
{
    struct kv_store *s = (struct kv_store *)kv;
    if (!s)
        return;
    mg_store_release(s->st);
    free(s);
}

static const struct mg_kv_ops store_ops = {
    .name = "store",
    .get = kget,
    .set = kset,
    .cas = kcas,
    .add = kadd,
    .del = kdel,
    .list = klist,
    .wait = kwait,
    .get_many = kget_many,
    .set_many = kset_many,
    .del_many = kdel_many,
    .watch = kwatch,
    .count = kcount,
    .keepalive = kkeepalive,
    .release = krelease,
};

int mg_kv_store_open(struct mg_kv **out, const struct mg_kv_store_opts *o, char *err, size_t errlen)
{
    struct kv_store *s = calloc(1, sizeof(*s));
    int rc;

    *out = NULL;
    if (!s)
        return -ENOMEM;
    s->kv.ops = &store_ops;
    s->kv.abort_fd = -1;
    snprintf(s->host, sizeof(s->host), "%s", o->host);
    snprintf(s->token, sizeof(s->token), "%s", o->token ? o->token : "");
    mg_format_hostport(s->where, sizeof(s->where), s->host, o->port);
    s->o.host = s->host;
    s->o.port = o->port;
    s->o.token = s->token[0] ? s->token : NULL;
    s->o.connect_timeout_ms = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 1;
    s->o.timeout_ms = o->timeout_ms;
    s->o.lease_ms = o->lease_ms;
    rc = mg_store_connect(&s->st, &s->o);
    if (rc < 0) {
        const char *why = mg_strerror(rc);
        if (rc == -MG_EAUTH)
            why = "authentication failed: the rendezvous token (--rdzv_conf token= or "
                  "MG_RDZV_TOKEN) differs from the store's, or one side has none";
        else if (rc == -ECONNREFUSED)
            why = "connection refused (no agent hosts the store there yet)";
        snprintf(err, errlen, "store %s: cannot connect: %s", s->where, why);
        free(s);
        return rc;
    }
    *out = &s->kv;
    return 0;
}

int mg_kv_store_fd(const struct mg_kv *kv)
{
    return mg_store_fd(((const struct kv_store *)kv)->st);
}
