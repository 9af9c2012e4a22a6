/* Collectives between the ranks of one host, through one shared memory segment.
 *
 * Every operation starts with a flag round: each rank writes what it is about
 * to do (and, for a small message, the data itself) into its half of a
 * double-buffered slot, bumps its round counter and waits for everyone else's.
 * A small allreduce is then finished by summing the peers' slots in rank order:
 * one round, no system call when the peers are running.
 *
 * Larger messages are pipelined in steps. The buffer is cut into one chunk per
 * rank; in step k each rank copies segment k of every other rank's chunk into
 * its own staging slot (A), sums segment k of its own chunk from everyone's
 * staging slots, in rank order, into its buffer and into its staging slot (R),
 * and copies the other ranks' finished segments out of their slots (C). The
 * slots are a few hundred KiB that stay in the caches, so memory traffic is
 * close to one read and one write of the buffer per rank, and each sum is
 * computed once, by one rank, and copied: every rank gets identical bits.
 *
 * Registered memory (mg_shm_mem_alloc) is a block per rank appended to the
 * segment (every rank keeps the segment's fd, so it can grow after the name is
 * gone, and maps the new blocks). An allreduce whose buffers sit at the same
 * offset of the same registration on every rank skips the staging slots: after
 * the flag round, rank r sums chunk r straight from every rank's buffer, in
 * rank order, and writes the sum into every rank's buffer; a second round says
 * that all chunks are written. Each rank then reads and writes its share of
 * the buffer once: a third of the memory traffic of staging, and two
 * synchronizations instead of one per pipeline step. Same sums, same bits.
 *
 * Waiting spins (peers on other cores answer within a microsecond), yielding
 * the core after the first 2 us so that a thread that has work (this
 * process's compute thread, or the peer we wait for) gets it at once, then
 * sleeps on a futex in the segment. How long it spins: when every rank of the
 * host has a CPU of its own, 1 ms, which covers the usual difference between
 * the ranks' steps (sleeping there costs a futex wake-up per step, tens of
 * microseconds on a virtual machine, and invites the scheduler to put both
 * ranks on one core); with more ranks than CPUs, 50 us, so that waiting ranks
 * leave the CPUs to the working ones. While sleeping it checks that the peer's
 * process is alive (a pidfd), so a dead peer is reported within ~50 ms, not
 * at the timeout. */
#include "comm_internal.h"
#include "mg_err.h"
#include "net.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SHM_MAGIC   0x31306d6d6f63676dULL /* "mgcomm01" */
#define SHM_VERSION 2
#define LINE        128 /* two cache lines: adjacent-line prefetch never shares */
#define SMALL_HDR   128 /* opdesc (and a zc_tag at TAG_OFF) in front of each small slot */
#define TAG_OFF     64
#define PAGE        4096

#define DEFAULT_SMALL_MAX  (64u << 10)
#define DEFAULT_STEP_BYTES (256u << 10)
#define DEFAULT_NSLOTS     4
#define SPIN_US_OWN_CPU    1000 /* every local rank has a CPU */
#define SPIN_US_SHARED_CPU 50   /* more local ranks than CPUs */
#define SLEEP_SLICE_MS     50
#define PURE_SPIN_US       2

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

struct shm_header {
    uint64_t magic;
    uint64_t nonce;
    uint32_t version, nlocal;
    uint64_t small_max, step_bytes, nslots, stride, total, zc_min;
    /* Set once by the first rank that gives up, so the others stop waiting at
     * once and report the same cause. */
    _Atomic uint32_t aborted;
    int32_t abort_kind, abort_peer, abort_pid, abort_origin;
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

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static size_t align_up(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

static char *small_slot(const struct mg_shm *g, int q, uint32_t parity)
{
    return g->data + (size_t)q * g->stride + (parity & 1) * (SMALL_HDR + g->small_max);
}

static char *large_slot(const struct mg_shm *g, int q, uint32_t step)
{
    return g->data + (size_t)q * g->stride + 2 * (SMALL_HDR + g->small_max) +
           (size_t)(step % (uint32_t)g->nslots) * g->step_bytes;
}

static inline int reached(uint32_t val, uint32_t target)
{
    return (int32_t)(val - target) >= 0;
}

static void post(struct shm_counter *c, uint32_t v)
{
    atomic_store(&c->val, v);
    if (atomic_load(&c->waiters))
        syscall(SYS_futex, &c->val, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

static int peer_alive(struct mg_shm *g, int q)
{
    if (g->pidfd[q] >= 0) {
        struct pollfd p = {.fd = g->pidfd[q], .events = POLLIN};
        return poll(&p, 1, 0) == 0;
    }
    if (g->pid[q] > 0)
        return !(kill(g->pid[q], 0) < 0 && errno == ESRCH);
    return 1;
}

static int aborted(struct mg_shm *g, struct mg_fault *f)
{
    struct shm_header *h = (struct shm_header *)g->base;
    /* 2 means the cause is still being written: not yet (wait_for keeps looping). */
    if (atomic_load_explicit(&h->aborted, memory_order_acquire) != 1)
        return 0;
    *f = (struct mg_fault){.kind = MG_FAULT_ABORTED,
                           .peer = h->abort_peer,
                           .pid = h->abort_pid,
                           .origin = h->abort_origin,
                           .orig_kind = h->abort_kind};
    return mg_fault_code(f);
}

void mg_shm_abort(struct mg_shm *g, const struct mg_fault *f)
{
    struct shm_header *h = (struct shm_header *)g->base;
    uint32_t zero = 0;
    if (!atomic_compare_exchange_strong(&h->aborted, &zero, 2)) /* 2: being written */
        return;
    /* A fault forwarded from elsewhere keeps its first cause. */
    h->abort_kind = f->kind == MG_FAULT_ABORTED ? f->orig_kind : f->kind;
    h->abort_peer = f->peer;
    h->abort_pid = f->pid;
    h->abort_origin = f->kind == MG_FAULT_ABORTED ? f->origin : g->ranks[g->me];
    atomic_store(&h->aborted, 1);
    for (int q = 0; q < g->n; q++) {
        struct shm_counter *cs[] = {&g->ctl[q].round, &g->ctl[q].posted, &g->ctl[q].reduced,
                                    &g->ctl[q].consumed, &g->ctl[q].attached};
        for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++)
            syscall(SYS_futex, &cs[i]->val, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
    }
}

/* Waits until q's counter c reaches target. */
static int wait_for(struct mg_shm *g, int q, struct shm_counter *c, uint32_t target,
                    int64_t deadline_ms, struct mg_fault *f)
{
    if (reached(atomic_load_explicit(&c->val, memory_order_acquire), target))
        return 0;
    if (g->spin_us > 0) {
        /* A peer on another core answers within a microsecond or two: spin.
         * After that, yield between checks: a peer waiting for our core gets
         * it at once. Then sleep. */
        int64_t start = mg_now_us(), end = start + g->spin_us, pure = start + PURE_SPIN_US;
        for (unsigned i = 1;; i++) {
            cpu_relax();
            if (reached(atomic_load_explicit(&c->val, memory_order_acquire), target))
                return 0;
            if ((i & 63) == 0) {
                int64_t now = mg_now_us();
                if (now >= end || atomic_load(&((struct shm_header *)g->base)->aborted))
                    break;
                if (now >= pure)
                    sched_yield();
            }
        }
    }
    for (;;) {
        atomic_fetch_add(&c->waiters, 1);
        uint32_t v = atomic_load(&c->val);
        if (!reached(v, target) && !atomic_load(&((struct shm_header *)g->base)->aborted)) {
            int left = mg_ms_until(deadline_ms);
            int slice = left >= 0 && left < SLEEP_SLICE_MS ? left : SLEEP_SLICE_MS;
            struct timespec ts = {slice / 1000, (long)(slice % 1000) * 1000000};
            syscall(SYS_futex, &c->val, FUTEX_WAIT, v, &ts, NULL, 0);
        }
        atomic_fetch_sub(&c->waiters, 1);
        if (reached(atomic_load_explicit(&c->val, memory_order_acquire), target))
            return 0;
        int rc = aborted(g, f);
        if (rc)
            return rc;
        if (!peer_alive(g, q)) {
            *f = (struct mg_fault){.kind = MG_FAULT_DIED, .peer = g->ranks[q], .pid = g->pid[q]};
            return -MG_EPEER;
        }
        if (deadline_ms >= 0 && mg_now_ms() >= deadline_ms) {
            *f = (struct mg_fault){.kind = MG_FAULT_TIMEOUT, .peer = g->ranks[q], .pid = g->pid[q]};
            return -ETIMEDOUT;
        }
    }
}

/* ---- setup ------------------------------------------------------------------- */

static int cfg_check(const struct mg_shm_cfg *cfg)
{
    if (cfg->nlocal < 1 || cfg->nlocal > MG_SHM_MAX_LOCAL || cfg->local_rank < 0 ||
        cfg->local_rank >= cfg->nlocal)
        return -EINVAL;
    return 0;
}

int mg_shm_default_spin_us(int nlocal)
{
    cpu_set_t set;
    long ncpu = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
                                                             : sysconf(_SC_NPROCESSORS_ONLN);
    return ncpu > 0 && nlocal > ncpu ? SPIN_US_SHARED_CPU : SPIN_US_OWN_CPU;
}

static struct mg_shm *shm_new(const struct mg_shm_cfg *cfg)
{
    struct mg_shm *g = calloc(1, sizeof(*g));
    if (!g)
        return NULL;
    g->n = cfg->nlocal;
    g->me = cfg->local_rank;
    for (int q = 0; q < g->n; q++) {
        g->ranks[q] = cfg->ranks ? cfg->ranks[q] : q;
        g->pidfd[q] = -1;
    }
    g->spin_us = cfg->spin_us >= 0 ? cfg->spin_us : mg_shm_default_spin_us(g->n);
    g->fd = -1;
    return g;
}

/* Fixes the pointers into a mapped segment from its header. */
static void shm_layout(struct mg_shm *g, const struct shm_header *h)
{
    g->small_max = h->small_max;
    g->step_bytes = h->step_bytes;
    g->nslots = (int)h->nslots;
    g->stride = h->stride;
    g->zc_min = h->zc_min;
    g->file_size = h->total;
    g->ctl = (struct shm_rankctl *)(g->base + PAGE);
    g->data = g->base + align_up(PAGE + (size_t)g->n * sizeof(struct shm_rankctl), PAGE);
}

int mg_shm_create(struct mg_shm **out, const char *name, uint64_t nonce,
                  const struct mg_shm_cfg *cfg)
{
    int rc = cfg_check(cfg), fd = -1;
    if (rc)
        return rc;
    struct mg_shm *g = shm_new(cfg);
    if (!g)
        return -ENOMEM;

    struct shm_header h = {
        .magic = SHM_MAGIC,
        .nonce = nonce,
        .version = SHM_VERSION,
        .nlocal = (uint32_t)cfg->nlocal,
        .small_max = align_up(cfg->small_max ? cfg->small_max : DEFAULT_SMALL_MAX, 64),
        .step_bytes = align_up(cfg->step_bytes ? cfg->step_bytes : DEFAULT_STEP_BYTES, 64),
        .nslots = (uint64_t)(cfg->nslots > 1 ? cfg->nslots : DEFAULT_NSLOTS),
    };
    h.zc_min = cfg->zc_min ? cfg->zc_min : h.small_max + 1;
    /* A step holds one segment per rank, each a multiple of 64 bytes. */
    if (h.step_bytes < 64u * (unsigned)cfg->nlocal)
        h.step_bytes = 64u * (unsigned)cfg->nlocal;
    h.stride = align_up(2 * (SMALL_HDR + h.small_max) + h.nslots * h.step_bytes, PAGE);
    h.total = align_up(PAGE + (size_t)cfg->nlocal * sizeof(struct shm_rankctl), PAGE) +
              (size_t)cfg->nlocal * h.stride;

    fd = name ? shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600)
              : memfd_create("mg-shm", MFD_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
        goto fail;
    }
    if (ftruncate(fd, (off_t)h.total) < 0) {
        rc = -errno;
        goto fail_unlink;
    }
    /* Reserve the pages now: a full /dev/shm fails here, not with SIGBUS later. */
    rc = posix_fallocate(fd, 0, (off_t)h.total);
    if (rc) {
        rc = -rc;
        goto fail_unlink;
    }
    g->base = mmap(NULL, h.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (g->base == MAP_FAILED) {
        g->base = NULL;
        rc = -errno;
        goto fail_unlink;
    }
    g->fd = fd;
    g->total = h.total;
    shm_layout(g, &h);
    struct shm_header *hp = (struct shm_header *)g->base;
    *hp = h;
    atomic_store(&g->ctl[g->me].pid, (int32_t)getpid());
    post(&g->ctl[g->me].attached, 1);
    *out = g;
    return 0;

fail_unlink:
    if (name)
        shm_unlink(name);
fail:
    if (fd >= 0)
        close(fd);
    free(g);
    return rc;
}

int mg_shm_attach(struct mg_shm **out, const char *name, uint64_t nonce,
                  const struct mg_shm_cfg *cfg)
{
    int rc = cfg_check(cfg);
    if (rc)
        return rc;
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    return mg_shm_attach_fd(out, fd, nonce, cfg);
}

int mg_shm_fd(const struct mg_shm *g)
{
    return g->fd;
}

int mg_shm_attach_fd(struct mg_shm **out, int fd, uint64_t nonce, const struct mg_shm_cfg *cfg)
{
    int rc = cfg_check(cfg);
    struct mg_shm *g = rc ? NULL : shm_new(cfg);
    if (!g) {
        close(fd);
        return rc ? rc : -ENOMEM;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        goto fail_fd;
    }
    if ((size_t)st.st_size < PAGE) {
        rc = -MG_EFORMAT;
        goto fail_fd;
    }
    g->base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (g->base == MAP_FAILED) {
        g->base = NULL;
        rc = -errno;
        goto fail_fd;
    }
    g->total = (size_t)st.st_size;
    g->fd = fd;
    fd = -1;
    const struct shm_header *h = (const struct shm_header *)g->base;
    if (h->magic != SHM_MAGIC || h->version != SHM_VERSION || h->nonce != nonce ||
        h->nlocal != (uint32_t)cfg->nlocal || h->total != g->total) {
        rc = -MG_EFORMAT;
        goto fail_map;
    }
    shm_layout(g, h);
    atomic_store(&g->ctl[g->me].pid, (int32_t)getpid());
    post(&g->ctl[g->me].attached, 1);
    *out = g;
    return 0;

fail_map:
    munmap(g->base, g->total);
    close(g->fd);
fail_fd:
    if (fd >= 0)
        close(fd);
    free(g);
    return rc;
}

int mg_shm_wait_attached(struct mg_shm *g, int64_t deadline_ms, struct mg_fault *f)
{
    for (int q = 0; q < g->n; q++) {
        if (q == g->me)
            continue;
        int rc = wait_for(g, q, &g->ctl[q].attached, 1, deadline_ms, f);
        if (rc)
            return rc;
        g->pid[q] = atomic_load(&g->ctl[q].pid);
        if (g->pidfd[q] < 0 && g->pid[q] > 0)
            g->pidfd[q] = (int)syscall(SYS_pidfd_open, g->pid[q], 0);
    }
    return 0;
}

int mg_shm_unlink(const char *name)
{
    return shm_unlink(name) < 0 ? -errno : 0;
}

size_t mg_shm_segment_bytes(const struct mg_shm *g)
{
    return g->total;
}

void mg_shm_release(struct mg_shm *g)
{
    if (!g)
        return;
    for (int q = 0; q < g->n; q++)
        if (g->pidfd[q] >= 0)
            close(g->pidfd[q]);
    for (int i = 0; i < g->nregs; i++)
        if (g->regs[i].map)
            munmap(g->regs[i].map, g->regs[i].stride * (size_t)g->n);
    if (g->base)
        munmap(g->base, g->total);
    if (g->fd >= 0)
        close(g->fd);
    free(g);
}

/* ---- registered memory --------------------------------------------------------- */

uint64_t mg_shm_zerocopy_count(const struct mg_shm *g)
{
    return g->nzc;
}

/* The leader grows the file; 0 or a negative code (the file is as before). */
static int grow(struct mg_shm *g, size_t from, size_t to)
{
    if (ftruncate(g->fd, (off_t)to) < 0)
        return -errno;
    int rc = posix_fallocate(g->fd, (off_t)from, (off_t)(to - from));
    if (rc) {
        if (ftruncate(g->fd, (off_t)from) < 0) {
            /* the file stays longer; nothing maps the tail */
        }
        return -rc;
    }
    return 0;
}

static int shm_round(struct mg_shm *g, const struct mg_opdesc *d, const void *data, size_t len,
                     int64_t deadline_ms, struct mg_fault *f);

int mg_shm_mem_alloc(struct mg_shm *g, size_t bytes, void **out, const struct mg_opdesc *d,
                     int64_t deadline_ms, struct mg_fault *f)
{
    size_t stride = align_up(bytes ? bytes : 1, PAGE);
    size_t from = g->file_size, n = (size_t)g->n;
    int32_t status = 0;
    *out = NULL;
    /* Every rank takes these decisions from the same figures. */
    if (g->nregs >= MG_SHM_MAX_REGS || stride < bytes || stride > (SIZE_MAX - from) / n / 2)
        status = -ENOSPC;
    else if (g->me == 0)
        status = grow(g, from, from + stride * n);
    uint32_t seq = g->round;
    int rc = shm_round(g, d, &status, sizeof(status), deadline_ms, f);
    if (rc)
        return rc;
    memcpy(&status, small_slot(g, 0, seq) + SMALL_HDR, sizeof(status));
    if (status)
        return 0; /* no room: ordinary memory will do */
    g->file_size = from + stride * n;
    struct shm_reg *r = &g->regs[g->nregs++];
    void *map = mmap(NULL, stride * n, PROT_READ | PROT_WRITE, MAP_SHARED, g->fd, (off_t)from);
    if (map == MAP_FAILED)
        return 0; /* this rank's buffers then never match the others': no zero-copy */
    *r = (struct shm_reg){.map = map, .stride = stride, .bytes = bytes};
    *out = r->map + (size_t)g->me * stride;
    return 0;
}

int mg_shm_mem_free(struct mg_shm *g, void *p)
{
    for (int i = 0; p && i < g->nregs; i++) {
        struct shm_reg *r = &g->regs[i];
        if (r->map && (char *)p == r->map + (size_t)g->me * r->stride) {
            munmap(r->map, r->stride * (size_t)g->n);
            r->map = NULL;
            return 1;
        }
    }
    return 0;
}

/* ---- the flag round ------------------------------------------------------------ */

/* Publishes d (and len bytes of data, len <= small_max) in this round's slot,
 * then waits for every other rank to do the same and checks they agree. */
static int shm_round(struct mg_shm *g, const struct mg_opdesc *d, const void *data, size_t len,
                     int64_t deadline_ms, struct mg_fault *f)
{
    uint32_t seq = g->round;
    char *mine = small_slot(g, g->me, seq);
    memcpy(mine, d, sizeof(*d));
    if (len)
        memcpy(mine + SMALL_HDR, data, len);
    post(&g->ctl[g->me].round, seq + 1);
    for (int q = 0; q < g->n; q++) {
        if (q == g->me)
            continue;
        int rc = wait_for(g, q, &g->ctl[q].round, seq + 1, deadline_ms, f);
        if (rc)
            return rc;
        struct mg_opdesc theirs;
        memcpy(&theirs, small_slot(g, q, seq), sizeof(theirs));
        if (!mg_opdesc_equal(&theirs, d)) {
            *f = (struct mg_fault){
                .kind = MG_FAULT_MISMATCH, .peer = g->ranks[q], .pid = g->pid[q], .theirs = theirs};
            return -MG_EPROTO;
        }
    }
    g->round = seq + 1;
    return 0;
}

int mg_shm_barrier(struct mg_shm *g, const struct mg_opdesc *d, int64_t deadline_ms,
                   struct mg_fault *f)
{
    return shm_round(g, d, NULL, 0, deadline_ms, f);
}

/* Every rank's counters end each pipelined operation at the same step. */
static void finish_steps(struct mg_shm *g, uint32_t end)
{
    struct shm_rankctl *me = &g->ctl[g->me];
    post(&me->posted, end);
    post(&me->reduced, end);
    post(&me->consumed, end);
    g->steps = end;
}

/* Before reusing slot (base + k): every other rank must be done with the step
 * that used it last, nslots steps ago (within this operation: the round that
 * started it proved that everyone finished the previous one). */
static int wait_slot_free(struct mg_shm *g, uint32_t base, uint32_t k, int need_reduced,
                          int64_t deadline_ms, struct mg_fault *f)
{
    if (k < (uint32_t)g->nslots)
        return 0;
    uint32_t t = base + k - (uint32_t)g->nslots + 1;
    for (int q = 0; q < g->n; q++) {
        if (q == g->me)
            continue;
        int rc = need_reduced ? wait_for(g, q, &g->ctl[q].reduced, t, deadline_ms, f) : 0;
        if (!rc)
            rc = wait_for(g, q, &g->ctl[q].consumed, t, deadline_ms, f);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- allreduce ------------------------------------------------------------------- */

/* Piece k of a message of len units cut into pieces of step (k * step < len). */
static size_t piece_len(size_t len, uint32_t k, size_t step)
{
    size_t start = (size_t)k * step;
    return len - start < step ? len - start : step;
}

/* Floats of chunk c that fall in segment k. */
static size_t seg_len(const size_t *off, int c, uint32_t k, size_t seg)
{
    size_t len = off[c + 1] - off[c];
    return len <= (size_t)k * seg ? 0 : piece_len(len, k, seg);
}

/* The whole message in the flag round's slots; each rank sums it all (the
 * same sums, in the same order, on every rank). */
static int small_reduce(struct mg_shm *g, float *buf, size_t count, int divide_by, int want,
                        const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f)
{
    const float *src[MG_SHM_MAX_LOCAL];
    uint32_t seq = g->round;
    int rc = shm_round(g, d, buf, count * sizeof(float), deadline_ms, f);
    if (rc || !want)
        return rc;
    for (int q = 0; q < g->n; q++)
        src[q] = q == g->me ? buf : (const float *)(small_slot(g, q, seq) + SMALL_HDR);
    mg_reduce_f32(buf, NULL, src, g->n, count, divide_by);
    return 0;
}

/* Where buf lies in this rank's registered memory (tag->reg = 0: nowhere). */
static void find_reg(const struct mg_shm *g, const float *buf, size_t bytes, struct zc_tag *tag)
{
    const char *p = (const char *)buf;
    *tag = (struct zc_tag){0};
    for (int i = 0; i < g->nregs; i++) {
        const struct shm_reg *r = &g->regs[i];
        const char *mine = r->map ? r->map + (size_t)g->me * r->stride : NULL;
        if (mine && p >= mine && (size_t)(p - mine) <= r->bytes &&
            bytes <= r->bytes - (size_t)(p - mine) && (size_t)(p - mine) % sizeof(float) == 0) {
            *tag = (struct zc_tag){.reg = (uint32_t)i + 1, .off = (uint64_t)(p - mine)};
            return;
        }
    }
}

/* The flag round of a large operation: each rank says where its buffer lies in
 * its registered memory (when look) and learns whether every rank's buffer lies
 * at the same offset of one registration (*all; *tag says where). */
static int zc_flag_round(struct mg_shm *g, const float *buf, size_t bytes, int look,
                         struct zc_tag *tag, int *all, const struct mg_opdesc *d,
                         int64_t deadline_ms, struct mg_fault *f)
{
    uint32_t seq = g->round;
    *tag = (struct zc_tag){0};
    if (look)
        find_reg(g, buf, bytes, tag);
    memcpy(small_slot(g, g->me, seq) + TAG_OFF, tag, sizeof(*tag));
    int rc = shm_round(g, d, NULL, 0, deadline_ms, f);
    if (rc)
        return rc;
    *all = tag->reg != 0;
    for (int q = 0; q < g->n && *all; q++) {
        struct zc_tag t;
        memcpy(&t, small_slot(g, q, seq) + TAG_OFF, sizeof(t));
        *all = t.reg == tag->reg && t.off == tag->off;
    }
    return 0;
}

/* R(j) of a pipeline starts once every other rank has staged step j. */
static int wait_posted(struct mg_shm *g, uint32_t base, uint32_t j, int64_t deadline_ms,
                       struct mg_fault *f)
{
    for (int q = 0; q < g->n; q++) {
        if (q == g->me)
            continue;
        int rc = wait_for(g, q, &g->ctl[q].posted, base + j + 1, deadline_ms, f);
        if (rc)
            return rc;
    }
    return 0;
}

/* Zero-copy: the flag round proved every rank's buffer holds its input.
 * Chunk boundaries fall on cache lines of the buffers (which sit at the same
 * offset in every block), so no two ranks write one line. */
static int zc_allreduce(struct mg_shm *g, const struct zc_tag *tag, size_t count, int divide_by,
                        const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f)
{
    const struct shm_reg *r = &g->regs[tag->reg - 1];
    float *bufs[MG_SHM_MAX_LOCAL];
    size_t off[MG_SHM_MAX_LOCAL + 1];
    size_t lead = (size_t)(tag->off / sizeof(float)) % 16; /* of the first line, before buf */
    int n = g->n, me = g->me;
    mg_split_chunks(count + lead, n, off);
    size_t from = off[me] > lead ? off[me] - lead : 0,
           to = off[me + 1] > lead ? off[me + 1] - lead : 0;
    if (to > from) {
        for (int q = 0; q < n; q++)
            bufs[q] = (float *)(r->map + (size_t)q * r->stride + tag->off) + from;
        mg_reduce_f32n(bufs, n, (const float *const *)bufs, n, to - from, divide_by);
    }
    g->nzc++;
    /* Nobody may use the result (or write the next input) before every
     * chunk has been written. */
    return shm_round(g, d, NULL, 0, deadline_ms, f);
}

/* The sums land in every rank's buf (root < 0) or only in root's; the other
 * ranks' buf then holds partial results. */
static int shm_reduce(struct mg_shm *g, float *buf, size_t count, int divide_by, int root,
                      const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f)
{
    const float *src[MG_SHM_MAX_LOCAL];
    size_t bytes = count * sizeof(float);
    int n = g->n, me = g->me, rc;
    int want = root < 0 || root == me; /* this rank needs the whole result */
    /* The path depends on the size only, so every rank takes the same one. */
    int zc = root < 0 && bytes && bytes >= g->zc_min;

    if (bytes <= g->small_max && !zc)
        return small_reduce(g, buf, count, divide_by, want, d, deadline_ms, f);

    /* A round without data; the tags say whether the buffers are registered. */
    struct zc_tag tag;
    int all;
    rc = zc_flag_round(g, buf, bytes, zc, &tag, &all, d, deadline_ms, f);
    if (rc)
        return rc;
    if (zc) {
        if (all)
            return zc_allreduce(g, &tag, count, divide_by, d, deadline_ms, f);
        if (bytes <= g->small_max) /* zc_min below small_max (tests): another round */
            return small_reduce(g, buf, count, divide_by, want, d, deadline_ms, f);
    }

    size_t off[MG_SHM_MAX_LOCAL + 1];
    mg_split_chunks(count, n, off);
    size_t seg = g->step_bytes / (size_t)n / 64 * 64 / sizeof(float); /* floats per segment */
    size_t maxchunk = 0;
    for (int c = 0; c < n; c++)
        if (off[c + 1] - off[c] > maxchunk)
            maxchunk = off[c + 1] - off[c];
    uint32_t nsteps = (uint32_t)((maxchunk + seg - 1) / seg);
    uint32_t base = g->steps;
    struct shm_rankctl *mine = &g->ctl[me];

    /* A(0), then R(j) A(j+1) C(j): the peers' sums get a whole stage of slack. */
    for (uint32_t k = 0; k <= nsteps; k++) {
        if (k > 0) {
            /* R(j): sum segment j of my chunk, in rank order. */
            uint32_t j = k - 1;
            rc = wait_posted(g, base, j, deadline_ms, f);
            if (rc)
                return rc;
            size_t l = seg_len(off, me, j, seg);
            if (l) {
                for (int q = 0; q < n; q++)
                    src[q] = q == me ? buf + off[me] + (size_t)j * seg
                                     : (const float *)large_slot(g, q, base + j) + (size_t)me * seg;
                /* Into my buffer if I need it, into my slot if someone else does. */
                float *mine_out = buf + off[me] + (size_t)j * seg;
                float *slot_out = (float *)large_slot(g, me, base + j) + (size_t)me * seg;
                int others = root < 0 || root != me;
                mg_reduce_f32(want ? mine_out : slot_out, want && others ? slot_out : NULL, src, n,
                              l, divide_by);
            }
            post(&mine->reduced, base + j + 1);
        }
        if (k < nsteps) {
            /* A(k): stage my part of everyone else's chunk. */
            rc = wait_slot_free(g, base, k, 1, deadline_ms, f);
            if (rc)
                return rc;
            float *slot = (float *)large_slot(g, me, base + k);
            for (int p = 0; p < n; p++) {
                size_t l = seg_len(off, p, k, seg);
                if (p != me && l)
                    memcpy(slot + (size_t)p * seg, buf + off[p] + (size_t)k * seg,
                           l * sizeof(float));
            }
            post(&mine->posted, base + k + 1);
        }
        if (k > 0) {
            /* C(j): copy the others' sums out of their slots. */
            uint32_t j = k - 1;
            for (int q = 0; q < n && want; q++) {
                if (q == me)
                    continue;
                rc = wait_for(g, q, &g->ctl[q].reduced, base + j + 1, deadline_ms, f);
                if (rc)
                    return rc;
                size_t l = seg_len(off, q, j, seg);
                if (l)
                    memcpy(buf + off[q] + (size_t)j * seg,
                           (const float *)large_slot(g, q, base + j) + (size_t)q * seg,
                           l * sizeof(float));
            }
            post(&mine->consumed, base + j + 1);
        }
    }
    finish_steps(g, base + nsteps);
    return 0;
}

int mg_shm_allreduce(struct mg_shm *g, float *buf, size_t count, int divide_by,
                     const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f)
{
    return shm_reduce(g, buf, count, divide_by, -1, d, deadline_ms, f);
}

int mg_shm_reduce(struct mg_shm *g, float *buf, size_t count, int root_local,
                  const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f)
{
    return shm_reduce(g, buf, count, 1, root_local, d, deadline_ms, f);
}

/* ---- reduce-scatter ---------------------------------------------------------------- */

/* Each rank sums only its own chunk, in rank order, as an allreduce's rank
 * would (so the bits are an allreduce's): from the flag round's slots for a
 * small message, straight from the peers' registered buffers when every rank's
 * send sits at the same offset of one registration, else through the staging
 * slots, A(k) and R(j) of the allreduce's pipeline without its copy-out. */
static int small_scatter(struct mg_shm *g, const float *send, float *recv, size_t count,
                         int divide_by, const struct mg_opdesc *d, int64_t deadline_ms,
                         struct mg_fault *f)
{
    const float *src[MG_SHM_MAX_LOCAL];
    uint32_t seq = g->round;
    int rc = shm_round(g, d, send, (size_t)g->n * count * sizeof(float), deadline_ms, f);
    if (rc)
        return rc;
    for (int q = 0; q < g->n; q++)
        src[q] = (q == g->me ? send : (const float *)(small_slot(g, q, seq) + SMALL_HDR)) +
                 (size_t)g->me * count;
    mg_reduce_f32(recv, NULL, src, g->n, count, divide_by);
    return 0;
}

int mg_shm_reduce_scatter(struct mg_shm *g, const float *send, float *recv, size_t count,
                          int divide_by, const struct mg_opdesc *d, int64_t deadline_ms,
                          struct mg_fault *f)
{
    const float *src[MG_SHM_MAX_LOCAL];
    int n = g->n, me = g->me, rc;
    size_t bytes = (size_t)n * count * sizeof(float);
    int zc = bytes && bytes >= g->zc_min;

    if (bytes <= g->small_max && !zc)
        return small_scatter(g, send, recv, count, divide_by, d, deadline_ms, f);

    struct zc_tag tag;
    int all;
    rc = zc_flag_round(g, send, bytes, zc, &tag, &all, d, deadline_ms, f);
    if (rc)
        return rc;
    if (zc) {
        if (all) {
            const struct shm_reg *r = &g->regs[tag.reg - 1];
            for (int q = 0; q < n; q++)
                src[q] =
                    (const float *)(r->map + (size_t)q * r->stride + tag.off) + (size_t)me * count;
            mg_reduce_f32(recv, NULL, src, n, count, divide_by);
            g->nzc++;
            /* nobody may change its send buffer while the others read it */
            return shm_round(g, d, NULL, 0, deadline_ms, f);
        }
        if (bytes <= g->small_max) /* zc_min below small_max (tests): another round */
            return small_scatter(g, send, recv, count, divide_by, d, deadline_ms, f);
    }

    size_t seg = g->step_bytes / (size_t)n / 64 * 64 / sizeof(float);
    uint32_t nsteps = (uint32_t)((count + seg - 1) / seg), base = g->steps;
    struct shm_rankctl *mine = &g->ctl[me];
    for (uint32_t k = 0; k <= nsteps; k++) {
        if (k > 0) {
            /* R(j): segment j of my chunk, summed in rank order into recv */
            uint32_t j = k - 1;
            rc = wait_posted(g, base, j, deadline_ms, f);
            if (rc)
                return rc;
            size_t at = (size_t)j * seg, l = piece_len(count, j, seg);
            for (int q = 0; q < n; q++)
                src[q] = q == me ? send + (size_t)me * count + at
                                 : (const float *)large_slot(g, q, base + j) + (size_t)me * seg;
            mg_reduce_f32(recv + at, NULL, src, n, l, divide_by);
            post(&mine->reduced, base + j + 1);
            post(&mine->consumed, base + j + 1);
        }
        if (k < nsteps) {
            /* A(k): stage segment k of every other rank's chunk */
            rc = wait_slot_free(g, base, k, 1, deadline_ms, f);
            if (rc)
                return rc;
            float *slot = (float *)large_slot(g, me, base + k);
            size_t at = (size_t)k * seg, l = piece_len(count, k, seg);
            for (int p = 0; p < n; p++)
                if (p != me)
                    memcpy(slot + (size_t)p * seg, send + (size_t)p * count + at,
                           l * sizeof(float));
            post(&mine->posted, base + k + 1);
        }
    }
    finish_steps(g, base + nsteps);
    return 0;
}

/* ---- broadcast --------------------------------------------------------------------- */

int mg_shm_broadcast(struct mg_shm *g, void *buf, size_t len, int root_local,
                     const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f)
{
    int me = g->me, rc;
    if (len <= g->small_max) {
        uint32_t seq = g->round;
        rc = shm_round(g, d, buf, me == root_local ? len : 0, deadline_ms, f);
        if (rc)
            return rc;
        if (me != root_local && len)
            memcpy(buf, small_slot(g, root_local, seq) + SMALL_HDR, len);
        return 0;
    }
    rc = shm_round(g, d, NULL, 0, deadline_ms, f);
    if (rc)
        return rc;
    size_t step = g->step_bytes;
    uint32_t nsteps = (uint32_t)((len + step - 1) / step), base = g->steps;
    char *p = buf;
    for (uint32_t k = 0; k < nsteps; k++) {
        size_t l = piece_len(len, k, step);
        if (me == root_local) {
            rc = wait_slot_free(g, base, k, 0, deadline_ms, f);
            if (rc)
                return rc;
            memcpy(large_slot(g, me, base + k), p + (size_t)k * step, l);
            post(&g->ctl[me].posted, base + k + 1);
        } else {
            rc = wait_for(g, root_local, &g->ctl[root_local].posted, base + k + 1, deadline_ms, f);
            if (rc)
                return rc;
            memcpy(p + (size_t)k * step, large_slot(g, root_local, base + k), l);
            post(&g->ctl[me].consumed, base + k + 1);
        }
    }
    /* The root may not leave while others still read its slots: the next
     * round proves they finished, and so would a reuse of the slots. */
    finish_steps(g, base + nsteps);
    return 0;
}

/* ---- allgather ---------------------------------------------------------------------- */

static int staged_allgather(struct mg_shm *g, char *out, size_t len, int64_t deadline_ms,
                            struct mg_fault *f);

int mg_shm_allgather(struct mg_shm *g, const void *send, void *recv, size_t len,
                     const struct mg_opdesc *d, int64_t deadline_ms, struct mg_fault *f)
{
    int n = g->n, me = g->me, rc;
    char *out = recv;
    size_t total = (size_t)n * len;
    if (send != out + (size_t)me * len && len)
        memmove(out + (size_t)me * len, send, len);
    if (total && total >= g->zc_min) {
        /* recv registered at the same offset everywhere: copy each block
         * straight from its owner's recv (one read, one write of the others'
         * blocks, no staging), then a round so that nobody changes its block
         * while another still reads it. The path depends on the size only. */
        struct zc_tag tag;
        int all;
        rc = zc_flag_round(g, recv, total, (uintptr_t)recv % sizeof(float) == 0, &tag, &all, d,
                           deadline_ms, f);
        if (rc)
            return rc;
        if (all) {
            const struct shm_reg *r = &g->regs[tag.reg - 1];
            for (int q = 0; q < n; q++)
                if (q != me)
                    memcpy(out + (size_t)q * len,
                           r->map + (size_t)q * r->stride + tag.off + (size_t)q * len, len);
            g->nzc++;
            return shm_round(g, d, NULL, 0, deadline_ms, f);
        }
        if (len > g->small_max) /* the round is done: straight to the slots */
            return staged_allgather(g, out, len, deadline_ms, f);
        /* zc_min below small_max (tests): another round, the small way */
    }
    if (len <= g->small_max) {
        uint32_t seq = g->round;
        rc = shm_round(g, d, out + (size_t)me * len, len, deadline_ms, f);
        if (rc)
            return rc;
        for (int q = 0; q < n; q++)
            if (q != me && len)
                memcpy(out + (size_t)q * len, small_slot(g, q, seq) + SMALL_HDR, len);
        return 0;
    }
    rc = shm_round(g, d, NULL, 0, deadline_ms, f);
    if (rc)
        return rc;
    return staged_allgather(g, out, len, deadline_ms, f);
}

/* After the operation's round: each block through its owner's staging slots. */
static int staged_allgather(struct mg_shm *g, char *out, size_t len, int64_t deadline_ms,
                            struct mg_fault *f)
{
    int n = g->n, me = g->me, rc;
    size_t step = g->step_bytes;
    uint32_t nsteps = (uint32_t)((len + step - 1) / step), base = g->steps;
    const char *mine = out + (size_t)me * len;
    for (uint32_t k = 0; k <= nsteps; k++) {
        if (k < nsteps) {
            size_t l = piece_len(len, k, step);
            rc = wait_slot_free(g, base, k, 0, deadline_ms, f);
            if (rc)
                return rc;
            memcpy(large_slot(g, me, base + k), mine + (size_t)k * step, l);
            post(&g->ctl[me].posted, base + k + 1);
        }
        if (k == 0)
            continue;
        uint32_t j = k - 1;
        size_t l = piece_len(len, j, step);
        for (int q = 0; q < n; q++) {
            if (q == me)
                continue;
            rc = wait_for(g, q, &g->ctl[q].posted, base + j + 1, deadline_ms, f);
            if (rc)
                return rc;
            memcpy(out + (size_t)q * len + (size_t)j * step, large_slot(g, q, base + j), l);
        }
        post(&g->ctl[me].consumed, base + j + 1);
    }
    finish_steps(g, base + nsteps);
    return 0;
}
