/* The etcd rendezvous backend: etcd's v3 API through its JSON gateway
 * (kv/range, kv/put, kv/txn, kv/deleterange, lease/grant, lease/keepalive,
 * lease/revoke, watch), over common/http.h, whose libcurl is loaded at run
 * time: mglaunch never links libcurl and pays for it only when
 * --rdzv_backend etcd is used.
 *
 * Keys and values travel base64-encoded, as the gateway requires. Ephemeral
 * keys are attached to one lease per client, granted on first use and renewed
 * by the keepalive op; release revokes it, which deletes them at once.
 * What thousands of nodes do at once costs each a request or two, not a
 * request per node that went first: an add of 1 takes its place from the
 * version of KEY#seq (see add_one), a count is etcd's count_only, and
 * set_many / del_many are transactions of 64 operations. */
#ifndef MG_KV_ETCD_H
#define MG_KV_ETCD_H

#include "kv.h"

#define MG_KV_ETCD_MAX_ENDPOINTS 16
#define MG_KV_ETCD_DEFAULT_PORT  2379

struct mg_kv_etcd_opts {
    /* "host", "host:port", "http://host:port" or "https://host:port", several
     * separated by commas (tried in turn when one does not answer). */
    const char *endpoints;
    const char *cacert, *cert, *key; /* TLS files for libcurl; "" or NULL = none */
    int https;                       /* endpoints without a scheme use https (with a TLS
                                        file they do anyway) */
    int timeout_ms;                  /* bound of each request */
    int lease_ttl_ms;                /* ephemeral keys live this long without keepalive */
    const char *libcurl;             /* library to dlopen; NULL = "libcurl.so.4" */
};

/* Creates the client (no request is sent yet). On failure returns a negative
 * code and writes why into err: a malformed endpoint (-EINVAL), or libcurl
 * missing (-MG_EUNSUPPORTED). */
int mg_kv_etcd_open(struct mg_kv **out, const struct mg_kv_etcd_opts *opts, char *err,
                    size_t errlen);

/* The gateway path prefix in use ("/v3/", or "/v3beta/" for etcd 3.3),
 * known after the first successful request; NULL before. */
const char *mg_kv_etcd_api_prefix(const struct mg_kv *kv);
/* The local address of the last connection to etcd. */
int mg_kv_etcd_local_addr(const struct mg_kv *kv, char *buf, size_t len);

#endif
