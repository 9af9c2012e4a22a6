/* The key-value operations the rendezvous is built on, as a small backend
 * interface that mg's store (common/store.h: kv_store.c as its client,
 * kv_hosted.c in the process that hosts it) and etcd v3 (kv_etcd.c) provide:
 * get with a modification revision, set (optionally ephemeral: tied to this
 * client's lease or connection), compare-and-swap, atomic add, delete, list
 * by prefix, wait for a key to change, and lease renewal.
 *
 * Every call is bounded by the backend's request timeout (and wait by its own
 * timeout), returns 0 (or a count / a flag) on success and a negative code on
 * failure. After a failure, mg_kv_error() says which endpoint and what failed,
 * for the program's error message. A call that blocks gives up with -EINTR
 * as soon as abort_fd is readable (the launcher's terminating signals). */
#ifndef MG_KV_H
#define MG_KV_H

#include "mg_err.h"

#include <stddef.h>
#include <stdint.h>

#define MG_KV_MAX_KEY   1024
#define MG_KV_MAX_VALUE (1u << 20) /* the rendezvous' values are small; etcd's limit is 1.5 MiB */
#define MG_KV_MAX_LIST  65536      /* entries one list may return */

enum mg_kv_flags {
    MG_KV_EPHEMERAL = 1 << 0, /* deleted when this client's lease or connection ends */
};

struct mg_kv_entry {
    char *key;
    char *val; /* NUL-terminated; NULL when the backend lists keys only and none was asked */
    size_t len;
    int64_t rev; /* modification revision, 0 when unknown */
};

struct mg_kv;

struct mg_kv_ops {
    const char *name;
    /* *val is malloc'd and NUL-terminated; *rev (optional) is the key's
     * modification revision. -MG_ENOKEY when the key does not exist. */
    int (*get)(struct mg_kv *kv, const char *key, char **val, size_t *len, int64_t *rev);
    int (*set)(struct mg_kv *kv, const char *key, const void *val, size_t len, int flags);
    /* Sets key to desired when its value equals expected (expected NULL: when
     * the key does not exist). Returns 1 when swapped, 0 when not; *cur
     * (optional, malloc'd) receives the value after the call, NULL when the
     * key does not exist. The flags apply to the value written. */
    int (*cas)(struct mg_kv *kv, const char *key, const void *expected, size_t elen,
               const void *desired, size_t dlen, int flags, char **cur, size_t *curlen);
    /* Adds delta to the decimal integer at key (missing = 0); *result the sum. */
    int (*add)(struct mg_kv *kv, const char *key, int64_t delta, int64_t *result);
    /* Returns 1 when the key existed, 0 when not. */
    int (*del)(struct mg_kv *kv, const char *key);
    /* Keys starting with prefix, sorted, at most max; with values when
     * want_values. Free with mg_kv_free_list. */
    int (*list)(struct mg_kv *kv, const char *prefix, int max, int want_values,
                struct mg_kv_entry **out, int *n);
    /* Waits until key is modified after revision since_rev (set, added to or
     * deleted), at most timeout_ms. Returns 1 on a change, 0 on timeout.
     * since_rev 0: waits for the key to exist. */
    int (*wait)(struct mg_kv *kv, const char *key, int64_t since_rev, int timeout_ms);
    /* Optional (NULL: one get or set per key, which mg_kv_get_many and
     * mg_kv_set_many do): n keys read or written (persistent) in a few round
     * trips. get_many: vals[i] NULL when keys[i] does not exist; revs
     * optional. */
    int (*get_many)(struct mg_kv *kv, const char *const *keys, int n, char **vals, size_t *lens,
                    int64_t *revs);
    int (*set_many)(struct mg_kv *kv, const char *const *keys, const char *const *vals,
                    const size_t *lens, int n);
    int (*del_many)(struct mg_kv *kv, const char *const *keys, int n);
    /* Optional (NULL: list them): how many keys start with prefix, without
     * their names: O(1) bytes where a listing of thousands is O(nodes). */
    int (*count)(struct mg_kv *kv, const char *prefix, int *n);
    /* Optional (NULL: wait, then get): as wait, and on a change the key's
     * value too (*val NULL when it does not exist). park_ms (at least
     * timeout_ms) is how long the backend may keep the wait open on its
     * side: a call that ends at timeout_ms leaves it there, and the next one
     * for the same key and since_rev takes it up instead of asking anew
     * (any other call on this client drops it). A node waiting in the short
     * slices of the agent's loop so sends a request per park_ms, not per
     * slice. */
    int (*watch)(struct mg_kv *kv, const char *key, int64_t since_rev, int timeout_ms, int park_ms,
                 char **val, size_t *len);
    /* Renews this client's lease (a heartbeat). -EKEYEXPIRED when the backend
     * already dropped it (and with it this client's ephemeral keys). */
    int (*keepalive)(struct mg_kv *kv);
    /* Ends the lease (ephemeral keys go at once) and frees the client. */
    void (*release)(struct mg_kv *kv);
};

struct mg_kv {
    const struct mg_kv_ops *ops;
    char err[MG_ERRMSG_LEN]; /* what the last failure was, for messages */
    int abort_fd;            /* -1 (as opened), or readable = give up a blocking call */
};

static inline const char *mg_kv_error(const struct mg_kv *kv)
{
    return kv->err;
}

void mg_kv_free_list(struct mg_kv_entry *e, int n);
/* The end of a backend's list: entries for n listed keys (taking the malloc'd
 * keys array and its strings), with each value read through kv's get when
 * want_values; a key deleted since the listing is left out. */
/* n gets, sets or deletes, through the backend's get_many / set_many /
 * del_many where it has them. */
int mg_kv_get_many(struct mg_kv *kv, const char *const *keys, int n, char **vals, size_t *lens,
                   int64_t *revs);
int mg_kv_set_many(struct mg_kv *kv, const char *const *keys, const char *const *vals,
                   const size_t *lens, int n);
int mg_kv_del_many(struct mg_kv *kv, const char *const *keys, int n);
int mg_kv_entries_from_keys(struct mg_kv *kv, char **keys, int n, int want_values,
                            struct mg_kv_entry **out, int *count);

#endif
