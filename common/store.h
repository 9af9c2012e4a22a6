/* The mg store: a small key-value server and its client, over one documented
 * binary protocol (docs/store-protocol.md). The launcher's rendezvous and the
 * runtime's bootstrap (rank 0 hosts it at MASTER_ADDR:MASTER_PORT) both use it.
 *
 * Keys are byte strings up to MG_STORE_MAX_KEY, values up to MG_STORE_MAX_VALUE.
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

#define MG_STORE_MAX_KEY 1024
#define MG_STORE_MAX_VALUE (16u << 20)
#define MG_STORE_MAX_TOKEN 256
#define MG_STORE_MAX_WAIT_KEYS 256

/* ---- server ------------------------------------------------------------------ */

struct mg_store_server;

struct mg_store_server_opts {
    const char *host;  /* bind address; NULL or "" = all interfaces */
    int port;          /* 0 = kernel-chosen */
    int listen_fd;     /* >= 0: use this already-listening socket instead of binding */
    const char *token; /* NULL = no authentication */
    int max_clients;   /* 0 = default (4096) */
};

int mg_store_server_start(struct mg_store_server **out, const struct mg_store_server_opts *opts);
int mg_store_server_port(const struct mg_store_server *srv);

/* Poll-loop integration (the launcher): add the server's descriptors to a
 * pollfd array, and after poll() let it handle the ones that are ready.
 * mg_store_server_pollfds returns how many it filled in (at most max; -ENOSPC
 * when more are needed). mg_store_server_timeout_ms says how long poll may
 * sleep before the server has work (blocked waits, lease expiry); -1 = none. */
int mg_store_server_pollfds(struct mg_store_server *srv, struct pollfd *fds, int max);
int mg_store_server_process(struct mg_store_server *srv, const struct pollfd *fds, int n);
int mg_store_server_timeout_ms(const struct mg_store_server *srv);

/* Or serve from a background thread (the runtime's rank 0). */
int mg_store_server_start_thread(struct mg_store_server *srv);

/* Direct access for the process hosting the server, without a socket. These
 * take the same lock the serving thread uses. The value is copied. */
int mg_store_server_set(struct mg_store_server *srv, const char *key, const void *val, size_t len);
int mg_store_server_get(struct mg_store_server *srv, const char *key, void *buf, size_t cap,
                        size_t *len);

/* Stops the thread (if any), closes every connection, frees everything. */
void mg_store_server_release(struct mg_store_server *srv);

/* ---- client (blocking, one connection, not thread-safe) ------------------- */

struct mg_store;

struct mg_store_opts {
    const char *host;
    int port;
    const char *token;        /* must match the server's, or NULL */
    int connect_timeout_ms;   /* retry connecting (refused, unresolvable) until then */
    int timeout_ms;           /* default bound for each request */
    int lease_ms;             /* > 0: the server drops the connection (and its
                                 ephemeral keys) after this long without a message;
                                 the client must call mg_store_ping in time */
};

int mg_store_connect(struct mg_store **out, const struct mg_store_opts *opts);
void mg_store_release(struct mg_store *st);
/* The connected socket, for callers that poll it (readable = server closed). */
int mg_store_fd(const struct mg_store *st);

enum mg_store_set_flags {
    MG_STORE_EPHEMERAL = 1 << 0, /* deleted when this connection goes away */
};

int mg_store_set(struct mg_store *st, const char *key, const void *val, size_t len, int flags);
/* Waits up to timeout_ms for the key to exist (0 = do not wait). On success
 * *val is malloc'd (NUL-terminated for convenience), *len its length. */
int mg_store_get(struct mg_store *st, const char *key, void **val, size_t *len, int timeout_ms);
/* Atomically adds delta to the decimal integer stored at key (missing = 0). */
int mg_store_add(struct mg_store *st, const char *key, int64_t delta, int64_t *result);
/* Sets key to desired if its value equals expected (expected NULL = key must
 * not exist). *current (malloc'd, optional) receives the value after the call. */
int mg_store_compare_set(struct mg_store *st, const char *key, const void *expected,
                         size_t expected_len, const void *desired, size_t desired_len,
                         void **current, size_t *current_len);
/* Waits until every key exists; -ETIMEDOUT names no key, see mg_store_check. */
int mg_store_wait(struct mg_store *st, const char *const *keys, int nkeys, int timeout_ms);
/* Returns 1 when every key exists, 0 otherwise. */
int mg_store_check(struct mg_store *st, const char *const *keys, int nkeys);
/* Returns 1 when the key existed. */
int mg_store_delete(struct mg_store *st, const char *key);
/* Waits until key's revision exceeds since_rev (it was set, added to or
 * deleted), or the timeout passes (-ETIMEDOUT). *rev receives the new revision;
 * *val / *len the value, or NULL / 0 when the key was deleted. */
int mg_store_watch(struct mg_store *st, const char *key, int64_t since_rev, int timeout_ms,
                   int64_t *rev, void **val, size_t *len);
/* Keys starting with prefix, sorted, as one malloc'd array of malloc'd strings
 * (free with mg_store_free_list). At most max keys. */
int mg_store_list(struct mg_store *st, const char *prefix, int max, char ***keys, int *nkeys);
void mg_store_free_list(char **keys, int nkeys);
int mg_store_ping(struct mg_store *st);

#endif
