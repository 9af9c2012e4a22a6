/* The destinations of remote copies (see upload.h): S3 through libcurl's AWS
 * SigV4 signing, a plain HTTP(S) PUT (WebDAV), and a command. One file per
 * call, on the sender thread. */
#include "upload_internal.h"
#include "fs.h"
#include "http.h"
#include "mg_err.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define CONNECT_TIMEOUT_MS 10000

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* The URL without "user:password@". */
void mg_upload_describe(const char *dest, char *buf, size_t cap)
{
    const char *s = dest ? dest : "";
    const char *scheme = strstr(s, "://");
    const char *host = scheme ? scheme + 3 : s;
    const char *slash = strchr(host, '/'), *at = strchr(host, '@');
    if (at && (!slash || at < slash))
        mg_fmt(buf, cap, "%.*s%s", (int)(host - s), s, at + 1);
    else
        mg_fmt(buf, cap, "%s", s);
}

int mg_upload_check_dest(const char *dest, char *err, size_t errlen)
{
    char shown[1024];
    const char *s = dest ? dest : "";
    mg_upload_describe(s, shown, sizeof(shown));
    if (strncmp(s, "s3://", 5) == 0) {
        if (s[5] == '\0' || s[5] == '/')
            return mg_seterr(err, errlen, -EINVAL, "'%s': no bucket: want s3://BUCKET/PREFIX",
                             shown);
        return 0;
    }
    const char *host = strncmp(s, "http://", 7) == 0    ? s + 7
                       : strncmp(s, "https://", 8) == 0 ? s + 8
                                                        : NULL;
    if (!host)
        return mg_seterr(err, errlen, -EINVAL,
                         "'%s': want s3://BUCKET/PREFIX, http://... or https://...", shown);
    size_t alen = strcspn(host, "/?#");
    const char *at = NULL;
    for (size_t i = 0; i < alen; i++)
        if (host[i] == '@')
            at = host + i;
    if (at) {
        alen -= (size_t)(at + 1 - host);
        host = at + 1;
    }
    const char *port = NULL;
    if (host[0] == '[') { /* an IPv6 address */
        const char *close = memchr(host, ']', alen);
        if (!close)
            return mg_seterr(err, errlen, -EINVAL,
                             "'%s': an IPv6 address without its closing ']' (want "
                             "http://[ADDRESS]:PORT/PATH)",
                             shown);
        if (close == host + 1)
            return mg_seterr(err, errlen, -EINVAL, "'%s': an empty IPv6 address", shown);
        if (close + 1 < host + alen && close[1] != ':')
            return mg_seterr(err, errlen, -EINVAL, "'%s': after ']' want ':PORT' or '/'", shown);
        if (close + 1 < host + alen)
            port = close + 2;
    } else {
        const char *colon = memchr(host, ':', alen);
        if ((colon ? (size_t)(colon - host) : alen) == 0)
            return mg_seterr(err, errlen, -EINVAL, "'%s': no host name", shown);
        if (colon)
            port = colon + 1;
    }
    if (port) {
        long v = 0;
        const char *p = port;
        for (; p < host + alen && *p >= '0' && *p <= '9' && v <= 65535; p++)
            v = v * 10 + (*p - '0');
        if (p == port || p != host + alen || v < 1 || v > 65535)
            return mg_seterr(err, errlen, -EINVAL, "'%s': the port is not a number from 1 to 65535",
                             shown);
    }
    return 0;
}

/* Appends s to out with every byte but unreserved ones and '/' as %XX (an
 * S3 key or a path as SigV4's canonical URI wants it). */
static int put_encoded(char *out, size_t cap, const char *s)
{
    size_t n = strlen(out);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        int plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.' || c == '~' || c == '/';
        if (n + 4 >= cap)
            return -ENAMETOOLONG;
        n += (size_t)(plain ? snprintf(out + n, cap - n, "%c", c)
                            : snprintf(out + n, cap - n, "%%%02X", c));
    }
    return 0;
}

static int url_of(const struct upload_dest *d, const char *name, char *url, size_t cap)
{
    if (mg_fmt(url, cap, "%s/", d->base) < 0)
        return -ENAMETOOLONG;
    return put_encoded(url, cap, name);
}

static int open_s3(struct upload_dest *d, const char *dest, char *err, size_t errlen)
{
    const char *p = dest + 5, *slash = strchr(p, '/');
    char bucket[256], prefix[1024] = "";
    size_t blen = slash ? (size_t)(slash - p) : strlen(p);
    if (blen == 0 || blen >= sizeof(bucket))
        return mg_seterr(err, errlen, -EINVAL, "'%s': want s3://BUCKET/PREFIX", dest);
    memcpy(bucket, p, blen);
    bucket[blen] = '\0';
    if (slash) {
        const char *q = slash + 1;
        size_t n = strlen(q);
        while (n && q[n - 1] == '/')
            n--;
        if (n >= sizeof(prefix) - 1)
            return mg_seterr(err, errlen, -ENAMETOOLONG, "'%s': prefix too long", dest);
        if (n)
            mg_fmt(prefix, sizeof(prefix), "/%.*s", (int)n, q);
    }
    const char *key = env("AWS_ACCESS_KEY_ID"), *secret = env("AWS_SECRET_ACCESS_KEY");
    if (!key || !secret)
        return mg_seterr(err, errlen, -EINVAL,
                         "'%s': AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set", dest);
    if (strlen(key) >= sizeof(d->key) || strlen(secret) >= sizeof(d->secret))
        return mg_seterr(err, errlen, -EINVAL, "AWS credentials too long");
    mg_fmt(d->key, sizeof(d->key), "%s", key);
    mg_fmt(d->secret, sizeof(d->secret), "%s", secret);
    const char *token = env("AWS_SESSION_TOKEN");
    if (token && mg_fmt(d->token_hdr, sizeof(d->token_hdr), "x-amz-security-token: %s", token) < 0)
        return mg_seterr(err, errlen, -EINVAL, "AWS_SESSION_TOKEN too long");
    const char *region = env("AWS_REGION");
    if (!region)
        region = env("AWS_DEFAULT_REGION");
    if (!region)
        region = "us-east-1";
    if (strlen(region) > 64 || strchr(region, ':') || strchr(region, '/'))
        return mg_seterr(err, errlen, -EINVAL, "AWS region '%s' is not a region name", region);
    mg_fmt(d->sigv4, sizeof(d->sigv4), "aws:amz:%s:s3", region);
    const char *endpoint = env("AWS_ENDPOINT_URL_S3");
    if (!endpoint)
        endpoint = env("AWS_ENDPOINT_URL");
    char path[1400] = "";
    if (endpoint) { /* an S3-compatible store: path-style, ENDPOINT/BUCKET/KEY */
        size_t n = strlen(endpoint);
        while (n && endpoint[n - 1] == '/')
            n--;
        mg_fmt(path, sizeof(path), "/%s%s", bucket, prefix);
        if (mg_fmt(d->base, sizeof(d->base), "%.*s", (int)n, endpoint) < 0)
            return mg_seterr(err, errlen, -ENAMETOOLONG, "endpoint too long");
    } else {
        mg_fmt(path, sizeof(path), "%s", prefix);
        mg_fmt(d->base, sizeof(d->base), "https://%s.s3.%s.amazonaws.com", bucket, region);
    }
    if (put_encoded(d->base, sizeof(d->base), path) < 0)
        return mg_seterr(err, errlen, -ENAMETOOLONG, "'%s': too long", dest);
    return 0;
}

/* A directory of our own for a command's files. */
static int open_stage(struct upload_dest *d, const char *where, char *err, size_t errlen)
{
    const char *tmp = where ? where : env("TMPDIR");
    if (mg_fmt(d->stage, sizeof(d->stage), "%s/mg-upload.XXXXXX", tmp ? tmp : "/tmp") < 0)
        return mg_seterr(err, errlen, -ENAMETOOLONG, "temporary directory name too long");
    if (!mkdtemp(d->stage)) {
        int rc = -errno;
        return mg_seterr(err, errlen, rc, "cannot create '%s': %s", d->stage, strerror(-rc));
    }
    return 0;
}

int upload_dest_open(struct upload_dest *d, const struct mg_upload_config *cfg, char *err,
                     size_t errlen)
{
    memset(d, 0, sizeof(*d));
    d->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 600000;
    if (cfg->cmd) {
        if (cfg->dest)
            return mg_seterr(err, errlen, -EINVAL, "a destination or a command, not both");
        if (!*cfg->cmd)
            return mg_seterr(err, errlen, -EINVAL, "an empty upload command");
        d->kind = UPLOAD_CMD;
        d->cmd = cfg->cmd;
        mg_fmt(d->shown, sizeof(d->shown), "command '%s'", cfg->cmd);
        return open_stage(d, cfg->stage_dir, err, errlen);
    }
    const char *dest = cfg->dest ? cfg->dest : "";
    int rc;
    mg_upload_describe(dest, d->shown, sizeof(d->shown));
    if (strncmp(dest, "s3://", 5) == 0) {
        d->kind = UPLOAD_S3;
        rc = open_s3(d, dest, err, errlen);
    } else if (strncmp(dest, "http://", 7) == 0 || strncmp(dest, "https://", 8) == 0) {
        size_t n = strlen(dest);
        while (n && dest[n - 1] == '/')
            n--;
        d->kind = UPLOAD_HTTP;
        rc = mg_fmt(d->base, sizeof(d->base), "%.*s", (int)n, dest) < 0
                 ? mg_seterr(err, errlen, -ENAMETOOLONG, "'%s': too long", d->shown)
                 : 0;
    } else {
        rc = mg_seterr(err, errlen, -EINVAL,
                       "'%s': a destination is s3://BUCKET/PREFIX, http://... or https://...",
                       d->shown);
    }
    if (rc < 0)
        return rc;
    struct mg_http_opts ho = {.libcurl = cfg->libcurl, .connect_timeout_ms = CONNECT_TIMEOUT_MS};
    return mg_http_open(&d->http, &ho, err, errlen);
}

void upload_dest_close(struct upload_dest *d)
{
    mg_http_close(d->http);
    d->http = NULL;
    if (d->stage[0])
        rmdir(d->stage);
    memset(d->secret, 0, sizeof(d->secret));
}

/* "HTTP 403 (SignatureDoesNotMatch: The request signature we calculated ...)" from
 * an S3 error document, or the status alone. */
static void http_failure(long status, const char *body, char *err, size_t errlen)
{
    const char *code = strstr(body, "<Code>"), *msg = strstr(body, "<Message>");
    int cl = code ? (int)strcspn(code + 6, "<") : 0, ml = msg ? (int)strcspn(msg + 9, "<") : 0;
    if (code)
        mg_fmt(err, errlen, "HTTP %ld (%.*s%s%.*s)", status, cl > 100 ? 100 : cl, code + 6,
               msg ? ": " : "", ml > 160 ? 160 : ml, msg ? msg + 9 : "");
    else
        mg_fmt(err, errlen, "HTTP %ld", status);
}

static void request_for(struct upload_dest *d, struct mg_http_request *rq, const char *url,
                        const char **hdrs, int abort_fd)
{
    int n = 0;
    memset(rq, 0, sizeof(*rq));
    rq->url = url;
    rq->timeout_ms = d->timeout_ms;
    rq->abort_fd = abort_fd;
    if (d->kind != UPLOAD_S3)
        hdrs[n++] = "Expect:"; /* no 100-continue round trip (libcurl 7.88 would sign
                                  the removed header and the signature fail) */
    if (d->kind == UPLOAD_S3) {
        /* libcurl 7.88 signs it but does not add it; S3 requires it */
        hdrs[n++] = "x-amz-content-sha256: UNSIGNED-PAYLOAD";
        if (d->token_hdr[0])
            hdrs[n++] = d->token_hdr;
        rq->aws_sigv4 = d->sigv4;
        rq->user = d->key;
        rq->password = d->secret;
    }
    hdrs[n] = NULL;
    rq->headers = hdrs;
}

static int http_put(struct upload_dest *d, const char *name, int fd, long long len,
                    const char *text, int abort_fd, int *permanent, char *err, size_t errlen)
{
    char url[4096];
    const char *hdrs[4];
    struct mg_http_request rq;
    struct mg_http_response res;
    struct mg_http_file f = {.fd = fd, .len = len};
    if (url_of(d, name, url, sizeof(url)) < 0)
        return mg_seterr(err, errlen, -ENAMETOOLONG, "%s: name too long", name);
    request_for(d, &rq, url, hdrs, abort_fd);
    rq.method = "PUT";
    if (fd >= 0) {
        rq.upload = &f;
    } else {
        rq.body = text;
        rq.body_len = strlen(text);
    }
    int rc = mg_http_request(d->http, &rq, &res);
    if (rc < 0)
        return mg_seterr(err, errlen, rc, "%s", res.error);
    if (res.status >= 200 && res.status < 300)
        return 0;
    http_failure(res.status, res.body, err, errlen);
    *permanent = res.status >= 400 && res.status < 500 && res.status != 408 && res.status != 429;
    return -EIO;
}

/* ---- a command -------------------------------------------------------------------------- */

/* 'x' as a shell word. */
static int shell_quote(char *out, size_t cap, const char *s)
{
    size_t n = 0;
    if (cap < 3)
        return -ENAMETOOLONG;
    out[n++] = '\'';
    for (; *s; s++) {
        const char *piece = *s == '\'' ? "'\\''" : NULL;
        size_t k = piece ? strlen(piece) : 1;
        if (n + k + 2 > cap)
            return -ENAMETOOLONG;
        if (piece)
            memcpy(out + n, piece, k);
        else
            out[n] = *s;
        n += k;
    }
    out[n++] = '\'';
    out[n] = '\0';
    return 0;
}

/* The command line with every {} replaced by the quoted path (appended when
 * there is none). */
static int command_line(const char *cmd, const char *path, char *out, size_t cap)
{
    char q[PATH_MAX * 4 + 8];
    size_t n = 0, ql;
    int any = 0;
    if (shell_quote(q, sizeof(q), path) < 0)
        return -ENAMETOOLONG;
    ql = strlen(q);
    for (const char *p = cmd; *p; p++) {
        if (p[0] == '{' && p[1] == '}') {
            if (n + ql + 1 > cap)
                return -ENAMETOOLONG;
            memcpy(out + n, q, ql);
            n += ql;
            p++;
            any = 1;
        } else {
            if (n + 2 > cap)
                return -ENAMETOOLONG;
            out[n++] = *p;
        }
    }
    if (!any) {
        if (n + ql + 2 > cap)
            return -ENAMETOOLONG;
        out[n++] = ' ';
        memcpy(out + n, q, ql);
        n += ql;
    }
    out[n] = '\0';
    return 0;
}

/* The bytes to send as a file the command can read, under its own name: a
 * hard link to what fd holds when the file system allows it, else a copy of
 * its first len bytes (or the text). */
static int stage_file(const struct upload_dest *d, const char *name, int fd, long long len,
                      const char *text, char *path, size_t cap)
{
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (mg_fmt(path, cap, "%s/%s", d->stage, base) < 0)
        return -ENAMETOOLONG;
    unlink(path);
    if (fd >= 0) {
        char self[64];
        snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
        if (linkat(AT_FDCWD, self, AT_FDCWD, path, AT_SYMLINK_FOLLOW) == 0)
            return 0;
    }
    int out = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (out < 0)
        return -errno;
    int rc = 0;
    if (fd < 0) {
        size_t n = strlen(text);
        rc = write(out, text, n) == (ssize_t)n ? 0 : -EIO;
    } else {
        char buf[65536];
        for (long long off = 0; off < len && rc == 0;) {
            size_t want = len - off < (long long)sizeof(buf) ? (size_t)(len - off) : sizeof(buf);
            ssize_t k = pread(fd, buf, want, (off_t)off);
            if (k <= 0)
                rc = k < 0 ? -errno : -EIO;
            else if (write(out, buf, (size_t)k) != k)
                rc = -EIO;
            else
                off += k;
        }
    }
    if (close(out) < 0 && rc == 0)
        rc = -errno;
    if (rc < 0)
        unlink(path);
    return rc;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Runs the command in a process group of its own; kills the group at the
 * timeout or when abort_fd becomes readable. */
static int run_command(struct upload_dest *d, const char *name, const char *path, int abort_fd,
                       char *err, size_t errlen)
{
    char line[8192], envname[MG_UPLOAD_NAME_MAX + 32];
    if (command_line(d->cmd, path, line, sizeof(line)) < 0)
        return mg_seterr(err, errlen, -ENAMETOOLONG, "the command line is too long");
    size_t ne = 0;
    while (environ && environ[ne])
        ne++;
    char **envp = calloc(ne + 2, sizeof(char *));
    if (!envp)
        return mg_seterr(err, errlen, -ENOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < ne; i++)
        if (strncmp(environ[i], "MG_UPLOAD_NAME=", 15) != 0)
            envp[k++] = environ[i];
    mg_fmt(envname, sizeof(envname), "MG_UPLOAD_NAME=%s", name);
    envp[k++] = envname;
    envp[k] = NULL;

    posix_spawnattr_t at;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_init(&at);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
    posix_spawnattr_setpgroup(&at, 0);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    char *argv[] = {"sh", "-c", line, NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, "/bin/sh", &fa, &at, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    free(envp);
    if (rc != 0)
        return mg_seterr(err, errlen, -rc, "cannot run /bin/sh: %s", strerror(rc));
    int64_t deadline = now_ms() + d->timeout_ms;
    int status = 0, killed = 0;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid || (w < 0 && errno != EINTR))
            break;
        struct pollfd p = {.fd = abort_fd, .events = POLLIN};
        int stop = abort_fd >= 0 && poll(&p, 1, 0) > 0;
        if (!killed && (stop || now_ms() >= deadline)) {
            kill(-pid, SIGKILL);
            killed = stop ? 2 : 1;
        }
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
    if (killed)
        return mg_seterr(err, errlen, killed == 2 ? -EINTR : -ETIMEDOUT,
                         killed == 2 ? "the command was stopped" : "the command ran over %d s",
                         d->timeout_ms / 1000);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    if (WIFEXITED(status))
        return mg_seterr(err, errlen, -EIO, "the command exited with status %d",
                         WEXITSTATUS(status));
    return mg_seterr(err, errlen, -EIO, "the command was killed by signal %d", WTERMSIG(status));
}

int upload_dest_put(struct upload_dest *d, const char *name, int fd, long long len,
                    const char *text, int abort_fd, int *permanent, char *err, size_t errlen)
{
    char path[PATH_MAX + MG_UPLOAD_NAME_MAX];
    *permanent = 0;
    if (d->kind != UPLOAD_CMD)
        return http_put(d, name, fd, len, text, abort_fd, permanent, err, errlen);
    int rc = stage_file(d, name, fd, len, text, path, sizeof(path));
    if (rc < 0)
        return mg_seterr(err, errlen, rc, "cannot stage '%s' for the command: %s", name,
                         mg_strerror(rc));
    rc = run_command(d, name, path, abort_fd, err, errlen);
    unlink(path);
    return rc;
}

/* ---- fetching ----------------------------------------------------------------------------- */

struct sink {
    int fd;
    long long n;
};

static int to_file(void *ctx, const char *data, size_t len)
{
    struct sink *s = ctx;
    while (len) {
        ssize_t k = write(s->fd, data, len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? -errno : -EIO;
        data += k;
        len -= (size_t)k;
        s->n += k;
    }
    return 0;
}

int upload_dest_get(struct upload_dest *d, const char *name, int fd, char *err, size_t errlen)
{
    char url[4096];
    const char *hdrs[4];
    struct mg_http_request rq;
    struct mg_http_response res;
    struct sink s = {.fd = fd};
    if (d->kind == UPLOAD_CMD)
        return mg_seterr(err, errlen, -MG_EUNSUPPORTED, "a command cannot fetch files");
    if (url_of(d, name, url, sizeof(url)) < 0)
        return mg_seterr(err, errlen, -ENAMETOOLONG, "%s: name too long", name);
    request_for(d, &rq, url, hdrs, -1);
    rq.method = "GET";
    rq.on_data = to_file;
    rq.ctx = &s;
    int rc = mg_http_request(d->http, &rq, &res);
    if (rc < 0)
        return mg_seterr(err, errlen, rc, "GET %s/%s: %s", d->shown, name, res.error);
    if (res.status == 404)
        return mg_seterr(err, errlen, -ENOENT, "%s/%s: not there (HTTP 404)", d->shown, name);
    if (res.status < 200 || res.status >= 300) {
        char why[400];
        /* the error document went to the file: read it back for its code */
        char body[2048] = "";
        ssize_t k = pread(fd, body, sizeof(body) - 1, 0);
        body[k > 0 ? k : 0] = '\0';
        http_failure(res.status, body, why, sizeof(why));
        return mg_seterr(err, errlen, -EIO, "GET %s/%s: %s", d->shown, name, why);
    }
    return 0;
}
