/* Opening the rendezvous' key-value backend, with retries while the
 * endpoint's name does not resolve or nothing listens yet; hosting the store
 * (see kv_open.h). */
#include "kv_open.h"
#include "kv_etcd.h"
#include "mg_err.h"
#include "net.h"
#include "kv_hosted.h"
#include "rdzv_proto.h"
#include "kv_store.h"
#include "store.h"

#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Errors worth retrying while the job's nodes come up. */
static int transient(int rc)
{
    return rc == -MG_ENONAME || rc == -MG_ERESOLVE || rc == -EAGAIN || rc == -ECONNREFUSED ||
           rc == -ETIMEDOUT || rc == -MG_ENOANSWER || rc == -EHOSTUNREACH || rc == -ENETUNREACH ||
           rc == -ECONNRESET;
}

/* The last error, and why the retries stopped. */
static void gave_up(char *err, size_t errlen, const char *why, int rc)
{
    snprintf(err, errlen, "%s%s", why,
             rc == -EINTR    ? " (interrupted)"
             : transient(rc) ? " (gave up at join_timeout)"
                             : "");
}

/* One request to the store or etcd may take this long: a stalled one must not
 * outlast a heartbeat timeout. */
static int request_timeout_ms(const struct mg_rdzv_conf *c)
{
    return c->read_timeout_ms < c->heartbeat_timeout_ms ? c->read_timeout_ms
                                                        : c->heartbeat_timeout_ms;
}

/* A node is declared dead heartbeat_timeout after its last heartbeat. */
static int lease_ms(const struct mg_rdzv_conf *c)
{
    return c->heartbeat_timeout_ms - c->heartbeat_interval_ms;
}

/* Tells the caller why the endpoint is still out of reach: a few seconds
 * after start, then now and then until the deadline. *next (0 at first) is
 * when to tell next. */
static void progress(const struct mg_kv_open_opts *s, int64_t start, int64_t *next, const char *why)
{
    char msg[800];
    int64_t now = mg_now_ms();
    if (!s->progress)
        return;
    if (!*next)
        *next = start + MG_KV_OPEN_PROGRESS_MS;
    if (now < *next)
        return;
    *next = now + MG_KV_OPEN_PROGRESS_EVERY_MS;
    snprintf(msg, sizeof(msg),
             "rendezvous: waiting for the backend: %s; retrying until join_timeout (%d s left)",
             why, (mg_ms_until(s->deadline_ms) + 999) / 1000);
    s->progress(s->progress_ctx, msg);
}

/* Sleeps up to ms, returning -EINTR early when abort_fd becomes readable. */
static int pause_ms(int abort_fd, int ms)
{
    struct pollfd p = {.fd = abort_fd, .events = POLLIN};
    if (abort_fd < 0)
        return poll(NULL, 0, ms) < 0 ? -errno : 0;
    int n = poll(&p, 1, ms);
    return n > 0 ? -EINTR : 0;
}

static int check_run_id(const char *id, char *err, size_t errlen)
{
    size_t n = id ? strlen(id) : 0;
    if (n == 0 || n > MG_RDZV_RUN_ID_MAX) {
        snprintf(err, errlen, "--rdzv_id: must be 1 to %d characters", MG_RDZV_RUN_ID_MAX);
        return -EINVAL;
    }
    for (const char *p = id; *p; p++) {
        char c = *p;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-' || c == ':' || c == '@' || c == '+')) {
            snprintf(err, errlen,
                     "--rdzv_id '%s': only letters, digits and . _ - : @ + are allowed", id);
            return -EINVAL;
        }
    }
    return 0;
}

int mg_kv_is_local_host(const char *host)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_ADDRCONFIG}, *res, *ai;
    int local = 0;

    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return 0;
    for (ai = res; ai && !local; ai = ai->ai_next) {
        /* Binding succeeds only to an address this machine holds. */
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        if (ai->ai_family == AF_INET)
            ((struct sockaddr_in *)ai->ai_addr)->sin_port = 0;
        else if (ai->ai_family == AF_INET6)
            ((struct sockaddr_in6 *)ai->ai_addr)->sin6_port = 0;
        local = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;
        close(fd);
    }
    freeaddrinfo(res);
    return local;
}

static int open_etcd(const struct mg_kv_open_opts *s, struct mg_kv **kv, const char *ns, char *err,
                     size_t errlen)
{
    const struct mg_rdzv_conf *c = s->conf;
    struct mg_kv_etcd_opts o = {
        .endpoints = s->endpoint,
        .cacert = c->cacert,
        .cert = c->cert,
        .key = c->key,
        .https = c->https,
        .timeout_ms = request_timeout_ms(c),
        .lease_ttl_ms = lease_ms(c),
    };
    char probe[MG_KV_MAX_KEY];
    int delay = 50, rc;
    int64_t start = mg_now_ms(), next = 0;

    rc = mg_kv_etcd_open(kv, &o, err, errlen);
    if (rc < 0)
        return rc;
    snprintf(probe, sizeof(probe), "%s/state", ns);
    for (;;) {
        rc = (*kv)->ops->get(*kv, probe, NULL, NULL, NULL);
        if (rc == 0 || rc == -MG_ENOKEY)
            return 0;
        if (!transient(rc) || mg_now_ms() + delay >= s->deadline_ms)
            break;
        progress(s, start, &next, mg_kv_error(*kv));
        rc = pause_ms(s->abort_fd, delay);
        if (rc < 0)
            break;
        delay = delay * 2 > 1000 ? 1000 : delay * 2;
    }
    gave_up(err, errlen, mg_kv_error(*kv), rc);
    (*kv)->ops->release(*kv);
    *kv = NULL;
    return rc;
}

/* What the hosted store reads from one connection per turn of the agent's
 * loop: a client's burst of pipelined requests is taken in slices of a few
 * milliseconds each, between the agent's other work. */
#define HOST_READ_BYTES (64u << 10)

struct mg_kv_host {
    struct mg_store_server *srv;
    int port;
    int reachable;                /* from other machines (not loopback only) */
    char bound[MG_HOST_MAX];      /* the address it listens on, "" = every interface */
    char where[MG_HOST_MAX + 16]; /* the endpoint, for messages */
    char addr[MG_HOST_MAX];       /* where this host leaves from towards it, or "" */
    struct pollfd *fds;           /* mg_kv_host_serve's */
    int nfds;
};

/* The address a connection from this machine to the endpoint would leave
 * from (the kernel's choice, asked of an unconnected UDP socket: nothing is
 * sent), which is what the other nodes reach this one at. */
static void route_addr(const struct mg_hostport *hp, char *out, size_t cap)
{
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *res = NULL;
    char port[16];
    snprintf(port, sizeof(port), "%d", hp->port);
    out[0] = 0;
    if (getaddrinfo(hp->host, port, &hints, &res) != 0)
        return;
    for (struct addrinfo *ai = res; ai && !out[0]; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 && mg_sock_local_addr(fd, out, cap) < 0)
            out[0] = 0;
        close(fd);
    }
    freeaddrinfo(res);
}

/* The hosted store holds the rendezvous and nothing else, so its limits are
 * sized for it (docs/store-protocol.md): per node an announcement, joins and
 * exit-barrier keys of under a kilobyte each; per round a membership record of
 * under a kilobyte per node, three rounds kept; a connection per node, and as
 * many again for spares and probes. Then no client can make the agent that
 * supervises the workers hold more than a few megabytes for a small job.
 * max_nodes 0 (the tests' tools) keeps the store's own defaults. */
static void host_limits(int max_nodes, struct mg_store_server_opts *so)
{
    if (max_nodes <= 0)
        return;
    size_t n = (size_t)max_nodes, value = 4096 + n * 1024, frame;
    if (value > MG_KV_MAX_VALUE)
        value = MG_KV_MAX_VALUE;
    frame = 2 * value + 4096;
    so->max_value_bytes = value;
    so->max_clients = (int)(2 * n + 32);
    so->max_store_bytes = (256u << 10) + n * (16u << 10) + 4 * value;
    if (so->max_store_bytes > (1u << 30))
        so->max_store_bytes = 1u << 30;
    /* Each connection holds a 4 KiB input buffer; a few frames may be in flight. */
    so->max_buffer_bytes = (size_t)so->max_clients * 8192 + 4 * frame;
    so->max_waiters = so->max_clients * 8;
}

/* Open files the agent needs besides the store's connections: its own, its
 * workers' pipes and log files. */
#define FD_HEADROOM 256

/* The store takes a descriptor per connection: the soft open-file limit is
 * raised to what max_clients needs; past the hard limit, one warning says
 * which limit, what it needs and how to raise it (an agent past the limit
 * would otherwise only wait to connect, its store unable to accept it). */
static void host_nofile(const struct mg_kv_open_opts *s, int max_clients)
{
    unsigned long soft = 0, hard = 0, need = (unsigned long)max_clients + FD_HEADROOM;
    char msg[640];
    if (s->max_nodes <= 0 || mg_nofile_raise(need, &soft, &hard) != -EMFILE || !s->progress)
        return;
    snprintf(msg, sizeof(msg),
             "warning: the rendezvous store takes up to %d connections (2 per node of --nnodes "
             "%d, and spares), an open file each, %lu in all with this agent's own, but this "
             "process may open only %lu (RLIMIT_NOFILE, hard limit %lu): the store can then serve "
             "about %lu nodes, and the others wait to connect. Raise the hard limit (it takes "
             "privilege) before mglaunch starts: `ulimit -n %lu` as root in its "
             "shell, LimitNOFILE=%lu in its systemd unit, or the container's nofile ulimit "
             "(docs/rendezvous.md, Beyond 1,000 nodes)",
             max_clients, s->max_nodes, need, soft, hard,
             (soft - (soft / 2 < FD_HEADROOM ? soft / 2 : FD_HEADROOM)) / 2, need, need);
    s->progress(s->progress_ctx, msg);
}

/* Hosts the store on this agent: served from the caller's poll loop
 * (mg_kv_host_pollfds / _process), used through the in-process backend. */
static int host_store(const struct mg_kv_open_opts *s, const struct mg_hostport *hp,
                      struct mg_kv_host **out, char *err, size_t errlen)
{
    struct mg_kv_host *h = calloc(1, sizeof(*h));
    int rc;

    if (!h)
        return -ENOMEM;
    /* The endpoint's own address when it is this machine's (loopback stays
     * loopback), else every interface: the others reach it by a name or a
     * service address. */
    h->reachable =
        mg_store_bind_addr(hp->host, 0, h->bound, sizeof(h->bound)) != MG_STORE_BIND_LOOPBACK;
    struct mg_store_server_opts so = {.host = h->bound,
                                      .port = hp->port,
                                      .token = s->conf->token,
                                      .read_bytes_per_turn = HOST_READ_BYTES,
                                      .foreign = s->foreign,
                                      .foreign_ctx = s->foreign_ctx};
    host_limits(s->max_nodes, &so);
    host_nofile(s, so.max_clients);
    rc = mg_store_server_start(&h->srv, &so);
    if (rc < 0) {
        snprintf(err, errlen, "cannot host the rendezvous store on %s port %d: %s",
                 h->bound[0] ? h->bound : "every interface,", hp->port, mg_strerror(rc));
        free(h);
        return rc;
    }
    h->port = mg_store_server_port(h->srv);
    mg_format_hostport(h->where, sizeof(h->where), hp->host, h->port);
    route_addr(hp, h->addr, sizeof(h->addr));
    *out = h;
    return 0;
}

/* How long a connection to the endpoint may take to show up at the store
 * this agent started, when the endpoint leads back to it (it is normally
 * there by the time connect returns). */
#define SELF_PROBE_MS 200

/* Whether the endpoint leads to the store this agent just started: at once
 * when its name is one of this machine's addresses; otherwise (a service or
 * NAT address, or a mistake such as two static nodes with --node_rank 0) by
 * connecting to it and looking for that connection among the store's. The
 * connection is retried as a client's would be, until the deadline. 1 or 0,
 * or a negative code with err set. */
static int leads_here(const struct mg_kv_open_opts *s, const struct mg_hostport *hp,
                      struct mg_kv_host *h, char *err, size_t errlen)
{
    int rc;
    int64_t start = mg_now_ms(), next = 0;
    char why[MG_HOST_MAX + 160];

    if (mg_kv_is_local_host(hp->host))
        return 1;
    for (;;) {
        int64_t dl = mg_now_ms() + 1000;
        int fd = mg_connect_tcp(hp->host, hp->port, dl < s->deadline_ms ? dl : s->deadline_ms);
        if (fd >= 0) {
            rc = mg_store_server_is_own_peer(h->srv, fd, SELF_PROBE_MS);
            close(fd);
            return rc == 1;
        }
        rc = fd;
        snprintf(why, sizeof(why), "store %s: cannot connect: %s", h->where, mg_strerror(rc));
        if (!transient(rc) || mg_now_ms() >= s->deadline_ms)
            break;
        progress(s, start, &next, why);
        if (pause_ms(s->abort_fd, 20) < 0) {
            rc = -EINTR;
            break;
        }
    }
    gave_up(err, errlen, why, rc);
    return rc;
}

/* Once, when this agent hosts a store other machines can reach and no token
 * guards it: whoever reaches the port can rewrite the rendezvous. */
static void warn_open(const struct mg_kv_open_opts *s, const struct mg_kv_host *h)
{
    char msg[MG_HOST_MAX + 400];
    if (!h->reachable || s->conf->token[0] || !s->progress)
        return;
    snprintf(msg, sizeof(msg),
             "warning: the rendezvous store listens on %s port %d without a token: anyone who "
             "can reach that port can end the job. Give every node the same secret in "
             "MG_RDZV_TOKEN (docs/rendezvous.md, Security)",
             h->bound[0] ? h->bound : "every interface,", h->port);
    s->progress(s->progress_ctx, msg);
}

static int open_store(const struct mg_kv_open_opts *s, struct mg_kv **kv, struct mg_kv_host **host,
                      char *err, size_t errlen)
{
    const struct mg_rdzv_conf *c = s->conf;
    struct mg_hostport hp;
    int rc, hosting;
    int64_t start = mg_now_ms(), next = 0;
    char last[512] = "";

    if (mg_parse_hostport(s->endpoint, MG_KV_STORE_DEFAULT_PORT, &hp) < 0) {
        snprintf(err, errlen, "--rdzv_endpoint '%s': expected host[:port]", s->endpoint);
        return -EINVAL;
    }
    if (s->backend == MG_RDZV_STATIC)
        hosting = c->is_host >= 0 ? c->is_host : s->node_rank == 0;
    else
        hosting = c->is_host >= 0 ? c->is_host : mg_kv_is_local_host(hp.host);
    if (hosting) {
        rc = host_store(s, &hp, host, err, errlen);
        if (rc == 0) {
            rc = leads_here(s, &hp, *host, err, errlen);
            if (rc == 1) {
                rc = mg_kv_hosted_open(kv, (*host)->srv, (*host)->where);
                if (rc == 0) {
                    warn_open(s, *host);
                    return 0;
                }
                snprintf(err, errlen, "cannot open the hosted store: %s", mg_strerror(rc));
            }
            mg_kv_host_release(*host);
            *host = NULL;
            if (rc < 0)
                return rc;
            /* The endpoint leads to another store: this agent is its client. */
        } else if (rc != -EADDRINUSE || c->is_host >= 0 || s->backend != MG_RDZV_C10D) {
            return rc;
        }
        /* (Guessed, and another agent on this machine hosts it: its client.) */
    }

    struct mg_kv_store_opts o = {
        .host = hp.host,
        .port = hp.port,
        .token = c->token,
        .timeout_ms = request_timeout_ms(c),
        .lease_ms = lease_ms(c),
    };
    /* Retry in steps of at most a second, so that abort_fd is honoured. */
    for (;;) {
        int left = mg_ms_until(s->deadline_ms);
        o.connect_timeout_ms = left < 1000 ? (left > 0 ? left : 1) : 1000;
        rc = mg_kv_store_open(kv, &o, last, sizeof(last));
        if (rc == 0)
            return 0;
        if (!transient(rc) || mg_now_ms() >= s->deadline_ms)
            break;
        progress(s, start, &next, last);
        if (pause_ms(s->abort_fd, 0) < 0) {
            rc = -EINTR;
            break;
        }
    }
    gave_up(err, errlen, last, rc);
    mg_kv_host_release(*host);
    *host = NULL;
    return rc;
}

int mg_kv_open(const struct mg_kv_open_opts *s, struct mg_kv **kv, struct mg_kv_host **host,
               char *ns, size_t nslen, char *err, size_t errlen)
{
    int rc;

    *kv = NULL;
    *host = NULL;
    rc = check_run_id(s->run_id, err, errlen);
    if (rc < 0)
        return rc;
    switch (s->backend) {
    case MG_RDZV_ETCD:
        snprintf(ns, nslen, "%s/%s", s->conf->prefix, s->run_id);
        return open_etcd(s, kv, ns, err, errlen);
    case MG_RDZV_C10D:
    case MG_RDZV_STATIC:
        snprintf(ns, nslen, "/mg/rdzv/%s", s->run_id);
        return open_store(s, kv, host, err, errlen);
    }
    return -EINVAL;
}

int mg_kv_local_addr(struct mg_kv *kv, const struct mg_kv_host *host, char *buf, size_t len)
{
    if (host) {
        if (!host->addr[0])
            return -ENOTCONN;
        snprintf(buf, len, "%s", host->addr);
        return 0;
    }
    if (strcmp(kv->ops->name, "store") == 0)
        return mg_sock_local_addr(mg_kv_store_fd(kv), buf, len);
    if (strcmp(kv->ops->name, "etcd") == 0)
        return mg_kv_etcd_local_addr(kv, buf, len);
    return -MG_EUNSUPPORTED;
}

int mg_kv_host_pollfds(struct mg_kv_host *h, struct pollfd *fds, int max)
{
    return h ? mg_store_server_pollfds(h->srv, fds, max) : 0;
}

int mg_kv_host_process(struct mg_kv_host *h, const struct pollfd *fds, int n)
{
    if (!h)
        return 0;
    int64_t before = mg_store_server_revision(h->srv);
    int rc = mg_store_server_process(h->srv, fds, n);
    if (rc < 0)
        return rc;
    return mg_store_server_revision(h->srv) != before;
}

int mg_kv_host_timeout_ms(const struct mg_kv_host *h)
{
    return h ? mg_store_server_timeout_ms(h->srv) : -1;
}

int mg_kv_host_serve(struct mg_kv_host *h, int timeout_ms)
{
    int64_t deadline = mg_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    if (!h) {
        if (timeout_ms > 0)
            poll(NULL, 0, timeout_ms);
        return 0;
    }
    for (;;) {
        int need = mg_store_server_nfds(h->srv);
        if (need > h->nfds) {
            struct pollfd *p = realloc(h->fds, (size_t)need * 2 * sizeof(*p));
            if (!p)
                return -ENOMEM;
            h->fds = p;
            h->nfds = need * 2;
        }
        int n = mg_store_server_pollfds(h->srv, h->fds, h->nfds);
        if (n == -ENOSPC)
            continue;
        if (n < 0)
            return n;
        int t = mg_ms_until(deadline), st = mg_store_server_timeout_ms(h->srv);
        if (st >= 0 && st < t)
            t = st;
        int rc = poll(h->fds, (nfds_t)n, t);
        if (rc < 0 && errno != EINTR)
            return -errno;
        rc = mg_kv_host_process(h, h->fds, rc > 0 ? n : 0);
        if (rc != 0)
            return rc;
        if (mg_now_ms() >= deadline)
            return 0;
    }
}

int mg_kv_host_stats(struct mg_kv_host *h, struct mg_store_server_stats *st)
{
    if (!h)
        return -EINVAL;
    mg_store_server_stats(h->srv, st);
    return 0;
}

int mg_kv_host_port(const struct mg_kv_host *h)
{
    return h ? h->port : 0;
}

void mg_kv_host_release(struct mg_kv_host *h)
{
    if (!h)
        return;
    mg_store_server_release(h->srv);
    free(h->fds);
    free(h);
}

int mg_kv_host_delete_prefix(struct mg_kv_host *h, const char *prefix, const char *keep)
{
    char **keys = NULL;
    int n = 0, done = 0;
    if (!h || mg_store_server_local_list(h->srv, prefix, -1, &keys, &n) < 0)
        return 0;
    for (int i = 0; i < n; i++)
        if (!(keep && strncmp(keys[i], keep, strlen(keep)) == 0) &&
            mg_store_server_local_delete(h->srv, keys[i]) == 1)
            done++;
    mg_store_free_list(keys, n);
    return done;
}
