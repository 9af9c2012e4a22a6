/* Opening the rendezvous backends, with retries while the endpoint's name does
 * not resolve or nothing listens yet (see rdzv_backend.h). */
#include "rdzv_backend.h"
#include "etcd.h"
#include "mg_err.h"
#include "net.h"
#include "rdzv_proto.h"
#include "rdzv_store.h"
#include "store.h"

#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Errors worth retrying while the job's nodes come up. */
static int transient(int rc)
{
    return rc == -ENOENT || rc == -EAGAIN || rc == -ECONNREFUSED || rc == -ETIMEDOUT ||
           rc == -EHOSTUNREACH || rc == -ENETUNREACH || rc == -ECONNRESET;
}

/* Tells the caller, once, that the endpoint is still out of reach. */
static void progress(const struct mg_rdzv_setup *s, int64_t start, int *told, const char *why)
{
    char msg[700];
    if (*told || !s->progress || mg_now_ms() - start < MG_RDZV_PROGRESS_MS)
        return;
    *told = 1;
    snprintf(msg, sizeof(msg), "%s; retrying until join_timeout (%gs)", why,
             s->conf->join_timeout_ms / 1000.0);
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

int mg_rdzv_is_local_host(const char *host)
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

static int open_etcd(const struct mg_rdzv_setup *s, struct mg_kv **kv, const char *ns, char *err,
                     size_t errlen)
{
    const struct mg_rdzv_conf *c = s->conf;
    struct mg_etcd_opts o = {
        .endpoints = s->endpoint,
        .cacert = c->cacert,
        .cert = c->cert,
        .key = c->key,
        .timeout_ms = c->read_timeout_ms < c->heartbeat_timeout_ms ? c->read_timeout_ms
                                                                   : c->heartbeat_timeout_ms,
        /* A node is declared dead heartbeat_timeout after its last heartbeat. */
        .lease_ttl_ms = c->heartbeat_timeout_ms - c->heartbeat_interval_ms,
    };
    char probe[MG_KV_MAX_KEY];
    int delay = 50, rc, told = 0;
    int64_t start = mg_now_ms();

    rc = mg_etcd_open(kv, &o, err, errlen);
    if (rc < 0)
        return rc;
    snprintf(probe, sizeof(probe), "%s/state", ns);
    for (;;) {
        rc = (*kv)->ops->get(*kv, probe, NULL, NULL, NULL);
        if (rc == 0 || rc == -MG_ENOKEY)
            return 0;
        if (!transient(rc) || mg_now_ms() + delay >= s->deadline_ms)
            break;
        progress(s, start, &told, mg_kv_error(*kv));
        rc = pause_ms(s->abort_fd, delay);
        if (rc < 0)
            break;
        delay = delay * 2 > 1000 ? 1000 : delay * 2;
    }
    snprintf(err, errlen, "%s%s", mg_kv_error(*kv),
             rc == -EINTR    ? " (interrupted)"
             : transient(rc) ? " (gave up at join_timeout)"
                             : "");
    (*kv)->ops->release(*kv);
    *kv = NULL;
    return rc;
}

struct mg_rdzv_host {
    struct mg_store_server *srv;
    int port;
};

static int host_store(const struct mg_rdzv_setup *s, int port, struct mg_rdzv_host **out, char *err,
                      size_t errlen)
{
    struct mg_store_server_opts so = {.port = port, .token = s->conf->token};
    struct mg_rdzv_host *h = calloc(1, sizeof(*h));
    int rc;

    if (!h)
        return -ENOMEM;
    /* Every interface: the other nodes reach it by the endpoint's name. */
    rc = mg_store_server_start(&h->srv, &so);
    if (rc < 0) {
        snprintf(err, errlen, "cannot host the rendezvous store on port %d: %s", port,
                 mg_strerror(rc));
        free(h);
        return rc;
    }
    /* The store client blocks in poll() on its own socket, so the store this
     * agent hosts is served from a thread rather than the agent's loop. The
     * thread must take no signal: the agent reads them all from a signalfd,
     * SIGCHLD included, which only works when every thread blocks them. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    rc = mg_store_server_start_thread(h->srv);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc < 0) {
        snprintf(err, errlen, "cannot start the rendezvous store: %s", mg_strerror(rc));
        mg_store_server_release(h->srv);
        free(h);
        return rc;
    }
    h->port = mg_store_server_port(h->srv);
    *out = h;
    return 0;
}

static int open_store(const struct mg_rdzv_setup *s, struct mg_kv **kv, struct mg_rdzv_host **host,
                      char *err, size_t errlen)
{
    const struct mg_rdzv_conf *c = s->conf;
    struct mg_hostport hp;
    int rc, hosting, told = 0;
    int64_t start = mg_now_ms();
    char last[512] = "";

    if (mg_parse_hostport(s->endpoint, MG_RDZV_DEFAULT_PORT, &hp) < 0) {
        snprintf(err, errlen, "--rdzv_endpoint '%s': expected host[:port]", s->endpoint);
        return -EINVAL;
    }
    if (s->backend == MG_RDZV_STATIC)
        hosting = c->is_host >= 0 ? c->is_host : s->node_rank == 0;
    else
        hosting = c->is_host >= 0 ? c->is_host : mg_rdzv_is_local_host(hp.host);
    if (hosting) {
        rc = host_store(s, hp.port, host, err, errlen);
        /* Guessed, and another agent on this machine hosts it: be its client. */
        if (rc == -EADDRINUSE && c->is_host < 0 && s->backend == MG_RDZV_C10D)
            rc = 0;
        else if (rc < 0)
            return rc;
    }

    struct mg_kv_store_opts o = {
        .host = hp.host,
        .port = hp.port,
        .token = c->token,
        .timeout_ms = c->read_timeout_ms < c->heartbeat_timeout_ms ? c->read_timeout_ms
                                                                   : c->heartbeat_timeout_ms,
        .lease_ms = c->heartbeat_timeout_ms - c->heartbeat_interval_ms,
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
        progress(s, start, &told, last);
        if (pause_ms(s->abort_fd, 0) < 0) {
            rc = -EINTR;
            break;
        }
    }
    snprintf(err, errlen, "%s%s", last,
             rc == -EINTR    ? " (interrupted)"
             : transient(rc) ? " (gave up at join_timeout)"
                             : "");
    mg_rdzv_host_release(*host);
    *host = NULL;
    return rc;
}

int mg_rdzv_backend_open(const struct mg_rdzv_setup *s, struct mg_kv **kv,
                         struct mg_rdzv_host **host, char *ns, size_t nslen, char *err,
                         size_t errlen)
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

int mg_rdzv_backend_local_addr(struct mg_kv *kv, char *buf, size_t len)
{
    if (strcmp(kv->ops->name, "store") == 0)
        return mg_sock_local_addr(mg_kv_store_fd(kv), buf, len);
    if (strcmp(kv->ops->name, "etcd") == 0)
        return mg_etcd_local_addr(kv, buf, len);
    return -MG_EUNSUPPORTED;
}

int mg_rdzv_host_pollfds(struct mg_rdzv_host *h, struct pollfd *fds, int max)
{
    return 0; /* served by its thread */
}

int mg_rdzv_host_process(struct mg_rdzv_host *h, const struct pollfd *fds, int n)
{
    return 0;
}

int mg_rdzv_host_timeout_ms(const struct mg_rdzv_host *h)
{
    return -1;
}

int mg_rdzv_host_port(const struct mg_rdzv_host *h)
{
    return h ? h->port : 0;
}

void mg_rdzv_host_release(struct mg_rdzv_host *h)
{
    if (!h)
        return;
    mg_store_server_release(h->srv);
    free(h);
}
