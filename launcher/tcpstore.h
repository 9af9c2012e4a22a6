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
 * served: such a client is disconnected. Everything a client sends is
 * bounded; a client that breaks a bound is disconnected. */
#ifndef MG_TCPSTORE_H
#define MG_TCPSTORE_H

#include <poll.h>
#include <stddef.h>

#define MG_TCPSTORE_MAX_KEY     4096
#define MG_TCPSTORE_MAX_VALUE   (64u << 20)
#define MG_TCPSTORE_MAX_KEYS    65536 /* in one check, wait or multi_* request */
#define MG_TCPSTORE_MAX_BYTES   (1u << 30)
#define MG_TCPSTORE_MAX_CLIENTS 65536

struct mg_tcpstore;

int mg_tcpstore_new(struct mg_tcpstore **out);
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
