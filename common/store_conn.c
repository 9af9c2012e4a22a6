/* The store server's connections (store_server_internal.h): accepting them,
 * the handshake, reading and splitting frames, sending the replies, and
 * closing. It keeps: every buffer that grows on a client's input is bounded
 * (max_buffer, out_high, max_frame, the read budget, MAX_HANDSHAKING); a
 * connection is served at most REQS_PER_TURN requests per turn of the loop,
 * the rest waiting in its input buffer on the backlog, so a client that
 * pipelines many requests delays no other by more than that; the replies to
 * what a connection sent go out at once, those to the requests a change woke
 * (other connections) FLUSH_PER_TURN connections a turn, oldest first; a
 * misbehaving client is dropped alone, marked dead and torn down by
 * mg_ss_settle outside any walk over the connections. */
#include "store_server_internal.h"
#include "net.h"
#include "sha256.h"

#include <errno.h>
#include <stdint.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* Brings the epoll set's interest in c up to date: input unless its replies
 * pile up, output while some are queued. Level-triggered, so nothing is
 * missed between a change and the next turn. */
static void conn_watch(struct conn *c)
{
    struct mg_store_server *s = c->srv;
    if (c->fd < 0 || c->closing == CL_DEAD)
        return;
    uint32_t ev = (mg_ss_backpressured(c) ? 0 : EPOLLIN) | (c->ohead ? EPOLLOUT : 0);
    mg_ss_conn_arm(c); /* a frame begun, a handshake done: a deadline may apply now */
    if (ev == c->evmask)
        return;
    struct epoll_event e = {.events = ev, .data.fd = c->fd};
    if (epoll_ctl(s->epfd, EPOLL_CTL_MOD, c->fd, &e) == 0)
        c->evmask = ev;
    else
        mg_ss_conn_kill(c);
}

#define BACKPRESSURED_RECHECK_MS 100 /* a stalled frame of a connection not read from */

/* The earliest of c's deadlines, INT64_MAX when none applies. */
static int64_t conn_due(const struct conn *c)
{
    int64_t t = INT64_MAX;
    if (c->closing == CL_DEAD || c->fd < 0)
        return t;
    if (c->deadline_ms)
        t = c->deadline_ms;
    if (c->state == ST_READY && c->lease_ms && c->last_rx_ms + (int64_t)c->lease_ms < t)
        t = c->last_rx_ms + (int64_t)c->lease_ms;
    if (c->frame_start_ms && c->frame_start_ms + c->srv->frame_ms < t)
        t = c->frame_start_ms + c->srv->frame_ms;
    return t;
}

void mg_ss_conn_arm(struct conn *c)
{
    struct mg_store_server *s = c->srv;
    int64_t t = conn_due(c);
    if (t == INT64_MAX)
        return; /* a timer left in the heap finds nothing due and goes */
    if (c->timer.idx == MG_THEAP_NONE)
        mg_theap_push(&s->ctimers, &c->timer, t); /* room reserved at accept */
    else if (t < c->timer.deadline)
        mg_theap_move(&s->ctimers, &c->timer, t);
}

void mg_ss_conn_timer(struct mg_store_server *s, struct conn *c, int64_t now)
{
    if (c->closing == CL_DEAD)
        return;
    if (c->deadline_ms && now >= c->deadline_ms) {
        mg_ss_conn_drop(c); /* handshake too slow, or a final error nobody reads */
        return;
    }
    if (c->state == ST_READY && c->lease_ms && now - c->last_rx_ms >= (int64_t)c->lease_ms) {
        /* Bytes that arrived after the epoll set was read are not silence. */
        int pending = 0;
        if (ioctl(c->fd, FIONREAD, &pending) == 0 && pending > 0) {
            c->last_rx_ms = now;
        } else {
            s->leases_expired++;
            mg_ss_conn_drop(c);
            return;
        }
    }
    if (c->frame_start_ms && now - c->frame_start_ms >= s->frame_ms) {
        if (!mg_ss_backpressured(c)) {
            mg_ss_conn_drop(c); /* a frame begun and never finished */
            return;
        }
        /* Not read from while its replies pile up: the frame cannot finish,
         * and counts against it once reading resumes. */
        mg_theap_push(&s->ctimers, &c->timer, now + BACKPRESSURED_RECHECK_MS);
        return;
    }
    mg_ss_conn_arm(c);
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
void mg_ss_conn_drop(struct conn *c)
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
    mg_ss_conn_arm(c);
    mg_ss_mark_dirty(c);
}

static void dirty_unlink(struct conn *c)
{
    if (c->dirty) {
        TAILQ_REMOVE(&c->srv->dirty, c, dlink);
        c->dirty = 0;
    }
}

/* c has complete requests left in its input buffer: served next turn. */
static void backlog_add(struct conn *c)
{
    if (!c->in_backlog && c->closing == CL_OPEN) {
        c->in_backlog = 1;
        TAILQ_INSERT_TAIL(&c->srv->backlog, c, blink);
    }
}

static void backlog_unlink(struct conn *c)
{
    if (c->in_backlog) {
        TAILQ_REMOVE(&c->srv->backlog, c, blink);
        c->in_backlog = 0;
    }
}

void mg_ss_conn_teardown(struct conn *c)
{
    struct mg_store_server *s = c->srv;
    dirty_unlink(c);
    backlog_unlink(c);
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
    mg_theap_remove(&s->ctimers, &c->timer);
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

int mg_ss_backpressured(const struct conn *c)
{
    return c->obytes > c->srv->out_high || c->closing != CL_OPEN;
}

/* Sends what is queued for c, as far as its socket takes it; the rest goes
 * when the epoll set says it is writable (conn_watch). */
void mg_ss_conn_flush(struct conn *c)
{
    struct iovec iov[64];
    dirty_unlink(c);
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
        size_t asked = 0;
        for (int i = 0; i < n; i++)
            asked += iov[i].iov_len;
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                mg_ss_conn_kill(c);
            break; /* the rest when the socket is writable (conn_watch) */
        }
        int full = (size_t)w < asked; /* the next send would only say so */
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
        if (full)
            break;
    }
    if (!c->ohead && c->closing == CL_AFTER_FLUSH)
        mg_ss_conn_kill(c);
    /* Requests that arrived while the replies were piling up wait in the
     * input buffer: with room again, they are served next turn, not on the
     * next read (the client may be sending nothing until it has its
     * replies). */
    if (c->ilen > c->ipos && !mg_ss_backpressured(c))
        backlog_add(c);
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
        mg_ss_conn_drop(c); /* not our protocol: no answer */
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
            mg_ss_conn_drop(c);
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

/* Handles the complete messages in the input buffer, at most *budget of them
 * (each taken off it). Returns the bytes the message in progress still needs
 * (0 when unknown, or when the budget ran out first). */
static size_t process_input(struct mg_store_server *s, struct conn *c, int *budget)
{
    size_t need = 0;
    while (c->closing == CL_OPEN && !mg_ss_backpressured(c) && *budget > 0) {
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
            --*budget;
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
        --*budget;
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

/* One turn of c: the requests already in its input buffer, then what its
 * socket holds, at most REQS_PER_TURN requests and the read budget in all;
 * the replies go out at once. Requests left over put c on the backlog. */
void mg_ss_conn_read(struct mg_store_server *s, struct conn *c)
{
    size_t budget = s->read_budget, need = 0;
    int reqs = REQS_PER_TURN;
    backlog_unlink(c);
    if (c->ilen > c->ipos)
        need = process_input(s, c, &reqs);
    while (c->closing == CL_OPEN && !mg_ss_backpressured(c) && budget && reqs > 0) {
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
        need = process_input(s, c, &reqs);
        /* A short read emptied the socket: asking again costs a system
         * call that only says so (level-triggered, more input is seen next
         * turn). */
        if ((size_t)n < room)
            break;
    }
    if (reqs == 0 && c->ilen > c->ipos)
        backlog_add(c);
    if (c->ohead && c->closing != CL_DEAD)
        mg_ss_conn_flush(c); /* watches c */
    else
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
int mg_ss_can_accept(const struct mg_store_server *s)
{
    return s->nconns < s->max_clients || s->nhs > 0;
}

void mg_ss_accept_some(struct mg_store_server *s)
{
    for (int i = 0; i < ACCEPT_BURST && mg_ss_can_accept(s); i++) {
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
        mg_theap_node_init(&c->timer);
        if (byfd_put(s, fd, c) || mg_theap_reserve(&s->ctimers, (size_t)s->nconns + 1) ||
            ibuf_resize(s, c, IBUF_MIN)) {
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
            mg_ss_conn_drop(old);
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
        mg_ss_conn_arm(c);
        LIST_INSERT_HEAD(&s->conns, c, link);
        s->nconns++;
        c->in_hs = 1;
        TAILQ_INSERT_TAIL(&s->hs, c, hslink);
        s->nhs++;
        s->turn.accepted++;
    }
}

/* Flushes up to FLUSH_PER_TURN connections that got output (oldest first)
 * and tears down the dead ones (a teardown wakes other connections' waiters,
 * whose replies join the queue). What is left waits for the next turn, which
 * comes at once (mg_ss_timeout). */
void mg_ss_settle(struct mg_store_server *s)
{
    int flushed = 0;
    for (;;) {
        struct conn *c;
        while (flushed < FLUSH_PER_TURN && (c = TAILQ_FIRST(&s->dirty))) {
            if (c->closing == CL_DEAD)
                dirty_unlink(c);
            else
                mg_ss_conn_flush(c);
            flushed++;
            s->turn.flushed++;
        }
        if (!s->dead)
            break;
        while (s->dead) {
            c = s->dead;
            s->dead = c->knext;
            mg_ss_conn_teardown(c);
            s->turn.closed++;
        }
    }
}

/* The connections whose requests waited in their input buffers for a turn,
 * as many as were waiting when the turn began (those served since by an
 * event of theirs are off the list). */
void mg_ss_serve_backlog(struct mg_store_server *s)
{
    int n = 0;
    struct conn *c;
    TAILQ_FOREACH(c, &s->backlog, blink)
        n++;
    while (n-- > 0 && (c = TAILQ_FIRST(&s->backlog)))
        mg_ss_conn_read(s, c);
}
