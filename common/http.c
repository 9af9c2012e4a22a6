/* The HTTP client over a libcurl loaded at run time (see http.h). Only
 * curl/curl.h is needed to build it: its types and constants, no symbol. */
#include "http.h"
#include "mg_err.h"

#include <curl/curl.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The few libcurl entry points used, resolved with dlsym. */
struct curl_fns {
    void *dl;
    CURL *(*easy_init)(void);
    CURLcode (*easy_setopt)(CURL *, CURLoption, ...);
    CURLcode (*easy_perform)(CURL *);
    void (*easy_cleanup)(CURL *);
    const char *(*easy_strerror)(CURLcode);
    CURLcode (*easy_getinfo)(CURL *, CURLINFO, ...);
    struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
    void (*slist_free_all)(struct curl_slist *);
    /* the multi interface, for requests that run across calls (mg_http_begin);
     * NULL when this libcurl lacks curl_multi_poll (before 7.66) */
    CURLM *(*multi_init)(void);
    CURLMcode (*multi_add_handle)(CURLM *, CURL *);
    CURLMcode (*multi_remove_handle)(CURLM *, CURL *);
    CURLMcode (*multi_perform)(CURLM *, int *);
    CURLMcode (*multi_poll)(CURLM *, struct curl_waitfd *, unsigned int, int, int *);
    CURLMsg *(*multi_info_read)(CURLM *, int *);
    CURLMcode (*multi_cleanup)(CURLM *);
};

struct mg_http {
    struct curl_fns c;
    CURL *h;
    struct curl_slist *hdrs; /* mg_http_opts.headers */
    /* the response body */
    char *body;
    size_t len, cap, max;
    /* the request running */
    const struct mg_http_request *req;
    struct curl_slist *extra; /* its header lines, when it has some of its own */
    CURLM *multi;             /* for mg_http_begin, made on first use */
    int begun;                /* a request begun with mg_http_begin runs */
    long long sent;           /* of req->upload */
    int over;                 /* the body went over max */
    int data_rc;              /* on_data's negative code */
    char curl_err[CURL_ERROR_SIZE];
    char error[CURL_ERROR_SIZE + 256];
};

static int load_curl(struct curl_fns *c, const char *lib, char *err, size_t errlen)
{
    c->dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!c->dl)
        return mg_seterr(err, errlen, -MG_EUNSUPPORTED,
                         "cannot load %s (%s); install libcurl4 (Debian: apt-get install libcurl4)",
                         lib, dlerror());
#define SYM(field, name)                                                                           \
    do {                                                                                           \
        *(void **)&c->field = dlsym(c->dl, name);                                                  \
        if (!c->field) {                                                                           \
            dlclose(c->dl);                                                                        \
            c->dl = NULL;                                                                          \
            return mg_seterr(err, errlen, -MG_EUNSUPPORTED, "%s has no symbol %s", lib, name);     \
        }                                                                                          \
    } while (0)
    SYM(easy_init, "curl_easy_init");
    SYM(easy_setopt, "curl_easy_setopt");
    SYM(easy_perform, "curl_easy_perform");
    SYM(easy_cleanup, "curl_easy_cleanup");
    SYM(easy_strerror, "curl_easy_strerror");
    SYM(easy_getinfo, "curl_easy_getinfo");
    SYM(slist_append, "curl_slist_append");
    SYM(slist_free_all, "curl_slist_free_all");
#undef SYM
    *(void **)&c->multi_poll = dlsym(c->dl, "curl_multi_poll");
    if (c->multi_poll) {
        *(void **)&c->multi_init = dlsym(c->dl, "curl_multi_init");
        *(void **)&c->multi_add_handle = dlsym(c->dl, "curl_multi_add_handle");
        *(void **)&c->multi_remove_handle = dlsym(c->dl, "curl_multi_remove_handle");
        *(void **)&c->multi_perform = dlsym(c->dl, "curl_multi_perform");
        *(void **)&c->multi_info_read = dlsym(c->dl, "curl_multi_info_read");
        *(void **)&c->multi_cleanup = dlsym(c->dl, "curl_multi_cleanup");
        if (!c->multi_init || !c->multi_add_handle || !c->multi_remove_handle ||
            !c->multi_perform || !c->multi_info_read || !c->multi_cleanup)
            c->multi_poll = NULL;
    }
    return 0;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    struct mg_http *h = arg;
    size_t n = size * nmemb;

    if (h->req->on_data) {
        int rc = h->req->on_data(h->req->ctx, data, n);
        if (rc < 0)
            h->data_rc = rc;
        return rc == 0 ? n : 0; /* 0: libcurl ends the transfer */
    }
    if (h->len + n + 1 > h->max) {
        h->over = 1;
        return 0;
    }
    if (h->len + n + 1 > h->cap) {
        size_t cap = h->cap ? h->cap : 4096;
        while (cap < h->len + n + 1)
            cap *= 2;
        char *p = realloc(h->body, cap);
        if (!p) {
            h->data_rc = -ENOMEM;
            return 0;
        }
        h->body = p;
        h->cap = cap;
    }
    memcpy(h->body + h->len, data, n);
    h->len += n;
    h->body[h->len] = 0;
    return n;
}

/* The upload body, read where the last call stopped. */
static size_t on_read(char *buf, size_t size, size_t nitems, void *arg)
{
    struct mg_http *h = arg;
    const struct mg_http_file *f = h->req->upload;
    size_t want = size * nitems;
    if ((long long)want > f->len - h->sent)
        want = (size_t)(f->len - h->sent);
    if (!want)
        return 0;
    ssize_t n;
    do
        n = pread(f->fd, buf, want, (off_t)h->sent);
    while (n < 0 && errno == EINTR);
    if (n <= 0) { /* the file shrank, or a read error: the request fails */
        h->data_rc = n < 0 ? -errno : -EIO;
        return CURL_READFUNC_ABORT;
    }
    h->sent += n;
    return (size_t)n;
}

/* libcurl's progress callback, which it calls about once a second even
 * while nothing moves: gives up the request once abort_fd is readable. */
static int on_progress(void *arg, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    const struct mg_http *h = arg;
    struct pollfd p = {.fd = h->req ? h->req->abort_fd : -1, .events = POLLIN};
    return p.fd >= 0 && poll(&p, 1, 0) > 0;
}

int mg_http_open(struct mg_http **out, const struct mg_http_opts *o, char *err, size_t errlen)
{
    struct mg_http *h = calloc(1, sizeof(*h));
    int rc;

    *out = NULL;
    if (!h)
        return mg_seterr(err, errlen, -ENOMEM, "out of memory setting up libcurl");
    h->max = o->body_max ? o->body_max : MG_HTTP_BODY_MAX;
    rc = load_curl(&h->c, o->libcurl ? o->libcurl : MG_HTTP_LIBCURL, err, errlen);
    if (rc < 0) {
        free(h);
        return rc;
    }
    struct curl_fns *c = &h->c;
    h->h = c->easy_init();
    for (const char *const *p = o->headers; p && *p && h->h; p++) {
        struct curl_slist *l = c->slist_append(h->hdrs, *p);
        if (!l) {
            rc = -ENOMEM;
            break;
        }
        h->hdrs = l;
    }
    if (!h->h || rc < 0) {
        mg_http_close(h);
        return mg_seterr(err, errlen, -ENOMEM, "out of memory setting up libcurl");
    }
    c->easy_setopt(h->h, CURLOPT_NOSIGNAL, 1L);
    c->easy_setopt(h->h, CURLOPT_NOPROGRESS, 0L);
    c->easy_setopt(h->h, CURLOPT_XFERINFOFUNCTION, on_progress);
    c->easy_setopt(h->h, CURLOPT_XFERINFODATA, h);
    c->easy_setopt(h->h, CURLOPT_WRITEFUNCTION, on_body);
    c->easy_setopt(h->h, CURLOPT_WRITEDATA, h);
    c->easy_setopt(h->h, CURLOPT_TCP_NODELAY, 1L);
    c->easy_setopt(h->h, CURLOPT_HTTPHEADER, h->hdrs);
    c->easy_setopt(h->h, CURLOPT_ERRORBUFFER, h->curl_err);
    if (o->proxy)
        c->easy_setopt(h->h, CURLOPT_PROXY, o->proxy);
    if (o->connect_timeout_ms > 0)
        c->easy_setopt(h->h, CURLOPT_CONNECTTIMEOUT_MS, (long)o->connect_timeout_ms);
    if (o->cacert && *o->cacert)
        c->easy_setopt(h->h, CURLOPT_CAINFO, o->cacert);
    if (o->cert && *o->cert)
        c->easy_setopt(h->h, CURLOPT_SSLCERT, o->cert);
    if (o->key && *o->key)
        c->easy_setopt(h->h, CURLOPT_SSLKEY, o->key);
    *out = h;
    return 0;
}

void mg_http_close(struct mg_http *h)
{
    if (!h)
        return;
    mg_http_end(h);
    if (h->multi)
        h->c.multi_cleanup(h->multi);
    if (h->h)
        h->c.easy_cleanup(h->h);
    if (h->hdrs)
        h->c.slist_free_all(h->hdrs);
    if (h->c.dl)
        dlclose(h->c.dl);
    free(h->body);
    free(h);
}

static enum mg_http_fault fault_of(CURLcode cc, const char *detail)
{
    if (strstr(detail, "SSL") || strstr(detail, "certificate") ||
        cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CONNECT_ERROR ||
        cc == CURLE_SSL_CERTPROBLEM || cc == CURLE_SSL_CACERT_BADFILE)
        return MG_HTTP_FAULT_TLS;
    switch (cc) {
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
        return MG_HTTP_FAULT_CLOSED;
    case CURLE_OPERATION_TIMEDOUT:
        return MG_HTTP_FAULT_TIMEOUT;
    default:
        return MG_HTTP_FAULT_OTHER;
    }
}

static int code_of(CURLcode cc)
{
    switch (cc) {
    case CURLE_COULDNT_RESOLVE_HOST:
        return -MG_ENONAME;
    case CURLE_COULDNT_CONNECT:
        return -ECONNREFUSED;
    case CURLE_OPERATION_TIMEDOUT:
        return -ETIMEDOUT;
    case CURLE_OUT_OF_MEMORY:
        return -ENOMEM;
    case CURLE_ABORTED_BY_CALLBACK:
        return -EINTR; /* abort_fd */
    default:
        return -EIO;
    }
}

/* Sets the method on a handle that keeps the previous request's settings. */
static void set_method(struct mg_http *h, const struct mg_http_request *req)
{
    struct curl_fns *c = &h->c;
    const char *m = req->method;
    int head = m && strcmp(m, "HEAD") == 0;

    c->easy_setopt(h->h, CURLOPT_NOBODY, head ? 1L : 0L);
    c->easy_setopt(h->h, CURLOPT_UPLOAD, req->upload ? 1L : 0L);
    if (req->upload) {
        h->sent = 0;
        c->easy_setopt(h->h, CURLOPT_READFUNCTION, on_read);
        c->easy_setopt(h->h, CURLOPT_READDATA, h);
        c->easy_setopt(h->h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)req->upload->len);
        if (m && strcmp(m, "PUT") == 0)
            m = NULL;
    } else if (req->body) {
        c->easy_setopt(h->h, CURLOPT_POSTFIELDS, req->body);
        c->easy_setopt(h->h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
        if (m && strcmp(m, "POST") == 0)
            m = NULL;
    } else if (!head) {
        c->easy_setopt(h->h, CURLOPT_HTTPGET, 1L);
        if (m && strcmp(m, "GET") == 0)
            m = NULL;
    } else {
        m = NULL;
    }
    c->easy_setopt(h->h, CURLOPT_CUSTOMREQUEST, m);
}

/* Sets up the handle for req (the part every request shares); 0 or a
 * negative code with res filled. */
static int prepare(struct mg_http *h, const struct mg_http_request *req,
                   struct mg_http_response *res)
{
    struct curl_fns *c = &h->c;
    struct curl_slist *extra = NULL;
    int rc = 0;

    memset(res, 0, sizeof(*res));
    h->req = req;
    h->len = 0;
    h->over = 0;
    h->data_rc = 0;
    h->curl_err[0] = 0;
    h->error[0] = 0;
    if (h->body)
        h->body[0] = 0;
    res->body = h->body ? h->body : "";
    res->error = h->error;
    if (req->headers) {
        /* libcurl takes one list per request: the client's lines, then these. */
        for (const struct curl_slist *l = h->hdrs; l && rc == 0; l = l->next)
            rc = (extra = c->slist_append(extra, l->data)) ? 0 : -ENOMEM;
        for (const char *const *p = req->headers; *p && rc == 0; p++)
            rc = (extra = c->slist_append(extra, *p)) ? 0 : -ENOMEM;
        if (rc < 0) {
            if (extra)
                c->slist_free_all(extra);
            snprintf(h->error, sizeof(h->error), "out of memory");
            res->fault = MG_HTTP_FAULT_OTHER;
            h->req = NULL;
            return rc;
        }
        c->easy_setopt(h->h, CURLOPT_HTTPHEADER, extra);
    }
    h->extra = extra;
    c->easy_setopt(h->h, CURLOPT_URL, req->url);
    set_method(h, req);
    /* setting CURLOPT_AWS_SIGV4 chooses that scheme: back to basic without it */
    if (req->aws_sigv4)
        c->easy_setopt(h->h, CURLOPT_AWS_SIGV4, req->aws_sigv4);
    else
        c->easy_setopt(h->h, CURLOPT_HTTPAUTH, (long)CURLAUTH_BASIC);
    c->easy_setopt(h->h, CURLOPT_USERNAME, req->user);
    c->easy_setopt(h->h, CURLOPT_PASSWORD, req->password);
    c->easy_setopt(h->h, CURLOPT_TIMEOUT_MS, req->timeout_ms > 0 ? (long)req->timeout_ms : 0L);
    return 0;
}

/* The request's outcome from libcurl's code, as mg_http_request returns it. */
static int finish(struct mg_http *h, CURLcode cc, struct mg_http_response *res)
{
    struct curl_fns *c = &h->c;
    const struct mg_http_request *req = h->req;

    if (h->extra) {
        c->easy_setopt(h->h, CURLOPT_HTTPHEADER, h->hdrs);
        c->slist_free_all(h->extra);
        h->extra = NULL;
    }
    h->req = NULL;
    c->easy_getinfo(h->h, CURLINFO_RESPONSE_CODE, &res->status);
    res->body = h->body ? h->body : "";
    res->len = h->len;
    res->error = h->error;

    if (cc == CURLE_WRITE_ERROR && req->on_data && !h->data_rc)
        return 0; /* on_data ended it: the answer is known */
    if (cc == CURLE_OK)
        return 0;
    if (h->over) {
        snprintf(h->error, sizeof(h->error), "the response is over %zu bytes", h->max);
        res->fault = MG_HTTP_FAULT_OTHER;
        return -MG_ETOOBIG;
    }
    if (h->data_rc) {
        snprintf(h->error, sizeof(h->error), "%s", mg_strerror(h->data_rc));
        res->fault = MG_HTTP_FAULT_OTHER;
        return h->data_rc;
    }
    snprintf(h->error, sizeof(h->error), "%s%s%s%s", c->easy_strerror(cc),
             h->curl_err[0] ? " (" : "", h->curl_err, h->curl_err[0] ? ")" : "");
    res->fault = fault_of(cc, h->curl_err);
    return code_of(cc);
}

int mg_http_request(struct mg_http *h, const struct mg_http_request *req,
                    struct mg_http_response *res)
{
    mg_http_end(h);
    int rc = prepare(h, req, res);
    if (rc < 0)
        return rc;
    return finish(h, h->c.easy_perform(h->h), res);
}

int mg_http_begin(struct mg_http *h, const struct mg_http_request *req,
                  struct mg_http_response *res)
{
    mg_http_end(h);
    if (!h->c.multi_poll) {
        memset(res, 0, sizeof(*res));
        snprintf(h->error, sizeof(h->error), "this libcurl has no curl_multi_poll (7.66 or later)");
        res->error = h->error;
        res->fault = MG_HTTP_FAULT_OTHER;
        return -MG_EUNSUPPORTED;
    }
    if (!h->multi && !(h->multi = h->c.multi_init()))
        return -ENOMEM;
    int rc = prepare(h, req, res);
    if (rc < 0)
        return rc;
    if (h->c.multi_add_handle(h->multi, h->h) != CURLM_OK) {
        finish(h, CURLE_OUT_OF_MEMORY, res);
        return -ENOMEM;
    }
    h->begun = 1;
    return 0;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int mg_http_run(struct mg_http *h, int timeout_ms, struct mg_http_response *res)
{
    struct curl_fns *c = &h->c;
    int64_t end = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);

    if (!h->begun)
        return -EINVAL;
    for (;;) {
        int running = 0, queued;
        CURLMcode mc = c->multi_perform(h->multi, &running);
        CURLcode cc = CURLE_OK;
        int done = mc != CURLM_OK;
        if (mc != CURLM_OK)
            cc = CURLE_RECV_ERROR;
        for (CURLMsg *m; (m = c->multi_info_read(h->multi, &queued));)
            if (m->msg == CURLMSG_DONE) {
                cc = m->data.result;
                done = 1;
            }
        if (done) {
            c->multi_remove_handle(h->multi, h->h);
            h->begun = 0;
            return finish(h, cc, res);
        }
        int left = (int)(end - now_ms());
        if (left <= 0)
            return MG_HTTP_RUNNING;
        int afd = h->req->abort_fd;
        struct curl_waitfd w = {.fd = afd, .events = CURL_WAIT_POLLIN};
        /* A poll that fails fails at once: ending the request here keeps
         * the loop from spinning until the timeout. */
        if (c->multi_poll(h->multi, afd >= 0 ? &w : NULL, afd >= 0 ? 1 : 0, left, NULL) !=
            CURLM_OK) {
            c->multi_remove_handle(h->multi, h->h);
            h->begun = 0;
            return finish(h, CURLE_RECV_ERROR, res);
        }
        if (afd >= 0 && (w.revents & CURL_WAIT_POLLIN)) {
            mg_http_end(h);
            memset(res, 0, sizeof(*res));
            snprintf(h->error, sizeof(h->error), "given up (abort)");
            res->error = h->error;
            res->body = "";
            res->fault = MG_HTTP_FAULT_OTHER;
            return -EINTR;
        }
    }
}

void mg_http_end(struct mg_http *h)
{
    struct mg_http_response res;
    if (!h || !h->begun)
        return;
    h->c.multi_remove_handle(h->multi, h->h);
    h->begun = 0;
    finish(h, CURLE_OK, &res);
}

int mg_http_local_addr(const struct mg_http *h, char *buf, size_t len)
{
    char *ip = NULL;
    if (h->c.easy_getinfo(h->h, CURLINFO_LOCAL_IP, &ip) != CURLE_OK || !ip || !*ip)
        return -ENOTCONN;
    snprintf(buf, len, "%s", ip);
    return 0;
}
