/* The store server (store.h, docs/store-protocol.md): one event loop (an
 * epoll set, which the caller's poll() sees as one descriptor) over
 * non-blocking sockets, either driven by the caller's loop (the launcher) or
 * by a background thread (the runtime's rank 0). This part holds the
 * connections (accept, read, flush, the handshake), the loop, the thread and
 * the public API; the key table, the requests and the local calls are
 * store_table.c, store_requests.c and store_local.c. It keeps: one lock
 * around all the server's state; every buffer that grows on a client's input
 * is bounded (max_buffer, out_high, max_frame, the read budget,
 * MAX_HANDSHAKING); a misbehaving client is dropped alone, marked dead and
 * torn down by mg_ss_settle outside any walk over the connections; ephemeral
 * keys die with their connection or its lease. Where to listen is the
 * caller's choice, mg_store_bind_addr its usual answer. */
#include "store_server_internal.h"
#include "mg_err.h"
#include "net.h"
#include "sha256.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* ---- connections --------------------------------------------------------------------- */

#define SCAN_MS  100 /* the longest between two walks of the connections' timers */
#define EV_BATCH 256 /* events taken from the epoll set per turn */

static int backpressured(const struct conn *c);

/* Brings the epoll set's interest in c up to date: input unless its replies
 * pile up, output while some are queued. Level-triggered, so nothing is
 * missed between a change and the next turn. */
static void conn_watch(struct conn *c)
{
    struct mg_store_server *s = c->srv;
    if (c->fd < 0 || c->closing == CL_DEAD)
        return;
    uint32_t ev = (backpressured(c) ? 0 : EPOLLIN) | (c->ohead ? EPOLLOUT : 0);
    if (ev == c->evmask)
        return;
    struct epoll_event e = {.events = ev, .data.fd = c->fd};
    if (epoll_ctl(s->epfd, EPOLL_CTL_MOD, c->fd, &e) == 0)
        c->evmask = ev;
    else
        mg_ss_conn_kill(c);
}

/* A deadline of c set or moved earlier: the next walk comes no later. */
static void scan_by(struct mg_store_server *s, int64_t t)
{
    if (t < s->next_scan)
        s->next_scan = t;
}

static void hs_unlink(struct conn *c)
{
    struct mg_store_server *s = c->srv;
    if (!c->in_hs)
        return;
    c->in_hs = 0;
    TAILQ_REMOVE(&s->hs, c, hslink);
    s->nhs--;
}

/* Drops a connection now. The teardown (ephemeral keys, parked requests)
 * happens in mg_ss_settle(), outside whatever loop is running. */
void mg_ss_conn_kill(struct conn *c)
{
    if (c->closing == CL_DEAD)
        return;
    c->closing = CL_DEAD;
    c->knext = c->srv->dead;
    c->srv->dead = c;
}

/* A protocol or policy failure: counted, then dropped. */
static void conn_drop(struct conn *c)
{
    if (c->closing != CL_DEAD)
        c->srv->dropped++;
    mg_ss_conn_kill(c);
}

/* Sends what is queued, then closes. */
static void conn_close_after_flush(struct conn *c)
{
    if (c->closing != CL_OPEN)
        return;
    c->srv->dropped++;
    c->closing = CL_AFTER_FLUSH;
    c->deadline_ms = mg_now_ms() + CLOSE_LINGER_MS;
    scan_by(c->srv, c->deadline_ms);
    mg_ss_mark_dirty(c);
}

static void conn_teardown(struct conn *c)
{
    struct mg_store_server *s = c->srv;
    if (c->dirty) {
        struct conn **pp = &s->dirty;
        while (*pp != c)
            pp = &(*pp)->dnext;
        *pp = c->dnext;
        c->dirty = 0;
    }
    while (!LIST_EMPTY(&c->eph))
        mg_ss_entry_delete(s, LIST_FIRST(&c->eph));
    while (!LIST_EMPTY(&c->waiters))
        mg_ss_waiter_free(s, LIST_FIRST(&c->waiters));
    for (struct oseg *o = c->ohead, *next; o; o = next) {
        next = o->next;
        s->buffered -= o->hlen;
        mg_ss_blob_unref(s, o->blob);
        free(o);
    }
    hs_unlink(c);
    LIST_REMOVE(c, link);
    s->nconns--;
    s->buffered -= c->icap;
    free(c->ibuf);
    if (c->fd >= 0 && c->fd < s->byfd_cap)
        s->byfd[c->fd] = NULL;
    if (c->fd >= 0) {
        epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    free(c);
}

static int backpressured(const struct conn *c)
{
    return c->obytes > c->srv->out_high || c->closing != CL_OPEN;
}

static size_t process_input(struct mg_store_server *s, struct conn *c);

static void conn_flush(struct conn *c)
{
    struct iovec iov[64];
    while (c->ohead && c->closing != CL_DEAD) {
        int n = 0;
        for (struct oseg *o = c->ohead; o && n < 62; o = o->next) {
            size_t off = o->off;
            if (off < o->hlen) {
                iov[n].iov_base = o->data + off;
                iov[n++].iov_len = o->hlen - off;
                off = 0;
            } else {
                off -= o->hlen;
            }
            if (o->blob && off < o->blob->len) {
                iov[n].iov_base = o->blob->data + off;
                iov[n++].iov_len = o->blob->len - off;
            }
        }
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                mg_ss_conn_kill(c);
            return;
        }
        c->obytes -= (size_t)w;
        while (w > 0) {
            struct oseg *o = c->ohead;
            size_t total = o->hlen + (o->blob ? o->blob->len : 0), left = total - o->off;
            if ((size_t)w < left) {
                o->off += (size_t)w;
                break;
            }
            w -= (ssize_t)left;
            c->ohead = o->next;
            if (!c->ohead)
                c->otail = NULL;
            c->srv->buffered -= o->hlen;
            mg_ss_blob_unref(c->srv, o->blob);
            free(o);
        }
    }
    if (!c->ohead && c->closing == CL_AFTER_FLUSH)
        mg_ss_conn_kill(c);
    /* Requests that arrived while the replies were piling up wait in the
     * input buffer: with room again, serve them now, not on the next read
     * (the client may be sending nothing until it has its replies). */
    if (c->ilen > c->ipos && !backpressured(c))
        process_input(c->srv, c);
    conn_watch(c);
}

static void send_shello(struct conn *c, uint16_t status, uint32_t flags)
{
    struct mg_sp_shello h = {.version = MG_SP_WIRE_VERSION, .status = status, .flags = flags};
    uint8_t out[MG_SP_SHELLO_LEN];
    memcpy(h.nonce, c->snonce, sizeof(h.nonce));
    mg_sp_shello_encode(out, &h);
    mg_ss_queue_raw(c, out, sizeof(out), NULL);
}

static void become_ready(struct conn *c)
{
    hs_unlink(c);
    c->state = ST_READY;
    c->last_rx_ms = mg_now_ms();
    c->deadline_ms = 0;
}

static void handle_hello(struct mg_store_server *s, struct conn *c, const uint8_t *in)
{
    struct mg_sp_hello h;
    if (mg_sp_hello_decode(in, &h)) {
        conn_drop(c); /* not our protocol: no answer */
        return;
    }
    memcpy(c->cnonce, h.nonce, sizeof(c->cnonce));
    if (h.version != MG_SP_WIRE_VERSION) {
        send_shello(c, MG_SP_VERSION, 0);
        conn_close_after_flush(c);
    } else if (h.lease_ms > MG_SP_MAX_LEASE_MS || (h.flags & ~MG_SP_HELLO_AUTH)) {
        send_shello(c, MG_SP_INVAL, 0);
        conn_close_after_flush(c);
    } else if (s->token && !(h.flags & MG_SP_HELLO_AUTH)) {
        send_shello(c, MG_SP_AUTH, MG_SP_HELLO_AUTH);
        conn_close_after_flush(c);
    } else if (s->token) {
        c->lease_ms = h.lease_ms;
        if (getrandom(c->snonce, sizeof(c->snonce), 0) != (ssize_t)sizeof(c->snonce)) {
            conn_drop(c);
            return;
        }
        send_shello(c, MG_SP_OK, MG_SP_HELLO_AUTH);
        c->state = ST_AUTH;
    } else {
        c->lease_ms = h.lease_ms;
        send_shello(c, MG_SP_OK, 0);
        become_ready(c);
    }
}

static void handle_auth(struct mg_store_server *s, struct conn *c, const uint8_t *in)
{
    uint8_t want[MG_SP_PROOF_LEN], out[MG_SP_AUTH_REPLY_LEN];
    mg_sp_client_proof(s->token, c->cnonce, c->snonce, want);
    if (!mg_memeq_ct(want, in, MG_SP_PROOF_LEN)) {
        mg_sp_auth_reply_encode(out, MG_SP_AUTH, NULL);
        mg_ss_queue_raw(c, out, sizeof(out), NULL);
        conn_close_after_flush(c);
        return;
    }
    mg_sp_server_proof(s->token, c->cnonce, c->snonce, want);
    mg_sp_auth_reply_encode(out, MG_SP_OK, want);
    mg_ss_queue_raw(c, out, sizeof(out), NULL);
    become_ready(c);
}

/* A connection that speaks another protocol (its first bytes are not the
 * handshake's magic) goes to the server's foreign handler with what it sent
 * so far; this server forgets it without closing it. 1 when handed over. */
static int hand_over(struct mg_store_server *s, struct conn *c, const uint8_t *p, size_t avail)
{
    static const uint8_t magic[4] = {'M', 'G', 'S', 'T'};
    size_t k = avail < sizeof(magic) ? avail : sizeof(magic);
    if (!s->foreign || c->state != ST_HELLO || c->ipos != 0 || memcmp(p, magic, k) == 0)
        return 0;
    int fd = c->fd;
    if (fd < s->byfd_cap)
        s->byfd[fd] = NULL;
    epoll_ctl(s->epfd, EPOLL_CTL_DEL, fd, NULL);
    c->fd = -1;
    mg_ss_conn_kill(c); /* torn down in mg_ss_settle, the socket left alone */
    s->foreign(s->foreign_ctx, fd, p, avail);
    return 1;
}

/* Handles every complete message in the input buffer. Returns the bytes the
 * message in progress still needs (0 when unknown). */
static size_t process_input(struct mg_store_server *s, struct conn *c)
{
    size_t need = 0;
    while (c->closing == CL_OPEN && !backpressured(c)) {
        size_t avail = c->ilen - c->ipos;
        const uint8_t *p = c->ibuf + c->ipos;
        if (avail && hand_over(s, c, p, avail))
            return 0;
        if (c->state == ST_HELLO || c->state == ST_AUTH) {
            size_t len = c->state == ST_HELLO ? MG_SP_HELLO_LEN : MG_SP_AUTH_LEN;
            if (avail < len) {
                need = len - avail;
                break;
            }
            if (c->state == ST_HELLO)
                handle_hello(s, c, p);
            else
                handle_auth(s, c, p);
            c->ipos += len;
            continue;
        }
        if (avail < MG_SP_HDR_LEN) {
            need = MG_SP_HDR_LEN - avail;
            break;
        }
        struct mg_sp_hdr h;
        mg_sp_hdr_decode(p, &h);
        if (mg_sp_hdr_check(&h, 0) || h.len > s->max_frame) {
            /* An oversized length: the stream cannot be followed any further. */
            mg_ss_reply_status(c, MG_SP_ERROR, h.id, MG_SP_TOOBIG);
            conn_close_after_flush(c);
            break;
        }
        if (avail < MG_SP_HDR_LEN + (size_t)h.len) {
            need = MG_SP_HDR_LEN + (size_t)h.len - avail;
            break;
        }
        mg_ss_handle_request(s, c, &h, p + MG_SP_HDR_LEN);
        c->ipos += MG_SP_HDR_LEN + h.len;
        c->frame_start_ms = 0;
    }
    if (c->ipos == c->ilen) {
        c->ipos = c->ilen = 0;
    } else if (c->ipos > 0 && (need || c->ipos >= c->icap / 2)) {
        memmove(c->ibuf, c->ibuf + c->ipos, c->ilen - c->ipos);
        c->ilen -= c->ipos;
        c->ipos = 0;
    }
    if (c->ilen > c->ipos && !c->frame_start_ms)
        c->frame_start_ms = mg_now_ms();
    else if (c->ilen == c->ipos)
        c->frame_start_ms = 0;
    return need;
}

static int ibuf_resize(struct mg_store_server *s, struct conn *c, size_t cap)
{
    if (cap > c->icap && s->buffered + (cap - c->icap) > s->max_buffer)
        return -ENOSPC;
    uint8_t *p = realloc(c->ibuf, cap);
    if (!p)
        return -ENOMEM;
    s->buffered = s->buffered - c->icap + cap;
    c->ibuf = p;
    c->icap = cap;
    return 0;
}

static void conn_read(struct mg_store_server *s, struct conn *c)
{
    size_t budget = s->read_budget, need = 0;
    while (c->closing == CL_OPEN && !backpressured(c) && budget) {
        if (c->ilen == c->icap) {
            /* Grow only towards what the message in progress needs, and in
             * steps, so a declared length costs nothing until bytes arrive. */
            size_t want = c->ilen + (need ? need : IBUF_MIN);
            size_t step = c->icap < 65536 ? 65536 : c->icap * 2;
            if (want > step)
                want = step;
            if (ibuf_resize(s, c, want)) {
                mg_ss_reply_status(c, MG_SP_ERROR, 0, MG_SP_NOSPACE);
                conn_close_after_flush(c);
                return;
            }
        }
        size_t room = c->icap - c->ilen;
        if (room > budget)
            room = budget;
        ssize_t n = recv(c->fd, c->ibuf + c->ilen, room, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                mg_ss_conn_kill(c);
            break;
        }
        if (n == 0) {
            mg_ss_conn_kill(c);
            break;
        }
        c->ilen += (size_t)n;
        budget -= (size_t)n;
        c->last_rx_ms = mg_now_ms();
        need = process_input(s, c);
    }
    conn_watch(c);
    /* Give back a large buffer once its frame is done. */
    if (c->closing != CL_DEAD && c->icap > IBUF_MIN && c->ilen - c->ipos <= IBUF_MIN / 2 && !need) {
        if (c->ipos) {
            memmove(c->ibuf, c->ibuf + c->ipos, c->ilen - c->ipos);
            c->ilen -= c->ipos;
            c->ipos = 0;
        }
        ibuf_resize(s, c, IBUF_MIN);
    }
}

static int byfd_put(struct mg_store_server *s, int fd, struct conn *c)
{
    if (fd >= s->byfd_cap) {
        int cap = s->byfd_cap ? s->byfd_cap : 64;
        while (cap <= fd)
            cap *= 2;
        struct conn **t = realloc(s->byfd, (size_t)cap * sizeof(*t));
        if (!t)
            return -ENOMEM;
        memset(t + s->byfd_cap, 0, (size_t)(cap - s->byfd_cap) * sizeof(*t));
        s->byfd = t;
        s->byfd_cap = cap;
    }
    s->byfd[fd] = c;
    return 0;
}

/* Whether a new connection can be taken: below max_clients, or at it with a
 * connection still in the handshake to give way (a crowd of silent
 * connections must not lock the nodes of the job out until they time out). */
static int can_accept(const struct mg_store_server *s)
{
    return s->nconns < s->max_clients || s->nhs > 0;
}

void mg_ss_accept_some(struct mg_store_server *s)
{
    for (int i = 0; i < ACCEPT_BURST && can_accept(s); i++) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                s->accept_pause_until = mg_now_ms() + 100;
            return;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        struct conn *c = calloc(1, sizeof(*c));
        if (!c) {
            close(fd);
            continue;
        }
        if (byfd_put(s, fd, c) || ibuf_resize(s, c, IBUF_MIN)) {
            if (fd < s->byfd_cap)
                s->byfd[fd] = NULL;
            s->buffered -= c->icap;
            free(c->ibuf);
            free(c);
            close(fd);
            continue;
        }
        /* Too many half-open handshakes, or no room: the oldest handshake
         * makes room. */
        if ((s->nhs >= MAX_HANDSHAKING || s->nconns >= s->max_clients) && !TAILQ_EMPTY(&s->hs)) {
            struct conn *old = TAILQ_FIRST(&s->hs);
            hs_unlink(old);
            conn_drop(old);
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
        if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev)) {
            s->byfd[fd] = NULL;
            s->buffered -= c->icap;
            free(c->ibuf);
            free(c);
            close(fd);
            s->accept_pause_until = mg_now_ms() + 100;
            return;
        }
        c->evmask = EPOLLIN;
        c->srv = s;
        c->fd = fd;
        c->state = ST_HELLO;
        c->deadline_ms = mg_now_ms() + s->handshake_ms;
        scan_by(s, c->deadline_ms);
        LIST_INSERT_HEAD(&s->conns, c, link);
        s->nconns++;
        c->in_hs = 1;
        TAILQ_INSERT_TAIL(&s->hs, c, hslink);
        s->nhs++;
    }
}

/* Flushes the connections that got output and tears down the dead ones, until
 * neither list has anything (a teardown wakes other connections' waiters). */
void mg_ss_settle(struct mg_store_server *s)
{
    while (s->dirty || s->dead) {
        while (s->dirty) {
            struct conn *c = s->dirty;
            s->dirty = c->dnext;
            c->dirty = 0;
            if (c->closing != CL_DEAD)
                conn_flush(c);
        }
        while (s->dead) {
            struct conn *c = s->dead;
            s->dead = c->knext;
            conn_teardown(c);
        }
    }
}

static void run_timers(struct mg_store_server *s)
{
    int64_t now = mg_now_ms();
    while (s->nheap && s->heap[0]->deadline_ms <= now) {
        struct waiter *w = s->heap[0];
        mg_ss_answer(s, w->conn, w->op, w->id, NULL, MG_SP_TIMEDOUT);
        mg_ss_waiter_free(s, w);
    }
    if (now < s->next_scan)
        return;
    /* The walk notes the earliest deadline it sees for the next one. */
    int64_t next = now + SCAN_MS;
#define NOTE(t)                                                                                    \
    do {                                                                                           \
        if ((t) < next)                                                                            \
            next = (t);                                                                            \
    } while (0)
    struct conn *c;
    LIST_FOREACH(c, &s->conns, link) {
        if (c->closing == CL_DEAD)
            continue;
        if (c->deadline_ms)
            NOTE(c->deadline_ms);
        if (c->state == ST_READY && c->lease_ms)
            NOTE(c->last_rx_ms + (int64_t)c->lease_ms);
        if (c->frame_start_ms && !backpressured(c))
            NOTE(c->frame_start_ms + s->frame_ms);
        if (c->deadline_ms && now >= c->deadline_ms) {
            conn_drop(c); /* handshake too slow, or a final error nobody reads */
        } else if (c->state == ST_READY && c->lease_ms &&
                   now - c->last_rx_ms >= (int64_t)c->lease_ms) {
            /* Bytes that arrived after poll() returned are not silence. */
            int pending = 0;
            if (ioctl(c->fd, FIONREAD, &pending) == 0 && pending > 0) {
                c->last_rx_ms = now;
                continue;
            }
            s->leases_expired++;
            conn_drop(c);
        } else if (c->frame_start_ms && !backpressured(c) &&
                   now - c->frame_start_ms >= s->frame_ms) {
            conn_drop(c); /* a frame begun and never finished */
        }
    }
#undef NOTE
    s->next_scan = next;
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
    if (s->nheap)
        CONSIDER(s->heap[0]->deadline_ms);
    if (s->accept_pause_until > now)
        CONSIDER(s->accept_pause_until);
    if (s->nconns)
        CONSIDER(s->next_scan); /* the connections' timers (run_timers) */
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
    int want = can_accept(s) && mg_now_ms() >= s->accept_pause_until;
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
    for (int i = 0; i < n; i++)
        if (fds[i].fd == s->epfd && fds[i].revents)
            ready = 1;
    int k = ready ? epoll_wait(s->epfd, ev, EV_BATCH, 0) : 0;
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
            conn_flush(c);
        if (re & POLLERR) {
            mg_ss_conn_kill(c);
            continue;
        }
        if (re & (POLLIN | POLLHUP)) {
            if (backpressured(c) && (re & POLLHUP))
                mg_ss_conn_kill(c);
            else
                conn_read(s, c);
        }
    }
    if (accept_ready)
        mg_ss_accept_some(s);
    run_timers(s);
    mg_ss_settle(s);
    watch_listen(s);
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
        conn_teardown(c);
    }
    for (size_t i = 0; i < s->nbuckets; i++) {
        for (struct entry *e = s->table[i], *next; e; e = next) {
            next = e->hnext;
            mg_ss_blob_unref(s, e->val);
            free(e);
        }
    }
    free(s->local);
    free(s->table);
    free(s->heap);
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
