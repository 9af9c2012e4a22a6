/* Opening a rendezvous backend from --rdzv_backend / --rdzv_endpoint /
 * --rdzv_conf: the etcd client, the mg store client, or, on the endpoint
 * host, the store server itself with the in-process backend over it. Name
 * resolution and refused connections are retried until a deadline, since on
 * Kubernetes a service name may not be published yet when the pod starts. */
#ifndef MG_RDZV_BACKEND_H
#define MG_RDZV_BACKEND_H

#include "rdzv_conf.h"
#include "kv.h"

#include <poll.h>
#include <stdint.h>

#define MG_RDZV_DEFAULT_PORT 29400 /* torchrun's default for c10d endpoints */

struct mg_rdzv_setup {
    enum mg_rdzv_backend backend;
    const char *endpoint; /* host[:port]; for static: master_addr:master_port */
    const char *run_id;
    const struct mg_rdzv_conf *conf;
    int64_t deadline_ms; /* absolute (mg_now_ms): give up connecting then */
    int abort_fd;        /* -1, or readable = stop retrying (-EINTR) */
    int node_rank;       /* static: rank 0 hosts the store; -1 otherwise */
    /* Optional: told once, when the endpoint still cannot be reached after
     * MG_RDZV_PROGRESS_MS, why it keeps retrying (for the user's console). */
    void (*progress)(void *ctx, const char *msg);
    void *progress_ctx;
};

#define MG_RDZV_PROGRESS_MS 2000

/* The store server this agent hosts (c10d / static on the endpoint host). */
struct mg_rdzv_host;

/* Opens the backend. *kv is the client, *host the hosted server or NULL.
 * When this agent hosts the store, *kv is the in-process backend over it
 * (kv_hosted.h), and the caller serves the store from its poll loop with
 * the calls below: there is no thread. ns receives the key namespace for the
 * run. On failure, err says which endpoint and what failed. */
int mg_rdzv_backend_open(const struct mg_rdzv_setup *s, struct mg_kv **kv,
                         struct mg_rdzv_host **host, char *ns, size_t nslen, char *err,
                         size_t errlen);

/* Poll-loop integration of the hosted server (mg_store_server_pollfds /
 * _process / _timeout_ms; NULL h: nothing). _process returns 1 when that
 * turn changed the store (a remote client's write, a closed connection, an
 * expired lease): the cue to step a rendezvous that waits on it. */
int mg_rdzv_host_pollfds(struct mg_rdzv_host *h, struct pollfd *fds, int max);
int mg_rdzv_host_process(struct mg_rdzv_host *h, const struct pollfd *fds, int n);
int mg_rdzv_host_timeout_ms(const struct mg_rdzv_host *h);
/* For programs without a loop of their own (the tests' helpers): serves
 * the store for at most timeout_ms, returning 1 as soon as it changed, 0 at
 * the timeout, or a negative code. With NULL h it just sleeps. */
int mg_rdzv_host_serve(struct mg_rdzv_host *h, int timeout_ms);
int mg_rdzv_host_port(const struct mg_rdzv_host *h);
void mg_rdzv_host_release(struct mg_rdzv_host *h);

/* The address the other nodes most likely reach this agent at: the local
 * address of its connection to the backend, or, when it hosts the store,
 * the address a connection to the endpoint would leave from. */
int mg_rdzv_backend_local_addr(struct mg_kv *kv, const struct mg_rdzv_host *host, char *buf,
                               size_t len);

/* Whether host names this machine: a loopback address, or an address one of
 * its interfaces holds (decided by binding to it). */
int mg_rdzv_is_local_host(const char *host);

#endif
