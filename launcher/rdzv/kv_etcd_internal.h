/* What kv_etcd.c, kv_etcd_watch.c and kv_etcd_txn.c share: the backend's
 * state and the request helpers (kv_etcd.c's). Not for other callers. */
#ifndef MG_KV_ETCD_INTERNAL_H
#define MG_KV_ETCD_INTERNAL_H

#include "http.h"
#include "json.h"
#include "kv_etcd.h"
#include "net.h"

#include <stddef.h>
#include <stdint.h>

#define WATCH_MSG_MAX (4u << 20) /* largest single watch message */
#define URL_MAX       (MG_HOST_MAX + 64)
#define TXN_OPS       64 /* operations in one transaction: etcd's default limit is 128 */

struct buf {
    char *p;
    size_t len, cap, max;
};

/* Watch stream state: the gateway sends one JSON message per line. */
struct watch {
    struct buf line;
    int created, changed, err;
    char msg[256];
};

/* A watch left open between calls (kv.h's watch with park_ms), on the
 * watch client, as mg_http_begin runs it. */
struct parked {
    int on;
    char key[MG_KV_MAX_KEY + 1];
    int64_t since_rev; /* as the caller gave it (0: to exist) */
    struct watch x;
    struct mg_http_request req;
    char url[URL_MAX + 64];
    char *body;
};

struct kv_etcd {
    struct mg_kv kv;       /* first: the ops see a struct mg_kv * */
    struct mg_http *http;  /* requests (keeps its connection) */
    struct mg_http *watch; /* watches (their connection is dropped when one ends) */
    char url[MG_KV_ETCD_MAX_ENDPOINTS][URL_MAX];
    int nurl, cur;
    const char *api; /* gateway prefix once known */
    int timeout_ms, lease_ttl_s;
    int64_t lease;
    struct mg_json doc; /* the last response, parsed */
    struct mg_json_tok *toks;
    int ntoks;
    struct parked park;
    uint64_t jitter; /* the pauses' random part (call) */
};

struct body {
    char *json, *tmp;
    size_t cap;
    struct mg_jsonw w;
};

/* kv_etcd.c */
__attribute__((format(printf, 2, 3))) void etcd_seterr(struct kv_etcd *e, const char *fmt, ...);
int etcd_http_fail(struct kv_etcd *e, const char *url, const char *op, int rc,
                   const struct mg_http_response *res);
void etcd_kb64(struct mg_jsonw *w, const char *name, const void *data, size_t n, char *tmp);
void etcd_kint64(struct mg_jsonw *w, const char *name, int64_t v);
int etcd_body_begin(struct body *b, size_t payload);
int etcd_body_end(struct body *b);
int etcd_body_call(struct kv_etcd *e, struct body *b, const char *path);
size_t etcd_prefix_end(const char *prefix, char *out);
int64_t etcd_member_int(struct kv_etcd *e, int obj, const char *name);
int etcd_get(struct mg_kv *kv, const char *key, char **val, size_t *len, int64_t *rev);

/* kv_etcd_watch.c */
void etcd_drop_park(struct kv_etcd *e);
int etcd_wait(struct mg_kv *kv, const char *key, int64_t since_rev, int timeout_ms);
int etcd_watch(struct mg_kv *kv, const char *key, int64_t since_rev, int timeout_ms, int park_ms,
               char **val, size_t *len);

/* kv_etcd_txn.c */
int etcd_set_many(struct mg_kv *kv, const char *const *keys, const char *const *vals,
                  const size_t *lens, int n);
int etcd_del_many(struct mg_kv *kv, const char *const *keys, int n);
int etcd_count(struct mg_kv *kv, const char *prefix, int *n);

#endif
