/* The store server (store.h, docs/store-protocol.md): one event loop (an
 * epoll set, which the caller's poll() sees as one descriptor) over
 * non-blocking sockets, either driven by the caller's loop (the launcher) or
 * by a background thread (the runtime's rank 0). This part holds the loop's
 * turn, the timers (parked requests' deadlines, the connections' handshake,
 * lease, frame and closing deadlines), the thread and the public API; the
 * connections are store_conn.c, the key table, the requests and the local
 * calls store_table.c, store_requests.c and store_local.c. It keeps: one lock
 * around all the server's state; a turn costs what is ready, bounded (EV_BATCH
 * events, REQS_PER_TURN requests each, FLUSH_PER_TURN woken connections),
 * never what is connected (the timers are heaps: a turn costs those that
 * fall due); ephemeral keys die with their connection or its lease. Where to
 * listen is the caller's choice, mg_store_bind_addr its usual answer. */
#include "store_server_internal.h"
#include "mg_err.h"
#include "net.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#define EV_BATCH 256 /* events taken from the epoll set per turn */

/* ---- timers --------------------------------------------------------------------------- */

static void run_timers(struct mg_store_server *s)
{
    int64_t now = mg_now_ms();
    struct mg_theap_node *x;
    while ((x = mg_theap_top(&s->wtimers)) && x->deadline <= now) {
        struct waiter *w = (struct waiter *)((char *)x - offsetof(struct waiter, timer));
        mg_ss_answer(s, w->conn, w->op, w->id, NULL, MG_SP_TIMEDOUT);
        mg_ss_waiter_free(s, w);
        s->turn.timed_out++;
    }
    while ((x = mg_theap_top(&s->ctimers)) && x->deadline <= now) {
        struct conn *c = (struct conn *)((char *)x - offsetof(struct conn, timer));
        mg_theap_remove(&s->ctimers, x);
        s->turn.scanned++;
        mg_ss_conn_timer(s, c, now);
    }
}

static int timeout_locked(const struct mg_store_server *s)
{
    int64_t next = -1, now = mg_now_ms();
#define CONSIDER(t)                                                                                \
    do {                                                                                           \
        int64_t t_ = (t);                                                                          \
        if (next < 0 || t_ < next)                                                                 \
            next = t_;                                                                             \
    } while (0)
    if (mg_theap_top(&s->wtimers))
        CONSIDER(mg_theap_top(&s->wtimers)->deadline);
    if (mg_theap_top(&s->ctimers))
        CONSIDER(mg_theap_top(&s->ctimers)->deadline); /* the connections' own */
    if (s->accept_pause_until > now)
        CONSIDER(s->accept_pause_until);
    if (!TAILQ_EMPTY(&s->dirty) || !TAILQ_EMPTY(&s->backlog))
        CONSIDER(now); /* a turn's work left over */
#undef CONSIDER
    if (next < 0)
        return -1;
    if (next <= now)
        return 0;
    return next - now > 1000000 ? 1000000 : (int)(next - now);
}

/* ---- public API --------------------------------------------------------------------- */

void mg_ss_lock(const struct mg_store_server *s)
{
    pthread_mutex_lock((pthread_mutex_t *)&s->lock);
}

void mg_ss_unlock(const struct mg_store_server *s)
{
    pthread_mutex_unlock((pthread_mutex_t *)&s->lock);
}

int mg_store_server_start(struct mg_store_server **out, const struct mg_store_server_opts *o)
{
    struct mg_store_server *s;
    int rc;

    *out = NULL;
    if (o->token && strlen(o->token) > MG_STORE_MAX_TOKEN)
        return -MG_ETOOBIG;
    s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->lfd = s->wakefd = s->epfd = -1;
    TAILQ_INIT(&s->tombs);
    TAILQ_INIT(&s->hs);
    TAILQ_INIT(&s->dirty);
    TAILQ_INIT(&s->backlog);
    s->max_clients = o->max_clients > 0 ? o->max_clients : DEF_MAX_CLIENTS;
    s->max_waiters = o->max_waiters > 0 ? o->max_waiters : DEF_MAX_WAITERS;
    s->max_store = o->max_store_bytes ? o->max_store_bytes : DEF_MAX_STORE;
    s->max_buffer = o->max_buffer_bytes ? o->max_buffer_bytes : DEF_MAX_BUFFER;
    s->handshake_ms = o->handshake_timeout_ms > 0 ? o->handshake_timeout_ms : DEF_HANDSHAKE_MS;
    s->frame_ms = o->frame_timeout_ms > 0 ? o->frame_timeout_ms : DEF_FRAME_MS;
    s->read_budget = o->read_bytes_per_turn ? o->read_bytes_per_turn : READ_BUDGET;
    s->foreign = o->foreign;
    s->foreign_ctx = o->foreign_ctx;
    s->max_value = o->max_value_bytes && o->max_value_bytes < MG_STORE_MAX_VALUE
                       ? o->max_value_bytes
                       : MG_STORE_MAX_VALUE;
    /* The largest request, a compare-and-set, carries two values and a key. */
    s->max_frame = 2 * s->max_value + 4096;
    /* Replies queue up to a few requests' worth before reading stops. */
    s->out_high = 2 * s->max_frame;
    if (s->out_high < 65536)
        s->out_high = 65536;
    if (s->out_high > OUT_HIGH)
        s->out_high = OUT_HIGH;
    if (o->token && *o->token && !(s->token = strdup(o->token))) {
        rc = -ENOMEM;
        goto fail_free;
    }
    if (getrandom(s->sipkey, sizeof(s->sipkey), 0) != (ssize_t)sizeof(s->sipkey)) {
        rc = -errno;
        goto fail_free;
    }
    s->nbuckets = 256;
    s->table = calloc(s->nbuckets, sizeof(*s->table));
    if (!s->table) {
        rc = -ENOMEM;
        goto fail_free;
    }
    if ((rc = pthread_mutex_init(&s->lock, NULL))) {
        rc = -rc;
        goto fail_free;
    }
    s->local = calloc(1, sizeof(*s->local));
    if (!s->local) {
        rc = -ENOMEM;
        goto fail_mutex;
    }
    s->local->srv = s;
    s->local->fd = -1;
    s->local->state = ST_READY;
    mg_theap_node_init(&s->local->timer);
    s->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->wakefd < 0) {
        rc = -errno;
        goto fail_local;
    }
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (s->epfd < 0) {
        rc = -errno;
        goto fail_wake;
    }
    struct epoll_event wev = {.events = EPOLLIN, .data.fd = s->wakefd};
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->wakefd, &wev)) {
        rc = -errno;
        goto fail_ep;
    }
    if (o->listen_fd > 0) {
        s->lfd = o->listen_fd;
        rc = mg_set_nonblock(s->lfd, 1);
        if (rc)
            goto fail_ep;
        int port = mg_sock_local_port(s->lfd);
        if (port > 0)
            s->port = port;
    } else {
        rc = mg_listen_tcp(o->host, o->port, 1024, &s->port);
        if (rc < 0)
            goto fail_ep;
        s->lfd = rc;
        s->own_lfd = 1;
        rc = mg_set_nonblock(s->lfd, 1);
        if (rc)
            goto fail_listen;
    }
    *out = s;
    return 0;

fail_listen:
    close(s->lfd);
fail_ep:
    close(s->epfd);
fail_wake:
    close(s->wakefd);
fail_local:
    free(s->local);
fail_mutex:
    pthread_mutex_destroy(&s->lock);
fail_free:
    free(s->table);
    free(s->token);
    free(s);
    return rc;
}

int mg_store_server_port(const struct mg_store_server *srv)
{
    return srv->port;
}

static int sa_is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24 == 127;
    if (sa->sa_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
    return 0;
}

/* Whether this machine holds the address: binding to it succeeds. */
static int sa_is_mine(const struct addrinfo *ai)
{
    struct sockaddr_storage ss;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), ok;
    if (fd < 0 || ai->ai_addrlen > sizeof(ss)) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    if (ss.ss_family == AF_INET)
        ((struct sockaddr_in *)&ss)->sin_port = 0;
    else
        ((struct sockaddr_in6 *)&ss)->sin6_port = 0;
    ok = bind(fd, (struct sockaddr *)&ss, ai->ai_addrlen) == 0;
    close(fd);
    return ok;
}

enum mg_store_bind mg_store_bind_addr(const char *host, int single_host, char *out, size_t cap)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST};
    struct addrinfo *res = NULL, *pick = NULL;
    enum mg_store_bind how = MG_STORE_BIND_ALL;

    if (cap)
        out[0] = '\0';
    if (!host || !*host)
        return MG_STORE_BIND_ALL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0) {
        res = NULL;
        hints.ai_flags = 0;
        if ((strcasecmp(host, "localhost") && !single_host) ||
            getaddrinfo(host, NULL, &hints, &res) != 0)
            return MG_STORE_BIND_ALL;
    }
    /* IPv4 first, as the clients' resolver usually orders them. */
    for (int pass = 0; pass < 2 && !pick; pass++)
        for (struct addrinfo *ai = res; ai && !pick; ai = ai->ai_next)
            if ((ai->ai_family == AF_INET) == (pass == 0) &&
                (ai->ai_family == AF_INET || ai->ai_family == AF_INET6) && sa_is_mine(ai))
                pick = ai;
    if (pick && getnameinfo(pick->ai_addr, pick->ai_addrlen, out, (socklen_t)cap, NULL, 0,
                            NI_NUMERICHOST) == 0)
        how = sa_is_loopback(pick->ai_addr) ? MG_STORE_BIND_LOOPBACK : MG_STORE_BIND_ADDRESS;
    else if (cap)
        out[0] = '\0';
    freeaddrinfo(res);
    return how;
}

int mg_store_server_nfds(const struct mg_store_server *s)
{
    (void)s;
    return 1; /* the epoll set */
}

/* The listening socket is in the epoll set only while a connection can be
 * taken: level-triggered, a pending one would otherwise wake every turn. */
static void watch_listen(struct mg_store_server *s)
{
    int want = mg_ss_can_accept(s) && mg_now_ms() >= s->accept_pause_until;
    if (want == s->lfd_watched)
        return;
    struct epoll_event e = {.events = EPOLLIN, .data.fd = s->lfd};
    if (epoll_ctl(s->epfd, want ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, s->lfd, &e) == 0)
        s->lfd_watched = want;
}

static int pollfds_locked(struct mg_store_server *s, struct pollfd *fds, int max)
{
    if (max < 1)
        return -ENOSPC;
    watch_listen(s);
    fds[0] = (struct pollfd){.fd = s->epfd, .events = POLLIN};
    return 1;
}

int mg_store_server_pollfds(struct mg_store_server *s, struct pollfd *fds, int max)
{
    mg_ss_lock(s);
    int n = pollfds_locked(s, fds, max);
    mg_ss_unlock(s);
    return n;
}

/* One turn: what the epoll set has ready (at most EV_BATCH; the rest stays
 * ready for the next turn), the timers, then the replies. */
static void process_locked(struct mg_store_server *s, const struct pollfd *fds, int n)
{
    struct epoll_event ev[EV_BATCH];
    int accept_ready = 0, ready = 0;
    int64_t t0 = mg_now_us();
    for (int i = 0; i < n; i++)
        if (fds[i].fd == s->epfd && fds[i].revents)
            ready = 1;
    int k = ready ? epoll_wait(s->epfd, ev, EV_BATCH, 0) : 0;
    s->turn.events = k > 0 ? k : 0;
    for (int i = 0; i < k; i++) {
        uint32_t e = ev[i].events;
        int fd = ev[i].data.fd;
        short re = (short)(((e & EPOLLIN) ? POLLIN : 0) | ((e & EPOLLOUT) ? POLLOUT : 0) |
                           ((e & EPOLLERR) ? POLLERR : 0) | ((e & EPOLLHUP) ? POLLHUP : 0));
        if (!re)
            continue;
        if (fd == s->wakefd) {
            uint64_t v;
            while (read(s->wakefd, &v, sizeof(v)) > 0)
                ;
            continue;
        }
        if (fd == s->lfd) {
            accept_ready = 1; /* after the clients: no fd is reused under their events */
            continue;
        }
        struct conn *c = fd < s->byfd_cap ? s->byfd[fd] : NULL;
        if (!c || c->closing == CL_DEAD)
            continue;
        if (re & POLLOUT)
            mg_ss_conn_flush(c);
        if (re & POLLERR) {
            mg_ss_conn_kill(c);
            continue;
        }
        if (re & (POLLIN | POLLHUP)) {
            if (mg_ss_backpressured(c) && (re & POLLHUP))
                mg_ss_conn_kill(c);
            else
                mg_ss_conn_read(s, c);
        }
    }
    mg_ss_serve_backlog(s);
    if (accept_ready)
        mg_ss_accept_some(s);
    run_timers(s);
    mg_ss_settle(s);
    watch_listen(s);
    s->turn.us = mg_now_us() - t0;
    s->turn_last = s->turn;
    if (s->turn.us > s->turn_max.us)
        s->turn_max = s->turn;
    s->turns++;
    memset(&s->turn, 0, sizeof(s->turn));
}

int mg_store_server_process(struct mg_store_server *s, const struct pollfd *fds, int n)
{
    mg_ss_lock(s);
    process_locked(s, fds, n);
    mg_ss_unlock(s);
    return 0;
}

int mg_store_server_timeout_ms(const struct mg_store_server *s)
{
    mg_ss_lock(s);
    int t = timeout_locked(s);
    mg_ss_unlock(s);
    return t;
}

/* After a change made outside the loop (a local set, or release), the loop
 * may need to watch for POLLOUT: wake it so it rebuilds its pollfds. */
void mg_ss_wake_loop(struct mg_store_server *s)
{
    uint64_t one = 1;
    ssize_t rc = write(s->wakefd, &one, sizeof(one));
    (void)rc;
}

static void *serve(void *arg)
{
    struct mg_store_server *s = arg;
    for (;;) {
        mg_ss_lock(s);
        if (s->stop) {
            mg_ss_unlock(s);
            break;
        }
        int need = 1;
        if (need > s->tfds_cap) {
            int cap = need * 2;
            struct pollfd *p = realloc(s->tfds, (size_t)cap * sizeof(*p));
            if (p) {
                s->tfds = p;
                s->tfds_cap = cap;
            }
        }
        int n = pollfds_locked(s, s->tfds, s->tfds_cap);
        int timeout = timeout_locked(s);
        mg_ss_unlock(s);
        if (n < 0) { /* out of memory for the pollfds: retry shortly */
            poll(NULL, 0, 10);
            continue;
        }
        int rc = poll(s->tfds, (nfds_t)n, timeout);
        if (rc < 0 && errno != EINTR) {
            poll(NULL, 0, 10);
            continue;
        }
        mg_ss_lock(s);
        process_locked(s, s->tfds, rc > 0 ? n : 0);
        mg_ss_unlock(s);
    }
    return NULL;
}

int mg_store_server_start_thread(struct mg_store_server *s)
{
    if (s->has_thread)
        return -EBUSY;
    int rc = pthread_create(&s->thread, NULL, serve, s);
    if (rc)
        return -rc;
    s->has_thread = 1;
    return 0;
}

int64_t mg_store_server_revision(const struct mg_store_server *s)
{
    mg_ss_lock(s);
    int64_t rev = s->rev;
    mg_ss_unlock(s);
    return rev;
}

void mg_store_server_stats(struct mg_store_server *s, struct mg_store_server_stats *st)
{
    mg_ss_lock(s);
    st->clients = s->nconns;
    st->waiters = s->nwaiters;
    st->keys = s->nlive;
    st->stored_bytes = s->stored;
    st->buffer_bytes = s->buffered;
    st->revision = s->rev;
    st->dropped = s->dropped;
    st->leases_expired = s->leases_expired;
    st->requests = s->requests;
    st->turns = s->turns;
    st->turn_last = s->turn_last;
    st->turn_max = s->turn_max;
    mg_ss_unlock(s);
}

void mg_store_server_release(struct mg_store_server *s)
{
    if (!s)
        return;
    if (s->has_thread) {
        mg_ss_lock(s);
        s->stop = 1;
        mg_ss_unlock(s);
        mg_ss_wake_loop(s);
        pthread_join(s->thread, NULL);
    }
    /* Tear down without waking anyone: every connection goes. */
    while (!LIST_EMPTY(&s->conns)) {
        struct conn *c = LIST_FIRST(&s->conns);
        while (!LIST_EMPTY(&c->eph))
            mg_ss_owner_unlink(LIST_FIRST(&c->eph));
        while (!LIST_EMPTY(&c->waiters))
            mg_ss_waiter_free(s, LIST_FIRST(&c->waiters));
        c->closing = CL_DEAD;
        mg_ss_conn_teardown(c);
    }
    for (size_t i = 0; i < s->nbuckets; i++) {
        for (struct entry *e = s->table[i], *next; e; e = next) {
            next = e->hnext;
            mg_ss_blob_unref(s, e->val);
            free(e);
        }
    }
    mg_ss_blob_unref(s, s->list_cache.keys);
    free(s->list_cache.prefix);
    free(s->local);
    free(s->table);
    mg_theap_release(&s->wtimers);
    mg_theap_release(&s->ctimers);
    free(s->byfd);
    free(s->tfds);
    free(s->token);
    if (s->own_lfd)
        close(s->lfd);
    close(s->epfd);
    close(s->wakefd);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
