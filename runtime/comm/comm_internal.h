/* Internal pieces of the CPU communication backend: the shared-memory group
 * of the ranks on one host (comm_shm.c), the pipelined TCP ring between hosts
 * (comm_ring.c), and how they report what went wrong (a fault naming the peer,
 * which comm_cpu.c turns into the user-facing message). Not a public API. */
#ifndef MG_COMM_INTERNAL_H
#define MG_COMM_INTERNAL_H

#include "comm.h"

#include <stddef.h>
#include <stdint.h>

/* What a collective is, as every rank must agree on it. Exchanged at the start
 * of each operation, so a rank that calls something else is caught at once. */
enum mg_opkind {
    MG_OP_NONE,
    MG_OP_ALLREDUCE_SUM,
    MG_OP_ALLREDUCE_AVG,
    MG_OP_BROADCAST,
    MG_OP_ALLGATHER,
    MG_OP_BARRIER,
    MG_OP_SETUP,
    MG_OP_REGISTER, /* mg_comm_mem_alloc: len = bytes per rank */
    MG_OP_REDUCE_SCATTER_SUM,
    MG_OP_REDUCE_SCATTER_AVG,
    MG_OP_SHIFT, /* root = k */
};

struct mg_opdesc {
    uint32_t kind; /* enum mg_opkind */
    int32_t root;  /* broadcast root (global rank), shift's k, else -1 */
    uint64_t len;  /* bytes (allreduce: 4 * floats; allgather, reduce-scatter: per rank) */
};

/* "allreduce of 4096 floats", "broadcast of 12 bytes from rank 0", ... */
void mg_opdesc_text(const struct mg_opdesc *d, char *buf, size_t len);
int mg_opdesc_equal(const struct mg_opdesc *a, const struct mg_opdesc *b);

enum mg_fault_kind {
    MG_FAULT_NONE,
    MG_FAULT_TIMEOUT,  /* waited past the deadline for peer */
    MG_FAULT_DIED,     /* peer's process exited (shared memory: pid check) */
    MG_FAULT_CLOSED,   /* peer closed its connection */
    MG_FAULT_IO,       /* a socket error talking to peer (err) */
    MG_FAULT_MISMATCH, /* peer called a different collective (theirs) */
    MG_FAULT_LOCAL,    /* a local failure (err), e.g. out of memory */
    MG_FAULT_ABORTED,  /* another rank of this host gave up (origin, orig_kind, peer) */
};

struct mg_fault {
    int kind;                /* enum mg_fault_kind */
    int peer;                /* global rank */
    int pid;                 /* peer's pid where known, else 0 */
    int err;                 /* negative code for MG_FAULT_IO / MG_FAULT_LOCAL */
    struct mg_opdesc theirs; /* MG_FAULT_MISMATCH */
    int origin;              /* MG_FAULT_ABORTED: the rank that gave up */
    int orig_kind;           /* MG_FAULT_ABORTED: its fault's kind */
};

/* Page-aligned zero-filled memory from malloc (free() it): mem_alloc's
 * fallback. NULL when out of memory. */
void *mg_comm_plain_alloc(size_t bytes);

/* The code a fault makes the collective return. */
int mg_fault_code(const struct mg_fault *f);

/* ---- shared memory group (the ranks of one host) ----------------------------- */

struct mg_shm;

struct mg_shm_cfg {
    int nlocal;        /* ranks in the group, 1..MG_SHM_MAX_LOCAL */
    int local_rank;    /* this rank's index in the group */
    const int *ranks;  /* global rank of each local index (for messages) */
    size_t small_max;  /* largest message sent in one flag round (0 = default) */
    size_t step_bytes; /* per-rank staging per pipeline step (0 = default) */
    int nslots;        /* pipeline depth (0 = default) */
    int spin_us;       /* spin before sleeping on a futex (-1 = mg_shm_default_spin_us) */
    size_t zc_min;     /* smallest allreduce (bytes) done in place in registered memory
                          (0 = default: the messages above small_max) */
};

#define MG_SHM_MAX_LOCAL 256
#define MG_SHM_MAX_REGS  16 /* registrations per group (mg_shm_mem_alloc) */

/* The leader (local rank 0) creates the segment; the others attach to it
 * once the leader has published where it is. Both check the nonce. With a
 * name the segment is a /dev/shm file (someone must unlink it); with name
 * NULL it is a memfd, which has no name at all and goes with the last process
 * that holds it: the others open the leader's descriptor (mg_shm_fd) through
 * /proc/<pid>/fd/<fd> and attach with mg_shm_attach_fd, which takes fd over
 * (closing it on failure). */
int mg_shm_create(struct mg_shm **out, const char *name, uint64_t nonce,
                  const struct mg_shm_cfg *cfg);
int mg_shm_attach(struct mg_shm **out, const char *name, uint64_t nonce,
                  const struct mg_shm_cfg *cfg);
int mg_shm_attach_fd(struct mg_shm **out, int fd, uint64_t nonce, const struct mg_shm_cfg *cfg);
int mg_shm_fd(const struct mg_shm *g);
/* Waits until every member attached (then the leader may unlink the name). */
int mg_shm_wait_attached(struct mg_shm *g, int64_t deadline_ms, struct mg_fault *f);
int mg_shm_unlink(const char *name);
/* Microseconds a wait spins by default: 1000 when the nlocal ranks have a CPU
 * each (by this process's affinity mask), else 50. */
int mg_shm_default_spin_us(int nlocal);
/* Marks the group failed (the first call wins) and wakes every waiter: the
 * other local ranks then fail at once, naming f's peer. */
void mg_shm_abort(struct mg_shm *g, const struct mg_fault *f);
void mg_shm_release(struct mg_shm *g);
size_t mg_shm_segment_bytes(const struct mg_shm *g);

/* Registered memory (a collective over the group: every local rank calls it in
 * the same order with the same size). The segment grows by one block of
 * `bytes` per local rank, which every rank maps: an allreduce whose buffer is
 * at the same offset of the same registration on every rank reads the peers'
 * buffers in place and writes each sum into all of them (zero-copy). *out is
 * this rank's block (zero-filled, page-aligned), or NULL when the segment
 * cannot grow or be mapped (the caller then uses ordinary memory). */
int mg_shm_mem_alloc(struct mg_shm *g, size_t bytes, void **out, const struct mg_opdesc *d,
                     int64_t deadline_ms, struct mg_fault *f);
/* Unmaps p's registration (local, no communication) and returns 1, or returns
 * 0 when p is not the start of one. */
int mg_shm_mem_free(struct mg_shm *g, void *p);
/* Allreduces done in place in registered memory so far. */
uint64_t mg_shm_zerocopy_count(const struct mg_shm *g);

/* divide_by > 1 divides each sum once, by the rank that computed it. */
int mg_shm_allreduce(struct mg_shm *g, float *buf, size_t count, int divide_by,
                     const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f);
/* The sums in root_local's buf only (the others' buf is left with partial sums). */
int mg_shm_reduce(struct mg_shm *g, float *buf, size_t count, int root_local,
                  const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f);
int mg_shm_broadcast(struct mg_shm *g, void *buf, size_t len, int root_local,
                     const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f);
/* send holds nlocal chunks of count floats; recv gets chunk local_rank summed
 * in rank order (divided by divide_by when > 1): the bits mg_shm_allreduce
 * gives those elements. recv may be this rank's chunk of send. Buffers
 * registered at the same offset on every rank are read in place. */
int mg_shm_reduce_scatter(struct mg_shm *g, const float *send, float *recv, size_t count,
                          int divide_by, const struct mg_opdesc *d, int64_t deadline_ms,
                          struct mg_fault *f);
/* recv holds nlocal blocks of len bytes, in local-rank order. */
int mg_shm_allgather(struct mg_shm *g, const void *send, void *recv, size_t len,
                     const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f);
int mg_shm_barrier(struct mg_shm *g, const struct mg_opdesc *d, int64_t deadline_ms,
                   struct mg_fault *f);

/* A range of a peer's published block, and where it goes. */
struct mg_shm_pick {
    int from; /* local index of the publisher (not this rank) */
    size_t off, len;
    void *dst;
};
/* Every rank publishes plen bytes of pub (the same plen on every rank; pub
 * NULL: nothing that anyone picks) and copies its picks out of the others'
 * publications: a shift is one pick each, a gather to one rank that rank's
 * picks of every other, a scatter each rank's pick of its range of one. */
int mg_shm_pick(struct mg_shm *g, const void *pub, size_t plen, const struct mg_shm_pick *picks,
                int npicks, const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f);

/* ---- TCP ring (one rank per host, or every rank with MG_COMM=tcp) ------------ */

struct mg_ring;

#define MG_RING_DEFAULT_SEGMENT (256u << 10)

/* n members; idx is this one's position; ranks[i] the global rank of member i.
 * next_fd is connected to member idx+1, prev_fd to member idx-1 (both blocking
 * or not; the ring makes them non-blocking). The ring owns the fds. */
int mg_ring_create(struct mg_ring **out, int n, int idx, const int *ranks, int next_fd, int prev_fd,
                   size_t segment_bytes);
void mg_ring_release(struct mg_ring *r);
/* Shuts both connections down so the neighbours fail at once, not at their timeout. */
void mg_ring_abort(struct mg_ring *r);

int mg_ring_allreduce(struct mg_ring *r, float *buf, size_t count, int divide_by,
                      const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f);
/* buf holds n chunks of count floats (overwritten with partial sums); out
 * gets chunk idx, summed as mg_ring_allreduce sums it when its chunks are
 * these (mg_split_chunks(n * count, n) falls on multiples of count). */
int mg_ring_reduce_scatter(struct mg_ring *r, float *buf, size_t count, float *out, int divide_by,
                           const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f);
int mg_ring_broadcast(struct mg_ring *r, void *buf, size_t len, int root_idx,
                      const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f);
/* buf holds member blocks of lens[i] bytes back to back, in ring order; this
 * member's block is already in place. */
int mg_ring_allgatherv(struct mg_ring *r, void *buf, const size_t *lens, const struct mg_opdesc *d,
                       int64_t deadline_ms, struct mg_fault *f);
int mg_ring_barrier(struct mg_ring *r, const struct mg_opdesc *d, int64_t deadline_ms,
                    struct mg_fault *f);
/* Data passed on around the ring in rounds (a shift's blocks, each to a
 * member some hops on): round 0 sends slen[0] bytes of bufs[0] to the next
 * member; round t (1..rounds) receives rlen[t] bytes from the previous one
 * into bufs[t] and, below rounds, sends the first slen[t] of them on, as
 * they arrive. slen[t] <= rlen[t]; rounds < the ring's size. */
int mg_ring_relay(struct mg_ring *r, int rounds, char *const *bufs, const size_t *slen,
                  const size_t *rlen, const struct mg_opdesc *d, int64_t deadline_ms,
                  struct mg_fault *f);

/* ---- the CPU communicator from its pieces -------------------------------------- */

struct mg_cpu_parts {
    int rank, world;
    const int *host_of;   /* [world]: host of each rank, numbered by first appearance */
    int all_ring;         /* MG_COMM=tcp: one ring over every rank */
    struct mg_shm *shm;   /* this host's group, when it has several ranks (not all_ring) */
    struct mg_ring *ring; /* every rank (all_ring or one rank per host), else host leaders */
    int timeout_ms;       /* the default collective timeout */
    int no_zerocopy;      /* mem_alloc gives ordinary memory */
};

enum mg_cpu_layout {
    L_SHM,  /* one host */
    L_RING, /* every rank in the ring */
    L_HIER, /* shm per host + ring of leaders */
};

struct cpu_comm {
    struct mg_comm base;
    enum mg_cpu_layout layout;
    struct mg_shm *shm;   /* NULL when alone on the host (or L_RING) */
    struct mg_ring *ring; /* NULL unless this rank is a ring member */
    int host;             /* my host index; hosts ordered by their lowest rank */
    int no_zerocopy;
    int *host_of;    /* [world] */
    int *local_of;   /* [world] index within its host */
    int *host_start; /* [nhosts + 1] into members */
    int *members;    /* [world] ranks grouped by host, ascending within */
};

/* Records the fault as the communicator's message; the communicator is broken. */
int mg_cpu_fail(struct cpu_comm *cc, const struct mg_opdesc *d, const struct mg_fault *f,
                int timeout_ms);
/* The deadline of a collective that may take timeout_ms (-1: none). */
int64_t mg_cpu_deadline(int timeout_ms);
/* The shift (comm_cpu_shift.c): see struct mg_comm_ops. */
int mg_cpu_shift(struct mg_comm *c, const void *send, void *recv, size_t len, int k,
                 int timeout_ms);

/* Takes ownership of shm and ring on success only. -EINVAL when the pieces do
 * not fit the layout. */
int mg_comm_cpu_assemble(struct mg_comm **out, const struct mg_cpu_parts *p);
/* A barrier that names itself "communicator setup" in messages. */
int mg_comm_cpu_check(struct mg_comm *c, int timeout_ms);

/* ---- the reduction kernel shared by both ------------------------------------- */

/* out1[i] (and out2[i] when out2 is not NULL) = (((src[0][i] + src[1][i]) +
 * src[2][i]) + ...) / divide_by, for i < n. The order of the sum is src's order;
 * the outputs may be among the sources. */
void mg_reduce_f32(float *out1, float *out2, const float *const *src, int nsrc, size_t n,
                   int divide_by);
/* The same sum written to each of out[0..nout). */
void mg_reduce_f32n(float *const *out, int nout, const float *const *src, int nsrc, size_t n,
                    int divide_by);

/* Splits count floats into n chunks whose boundaries fall on 64-byte multiples
 * (all but the last ones may be empty for tiny counts). off has n + 1 entries. */
void mg_split_chunks(size_t count, int n, size_t *off);

#endif
