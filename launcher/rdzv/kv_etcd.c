/* The etcd v3 backend of the rendezvous, over the JSON gateway (see
 * kv_etcd.h); HTTP is common/http.c's. */
#include "kv_etcd.h"
#include "kv_etcd_internal.h"
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
#define ADD_MAX_TRIES 10000       /* compare-and-swap retries of one add under contention */

static const char *const api_prefixes[] = {"/v3/", "/v3beta/", "/v3alpha/"};

__attribute__((format(printf, 2, 3))) void etcd_seterr(struct kv_etcd *e, const char *fmt, ...)
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
int etcd_http_fail(struct kv_etcd *e, const char *url, const char *op, int rc,
                   const struct mg_http_response *res)
{
    etcd_seterr(e, "etcd %s: %s: %s%s", url, op, res->error, hint(res->fault));
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
            etcd_seterr(e, "etcd %s: %s: interrupted (a signal)", e->url[e->cur], op);
            return -EINTR;
        }
        pause = pause * 2 > 1000 ? 1000 : pause * 2;
    }
}

static int call_once(struct kv_etcd *e, const char *op, const char *body, size_t blen)
{
    char url[URL_MAX + 64];
    int rc = -EIO;

    etcd_drop_park(e); /* kv.h: any other call drops a parked watch */
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
                etcd_seterr(e, "etcd %s: %s: interrupted (a signal)", e->url[i], op);
                return -EINTR;
            }
            if (hrc < 0) {
                rc = etcd_http_fail(e, e->url[i], op, hrc, &res);
                break; /* this endpoint does not answer: try the next */
            }
            long status = res.status;
            if (status == 404 && !e->api) {
                etcd_seterr(e, "etcd %s: %s: HTTP 404 (no v3 JSON gateway at %s)", e->url[i], op,
                            api);
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
                etcd_seterr(e, "etcd %s: %s: HTTP %ld with a response that is not JSON (%.80s)",
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
                etcd_seterr(e, "etcd %s: %s: HTTP %ld: %s (code %lld)", e->url[i], op, status,
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
void etcd_kb64(struct mg_jsonw *w, const char *name, const void *data, size_t n, char *tmp)
{
    size_t l = mg_base64_encode(data, n, tmp);
    mg_jsonw_key(w, name);
    mg_jsonw_strn(w, tmp, l);
}

void etcd_kint64(struct mg_jsonw *w, const char *name, int64_t v)
{
    char s[32];
    snprintf(s, sizeof(s), "%" PRId64, v);
    mg_jsonw_kstr(w, name, s); /* int64 travels as a string in proto3 JSON */
}

int etcd_body_begin(struct body *b, size_t payload)
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

int etcd_body_end(struct body *b)
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
int etcd_body_call(struct kv_etcd *e, struct body *b, const char *path)
{
    int n = etcd_body_end(b);
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
    if (etcd_body_begin(&b, kl) < 0)
        return -ENOMEM;
    etcd_kb64(&b.w, "key", key, kl, b.tmp);
    return etcd_body_call(e, &b, path);
}

/* range_end for a prefix: the prefix with its last byte incremented. */
size_t etcd_prefix_end(const char *prefix, char *out)
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
        etcd_seterr(e, "etcd %s: a %s in the response is not base64", e->url[e->cur], name);
        return -MG_EPROTO;
    }
    dec[n] = 0;
    *out = dec;
    *len = (size_t)n;
    return 0;
}

int64_t etcd_member_int(struct kv_etcd *e, int obj, const char *name)
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
    e->lease = etcd_member_int(e, 0, "ID");
    if (e->lease == 0) {
        etcd_seterr(e, "etcd %s: lease/grant: no lease id in the response", e->url[e->cur]);
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
    if (res < 0 || etcd_member_int(e, res, "TTL") <= 0) {
        etcd_seterr(e, "etcd %s: lease %" PRId64 " expired (no heartbeat reached etcd in time)",
                    e->url[e->cur], e->lease);
        e->lease = 0;
        return -EKEYEXPIRED;
    }
    return 0;
}

/* ---- kv operations ------------------------------------------------------------------ */

int etcd_get(struct mg_kv *kv, const char *key, char **val, size_t *len, int64_t *rev)
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
        *rev = etcd_member_int(e, first, "mod_revision");
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
    etcd_kb64(w, "key", key, kl, tmp);
    etcd_kb64(w, "value", val, len, tmp);
    if (flags & MG_KV_EPHEMERAL)
        etcd_kint64(w, "lease", e->lease);
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
    if (etcd_body_begin(&b, kl + len) < 0)
        return -ENOMEM;
    put_body(e, &b.w, key, kl, val, len, flags, b.tmp);
    return etcd_body_call(e, &b, "kv/put");
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
    if (etcd_body_begin(&b, 3 * kl + elen + dlen) < 0)
        return -ENOMEM;
    struct mg_jsonw *w = &b.w;
    mg_jsonw_key(w, "compare");
    mg_jsonw_arr_begin(w);
    mg_jsonw_obj_begin(w);
    etcd_kb64(w, "key", key, kl, b.tmp);
    mg_jsonw_kstr(w, "result", "EQUAL");
    if (mod_rev >= 0) {
        mg_jsonw_kstr(w, "target", "MOD");
        etcd_kint64(w, "mod_revision", mod_rev);
    } else if (expected) {
        mg_jsonw_kstr(w, "target", "VALUE");
        etcd_kb64(w, "value", expected, elen, b.tmp);
    } else {
        mg_jsonw_kstr(w, "target", "CREATE");
        etcd_kint64(w, "create_revision", 0);
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
    etcd_kb64(w, "key", key, kl, b.tmp);
    mg_jsonw_obj_end(w);
    mg_jsonw_obj_end(w);
    mg_jsonw_arr_end(w);
    rc = etcd_body_call(e, &b, "kv/txn");
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
    if (etcd_body_begin(&b, sl) < 0)
        return -ENOMEM;
    etcd_kb64(&b.w, "key", seq, sl, b.tmp);
    mg_jsonw_kbool(&b.w, "prev_kv", 1);
    rc = etcd_body_call(e, &b, "kv/put");
    if (rc < 0)
        return rc;
    int prev = mg_json_get(&e->doc, 0, "prev_kv");
    int64_t place = (prev >= 0 ? etcd_member_int(e, prev, "version") : 0) + 1;
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
    return etcd_member_int(e, 0, "deleted") > 0;
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
    if (etcd_body_begin(&b, 2 * kl) < 0)
        return -ENOMEM;
    etcd_kb64(&b.w, "key", prefix, kl, b.tmp);
    size_t el = etcd_prefix_end(prefix, end);
    etcd_kb64(&b.w, "range_end", end, el, b.tmp);
    etcd_kint64(&b.w, "limit", max);
    mg_jsonw_kstr(&b.w, "sort_order", "ASCEND");
    mg_jsonw_kstr(&b.w, "sort_target", "KEY");
    if (!want_values)
        mg_jsonw_kbool(&b.w, "keys_only", 1);
    rc = etcd_body_call(e, &b, "kv/range");
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
        v[i].rev = etcd_member_int(e, it, "mod_revision");
    }
    *out = v;
    *count = total;
    return 0;
}

static void etcd_release(struct mg_kv *kv)
{
    struct kv_etcd *e = (struct kv_etcd *)kv;
    if (!e)
        return;
    etcd_drop_park(e);
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
