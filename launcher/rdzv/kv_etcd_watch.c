/* etcd watches (kv.h's wait and watch): the gateway's watch stream, and a
 * watch parked between calls on libcurl's multi interface; split from
 * kv_etcd.c, which holds the requests they share. */
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

void etcd_drop_park(struct kv_etcd *e)
{
    if (!e->park.on)
        return;
    mg_http_end(e->watch);
    free(e->park.body);
    free(e->park.x.line.p);
    memset(&e->park, 0, sizeof(e->park));
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

/* The body of a watch of key from revision after_rev + 1, for the stream and
 * for the parked watch alike: its length, or -ENOMEM. */
static int watch_body(struct body *b, const char *key, size_t kl, int64_t after_rev)
{
    if (etcd_body_begin(b, kl) < 0)
        return -ENOMEM;
    mg_jsonw_key(&b->w, "create_request");
    mg_jsonw_obj_begin(&b->w);
    etcd_kb64(&b->w, "key", key, kl, b->tmp);
    etcd_kint64(&b->w, "start_revision", after_rev + 1);
    mg_jsonw_obj_end(&b->w);
    return etcd_body_end(b);
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

int etcd_wait(struct mg_kv *kv, const char *key, int64_t since_rev, int timeout_ms)
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
        since_rev = etcd_member_int(e, mg_json_get(&e->doc, 0, "header"), "revision");
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
    n = watch_body(&b, key, kl, since_rev);
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
        etcd_seterr(e, "etcd %s: %s", e->url[e->cur], x.msg);
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
        etcd_seterr(e, "etcd %s: watch: the stream ended early", e->url[e->cur]);
        return -EIO;
    }
    return etcd_http_fail(e, e->url[e->cur], "watch", rc, &res);
}

/* kv.h's watch: as etcd_wait, with the key's value on a change, and the
 * watch left open at etcd when timeout_ms ends first: a node waiting in the
 * agent's slices of 100 to 200 ms then opens a watch once per park_ms (or
 * per heartbeat, whose requests drop it) instead of a connection and a
 * watch every slice, which at 1,024 waiting nodes was most of what etcd
 * did. */
int etcd_watch(struct mg_kv *kv, const char *key, int64_t since_rev, int timeout_ms, int park_ms,
               char **val, size_t *len)
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
        etcd_drop_park(e);
    if (!p->on) {
        int64_t from = since_rev;
        if (since_rev <= 0) {
            /* Waiting for the key to exist: it may already. */
            rc = etcd_get(kv, key, val, len, NULL);
            if (rc != -MG_ENOKEY)
                return rc < 0 ? rc : 1;
            from = etcd_member_int(e, mg_json_get(&e->doc, 0, "header"), "revision");
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
        int n = watch_body(&b, key, kl, from);
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
            return etcd_http_fail(e, e->url[e->cur], "watch", rc, &res);
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
        etcd_seterr(e, "etcd %s: %s", e->url[e->cur], x.msg);
        return x.err;
    }
    if (x.changed) {
        rc = etcd_get(kv, key, val, len, NULL);
        return rc == -MG_ENOKEY ? 1 : rc < 0 ? rc : 1;
    }
    if (rc == -ETIMEDOUT)
        return 0; /* park_ms ran out with nothing seen */
    if (rc == 0) {
        etcd_seterr(e, "etcd %s: watch: the stream ended early", e->url[e->cur]);
        return -EIO;
    }
    return etcd_http_fail(e, e->url[e->cur], "watch", rc, &res);
}
