/* The mg store: a small key-value server and its client, over one documented
 * binary protocol (docs/store-protocol.md). The launcher's rendezvous and the
 * runtime's bootstrap (rank 0 hosts it at MASTER_ADDR:MASTER_PORT) both use it.
 *
 * Keys are C strings of 1 to MG_STORE_MAX_KEY bytes, values opaque bytes up
 * to MG_STORE_MAX_VALUE.
 * Every key carries the store-wide revision at which it was last modified, so
 * a client can watch a key for changes. An ephemeral key belongs to the
 * connection that set it and disappears when that connection closes or stays
 * silent past its lease (this is how agents detect a dead node).
 *
 * All functions return 0 (or a count) on success and a negative code
 * (-errno or -MG_E*) on failure. Timeouts are in milliseconds. */
#ifndef MG_STORE_H
#define MG_STORE_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#define MG_STORE_MAX_KEY       1024
#define MG_STORE_MAX_VALUE     (16u << 20)
#define MG_STORE_MAX_TOKEN     256
#define MG_STORE_MAX_WAIT_KEYS 256
#define MG_STORE_MAX_LIST      16384 /* keys in one mg_store_list reply */

/* ---- server ------------------------------------------------------------------ */

struct mg_store_server;

struct mg_store_server_opts {
    const char *host;  /* bind address; NULL or "" = all interfaces */
    int port;          /* 0 = kernel-chosen */
    int listen_fd;     /* > 0: use this already-listening socket instead of binding
                          (0 or -1: bind host:port); the caller keeps ownership and
                          closes it after mg_store_server_release */
    const char *token; /* NULL or "" = no authentication */
    int max_clients;   /* 0 = default (4096) */
    /* Bounds (0 = the default in parentheses). See docs/store-protocol.md. */
    size_t max_store_bytes;   /* keys, values, parked requests (1 GiB) */
    size_t max_buffer_bytes;  /* partly received requests, all connections (1 GiB) */
    size_t max_value_bytes;   /* one value (MG_STORE_MAX_VALUE); a frame that could only
                                 carry more is refused before its body is read */
    int max_waiters;          /* parked blocking requests, all connections (65536) */
    int handshake_timeout_ms; /* to finish the handshake after connecting (10000) */
    int frame_timeout_ms;     /* to finish sending a frame once begun (60000) */
    /* Bytes read from one connection per turn (4 MiB), which bounds the work
     * one client's pipelined requests make per mg_store_server_process: a
     * caller whose loop must stay responsive (the launcher) passes less. */
    size_t read_bytes_per_turn;
    /* Another protocol on the same port (NULL: none). A connection whose
     * first bytes cannot begin the mg store's handshake (docs/store-protocol.md)
     * is handed over instead of closed: foreign() gets the socket (it is the
     * callee's from then on, also when it returns an error) and the bytes
     * already read. The launcher serves torch's TCPStore clients this way on
     * the port its agent store holds. Called from mg_store_server_process. */
    int (*foreign)(void *ctx, int fd, const void *bytes, size_t n);
    void *foreign_ctx;
};
int mg_store_server_start(struct mg_store_server **out, const struct mg_store_server_opts *opts);
int mg_store_server_port(const struct mg_store_server *srv);

/* Where a store should listen when its clients reach it at host (the
 * endpoint or MASTER_ADDR): that address itself when it is one of this
 * machine's (so a loopback endpoint stays on loopback), "localhost" as
 * 127.0.0.1, else every interface (a service or NAT address, or a name,
 * which other machines may resolve to another of this machine's addresses
 * than it does: Debian maps the host name to 127.0.1.1). With single_host
 * (every client runs on this machine) a name is bound as it resolves here.
 * Writes the bind address into out ("" = every interface) and returns
 * MG_STORE_BIND_LOOPBACK, _ADDRESS or _ALL: only a loopback store is out of
 * reach of other machines. */
enum mg_store_bind {
    MG_STORE_BIND_LOOPBACK,
    MG_STORE_BIND_ADDRESS,
    MG_STORE_BIND_ALL,
};
enum mg_store_bind mg_store_bind_addr(const char *host, int single_host, char *out, size_t cap);

/* Poll-loop integration (the launcher): add the server's descriptors to a
 * pollfd array, and after poll() let it handle the ones that are ready.
 * The server runs only inside mg_store_server_process: a thread that drives
 * it this way must not make blocking client calls (mg_store_*) to it, or both
 * wait for each other until the call times out. That thread uses the local
 * calls below instead (the launcher hosting the rendezvous does); a process
 * that needs a socket client of its own store uses mg_store_server_start_thread.
 * mg_store_server_pollfds returns how many it filled in (at most max; -ENOSPC
 * when more are needed). mg_store_server_timeout_ms says how long poll may
 * sleep before the server has work (blocked waits, lease expiry); -1 = none. */
int mg_store_server_pollfds(struct mg_store_server *srv, struct pollfd *fds, int max);
/* How many pollfds the server may fill in (1: its epoll set holds the rest). */
int mg_store_server_nfds(const struct mg_store_server *srv);
/* Call after every poll(), also when it timed out: fds/n are the slice that
 * mg_store_server_pollfds filled. Returns 0, or a negative code only for a
 * failure of the server itself (a client's failure just drops that client). */
int mg_store_server_process(struct mg_store_server *srv, const struct pollfd *fds, int n);
int mg_store_server_timeout_ms(const struct mg_store_server *srv);

/* Or serve from a background thread (the runtime's rank 0). */
int mg_store_server_start_thread(struct mg_store_server *srv);

/* The client operations as local calls of the hosting process: the same
 * rules, bounds and return values as mg_store_set / _get / _add /
 * _compare_set / _delete / _list (one implementation serves both), answered
 * at once, never parked, no socket, under the lock the serving thread takes.
 * A change wakes the remote clients waiting on the key, as theirs would.
 * MG_STORE_EPHEMERAL makes the hosting process the key's owner: it goes with
 * mg_store_server_local_drop (or the server). local_get also reports a
 * missing key's revision (that of its deletion, as a watch would) in *rev;
 * values read are malloc'd and NUL-terminated. */
int mg_store_server_local_set(struct mg_store_server *srv, const char *key, const void *val,
                              size_t len, int flags);
int mg_store_server_local_get(struct mg_store_server *srv, const char *key, void **val, size_t *len,
                              int64_t *rev);
int mg_store_server_local_add(struct mg_store_server *srv, const char *key, int64_t delta,
                              int64_t *result);
int mg_store_server_local_compare_set(struct mg_store_server *srv, const char *key,
                                      const void *expected, size_t expected_len,
                                      const void *desired, size_t desired_len, void **current,
                                      size_t *current_len);
int mg_store_server_local_delete(struct mg_store_server *srv, const char *key);
int mg_store_server_local_list(struct mg_store_server *srv, const char *prefix, int max,
                               char ***keys, int *nkeys);
/* Whether fd, a connection this process just opened to some address (an
 * endpoint name, a service or NAT address), arrived at this server: accepts
 * the pending connections, waiting at most timeout_ms for it, and compares
 * the peer addresses with fd's own. 1 or 0 (or a negative code). For a
 * process that must know whether the endpoint it was given leads to itself
 * before it serves. */
int mg_store_server_is_own_peer(struct mg_store_server *srv, int fd, int timeout_ms);
/* Deletes the hosting process's ephemeral keys (waking their watchers). */
void mg_store_server_local_drop(struct mg_store_server *srv);
/* The store-wide revision: every change (by a client, a local call, a closed
 * connection or an expired lease) raises it, so a loop that drives the server
 * can tell whether a turn changed anything. */
int64_t mg_store_server_revision(const struct mg_store_server *srv);

struct mg_store_server_stats {
    int clients;         /* connections, handshaking ones included */
    int waiters;         /* parked blocking requests */
    size_t keys;         /* keys that exist */
    size_t stored_bytes; /* charged against max_store_bytes */
    size_t buffer_bytes; /* charged against max_buffer_bytes */
    int64_t revision;    /* store-wide revision */
    uint64_t dropped;    /* connections the server closed (protocol, auth, timeouts, leases) */
    uint64_t leases_expired;
    uint64_t requests; /* requests answered or parked since the start (all opcodes) */
    uint64_t turns;    /* turns of the loop (mg_store_server_process calls, or the thread's) */
    struct mg_store_server_turn {
        int64_t us;        /* wall time of the turn, as the server measures it */
        int events;        /* descriptors the epoll set reported ready */
        int requests;      /* requests served */
        int woken;         /* parked requests a change answered */
        int timed_out;     /* parked requests whose timeout passed */
        int flushed;       /* connections sent the replies others' changes woke */
        int scanned;       /* connections whose own timers were looked at */
        int accepted;      /* new connections */
        int closed;        /* connections torn down */
    } turn_last, turn_max; /* the last turn, and the longest one so far */
};
void mg_store_server_stats(struct mg_store_server *srv, struct mg_store_server_stats *st);

/* Stops the thread (if any), closes every connection, frees everything. */
void mg_store_server_release(struct mg_store_server *srv);

/* ---- client (blocking, one connection, not thread-safe) ------------------- */

struct mg_store;

struct mg_store_opts {
    const char *host; /* NULL or "" = 127.0.0.1 */
    int port;
    const char *token;      /* must match the server's, or NULL / "" */
    int connect_timeout_ms; /* retry connecting (refused, unresolvable) until then;
                               0 = default (30000) */
    int timeout_ms;         /* bound for each request, and for the handshake; on top
                               of a blocking call's own timeout; 0 = default (30000) */
    int lease_ms;           /* > 0: the server drops the connection (and its
                               ephemeral keys) after this long without a message.
                               During a blocking call the client pings by itself;
                               between calls, call mg_store_ping in time */
    const char *prefix;     /* NULL or "": none; else put in front of every key this
                               client names (and taken off the keys mg_store_list
                               returns): its own namespace in a store it shares, as
                               the workers in the launcher's agent store */
    /* Optional: while mg_store_connect retries, told why it still waits (rc,
     * the last attempt's error: -MG_ENONAME, -ECONNREFUSED, -ETIMEDOUT...),
     * how long it has waited and how long it will go on, first after
     * MG_STORE_PROGRESS_FIRST_MS and then every MG_STORE_PROGRESS_EVERY_MS.
     * Each attempt takes at most MG_STORE_ATTEMPT_MS, so that an unreachable
     * host is told about too. */
    void (*progress)(void *ctx, int rc, int waited_ms, int left_ms);
    void *progress_ctx;
};

#define MG_STORE_PROGRESS_FIRST_MS 3000
#define MG_STORE_PROGRESS_EVERY_MS 30000
#define MG_STORE_ATTEMPT_MS        3000

/* Errors: -MG_EAUTH (token refused, missing on one side, or the server could
 * not prove it holds the token), -MG_EVERSION, -MG_EPROTO (not an mg store),
 * -EINVAL, or, once connect_timeout_ms has passed, the last connect error
 * (-ECONNREFUSED, -MG_ENONAME for a name that never resolved, -ETIMEDOUT...). */
int mg_store_connect(struct mg_store **out, const struct mg_store_opts *opts);
void mg_store_release(struct mg_store *st);
/* The connected socket, for callers that poll it: readable means the server
 * closed it, or a late reply arrived; the next call tells which. */
int mg_store_fd(const struct mg_store *st);

/* Makes every blocking call give up with -EINTR as soon as fd is readable
 * (-1: never, the default). The launcher passes a signalfd of its
 * terminating signals, so that a server that stopped answering does not
 * hold up its exit. A call given up while waiting for its reply leaves the
 * connection usable (the reply is skipped when it comes); one given up
 * while its request was still being sent loses it (-MG_ECLOSED from then on). */
void mg_store_set_abort_fd(struct mg_store *st, int fd);

enum mg_store_set_flags {
    MG_STORE_EPHEMERAL = 1 << 0, /* deleted when this connection goes away */
};

/* Every call returns 0 (or the count it documents) or a negative code:
 * -ETIMEDOUT, -MG_ECLOSED (the connection is gone: every later call returns
 * it too), -MG_ETOOBIG (a key, value or count over its bound; checked before
 * sending), -EINVAL (empty key...), -ENOSPC (the server's memory bound),
 * -EBUSY (too many blocked requests on the server), -MG_EPROTO.
 * A timeout_ms argument: > 0 waits that long, 0 does not wait, < 0 uses the
 * connection's timeout_ms. Values read are malloc'd and NUL-terminated. */

/* An ephemeral set makes this connection the key's owner; a plain set, by
 * anyone, makes the key persistent again. */
int mg_store_set(struct mg_store *st, const char *key, const void *val, size_t len, int flags);
/* Waits up to timeout_ms for the key to exist: -MG_ENOKEY (timeout_ms 0) or
 * -ETIMEDOUT when it does not. */
int mg_store_get(struct mg_store *st, const char *key, void **val, size_t *len, int timeout_ms);
/* Atomically adds delta to the decimal integer stored at key (missing = 0);
 * -ERANGE when the value is not a decimal int64 or the sum overflows. */
int mg_store_add(struct mg_store *st, const char *key, int64_t delta, int64_t *result);
/* Sets key to desired if its value equals expected (expected NULL = key must
 * not exist). Returns 1 when it swapped, 0 when not. *current (malloc'd,
 * optional) receives the value after the call, NULL when the key does not
 * exist. The key keeps its ephemeral owner, if any. */
int mg_store_compare_set(struct mg_store *st, const char *key, const void *expected,
                         size_t expected_len, const void *desired, size_t desired_len,
                         void **current, size_t *current_len);
/* Waits until every key exists (at most MG_STORE_MAX_WAIT_KEYS); -ETIMEDOUT
 * names no key, see mg_store_check. */
int mg_store_wait(struct mg_store *st, const char *const *keys, int nkeys, int timeout_ms);
/* Returns 1 when every key exists, 0 otherwise. */
int mg_store_check(struct mg_store *st, const char *const *keys, int nkeys);
/* Returns 1 when the key existed. */
int mg_store_delete(struct mg_store *st, const char *key);
/* Waits until key's revision exceeds since_rev (it was set, added to or
 * deleted), or the timeout passes (-ETIMEDOUT). since_rev < 0 answers at
 * once with the current state. *rev receives the key's revision; *val / *len
 * (optional) the value, or NULL / 0 when the key does not exist. The revision
 * of a key that does not exist is that of its deletion; when the server no
 * longer remembers it (docs/store-protocol.md, "tombstones") a watch on it
 * may return at once, reporting the key absent. */
int mg_store_watch(struct mg_store *st, const char *key, int64_t since_rev, int timeout_ms,
                   int64_t *rev, void **val, size_t *len);
/* Keys starting with prefix, sorted bytewise, as one malloc'd array of
 * malloc'd strings (free with mg_store_free_list). At most max keys (< 0 =
 * MG_STORE_MAX_LIST, the cap). Returns how many keys match, which may be more
 * than *nkeys. */
int mg_store_list(struct mg_store *st, const char *prefix, int max, char ***keys, int *nkeys);
void mg_store_free_list(char **keys, int nkeys);
/* A round trip; keeps a lease alive. */
int mg_store_ping(struct mg_store *st);

/* Pipelined: n gets (no wait) or sets sent back to back, 64 at a time, their
 * replies read after: a few round trips instead of n (the rendezvous' closer
 * reads thousands of joins so). get_many: vals[i] (malloc'd) NULL and
 * lens[i] untouched when keys[i] does not exist; lens and revs optional; on
 * failure no value is kept. set_many: flags as mg_store_set's. */
int mg_store_get_many(struct mg_store *st, const char *const *keys, int n, void **vals,
                      size_t *lens, int64_t *revs);
int mg_store_set_many(struct mg_store *st, const char *const *keys, const void *const *vals,
                      const size_t *lens, int n, int flags);
/* Deletes n keys so (a key that does not exist is no error). */
int mg_store_delete_many(struct mg_store *st, const char *const *keys, int n);

/* A watch parked on the server across calls: _begin sends it (the server
 * answers when key's revision exceeds since_rev or at timeout_ms), _end waits
 * at most wait_ms for its reply. -EAGAIN: not yet, still parked (call _end
 * again); -ETIMEDOUT: the server's timeout passed; -EINTR: the abort fd,
 * still parked; -ENOENT: no watch is parked, because another call on this
 * connection dropped it (its late reply is skipped). Otherwise as
 * mg_store_watch. So a caller that waits in short slices of its own loop
 * sends one request per timeout_ms rather than one per slice. */
int mg_store_watch_begin(struct mg_store *st, const char *key, int64_t since_rev, int timeout_ms);
int mg_store_watch_end(struct mg_store *st, int wait_ms, int64_t *rev, void **val, size_t *len);

#endif
