/* The communication interface of libmg: collectives between the ranks of a
 * job, behind a small struct of function pointers chosen once at startup.
 *
 * Backends, one of which mg_comm_create() picks: the CPU backend (comm_cpu.c,
 * set up by comm_cpu_boot.c: shared memory between the ranks of a host, a
 * pipelined TCP ring between hosts, hierarchical when a job has both) and
 * NCCL (mg_comm_nccl_create: runtime/cuda/comm_nccl.c in the CUDA plugin; its
 * buffers are device memory). The world-size-1 backend (comm_single.c) does
 * nothing, quickly.
 *
 * Contract for every backend:
 * - Every rank calls the same collectives in the same order with the same
 *   sizes (and root). A mismatch is detected where the backend can (the CPU
 *   backend always does) and fails with MG_EPROTO.
 * - The reduction order is fixed for a given world size and placement of ranks
 *   on hosts: all ranks receive identical bits and a rerun repeats exactly.
 * - Every call takes a timeout in milliseconds (MG_COMM_DEFAULT_TIMEOUT = the
 *   communicator's default, MG_COMM_TIMEOUT or 300 s). A peer that dies or
 *   stops answering gives an error, never a hang: -ETIMEDOUT (hung peer) or
 *   -MG_EPEER (dead peer, closed connection), and mg_comm_errmsg() says which
 *   rank was waited for, during which operation, e.g.
 *   "allreduce of 4096 floats: timed out after 30 s waiting for rank 1".
 * - After an error the communicator is broken: every later call fails at once
 *   with the same message. The job is expected to exit and be restarted.
 * - A communicator is used by one thread at a time (DDP's communication thread,
 *   or the main thread while that one is idle).
 * - Buffers may be anywhere in memory; allreduce works in place, and so may
 *   allgather and reduce-scatter (this rank's block of the whole buffer).
 * - Memory from mem_alloc (registered memory, like NCCL's user buffer
 *   registration) may make collectives on it faster: the CPU backend then sums
 *   the ranks' buffers in place, without staging copies (zero-copy). Any
 *   buffer gives the same bits; registration is only about speed.
 *
 * Device buffers and overlap (NCCL). A collective runs on the communicator's
 * own CUDA stream and returns once it has finished on the device, so the host
 * thread that called it (DDP's communication thread) waits and can time out,
 * while the compute stream goes on. Before it starts, the device waits for
 * the work it depends on: by default everything queued so far on
 * opts->stream (the backend's compute stream); after wait_event(c, ev), only
 * what was queued before the backend recorded ev (mg_backend_event_record).
 * That is how DDP will send a bucket as soon as backward has queued its
 * layers, without blocking the host: in the `ready` callback the main thread
 * records an event and hands (bucket, event) to the communication thread,
 * which calls mg_comm_wait_event() and then mg_comm_allreduce() on it; the
 * optimizer, queued after the communication thread reports the bucket done,
 * reads finished sums (ddp.c does this). */
#ifndef MG_COMM_H
#define MG_COMM_H

#include "mg_config.h"
#include "mg_err.h"

#include <stddef.h>
#include <stdint.h>

struct mg_store;

#define MG_COMM_DEFAULT_TIMEOUT (-1)
/* What that default is when nothing sets it (MG_COMM_TIMEOUT, opts). */
#define MG_COMM_TIMEOUT_DEFAULT_MS (300 * 1000)

enum mg_reduce_op {
    MG_REDUCE_SUM,
    MG_REDUCE_AVG, /* sum, then divided by the world size (once, by one rank) */
};

/* Which communicator, and how the CPU one connects ranks (MG_COMM=auto|cpu|shm|tcp|nccl). */
enum mg_comm_mode {
    MG_COMM_AUTO, /* NCCL when the ranks compute on CUDA, else the CPU backend's layout */
    MG_COMM_SHM,  /* CPU, shared memory only: every rank must be on one host */
    MG_COMM_TCP,  /* CPU, one TCP ring over all ranks, even on one host */
    MG_COMM_CPU,  /* CPU: shm within a host, tcp between hosts, hierarchical for both */
    MG_COMM_NCCL, /* NCCL (the CUDA plugin) */
};

struct mg_comm;

struct mg_comm_ops {
    const char *name;
    /* buf[0..count) summed (or averaged) over all ranks, in place. */
    int (*allreduce)(struct mg_comm *c, float *buf, size_t count, enum mg_reduce_op op,
                     int timeout_ms);
    /* len bytes of root's buf copied to every rank's buf. */
    int (*broadcast)(struct mg_comm *c, void *buf, size_t len, int root, int timeout_ms);
    /* Every rank's len bytes of send land at recv + rank * len, on every rank.
     * send may be recv + rank * len (in place). */
    int (*allgather)(struct mg_comm *c, const void *send, void *recv, size_t len, int timeout_ms);
    /* Optional (NULL: mg_comm_reduce_scatter says -MG_EUNSUPPORTED).
     * send holds world * recv_count floats; rank r receives the sum (or
     * average) over the ranks of chunk r, send[r * recv_count, (r + 1) *
     * recv_count): the same bits an allreduce of send would leave there. recv
     * may be send + rank * recv_count (in place); otherwise the two do not
     * overlap. Nothing else of send changes. */
    int (*reduce_scatter)(struct mg_comm *c, const float *send, float *recv, size_t recv_count,
                          enum mg_reduce_op op, int timeout_ms);
    /* Optional (NULL: mg_comm_shift says -MG_EUNSUPPORTED; NCCL has none, and
     * its callers use allgather instead). A ring shift: every rank's len
     * bytes of send land in the recv of rank (rank + k) mod world, so each
     * rank receives those of rank (rank - k) mod world; 0 < k < world, len
     * the same on every rank (checked, as a collective's size is). Only what
     * the shift moves crosses hosts: one block per rank, relayed over the
     * TCP ring where it has no direct link. send and recv do not overlap. */
    int (*shift)(struct mg_comm *c, const void *send, void *recv, size_t len, int k,
                 int timeout_ms);
    /* Returns once every rank has entered the barrier. */
    int (*barrier)(struct mg_comm *c, int timeout_ms);
    void (*release)(struct mg_comm *c);
    /* bytes of zero-filled memory, aligned to 4096, for buffers of later
     * collectives: host memory that the ranks of a host share (CPU backend),
     * device memory (NCCL). A collective: every rank calls it in the same order
     * with the same size. When the backend has no such memory left it returns
     * ordinary memory, which works as well, only slower. */
    int (*mem_alloc)(struct mg_comm *c, size_t bytes, void **out, int timeout_ms);
    /* Local: no other rank takes part. */
    void (*mem_free)(struct mg_comm *c, void *p);
    /* Optional (NULL: nothing to order, as on the CPU). The next collective
     * starts on the device once the work recorded by event (a backend's
     * event_record) is done, instead of all the work queued on opts->stream.
     * Local and quick: the host never waits here. */
    int (*wait_event)(struct mg_comm *c, void *event);
    /* Optional (NULL: mg_comm_allreduce_queue is allreduce, which waits).
     * allreduce, but it returns once the collective is queued on the device
     * (after wait_event's event, or the stream, as allreduce) instead of once
     * it is done, so the next one queues at once behind it, in call order.
     * buf must stay untouched until wait_queued (or any other collective,
     * which comes after them) returns. */
    int (*allreduce_queue)(struct mg_comm *c, float *buf, size_t count, enum mg_reduce_op op,
                           int timeout_ms);
    /* Waits until the collectives queued so far are done on the device,
     * against one deadline, naming the first unfinished one when it fails. */
    int (*wait_queued)(struct mg_comm *c, int timeout_ms);
};

/* Fields common to every backend; a backend embeds this first. */
struct mg_comm {
    const struct mg_comm_ops *ops;
    int rank, world;
    int local_rank, local_world; /* within this host, as the backend sees it */
    int nhosts;
    int timeout_ms;   /* the default for MG_COMM_DEFAULT_TIMEOUT */
    int rank_ordered; /* sums are taken in rank order (one host, shared memory) */
    int failed;       /* an error happened: every later call fails */
    int failed_code;
    uint64_t zerocopy; /* allreduces done in place in registered memory so far */
    char desc[96];     /* e.g. "cpu: shm (2 ranks on 1 host)" */
    char errmsg[MG_ERRMSG_LEN];
    /* Collectives take device memory only (NCCL): host data must be staged. */
    int device_memory;
};

/* Options for creating a communicator. Zero-initialized fields take defaults. */
struct mg_comm_opts {
    int rank, world;
    enum mg_comm_mode mode;
    int timeout_ms;      /* default collective timeout (0 = MG_COMM_TIMEOUT or 300 s) */
    int init_timeout_ms; /* bootstrap through the store (0 = the collective default) */
    const char *run_id;  /* for naming the shared memory segment (readability only) */
    int restart_count;
    const char *host_id;   /* NULL = this host's identity (boot id + namespaces);
                               MG_COMM_HOST overrides it, to simulate hosts in tests */
    const char *advertise; /* NULL = MG_COMM_ADDR, else the local address of the store
                               connection: where peers on other hosts reach this rank */
    int spin_us;           /* shared memory: spin before sleeping (0 = default: 1000 when the
                              host's ranks have a CPU each, else 50; -1 = none) */
    size_t tcp_segment;    /* TCP ring pipeline segment in bytes (0 = default 256 KiB) */
    int no_zerocopy;       /* mem_alloc returns ordinary memory (MG_COMM_ZEROCOPY=0) */
    int on_cuda;           /* the ranks compute on CUDA: MG_COMM_AUTO means NCCL */
    int device_index;      /* NCCL: the CUDA device of this rank (LOCAL_RANK within the
                              CUDA_VISIBLE_DEVICES mglaunch sets); -1 = the calling
                              thread's current device, set by the caller */
    void *stream;          /* NCCL: the compute stream (mg_backend.stream) collectives
                              wait for; NULL = the legacy default stream */
    /* Optional: a wait for a peer during the setup that lasts more than
     * MG_COMM_PROGRESS_FIRST_MS is told here (which rank, for how long), and
     * again every MG_COMM_PROGRESS_EVERY_MS, for the program to print. */
    void (*progress)(void *ctx, const char *msg);
    void *progress_ctx;
};

#define MG_COMM_PROGRESS_FIRST_MS 5000
#define MG_COMM_PROGRESS_EVERY_MS 30000

/* The default options from the environment: MG_COMM, MG_COMM_TIMEOUT and
 * MG_COMM_INIT_TIMEOUT (seconds, may be fractional), MG_COMM_HOST,
 * MG_COMM_ADDR, MG_COMM_SPIN_US, MG_COMM_TCP_SEGMENT, MG_COMM_ZEROCOPY. On a
 * bad value returns -EINVAL and writes a message naming the variable into err. */
int mg_comm_opts_from_env(struct mg_comm_opts *opts, char *err, size_t errlen);

/* The communicator opts->mode asks for (MG_COMM_AUTO: NCCL when opts->on_cuda,
 * else the CPU backend). Every rank calls this at the same time, through the
 * same store. On failure returns a negative code and a message in err. */
int mg_comm_create(struct mg_comm **out, struct mg_store *store, const struct mg_comm_opts *opts,
                   char *err, size_t errlen);

/* The CPU backend. Every rank calls this at the same time; they find each other
 * through the store (which must be shared by exactly this job's ranks and
 * outlive the call). On failure returns a negative code and a message in err. */
int mg_comm_cpu_create(struct mg_comm **out, struct mg_store *store,
                       const struct mg_comm_opts *opts, char *err, size_t errlen);

/* NCCL, from the CUDA plugin (runtime/gpu_plugin.c loads it; -MG_EUNSUPPORTED
 * in a build without one). Every rank calls it at the same time. Rank 0 makes
 * NCCL's unique id and publishes it in the store under a key scoped to
 * opts->run_id and opts->restart_count, so a restarted group never reads the
 * id of the attempt before; the others wait for it (opts->init_timeout_ms).
 * Each rank then starts NCCL on device opts->device_index (non-blocking
 * init, polled against the same deadline). A rank that fails says so in the
 * store, and the others stop waiting and name it. Collectives are polled
 * against their deadline: on a timeout, NCCL's asynchronous error, or a rank
 * whose store connection closed (its process died), the communicator is
 * aborted and broken, and its message names the operation and, through the
 * store, the rank that failed or was waited for. */
int mg_comm_nccl_create(struct mg_comm **out, struct mg_store *store,
                        const struct mg_comm_opts *opts, char *err, size_t errlen);

/* World size 1 (comm_single.c): every collective is a no-op (with the same
 * argument checks). */
int mg_comm_single_create(struct mg_comm **out);

/* Convenience wrappers; they check arguments and the broken state. */
int mg_comm_allreduce(struct mg_comm *c, float *buf, size_t count, enum mg_reduce_op op,
                      int timeout_ms);
int mg_comm_broadcast(struct mg_comm *c, void *buf, size_t len, int root, int timeout_ms);
int mg_comm_allgather(struct mg_comm *c, const void *send, void *recv, size_t len, int timeout_ms);
/* -EINVAL for recv overlapping send other than in place; -MG_EUNSUPPORTED
 * from a backend without it. */
int mg_comm_reduce_scatter(struct mg_comm *c, const float *send, float *recv, size_t recv_count,
                           enum mg_reduce_op op, int timeout_ms);
/* k is taken mod world (a negative k shifts the other way); a shift by 0
 * copies send to recv on every rank without communication. -EINVAL for
 * overlapping buffers; -MG_EUNSUPPORTED from a backend without shift. */
int mg_comm_shift(struct mg_comm *c, const void *send, void *recv, size_t len, int k,
                  int timeout_ms);
/* Whether the communicator has a shift (mg_comm_shift, not -MG_EUNSUPPORTED). */
int mg_comm_has_shift(const struct mg_comm *c);
int mg_comm_barrier(struct mg_comm *c, int timeout_ms);
/* allreduce_queue, or allreduce where the backend has none (then it is done
 * when this returns); wait_queued (0 at once without one). */
int mg_comm_allreduce_queue(struct mg_comm *c, float *buf, size_t count, enum mg_reduce_op op,
                            int timeout_ms);
int mg_comm_wait_queued(struct mg_comm *c, int timeout_ms);
/* 0 at once when the communicator has no wait_event or event is NULL. */
int mg_comm_wait_event(struct mg_comm *c, void *event);
void mg_comm_release(struct mg_comm *c);
/* Registered memory (see mem_alloc): 0 and *out, or a negative code (a failed
 * collective, -EINVAL for 0 bytes, -ENOMEM). Free it with mg_comm_mem_free()
 * before releasing the communicator. */
int mg_comm_mem_alloc(struct mg_comm *c, size_t bytes, void **out, int timeout_ms);
void mg_comm_mem_free(struct mg_comm *c, void *p);

/* The message of the last error ("" when none). */
const char *mg_comm_errmsg(const struct mg_comm *c);

/* Parses MG_COMM-style text ("auto", "shm", "tcp"). */
int mg_comm_mode_parse(const char *text, enum mg_comm_mode *mode);
const char *mg_comm_mode_name(enum mg_comm_mode mode);

#endif
