/* The store this agent hosts, as its own rendezvous key-value backend
 * (kv.h): the agent on the endpoint host runs the same protocol code as
 * the remote agents, on the server's data directly (common/store.h's local
 * calls), with no socket and no thread.
 *
 * Its wait never blocks: it reports at once whether the key changed. The
 * caller serves the store from its own poll loop and steps the rendezvous
 * again when the store changed (mg_store_server_revision) or a deadline of
 * the rendezvous passed. Ephemeral keys belong to the hosting process and go
 * when the backend is released; keepalive has nothing to renew. */
#ifndef MG_KV_HOSTED_H
#define MG_KV_HOSTED_H

#include "kv.h"
#include "store.h"

/* The backend over srv, which must outlive it. where names the store in
 * messages (the endpoint, "host:port"). */
int mg_kv_hosted_open(struct mg_kv **out, struct mg_store_server *srv, const char *where);

#endif
