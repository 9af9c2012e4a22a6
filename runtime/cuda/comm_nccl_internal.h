/* What the NCCL communicator's two files share: its state, and the watch
 * over a collective that comm_nccl_watch.c keeps (the store's news of the
 * other ranks, NCCL's errors, the deadline, the broken state) for the
 * collectives and the bootstrap of comm_nccl.c. */
#ifndef MG_COMM_NCCL_INTERNAL_H
#define MG_COMM_NCCL_INTERNAL_H

#include "cuda_internal.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <nccl.h>
#include <stdint.h>
#include <time.h>

#define MAX_REGS   64
#define MAX_QUEUED 64 /* collectives queued and not yet waited for (allreduce_queue) */

struct reg {
    void *user, *base, *handle;
    int nccl_mem; /* from ncclMemAlloc, else cudaMalloc */
};

struct nccl_comm {
    struct mg_comm c;
    ncclComm_t nc;
    int device;
    cudaStream_t stream;
    cudaStream_t wait_on; /* the compute stream collectives follow */
    cudaEvent_t order;
    cudaEvent_t pending; /* from wait_event: the next collective follows it instead */
    float *zero;         /* the barrier's one float */
    /* allreduce_queue: an event after each queued collective, and what it was */
    cudaEvent_t qev[MAX_QUEUED];
    char qwhat[MAX_QUEUED][96];
    int nq;
    struct mg_store *store;
    char prefix[200];
    struct reg regs[MAX_REGS];
};

struct waiter {
    int64_t start, deadline, next_look;
    long spins;
    int timeout_ms;
};

/* The monotonic clock, in ms; a nap. */
static inline int64_t mgcu_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void mgcu_nap_us(long us)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = us * 1000};
    nanosleep(&ts, NULL);
}

/* "timed out", or the code's text. */
static inline const char *mgcu_nccl_why(int rc)
{
    return rc == -ETIMEDOUT ? "timed out" : mgcu_host->strerror(rc);
}

/* The store key prefix+what(/rank when rank >= 0). */
void mgcu_nccl_key(const struct nccl_comm *n, char *buf, size_t len, const char *what, int rank);
/* "NCCL error 'unhandled cuda error ...' (ncclUnhandledCudaError): <last error>" */
void mgcu_nccl_text(ncclResult_t r, ncclComm_t nc, char *buf, size_t len);
/* The communicator is broken from now on: abort NCCL, keep the message, tell
 * the others through the store. Returns code. */
__attribute__((format(printf, 3, 4))) int mgcu_nccl_broken(struct nccl_comm *n, int code,
                                                           const char *fmt, ...);
/* A wait of timeout_ms from now. */
void mgcu_nccl_wait_begin(struct waiter *w, int timeout_ms);
/* Between two polls: spins, then naps. Past the deadline -ETIMEDOUT, and
 * when the store says a rank failed or died -MG_EPEER, with the end of the
 * message in out; else 0. */
int mgcu_nccl_wait_tick(struct nccl_comm *n, struct waiter *w, char *out, size_t len);
/* Waits until the non-blocking communicator has taken the call, then queues
 * the AVG divide (of avg_count floats at avg, when avg) behind it. */
int mgcu_nccl_taken(struct nccl_comm *n, const char *what, struct waiter *wt, ncclResult_t issued,
                    float *avg, size_t avg_count);
/* Waits until the device has done the stream's work up to ev (everything
 * queued so far when ev is NULL). */
int mgcu_nccl_drained(struct nccl_comm *n, const char *what, struct waiter *wt, cudaEvent_t ev);
/* A collective, waited for: taken, then done on the device. */
int mgcu_nccl_finish(struct nccl_comm *n, const char *what, int timeout_ms, ncclResult_t issued,
                     float *avg, size_t avg_count);
/* Before a collective: this thread on the communicator's device, and the
 * stream behind the compute work it needs (comm.h). */
int mgcu_nccl_prepare(struct nccl_comm *n, const char *what);

#endif
