/* What rdzv_multi.c (driving the protocol) and rdzv_multi_setup.c (setting
 * it up) share: the state of a multi-node rendezvous in the agent. */
#ifndef MG_RDZV_MULTI_INTERNAL_H
#define MG_RDZV_MULTI_INTERNAL_H

#include "agent.h"
#include "kv.h"
#include "rdzv.h"
#include "net.h"
#include "rdzv_conf.h"
#include "rdzv_proto.h"
#include "tcpstore.h"

#include <stdint.h>
#include <stdio.h>

enum phase {
    M_IDLE,
    M_JOINING,
    M_RUNNING,
    M_RESTARTING, /* the rendezvous left the round; the workers are being stopped */
    M_BARRIER,
    M_CLOSING,  /* the host keeps its store up for the others (mg_rdzv_close_begin) */
    M_EXCLUDED, /* out of the rendezvous until the cooldown ends (node exclusion) */
};

struct multi {
    struct mg_rdzv_ops ops; /* multi_ops, with the backend's name */
    struct mg_rdzv_conf conf;
    enum mg_rdzv_backend backend;
    struct mg_kv_host *host;
    struct mg_rdzv *r;
    struct mg_agent *ag;
    enum phase phase;
    FILE *status;              /* the launcher's console (rdzv.h), or NULL */
    int timer;                 /* the one pending timer, or -1 */
    int poller;                /* the hosted store's, or -1 */
    int abort_fd;              /* a signalfd of the terminating signals (kv.h), or -1 */
    int exit_fd;               /* at exit: a timer bounding the last requests, or -1 */
    struct mg_kv *kv;          /* the backend (owned by r) */
    mg_agent_timer_fn waiting; /* host: the step to run again when the store changes */
    struct mg_backoff backoff;
    int64_t formed_ms;
    int64_t progress_ms; /* while joining: when to say what the join waits for */
    char hostname[MG_HOST_MAX];
    char run_id[MG_RDZV_RUN_ID_MAX + 1];
    char notice[2048];
    char first_wait[MG_HOST_MAX + 160]; /* said before the first "still out of reach" */
    /* static: the agents' store at --master_addr:--master_port is the
     * workers' too (torchrun's agent store); the node hosting it serves
     * torch's TCPStore clients on its port as well (tcpstore.h). */
    char store_host[MG_HOST_MAX];
    int store_port;
    struct mg_tcpstore *ts;
    int ts_poller;
    int world; /* --nnodes' maximum times --nproc_per_node: the agent store's limits */
    /* node exclusion: when this node's own failures happened (the newest
     * exclude_after of them), and whether the next join sits out */
    int64_t fail_ms[MG_RDZV_EXCLUDE_AFTER_MAX];
    int nfail;
    int exclude_next;
    int last_nnodes;                  /* nodes in the last round formed */
    int node_rank, rank_base, nranks; /* this node's place in it */
    int nproc;                        /* --nproc_per_node */
    int was_excluded;
    int64_t cooldown_end;
};

/* A line on the launcher's console, as the agent's own notes. */
__attribute__((format(printf, 2, 3))) void mg_multi_note(struct multi *m, const char *fmt, ...);

/* The agent's table for the three backends (each instance copies it and names
 * its own backend), and its release, which takes what setup opened too. */
extern const struct mg_rdzv_ops mg_multi_ops;
void mg_multi_release(void *impl);

#endif
