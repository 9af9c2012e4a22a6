/* Socket and clock helpers shared by the launcher and libmg (see net.h). */
#include "net.h"
#include "mg_err.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int64_t mg_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t mg_now_ms(void)
{
    return mg_now_us() / 1000;
}

int mg_ms_until(int64_t deadline_ms)
{
    if (deadline_ms < 0)
        return -1;
    int64_t left = deadline_ms - mg_now_ms();
    if (left < 0)
        return 0;
    return left > INT_MAX ? INT_MAX : (int)left;
}

static int parse_port(const char *s, int *port)
{
    char *end;
    if (!*s)
        return -EINVAL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 0 || v > 65535)
        return -EINVAL;
    *port = (int)v;
    return 0;
}

int mg_format_hostport(char *buf, size_t len, const char *host, int port)
{
    return snprintf(buf, len, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
}

int mg_parse_hostport(const char *text, int default_port, struct mg_hostport *out)
{
    const char *host = text, *port = NULL;
    size_t hlen;

    if (!text)
        return -EINVAL;
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        if (!close)
            return -EINVAL;
        host = text + 1;
        hlen = (size_t)(close - host);
        if (close[1] == ':')
            port = close + 2;
        else if (close[1])
            return -EINVAL;
    } else {
        const char *colon = strrchr(text, ':');
        /* More than one colon and no brackets: a bare IPv6 address. */
        if (colon && memchr(text, ':', (size_t)(colon - text)) == NULL) {
            hlen = (size_t)(colon - text);
            port = colon + 1;
        } else {
            hlen = strlen(text);
        }
    }
    if (hlen == 0 || hlen >= sizeof(out->host))
        return -EINVAL;
    memcpy(out->host, host, hlen);
    out->host[hlen] = '\0';
    /* A URL ("http://user:pw@h:x") is no host, though its colons would pass
     * for an IPv6 address's: a host name or address never holds these, and
     * an address with colons must be one (its %zone aside). */
    if (strpbrk(out->host, "/@?#[] \t\n"))
        return -EINVAL;
    if (strchr(out->host, ':')) {
        char addr[sizeof(out->host)];
        struct in6_addr a6;
        memcpy(addr, out->host, hlen + 1);
        addr[strcspn(addr, "%")] = '\0';
        if (inet_pton(AF_INET6, addr, &a6) != 1)
            return -EINVAL;
    }
    out->port = default_port;
    if (port)
        return parse_port(port, &out->port);
    return 0;
}

/* A resolver failure as a code whose message says it is one: never ENOENT,
 * which would read "No such file or directory". */
static int gai_to_err(int rc)
{
    switch (rc) {
    case EAI_AGAIN:
        return -MG_ERESOLVE;
    case EAI_MEMORY:
        return -ENOMEM;
    case EAI_SYSTEM:
        return errno ? -errno : -EIO;
    default:
        return -MG_ENONAME;
    }
}

int mg_listen_tcp(const char *host, int port, int backlog, int *bound_port)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res, *ai;
    char portstr[16];
    int fd = -1, err = -EADDRNOTAVAIL, one = 1;

    snprintf(portstr, sizeof(portstr), "%d", port);
    if (host && !*host)
        host = NULL;
    if (!host)
        hints.ai_family = AF_INET6; /* dual-stack wildcard when available */
    int rc = getaddrinfo(host, portstr, &hints, &res);
    if (rc && !host) {
        hints.ai_family = AF_INET;
        rc = getaddrinfo(host, portstr, &hints, &res);
    }
    if (rc)
        return gai_to_err(rc);
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = -errno;
            continue;
        }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (ai->ai_family == AF_INET6 && !host) {
            int zero = 0;
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
        }
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, backlog) == 0)
            break;
        err = -errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return err;
    int bound = bound_port ? mg_sock_local_port(fd) : -1;
    if (bound > 0)
        *bound_port = bound;
    return fd;
}

int mg_set_nonblock(int fd, int on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return -errno;
    fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
    return fcntl(fd, F_SETFL, fl) < 0 ? -errno : 0;
}

/* Non-blocking connect to one address, bounded by the deadline. */
static int connect_one(const struct addrinfo *ai, int64_t deadline_ms)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0)
        return -errno;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        if (errno != EINPROGRESS) {
            int err = -errno;
            close(fd);
            return err;
        }
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int rc;
        do {
            rc = poll(&p, 1, mg_ms_until(deadline_ms));
        } while (rc < 0 && errno == EINTR);
        if (rc == 0) {
            close(fd);
            return -ETIMEDOUT;
        }
        int soerr = 0;
        socklen_t len = sizeof(soerr);
        if (rc < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0 || soerr) {
            int err = rc < 0 ? -errno : (soerr ? -soerr : -errno);
            close(fd);
            return err;
        }
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    mg_set_nonblock(fd, 0);
    return fd;
}

int mg_connect_tcp(const char *host, int port, int64_t deadline_ms)
{
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res, *ai;
    char portstr[16];
    int err = -ECONNREFUSED;

    snprintf(portstr, sizeof(portstr), "%d", port);
    int rc = getaddrinfo(host, portstr, &hints, &res);
    if (rc)
        return gai_to_err(rc);
    for (ai = res; ai; ai = ai->ai_next) {
        int fd = connect_one(ai, deadline_ms);
        if (fd >= 0) {
            freeaddrinfo(res);
            return fd;
        }
        err = fd;
        if (err == -ETIMEDOUT)
            break;
    }
    freeaddrinfo(res);
    return err;
}

static int wait_fd(int fd, short events, int64_t deadline_ms)
{
    struct pollfd p = {.fd = fd, .events = events};
    for (;;) {
        int rc = poll(&p, 1, mg_ms_until(deadline_ms));
        if (rc > 0)
            return 0;
        if (rc == 0)
            return -ETIMEDOUT;
        if (errno != EINTR)
            return -errno;
    }
}

int mg_write_full(int fd, const void *buf, size_t len, int64_t deadline_ms)
{
    const char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == ENOTSOCK)
            n = write(fd, p, len);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(fd, POLLOUT, deadline_ms);
            if (rc)
                return rc;
            continue;
        }
        return n < 0 ? -errno : -EIO;
    }
    return 0;
}

int mg_read_full(int fd, void *buf, size_t len, int64_t deadline_ms)
{
    char *p = buf;
    while (len) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n < 0 && errno == ENOTSOCK)
            n = read(fd, p, len);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return -MG_ECLOSED;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = wait_fd(fd, POLLIN, deadline_ms);
            if (rc)
                return rc;
            continue;
        }
        return -errno;
    }
    return 0;
}

static int sockaddr_text(const struct sockaddr_storage *ss, socklen_t sl, char *buf, size_t len)
{
    char host[INET6_ADDRSTRLEN];
    int rc =
        getnameinfo((const struct sockaddr *)ss, sl, host, sizeof(host), NULL, 0, NI_NUMERICHOST);
    if (rc)
        return gai_to_err(rc);
    /* Show v4-mapped v6 addresses in their plain v4 form. */
    const char *h = strncmp(host, "::ffff:", 7) == 0 && strchr(host, '.') ? host + 7 : host;
    int n = snprintf(buf, len, "%s", h);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int mg_sock_local_addr(int fd, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0)
        return -errno;
    return sockaddr_text(&ss, sl, buf, len);
}

int mg_sock_local_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0)
        return -errno;
    return ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                          : ((struct sockaddr_in *)&ss)->sin_port);
}

int mg_resolve_numeric(const char *host, char *buf, size_t len)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res, *ai, *pick = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc)
        return gai_to_err(rc);
    for (ai = res; ai; ai = ai->ai_next)
        if (!pick || (ai->ai_family == AF_INET && pick->ai_family != AF_INET))
            pick = ai;
    struct sockaddr_storage ss;
    memcpy(&ss, pick->ai_addr, pick->ai_addrlen);
    rc = sockaddr_text(&ss, pick->ai_addrlen, buf, len);
    freeaddrinfo(res);
    return rc;
}

static unsigned long nofile_given; /* the soft limit before the first raise */

unsigned long mg_nofile_given(void)
{
    return nofile_given;
}

int mg_nofile_raise(unsigned long need, unsigned long *soft, unsigned long *hard)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl))
        return -errno;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        struct rlimit up = rl;
        up.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
        if (up.rlim_cur > rl.rlim_cur && setrlimit(RLIMIT_NOFILE, &up) == 0) {
            if (!nofile_given)
                nofile_given = (unsigned long)rl.rlim_cur;
            rl = up;
        }
    }
    if (soft)
        *soft = rl.rlim_cur == RLIM_INFINITY ? ULONG_MAX : (unsigned long)rl.rlim_cur;
    if (hard)
        *hard = rl.rlim_max == RLIM_INFINITY ? ULONG_MAX : (unsigned long)rl.rlim_max;
    return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need ? 0 : -EMFILE;
}
