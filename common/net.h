/* Socket and clock helpers shared by the launcher and libmg.
 *
 * Every function returns a file descriptor or 0 on success, or a negative
 * error code (-errno, or MG_E* from mg_err.h). All descriptors are created
 * close-on-exec. Deadlines are absolute times on the monotonic clock in
 * milliseconds (mg_now_ms() + timeout); a deadline of -1 means no deadline. */
#ifndef MG_NET_H
#define MG_NET_H

#include <stddef.h>
#include <stdint.h>

#define MG_HOST_MAX 256

struct mg_hostport {
    char host[MG_HOST_MAX]; /* name or address, without IPv6 brackets */
    int port;               /* 0..65535; default_port when the text has none */
};

int64_t mg_now_ms(void);
int64_t mg_now_us(void);
/* Milliseconds from now until deadline, clamped to [0, INT32_MAX]; -1 for no deadline. */
int mg_ms_until(int64_t deadline_ms);

/* Parses "host", "host:port", "[v6addr]:port" or "v6addr". Returns -EINVAL
 * for an empty host, a bad or out-of-range port, or a host over MG_HOST_MAX. */
int mg_parse_hostport(const char *text, int default_port, struct mg_hostport *out);
/* The reverse: "host:port", "[v6addr]:port" for an IPv6 address. Returns what
 * snprintf returns. */
int mg_format_hostport(char *buf, size_t len, const char *host, int port);

/* Listening TCP socket on host:port (host NULL or "" = all interfaces,
 * port 0 = kernel-chosen). SO_REUSEADDR is set. *bound_port (optional)
 * receives the port actually bound. Returns the fd. */
int mg_listen_tcp(const char *host, int port, int backlog, int *bound_port);

/* Connects to host:port, trying every resolved address, each attempt bounded
 * by the deadline. Sets TCP_NODELAY. The returned fd is blocking.
 * An unknown name gives -MG_ENONAME, a temporary resolver failure -MG_ERESOLVE, and
 * otherwise the last connect error (-ECONNREFUSED, -ETIMEDOUT, ...). */
int mg_connect_tcp(const char *host, int port, int64_t deadline_ms);

int mg_set_nonblock(int fd, int on);

/* Full reads and writes on a blocking or non-blocking fd (a socket, a pipe or
 * a file), waiting with poll() until the deadline (< 0: none). mg_read_full returns -MG_ECLOSED when the peer closed
 * the connection before len bytes arrived, -ETIMEDOUT at the deadline. */
int mg_write_full(int fd, const void *buf, size_t len, int64_t deadline_ms);
int mg_read_full(int fd, void *buf, size_t len, int64_t deadline_ms);

/* Numeric address of the local end of a connected socket (for advertising). */
int mg_sock_local_addr(int fd, char *buf, size_t len);
/* The local port of a bound socket, or -errno. */
int mg_sock_local_port(int fd);

/* Open files: raises the soft RLIMIT_NOFILE to at least need when the hard
 * limit allows (a server of thousands of connections needs one each; the
 * soft limit is often 1024 under a hard one of 512 Ki). 0 when the soft limit
 * is now at least need; -EMFILE when the hard limit is lower (the soft one is
 * then raised to it). *soft and *hard (either may be NULL) tell the limits
 * as they are afterwards. */
int mg_nofile_raise(unsigned long need, unsigned long *soft, unsigned long *hard);
/* The soft open-file limit this process was given, when mg_nofile_raise
 * raised it; 0 when it never did. Children that do not serve the store get
 * it back (a program using select() breaks on descriptors past 1024). */
unsigned long mg_nofile_given(void);
/* Resolves host to its first numeric address (IPv4 preferred). */
int mg_resolve_numeric(const char *host, char *buf, size_t len);

#endif
