/* Multi-node rendezvous: forms the group of agents round by round over a
 * key-value backend (kv.h: the mg store or etcd), watches the members'
 * liveness while the workers run, and coordinates restarts and the exit
 * barrier across nodes. docs/rendezvous.md describes the protocol for users.
 *
 * Keys, under the namespace NS (one per run id):
 *   NS/state            "ROUND RESTARTS STATUS CAUSE": the current round, the
 *                       failure restarts so far, r(unning) / d(one) / f(ailed),
 *                       and why the round last moved (f failure, x node died,
 *                       j node waiting; once a round after a failure closes: c
 *                       the restart counted, m it did not, a node was gone).
 *                       Changed only by compare-and-swap.
 *   NS/fail             the root cause, when STATUS is f.
 *   NS/a/ID             one per live agent, ephemeral (lease or connection):
 *                       its descriptor. Its disappearance is a node's death.
 *   NS/r/ROUND/j/ID     agent ID joined the round (value: its descriptor).
 *   NS/r/ROUND/n        count of joins (atomic add).
 *   NS/r/ROUND/closing  the agent id of the node closing the round: one at a
 *                       time reads the joins (taken over when it died).
 *   NS/r/ROUND/close    the formed round: ranks, world size, master address;
 *                       written once, by compare-and-swap from absent. Above
 *                       128 nodes it holds the first block of members, and
 *   NS/r/ROUND/m/TAG/K  the other blocks (rdzv_round.c), and
 *   NS/r/ROUND/i/TAG/H  the index from agent id to rank, are written before it
 *                       under the closer's TAG, so that each node reads a few
 *                       blocks rather than the whole roster.
 *   NS/r/ROUND/failure  the round's first worker failure (the root cause,
 *                       should the job end on it).
 *   NS/r/ROUND/done/ID  agent ID's workers all succeeded in the round.
 *
 * An agent counts once in a round's joins (a join begun again keeps its
 * place). A round closes when MAX agents joined, or when at least MIN did and the
 * last call passed (for a re-formation: as soon as every live agent joined).
 * Any joined agent may close it; the compare-and-swap picks one. Node ranks:
 * the fixed --node_rank (static); otherwise agents of the previous round keep
 * their order, and newcomers follow sorted by host name, then agent id.
 *
 * Everything runs in steps, for the launcher's single poll loop. A step that
 * finds nothing to do waits for a change in the backend at most the
 * max_block ms its caller allows (0 for the in-process backend of the agent
 * hosting the store, whose loop steps again when the store changed), and
 * mg_rdzv_wait_ms says when the next step is due regardless. */
#ifndef MG_RDZV_PROTO_H
#define MG_RDZV_PROTO_H

#include "net.h"
#include "rdzv_conf.h"
#include "kv.h"

#include <stdint.h>

#define MG_RDZV_SLICE_MS   200
#define MG_RDZV_ID_MAX     128   /* agent id: host-pid-random */
#define MG_RDZV_RUN_ID_MAX 128   /* --rdzv_id */
#define MG_RDZV_MAX_NODES  65536 /* --nnodes bound, MG_MAX_NNODES in opts.h */
#define MG_RDZV_MSG_MAX    1024

struct mg_rdzv;

struct mg_rdzv_opts {
    struct mg_kv *kv; /* the backend client; the rendezvous takes ownership */
    const char *ns;   /* key namespace (prefix + run id), without trailing '/' */
    int min_nodes;    /* --nnodes MIN:MAX */
    int max_nodes;
    int node_rank;         /* >= 0: fixed rank (static backend); -1: assigned */
    int has_sched_index;   /* the scheduler numbered this node: */
    int sched_index;       /* its index (node_order.h), which orders new nodes first */
    int nproc;             /* workers on this node */
    int max_restarts;      /* failure restarts allowed for the whole job */
    const char *hostname;  /* for agent ids, rank order and messages */
    const char *advertise; /* address other nodes reach this one at (MASTER_ADDR) */
    const struct mg_rdzv_conf *conf;
};

/* A formed round, from this node's point of view. */
struct mg_rdzv_world {
    int round;         /* attempt number: never repeats within a run */
    int restart_count; /* failure restarts so far (TORCHELASTIC_RESTART_COUNT) */
    int node_rank;     /* GROUP_RANK */
    int nnodes;        /* GROUP_WORLD_SIZE */
    int rank_base;     /* global rank of this node's local rank 0 */
    int world_size;
    char master_addr[MG_HOST_MAX];
    int master_port;
    /* On the rank-0 node: the listening socket that holds master_port, to be
     * closed just before the workers are spawned (-1 elsewhere). Owned by the
     * caller once returned. */
    int master_fd;
};

/* What a failed worker was, to tell the other nodes. */
struct mg_rdzv_failure {
    int rank, local_rank; /* -1: a node's failure, not a worker's (a lost node) */
    int exit_code;        /* shell-style: 128+signal for a signal */
    int signal;           /* 0 when it exited */
    long pid;
    double time; /* seconds since the epoch */
    char host[MG_HOST_MAX];
    char message[512];
    /* The agent whose node failed ("": a record of an older mglaunch), and
     * for a lost node its ranks (first_rank .. first_rank + nranks - 1;
     * nranks 0: not known). */
    char node[MG_RDZV_ID_MAX];
    int first_rank, nranks;
};

enum mg_rdzv_event {
    MG_RDZV_NONE = 0, /* nothing to do */
    MG_RDZV_RESTART,  /* stop the workers and join the next round */
    MG_RDZV_FAILED,   /* the job failed (here or elsewhere): stop and exit */
    MG_RDZV_DONE,     /* every node finished: exit 0 */
};

/* Why the last RESTART happened (for logs). */
enum mg_rdzv_reason {
    MG_RDZV_R_NONE,
    MG_RDZV_R_FAILURE,     /* a worker failed somewhere: counts as a restart */
    MG_RDZV_R_NODE_DIED,   /* a member disappeared: membership change */
    MG_RDZV_R_NODE_JOINED, /* a node is waiting to join: membership change */
    MG_RDZV_R_LEASE_LOST,  /* this agent was declared dead and rejoins */
};

int mg_rdzv_new(struct mg_rdzv **out, const struct mg_rdzv_opts *opts, char *err, size_t errlen);
void mg_rdzv_release(struct mg_rdzv *r);

/* Joins the next round: begin, then call step until it returns 1 (formed,
 * *w filled) or an error; 0 means "not yet: call again", after the step
 * waited at most max_block_ms for a change (see mg_rdzv_wait_ms). Errors:
 * -ETIMEDOUT (too few nodes within join_timeout), -MG_ECLOSED (the run
 * already finished), -MG_EPEER (the job failed elsewhere: see
 * mg_rdzv_failure_info), or a backend error (-EINTR: the backend gave up
 * because its abort_fd fired). mg_rdzv_message() explains. */
int mg_rdzv_join_begin(struct mg_rdzv *r);
int mg_rdzv_join_step(struct mg_rdzv *r, struct mg_rdzv_world *w, int max_block_ms);

/* While joining: what the join waits for, for a progress line. *joined is
 * the number of nodes seen in the open round (-1 while this node waits for
 * a place as a spare or has not found the round yet); *left_ms the time to
 * join_timeout. */
struct mg_rdzv_progress {
    int64_t round, joined;
    int min, max;
    int left_ms;
};
void mg_rdzv_join_progress(const struct mg_rdzv *r, struct mg_rdzv_progress *p);

/* After a join, barrier or close step that returned "not yet": how long
 * until the next one has something to do even if the backend does not
 * change (a last call, a heartbeat, a deadline), at most MG_RDZV_SLICE_MS. */
int mg_rdzv_wait_ms(const struct mg_rdzv *r);

/* While the workers run: how long until mg_rdzv_tick is due (ms), and the
 * tick itself (heartbeat, membership and job state check). */
int mg_rdzv_timeout_ms(const struct mg_rdzv *r);
enum mg_rdzv_event mg_rdzv_tick(struct mg_rdzv *r);

/* A worker of this node failed: moves the job to a new round, so that every
 * node re-forms (the next round decides whether the restart counts), riding
 * out a backend that does not answer for up to heartbeat_timeout. Returns
 * RESTART, or FAILED (the job failed elsewhere, or the backend did not let
 * the group re-form); mg_rdzv_message says which, and why. */
enum mg_rdzv_event mg_rdzv_worker_failed(struct mg_rdzv *r, const struct mg_rdzv_failure *f);
/* Whether the last mg_rdzv_worker_failed was the round's first failure (it
 * moved the job on), rather than one that followed another node's. */
int mg_rdzv_failed_here(const struct mg_rdzv *r);
/* A worker of this node failed in a way no restart can mend (the
 * do-not-retry exit code): the job ends, with f as its root cause, on every
 * node. 0, or a backend error. */
int mg_rdzv_fail_job(struct mg_rdzv *r, const struct mg_rdzv_failure *f);
/* --nnodes MIN. */
int mg_rdzv_min_nodes(const struct mg_rdzv *r);
/* After a time out of the rendezvous (node exclusion's cooldown): the
 * backend's connection and lease made good again (they ran out meanwhile),
 * before mg_rdzv_join_begin. 0, or a backend error. */
int mg_rdzv_refresh(struct mg_rdzv *r);
/* The job's state as the backend has it: 'r' running, 'd' done, 'f'
 * failed, or a negative backend error. */
int mg_rdzv_job_state(struct mg_rdzv *r);
/* Node exclusion: this node leaves the live agents (the others re-form
 * without it) but stays known as sitting out (NS/o/ID, ephemeral), so that
 * the agent hosting the store keeps it up at the end until this node has
 * read the outcome. mg_rdzv_sit_in ends that, before joining again or
 * leaving. 0, or a backend error. */
int mg_rdzv_sit_out(struct mg_rdzv *r);
void mg_rdzv_sit_in(struct mg_rdzv *r);

/* Every worker of this node succeeded: the exit barrier, which waits, at
 * most exit_barrier_timeout, until every live member finished. Begin (0 or
 * < 0), then step until it returns something other than MG_RDZV_NONE: DONE,
 * RESTART when a failure elsewhere restarts the job meanwhile, FAILED, or
 * -ETIMEDOUT (the barrier timed out) / another error, as a negative int. */
int mg_rdzv_finish_begin(struct mg_rdzv *r);
int mg_rdzv_finish_step(struct mg_rdzv *r, int max_block_ms);

/* Graceful exit (a signal, an error): leaves the rendezvous so that the
 * others notice at once rather than a heartbeat timeout later. */
void mg_rdzv_leave(struct mg_rdzv *r);

/* The last call before exiting. Leaves the rendezvous; and when this agent
 * hosts the store (hosting), the job cannot go on without it: unless the job
 * already finished or failed, marks it failed with why. Returns 1 when that
 * is all; 0 when the host should keep serving its store, so that the other
 * agents can read the outcome, and call mg_rdzv_close_step (when the store
 * changed, or after mg_rdzv_wait_ms) until it returns 1: every other agent
 * gone, or close_timeout passed. */
int mg_rdzv_close_begin(struct mg_rdzv *r, int hosting, const char *why);
int mg_rdzv_close_step(struct mg_rdzv *r);

enum mg_rdzv_reason mg_rdzv_last_reason(const struct mg_rdzv *r);
/* A human-readable line about the last event or error. */
const char *mg_rdzv_message(const struct mg_rdzv *r);
/* A line to print now, once (the tick found the backend's connection closed
 * and connects again): 1 and the line in buf, or 0 when there is none. */
int mg_rdzv_take_note(struct mg_rdzv *r, char *buf, size_t len);
/* How long this node's heartbeats had stopped when it found itself dropped
 * from the job (declared dead), until it is in a formed round again; 0 when
 * it was not dropped. */
int64_t mg_rdzv_dropped_ms(const struct mg_rdzv *r);
/* The root cause recorded by the node whose failure ended the job; 0 when
 * there is one, -MG_ENOKEY otherwise. */
int mg_rdzv_failure_info(const struct mg_rdzv *r, struct mg_rdzv_failure *f);
/* Whether that root cause is another node's (its worker, or the node
 * itself, lost): then this node's own failures only followed it. */
int mg_rdzv_failure_elsewhere(const struct mg_rdzv *r);

/* A node's descriptor (NS/a/ID, NS/r/ROUND/j/ID, a line of the close record)
 * and the rank order, a pure function exposed for the unit tests: sorts n
 * descriptors in place into rank order (see above). */
struct mg_rdzv_desc {
    char id[MG_RDZV_ID_MAX];
    char host[MG_HOST_MAX];
    char addr[MG_HOST_MAX];
    int port, nproc, prev, fixed;
    int idx; /* the scheduler's index of the node (node_order.h), -1: none */
};
int mg_rdzv_desc_parse(const char *text, struct mg_rdzv_desc *d);
int mg_rdzv_desc_format(const struct mg_rdzv_desc *d, char *buf, size_t len);
void mg_rdzv_rank_order(struct mg_rdzv_desc *d, int n);

/* When a node's first heartbeat after a round formed comes, in ms after it
 * learned its rank: a point of (0, interval_ms] picked by rnd (uniformly
 * for a uniform rnd), never later than one interval. Every node of a round
 * learns its rank within a moment, and heartbeats that stayed in step would
 * reach the store together every interval (10,000 nodes: 50,000 requests in
 * the same second) where spread out they are a steady rate; each keeps its
 * phase after (the next comes an interval after the last). Pure, for the
 * unit tests. */
int64_t mg_rdzv_first_tick_ms(uint64_t rnd, int64_t interval_ms);

#endif
