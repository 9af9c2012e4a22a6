/* http.c against a small HTTP/1.1 server this test runs on loopback in a
 * thread: methods on a reused handle, the client's and the request's headers,
 * bodies both ways, a status that is not 200, the body cap, a refused
 * connection, an unknown host, the timeout, abort_fd, a streamed body ended
 * by on_data, a body sent from a file (PUT, then a GET on the same handle), a
 * request signed with AWS Signature V4 by libcurl, basic auth, and a libcurl
 * that cannot be loaded. */
#include "http.h"
#include "mg_err.h"
#include "net.h"
#include "tap.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

/* timeout: 60 */

#define BIG_LEN 100000

static int srv_fd = -1, srv_port;
static volatile int srv_stop;

static void send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

static void respond(int fd, int status, const char *body, size_t len)
{
    char head[256];
    int n =
        snprintf(head, sizeof(head),
                 "HTTP/1.1 %d X\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", status, len);
    send_all(fd, head, (size_t)n);
    send_all(fd, body, len);
}

/* Until the client hangs up (it gave up), at most 10 s. */
static void hold(int fd)
{
    char b[256];
    struct pollfd p = {.fd = fd, .events = POLLIN};
    for (int i = 0; i < 100 && !srv_stop; i++)
        if (poll(&p, 1, 100) > 0 && recv(fd, b, sizeof(b), 0) <= 0)
            return;
}

/* The value of header name in the request head, or "-". */
static void header(const char *head, const char *name, char *out, size_t cap)
{
    size_t n = strlen(name);
    for (const char *p = strstr(head, "\r\n"); p; p = strstr(p + 2, "\r\n")) {
        if (strncasecmp(p + 2, name, n) == 0 && p[2 + n] == ':') {
            const char *v = p + 3 + n, *end = strstr(v, "\r\n");
            while (*v == ' ')
                v++;
            snprintf(out, cap, "%.*s", (int)(end - v), v);
            return;
        }
    }
    snprintf(out, cap, "-");
}

static void serve(int fd)
{
    static char req[65536], out[BIG_LEN];
    size_t n = 0;
    char *end = NULL;

    while (n < sizeof(req) - 1 && !(end = strstr(req, "\r\n\r\n"))) {
        ssize_t r = recv(fd, req + n, sizeof(req) - 1 - n, 0);
        if (r <= 0)
            return;
        n += (size_t)r;
        req[n] = 0;
    }
    if (!end)
        return;
    char method[16] = "", path[256] = "", len[32], client[64], test[64], ctype[64], auth[512],
         amz[128];
    sscanf(req, "%15s %255s", method, path);
    *end = 0;
    header(req, "Content-Length", len, sizeof(len));
    header(req, "X-Client", client, sizeof(client));
    header(req, "X-Test", test, sizeof(test));
    header(req, "Content-Type", ctype, sizeof(ctype));
    header(req, "Authorization", auth, sizeof(auth));
    header(req, "X-Amz-Date", amz, sizeof(amz));
    size_t want = len[0] == '-' ? 0 : (size_t)atol(len), have = n - (size_t)(end + 4 - req);
    char *body = end + 4;
    while (have < want && body + have < req + sizeof(req) - 1) {
        ssize_t r = recv(fd, body + have, want - have, 0);
        if (r <= 0)
            return;
        have += (size_t)r;
    }
    body[have] = 0;

    if (strcmp(path, "/echo") == 0) {
        int k = snprintf(out, sizeof(out), "%s %s\nx-client=%s\nx-test=%s\nctype=%s\nbody=%s",
                         method, path, client, test, ctype, body);
        respond(fd, 200, out, (size_t)k);
    } else if (strcmp(path, "/auth") == 0) {
        int k = snprintf(out, sizeof(out), "%s\nauth=%s\nx-amz-date=%s\nbody=%s", method, auth, amz,
                         body);
        respond(fd, 200, out, (size_t)k);
    } else if (strcmp(path, "/404") == 0) {
        respond(fd, 404, "nope", 4);
    } else if (strcmp(path, "/big") == 0) {
        memset(out, 'x', BIG_LEN);
        respond(fd, 200, out, BIG_LEN);
    } else if (strcmp(path, "/stream") == 0) {
        const char *h = "HTTP/1.1 200 X\r\nConnection: close\r\n\r\none\ntwo\n";
        send_all(fd, h, strlen(h));
        hold(fd);
    } else {
        hold(fd); /* /slow: no answer */
    }
}

static void *server(void *arg)
{
    while (!srv_stop) {
        struct pollfd p = {.fd = srv_fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        int c = accept(srv_fd, NULL, NULL);
        if (c < 0)
            continue;
        serve(c);
        close(c);
    }
    return NULL;
}

struct lines {
    int n, stop_at;
    char seen[64];
};

static int on_lines(void *ctx, const char *data, size_t len)
{
    struct lines *l = ctx;
    for (size_t i = 0; i < len; i++) {
        size_t k = strlen(l->seen);
        if (k + 1 < sizeof(l->seen))
            l->seen[k] = data[i];
        if (data[i] == '\n' && ++l->n == l->stop_at)
            return l->stop_at > 0 ? 1 : 0;
    }
    return l->stop_at < 0 ? -EPROTO : 0;
}

static int get(struct mg_http *h, const char *method, const char *path, const char *body,
               const char *const *headers, struct mg_http_response *res)
{
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", srv_port, path);
    struct mg_http_request req = {
        .method = method,
        .url = url,
        .headers = headers,
        .body = body,
        .body_len = body ? strlen(body) : 0,
        .timeout_ms = 5000,
        .abort_fd = -1,
    };
    return mg_http_request(h, &req, res);
}

int main(void)
{
    static const char *const client_headers[] = {"X-Client: c1", "Content-Type: text/plain", NULL};
    struct mg_http_opts o = {.proxy = "", .headers = client_headers};
    struct mg_http_response res;
    struct mg_http *h, *small;
    char err[MG_ERRMSG_LEN], url[128];
    pthread_t tid;
    int rc;

    {
        struct mg_http_opts bad = {.libcurl = "libnosuchcurl.so.9"};
        rc = mg_http_open(&h, &bad, err, sizeof(err));
        ok(rc == -MG_EUNSUPPORTED && strstr(err, "libnosuchcurl.so.9"),
           "a libcurl that cannot be loaded is named: %s", err);
    }
    if (mg_http_open(&h, &o, err, sizeof(err)) < 0)
        skip_all("libcurl: %s", err);
    srv_fd = mg_listen_tcp("127.0.0.1", 0, 16, &srv_port);
    if (srv_fd < 0 || pthread_create(&tid, NULL, server, NULL) != 0)
        BAIL_OUT("cannot start the test server");

    rc = get(h, NULL, "/echo", NULL, NULL, &res);
    ok(rc == 0 && res.status == 200, "GET: 200 (rc %d, %s)", rc, res.error);
    is_str(res.body, "GET /echo\nx-client=c1\nx-test=-\nctype=text/plain\nbody=",
           "  with the client's headers");
    is_int((int)res.len, (int)strlen(res.body), "  len is the body's");
    is_str(res.error, "", "  and no error text");

    static const char *const mine[] = {"X-Test: r1", NULL};
    rc = get(h, NULL, "/echo", "hello", mine, &res);
    ok(rc == 0 && strstr(res.body, "POST /echo\n") &&
           strstr(res.body, "x-client=c1\nx-test=r1\n") && strstr(res.body, "body=hello"),
       "POST with a body and a request header, on top of the client's");
    rc = get(h, NULL, "/echo", NULL, NULL, &res);
    ok(rc == 0 && strstr(res.body, "x-test=-\n"), "  the request's header does not stay");
    rc = get(h, "PUT", "/echo", "data", NULL, &res);
    ok(rc == 0 && strstr(res.body, "PUT /echo\n") && strstr(res.body, "body=data"),
       "PUT with a body");
    rc = get(h, "DELETE", "/echo", NULL, NULL, &res);
    ok(rc == 0 && strncmp(res.body, "DELETE /echo\n", 13) == 0, "DELETE without one");
    rc = get(h, "HEAD", "/echo", NULL, NULL, &res);
    ok(rc == 0 && res.status == 200 && res.len == 0, "HEAD: a status, no body (rc %d)", rc);
    rc = get(h, "GET", "/echo", NULL, NULL, &res);
    ok(rc == 0 && strncmp(res.body, "GET /echo\n", 10) == 0, "GET after HEAD gets a body again");

    rc = get(h, NULL, "/404", NULL, NULL, &res);
    ok(rc == 0 && res.status == 404 && strcmp(res.body, "nope") == 0,
       "a 404 is a response, with its body");
    rc = get(h, NULL, "/big", NULL, NULL, &res);
    ok(rc == 0 && res.len == BIG_LEN, "a body of %d bytes", BIG_LEN);
    {
        char addr[64] = "";
        ok(mg_http_local_addr(h, addr, sizeof(addr)) == 0 && strcmp(addr, "127.0.0.1") == 0,
           "the local address of the connection: %s", addr);
    }

    struct mg_http_opts so = {.proxy = "", .body_max = 1000};
    if (mg_http_open(&small, &so, err, sizeof(err)) < 0)
        BAIL_OUT("mg_http_open: %s", err);
    rc = get(small, NULL, "/big", NULL, NULL, &res);
    ok(rc == -MG_ETOOBIG && strstr(res.error, "1000"), "over body_max: -MG_ETOOBIG (%s)",
       res.error);
    mg_http_close(small);

    {
        struct lines l = {.stop_at = 2};
        snprintf(url, sizeof(url), "http://127.0.0.1:%d/stream", srv_port);
        struct mg_http_request req = {
            .url = url, .timeout_ms = 8000, .abort_fd = -1, .on_data = on_lines, .ctx = &l};
        rc = mg_http_request(h, &req, &res);
        ok(rc == 0 && l.n == 2 && strcmp(l.seen, "one\ntwo\n") == 0,
           "on_data ends a stream that stays open (rc %d, %d lines)", rc, l.n);
        is_str(res.body, "", "  and the response's body is empty");
        struct lines e = {.stop_at = -1};
        req.ctx = &e;
        rc = mg_http_request(h, &req, &res);
        is_int(rc, -EPROTO, "on_data's error fails the request with its code");
    }

    {
        snprintf(url, sizeof(url), "http://127.0.0.1:%d/slow", srv_port);
        struct mg_http_request req = {.url = url, .timeout_ms = 300, .abort_fd = -1};
        rc = mg_http_request(h, &req, &res);
        ok(rc == -ETIMEDOUT && res.fault == MG_HTTP_FAULT_TIMEOUT && res.error[0],
           "no answer: -ETIMEDOUT (%s)", res.error);
        int p[2];
        if (pipe(p) < 0)
            BAIL_OUT("pipe");
        if (write(p[1], "x", 1) != 1)
            BAIL_OUT("write");
        req.timeout_ms = 20000;
        req.abort_fd = p[0];
        rc = mg_http_request(h, &req, &res);
        is_int(rc, -EINTR, "a readable abort_fd gives the request up");
        close(p[0]);
        close(p[1]);
    }

    {
        int port, fd = mg_listen_tcp("127.0.0.1", 0, 1, &port);
        close(fd); /* nothing listens there now */
        snprintf(url, sizeof(url), "http://127.0.0.1:%d/", port);
        struct mg_http_request req = {.url = url, .timeout_ms = 3000, .abort_fd = -1};
        rc = mg_http_request(h, &req, &res);
        ok(rc == -ECONNREFUSED && res.error[0] && res.status == 0,
           "nothing listening: -ECONNREFUSED (%s)", res.error);
        req.url = "http://nosuchhost.invalid:1/";
        rc = mg_http_request(h, &req, &res);
        ok(rc == -MG_ENONAME, "an unknown host: -MG_ENONAME (%s)", res.error);
    }

    {
        /* a body from a file: only len bytes, read with pread */
        char path[] = "/tmp/mghttp.XXXXXX";
        int fd = mkstemp(path);
        if (fd < 0 || write(fd, "file body and more", 18) != 18)
            BAIL_OUT("temp file");
        unlink(path);
        struct mg_http_file f = {.fd = fd, .len = 9};
        snprintf(url, sizeof(url), "http://127.0.0.1:%d/echo", srv_port);
        struct mg_http_request req = {.url = url, .timeout_ms = 5000, .abort_fd = -1, .upload = &f};
        rc = mg_http_request(h, &req, &res);
        ok(rc == 0 && strstr(res.body, "PUT /echo\n") && strstr(res.body, "body=file body") &&
               !strstr(res.body, "body=file body and"),
           "a body from a file: PUT of its first 9 bytes (rc %d)", rc);
        is_int((int)lseek(fd, 0, SEEK_CUR), 18, "  the descriptor's position is left alone");
        rc = mg_http_request(h, &req, &res);
        ok(rc == 0 && strstr(res.body, "body=file body"), "  and again from the start");
        rc = get(h, NULL, "/echo", NULL, NULL, &res);
        ok(rc == 0 && strncmp(res.body, "GET /echo\n", 10) == 0, "a GET after it is a GET");
        f.len = 100; /* more than the file has */
        rc = mg_http_request(h, &req, &res);
        ok(rc < 0, "a file shorter than said fails the request (rc %d: %s)", rc, res.error);
        close(fd);

        static const char *const s3[] = {"x-amz-content-sha256: UNSIGNED-PAYLOAD", NULL};
        snprintf(url, sizeof(url), "http://127.0.0.1:%d/auth", srv_port);
        struct mg_http_request sreq = {.url = url,
                                       .method = "PUT",
                                       .body = "x",
                                       .body_len = 1,
                                       .headers = s3,
                                       .timeout_ms = 5000,
                                       .abort_fd = -1,
                                       .aws_sigv4 = "aws:amz:us-east-1:s3",
                                       .user = "AKIDEXAMPLE",
                                       .password = "secret"};
        rc = mg_http_request(h, &sreq, &res);
        ok(rc == 0 && strstr(res.body, "auth=AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/") &&
               strstr(res.body, "/us-east-1/s3/aws4_request, SignedHeaders=") &&
               strstr(res.body, ";host;x-amz-content-sha256;x-amz-date;") &&
               !strstr(res.body, "x-amz-date=-"),
           "signed by libcurl with AWS SigV4, the payload hash header among the signed ones");
        struct mg_http_request breq = {
            .url = url, .timeout_ms = 5000, .abort_fd = -1, .user = "user", .password = "pass"};
        rc = mg_http_request(h, &breq, &res);
        ok(rc == 0 && strstr(res.body, "GET\nauth=Basic dXNlcjpwYXNz\n"),
           "user and password without SigV4: basic auth");
        rc = get(h, NULL, "/auth", NULL, NULL, &res);
        ok(rc == 0 && strstr(res.body, "auth=-\n"), "  neither stays for the next request");
    }

    mg_http_close(h);
    srv_stop = 1;
    pthread_join(tid, NULL);
    close(srv_fd);
    return done_testing();
}
