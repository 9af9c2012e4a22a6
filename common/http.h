/* A small HTTP client over libcurl loaded at run time (dlopen), so that
 * mglaunch and libmg never link libcurl and pay for it only when something
 * speaks HTTP: the etcd rendezvous (launcher/rdzv/kv_etcd.c) today, remote
 * uploads of checkpoints next.
 *
 * One struct mg_http is one libcurl easy handle: its requests run one at a
 * time, each blocking until it is answered, times out or is given up (abort_fd),
 * and they reuse its connection. A request may send a file's bytes (upload,
 * read with pread), take its response as a stream (on_data, e.g. into a
 * file), and be signed with AWS Signature V4 by libcurl (aws_sigv4), as the
 * checkpoint uploads of runtime/upload do. A request may also run across
 * calls (mg_http_begin, below), as a wait parked between a loop's slices. */
#ifndef MG_HTTP_H
#define MG_HTTP_H

#include <stddef.h>

#define MG_HTTP_LIBCURL  "libcurl.so.4"
#define MG_HTTP_BODY_MAX (64u << 20) /* default cap of a response body */

struct mg_http;

struct mg_http_opts {
    const char *libcurl; /* the library to dlopen; NULL: MG_HTTP_LIBCURL */
    /* TLS: PEM files; NULL or "": libcurl's defaults (the system's CAs, no
     * client certificate) */
    const char *cacert, *cert, *key;
    /* NULL: libcurl's default (the *_proxy environment variables); "": no
     * proxy, for a server reached directly (etcd) */
    const char *proxy;
    const char *const *headers; /* "Name: value" lines sent with every request,
                                   NULL-terminated; NULL: none */
    int connect_timeout_ms;     /* <= 0: libcurl's default */
    size_t body_max;            /* cap of a response body; 0: MG_HTTP_BODY_MAX */
};

/* A body sent from a file: len bytes from offset 0 of fd, read with pread
 * (the descriptor's position is left alone). */
struct mg_http_file {
    int fd;
    long long len;
};

struct mg_http_request {
    const char *method; /* "GET", "POST", "PUT", "DELETE", "HEAD"...; NULL: POST
                           when there is a body, GET otherwise */
    const char *url;
    const char *const *headers; /* more lines for this request, NULL-terminated */
    const void *body;           /* NULL: none */
    size_t body_len;
    const struct mg_http_file *upload; /* NULL, or the body from a file (not with body);
                                          the method defaults to PUT */
    /* AWS Signature V4 by libcurl (CURLOPT_AWS_SIGV4, "aws:amz:REGION:SERVICE"),
     * user and password being the access key id and the secret; NULL: none.
     * libcurl 7.88 signs the x-amz-* headers given but adds no
     * x-amz-content-sha256 of its own: S3 wants one among headers. */
    const char *aws_sigv4;
    const char *user, *password; /* also HTTP basic auth without aws_sigv4 */
    int timeout_ms;              /* the whole request, <= 0: none */
    int abort_fd;                /* -1, or a descriptor whose readability gives the request
                       up (-EINTR); libcurl looks about once a second */
    /* Optional: takes the response body as it arrives instead of the
     * response's buffer (a stream, such as etcd's watch). Returns 0 to go on,
     * 1 to end the request there (it then succeeds), or a negative code to
     * fail it with that code. */
    int (*on_data)(void *ctx, const char *data, size_t len);
    void *ctx;
};

/* How a request failed, beyond its code: for a hint in the caller's message. */
enum mg_http_fault {
    MG_HTTP_FAULT_NONE,
    MG_HTTP_FAULT_TLS,     /* the TLS handshake or a certificate */
    MG_HTTP_FAULT_CLOSED,  /* the server closed the connection, or sending or receiving failed */
    MG_HTTP_FAULT_TIMEOUT, /* no complete answer within timeout_ms */
    MG_HTTP_FAULT_OTHER,
};

struct mg_http_response {
    long status;      /* the HTTP status; 0 when none arrived */
    const char *body; /* NUL-terminated; "" when on_data took it. The client's
                         buffer: valid until its next request */
    size_t len;
    /* After a failure: libcurl's words for it ("Couldn't connect to server
     * (Failed to connect to ...)"), valid until the next request; "" after
     * a success. */
    const char *error;
    enum mg_http_fault fault;
};

/* Loads libcurl and creates a client; sends nothing. -MG_EUNSUPPORTED when
 * libcurl cannot be loaded, -ENOMEM; err says which. */
int mg_http_open(struct mg_http **out, const struct mg_http_opts *o, char *err, size_t errlen);
void mg_http_close(struct mg_http *h);

/* Runs one request. 0 when a response arrived, whatever its status (then
 * *res has it), or a negative code with res->error and res->fault set:
 * -MG_ENONAME the host name does not resolve, -ECONNREFUSED nothing listens,
 * -ETIMEDOUT timeout_ms passed, -EINTR abort_fd, -MG_ETOOBIG the body is over
 * body_max, -ENOMEM, on_data's code, -EIO anything else. */
int mg_http_request(struct mg_http *h, const struct mg_http_request *req,
                    struct mg_http_response *res);

/* A request that runs across calls, through libcurl's multi interface: a
 * wait that its caller drives in short slices from its own loop stays open
 * between them (etcd's watch). mg_http_begin starts it (0, or a negative
 * code with res filled; -MG_EUNSUPPORTED from a libcurl older than 7.66);
 * each mg_http_run drives it for at most timeout_ms and returns
 * MG_HTTP_RUNNING while it goes on, else what mg_http_request would have
 * (the request is then over); mg_http_end drops it, and its connection.
 * Meanwhile req, and what it points to, must stay valid, and the client
 * runs no other request: mg_http_request and mg_http_begin end it first. */
#define MG_HTTP_RUNNING 1
int mg_http_begin(struct mg_http *h, const struct mg_http_request *req,
                  struct mg_http_response *res);
int mg_http_run(struct mg_http *h, int timeout_ms, struct mg_http_response *res);
void mg_http_end(struct mg_http *h);

/* The local address of the client's last connection (numeric). */
int mg_http_local_addr(const struct mg_http *h, char *buf, size_t len);

#endif
