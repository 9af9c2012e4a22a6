/* mglaunch-dashboard (see dashboard.h): its command line, the listening
 * socket, the token, and libmicrohttpd, which runs the HTTP side in one
 * thread of its own and hands each request to dash_handle(). The only file
 * of the program that prints. mglaunch execs it for `mglaunch dashboard`. */
#include "dashboard.h"
#include "logdir.h"
#include "mg_err.h"
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROG "mglaunch dashboard"

/* Who may hold connections, and for how long (docs/cli.md, "mglaunch
 * dashboard"): a connection idle this long is closed (the page's requests
 * are short, and it reconnects); a request must arrive whole within the
 * deadline, so one that trickles its headers a byte at a time to stay alive
 * is closed too; one address holds at most PER_ADDRESS connections of
 * MAX_CONNECTIONS, so it cannot lock the others out. On loopback every local
 * user shares the address 127.0.0.1: there only the total applies, and what
 * any connection holds ends within the deadline. */
#define IDLE_TIMEOUT_S   5
#define REQUEST_DEADLINE 10000 /* ms */
#define PER_ADDRESS      16
#define MAX_CONNECTIONS  1024

static const char usage[] =
    "usage: mglaunch dashboard [LOG_DIR] [--host ADDR] [--port N] [--token TOKEN]\n"
    "Serves a page that lists the runs in LOG_DIR with their attempts and ranks, shows the\n"
    "root cause of a failure, tails any rank's log and draws the metrics as they arrive.\n"
    "  --host ADDR    address to listen on (default 127.0.0.1)\n"
    "  --port N       port (default 29600; 0: a free one)\n"
    "  --token TOKEN  required from every request (also MG_DASHBOARD_TOKEN); on any\n"
    "                 address but loopback one is generated and printed when not given\n"
    "LOG_DIR defaults to mglaunch's private directory ${TMPDIR:-/tmp}/mglaunch-<uid>.\n"
    "See docs/cli.md.\n";

struct opts {
    const char *dir, *host, *token;
    int port;
};

static int parse(struct opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof(*o));
    o->host = "127.0.0.1";
    o->port = DASH_DEFAULT_PORT;
    o->token = getenv("MG_DASHBOARD_TOKEN");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            exit(0);
        }
        if (a[0] != '-') {
            if (o->dir) {
                fprintf(stderr, PROG ": unexpected argument '%s'\n", a);
                return -1;
            }
            o->dir = a;
            continue;
        }
        const char *name = a + (a[1] == '-' ? 2 : 1), *eq = strchr(name, '=');
        size_t n = eq ? (size_t)(eq - name) : strlen(name);
        if (eq)
            val = eq + 1;
        else if (i + 1 < argc)
            val = argv[i + 1];
        int known = (n == 4 && !strncmp(name, "host", 4)) ||
                    (n == 4 && !strncmp(name, "port", 4)) || (n == 5 && !strncmp(name, "token", 5));
        if (!known) {
            fprintf(stderr, PROG ": unknown option '%s' (see mglaunch dashboard --help)\n", a);
            return -1;
        }
        if (!val) {
            fprintf(stderr, PROG ": option %s needs a value\n", a);
            return -1;
        }
        if (!eq)
            i++;
        if (name[0] == 'h') {
            o->host = val;
        } else if (name[0] == 't') {
            o->token = val;
        } else {
            char *end;
            long p = strtol(val, &end, 10);
            if (!*val || *end || p < 0 || p > 65535) {
                fprintf(stderr, PROG ": invalid value '%s' for --port: expected 0..65535\n", val);
                return -1;
            }
            o->port = (int)p;
        }
    }
    if (o->token && (!*o->token || strlen(o->token) > DASH_TOKEN_MAX)) {
        fprintf(stderr, PROG ": a token has 1 to %d characters\n", DASH_TOKEN_MAX);
        return -1;
    }
    return 0;
}

/* Whether the socket listens on a loopback address only. */
static int is_loopback(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
        return 0;
    if (ss.ss_family == AF_INET)
        return (ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss.ss_family == AF_INET6) {
        const struct in6_addr *a = &((struct sockaddr_in6 *)&ss)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

static int new_token(char *out, size_t cap)
{
    unsigned char r[16];
    if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r))
        return -errno;
    for (size_t i = 0; i < sizeof(r) && 2 * i + 2 < cap; i++)
        snprintf(out + 2 * i, 3, "%02x", r[i]);
    return 0;
}

/* ---- connections: the request deadline ----------------------------------------------------- */

/* Every open connection, with when its current request began (its opening,
 * or the end of its last request). libmicrohttpd's thread adds, updates and
 * removes them; the watchdog thread shuts down those past the deadline. A
 * connection's socket is closed only after its CLOSED notice, which waits for
 * the lock: the watchdog never touches a socket that is not the connection's. */
struct conn {
    struct conn *prev, *next;
    int fd;
    int64_t since_ms;
};

static pthread_mutex_t conns_lock = PTHREAD_MUTEX_INITIALIZER;
static struct conn conns = {&conns, &conns, -1, 0};

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    (void)cls;
    struct conn *c = *socket_context;
    pthread_mutex_lock(&conns_lock);
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci && (c = calloc(1, sizeof(*c)))) {
            c->fd = ci->connect_fd;
            c->since_ms = mg_now_ms();
            c->next = &conns;
            c->prev = conns.prev;
            conns.prev->next = c;
            conns.prev = c;
            *socket_context = c;
        }
    } else if (c) {
        c->prev->next = c->next;
        c->next->prev = c->prev;
        free(c);
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&conns_lock);
}

/* A request was answered: the next one has its own deadline. */
static void request_done(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    pthread_mutex_lock(&conns_lock);
    if (ci && ci->socket_context)
        ((struct conn *)ci->socket_context)->since_ms = mg_now_ms();
    pthread_mutex_unlock(&conns_lock);
}

static void *watchdog(void *arg)
{
    (void)arg;
    for (;;) {
        usleep(250 * 1000);
        int64_t now = mg_now_ms();
        pthread_mutex_lock(&conns_lock);
        for (struct conn *c = conns.next; c != &conns; c = c->next)
            if (now - c->since_ms > REQUEST_DEADLINE) {
                shutdown(c->fd, SHUT_RDWR); /* libmicrohttpd sees it end and closes it */
                c->since_ms = INT64_MAX / 2;
            }
        pthread_mutex_unlock(&conns_lock);
    }
    return NULL;
}

/* ---- libmicrohttpd ----------------------------------------------------------------------- */

static const char *get_arg(void *ctx, const char *name)
{
    return MHD_lookup_connection_value(ctx, MHD_GET_ARGUMENT_KIND, name);
}

static const char *get_header(void *ctx, const char *name)
{
    return MHD_lookup_connection_value(ctx, MHD_HEADER_KIND, name);
}

static enum MHD_Result reply(struct MHD_Connection *conn, const struct dash_resp *rs)
{
    static const enum MHD_ResponseMemoryMode mode[] = {
        [DASH_BODY_FREE] = MHD_RESPMEM_MUST_FREE,
        [DASH_BODY_STATIC] = MHD_RESPMEM_PERSISTENT,
        [DASH_BODY_COPY] = MHD_RESPMEM_MUST_COPY,
    };
    struct MHD_Response *r =
        MHD_create_response_from_buffer(rs->body ? rs->len : 0, rs->body,
                                        rs->body ? mode[rs->body_static] : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        if (rs->body && rs->body_static == DASH_BODY_FREE)
            free(rs->body);
        return MHD_NO;
    }
    if (rs->type)
        MHD_add_response_header(r, "Content-Type", rs->type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    /* the page loads nothing from anywhere: no CDN, no font, no frame */
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'none'; script-src 'unsafe-inline'; style-src "
                            "'unsafe-inline'; img-src 'self' data:; connect-src 'self'; "
                            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
    for (int i = 0; i < rs->nhdr; i++)
        MHD_add_response_header(r, rs->hdr_name[i], rs->hdr_value[i]);
    /* A request without the token (or for a foreign Host) keeps nothing open. */
    if (rs->status == 401 || rs->status == 403 || rs->status == 405)
        MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result ok = MHD_queue_response(conn, (unsigned int)rs->status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    struct dash *d = cls;
    struct dash_resp rs;
    (void)version;
    (void)upload_data;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        memset(&rs, 0, sizeof(rs));
        rs.status = 405;
        rs.type = "text/plain; charset=utf-8";
        rs.body = (char *)"only GET and HEAD\n";
        rs.len = strlen(rs.body);
        rs.body_static = DASH_BODY_STATIC;
        rs.hdr_name[0] = "Allow";
        snprintf(rs.hdr_value[0], sizeof(rs.hdr_value[0]), "GET, HEAD");
        rs.nhdr = 1;
        *upload_data_size = 0;
        return reply(conn, &rs);
    }
    (void)con_cls;
    struct dash_req rq = {.path = url, .arg = get_arg, .header = get_header, .ctx = conn};
    dash_handle(d, &rq, &rs);
    request_done(conn);
    return reply(conn, &rs);
}

/* ---- main -------------------------------------------------------------------------------- */

static void print_url(const struct opts *o, const struct dash *d)
{
    char host[300], url[700];
    const char *h = o->host;
    if (!strcmp(h, "0.0.0.0") || !strcmp(h, "::") || !*h) {
        if (gethostname(host, sizeof(host) - 1) < 0)
            snprintf(host, sizeof(host), "localhost");
        host[sizeof(host) - 1] = '\0';
        h = host;
    }
    mg_format_hostport(url, sizeof(url), h, d->port);
    printf(PROG ": serving %s at http://%s/%s%s\n", d->dir, url, d->token[0] ? "?token=" : "",
           d->token);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    struct opts o;
    struct dash d;
    sigset_t stop;
    int sig, rc;

    if (parse(&o, argc, argv) < 0)
        return 2;
    memset(&d, 0, sizeof(d));
    if (o.dir) {
        if (!realpath(o.dir, d.dir)) /* absolute, as the page shows it */
            mg_fmt(d.dir, sizeof(d.dir), "%s", o.dir);
    } else if ((rc = mg_logdir_default(d.dir, sizeof(d.dir)))) {
        fprintf(stderr, PROG ": cannot use the default log directory '%s': %s\n", d.dir,
                mg_strerror(rc));
        return 1;
    }
    struct stat st;
    if (stat(d.dir, &st) < 0) {
        fprintf(stderr, PROG ": cannot read '%s': %s\n", d.dir, strerror(errno));
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, PROG ": '%s' is not a directory\n", d.dir);
        return 1;
    }
    int bound = 0;
    int fd = mg_listen_tcp(o.host, o.port, 64, &bound);
    if (fd < 0) {
        char hp[300];
        mg_format_hostport(hp, sizeof(hp), o.host, o.port);
        fprintf(stderr, PROG ": cannot listen on '%s': %s\n", hp, mg_strerror(fd));
        return 1;
    }
    d.port = bound;
    d.loopback = is_loopback(fd);
    if (o.token) {
        mg_fmt(d.token, sizeof(d.token), "%s", o.token);
    } else if (!d.loopback && (rc = new_token(d.token, sizeof(d.token))) < 0) {
        fprintf(stderr, PROG ": cannot make a token: %s\n", mg_strerror(rc));
        close(fd);
        return 1;
    }
    if (dash_cache_new(&d.cache) < 0) {
        fprintf(stderr, PROG ": out of memory\n");
        close(fd);
        return 1;
    }

    /* The server's thread inherits the mask: the signals come to sigwait. */
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* The total: what the descriptors allow, leaving room for the files read. */
    struct rlimit nofile;
    unsigned max_conns = MAX_CONNECTIONS;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < MAX_CONNECTIONS + 64) {
        nofile.rlim_cur =
            nofile.rlim_max < MAX_CONNECTIONS + 64 ? nofile.rlim_max : MAX_CONNECTIONS + 64;
        setrlimit(RLIMIT_NOFILE, &nofile);
        if (nofile.rlim_cur < MAX_CONNECTIONS + 64)
            max_conns = nofile.rlim_cur > 96 ? (unsigned)nofile.rlim_cur - 64 : 32;
    }
    pthread_t wd;
    if (pthread_create(&wd, NULL, watchdog, NULL) != 0) {
        fprintf(stderr, PROG ": cannot start a thread\n");
        close(fd);
        dash_cache_free(d.cache);
        return 1;
    }
    pthread_detach(wd);
    struct MHD_Daemon *mhd = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL, 0, NULL, NULL, on_request, &d,
        MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT, max_conns,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, d.loopback ? 0U : (unsigned)PER_ADDRESS,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)65536, MHD_OPTION_NOTIFY_CONNECTION, on_connection, NULL, MHD_OPTION_END);
    if (!mhd) {
        fprintf(stderr, PROG ": cannot start the HTTP server (libmicrohttpd)\n");
        close(fd);
        dash_cache_free(d.cache);
        return 1;
    }
    print_url(&o, &d);
    sigwait(&stop, &sig);
    MHD_stop_daemon(mhd); /* closes the listening socket too */
    dash_cache_free(d.cache);
    return 0;
}
