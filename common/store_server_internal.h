/* The store server's insides, shared by its five parts; not a public API
 * (store.h is). store_table.c holds the keys (hashing, the ordered index
 * LIST reads, memory accounting, tombstones), store_requests.c what a
 * request means (operations, replies, parked requests), store_conn.c the
 * connections (accept, handshake, frames, replies, fair turns),
 * store_server.c the loop, the timers and the public API, store_local.c the
 * hosting process's direct calls; each says at its
 * top which invariants it keeps. The bounds below are all in one place so
 * that a review of what a client can make the server hold starts here.
 * mg_ss_: store server, as mg_sp_ is the store protocol. */
#ifndef MG_STORE_SERVER_INTERNAL_H
#define MG_STORE_SERVER_INTERNAL_H

#include "store.h"
#include "store_proto.h"
#include "timer_heap.h"

#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#define DEF_MAX_CLIENTS  4096
#define DEF_MAX_STORE    (1ull << 30)
#define DEF_MAX_BUFFER   (1ull << 30)
#define DEF_MAX_WAITERS  65536
#define DEF_HANDSHAKE_MS 10000
#define DEF_FRAME_MS     60000
#define MAX_HANDSHAKING  256        /* connections still in the handshake (oldest evicted) */
#define MAX_CONN_WAITERS 64         /* parked requests per connection */
#define MAX_TOMBSTONES   16384      /* deleted keys whose revision is remembered */
#define IBUF_MIN         4096       /* input buffer kept between frames */
#define OUT_HIGH         (1u << 20) /* queued reply bytes above which input is not read (default) */
#define READ_BUDGET      (4u << 20) /* bytes read from one connection per loop turn (default) */
#define ACCEPT_BURST     64         /* connections accepted per loop turn */
#define REQS_PER_TURN    16         /* requests served per connection per loop turn */
#define FLUSH_PER_TURN   256        /* connections sent woken replies per loop turn */
#define CLOSE_LINGER_MS  1000       /* to flush a final error before closing */
#define ENTRY_OVERHEAD   64         /* charged per key besides its bytes */

struct blob {
    size_t refs;
    size_t len;
    uint8_t data[];
};

/* The keys of the last LIST reply (store_requests.c), shared by the replies
 * to the same list at the same revision. */
struct mg_ss_list_cache {
    struct blob *keys; /* one reference held here */
    uint8_t *prefix;
    size_t plen;
    int64_t rev;
    uint32_t max, total, take;
};

struct entry;
struct waiter;
struct conn;

/* One key of a parked request, linked into that key's entry. */
struct wkey {
    struct entry *e;
    struct waiter *w;
    LIST_ENTRY(wkey) link; /* the entry's parked keys */
};

struct waiter {
    struct conn *conn;
    uint32_t id;
    uint8_t op;
    int ready;
    int64_t since;              /* WATCH */
    struct mg_theap_node timer; /* its timeout, in the server's wtimers */
    size_t charge;
    LIST_ENTRY(waiter) clink; /* the connection's parked requests */
    struct waiter *rnext;     /* satisfied, to answer */
    int nkeys;
    struct wkey keys[];
};

/* A key. val NULL means absent: a tombstone (tomb set, rev = deletion) or a
 * placeholder that only anchors parked requests. */
struct entry {
    struct entry *hnext;
    uint64_t hash;
    struct blob *val;
    int64_t rev;
    struct conn *owner;      /* of an ephemeral key */
    struct entry *tl, *tr;   /* the ordered index of live keys (a treap on hash) */
    LIST_ENTRY(entry) olink; /* the owner's ephemeral keys */
    int tomb;
    TAILQ_ENTRY(entry) tlink; /* tombstones, oldest first */
    LIST_HEAD(, wkey) waiters;
    size_t klen;
    uint8_t key[];
};

/* One queued reply (or handshake message): head bytes, then an optional value. */
struct oseg {
    struct oseg *next;
    struct blob *blob;
    size_t hlen, off;
    uint8_t data[];
};

enum conn_state {
    ST_HELLO,
    ST_AUTH,
    ST_READY
};
enum conn_close {
    CL_OPEN,
    CL_AFTER_FLUSH,
    CL_DEAD
};

struct conn {
    struct mg_store_server *srv;
    int fd;
    enum conn_state state;
    enum conn_close closing;
    int dirty;
    uint8_t cnonce[MG_SP_NONCE_LEN], snonce[MG_SP_NONCE_LEN];
    uint32_t lease_ms;
    int64_t last_rx_ms;
    int64_t deadline_ms; /* handshake, or lingering close */
    int64_t frame_start_ms;
    /* The earliest of its deadlines (handshake or closing, lease, frame), in
     * the server's ctimers, or an earlier time: a deadline that moves later
     * (a lease renewed by every byte) leaves it there, and when it falls due
     * the connection is looked at and put back at its true one. */
    struct mg_theap_node timer;
    uint8_t *ibuf;
    size_t ipos, ilen, icap;
    struct oseg *ohead, *otail;
    size_t obytes;
    LIST_HEAD(, entry) eph;
    LIST_HEAD(, waiter) waiters;
    int nwaiters;
    LIST_ENTRY(conn) link;    /* all live connections */
    TAILQ_ENTRY(conn) hslink; /* still handshaking, oldest first */
    int in_hs;
    uint32_t evmask;         /* the events the epoll set watches for it */
    TAILQ_ENTRY(conn) dlink; /* dirty: replies a change woke, to send */
    TAILQ_ENTRY(conn) blink; /* backlog: requests left for the next turn */
    int in_backlog;
    struct conn *knext; /* dead list: to tear down */
};

struct mg_store_server {
    pthread_mutex_t lock;
    int lfd, own_lfd, wakefd, port;
    /* One epoll set holds the wake fd, the listening socket (while it may
     * accept) and every connection, so that a turn of the loop costs what
     * is ready, not what is connected: pollfds hands the caller this one
     * descriptor. */
    int epfd, lfd_watched;
    char *token;
    int max_clients, max_waiters, handshake_ms, frame_ms;
    int (*foreign)(void *ctx, int fd, const void *bytes, size_t n);
    void *foreign_ctx;
    size_t max_store, max_buffer, read_budget;
    size_t max_value, max_frame; /* one value; one request's body */
    size_t out_high;             /* queued reply bytes above which input is not read */
    uint64_t sipkey[2];

    struct entry **table;
    struct entry *tree; /* the live keys in order, for LIST */
    struct mg_ss_list_cache list_cache;
    size_t nbuckets, nentries, nlive;
    int64_t rev, compact_rev;
    TAILQ_HEAD(, entry) tombs;
    size_t ntombs;

    /* The parked requests' timeouts, and the connections' own timers: a
     * turn costs the timers that fall due, never a walk of every connection
     * (which took an eighth of the server's CPU at 10,000 nodes). */
    struct mg_theap wtimers, ctimers;
    int nwaiters;

    LIST_HEAD(, conn) conns;
    TAILQ_HEAD(, conn) hs;
    int nconns, nhs;
    struct conn **byfd;
    int byfd_cap;
    TAILQ_HEAD(, conn) dirty, backlog;
    struct conn *dead;

    size_t stored, buffered;
    uint64_t dropped, leases_expired, requests, turns;
    /* What the turn under way did (counted where it happens; local calls
     * between turns count into the next), the last whole one, the longest. */
    struct mg_store_server_turn turn, turn_last, turn_max;
    int64_t accept_pause_until;

    struct conn *local; /* owns the hosting process's ephemeral keys (never polled) */

    pthread_t thread;
    int has_thread, stop;
    struct pollfd *tfds;
    int tfds_cap;
};

/* ---- store_table.c ------------------------------------------------------------------ */

int mg_ss_charge(struct mg_store_server *s, size_t n);
void mg_ss_uncharge(struct mg_store_server *s, size_t n);
struct blob *mg_ss_blob_new(struct mg_store_server *s, const void *data, size_t len,
                            const struct blob *old);
void mg_ss_blob_unref(struct mg_store_server *s, struct blob *b);
/* The key's entry, or NULL. */
struct entry *mg_ss_lookup(struct mg_store_server *s, const uint8_t *key, size_t klen);
/* The key's entry, made absent when new; NULL when out of memory. */
struct entry *mg_ss_entry_get(struct mg_store_server *s, const uint8_t *key, size_t klen);
void mg_ss_entry_maybe_free(struct mg_store_server *s, struct entry *e);
int64_t mg_ss_entry_rev(const struct mg_store_server *s, const struct entry *e);
/* The live keys starting with prefix, in byte order (*out malloc'd, NULL
 * when none); 0 or -ENOMEM. */
int mg_ss_index_prefix(struct mg_store_server *s, const uint8_t *prefix, size_t plen,
                       struct entry ***out, size_t *n);
void mg_ss_owner_unlink(struct entry *e);
void mg_ss_entry_store(struct mg_store_server *s, struct entry *e, struct blob *b,
                       struct conn *owner, int keep_owner);
void mg_ss_entry_delete(struct mg_store_server *s, struct entry *e);

/* ---- store_requests.c --------------------------------------------------------------- */

void mg_ss_mark_dirty(struct conn *c);
void mg_ss_queue_raw(struct conn *c, const void *head, size_t hlen, struct blob *tail);
void mg_ss_reply_status(struct conn *c, uint8_t op, uint32_t id, uint16_t status);
void mg_ss_waiter_free(struct mg_store_server *s, struct waiter *w);
void mg_ss_answer(struct mg_store_server *s, struct conn *c, uint8_t op, uint32_t id,
                  struct entry *e, uint16_t status);
/* Answers the requests parked on e that its change satisfied. */
void mg_ss_wake(struct mg_store_server *s, struct entry *e);
uint16_t mg_ss_op_list(struct mg_store_server *s, const uint8_t *prefix, size_t plen,
                       struct entry ***out, size_t *total);
uint16_t mg_ss_op_set(struct mg_store_server *s, const uint8_t *key, size_t klen, const void *val,
                      size_t vlen, struct conn *owner, struct entry **ep);
uint16_t mg_ss_op_add(struct mg_store_server *s, const uint8_t *key, size_t klen, int64_t delta,
                      int64_t *sum, struct entry **ep);
uint16_t mg_ss_op_cas(struct mg_store_server *s, const uint8_t *key, size_t klen, int absent,
                      const void *expected, size_t elen, const void *desired, size_t dlen,
                      struct entry **ep, int *swapped);
int mg_ss_op_delete(struct mg_store_server *s, const uint8_t *key, size_t klen);
/* One request (header h, body) from a ready connection. */
void mg_ss_handle_request(struct mg_store_server *s, struct conn *c, const struct mg_sp_hdr *h,
                          const uint8_t *body);

/* ---- store_conn.c ------------------------------------------------------------------- */

void mg_ss_conn_kill(struct conn *c);
/* A protocol or policy failure: counted, then dropped. */
void mg_ss_conn_drop(struct conn *c);
void mg_ss_conn_teardown(struct conn *c);
void mg_ss_conn_read(struct mg_store_server *s, struct conn *c);
void mg_ss_conn_flush(struct conn *c);
int mg_ss_backpressured(const struct conn *c);
/* After a deadline of c was set, moved earlier or came to apply: c's timer
 * is put at the earliest. Cheap when nothing moved earlier. */
void mg_ss_conn_arm(struct conn *c);
/* c's timer fell due at now: drops it when one of its deadlines passed,
 * else puts the timer back at the next one. */
void mg_ss_conn_timer(struct mg_store_server *s, struct conn *c, int64_t now);
int mg_ss_can_accept(const struct mg_store_server *s);
void mg_ss_accept_some(struct mg_store_server *s);
void mg_ss_settle(struct mg_store_server *s);
void mg_ss_serve_backlog(struct mg_store_server *s);

/* ---- store_server.c ----------------------------------------------------------------- */

void mg_ss_lock(const struct mg_store_server *s);
void mg_ss_unlock(const struct mg_store_server *s);
void mg_ss_wake_loop(struct mg_store_server *s);

#endif
