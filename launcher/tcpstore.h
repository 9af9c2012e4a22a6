/* torch's TCPStore protocol, served by the agent that hosts the static
 * rendezvous (its "agent store"). torchrun's static backend gives workers
 * MASTER_PORT = --master_port and TORCHELASTIC_USE_AGENT_STORE=True: every
 * torch worker then connects to the agent's TCPStore there, as a client,
 * instead of rank 0 hosting one (torch.distributed.rendezvous
 * _create_c10d_store). mglaunch's agent store is mg's store; connections
 * that speak TCPStore on its port are handed here (mg_store_server_opts
 * .foreign), so one port serves the agents, mg's workers and torch's.
 *
 * The keys are the torch workers' own (mg's workers use the mg store). Both
 * framings of the protocol are spoken, told apart by the first bytes:
 * torch 1.13 to 2.1 (SET=0, ... no handshake) and later torch, which opens
 * with VALIDATE (0x00 and the magic 0x3C85F7CE) and pings (queries renumbered
 * from SET=1). Requests: set, compare_set, get, add, check, wait (parked
 * until its keys exist, or cancelled), num_keys, delete, append,
 * multi_get, multi_set, ping. watch_key and the queue operations are not
 * served: such a client is disconnected. Everything a client sends, and
 * what the store holds, is bounded (struct mg_tcpstore_limits); a client that
 * breaks a bound is disconnected (the protocol has no error reply: torch
 * reports the reset on its call) and the agent's log says which bound. */
#ifndef MG_TCPSTORE_H
#define MG_TCPSTORE_H

#include <poll.h>
#include <stddef.h>

#define MG_TCPSTORE_MAX_KEY  4096
#define MG_TCPSTORE_MAX_KEYS 65536 /* in one check, wait or multi_* request */

/* What a store serving a job of `world` torch workers accepts
 * (mg_tcpstore_limits_for; docs/store-protocol.md#limits). torch's own use
 * is a few keys per rank and process group, each under 1 KiB (NCCL's id is
 * 128 bytes, a gloo address about 100) and a connection per worker
 * process; the limits leave room for a script's own keys many times over
 * while bounding what a stranger on the port can make the agent hold. */
struct mg_tcpstore_limits {
    size_t max_value;    /* one value, after an append too */
    size_t max_keys;     /* keys held */
    size_t max_bytes;    /* keys and values held, with each key's overhead */
    int max_clients;     /* connections open */
    size_t max_buffered; /* requests read but not yet whole, and parked waits' keys, all clients */
    size_t max_pending;  /* replies not yet sent, all clients: past it, requests wait */
};

void mg_tcpstore_limits_for(struct mg_tcpstore_limits *l, int world);

/* Told a line for the agent's log when a client is refused (over a limit,
 * or an unserved or malformed request), at most one a second (the others
 * counted into the next one). */
typedef void (*mg_tcpstore_report_fn)(void *ctx, const char *line);

struct mg_tcpstore;

/* limits NULL: mg_tcpstore_limits_for(1); report may be NULL. */
int mg_tcpstore_new(struct mg_tcpstore **out, const struct mg_tcpstore_limits *limits,
                    mg_tcpstore_report_fn report, void *report_ctx);
void mg_tcpstore_release(struct mg_tcpstore *t);

/* Takes over a connected socket and the bytes already read from it (the
 * shape of mg_store_server_opts.foreign). 0, or a negative code (the socket
 * is closed then). */
int mg_tcpstore_adopt(void *t, int fd, const void *bytes, size_t n);

/* Poll-loop integration: the shapes of struct mg_poller (loop.h). */
int mg_tcpstore_pollfds(void *t, struct pollfd *fds, int max);
int mg_tcpstore_process(void *t, const struct pollfd *fds, int n);

/* Forgets every key (a new round must not see the last one's); parked
 * waits stay parked. */
void mg_tcpstore_clear(struct mg_tcpstore *t);
/* Keys and connections now (for tests and messages). */
long mg_tcpstore_nkeys(const struct mg_tcpstore *t);
int mg_tcpstore_nclients(const struct mg_tcpstore *t);

#endif
