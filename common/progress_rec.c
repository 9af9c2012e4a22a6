/* Reading a progress record (see progress_rec.h). */
#include "progress_rec.h"

#include "mg_err.h"

static const char *const phases[MG_PH_COUNT] = {"startup",           "setup",
                                                "data loading",      "forward/backward",
                                                "the gradient sync", "the optimizer step",
                                                "evaluation",        "a checkpoint",
                                                "the finish"};

static const char *const ops[MG_PROG_OP_COUNT] = {"allreduce",      "broadcast", "allgather",
                                                  "reduce-scatter", "barrier",   "shift"};

const char *mg_progress_phase_name(unsigned phase)
{
    return phase < MG_PH_COUNT ? phases[phase] : "an unknown phase";
}

const char *mg_progress_where(const struct mg_progress *p, char *buf, size_t cap)
{
    const char *ph = mg_progress_phase_name(p->phase);
    long long done = (long long)p->step;
    if (p->phase == MG_PH_DATA || p->phase == MG_PH_COMPUTE || p->phase == MG_PH_SYNC ||
        p->phase == MG_PH_OPTIMIZER)
        mg_fmt(buf, cap, "%s of step %lld (%lld done)", ph, done + 1, done);
    else if (done > 0)
        mg_fmt(buf, cap, "%s after step %lld", ph, done);
    else
        mg_fmt(buf, cap, "%s before its first step", ph);
    return buf;
}

const char *mg_progress_op_name(unsigned op)
{
    return op < MG_PROG_OP_COUNT ? ops[op] : "collective";
}

const char *mg_progress_from_name(unsigned from)
{
    static const char *const names[] = {
        [MG_FROM_START] = "start", [MG_FROM_MEMORY] = "memory", [MG_FROM_DISK] = "disk"};
    return from > MG_FROM_UNSAID && from <= MG_FROM_DISK ? names[from] : NULL;
}

const struct mg_progress_coll *mg_progress_coll_find(const struct mg_progress *p, uint64_t seq)
{
    if (seq == 0)
        return NULL;
    const struct mg_progress_coll *c = &p->ring[seq % MG_PROGRESS_RING];
    return c->seq == seq && c->state != MG_CS_EMPTY ? c : NULL;
}

const struct mg_progress_coll *mg_progress_coll_last(const struct mg_progress *p)
{
    return p->coll_next > 1 ? mg_progress_coll_find(p, p->coll_next - 1) : NULL;
}

uint64_t mg_progress_last_done(const struct mg_progress *p)
{
    uint64_t best = 0;
    for (int i = 0; i < MG_PROGRESS_RING; i++)
        if (p->ring[i].state == MG_CS_DONE && p->ring[i].seq > best)
            best = p->ring[i].seq;
    return best;
}

int64_t mg_progress_slowest_step(const struct mg_progress *p)
{
    int64_t m = 0;
    uint64_t n = p->steps_done < MG_PROGRESS_STEPS ? p->steps_done : MG_PROGRESS_STEPS;
    for (uint64_t i = 0; i < n; i++)
        if (p->step_us[i] > m)
            m = p->step_us[i];
    return m;
}
