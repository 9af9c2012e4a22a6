/* The hosted store as an in-process rendezvous backend (kv_hosted.h). */
#include "kv_hosted.h"
#include "mg_err.h"
#include "net.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kv_hosted {
    struct mg_kv kv; /* first */
    struct mg_store_server *srv;
    char where[MG_HOST_MAX + 32];
};

static int fail(struct kv_hosted *l, const char *op, int rc)
{
    snprintf(l->kv.err, sizeof(l->kv.err), "store %s (hosted here): %s: %s", l->where, op,
             mg_strerror(rc));
    return rc;
}

static int lget(struct mg_kv *kv, const char *key, char **val, size_t *len, int64_t *rev)
{
    struct kv_hosted *l = (struct kv_hosted *)kv;
    void *v = NULL;
    size_t n = 0;
    int64_t r = 0;
    int rc = mg_store_server_local_get(l->srv, key, val ? &v : NULL, &n, &r);
    if (rc == -MG_ENOKEY) {
        snprintf(kv->err, sizeof(kv->err), "store %s: no key %s", l->where, key);
        return rc;
    }
    if (rc < 0)
        return fail(l, "get", rc);
    if (val)
        *val = v;
    if (len)
        *len = n;
    if (rev)
        *rev = r;
    return 0;
}

static int lset(struct mg_kv *kv, const char *key, const void *val, size_t len, int flags)
{
    struct kv_hosted *l = (struct kv_hosted *)kv;
    int rc = mg_store_server_local_set(l->srv, key, val, len,
                                       flags & MG_KV_EPHEMERAL ? MG_STORE_EPHEMERAL : 0);
    return rc < 0 ? fail(l, "set", rc) : 0;
}

static int lcas(struct mg_kv *kv, const char *key, const void *expected, size_t elen,
                const void *desired, size_t dlen, int flags, char **cur, size_t *curlen)
{
    struct kv_hosted *l = (struct kv_hosted *)kv;
    void *c = NULL;
    size_t cl = 0;
    int rc = mg_store_server_local_compare_set(l->srv, key, expected, elen, desired, dlen,
                                               cur ? &c : NULL, &cl);
    if (rc < 0)
        return fail(l, "compare_set", rc);
    if (cur)
        *cur = c;
    if (curlen)
        *curlen = cl;
    return rc;
}

static int ladd(struct mg_kv *kv, const char *key, int64_t delta, int64_t *result)
{
    struct kv_hosted *l = (struct kv_hosted *)kv;
    int rc = mg_store_server_local_add(l->srv, key, delta, result);
    if (rc == -ERANGE)
        rc = -EINVAL; /* as the other backends: not an integer */
    return rc < 0 ? fail(l, "add", rc) : 0;
}

static int ldel(struct mg_kv *kv, const char *key)
{
    struct kv_hosted *l = (struct kv_hosted *)kv;
    int rc = mg_store_server_local_delete(l->srv, key);
    return rc < 0 ? fail(l, "delete", rc) : rc;
}

static int llist(struct mg_kv *kv, const char *prefix, int max, int want_values,
                 struct mg_kv_entry **out, int *count)
{
    struct kv_hosted *l = (struct kv_hosted *)kv;
    char **keys = NULL;
    int n = 0, rc;

    *out = NULL;
    *count = 0;
    if (max > MG_KV_MAX_LIST)
        max = MG_KV_MAX_LIST;
    rc = mg_store_server_local_list(l->srv, prefix, max, &keys, &n);
    if (rc < 0)
        return fail(l, "list", rc);
    return mg_kv_entries_from_keys(kv, keys, n, want_values, out, count);
}

static int lcount(struct mg_kv *kv, const char *prefix, int *n)
{
    struct kv_hosted *l = (struct kv_hosted *)kv;
    char **keys = NULL;
    int got = 0;
    int rc = mg_store_server_local_list(l->srv, prefix, 0, &keys, &got); /* the total only */
    mg_store_free_list(keys, got);
    if (rc < 0)
        return fail(l, "list", rc);
    *n = rc;
    return 0;
}

/* Never blocks, whatever timeout_ms says: the caller's loop serves the
 * store, and calls again when it changed. */
static int lwait(struct mg_kv *kv, const char *key, int64_t since_rev, int timeout_ms)
{
    struct kv_hosted *l = (struct kv_hosted *)kv;
    int64_t rev = 0;
    int rc = mg_store_server_local_get(l->srv, key, NULL, NULL, &rev);
    if (rc < 0 && rc != -MG_ENOKEY)
        return fail(l, "watch", rc);
    if (since_rev <= 0)
        return rc == 0; /* waiting for the key to exist */
    return rev > since_rev;
}

static int lkeepalive(struct mg_kv *kv)
{
    return 0; /* the host's keys live as long as its process */
}

static void lrelease(struct mg_kv *kv)
{
    struct kv_hosted *l = (struct kv_hosted *)kv;
    if (!l)
        return;
    mg_store_server_local_drop(l->srv);
    free(l);
}

static const struct mg_kv_ops hosted_ops = {
    .name = "hosted",
    .get = lget,
    .set = lset,
    .cas = lcas,
    .add = ladd,
    .del = ldel,
    .list = llist,
    .wait = lwait,
    .count = lcount,
    .keepalive = lkeepalive,
    .release = lrelease,
};

int mg_kv_hosted_open(struct mg_kv **out, struct mg_store_server *srv, const char *where)
{
    struct kv_hosted *l = calloc(1, sizeof(*l));
    *out = NULL;
    if (!l)
        return -ENOMEM;
    l->kv.ops = &hosted_ops;
    l->kv.abort_fd = -1; /* nothing here blocks */
    l->srv = srv;
    snprintf(l->where, sizeof(l->where), "%s", where ? where : "hosted");
    *out = &l->kv;
    return 0;
}
