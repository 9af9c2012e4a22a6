/* The watchdog's verdict (see watchdog.h). */
#include "watchdog.h"
#include "mg_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int long_phase(const struct mg_progress *rec)
{
    return rec->steps_done == 0 || rec->phase == MG_PH_NONE || rec->phase == MG_PH_SETUP ||
           rec->phase == MG_PH_CHECKPOINT || rec->phase == MG_PH_DONE;
}

int64_t mg_watch_bound_us(const struct mg_progress *rec, double floor_s, char *how, size_t cap)
{
    if (long_phase(rec)) {
        int64_t t = rec->coll_timeout_ms > 0 ? rec->coll_timeout_ms : 300000;
        mg_fmt(how, cap, "%s: its collective timeout, %g s, + %g s",
               rec->steps_done == 0 ? "before its first step" : mg_progress_phase_name(rec->phase),
               (double)t / 1000.0, MG_HANG_MARGIN_MS / 1000.0);
        return (t + MG_HANG_MARGIN_MS) * 1000;
    }
    int64_t floor_us = (int64_t)(floor_s * 1e6);
    int64_t slow = mg_progress_slowest_step(rec);
    if (slow * MG_HANG_STEPS > floor_us) {
        mg_fmt(how, cap, "%d x its slowest recent step, %.3g s", MG_HANG_STEPS, (double)slow / 1e6);
        return slow * MG_HANG_STEPS;
    }
    mg_fmt(how, cap, "--hang-timeout %g s; its slowest recent step %.3g s", floor_s,
           (double)slow / 1e6);
    return floor_us;
}

const struct mg_progress_coll *mg_watch_waiting(const struct mg_progress *rec)
{
    const struct mg_progress_coll *c = mg_progress_coll_last(rec);
    return c && c->state == MG_CS_STARTED ? c : NULL;
}

int mg_watch_stale(const struct mg_watch_rank *r, double floor_s, int64_t now_us)
{
    char how[160];
    return r->live &&
           now_us - r->rec.beat_us > mg_watch_bound_us(&r->rec, floor_s, how, sizeof(how));
}

const char *mg_watch_coll_text(const struct mg_progress_coll *c, char *buf, size_t cap)
{
    char b[48] = "", sz[32];
    double n = (double)c->bytes;
    if (n >= 1 << 20)
        mg_fmt(sz, sizeof(sz), "%.1f MB", n / (1 << 20));
    else if (n >= 1024)
        mg_fmt(sz, sizeof(sz), "%.0f KB", n / 1024);
    else
        mg_fmt(sz, sizeof(sz), "%.0f B", n);
    if (c->bucket >= 0)
        mg_fmt(b, sizeof(b), "bucket %d, ", (int)c->bucket);
    if (c->op == MG_PROG_BARRIER)
        mg_fmt(buf, cap, "barrier #%llu", (unsigned long long)c->seq);
    else
        mg_fmt(buf, cap, "%s #%llu (%s%s)", mg_progress_op_name(c->op), (unsigned long long)c->seq,
               b, sz);
    return buf;
}

/* Appends to buf at *len, bounded. */
__attribute__((format(printf, 4, 5))) static void add(char *buf, size_t cap, size_t *len,
                                                      const char *fmt, ...)
{
    va_list ap;
    if (*len >= cap)
        return;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n > 0)
        *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

/* "ranks 0,2 wait in allreduce #12 (...) since 10.1 s; " for every waiting
 * rank other than skip, grouped by collective. */
static void add_waiters(const struct mg_watch_rank *r, int n, int skip, int64_t now_us, char *buf,
                        size_t cap, size_t *len)
{
    int done[64] = {0};
    for (int i = 0; i < n && i < 64; i++) {
        const struct mg_progress_coll *c =
            r[i].live && i != skip ? mg_watch_waiting(&r[i].rec) : NULL;
        if (!c || done[i])
            continue;
        char ranks[256], ct[128];
        size_t rl = 0, count = 0;
        ranks[0] = '\0';
        int64_t since = c->start_us;
        for (int j = i; j < n && j < 64; j++) {
            const struct mg_progress_coll *d =
                r[j].live && j != skip ? mg_watch_waiting(&r[j].rec) : NULL;
            if (!d || d->seq != c->seq)
                continue;
            done[j] = 1;
            add(ranks, sizeof(ranks), &rl, "%s%d", count ? "," : "", r[j].rank);
            count++;
            if (d->start_us < since)
                since = d->start_us;
        }
        add(buf, cap, len, "; rank%s %s wait%s in %s since %.1f s", count > 1 ? "s" : "", ranks,
            count > 1 ? "" : "s", mg_watch_coll_text(c, ct, sizeof(ct)),
            (double)(now_us - since) / 1e6);
    }
}

int mg_watch_judge(const struct mg_watch_rank *r, int n, int multi_node, double floor_s,
                   int64_t now_us, const char *host, struct mg_hang_verdict *v)
{
    char how[160], st[160], ct[128], where[96];
    size_t len = 0;
    int culprit = -1, nlive = 0, nwait = 0, all_inside = 0;

    memset(v, 0, sizeof(*v));
    v->culprit = -1;
    /* The cause: past its bound and not waiting in a collective, or stopped
     * (a stopped rank inside a collective holds the others up all the
     * same). A stopped one first, then the one silent longest. */
    for (int i = 0; i < n; i++) {
        if (!r[i].live)
            continue;
        nlive++;
        int waiting = mg_watch_waiting(&r[i].rec) != NULL;
        int stale = mg_watch_stale(&r[i], floor_s, now_us);
        nwait += waiting && stale;
        if (!stale || (waiting && !mg_procstate_stopped(&r[i].ps)))
            continue;
        if (culprit < 0 ||
            (mg_procstate_stopped(&r[i].ps) && !mg_procstate_stopped(&r[culprit].ps)) ||
            (mg_procstate_stopped(&r[i].ps) == mg_procstate_stopped(&r[culprit].ps) &&
             r[i].rec.beat_us < r[culprit].rec.beat_us))
            culprit = i;
    }
    if (culprit < 0 && nlive > 0 && nwait == nlive) {
        /* Every rank waits in a collective past its bound. */
        if (multi_node) {
            v->remote = 1;
            add(v->line, sizeof(v->line), &len, "no progress on %s for the ranks here", host);
            add_waiters(r, n, -1, now_us, v->line, sizeof(v->line), &len);
            add(v->line, sizeof(v->line), &len,
                ": the rank they wait for is on another node (its mglaunch reports it; the "
                "collective timeout ends the wait otherwise)");
            return 1;
        }
        /* One node: the rank behind (the lowest collective) is the cause;
         * all in the same one means the collective itself is stuck. */
        for (int i = 0; i < n; i++)
            if (r[i].live && (culprit < 0 || mg_watch_waiting(&r[i].rec)->seq <
                                                 mg_watch_waiting(&r[culprit].rec)->seq))
                culprit = i;
        all_inside = 1;
    }
    if (culprit < 0)
        return 0;

    const struct mg_watch_rank *c = &r[culprit];
    int64_t bound = mg_watch_bound_us(&c->rec, floor_s, how, sizeof(how));
    double age = (double)(now_us - c->rec.beat_us) / 1e6;
    const struct mg_progress_coll *in = mg_watch_waiting(&c->rec);
    uint64_t last_done = mg_progress_last_done(&c->rec);
    v->culprit = culprit;
    mg_procstate_text(&c->ps, st, sizeof(st));
    add(v->line, sizeof(v->line), &len,
        "rank %d (local rank %d, host %s, pid %d) is hung: no progress for %.1f s (bound %.1f s: "
        "%s); it is %s; it was in %s",
        c->rank, c->local_rank, host, c->pid, age, (double)bound / 1e6, how, st,
        mg_progress_where(&c->rec, where, sizeof(where)));
    if (in)
        add(v->line, sizeof(v->line), &len, ", inside %s", mg_watch_coll_text(in, ct, sizeof(ct)));
    add_waiters(r, n, culprit, now_us, v->line, sizeof(v->line), &len);
    if (last_done)
        add(v->line, sizeof(v->line), &len, "; rank %d last finished #%llu", c->rank,
            (unsigned long long)last_done);
    else
        add(v->line, sizeof(v->line), &len, "; rank %d finished no collective yet", c->rank);
    if (all_inside)
        add(v->line, sizeof(v->line), &len,
            "; every rank is inside a collective: it is the collective that does not finish");
    mg_fmt(v->why, sizeof(v->why), "hung: no progress for %.1f s in %s; %s%s%s", age, where, st,
           in ? ", inside " : "", in ? mg_watch_coll_text(in, ct, sizeof(ct)) : "");
    return 1;
}
