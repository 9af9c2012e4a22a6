/* The etcd v3 backend of the rendezvous, over the JSON gateway (see
 * kv_etcd.h); HTTP is common/http.c's. */
#include "kv_etcd.h"
#include "base64.h"
#include "http.h"
#include "json.h"
#include "mg_err.h"
#include "net.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RESP_MAX      (64u << 20) /* largest gateway response accepted */
#define WATCH_MSG_MAX (4u << 20)  /* largest single watch message */
#define ADD_MAX_TRIES 10000       /* compare-and-swap retries of one add under contention */
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

static void drop_park(struct kv_etcd *e)
{
    if (!e->park.on)
        return;
    mg_http_end(e->watch);
    free(e->park.body);
    free(e->park.x.line.p);
    memset(&e->park, 0, sizeof(e->park));
}

static const char *const api_prefixes[] = {"/v3/", "/v3beta/", "/v3alpha/"};

__attribute__((format(printf, 2, 3))) static void seterr(struct kv_etcd *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->kv.err, sizeof(e->kv.err), fmt, ap);
    va_end(ap);
}

/* ---- requests ---------------------------------------------------------------- */

/* What a failed request means for etcd, in words. */
static const char *hint(enum mg_http_fault f)
{
    switch (f) {
    case MG_HTTP_FAULT_TLS:
        return "; a TLS problem: check --rdzv_conf cacert, cert and key";
    case MG_HTTP_FAULT_CLOSED:
        return "; etcd closed the connection (stopped or restarting?)";
    case MG_HTTP_FAULT_TIMEOUT:
        return "; etcd did not answer in time";
    default:
        return "";
    }
}

/* Says which endpoint and request failed, and how; returns the code. */
static int http_fail(struct kv_etcd *e, const char *url, const char *op, int rc,
                     const struct mg_http_response *res)
{
    seterr(e, "etcd %s: %s: %s%s", url, op, res->error, hint(res->fault));
    return rc;
}

/* Sleeps ms, or less when abort_fd becomes readable: -EINTR then. */
static int nap(int abort_fd, int ms)
{
    struct pollfd p = {.fd = abort_fd, .events = POLLIN};
    int n = poll(&p, abort_fd >= 0 ? 1 : 0, ms);
    return n > 0 ? -EINTR : 0;
}

static int call_once(struct kv_etcd *e, const char *op, const char *body, size_t blen);

/* One POST to every endpoint in turn until one answers. On HTTP 200 the
 * parsed response is in e->doc. An etcd whose log runs more than 5,000
 * entries ahead of what it applied refuses writes with "etcdserver: too
 * many requests" until it caught up (10,000 nodes announcing themselves at
 * once): asked again after a pause, growing to a second, within the
 * request's bound. */
static int call(struct kv_etcd *e, const char *op, const char *body, size_t blen)
{
    int64_t end = mg_now_ms() + e->timeout_ms;
    int pause = 20;
    for (;;) {
        int rc = call_once(e, op, body, blen);
        if (rc != -EBUSY)
            return rc;
        /* a pause of pause/2 to pause: the refused do not come back together */
        e->jitter = e->jitter * 6364136223846793005u + 1442695040888963407u;
        int ms = pause / 2 + (int)((e->jitter >> 33) % (uint64_t)(pause / 2 + 1));
        if (mg_now_ms() + ms >= end)
            return -EIO; /* the words are in kv.err */
        if (nap(e->kv.abort_fd, ms) < 0) {
            seterr(e, "etcd %s: %s: interrupted (a signal)", e->url[e->cur], op);
            return -EINTR;
        }
        pause = pause * 2 > 1000 ? 1000 : pause * 2;
    }
}

static int call_once(struct kv_etcd *e, const char *op, const char *body, size_t blen)
{
    char url[URL_MAX + 64];
    int rc = -EIO;

    drop_park(e); /* kv.h: any other call drops a parked watch */
    for (int k = 0; k < e->nurl; k++) {
        int i = (e->cur + k) % e->nurl;
        int np = e->api ? 1 : (int)(sizeof(api_prefixes) / sizeof(api_prefixes[0]));
        for (int p = 0; p < np; p++) {
            const char *api = e->api ? e->api : api_prefixes[p];
            struct mg_http_request req = {
                .url = url,
                .body = body,
                .body_len = blen,
                .timeout_ms = e->timeout_ms,
                .abort_fd = e->kv.abort_fd,
            };
            struct mg_http_response res;

            snprintf(url, sizeof(url), "%s%s%s", e->url[i], api, op);
            int hrc = mg_http_request(e->http, &req, &res);
            if (hrc == -EINTR) {
                seterr(e, "etcd %s: %s: interrupted (a signal)", e->url[i], op);
                return -EINTR;
            }
            if (hrc < 0) {
                rc = http_fail(e, e->url[i], op, hrc, &res);
                break; /* this endpoint does not answer: try the next */
            }
            long status = res.status;
            if (status == 404 && !e->api) {
                seterr(e, "etcd %s: %s: HTTP 404 (no v3 JSON gateway at %s)", e->url[i], op, api);
                rc = -MG_EUNSUPPORTED;
                continue; /* an older etcd: try the next gateway prefix */
            }
            int nt = mg_json_parse(&e->doc, res.body, res.len, e->toks, e->ntoks);
            if (nt == -MG_ETOOBIG && res.len / 2 + 16 > (size_t)e->ntoks) {
                int want = (int)(res.len / 2 + 16);
                struct mg_json_tok *t = realloc(e->toks, (size_t)want * sizeof(*t));
                if (!t)
                    return -ENOMEM;
                e->toks = t;
                e->ntoks = want;
                nt = mg_json_parse(&e->doc, res.body, res.len, e->toks, e->ntoks);
            }
            if (nt < 0) {
                seterr(e, "etcd %s: %s: HTTP %ld with a response that is not JSON (%.80s)",
                       e->url[i], op, status, res.body);
                return -MG_EPROTO;
            }
            if (status != 200) {
                char msg[300] = "";
                long long code = 0;
                int t = mg_json_get(&e->doc, 0, "message");
                if (t < 0)
                    t = mg_json_get(&e->doc, 0, "error");
                if (t >= 0)
                    mg_json_str(&e->doc, t, msg, sizeof(msg));
                t = mg_json_get(&e->doc, 0, "code");
                if (t >= 0)
                    mg_json_int(&e->doc, t, &code);
                seterr(e, "etcd %s: %s: HTTP %ld: %s (code %lld)", e->url[i], op, status,
                       msg[0] ? msg : "no message", code);
                /* gRPC NOT_FOUND is how etcd says a lease is gone. */
                if (code == 5)
                    return -EKEYEXPIRED;
                return strstr(msg, "too many requests") ? -EBUSY : -EIO;
            }
            e->cur = i;
            e->api = api;
            return 0;
        }
    }
    return rc;
}

/* ---- request bodies ---------------------------------------------------------- */

/* Appends "name":"base64(data)" to a writer. */
static void kb64(struct mg_jsonw *w, const char *name, const void *data, size_t n, char *tmp)
{
    size_t l = mg_base64_encode(data, n, tmp);
    mg_jsonw_key(w, name);
    mg_jsonw_strn(w, tmp, l);
}

static void kint64(struct mg_jsonw *w, const char *name, int64_t v)
{
    char s[32];
    snprintf(s, sizeof(s), "%" PRId64, v);
    mg_jsonw_kstr(w, name, s); /* int64 travels as a string in proto3 JSON */
}

struct body {
    char *json, *tmp;
    size_t cap;
    struct mg_jsonw w;
};

static int body_begin(struct body *b, size_t payload)
{
    b->cap = 512 + 2 * mg_base64_len(payload);
    b->json = malloc(b->cap);
    b->tmp = malloc(mg_base64_len(payload) + 8);
    if (!b->json || !b->tmp) {
        free(b->json);
        free(b->tmp);
        return -ENOMEM;
    }
    mg_jsonw_init(&b->w, b->json, b->cap);
    mg_jsonw_obj_begin(&b->w);
    return 0;
}

static int body_end(struct body *b)
{
    mg_jsonw_obj_end(&b->w);
    int n = mg_jsonw_finish(&b->w);
    free(b->tmp);
    b->tmp = NULL;
    if (n < 0) {
        free(b->json);
        b->json = NULL;
    }
    return n;
}

/* Ends the body, posts it to the gateway's path and frees it. */
static int body_call(struct kv_etcd *e, struct body *b, const char *path)
{
    int n = body_end(b);
    if (n < 0)
        return n;
    int rc = call(e, path, b->json, (size_t)n);
    free(b->json);
    return rc;
}

/* Posts a body that names one key and nothing else. */
static int key_call(struct kv_etcd *e, const char *key, const char *path)
{
    struct body b;
    size_t kl = strlen(key);
    if (body_begin(&b, kl) < 0)
        return -ENOMEM;
    kb64(&b.w, "key", key, kl, b.tmp);
    return body_call(e, &b, path);
}

/* range_end for a prefix: the prefix with its last byte incremented. */
static size_t prefix_end(const char *prefix, char *out)
{
    size_t n = strlen(prefix);
    memcpy(out, prefix, n);
    while (n && (unsigned char)out[n - 1] == 0xff)
        n--;
    if (n == 0) {
        out[0] = 0; /* every key: range_end "\0" */
        return 1;
    }
    out[n - 1] = (char)((unsigned char)out[n - 1] + 1);
    return n;
}

/* ---- reading responses --------------------------------------------------------- */

/* Decodes a base64 string member of obj into a malloc'd NUL-terminated buffer. */
static int member_b64(struct kv_etcd *e, int obj, const char *name, char **out, size_t *len)
{
    int t = mg_json_get(&e->doc, obj, name);
    *out = NULL;
    *len = 0;
    if (t < 0) {
        *out = calloc(1, 1); /* proto3 JSON omits empty values */
        return *out ? 0 : -ENOMEM;
    }
    size_t enc = e->doc.toks[t].len;
    char *tmp = malloc(enc + 1);
    char *dec = malloc(enc / 4 * 3 + 4);
    int n;
    if (!tmp || !dec) {
        free(tmp);
        free(dec);
        return -ENOMEM;
    }
    n = mg_json_str(&e->doc, t, tmp, enc + 1);
    if (n >= 0)
        n = mg_base64_decode(tmp, (size_t)n, dec, enc / 4 * 3 + 3);
    free(tmp);
    if (n < 0) {
        free(dec);
        seterr(e, "etcd %s: a %s in the response is not base64", e->url[e->cur], name);
        return -MG_EPROTO;
    }
    dec[n] = 0;
    *out = dec;
    *len = (size_t)n;
    return 0;
}

static int64_t member_int(struct kv_etcd *e, int obj, const char *name)
{
    long long v = 0;
    int t = mg_json_get(&e->doc, obj, name);
    if (t >= 0)
        mg_json_int(&e->doc, t, &v);
    return v;
}

/* ---- leases ------------------------------------------------------------------------ */

static int lease_grant(struct kv_etcd *e)
{
    char body[64];
    int n = snprintf(body, sizeof(body), "{\"TTL\":\"%d\"}", e->lease_ttl_s);
    int rc = call(e, "lease/grant", body, (size_t)n);
    if (rc < 0)
        return rc;
    e->lease = member_int(e, 0, "ID");
    if (e->lease == 0) {
        seterr(e, "etcd %s: lease/grant: no lease id in the response", e->url[e->cur]);
        return -MG_EPROTO;
    }
    return 0;
}

static int etcd_keepalive(struct mg_kv *kv)
{
    struct kv_etcd *e = (struct kv_etcd *)kv;
    char body[64];
    int rc, n;

    if (!e->lease)
        return 0;
    n = snprintf(body, sizeof(body), "{\"ID\":\"%" PRId64 "\"}", e->lease);
    rc = call(e, "lease/keepalive", body, (size_t)n);
    if (rc < 0)
        return rc;
    int res = mg_json_get(&e->doc, 0, "result");
    if (res < 0 || member_int(e, res, "TTL") <= 0) {
        seterr(e, "etcd %s: lease %" PRId64 " expired (no heartbeat reached etcd in time)",
               e->url[e->cur], e->lease);
        e->lease = 0;
        return -EKEYEXPIRED;
    }
    return 0;
}

/* ---- kv operations ------------------------------------------------------------------ */

static int etcd_get(struct mg_kv *kv, const char *key, char **val, size_t *len, int64_t *rev)
{
    struct kv_etcd *e = (struct kv_etcd *)kv;
    int rc = key_call(e, key, "kv/range");
    if (rc < 0)
        return rc;
    int kvs = mg_json_get(&e->doc, 0, "kvs");
    int first = kvs >= 0 ? mg_json_at(&e->doc, kvs, 0) : -1;
    if (first < 0) {
        snprintf(kv->err, sizeof(kv->err), "etcd %s: no key %s", e->url[e->cur], key);
        return -MG_ENOKEY;
    }
    if (rev)
        *rev = member_int(e, first, "mod_revision");
    if (!val)
        return 0;
    size_t l;
    rc = member_b64(e, first, "value", val, &l);
    if (len)
        *len = l;
    return rc;
}

static void put_body(struct kv_etcd *e, struct mg_jsonw *w, const char *key, size_t kl,
                     const void *val, size_t len, int flags, char *tmp)
{
    kb64(w, "key", key, kl, tmp);
    kb64(w, "value", val, len, tmp);
    if (flags & MG_KV_EPHEMERAL)
        kint64(w, "lease", e->lease);
}

static int need_lease(struct kv_etcd *e, int flags)
{
    if (!(flags & MG_KV_EPHEMERAL) || e->lease)
        return 0;
    return lease_grant(e);
}

static int etcd_set(struct mg_kv *kv, const char *key, const void *val, size_t len, int flags)
{
    struct kv_etcd *e = (struct kv_etcd *)kv;
    struct body b;
    size_t kl = strlen(key);
    int rc;

    if (len > MG_KV_MAX_VALUE || kl > MG_KV_MAX_KEY)
        return -MG_ETOOBIG;
    rc = need_lease(e, flags);
    if (rc < 0)
        return rc;
    if (body_begin(&b, kl + len) < 0)
        return -ENOMEM;
    put_body(e, &b.w, key, kl, val, len, flags, b.tmp);
    return body_call(e, &b, "kv/put");
}

/* A transaction: if key's VALUE equals expected (or, expected NULL, the key
 * does not exist; or, mod_rev >= 0, its MOD revision equals mod_rev) put
 * desired, else read the key. Returns 1 when the put happened. */
static int txn(struct kv_etcd *e, const char *key, const void *expected, size_t elen,
               int64_t mod_rev, const void *desired, size_t dlen, int flags, char **cur,
               size_t *curlen)
{
    struct body b;
    size_t kl = strlen(key);
    int rc;

    if (cur)
        *cur = NULL;
    if (dlen > MG_KV_MAX_VALUE || elen > MG_KV_MAX_VALUE || kl > MG_KV_MAX_KEY)
        return -MG_ETOOBIG;
    rc = need_lease(e, flags);
    if (rc < 0)
        return rc;
    if (body_begin(&b, 3 * kl + elen + dlen) < 0)
        return -ENOMEM;
    struct mg_jsonw *w = &b.w;
    mg_jsonw_key(w, "compare");
    mg_jsonw_arr_begin(w);
    mg_jsonw_obj_begin(w);
    kb64(w, "key", key, kl, b.tmp);
    mg_jsonw_kstr(w, "result", "EQUAL");
    if (mod_rev >= 0) {
        mg_jsonw_kstr(w, "target", "MOD");
        kint64(w, "mod_revision", mod_rev);
    } else if (expected) {
        mg_jsonw_kstr(w, "target", "VALUE");
        kb64(w, "value", expected, elen, b.tmp);
    } else {
        mg_jsonw_kstr(w, "target", "CREATE");
        kint64(w, "create_revision", 0);
    }
    mg_jsonw_obj_end(w);
    mg_jsonw_arr_end(w);
    mg_jsonw_key(w, "success");
    mg_jsonw_arr_begin(w);
    mg_jsonw_obj_begin(w);
    mg_jsonw_key(w, "request_put");
    mg_jsonw_obj_begin(w);
    put_body(e, w, key, kl, desired, dlen, flags, b.tmp);
    mg_jsonw_obj_end(w);
    mg_jsonw_obj_end(w);
    mg_jsonw_arr_end(w);
    mg_jsonw_key(w, "failure");
    mg_jsonw_arr_begin(w);
    mg_jsonw_obj_begin(w);
    mg_jsonw_key(w, "request_range");
    mg_jsonw_obj_begin(w);
    kb64(w, "key", key, kl, b.tmp);
    mg_jsonw_obj_end(w);
    mg_jsonw_obj_end(w);
    mg_jsonw_arr_end(w);
    rc = body_call(e, &b, "kv/txn");
    if (rc < 0)
        return rc;

    int ok = 0, t = mg_json_get(&e->doc, 0, "succeeded");
    if (t >= 0)
        mg_json_bool(&e->doc, t, &ok);
    if (ok) {
        if (cur) {
            *cur = malloc(dlen + 1);
            if (!*cur)
                return -ENOMEM;
            memcpy(*cur, desired, dlen);
            (*cur)[dlen] = 0;
            if (curlen)
                *curlen = dlen;
        }
        return 1;
    }
    if (cur || mod_rev >= 0) {
        /* responses[0].response_range.kvs[0]: the value that won. */
        int r = mg_json_path(&e->doc, 0, "responses");
        int r0 = r >= 0 ? mg_json_at(&e->doc, r, 0) : -1;
        int kvs = r0 >= 0 ? mg_json_path(&e->doc, r0, "response_range.kvs") : -1;
        int first = kvs >= 0 ? mg_json_at(&e->doc, kvs, 0) : -1;
        if (first >= 0 && cur) {
            size_t l;
            rc = member_b64(e, first, "value", cur, &l);
            if (rc < 0)
                return rc;
            if (curlen)
                *curlen = l;
        }
    }
    return 0;
}

static int etcd_cas(struct mg_kv *kv, const char *key, const void *expected, size_t elen,
                    const void *desired, size_t dlen, int flags, char **cur, size_t *curlen)
{
    return txn((struct kv_etcd *)kv, key, expected, elen, -1, desired, dlen, flags, cur, curlen);
}

/* An add of 1, the rendezvous' join count, which thousands of nodes make
 * at once. Read-then-swap (below) lets one of them win per round trip and
 * the rest read and try again: 128 nodes took 2 s each to join, and the
 * requests grow as nodes squared. etcd has no atomic add, but a put bumps
 * the key's version, and returns the version it replaced (prev_kv): a put
 * to KEY#seq hands every adder its own place, at once and in one request.
 * The adder then raises KEY's value to its place unless a later one did
 * already (a swap that only adders placed between a read and the swap can
 * make fail, and each of those leaves a larger value): readers of KEY see
 * the count, and it is at least the place an add returned. So on etcd a
 * key advanced by adds of 1 must be counted by those alone (the join count
 * is). */
static int add_one(struct kv_etcd *e, const char *key, int64_t *result)
{
    char seq[MG_KV_MAX_KEY + 8], num[32], *cur = NULL;
    size_t sl, len;
    struct body b;
    int rc;

    sl = (size_t)snprintf(seq, sizeof(seq), "%s#seq", key);
    if (sl >= sizeof(seq) || strlen(key) > MG_KV_MAX_KEY)
        return -MG_ETOOBIG;
    if (body_begin(&b, sl) < 0)
        return -ENOMEM;
    kb64(&b.w, "key", seq, sl, b.tmp);
    mg_jsonw_kbool(&b.w, "prev_kv", 1);
    rc = body_call(e, &b, "kv/put");
    if (rc < 0)
        return rc;
    int prev = mg_json_get(&e->doc, 0, "prev_kv");
    int64_t place = (prev >= 0 ? member_int(e, prev, "version") : 0) + 1;
    int n = snprintf(num, sizeof(num), "%" PRId64, place);

    /* KEY := place, unless it holds a count that large already. */
    rc = txn(e, key, NULL, 0, -1, num, (size_t)n, 0, &cur, &len);
    for (int tries = 0; rc == 0 && tries < ADD_MAX_TRIES; tries++) {
        char *end;
        if (!cur) /* deleted meanwhile: create it again */
            rc = txn(e, key, NULL, 0, -1, num, (size_t)n, 0, &cur, &len);
        else {
            errno = 0;
            long long v = strtoll(cur, &end, 10);
            if (errno || end == cur || *end) {
                free(cur);
                snprintf(e->kv.err, sizeof(e->kv.err), "etcd %s: add to %s: not an integer",
                         e->url[e->cur], key);
                return -EINVAL;
            }
            if (v >= place) {
                rc = 1; /* a later adder's count is there */
                break;
            }
            char *was = cur;
            cur = NULL;
            rc = txn(e, key, was, len, -1, num, (size_t)n, 0, &cur, &len);
            free(was);
        }
    }
    free(cur);
    if (rc < 0)
        return rc;
    if (rc == 0) {
        snprintf(e->kv.err, sizeof(e->kv.err), "etcd %s: add to %s: lost %d races in a row",
                 e->url[e->cur], key, ADD_MAX_TRIES);
        return -EAGAIN;
    }
    if (result)
        *result = place;
    return 0;
}

static int etcd_add(struct mg_kv *kv, const char *key, int64_t delta, int64_t *result)
{
    struct kv_etcd *e = (struct kv_etcd *)kv;
    char *val = NULL, num[32];
    int64_t rev = 0;
    size_t len;
    int rc;

    if (delta == 1)
        return add_one(e, key, result);
    /* No atomic add in etcd: read, then swap on the modification revision. */
    for (int tries = 0; tries < ADD_MAX_TRIES; tries++) {
        long long v = 0;
        rc = etcd_get(kv, key, &val, &len, &rev);
        if (rc == -MG_ENOKEY) {
            rev = 0; /* compare MOD == 0 holds for a missing key */
        } else if (rc < 0) {
            return rc;
        } else {
            char *end;
            errno = 0;
            v = strtoll(val, &end, 10);
            int bad = errno || end == val || *end;
            free(val);
            val = NULL;
            if (bad) {
                snprintf(kv->err, sizeof(kv->err), "etcd %s: add to %s: not an integer",
                         e->url[e->cur], key);
                return -EINVAL;
            }
        }
        v += delta;
        int n = snprintf(num, sizeof(num), "%lld", v);
        rc = txn(e, key, NULL, 0, rev, num, (size_t)n, 0, NULL, NULL);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            if (result)
                *result = v;
            return 0;
        }
    }
    snprintf(kv->err, sizeof(kv->err), "etcd %s: add to %s: lost %d races in a row", e->url[e->cur],
             key, ADD_MAX_TRIES);
    return -EAGAIN;
}

static int etcd_del(struct mg_kv *kv, const char *key)
{
    struct kv_etcd *e = (struct kv_etcd *)kv;
    int rc = key_call(e, key, "kv/deleterange");
    if (rc < 0)
        return rc;
    return member_int(e, 0, "deleted") > 0;
}

static int etcd_list(struct mg_kv *kv, const char *prefix, int max, int want_values,
                     struct mg_kv_entry **out, int *count)
{
    struct kv_etcd *e = (struct kv_etcd *)kv;
    struct body b;
    size_t kl = strlen(prefix);
    char end[MG_KV_MAX_KEY + 1];
    int rc;

    *out = NULL;
    *count = 0;
    if (kl > MG_KV_MAX_KEY || max <= 0)
        return -EINVAL;
    if (max > MG_KV_MAX_LIST)
        max = MG_KV_MAX_LIST;
    if (body_begin(&b, 2 * kl) < 0)
        return -ENOMEM;
    kb64(&b.w, "key", prefix, kl, b.tmp);
    size_t el = prefix_end(prefix, end);
    kb64(&b.w, "range_end", end, el, b.tmp);
    kint64(&b.w, "limit", max);
    mg_jsonw_kstr(&b.w, "sort_order", "ASCEND");
    mg_jsonw_kstr(&b.w, "sort_target", "KEY");
    if (!want_values)
        mg_jsonw_kbool(&b.w, "keys_only", 1);
    rc = body_call(e, &b, "kv/range");
    if (rc < 0)
        return rc;

    int kvs = mg_json_get(&e->doc, 0, "kvs");
    int total = kvs >= 0 ? e->doc.toks[kvs].size : 0;
    if (total == 0)
        return 0;
    struct mg_kv_entry *v = calloc((size_t)total, sizeof(*v));
    if (!v)
        return -ENOMEM;
    for (int i = 0; i < total; i++) {
        int it = mg_json_at(&e->doc, kvs, i);
        size_t l;
        rc = member_b64(e, it, "key", &v[i].key, &l);
        if (rc == 0 && want_values)
            rc = member_b64(e, it, "value", &v[i].val, &v[i].len);
        if (rc < 0) {
            mg_kv_free_list(v, total);
            return rc;
        }
        v[i].rev = member_int(e, it, "mod_revision");
    }
    *out = v;
    *count = total;
    return 0;
}

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
        if (body_begin(&b, payload) < 0)
            return -ENOMEM;
        mg_jsonw_key(&b.w, "success");
        mg_jsonw_arr_begin(&b.w);
        for (int i = lo; i < hi; i++) {
            size_t kl = strlen(keys[i]);
            mg_jsonw_obj_begin(&b.w);
            mg_jsonw_key(&b.w, vals ? "request_put" : "request_delete_range");
            mg_jsonw_obj_begin(&b.w);
            kb64(&b.w, "key", keys[i], kl, b.tmp);
            if (vals)
                kb64(&b.w, "value", vals[i], lens[i], b.tmp);
            mg_jsonw_obj_end(&b.w);
            mg_jsonw_obj_end(&b.w);
        }
        mg_jsonw_arr_end(&b.w);
        int rc = body_call(e, &b, "kv/txn");
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int etcd_set_many(struct mg_kv *kv, const char *const *keys, const char *const *vals,
                         const size_t *lens, int n)
{
    return etcd_many((struct kv_etcd *)kv, keys, vals, lens, n);
}

static int etcd_del_many(struct mg_kv *kv, const char *const *keys, int n)
{
    return etcd_many((struct kv_etcd *)kv, keys, NULL, NULL, n);
}

/* The number of keys under prefix, without them (count_only): a node that
 * counts the live agents of a job of thousands gets a number, where a
 * listing is every agent's key, base64 in JSON, to each node. */
static int etcd_count(struct mg_kv *kv, const char *prefix, int *n)
{
    struct kv_etcd *e = (struct kv_etcd *)kv;
    struct body b;
    size_t kl = strlen(prefix);
    char end[MG_KV_MAX_KEY + 1];

    *n = 0;
    if (kl > MG_KV_MAX_KEY)
        return -EINVAL;
    if (body_begin(&b, 2 * kl) < 0)
        return -ENOMEM;
    kb64(&b.w, "key", prefix, kl, b.tmp);
    size_t el = prefix_end(prefix, end);
    kb64(&b.w, "range_end", end, el, b.tmp);
    mg_jsonw_kbool(&b.w, "count_only", 1);
    int rc = body_call(e, &b, "kv/range");
    if (rc < 0)
        return rc;
    int64_t c = member_int(e, 0, "count"); /* proto3 JSON omits a count of 0 */
    *n = c > MG_KV_MAX_LIST ? MG_KV_MAX_LIST : (int)c;
    return 0;
}

/* Watch stream: one JSON message per line; stop at the first event. */
static int watch_message(struct watch *w, const char *msg, size_t len)
{
    struct mg_json doc;
    struct mg_json_tok toks[256];
    int nt = mg_json_parse(&doc, msg, len, toks, 256);
    if (nt == -MG_ETOOBIG) {
        /* A message with many events: a change happened, the details do not matter. */
        w->changed = 1;
        return 1;
    }
    if (nt < 0) {
        snprintf(w->msg, sizeof(w->msg), "watch: a message that is not JSON (%.60s)", msg);
        w->err = -MG_EPROTO;
        return 1;
    }
    int res = mg_json_get(&doc, 0, "result");
    if (res < 0) {
        int m = mg_json_get(&doc, 0, "message");
        if (m < 0)
            m = mg_json_get(&doc, 0, "error");
        snprintf(w->msg, sizeof(w->msg), "watch: ");
        if (m >= 0)
            mg_json_str(&doc, m, w->msg + 7, sizeof(w->msg) - 7);
        w->err = -EIO;
        return 1;
    }
    int t = mg_json_get(&doc, res, "created");
    if (t >= 0)
        w->created = 1;
    t = mg_json_get(&doc, res, "events");
    if (t >= 0 && doc.toks[t].size > 0) {
        w->changed = 1;
        return 1;
    }
    if (mg_json_get(&doc, res, "canceled") >= 0 ||
        mg_json_get(&doc, res, "compact_revision") >= 0) {
        /* The revision was compacted away: report a change so the caller re-reads. */
        w->changed = 1;
        return 1;
    }
    return 0;
}

/* The watch stream as it arrives (mg_http_request.on_data). */
static int on_watch_data(void *arg, const char *data, size_t n)
{
    struct watch *w = arg;
    struct buf *b = &w->line;
    for (size_t i = 0; i < n; i++) {
        if (data[i] != '\n') {
            if (b->len + 2 > b->max) {
                snprintf(w->msg, sizeof(w->msg), "watch: a message over %zu bytes", b->max);
                w->err = -MG_ETOOBIG;
                return w->err;
            }
            if (b->len + 2 > b->cap) {
                size_t cap = b->cap ? b->cap * 2 : 4096;
                char *p = realloc(b->p, cap);
                if (!p) {
                    w->err = -ENOMEM;
                    return w->err;
                }
                b->p = p;
                b->cap = cap;
            }
            b->p[b->len++] = data[i];
            continue;
        }
        b->p[b->len] = 0;
        int stop = b->len ? watch_message(w, b->p, b->len) : 0;
        b->len = 0;
        if (stop)
            return w->err ? w->err : 1; /* ends the request: the answer is known */
    }
    return 0;
}

static int etcd_wait(struct mg_kv *kv, const char *key, int64_t since_rev, int timeout_ms)
{
    struct kv_etcd *e = (struct kv_etcd *)kv;
    struct watch x = {.line = {.max = WATCH_MSG_MAX}};
    char url[URL_MAX + 64];
    struct body b;
    size_t kl = strlen(key);
    int rc, n;

    if (since_rev <= 0) {
        /* Waiting for the key to exist: it may already. */
        rc = etcd_get(kv, key, NULL, NULL, &since_rev);
        if (rc == 0)
            return 1;
        if (rc != -MG_ENOKEY)
            return rc;
        since_rev = member_int(e, mg_json_get(&e->doc, 0, "header"), "revision");
        if (timeout_ms <= 0)
            return 0; /* absent just now */
    }
    if (timeout_ms <= 0) {
        int64_t rev = 0;
        rc = etcd_get(kv, key, NULL, NULL, &rev);
        if (rc == -MG_ENOKEY)
            return 0; /* cannot tell a deletion without a watch; good enough at 0 ms */
        return rc < 0 ? rc : rev > since_rev;
    }
    if (!e->api) {
        /* Learn the gateway prefix (and check the endpoint) with a plain request. */
        rc = etcd_get(kv, key, NULL, NULL, NULL);
        if (rc < 0 && rc != -MG_ENOKEY)
            return rc;
    }
    if (body_begin(&b, kl) < 0)
        return -ENOMEM;
    mg_jsonw_key(&b.w, "create_request");
    mg_jsonw_obj_begin(&b.w);
    kb64(&b.w, "key", key, kl, b.tmp);
    kint64(&b.w, "start_revision", since_rev + 1);
    mg_jsonw_obj_end(&b.w);
    n = body_end(&b);
    if (n < 0)
        return n;

    snprintf(url, sizeof(url), "%s%swatch", e->url[e->cur], e->api);
    struct mg_http_request req = {
        .url = url,
        .body = b.json,
        .body_len = (size_t)n,
        .timeout_ms = timeout_ms,
        .abort_fd = kv->abort_fd,
        .on_data = on_watch_data,
        .ctx = &x,
    };
    struct mg_http_response res;
    rc = mg_http_request(e->watch, &req, &res);
    free(b.json);
    free(x.line.p);
    if (x.err) {
        seterr(e, "etcd %s: %s", e->url[e->cur], x.msg);
        return x.err;
    }
    if (x.changed)
        return 1;
    /* The caller's bound ran out with nothing seen, even before a loaded etcd
     * confirmed the watch (a slice of a few milliseconds): no change yet. An
     * etcd that stopped answering fails the caller's next plain request. */
    if (rc == -ETIMEDOUT)
        return 0;
    if (rc == 0) {
        seterr(e, "etcd %s: watch: the stream ended early", e->url[e->cur]);
        return -EIO;
    }
    return http_fail(e, e->url[e->cur], "watch", rc, &res);
}

/* kv.h's watch: as etcd_wait, with the key's value on a change, and the
 * watch left open at etcd when timeout_ms ends first: a node waiting in the
 * agent's slices of 100 to 200 ms then opens a watch once per park_ms (or
 * per heartbeat, whose requests drop it) instead of a connection and a
 * watch every slice, which at 1,024 waiting nodes was most of what etcd
 * did. */
static int etcd_watch(struct mg_kv *kv, const char *key, int64_t since_rev, int timeout_ms,
                      int park_ms, char **val, size_t *len)
{
    struct kv_etcd *e = (struct kv_etcd *)kv;
    struct parked *p = &e->park;
    struct mg_http_response res;
    size_t kl = strlen(key);
    int rc;

    *val = NULL;
    *len = 0;
    if (kl > MG_KV_MAX_KEY)
        return -MG_ETOOBIG;
    if (p->on && (strcmp(p->key, key) != 0 || p->since_rev != since_rev))
        drop_park(e);
    if (!p->on) {
        int64_t from = since_rev;
        if (since_rev <= 0) {
            /* Waiting for the key to exist: it may already. */
            rc = etcd_get(kv, key, val, len, NULL);
            if (rc != -MG_ENOKEY)
                return rc < 0 ? rc : 1;
            from = member_int(e, mg_json_get(&e->doc, 0, "header"), "revision");
        }
        if (timeout_ms <= 0 || !e->api) {
            /* No time to wait, or the gateway prefix is not known yet (the
             * plain wait learns it): as wait, then the value. */
            rc = etcd_wait(kv, key, from, timeout_ms);
            if (rc == 1) {
                rc = etcd_get(kv, key, val, len, NULL);
                return rc == -MG_ENOKEY ? 1 : rc < 0 ? rc : 1;
            }
            return rc;
        }
        struct body b;
        if (body_begin(&b, kl) < 0)
            return -ENOMEM;
        mg_jsonw_key(&b.w, "create_request");
        mg_jsonw_obj_begin(&b.w);
        kb64(&b.w, "key", key, kl, b.tmp);
        kint64(&b.w, "start_revision", from + 1);
        mg_jsonw_obj_end(&b.w);
        int n = body_end(&b);
        if (n < 0)
            return n;
        p->body = b.json;
        p->x = (struct watch){.line = {.max = WATCH_MSG_MAX}};
        snprintf(p->url, sizeof(p->url), "%s%swatch", e->url[e->cur], e->api);
        p->req = (struct mg_http_request){
            .url = p->url,
            .body = p->body,
            .body_len = (size_t)n,
            .timeout_ms = park_ms > timeout_ms ? park_ms : timeout_ms,
            .abort_fd = kv->abort_fd,
            .on_data = on_watch_data,
            .ctx = &p->x,
        };
        rc = mg_http_begin(e->watch, &p->req, &res);
        if (rc == -MG_EUNSUPPORTED) {
            /* a libcurl without the multi interface's poll: a watch per call */
            free(p->body);
            p->body = NULL;
            rc = etcd_wait(kv, key, from, timeout_ms);
            if (rc == 1) {
                rc = etcd_get(kv, key, val, len, NULL);
                return rc == -MG_ENOKEY ? 1 : rc < 0 ? rc : 1;
            }
            return rc;
        }
        if (rc < 0) {
            free(p->body);
            p->body = NULL;
            return http_fail(e, e->url[e->cur], "watch", rc, &res);
        }
        p->on = 1;
        memcpy(p->key, key, kl + 1);
        p->since_rev = since_rev;
    }
    p->req.abort_fd = kv->abort_fd;
    rc = mg_http_run(e->watch, timeout_ms, &res);
    if (rc == MG_HTTP_RUNNING)
        return 0; /* nothing yet: it stays open for the next call */
    /* over: what it saw */
    struct watch x = p->x;
    p->x.line.p = NULL;
    free(x.line.p);
    free(p->body);
    memset(p, 0, sizeof(*p));
    if (x.err) {
        seterr(e, "etcd %s: %s", e->url[e->cur], x.msg);
        return x.err;
    }
    if (x.changed) {
        rc = etcd_get(kv, key, val, len, NULL);
        return rc == -MG_ENOKEY ? 1 : rc < 0 ? rc : 1;
    }
    if (rc == -ETIMEDOUT)
        return 0; /* park_ms ran out with nothing seen */
    if (rc == 0) {
        seterr(e, "etcd %s: watch: the stream ended early", e->url[e->cur]);
        return -EIO;
    }
    return http_fail(e, e->url[e->cur], "watch", rc, &res);
}

static void etcd_release(struct mg_kv *kv)
{
    struct kv_etcd *e = (struct kv_etcd *)kv;
    if (!e)
        return;
    drop_park(e);
    if (e->lease && e->http) {
        /* Revoking deletes our ephemeral keys now, not a TTL later. */
        char body[64];
        int n = snprintf(body, sizeof(body), "{\"ID\":\"%" PRId64 "\"}", e->lease);
        if (e->timeout_ms > 2000)
            e->timeout_ms = 2000;
        call(e, "lease/revoke", body, (size_t)n);
    }
    mg_http_close(e->http);
    mg_http_close(e->watch);
    free(e->toks);
    free(e);
}

static const struct mg_kv_ops etcd_ops = {
    .name = "etcd",
    .get = etcd_get,
    .set = etcd_set,
    .cas = etcd_cas,
    .add = etcd_add,
    .del = etcd_del,
    .list = etcd_list,
    .count = etcd_count,
    .set_many = etcd_set_many,
    .del_many = etcd_del_many,
    .wait = etcd_wait,
    .watch = etcd_watch,
    .keepalive = etcd_keepalive,
    .release = etcd_release,
};

const char *mg_kv_etcd_api_prefix(const struct mg_kv *kv)
{
    return ((const struct kv_etcd *)kv)->api;
}

int mg_kv_etcd_local_addr(const struct mg_kv *kv, char *buf, size_t len)
{
    return mg_http_local_addr(((const struct kv_etcd *)kv)->http, buf, len);
}

static int parse_endpoints(struct kv_etcd *e, const char *list, int tls, char *err, size_t errlen)
{
    const char *p = list;
    if (!list || !*list) {
        snprintf(err, errlen, "etcd: no endpoint given (--rdzv_endpoint host:port)");
        return -EINVAL;
    }
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        char item[URL_MAX];
        const char *scheme = tls ? "https" : "http";
        struct mg_hostport hp;

        if (n == 0 || n >= sizeof(item)) {
            snprintf(err, errlen, "etcd: bad endpoint list '%s'", list);
            return -EINVAL;
        }
        if (e->nurl == MG_KV_ETCD_MAX_ENDPOINTS) {
            snprintf(err, errlen, "etcd: more than %d endpoints in '%s'", MG_KV_ETCD_MAX_ENDPOINTS,
                     list);
            return -EINVAL;
        }
        memcpy(item, p, n);
        item[n] = 0;
        const char *hostport = item;
        if (strncmp(item, "http://", 7) == 0) {
            scheme = "http";
            hostport = item + 7;
        } else if (strncmp(item, "https://", 8) == 0) {
            scheme = "https";
            hostport = item + 8;
        } else if (strstr(item, "://")) {
            snprintf(err, errlen, "etcd: endpoint '%s': only http:// and https:// are supported",
                     item);
            return -EINVAL;
        }
        size_t hl = strlen(hostport);
        if (hl && hostport[hl - 1] == '/')
            item[(size_t)(hostport - item) + hl - 1] = 0;
        if (mg_parse_hostport(hostport, MG_KV_ETCD_DEFAULT_PORT, &hp) < 0) {
            snprintf(err, errlen, "etcd: endpoint '%s' is not host:port", item);
            return -EINVAL;
        }
        int sl = snprintf(e->url[e->nurl], URL_MAX, "%s://", scheme);
        mg_format_hostport(e->url[e->nurl] + sl, URL_MAX - (size_t)sl, hp.host, hp.port);
        e->nurl++;
        p += n;
        if (*p == ',')
            p++;
    }
    return 0;
}

int mg_kv_etcd_open(struct mg_kv **out, const struct mg_kv_etcd_opts *o, char *err, size_t errlen)
{
    static const char *const headers[] = {
        "Content-Type: application/json",
        "Expect:", /* no 100-continue round trip */
        NULL,
    };
    struct kv_etcd *e = calloc(1, sizeof(*e));
    struct mg_http_opts ho = {
        .libcurl = o->libcurl,
        .cacert = o->cacert,
        .cert = o->cert,
        .key = o->key,
        .proxy = "", /* etcd is reached directly; an http_proxy meant for the web must not apply */
        .headers = headers,
        .body_max = RESP_MAX,
    };
    char why[MG_ERRMSG_LEN];
    int tls, rc;

    *out = NULL;
    if (!e)
        return -ENOMEM;
    e->kv.ops = &etcd_ops;
    e->kv.abort_fd = -1;
    e->jitter = (uint64_t)(uintptr_t)e ^ (uint64_t)mg_now_ms();
    e->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 10000;
    e->lease_ttl_s = o->lease_ttl_ms > 0 ? (o->lease_ttl_ms + 999) / 1000 : 5;
    if (e->lease_ttl_s < 2)
        e->lease_ttl_s = 2;
    tls = o->https || (o->cacert && *o->cacert) || (o->cert && *o->cert);
    rc = parse_endpoints(e, o->endpoints, tls, err, errlen);
    if (rc < 0)
        goto fail;
    rc = mg_http_open(&e->http, &ho, why, sizeof(why));
    if (rc == 0)
        rc = mg_http_open(&e->watch, &ho, why, sizeof(why));
    if (rc < 0) {
        snprintf(err, errlen, "%s%s",
                 rc == -MG_EUNSUPPORTED ? "the etcd backend needs libcurl at run time: " : "etcd: ",
                 why);
        goto fail;
    }
    e->ntoks = 1024;
    e->toks = malloc((size_t)e->ntoks * sizeof(*e->toks));
    if (!e->toks) {
        snprintf(err, errlen, "etcd: out of memory setting up libcurl");
        rc = -ENOMEM;
        goto fail;
    }
    *out = &e->kv;
    return 0;
fail:
    etcd_release(&e->kv);
    return rc;
}
