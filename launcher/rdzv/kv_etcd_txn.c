/* etcd's batched writes (kv.h's set_many and del_many, in transactions)
 * and count; split from kv_etcd.c, which holds the requests they share. */
#include "kv_etcd_internal.h"
#include "base64.h"
#include "http.h"
#include "json.h"
#include "mg_err.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Puts (vals) or deletes (vals NULL) of n keys in transactions of TXN_OPS
 * operations without a comparison: the closer of a round of thousands
 * writes its membership blocks and their index, and deletes an old round's
 * keys, in a few requests instead of one each (each a commit of etcd's). */
static int etcd_many(struct kv_etcd *e, const char *const *keys, const char *const *vals,
                     const size_t *lens, int n)
{
    for (int lo = 0; lo < n; lo += TXN_OPS) {
        int hi = lo + TXN_OPS < n ? lo + TXN_OPS : n;
        size_t payload = 0;
        for (int i = lo; i < hi; i++) {
            size_t kl = strlen(keys[i]);
            if (kl > MG_KV_MAX_KEY || (vals && lens[i] > MG_KV_MAX_VALUE))
                return -MG_ETOOBIG;
            payload += kl + (vals ? lens[i] : 0) + 64; /* base64 of each, and its JSON */
        }
        struct body b;
        if (etcd_body_begin(&b, payload) < 0)
            return -ENOMEM;
        mg_jsonw_key(&b.w, "success");
        mg_jsonw_arr_begin(&b.w);
        for (int i = lo; i < hi; i++) {
            size_t kl = strlen(keys[i]);
            mg_jsonw_obj_begin(&b.w);
            mg_jsonw_key(&b.w, vals ? "request_put" : "request_delete_range");
            mg_jsonw_obj_begin(&b.w);
            etcd_kb64(&b.w, "key", keys[i], kl, b.tmp);
            if (vals)
                etcd_kb64(&b.w, "value", vals[i], lens[i], b.tmp);
            mg_jsonw_obj_end(&b.w);
            mg_jsonw_obj_end(&b.w);
        }
        mg_jsonw_arr_end(&b.w);
        int rc = etcd_body_call(e, &b, "kv/txn");
        if (rc < 0)
            return rc;
    }
    return 0;
}

int etcd_set_many(struct mg_kv *kv, const char *const *keys, const char *const *vals,
                  const size_t *lens, int n)
{
    return etcd_many((struct kv_etcd *)kv, keys, vals, lens, n);
}

int etcd_del_many(struct mg_kv *kv, const char *const *keys, int n)
{
    return etcd_many((struct kv_etcd *)kv, keys, NULL, NULL, n);
}

/* The number of keys under prefix, without them (count_only): a node that
 * counts the live agents of a job of thousands gets a number, where a
 * listing is every agent's key, base64 in JSON, to each node. */
int etcd_count(struct mg_kv *kv, const char *prefix, int *n)
{
    struct kv_etcd *e = (struct kv_etcd *)kv;
    struct body b;
    size_t kl = strlen(prefix);
    char end[MG_KV_MAX_KEY + 1];

    *n = 0;
    if (kl > MG_KV_MAX_KEY)
        return -EINVAL;
    if (etcd_body_begin(&b, 2 * kl) < 0)
        return -ENOMEM;
    etcd_kb64(&b.w, "key", prefix, kl, b.tmp);
    size_t el = etcd_prefix_end(prefix, end);
    etcd_kb64(&b.w, "range_end", end, el, b.tmp);
    mg_jsonw_kbool(&b.w, "count_only", 1);
    int rc = etcd_body_call(e, &b, "kv/range");
    if (rc < 0)
        return rc;
    int64_t c = etcd_member_int(e, 0, "count"); /* proto3 JSON omits a count of 0 */
    *n = c > MG_KV_MAX_LIST ? MG_KV_MAX_LIST : (int)c;
    return 0;
}
