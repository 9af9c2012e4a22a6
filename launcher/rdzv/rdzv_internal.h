/* What the four files of the rendezvous protocol share: struct mg_rdzv, the
 * state record, and the plumbing both phases use. rdzv_proto.c holds the
 * records (descriptors, state, failures) and the set-up, rdzv_round.c forms a
 * round, rdzv_roster.c reads and writes a formed round's membership record,
 * rdzv_watch.c watches it while the workers run and ends it (the exit
 * barrier, leaving, closing). rdzv_proto.h has the keys and the rules. Not a
 * public API. */
#ifndef MG_RDZV_INTERNAL_H
#define MG_RDZV_INTERNAL_H

#include "rdzv_proto.h"
#include "mg_err.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#define KEY_MAX   MG_KV_MAX_KEY
#define CAS_TRIES 64

/* NS/state, parsed. */
struct rdzv_state {
    int64_t round, restarts;
    char status; /* 'r' running, 'd' done, 'f' failed */
    char cause;  /* why the round last moved (rdzv_proto.h): '-' start, 'f' failure, 'x' node
                    died, 'j' node waiting to join, 'c' / 'm' a restart counted or not */
    int64_t rev;
    char raw[64];
};

/* A block of the formed round's members: base is the global rank of its
 * first member's local rank 0; d is NULL until the block was read. */
struct rdzv_block {
    int base, n;
    struct mg_rdzv_desc *d;
};

/* Members each node watches in its heartbeat besides itself (rdzv_watch.c). */
#define RDZV_WATCH_NEXT 2

struct mg_rdzv {
    struct mg_kv *kv;
    char ns[KEY_MAX / 2];
    int min, max, fixed, idx, nproc, max_restarts;
    struct mg_rdzv_conf conf;
    char id[MG_RDZV_ID_MAX];
    char host[MG_HOST_MAX];
    char addr[MG_HOST_MAX];
    int prev_rank;
    int failed_here; /* the last mg_rdzv_worker_failed moved the job: its failure was the round's */
    /* the reserved port of this round */
    int listen_fd, port;
    /* the formed round */
    int formed;
    int64_t round, restarts;
    /* Its members, held by block of the membership record (rdzv_round.c):
     * nmembers in all, mblock a block, mtag the closer's tag that names the
     * blocks' keys. A block is read when first needed: a node holds its own
     * and those of the members it watches, not the whole roster. */
    int nmembers, mblock, mtag;
    struct rdzv_block *mblk; /* nmembers / mblock blocks, rounded up */
    int64_t next_tick, last_ok;
    /* While the workers run (rdzv_watch.c): when a request found the
     * backend's connection closed and the tick began to connect again (0:
     * it is not closed), and how long the backend had not answered a whole
     * tick then. */
    int64_t lost_at, lost_silent_ms;
    /* When the tick's request under way began: a request that finds the
     * connection closed may itself spend a second connecting again, which
     * is no silence of this node's. */
    int64_t op_at;
    /* This node was dropped from the job (its lease ran out: declared dead)
     * after its heartbeats stopped this long; 0 when not, or once it is in
     * a formed round again. What it says when it cannot go on names it. */
    int64_t dropped_ms;
    /* A line for the console now (mg_rdzv_note), "" when none. */
    char note[MG_RDZV_MSG_MAX];
    /* joining */
    enum {
        J_IDLE,
        J_TOP,
        J_ROUND
    } jstate;
    int64_t jround, jdeadline, last_call;
    int64_t jcount; /* nodes seen in round jround, -1 before the first count */
    /* This node's place in the join count of round jround (what its ADD
     * returned), and when it first saw MIN nodes there (-1: not yet). The
     * node whose place is the count closes the round; the others only when it
     * has not within a grace that grows with their distance from it, so that
     * thousands of nodes do not all read every join to close one round. */
    int64_t jpos, min_seen, jat; /* jat: when it joined */
    /* When this node may try to close the round again after it found
     * another live node closing it (rdzv_round.c, claim_close). */
    int64_t claim_retry_at;
    /* The state as the join saw it, and whether the next pass may take it
     * and jpos as the count instead of reading them again. */
    struct rdzv_state jst;
    int jfresh;
    /* Until when a pass whose wait for the close record ended without a
     * change may take jst and jcount again instead of reading them. */
    int64_t jquiet_until;
    /* The live agents' count this node listed last in round jround, and
     * when (-1: not yet): rdzv_round.c lists again only when it may matter. */
    int64_t live_at;
    int live_n;
    /* exit barrier, close */
    int64_t bdeadline, cdeadline;
    /* after a step that waited: when the next one has something to do even
     * if the backend does not change */
    int64_t wake_at;
    enum mg_rdzv_reason reason;
    char msg[MG_RDZV_MSG_MAX];
    int have_fail;
    struct mg_rdzv_failure fail;
};

/* The message mg_rdzv_message() returns. */
__attribute__((format(printf, 2, 3))) static inline void say(struct mg_rdzv *r, const char *fmt,
                                                             ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof(r->msg), fmt, ap);
    va_end(ap);
}

/* A backend failure: the message is the backend's (it names the endpoint). */
static inline int kvfail(struct mg_rdzv *r, const char *what, int rc)
{
    const char *e = mg_kv_error(r->kv);
    say(r, "%s: %s", what, e[0] ? e : mg_strerror(rc));
    return rc;
}

/* buf (KEY_MAX bytes) = NS/<fmt>. */
__attribute__((format(printf, 3, 4))) static inline void key(const struct mg_rdzv *r, char *buf,
                                                             const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(buf, KEY_MAX, "%s/", r->ns);
    va_start(ap, fmt);
    vsnprintf(buf + n, (size_t)(KEY_MAX - n), fmt, ap);
    va_end(ap);
}

/* ---- records (rdzv_proto.c) ---------------------------------------------------- */

/* This agent's descriptor, as it joins a round. */
void rdzv_my_desc(const struct mg_rdzv *r, struct mg_rdzv_desc *d);

/* Reads NS/state, creating "0 0 r" when the run is new. */
int rdzv_state_read(struct mg_rdzv *r, struct rdzv_state *s);
/* Moves the state from *from to *to. 1 when this call did it, 0 when the
 * state had already changed (then *from holds the new one). */
int rdzv_state_cas(struct mg_rdzv *r, struct rdzv_state *from, struct rdzv_state *to);

int rdzv_fail_format(const struct mg_rdzv_failure *f, char *buf, size_t len);
int rdzv_fail_parse(const char *v, struct mg_rdzv_failure *f);
/* Says why the job failed, from NS/fail. */
void rdzv_say_failed(struct mg_rdzv *r);
/* Records the root cause (the first one wins) and marks the job failed. */
int rdzv_mark_failed(struct mg_rdzv *r, struct rdzv_state *st, const struct mg_rdzv_failure *f);
/* Member "dead" of the last formed round died and fewer than MIN agents are
 * left: the job cannot go on. Records that as the root cause. */
void rdzv_below_min(struct mg_rdzv *r, struct rdzv_state *st, int dead, int na);
/* The global ranks of member i of the last formed round: returns the first,
 * their count into *n, and "rank 4" or "ranks 4-7" into buf (-1 and "ranks
 * unknown" when its block cannot be read). */
int rdzv_member_ranks(struct mg_rdzv *r, int i, int *n, char *buf, size_t cap);

/* ---- the membership record (rdzv_roster.c) ---------------------------------------- */

/* The close record's first line. block and tag are absent from a record of
 * an mglaunch from before the blocks (every member in it): block = nnodes. */
struct rdzv_close_hdr {
    int64_t round, restarts;
    int nnodes, world, block, tag;
    int nproc; /* every member's nproc when they are all the same, else 0 */
};

/* Its blocks, and the number of members in block k. */
int rdzv_roster_nblocks(const struct rdzv_close_hdr *h);
int rdzv_roster_block_len(const struct rdzv_close_hdr *h, int k);
/* Parses a close record: its header, and block 0 into *b0 (allocated). */
int rdzv_close_parse(const char *v, struct rdzv_close_hdr *h, struct mg_rdzv_desc **b0);
/* Reads NS/r/R/close: 1 and its parsed header and block 0 when it exists, 0
 * when not, < 0. */
int rdzv_read_close(struct mg_rdzv *r, int64_t round, struct rdzv_close_hdr *h,
                    struct mg_rdzv_desc **b0);
/* Reads block k of round h->round's members into *b (block 0: from the
 * close record). */
int rdzv_read_block(struct mg_rdzv *r, const struct rdzv_close_hdr *h, int k, struct rdzv_block *b);
/* Agent id's rank in round h from its index into *rank, -1 when it is not a
 * member. */
int rdzv_index_lookup(struct mg_rdzv *r, const struct rdzv_close_hdr *h, const char *id, int *rank);
/* Every member of round `round`, into *out (allocated). */
int rdzv_read_all(struct mg_rdzv *r, int64_t round, struct rdzv_close_hdr *h,
                  struct mg_rdzv_desc **out);
/* The closer writes round R's membership record, members d[0..nd) in rank
 * order: 1 when this call closed the round (*hout its header), 0 when
 * another closer did, < 0. */
int rdzv_write_roster(struct mg_rdzv *r, int64_t round, int64_t restarts,
                      const struct mg_rdzv_desc *d, int nd, struct rdzv_close_hdr *hout);
/* Deletes what is left of an old round (best effort). */
void rdzv_forget_round(struct mg_rdzv *r, int64_t round);
/* Member i (rank order) of the last formed round into *m, its block read
 * from the backend when not held yet. 0, or < 0 (r->msg says why). */
int rdzv_member(struct mg_rdzv *r, int i, const struct mg_rdzv_desc **m);
/* Drops the members held. */
void rdzv_roster_free(struct mg_rdzv *r);

/* ---- membership and waiting (rdzv_proto.c) ------------------------------------- */

/* A free port for MASTER_PORT, held until the workers start. */
int rdzv_reserve_port(struct mg_rdzv *r);
/* Writes NS/a/ID, this agent's ephemeral key: it is alive. */
int rdzv_publish_alive(struct mg_rdzv *r);
/* Keeps this agent's lease alive while it waits (joining, in the barrier). */
int rdzv_heartbeat_due(struct mg_rdzv *r);
/* ms from a round's forming to this node's first heartbeat in it, at random
 * within the interval (mg_rdzv_first_tick_ms). */
int64_t rdzv_first_tick(const struct mg_rdzv *r);
/* Lists NS/a/ (keys only): the live agents; *skip is the prefix length. */
int rdzv_list_alive(struct mg_rdzv *r, struct mg_kv_entry **e, int *n, size_t *skip);
/* Whether a listed key ends in id after the first skip bytes. */
int rdzv_in_list(const struct mg_kv_entry *e, int n, size_t skip, const char *id);

/* The earlier of two deadlines, where a negative one is none. */
int64_t rdzv_earlier(int64_t a, int64_t b);
int64_t rdzv_later(int64_t a, int64_t b);
/* The end of a step that found nothing to do: waits, at most max_block ms
 * and not past the step's deadlines, for key to change after since_rev
 * (0: to exist), and notes when the next step is due without a change; the
 * backend may keep the wait parked until those deadlines for the next step
 * to take up. *val (optional; NULL when absent or not read) is the key's
 * value on a change. 1 when it changed, 0 when not, < 0. */
int rdzv_wait_change(struct mg_rdzv *r, const char *k, int64_t since_rev, int64_t deadline,
                     int64_t other, int max_block, const char *what, char **val, size_t *len);

#endif
