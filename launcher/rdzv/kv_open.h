/* Opening the rendezvous' key-value backend (kv.h) from --rdzv_backend /
 * --rdzv_endpoint / --rdzv_conf: the etcd client (kv_etcd.h), the mg store
 * client (kv_store.h), or, on the endpoint host, the store server itself
 * (struct mg_kv_host) with the in-process backend over it (kv_hosted.h). Name
 * resolution and refused connections are retried until a deadline, since on
 * Kubernetes a service name may not be published yet when the pod starts. */
#ifndef MG_KV_OPEN_H
#define MG_KV_OPEN_H

#include "rdzv_conf.h"
#include "kv.h"
#include "store.h"

#include <poll.h>
#include <stdint.h>

#define MG_KV_STORE_DEFAULT_PORT                                                                   \
    29400 /* a store endpoint without a port: torchrun's c10d default */

struct mg_kv_open_opts {
    enum mg_rdzv_backend backend;
    const char *endpoint; /* host[:port]; for static: master_addr:master_port */
    const char *run_id;
    const struct mg_rdzv_conf *conf;
    int64_t deadline_ms; /* absolute (mg_now_ms): give up connecting then */
    int abort_fd;        /* -1, or readable = stop retrying (-EINTR) */
    int node_rank;       /* static: rank 0 hosts the store; -1 otherwise */
    int max_nodes;       /* --nnodes MAX: sizes the hosted store's limits
                            (docs/store-protocol.md); 0 keeps the store's defaults */
    /* Optional: what to tell the user's console. Why the endpoint still
     * cannot be reached, with the resolver's or the kernel's word for it,
     * after MG_KV_OPEN_PROGRESS_MS and then every MG_KV_OPEN_PROGRESS_EVERY_MS
     * until the deadline; and a warning, once, when this agent hosts a store
     * that other machines can reach without a token. */
    void (*progress)(void *ctx, const char *msg);
    void *progress_ctx;
    /* When this agent hosts the store: connections in another protocol on
     * its port go here (mg_store_server_opts.foreign; the static backend's
     * agent store serves torch's TCPStore clients so). NULL: none. */
    int (*foreign)(void *ctx, int fd, const void *bytes, size_t n);
    void *foreign_ctx;
};

#define MG_KV_OPEN_PROGRESS_MS       2000
#define MG_KV_OPEN_PROGRESS_EVERY_MS 30000

/* The store server this agent hosts (c10d or static, on the endpoint host). */
struct mg_kv_host;

/* Opens the backend. *kv is the client, *host the hosted server or NULL.
 * When this agent hosts the store, *kv is the in-process backend over it
 * (kv_hosted.h), and the caller serves the store from its poll loop with
 * the calls below: there is no thread. ns receives the key namespace for the
 * run. On failure, err says which endpoint and what failed. */
int mg_kv_open(const struct mg_kv_open_opts *s, struct mg_kv **kv, struct mg_kv_host **host,
               char *ns, size_t nslen, char *err, size_t errlen);

/* Poll-loop integration of the hosted server (mg_store_server_pollfds /
 * _process / _timeout_ms; NULL h: nothing). _process returns 1 when that
 * turn changed the store (a remote client's write, a closed connection, an
 * expired lease): the cue to step a rendezvous that waits on it. */
int mg_kv_host_pollfds(struct mg_kv_host *h, struct pollfd *fds, int max);
int mg_kv_host_process(struct mg_kv_host *h, const struct pollfd *fds, int n);
int mg_kv_host_timeout_ms(const struct mg_kv_host *h);
/* For programs without a loop of their own (the tests' helpers): serves
 * the store for at most timeout_ms, returning 1 as soon as it changed, 0 at
 * the timeout, or a negative code. With NULL h it just sleeps. */
int mg_kv_host_serve(struct mg_kv_host *h, int timeout_ms);
int mg_kv_host_port(const struct mg_kv_host *h);
/* Deletes the hosted store's keys that start with prefix but not with keep
 * (NULL: none kept): the workers' keys of earlier attempts in the agent
 * store. Returns how many. */
int mg_kv_host_delete_prefix(struct mg_kv_host *h, const char *prefix, const char *keep);
/* The hosted server's statistics (common/store.h), for the scale benchmark. */
int mg_kv_host_stats(struct mg_kv_host *h, struct mg_store_server_stats *st);
void mg_kv_host_release(struct mg_kv_host *h);

/* The address the other nodes most likely reach this agent at: the local
 * address of its connection to the backend, or, when it hosts the store,
 * the address a connection to the endpoint would leave from. */
int mg_kv_local_addr(struct mg_kv *kv, const struct mg_kv_host *host, char *buf, size_t len);

/* Whether host names this machine: a loopback address, or an address one of
 * its interfaces holds (decided by binding to it). */
int mg_kv_is_local_host(const char *host);

#endif
