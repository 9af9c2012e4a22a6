/* The shared memory segment of the ranks of one host: setting it up, its
 * registered memory, the waits and the flag round that the collectives
 * (comm_shm_coll.c) are built from.
 *
 * Every operation starts with a flag round: each rank writes what it is about
 * to do (and, for a small message, the data itself) into its half of a
 * double-buffered slot, bumps its round counter and waits for everyone else's.
 *
 * Registered memory (mg_shm_mem_alloc) is a block per rank appended to the
 * segment (every rank keeps the segment's fd, so it can grow after the name is
 * gone, and maps the new blocks), so that an allreduce can skip the staging
 * slots (comm_shm_coll.c).
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
#include "comm_shm_internal.h"
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
#define PAGE        4096

#define DEFAULT_SMALL_MAX  (64u << 10)
#define DEFAULT_STEP_BYTES (256u << 10)
#define DEFAULT_NSLOTS     4
#define SPIN_US_OWN_CPU    1000 /* every local rank has a CPU */
#define SPIN_US_SHARED_CPU 50   /* more local ranks than CPUs */
#define SLEEP_SLICE_MS     50
#define PURE_SPIN_US       2

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

static inline int reached(uint32_t val, uint32_t target)
{
    return (int32_t)(val - target) >= 0;
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
int mg_shm_wait(struct mg_shm *g, int q, struct shm_counter *c, uint32_t target,
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
        int rc = mg_shm_wait(g, q, &g->ctl[q].attached, 1, deadline_ms, f);
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

int mg_shm_round(struct mg_shm *g, const struct mg_opdesc *d, const void *data, size_t len,
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
    int rc = mg_shm_round(g, d, &status, sizeof(status), deadline_ms, f);
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
int mg_shm_round(struct mg_shm *g, const struct mg_opdesc *d, const void *data, size_t len,
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
        int rc = mg_shm_wait(g, q, &g->ctl[q].round, seq + 1, deadline_ms, f);
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
    return mg_shm_round(g, d, NULL, 0, deadline_ms, f);
}

/* Every rank's counters end each pipelined operation at the same step. */
void mg_shm_finish_steps(struct mg_shm *g, uint32_t end)
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
int mg_shm_wait_slot_free(struct mg_shm *g, uint32_t base, uint32_t k, int need_reduced,
                          int64_t deadline_ms, struct mg_fault *f)
{
    if (k < (uint32_t)g->nslots)
        return 0;
    uint32_t t = base + k - (uint32_t)g->nslots + 1;
    for (int q = 0; q < g->n; q++) {
        if (q == g->me)
            continue;
        int rc = need_reduced ? mg_shm_wait(g, q, &g->ctl[q].reduced, t, deadline_ms, f) : 0;
        if (!rc)
            rc = mg_shm_wait(g, q, &g->ctl[q].consumed, t, deadline_ms, f);
        if (rc)
            return rc;
    }
    return 0;
}
