/* The store client (store.h): one connection, blocking calls, each bounded
 * by a deadline. Connecting retries while the server is not up yet or its
 * name does not resolve yet; the handshake authenticates both ends when a
 * token is set. Replies are matched to requests by id, so a reply that comes
 * after its call gave up, or a reply to a keepalive ping, is skipped. */
#include "store.h"
#include "mg_err.h"
#include "net.h"
#include "sha256.h"
#include "store_proto.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define DEF_TIMEOUT_MS         30000
#define DEF_CONNECT_TIMEOUT_MS 30000
#define RBUF_MIN               65536
#define BACKOFF_FIRST_MS       2
/* A refused connect costs the server one RST: retry fast, so agents started
 * before the store meet it within milliseconds. Resolver failures and
 * timeouts retry slower, to spare the DNS server of a large cluster. */
#define BACKOFF_REFUSED_MS 20
#define BACKOFF_MAX_MS     250

struct mg_store {
    int fd;
    int abort_fd; /* readable = give up the call (mg_store_set_abort_fd), or -1 */
    int timeout_ms;
    uint32_t lease_ms;
    uint32_t next_id;
    /* A watch left parked on the server (mg_store_watch_begin): its id, 0
     * when none, and when the client stops waiting for its reply. Any other
     * call drops it (its reply is then skipped by id). */
    uint32_t pend_id;
    int64_t pend_deadline;
    int64_t last_tx_ms;
    int err; /* sticky: the connection is gone (or its framing lost) */
    uint8_t *rbuf;
    size_t rpos, rlen, rcap, consume;
    uint8_t *wbuf;
    size_t wcap;
    char *prefix; /* mg_store_opts.prefix, or NULL */
    size_t plen;
    char kbuf[MG_STORE_MAX_KEY + 1]; /* prefix + the key of the call under way */
};

/* ---- connecting ---------------------------------------------------------------------- */

static int retryable(int rc)
{
    switch (-rc) {
    case ECONNREFUSED:
    case MG_ENONAME: /* name not published yet (Kubernetes) */
    case MG_ERESOLVE:
    case EAGAIN:
    case ETIMEDOUT:
    case MG_ENOANSWER:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case EHOSTDOWN:
    case ENETDOWN:
    case ECONNRESET:
    case ECONNABORTED:
    case EPIPE:
    case MG_ECLOSED: /* closed during the handshake: a server starting or full */
        return 1;
    default:
        return 0;
    }
}

static int handshake(int fd, const struct mg_store_opts *o, int64_t deadline)
{
    const char *token = o->token && *o->token ? o->token : NULL;
    struct mg_sp_hello h = {.version = MG_SP_WIRE_VERSION,
                            .flags = token ? MG_SP_HELLO_AUTH : 0,
                            .lease_ms = (uint32_t)(o->lease_ms > 0 ? o->lease_ms : 0)};
    struct mg_sp_shello sh;
    uint8_t buf[MG_SP_AUTH_REPLY_LEN > MG_SP_HELLO_LEN ? MG_SP_AUTH_REPLY_LEN : MG_SP_HELLO_LEN];
    uint8_t proof[MG_SP_PROOF_LEN], want[MG_SP_PROOF_LEN];
    uint16_t status;
    int rc;

    if (getrandom(h.nonce, sizeof(h.nonce), 0) != (ssize_t)sizeof(h.nonce))
        return -errno;
    mg_sp_hello_encode(buf, &h);
    if ((rc = mg_write_full(fd, buf, MG_SP_HELLO_LEN, deadline)))
        return rc;
    /* Connected but no hello back: a store too busy to answer yet, or a
     * program that is not a store holding the port; said as such, since
     * "cannot connect: Connection timed out" sent users to the network. */
    if ((rc = mg_read_full(fd, buf, MG_SP_SHELLO_LEN, deadline)))
        return rc == -ETIMEDOUT ? -MG_ENOANSWER : rc;
    if (mg_sp_shello_decode(buf, &sh))
        return -MG_EPROTO; /* not an mg store */
    if (sh.version != MG_SP_WIRE_VERSION || sh.status == MG_SP_VERSION)
        return -MG_EVERSION;
    if (sh.status != MG_SP_OK)
        return mg_sp_status_err(sh.status);
    if (!token)
        return (sh.flags & MG_SP_HELLO_AUTH) ? -MG_EAUTH : 0;
    /* We hold a token: a server that cannot prove it holds it too is not ours. */
    if (!(sh.flags & MG_SP_HELLO_AUTH))
        return -MG_EAUTH;
    mg_sp_client_proof(token, h.nonce, sh.nonce, proof);
    if ((rc = mg_write_full(fd, proof, sizeof(proof), deadline)))
        return rc;
    if ((rc = mg_read_full(fd, buf, MG_SP_AUTH_REPLY_LEN, deadline)))
        return rc == -MG_ECLOSED ? -MG_EAUTH : rc;
    mg_sp_auth_reply_decode(buf, &status, proof);
    if (status != MG_SP_OK)
        return -MG_EAUTH;
    mg_sp_server_proof(token, h.nonce, sh.nonce, want);
    return mg_memeq_ct(want, proof, sizeof(want)) ? 0 : -MG_EAUTH;
}

int mg_store_connect(struct mg_store **out, const struct mg_store_opts *o)
{
    struct mg_store *st;
    const char *host = o->host && *o->host ? o->host : "127.0.0.1";
    int rc, backoff = BACKOFF_FIRST_MS;

    *out = NULL;
    if (o->token && strlen(o->token) > MG_STORE_MAX_TOKEN)
        return -MG_ETOOBIG;
    if (o->port <= 0 || o->port > 65535 || o->lease_ms < 0 ||
        (uint32_t)o->lease_ms > MG_SP_MAX_LEASE_MS)
        return -EINVAL;
    st = calloc(1, sizeof(*st));
    if (!st)
        return -ENOMEM;
    st->fd = -1;
    st->abort_fd = -1;
    st->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : DEF_TIMEOUT_MS;
    st->lease_ms = (uint32_t)o->lease_ms;
    st->rcap = RBUF_MIN;
    st->rbuf = malloc(st->rcap);
    if (!st->rbuf) {
        rc = -ENOMEM;
        goto fail;
    }
    if (o->prefix && *o->prefix) {
        st->plen = strlen(o->prefix);
        if (st->plen > MG_STORE_MAX_KEY / 2) {
            rc = -MG_ETOOBIG;
            goto fail;
        }
        if (!(st->prefix = strdup(o->prefix))) {
            rc = -ENOMEM;
            goto fail;
        }
    }
    int64_t start = mg_now_ms(), next_told = start + MG_STORE_PROGRESS_FIRST_MS;
    int64_t deadline =
        start + (o->connect_timeout_ms > 0 ? o->connect_timeout_ms : DEF_CONNECT_TIMEOUT_MS);
    for (;;) {
        int64_t now = mg_now_ms(), until = now + MG_STORE_ATTEMPT_MS;
        if (until > deadline)
            until = deadline > now ? deadline : now + 1;
        int fd = mg_connect_tcp(host, o->port, until);
        if (fd >= 0) {
            rc = handshake(fd, o, mg_now_ms() + st->timeout_ms);
            if (rc == 0) {
                st->fd = fd;
                break;
            }
            close(fd);
        } else {
            rc = fd;
        }
        now = mg_now_ms();
        if (!retryable(rc))
            goto fail;
        /* Told before giving up too: an attempt that blocked past the
         * deadline (a resolver that does not answer) still says so. */
        if (o->progress && now >= next_told) {
            next_told = now + MG_STORE_PROGRESS_EVERY_MS;
            o->progress(o->progress_ctx, rc, (int)(now - start), mg_ms_until(deadline));
        }
        if (now + backoff >= deadline)
            goto fail;
        /* Jittered backoff, so a crowd of agents does not retry in step. */
        uint32_t r = 0;
        if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r))
            r = 0;
        poll(NULL, 0, backoff / 2 + (int)(r % (uint32_t)(backoff / 2 + 1)));
        int cap = rc == -ECONNREFUSED ? BACKOFF_REFUSED_MS : BACKOFF_MAX_MS;
        backoff = backoff * 2 > cap ? cap : backoff * 2;
    }
    if ((rc = mg_set_nonblock(st->fd, 1)))
        goto fail;
    st->last_tx_ms = mg_now_ms();
    *out = st;
    return 0;

fail:
    if (st->fd >= 0)
        close(st->fd);
    free(st->rbuf);
    free(st->prefix);
    free(st);
    return rc;
}

void mg_store_release(struct mg_store *st)
{
    if (!st)
        return;
    if (st->fd >= 0)
        close(st->fd);
    free(st->rbuf);
    free(st->wbuf);
    free(st->prefix);
    free(st);
}

int mg_store_fd(const struct mg_store *st)
{
    return st->fd;
}

void mg_store_set_abort_fd(struct mg_store *st, int fd)
{
    st->abort_fd = fd;
}

/* Waits for events on the connection, at most timeout_ms: 1 when they came,
 * 0 at the timeout, -EINTR when abort_fd became readable first. */
static int wait_conn(struct mg_store *st, short events, int timeout_ms)
{
    struct pollfd p[2] = {{.fd = st->fd, .events = events}, {.fd = st->abort_fd, .events = POLLIN}};
    int n = poll(p, st->abort_fd >= 0 ? 2 : 1, timeout_ms);
    if (n < 0)
        return errno == EINTR ? 0 : -errno;
    if (n > 0 && st->abort_fd >= 0 && (p[1].revents & POLLIN))
        return -EINTR;
    return n > 0;
}

/* ---- one request --------------------------------------------------------------------- */

static int broken(struct mg_store *st, int rc)
{
    if (st->fd >= 0) {
        close(st->fd);
        st->fd = -1;
    }
    st->err = -MG_ECLOSED;
    return rc;
}

static int send_iov(struct mg_store *st, struct iovec *iov, int n, int64_t deadline)
{
    while (n > 0) {
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(st->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return errno == EPIPE || errno == ECONNRESET ? -MG_ECLOSED : -errno;
            int prc = wait_conn(st, POLLOUT, mg_ms_until(deadline));
            if (prc == 0 && mg_now_ms() >= deadline)
                return -ETIMEDOUT;
            if (prc < 0)
                return prc;
            continue;
        }
        st->last_tx_ms = mg_now_ms();
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

static int send_ping(struct mg_store *st, int64_t deadline)
{
    uint8_t buf[MG_SP_HDR_LEN];
    struct mg_sp_req q = {.op = MG_SP_PING, .id = ++st->next_id};
    mg_sp_req_encode(buf, &q, 1);
    struct iovec iov = {buf, sizeof(buf)};
    return send_iov(st, &iov, 1, deadline);
}

/* Drops the reply handed out by the previous call, and a large buffer. */
static void consume(struct mg_store *st)
{
    st->rpos += st->consume;
    st->consume = 0;
    if (st->rpos == st->rlen)
        st->rpos = st->rlen = 0;
    if (st->rcap > RBUF_MIN && st->rlen - st->rpos <= RBUF_MIN / 2) {
        memmove(st->rbuf, st->rbuf + st->rpos, st->rlen - st->rpos);
        st->rlen -= st->rpos;
        st->rpos = 0;
        uint8_t *p = realloc(st->rbuf, RBUF_MIN);
        if (p) {
            st->rbuf = p;
            st->rcap = RBUF_MIN;
        }
    }
}

/* Reads until the reply with this id (or an ERROR frame) is complete. While
 * waiting, keeps the lease alive with pings. */
static int read_reply(struct mg_store *st, uint32_t id, int64_t deadline, struct mg_sp_reply *y)
{
    for (;;) {
        size_t avail = st->rlen - st->rpos, need = MG_SP_HDR_LEN;
        if (avail >= MG_SP_HDR_LEN) {
            struct mg_sp_hdr h;
            mg_sp_hdr_decode(st->rbuf + st->rpos, &h);
            int rc = mg_sp_hdr_check(&h, 1);
            if (rc)
                return broken(st, -MG_EPROTO);
            need = MG_SP_HDR_LEN + h.len;
            if (avail >= need) {
                if (h.id != id && h.op != (MG_SP_ERROR | MG_SP_REPLY)) {
                    st->rpos += need; /* a ping's reply, or one a call gave up on */
                    continue;
                }
                if (mg_sp_reply_decode(&h, st->rbuf + st->rpos + MG_SP_HDR_LEN, y))
                    return broken(st, -MG_EPROTO);
                st->consume = need;
                if (y->op == MG_SP_ERROR) /* the server closes after this */
                    return broken(st, y->status ? mg_sp_status_err(y->status) : -MG_EPROTO);
                return 0;
            }
        }
        if (st->rcap - st->rpos < need) {
            memmove(st->rbuf, st->rbuf + st->rpos, st->rlen - st->rpos);
            st->rlen -= st->rpos;
            st->rpos = 0;
            if (st->rcap < need) {
                uint8_t *p = realloc(st->rbuf, need);
                if (!p)
                    return broken(st, -ENOMEM);
                st->rbuf = p;
                st->rcap = need;
            }
        }
        int64_t wake = deadline;
        if (st->lease_ms) {
            int64_t ping_at = st->last_tx_ms + st->lease_ms / 3;
            if (ping_at <= mg_now_ms()) {
                int rc = send_ping(st, deadline);
                if (rc)
                    return broken(st, rc);
                continue;
            }
            if (ping_at < wake)
                wake = ping_at;
        }
        int prc = wait_conn(st, POLLIN, mg_ms_until(wake));
        if (prc == -EINTR)
            return prc; /* the reply may still come: its id will skip it */
        if (prc < 0)
            return broken(st, prc);
        if (prc == 0) {
            if (mg_now_ms() >= deadline)
                return -ETIMEDOUT; /* the reply may still come: its id will skip it */
            continue;
        }
        ssize_t n = recv(st->fd, st->rbuf + st->rlen, st->rcap - st->rlen, MSG_DONTWAIT);
        if (n == 0)
            return broken(st, -MG_ECLOSED);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
                continue;
            return broken(st, errno == ECONNRESET ? -MG_ECLOSED : -errno);
        }
        st->rlen += (size_t)n;
    }
}

/* Sends q and waits for its reply. wait_ms: how long the server may park the
 * request (it answers by then); the client allows its own timeout on top. */
/* Sends one checked request under the next id (q->id), its value straight
 * from the caller's memory; what a parked watch had left unread is dropped
 * first. The send's result: any error leaves the framing unknown. */
static int send_req(struct mg_store *st, struct mg_sp_req *q)
{
    consume(st);
    st->pend_id = 0;
    if (++st->next_id == 0)
        ++st->next_id;
    q->id = st->next_id;

    size_t head = mg_sp_req_head_size(q), tail = mg_sp_req_size(q) - head;
    if (head > st->wcap) {
        uint8_t *p = realloc(st->wbuf, head);
        if (!p)
            return -ENOMEM;
        st->wbuf = p;
        st->wcap = head;
    }
    mg_sp_req_encode(st->wbuf, q, 0);
    struct iovec iov[2] = {{st->wbuf, head},
                           {(void *)(q->op == MG_SP_SET ? q->val : q->val2), tail}};
    int rc = send_iov(st, iov, tail ? 2 : 1, mg_now_ms() + st->timeout_ms);
    if (st->wcap > RBUF_MIN) { /* a large compare_set: give the memory back */
        free(st->wbuf);
        st->wbuf = NULL;
        st->wcap = 0;
    }
    return rc;
}

static int call(struct mg_store *st, struct mg_sp_req *q, int64_t wait_ms, struct mg_sp_reply *y)
{
    if (st->err)
        return st->err;
    int rc = mg_sp_req_check(q);
    if (rc)
        return rc;
    rc = send_req(st, q);
    if (rc == -ENOMEM)
        return rc; /* nothing was sent */
    if (rc == -MG_ECLOSED) {
        /* The server may have refused the frame from its header (too big)
         * and closed before reading the rest: its ERROR reply, sent first,
         * says why, and beats "the store closed the connection". */
        y->op = 0;
        int why = read_reply(st, q->id, mg_now_ms() + 1000, y);
        if (why < 0 && y->op == MG_SP_ERROR)
            rc = why;
    }
    if (rc)
        return broken(st, rc); /* part of a frame may be out: framing is lost */
    rc = read_reply(st, q->id, mg_now_ms() + wait_ms + st->timeout_ms, y);
    if (rc)
        return rc;
    if (y->op != q->op)
        return broken(st, -MG_EPROTO);
    return mg_sp_status_err(y->status);
}

static int wait_arg(const struct mg_store *st, int timeout_ms)
{
    return timeout_ms < 0 ? st->timeout_ms : timeout_ms;
}

/* The key as sent: with the client's prefix, in st->kbuf. */
static int key_arg(struct mg_store *st, const char *key, struct mg_sp_req *q)
{
    if (!key)
        return -EINVAL;
    q->key = (const uint8_t *)key;
    q->klen = strlen(key);
    if (!st->prefix)
        return 0;
    if (st->plen + q->klen > MG_STORE_MAX_KEY)
        return -MG_ETOOBIG;
    memcpy(st->kbuf, st->prefix, st->plen);
    memcpy(st->kbuf + st->plen, key, q->klen + 1);
    q->key = (const uint8_t *)st->kbuf;
    q->klen += st->plen;
    return 0;
}

static int copy_value(const struct mg_sp_reply *y, void **val, size_t *len)
{
    if (!val)
        return 0;
    char *p = malloc(y->vlen + 1);
    if (!p)
        return -ENOMEM;
    if (y->vlen)
        memcpy(p, y->val, y->vlen);
    p[y->vlen] = '\0';
    *val = p;
    if (len)
        *len = y->vlen;
    return 0;
}

/* ---- the calls ----------------------------------------------------------------------- */

int mg_store_set(struct mg_store *st, const char *key, const void *val, size_t len, int flags)
{
    struct mg_sp_req q = {.op = MG_SP_SET, .val = val, .vlen = len};
    struct mg_sp_reply y;
    if (key_arg(st, key, &q) || (flags & ~MG_STORE_EPHEMERAL) || (len && !val))
        return -EINVAL;
    if (flags & MG_STORE_EPHEMERAL)
        q.flags = MG_SP_F_EPHEMERAL;
    return call(st, &q, 0, &y);
}

int mg_store_get(struct mg_store *st, const char *key, void **val, size_t *len, int timeout_ms)
{
    struct mg_sp_req q = {.op = MG_SP_GET};
    struct mg_sp_reply y;
    if (key_arg(st, key, &q))
        return -EINVAL;
    q.timeout_ms = (uint32_t)wait_arg(st, timeout_ms);
    int rc = call(st, &q, q.timeout_ms, &y);
    return rc ? rc : copy_value(&y, val, len);
}

int mg_store_add(struct mg_store *st, const char *key, int64_t delta, int64_t *result)
{
    struct mg_sp_req q = {.op = MG_SP_ADD, .num = delta};
    struct mg_sp_reply y;
    if (key_arg(st, key, &q))
        return -EINVAL;
    int rc = call(st, &q, 0, &y);
    if (!rc && result)
        *result = y.num;
    return rc;
}

int mg_store_compare_set(struct mg_store *st, const char *key, const void *expected,
                         size_t expected_len, const void *desired, size_t desired_len,
                         void **current, size_t *current_len)
{
    struct mg_sp_req q = {.op = MG_SP_CAS,
                          .val = expected,
                          .vlen = expected ? expected_len : 0,
                          .val2 = desired,
                          .vlen2 = desired_len};
    struct mg_sp_reply y;
    if (key_arg(st, key, &q) || (desired_len && !desired))
        return -EINVAL;
    if (!expected)
        q.flags = MG_SP_F_EXPECT_ABSENT;
    int rc = call(st, &q, 0, &y);
    if (rc)
        return rc;
    if (current) {
        *current = NULL;
        if (current_len)
            *current_len = 0;
        if ((y.flags & MG_SP_F_PRESENT) && (rc = copy_value(&y, current, current_len)))
            return rc;
    }
    return (y.flags & MG_SP_F_SWAPPED) ? 1 : 0;
}

/* Packs keys (with the client's prefix) for WAIT and CHECK into a malloc'd buffer. */
static int pack_keys(struct mg_store *st, const char *const *keys, int nkeys, struct mg_sp_req *q,
                     uint8_t **buf)
{
    size_t total = 0;
    if (nkeys < 1)
        return -EINVAL;
    if (nkeys > MG_STORE_MAX_WAIT_KEYS)
        return -MG_ETOOBIG;
    for (int i = 0; i < nkeys; i++) {
        if (!keys[i])
            return -EINVAL;
        size_t kl = strlen(keys[i]);
        if (st->plen + kl > MG_STORE_MAX_KEY)
            return -MG_ETOOBIG;
        memcpy(st->kbuf, st->prefix ? st->prefix : "", st->plen);
        memcpy(st->kbuf + st->plen, keys[i], kl);
        int rc = mg_sp_key_check((const uint8_t *)st->kbuf, st->plen + kl, 0);
        if (rc)
            return rc;
        total += 2 + st->plen + kl;
    }
    uint8_t *p = malloc(total);
    if (!p)
        return -ENOMEM;
    *buf = p;
    q->keys = p;
    q->keys_len = total;
    q->nkeys = nkeys;
    for (int i = 0; i < nkeys; i++) {
        size_t kl = strlen(keys[i]);
        memcpy(st->kbuf, st->prefix ? st->prefix : "", st->plen);
        memcpy(st->kbuf + st->plen, keys[i], kl);
        p += mg_sp_keys_put(p, (const uint8_t *)st->kbuf, st->plen + kl);
    }
    return 0;
}

int mg_store_wait(struct mg_store *st, const char *const *keys, int nkeys, int timeout_ms)
{
    struct mg_sp_req q = {.op = MG_SP_WAIT};
    struct mg_sp_reply y;
    uint8_t *buf = NULL;
    if (nkeys == 0)
        return 0;
    int rc = pack_keys(st, keys, nkeys, &q, &buf);
    if (rc)
        return rc;
    q.timeout_ms = (uint32_t)wait_arg(st, timeout_ms);
    rc = call(st, &q, q.timeout_ms, &y);
    free(buf);
    return rc;
}

int mg_store_check(struct mg_store *st, const char *const *keys, int nkeys)
{
    struct mg_sp_req q = {.op = MG_SP_CHECK};
    struct mg_sp_reply y;
    uint8_t *buf = NULL;
    if (nkeys == 0)
        return 1;
    int rc = pack_keys(st, keys, nkeys, &q, &buf);
    if (rc)
        return rc;
    rc = call(st, &q, 0, &y);
    free(buf);
    return rc ? rc : (y.flags & MG_SP_F_PRESENT) ? 1 : 0;
}

int mg_store_delete(struct mg_store *st, const char *key)
{
    struct mg_sp_req q = {.op = MG_SP_DELETE};
    struct mg_sp_reply y;
    if (key_arg(st, key, &q))
        return -EINVAL;
    int rc = call(st, &q, 0, &y);
    return rc ? rc : (y.flags & MG_SP_F_PRESENT) ? 1 : 0;
}

/* A watch's answer (mg_store_watch, mg_store_watch_end): the revision, and
 * the value when the key is there. */
static int watch_result(const struct mg_sp_reply *y, int64_t *rev, void **val, size_t *len)
{
    if (rev)
        *rev = y->rev;
    if (val) {
        *val = NULL;
        if (len)
            *len = 0;
        if (y->flags & MG_SP_F_PRESENT)
            return copy_value(y, val, len);
    }
    return 0;
}

int mg_store_watch(struct mg_store *st, const char *key, int64_t since_rev, int timeout_ms,
                   int64_t *rev, void **val, size_t *len)
{
    struct mg_sp_req q = {.op = MG_SP_WATCH, .num = since_rev};
    struct mg_sp_reply y;
    if (key_arg(st, key, &q))
        return -EINVAL;
    q.timeout_ms = (uint32_t)wait_arg(st, timeout_ms);
    int rc = call(st, &q, since_rev < 0 ? 0 : q.timeout_ms, &y);
    if (rc)
        return rc;
    return watch_result(&y, rev, val, len);
}

int mg_store_list(struct mg_store *st, const char *prefix, int max, char ***keys, int *nkeys)
{
    struct mg_sp_req q = {.op = MG_SP_LIST};
    struct mg_sp_reply y;
    *keys = NULL;
    *nkeys = 0;
    if (key_arg(st, prefix ? prefix : "", &q))
        return -EINVAL;
    q.max = max < 0 || max > MG_STORE_MAX_LIST ? MG_STORE_MAX_LIST : (uint32_t)max;
    int rc = call(st, &q, 0, &y);
    if (rc)
        return rc;
    char **out = calloc(y.nkeys ? y.nkeys : 1, sizeof(*out));
    if (!out)
        return -ENOMEM;
    const uint8_t *p = y.keys, *end = y.keys + y.keys_len, *k;
    size_t kl;
    int n = 0;
    while (n < (int)y.nkeys && mg_sp_keys_next(&p, end, &k, &kl) > 0) {
        if (st->prefix && kl >= st->plen) { /* the namespace is the client's business */
            k += st->plen;
            kl -= st->plen;
        }
        out[n] = strndup((const char *)k, kl);
        if (!out[n]) {
            mg_store_free_list(out, n);
            return -ENOMEM;
        }
        n++;
    }
    *keys = out;
    *nkeys = n;
    return y.total > INT32_MAX ? INT32_MAX : (int)y.total;
}

void mg_store_free_list(char **keys, int nkeys)
{
    if (!keys)
        return;
    for (int i = 0; i < nkeys; i++)
        free(keys[i]);
    free(keys);
}

int mg_store_ping(struct mg_store *st)
{
    struct mg_sp_req q = {.op = MG_SP_PING};
    struct mg_sp_reply y;
    return call(st, &q, 0, &y);
}

/* ---- pipelined calls ------------------------------------------------------------------ */

/* Requests sent back to back before their replies are read: at most this
 * many at once, so that the replies queued on the server stay small. */
#define PIPE_MAX 64

/* Sends the n (<= PIPE_MAX) requests that enc (called with each index and a
 * request to fill) describes, back to back, and hands each reply in turn to
 * fn, which copies what it keeps (the reply lies in the read buffer). */
static int call_many(struct mg_store *st, int n, int (*enc)(void *ctx, int i, struct mg_sp_req *q),
                     int (*fn)(void *ctx, int i, int rc, const struct mg_sp_reply *y), void *ctx)
{
    uint32_t ids[PIPE_MAX];
    uint8_t ops[PIPE_MAX];
    size_t off = 0;
    int rc;

    if (st->err)
        return st->err;
    consume(st);
    st->pend_id = 0;
    for (int i = 0; i < n; i++) {
        struct mg_sp_req q;
        memset(&q, 0, sizeof(q));
        if ((rc = enc(ctx, i, &q)) != 0 || (rc = mg_sp_req_check(&q)) != 0)
            return rc;
        if (++st->next_id == 0)
            ++st->next_id;
        q.id = ids[i] = st->next_id;
        ops[i] = q.op;
        size_t sz = mg_sp_req_size(&q);
        if (off + sz > st->wcap) {
            size_t cap = (off + sz) * 2;
            uint8_t *p = realloc(st->wbuf, cap);
            if (!p)
                return -ENOMEM;
            st->wbuf = p;
            st->wcap = cap;
        }
        off += mg_sp_req_encode(st->wbuf + off, &q, 1);
    }
    struct iovec iov = {st->wbuf, off};
    rc = send_iov(st, &iov, 1, mg_now_ms() + st->timeout_ms);
    if (st->wcap > RBUF_MIN) {
        free(st->wbuf);
        st->wbuf = NULL;
        st->wcap = 0;
    }
    if (rc)
        return broken(st, rc); /* part of a frame may be out: framing is lost */
    for (int i = 0; i < n; i++) {
        struct mg_sp_reply y;
        consume(st);
        rc = read_reply(st, ids[i], mg_now_ms() + st->timeout_ms, &y);
        if (rc)
            return rc;
        if (y.op != ops[i])
            return broken(st, -MG_EPROTO);
        rc = fn(ctx, i, mg_sp_status_err(y.status), &y);
        if (rc)
            return rc; /* the replies still to come are skipped by id */
    }
    return 0;
}

struct many {
    struct mg_store *st;
    const char *const *keys;
    const void *const *vals;
    const size_t *lens;
    int flags;
    void **out;
    size_t *outlen;
    int64_t *revs;
};

static int enc_get(void *ctx, int i, struct mg_sp_req *q)
{
    struct many *m = ctx;
    q->op = MG_SP_GET;
    return key_arg(m->st, m->keys[i], q) ? -EINVAL : 0;
}

static int got(void *ctx, int i, int rc, const struct mg_sp_reply *y)
{
    struct many *m = ctx;
    if (rc == -MG_ENOKEY)
        return 0; /* absent: out[i] stays NULL */
    if (rc)
        return rc;
    if (m->revs)
        m->revs[i] = y->rev;
    return copy_value(y, &m->out[i], m->outlen ? &m->outlen[i] : NULL);
}

int mg_store_get_many(struct mg_store *st, const char *const *keys, int n, void **vals,
                      size_t *lens, int64_t *revs)
{
    int rc = 0;
    for (int i = 0; i < n; i++)
        vals[i] = NULL;
    for (int done = 0; done < n && !rc; done += PIPE_MAX) {
        int k = n - done < PIPE_MAX ? n - done : PIPE_MAX;
        struct many m = {.st = st,
                         .keys = keys + done,
                         .out = vals + done,
                         .outlen = lens ? lens + done : NULL,
                         .revs = revs ? revs + done : NULL};
        rc = call_many(st, k, enc_get, got, &m);
    }
    if (rc) {
        for (int i = 0; i < n; i++) {
            free(vals[i]);
            vals[i] = NULL;
        }
    }
    return rc;
}

static int enc_set(void *ctx, int i, struct mg_sp_req *q)
{
    struct many *m = ctx;
    q->op = MG_SP_SET;
    q->val = m->vals[i];
    q->vlen = m->lens[i];
    if (m->flags & MG_STORE_EPHEMERAL)
        q->flags = MG_SP_F_EPHEMERAL;
    return key_arg(m->st, m->keys[i], q) || (q->vlen && !q->val) ? -EINVAL : 0;
}

static int was_set(void *ctx, int i, int rc, const struct mg_sp_reply *y)
{
    (void)ctx;
    (void)i;
    (void)y;
    return rc;
}

int mg_store_set_many(struct mg_store *st, const char *const *keys, const void *const *vals,
                      const size_t *lens, int n, int flags)
{
    int rc = 0;
    if (flags & ~MG_STORE_EPHEMERAL)
        return -EINVAL;
    for (int done = 0; done < n && !rc; done += PIPE_MAX) {
        int k = n - done < PIPE_MAX ? n - done : PIPE_MAX;
        struct many m = {.st = st,
                         .keys = keys + done,
                         .vals = vals + done,
                         .lens = lens + done,
                         .flags = flags};
        rc = call_many(st, k, enc_set, was_set, &m);
    }
    return rc;
}

static int enc_del(void *ctx, int i, struct mg_sp_req *q)
{
    struct many *m = ctx;
    q->op = MG_SP_DELETE;
    return key_arg(m->st, m->keys[i], q) ? -EINVAL : 0;
}

int mg_store_delete_many(struct mg_store *st, const char *const *keys, int n)
{
    int rc = 0;
    for (int done = 0; done < n && !rc; done += PIPE_MAX) {
        int k = n - done < PIPE_MAX ? n - done : PIPE_MAX;
        struct many m = {.st = st, .keys = keys + done};
        rc = call_many(st, k, enc_del, was_set, &m);
    }
    return rc;
}

/* ---- a watch parked across calls ------------------------------------------------------ */

int mg_store_watch_begin(struct mg_store *st, const char *key, int64_t since_rev, int timeout_ms)
{
    struct mg_sp_req q = {.op = MG_SP_WATCH, .num = since_rev};
    if (st->err)
        return st->err;
    if (key_arg(st, key, &q))
        return -EINVAL;
    q.timeout_ms = (uint32_t)wait_arg(st, timeout_ms);
    int rc = mg_sp_req_check(&q);
    if (rc)
        return rc;
    rc = send_req(st, &q);
    if (rc)
        return rc == -ENOMEM ? rc : broken(st, rc);
    st->pend_id = q.id;
    st->pend_deadline = mg_now_ms() + (since_rev < 0 ? 0 : q.timeout_ms) + st->timeout_ms;
    return 0;
}

int mg_store_watch_end(struct mg_store *st, int wait_ms, int64_t *rev, void **val, size_t *len)
{
    struct mg_sp_reply y;
    if (st->err)
        return st->err;
    if (!st->pend_id)
        return -ENOENT;
    consume(st);
    int64_t deadline = mg_now_ms() + (wait_ms > 0 ? wait_ms : 0);
    int late = deadline >= st->pend_deadline;
    if (late)
        deadline = st->pend_deadline;
    int rc = read_reply(st, st->pend_id, deadline, &y);
    if (rc == -ETIMEDOUT && !late)
        return -EAGAIN; /* still parked: call again */
    if (rc == -EINTR)
        return rc; /* still parked; the caller acts on its signal */
    st->pend_id = 0;
    if (rc)
        return rc;
    if (y.op != MG_SP_WATCH)
        return broken(st, -MG_EPROTO);
    rc = mg_sp_status_err(y.status);
    if (rc)
        return rc;
    return watch_result(&y, rev, val, len);
}
