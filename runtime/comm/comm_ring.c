/* Collectives over a ring of TCP connections: one rank per host in a
 * hierarchical job, or every rank with MG_COMM=tcp.
 *
 * Each member sends only to the next member and receives only from the
 * previous one. An operation is a schedule of units (contiguous byte ranges)
 * on each of the two streams; a send unit may depend on a receive unit (the
 * partial sum it forwards), at segment granularity, so a large message flows
 * through the ring as a pipeline of segments: the reduce-scatter of segment j
 * goes on while segment j+1 is still arriving. One thread drives both sockets,
 * non-blocking, with poll() bounded by the operation's deadline.
 *
 * allreduce is the classic ring: reduce-scatter then allgather; a
 * reduce-scatter is the first half and one step that moves each finished
 * chunk to its owner. Chunk c is
 * summed in the fixed order c+1, c+2, ..., c (partial + own), divided by the
 * world size once by its last adder for an average, and then only copied, so
 * all members hold identical bits. Every operation starts with a header on each
 * stream that the receiver checks against its own: a member that called
 * something else is named, not misread. */
#include "comm_internal.h"
#include "mg_err.h"
#include "net.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define RING_MAGIC 0x676e6972676d /* "mgring" */
#define MAX_SEND   (4u << 20)

struct ring_hdr {
    uint64_t magic;
    struct mg_opdesc d;
};

enum unit_mode {
    U_COPY,   /* received bytes land in place */
    U_REDUCE, /* ptr[i] = received[i] + ptr[i] */
    U_HDR,    /* the operation header: checked against ours */
};

struct unit {
    char *ptr;
    size_t len;
    int dep;  /* send units: the receive unit this one forwards, or -1 */
    int mode; /* receive units: enum unit_mode */
    int div;  /* U_REDUCE: divide the sums by this (> 1) */
};

struct mg_ring {
    int n, idx;
    int *ranks;
    int next_fd, prev_fd;
    size_t seg;
    float *tmp; /* one segment of received partial sums */
    struct unit *su, *ru;
    int cap;
    struct ring_hdr hdr_out, hdr_in;
};

int mg_ring_create(struct mg_ring **out, int n, int idx, const int *ranks, int next_fd, int prev_fd,
                   size_t segment_bytes)
{
    if (n < 2 || idx < 0 || idx >= n)
        return -EINVAL;
    struct mg_ring *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    r->n = n;
    r->idx = idx;
    r->seg = segment_bytes ? segment_bytes / 64 * 64 : MG_RING_DEFAULT_SEGMENT;
    if (r->seg < 64)
        r->seg = 64;
    r->cap = 2 * n + 2;
    r->ranks = malloc((size_t)n * sizeof(int));
    r->tmp = malloc(r->seg);
    r->su = calloc((size_t)r->cap, sizeof(struct unit));
    r->ru = calloc((size_t)r->cap, sizeof(struct unit));
    if (!r->ranks || !r->tmp || !r->su || !r->ru) {
        free(r->ranks);
        free(r->tmp);
        free(r->su);
        free(r->ru);
        free(r);
        return -ENOMEM;
    }
    for (int i = 0; i < n; i++)
        r->ranks[i] = ranks ? ranks[i] : i;
    r->next_fd = next_fd;
    r->prev_fd = prev_fd;
    mg_set_nonblock(next_fd, 1);
    mg_set_nonblock(prev_fd, 1);
    int one = 1, buf = 4 << 20;
    setsockopt(next_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(prev_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(next_fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
    setsockopt(prev_fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
    *out = r;
    return 0;
}

void mg_ring_release(struct mg_ring *r)
{
    if (!r)
        return;
    if (r->next_fd >= 0)
        close(r->next_fd);
    if (r->prev_fd >= 0 && r->prev_fd != r->next_fd)
        close(r->prev_fd);
    free(r->ranks);
    free(r->tmp);
    free(r->su);
    free(r->ru);
    free(r);
}

void mg_ring_abort(struct mg_ring *r)
{
    shutdown(r->next_fd, SHUT_RDWR);
    shutdown(r->prev_fd, SHUT_RDWR);
}

static int next_rank(const struct mg_ring *r)
{
    return r->ranks[(r->idx + 1) % r->n];
}

static int prev_rank(const struct mg_ring *r)
{
    return r->ranks[(r->idx + r->n - 1) % r->n];
}

static int fault(struct mg_fault *f, int kind, int peer, int err)
{
    *f = (struct mg_fault){.kind = kind, .peer = peer, .err = err};
    return mg_fault_code(f);
}

/* Applies a finished piece [from, to) of receive unit u. */
static void apply(struct mg_ring *r, const struct unit *u, size_t from, size_t to)
{
    if (u->mode != U_REDUCE || to == from)
        return;
    float *dst = (float *)(u->ptr + from);
    const float *src[2] = {r->tmp, dst};
    mg_reduce_f32(dst, NULL, src, 2, (to - from) / sizeof(float), u->div);
}

/* Runs the schedule: nsu send units, nru receive units. */
static int ring_run(struct mg_ring *r, int nsu, int nru, int64_t deadline_ms, struct mg_fault *f)
{
    struct unit *su = r->su, *ru = r->ru;
    int si = 0, ri = 0;
    size_t soff = 0, roff = 0, rdone = 0; /* rdone: bytes of ru[ri] applied */

    for (;;) {
        int progress = 0, want_out = 0;

        /* Send as far as the data we depend on allows. */
        while (si < nsu) {
            struct unit *u = &su[si];
            size_t limit = u->len;
            if (u->dep >= 0)
                limit = ri > u->dep ? u->len : ri == u->dep ? rdone : 0;
            if (limit > u->len) /* a relay sends on only the head of what it receives */
                limit = u->len;
            if (soff == u->len) {
                si++;
                soff = 0;
                continue;
            }
            if (soff >= limit)
                break;
            size_t want = limit - soff < MAX_SEND ? limit - soff : MAX_SEND;
            ssize_t k = send(r->next_fd, u->ptr + soff, want, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (k > 0) {
                soff += (size_t)k;
                progress = 1;
                continue;
            }
            if (k < 0 && errno == EINTR)
                continue;
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                want_out = 1;
                break;
            }
            return fault(f, errno == EPIPE || errno == ECONNRESET ? MG_FAULT_CLOSED : MG_FAULT_IO,
                         next_rank(r), k < 0 ? -errno : -EIO);
        }

        /* Receive what has arrived, a segment at a time for partial sums. */
        while (ri < nru) {
            struct unit *u = &ru[ri];
            if (roff == u->len) {
                if (u->mode == U_HDR && r->hdr_in.magic != RING_MAGIC)
                    return fault(f, MG_FAULT_IO, prev_rank(r), -MG_EPROTO);
                if (u->mode == U_HDR && !mg_opdesc_equal(&r->hdr_in.d, &r->hdr_out.d)) {
                    *f = (struct mg_fault){
                        .kind = MG_FAULT_MISMATCH, .peer = prev_rank(r), .theirs = r->hdr_in.d};
                    return -MG_EPROTO;
                }
                ri++;
                roff = rdone = 0;
                progress = 1;
                continue;
            }
            size_t seg_start = u->mode == U_REDUCE ? roff / r->seg * r->seg : roff;
            size_t seg_end = u->mode == U_REDUCE ? seg_start + r->seg : u->len;
            if (seg_end > u->len)
                seg_end = u->len;
            char *dst = u->mode == U_REDUCE ? (char *)r->tmp + (roff - seg_start) : u->ptr + roff;
            ssize_t k = recv(r->prev_fd, dst, seg_end - roff, MSG_DONTWAIT);
            if (k > 0) {
                roff += (size_t)k;
                progress = 1;
                if (u->mode == U_REDUCE) {
                    if (roff == seg_end) {
                        apply(r, u, seg_start, seg_end);
                        rdone = roff;
                    }
                } else {
                    rdone = roff;
                }
                continue;
            }
            if (k == 0)
                return fault(f, MG_FAULT_CLOSED, prev_rank(r), -MG_ECLOSED);
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            return fault(f, errno == ECONNRESET ? MG_FAULT_CLOSED : MG_FAULT_IO, prev_rank(r),
                         -errno);
        }

        if (si == nsu && ri == nru)
            return 0;
        if (progress)
            continue;

        struct pollfd p[2];
        int np = 0, in_at = -1;
        if (ri < nru) {
            p[np] = (struct pollfd){.fd = r->prev_fd, .events = POLLIN};
            in_at = np++;
        }
        if (want_out) {
            p[np] = (struct pollfd){.fd = r->next_fd, .events = POLLOUT};
            np++;
        }
        if (np == 0) /* cannot happen: a blocked send depends on a pending receive */
            return fault(f, MG_FAULT_LOCAL, r->ranks[r->idx], -EDEADLK);
        int rc = poll(p, (nfds_t)np, mg_ms_until(deadline_ms));
        if (rc < 0 && errno != EINTR)
            return fault(f, MG_FAULT_LOCAL, r->ranks[r->idx], -errno);
        if (rc == 0) {
            /* Waiting for data names the previous member; only a send that
             * cannot drain (with nothing left to receive) names the next. */
            int peer = in_at >= 0 ? prev_rank(r) : next_rank(r);
            return fault(f, MG_FAULT_TIMEOUT, peer, -ETIMEDOUT);
        }
    }
}

/* Both streams start with the operation's header. */
static void start_schedule(struct mg_ring *r, const struct mg_opdesc *d, int *nsu, int *nru)
{
    r->hdr_out = (struct ring_hdr){.magic = RING_MAGIC, .d = *d};
    memset(&r->hdr_in, 0, sizeof(r->hdr_in));
    r->su[0] = (struct unit){.ptr = (char *)&r->hdr_out, .len = sizeof(r->hdr_out), .dep = -1};
    r->ru[0] = (struct unit){.ptr = (char *)&r->hdr_in, .len = sizeof(r->hdr_in), .mode = U_HDR};
    *nsu = *nru = 1;
}

/* Chunk c of buf: floats [off[c], off[c + 1]), or count floats at c * count
 * where off is NULL. */
static struct unit chunk_unit(float *buf, const size_t *off, size_t count, int c)
{
    size_t at = off ? off[c] : (size_t)c * count, len = off ? off[c + 1] - off[c] : count;
    return (struct unit){(char *)(buf + at), len * sizeof(float)};
}

/* The reduce-scatter both operations start with: send chunk i-s, receive chunk
 * i-s-1 and add ours to it; member i ends holding the sums of chunk i+1. */
static void schedule_reduce_scatter(struct mg_ring *r, float *buf, const size_t *off, size_t count,
                                    int divide_by, int *nsu, int *nru)
{
    int n = r->n, i = r->idx;
    for (int s = 0; s < n - 1; s++) {
        int cs = ((i - s) % n + n) % n, cr = ((i - s - 1) % n + n) % n;
        r->su[*nsu] = chunk_unit(buf, off, count, cs);
        r->su[*nsu].dep = s == 0 ? -1 : *nru - 1;
        (*nsu)++;
        r->ru[*nru] = chunk_unit(buf, off, count, cr);
        r->ru[*nru].mode = U_REDUCE;
        r->ru[*nru].div = s == n - 2 ? divide_by : 1;
        (*nru)++;
    }
}

int mg_ring_allreduce(struct mg_ring *r, float *buf, size_t count, int divide_by,
                      const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f)
{
    int n = r->n, i = r->idx, nsu, nru;
    size_t *off = malloc(((size_t)n + 1) * sizeof(size_t));
    if (!off)
        return fault(f, MG_FAULT_LOCAL, r->ranks[i], -ENOMEM);
    mg_split_chunks(count, n, off);
    start_schedule(r, d, &nsu, &nru);
    schedule_reduce_scatter(r, buf, off, count, divide_by, &nsu, &nru);
    /* Allgather: forward the finished chunks. */
    for (int s = 0; s < n - 1; s++) {
        int cs = ((i + 1 - s) % n + n) % n, cr = ((i - s) % n + n) % n;
        r->su[nsu] = chunk_unit(buf, off, count, cs);
        r->su[nsu].dep = nru - 1;
        nsu++;
        r->ru[nru] = chunk_unit(buf, off, count, cr);
        r->ru[nru].mode = U_COPY;
        nru++;
    }
    int rc = ring_run(r, nsu, nru, deadline_ms, f);
    free(off);
    return rc;
}

/* The allreduce's reduce-scatter, after which member i holds chunk i+1, and
 * one more step that hands each finished chunk to the next member: its owner. */
int mg_ring_reduce_scatter(struct mg_ring *r, float *buf, size_t count, float *out, int divide_by,
                           const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f)
{
    int n = r->n, i = r->idx, nsu, nru;
    start_schedule(r, d, &nsu, &nru);
    schedule_reduce_scatter(r, buf, NULL, count, divide_by, &nsu, &nru);
    r->su[nsu] = chunk_unit(buf, NULL, count, (i + 1) % n);
    r->su[nsu].dep = nru - 1;
    nsu++;
    r->ru[nru] = (struct unit){(char *)out, count * sizeof(float), .mode = U_COPY};
    nru++;
    return ring_run(r, nsu, nru, deadline_ms, f);
}

int mg_ring_broadcast(struct mg_ring *r, void *buf, size_t len, int root_idx,
                      const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f)
{
    int n = r->n, pos = ((r->idx - root_idx) % n + n) % n, nsu, nru;
    start_schedule(r, d, &nsu, &nru);
    /* A chain from the root: root -> root+1 -> ... -> root-1. */
    if (pos > 0) {
        r->ru[nru++] = (struct unit){.ptr = buf, .len = len, .mode = U_COPY};
    } else {
        nru = 0;
    }
    if (pos < n - 1) {
        r->su[nsu++] = (struct unit){.ptr = buf, .len = len, .dep = pos > 0 ? 1 : -1};
    } else {
        nsu = 0;
    }
    return ring_run(r, nsu, nru, deadline_ms, f);
}

int mg_ring_allgatherv(struct mg_ring *r, void *buf, const size_t *lens, const struct mg_opdesc *d,
                       int64_t deadline_ms, struct mg_fault *f)
{
    int n = r->n, i = r->idx, nsu, nru;
    size_t *off = malloc(((size_t)n + 1) * sizeof(size_t));
    if (!off)
        return fault(f, MG_FAULT_LOCAL, r->ranks[i], -ENOMEM);
    off[0] = 0;
    for (int c = 0; c < n; c++)
        off[c + 1] = off[c] + lens[c];
    start_schedule(r, d, &nsu, &nru);
    for (int s = 0; s < n - 1; s++) {
        int cs = ((i - s) % n + n) % n, cr = ((i - s - 1) % n + n) % n;
        r->su[nsu] = (struct unit){(char *)buf + off[cs], lens[cs], .dep = s == 0 ? -1 : nru - 1};
        nsu++;
        r->ru[nru] = (struct unit){(char *)buf + off[cr], lens[cr], .mode = U_COPY};
        nru++;
    }
    int rc = ring_run(r, nsu, nru, deadline_ms, f);
    free(off);
    return rc;
}

int mg_ring_barrier(struct mg_ring *r, const struct mg_opdesc *d, int64_t deadline_ms,
                    struct mg_fault *f)
{
    /* An allgather of one byte each: a member's byte reaches everyone only
     * after every member has entered. */
    char *tok = calloc((size_t)r->n, 1);
    size_t *lens = malloc((size_t)r->n * sizeof(size_t));
    int rc;
    if (!tok || !lens) {
        rc = fault(f, MG_FAULT_LOCAL, r->ranks[r->idx], -ENOMEM);
    } else {
        for (int c = 0; c < r->n; c++)
            lens[c] = 1;
        rc = mg_ring_allgatherv(r, tok, lens, d, deadline_ms, f);
    }
    free(tok);
    free(lens);
    return rc;
}

int mg_ring_relay(struct mg_ring *r, int rounds, char *const *bufs, const size_t *slen,
                  const size_t *rlen, const struct mg_opdesc *d, int64_t deadline_ms,
                  struct mg_fault *f)
{
    int nsu, nru;
    if (rounds < 1 || rounds >= r->n || rounds + 1 > r->cap)
        return fault(f, MG_FAULT_LOCAL, r->ranks[r->idx], -EINVAL);
    start_schedule(r, d, &nsu, &nru);
    for (int t = 0; t < rounds; t++) {
        /* round t > 0 forwards the head of what round t brings, as it comes */
        r->su[nsu++] = (struct unit){bufs[t], slen[t], .dep = t == 0 ? -1 : nru + t - 1};
    }
    for (int t = 1; t <= rounds; t++)
        r->ru[nru++] = (struct unit){bufs[t], rlen[t], .mode = U_COPY};
    return ring_run(r, nsu, nru, deadline_ms, f);
}
