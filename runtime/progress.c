/* The worker's progress record (see progress.h). */
#include "progress.h"
#include "net.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static struct mg_progress *g_rec;

/* Relaxed stores: the agent reads a copy and accepts torn values; the beat's
 * time is stored before the beat (release), so a reader that sees a new beat
 * sees its time. */
#define PUT(field, v) __atomic_store_n(&(field), (v), __ATOMIC_RELAXED)

static void beat(struct mg_progress *r, int64_t now)
{
    PUT(r->beat_us, now);
    __atomic_store_n(&r->beat, r->beat + 1, __ATOMIC_RELEASE);
}

int mg_progress_open(void)
{
    const char *v = getenv("MG_PROGRESS_FD");
    struct stat st;
    char *end;
    if (g_rec || !v || !*v)
        return 0;
    errno = 0;
    long fd = strtol(v, &end, 10);
    if (errno || *end || fd < 3 || fd > 1 << 20 || fstat((int)fd, &st) < 0 ||
        !S_ISREG(st.st_mode) || st.st_size < (off_t)MG_PROGRESS_BYTES)
        return -EINVAL;
    void *p = mmap(NULL, MG_PROGRESS_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, (int)fd, 0);
    if (p == MAP_FAILED)
        return -EINVAL;
    /* mglaunch lent this descriptor to this worker alone: its children
     * (DataLoader workers, daemons) must not keep it. */
    fcntl((int)fd, F_SETFD, FD_CLOEXEC);
    struct mg_progress *r = p;
    /* A new worker's record: what an earlier attempt left goes. */
    memset(r, 0, sizeof(*r));
    r->version = MG_PROGRESS_VERSION;
    r->pid = (int32_t)getpid();
    r->rank = -1;
    r->coll_next = 1;
    r->coll_bucket = -1;
    r->phase = MG_PH_SETUP;
    r->phase_us = r->beat_us = mg_now_us();
    __atomic_store_n(&r->magic, MG_PROGRESS_MAGIC, __ATOMIC_RELEASE);
    g_rec = r;
    return 0;
}

void mg_progress_identify(int rank, int coll_timeout_ms)
{
    if (!g_rec)
        return;
    PUT(g_rec->rank, rank);
    PUT(g_rec->coll_timeout_ms, coll_timeout_ms);
}

void mg_progress_resumed(enum mg_progress_from from, int64_t step, int64_t epoch, int src_rank,
                         int src_world, const char *path)
{
    struct mg_progress_resume *x = g_rec ? &g_rec->resume : NULL;
    if (!x || __atomic_load_n(&x->from, __ATOMIC_RELAXED) != MG_FROM_UNSAID)
        return;
    x->step = step;
    x->epoch = epoch;
    x->src_rank = src_rank;
    x->src_world = src_world;
    snprintf(x->path, sizeof(x->path), "%s", path ? path : "");
    PUT(g_rec->step, step); /* the steps done, before the first of this attempt */
    __atomic_store_n(&x->from, (uint32_t)from, __ATOMIC_RELEASE);
}

void mg_progress_phase(enum mg_progress_phase ph)
{
    struct mg_progress *r = g_rec;
    if (!r)
        return;
    int64_t now = mg_now_us();
    PUT(r->phase, (uint32_t)ph);
    PUT(r->phase_us, now);
    beat(r, now);
}

void mg_progress_step_begin(void)
{
    struct mg_progress *r = g_rec;
    if (!r)
        return;
    int64_t now = mg_now_us();
    PUT(r->step_start_us, now);
    PUT(r->phase, (uint32_t)MG_PH_DATA);
    PUT(r->phase_us, now);
    beat(r, now);
}

void mg_progress_step_end(int64_t steps_done)
{
    struct mg_progress *r = g_rec;
    if (!r)
        return;
    int64_t now = mg_now_us();
    if (r->step_start_us) {
        PUT(r->step_us[r->steps_done % MG_PROGRESS_STEPS], now - r->step_start_us);
        PUT(r->steps_done, r->steps_done + 1);
    }
    PUT(r->step, steps_done);
    beat(r, now);
}

void mg_progress_beat(void)
{
    if (g_rec)
        beat(g_rec, mg_now_us());
}

void mg_progress_next_bucket(int bucket)
{
    if (g_rec)
        PUT(g_rec->coll_bucket, bucket);
}

uint64_t mg_progress_coll_begin(enum mg_progress_op op, uint64_t bytes)
{
    struct mg_progress *r = g_rec;
    if (!r)
        return 0;
    int64_t now = mg_now_us();
    uint64_t seq = r->coll_next;
    struct mg_progress_coll *c = &r->ring[seq % MG_PROGRESS_RING];
    /* The entry is invalid while it is rewritten: seq last. */
    PUT(c->seq, 0);
    PUT(c->op, (uint32_t)op);
    PUT(c->state, (uint32_t)MG_CS_STARTED);
    PUT(c->bucket, r->coll_bucket);
    PUT(c->bytes, bytes);
    PUT(c->start_us, now);
    PUT(c->end_us, 0);
    __atomic_store_n(&c->seq, seq, __ATOMIC_RELEASE);
    PUT(r->coll_bucket, -1);
    PUT(r->coll_next, seq + 1);
    beat(r, now);
    return seq;
}

void mg_progress_coll_end(uint64_t seq, int rc)
{
    struct mg_progress *r = g_rec;
    if (!r || !seq)
        return;
    int64_t now = mg_now_us();
    struct mg_progress_coll *c = &r->ring[seq % MG_PROGRESS_RING];
    if (c->seq != seq)
        return;
    PUT(c->end_us, now);
    PUT(c->state, (uint32_t)(rc < 0 ? MG_CS_FAILED : MG_CS_DONE));
    beat(r, now);
}
