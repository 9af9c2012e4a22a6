/* What the two files of the host's shared-memory group share: the segment's
 * per-rank control block, its slots, the group's state, and the waits and
 * rounds every operation is built from (comm_shm.c sets up the segment and
 * runs the rounds; comm_shm_coll.c lays the collectives out on them). */
#ifndef MG_COMM_SHM_INTERNAL_H
#define MG_COMM_SHM_INTERNAL_H

#include "comm_internal.h"

#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#define LINE      128 /* two cache lines: adjacent-line prefetch never shares */
#define SMALL_HDR 128 /* opdesc (and a zc_tag at TAG_OFF) in front of each small slot */
#define TAG_OFF   64

struct shm_counter {
    _Atomic uint32_t val;
    _Atomic uint32_t waiters;
    char pad[LINE - 8];
};

struct shm_rankctl {
    struct shm_counter round;    /* flag rounds completed */
    struct shm_counter posted;   /* pipeline steps copied into my slots */
    struct shm_counter reduced;  /* pipeline steps whose sums I wrote */
    struct shm_counter consumed; /* pipeline steps I copied out of the others' slots */
    struct shm_counter attached;
    _Atomic int32_t pid;
    char pad[LINE - 4];
};

/* One registration: a block of `stride` bytes per rank, mapped at map. */
struct shm_reg {
    char *map; /* NULL: unmapped (freed, or this rank could not map it) */
    size_t stride, bytes;
};

/* Where an allreduce's buffer is in registered memory, as published in the
 * flag round: every rank must report the same for the zero-copy path. */
struct zc_tag {
    uint32_t reg; /* registration index + 1; 0 = not registered */
    uint32_t pad;
    uint64_t off; /* bytes from the start of this rank's block */
};

struct mg_shm {
    char *base;
    size_t total;
    int fd;           /* the segment, kept open to grow it for registrations */
    size_t file_size; /* bytes, the same on every rank */
    struct shm_reg regs[MG_SHM_MAX_REGS];
    int nregs; /* registrations made, the same on every rank */
    uint64_t nzc;
    int n, me;
    int ranks[MG_SHM_MAX_LOCAL];
    int pidfd[MG_SHM_MAX_LOCAL];
    int pid[MG_SHM_MAX_LOCAL];
    struct shm_rankctl *ctl;
    char *data;
    size_t small_max, step_bytes, stride, zc_min;
    int nslots;
    int spin_us;
    uint32_t round; /* rounds done, same on every rank */
    uint32_t steps; /* pipeline steps done, same on every rank */
};

static inline char *small_slot(const struct mg_shm *g, int q, uint32_t parity)
{
    return g->data + (size_t)q * g->stride + (parity & 1) * (SMALL_HDR + g->small_max);
}

static inline char *large_slot(const struct mg_shm *g, int q, uint32_t step)
{
    return g->data + (size_t)q * g->stride + 2 * (SMALL_HDR + g->small_max) +
           (size_t)(step % (uint32_t)g->nslots) * g->step_bytes;
}

static inline void post(struct shm_counter *c, uint32_t v)
{
    atomic_store(&c->val, v);
    if (atomic_load(&c->waiters))
        syscall(SYS_futex, &c->val, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

/* Waits until q's counter c reaches target: spinning, then on the futex;
 * a dead peer, an abort or the deadline end it with f set. */
int mg_shm_wait(struct mg_shm *g, int q, struct shm_counter *c, uint32_t target,
                int64_t deadline_ms, struct mg_fault *f);
/* The flag round: publishes d (and len bytes of data, len <= small_max) in
 * this round's slot, then waits for every other rank to do the same and
 * checks they agree. */
int mg_shm_round(struct mg_shm *g, const struct mg_opdesc *d, const void *data, size_t len,
                 int64_t deadline_ms, struct mg_fault *f);
/* Every rank's counters end each pipelined operation at the same step. */
void mg_shm_finish_steps(struct mg_shm *g, uint32_t end);
/* Before reusing slot (base + k): waits until every other rank is done with
 * the step that used it last (its sums too when need_reduced). */
int mg_shm_wait_slot_free(struct mg_shm *g, uint32_t base, uint32_t k, int need_reduced,
                          int64_t deadline_ms, struct mg_fault *f);

#endif
