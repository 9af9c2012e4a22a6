/* The mg store client as a rendezvous key-value backend (kv.h). */
#ifndef MG_KV_STORE_H
#define MG_KV_STORE_H

#include "kv.h"

struct mg_kv_store_opts {
    const char *host;
    int port;
    const char *token;      /* NULL or "" = none */
    int connect_timeout_ms; /* retry refused / unresolvable until then */
    int timeout_ms;         /* bound of each request */
    int lease_ms;           /* the store drops this agent after this long silent */
};

/* Connects. On failure, err says which endpoint and why. */
int mg_kv_store_open(struct mg_kv **out, const struct mg_kv_store_opts *o, char *err,
                     size_t errlen);
/* The connection's socket (readable = the store closed it). */
int mg_kv_store_fd(const struct mg_kv *kv);

#endif
