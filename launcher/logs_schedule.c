/* mglaunch logs --schedule: the membership schedule a run's event log
 * records (docs/logs.md, "The membership schedule"): which steps ran at which
 * world size and membership, and where each attempt's training went on from.
 * scripts/replay.sh replays it. */
#include "events.h"
#include "logs_internal.h"
#include "mg_err.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* One attempt as the event log has it. */
struct sched_attempt {
    int attempt, world, nodes, node_rank, first_rank, nproc;
    int resumed;   /* a resume event came */
    char from[16]; /* "start", "memory", "disk" */
    int64_t step;  /* where it went on from */
    int src_rank, src_world;
    char source[16]; /* memory: "own", "rank", "shards" */
    char ckpt[MG_EV_LINE_MAX / 16];
    int64_t end_step; /* attempt_end's step, -1 unknown */
};

/* A stretch of steps trained at one membership: [first, last), last -1 the run's end. */
struct segment {
    const struct sched_attempt *a;
    int64_t first, last;
};

static void source_text(const struct sched_attempt *a, char *buf, size_t cap)
{
    if (!strcmp(a->from, "start"))
        mg_fmt(buf, cap, "from the start");
    else if (!strcmp(a->from, "memory") && a->src_rank >= 0)
        mg_fmt(buf, cap, "from memory (rank %d's snapshot at world size %d)", a->src_rank,
               a->src_world);
    else if (!strcmp(a->from, "memory") && !strcmp(a->source, "shards"))
        mg_fmt(buf, cap, "from memory (the ZeRO-1 shards of world size %d, gathered)",
               a->src_world);
    else if (!strcmp(a->from, "memory"))
        mg_fmt(buf, cap, "from memory (each rank its own snapshot)");
    else if (!strcmp(a->from, "disk"))
        mg_fmt(buf, cap, "from disk (%s)", a->ckpt[0] ? a->ckpt : "a checkpoint");
    else
        mg_fmt(buf, cap, "from %s", a->from);
}

/* Reads path's attempts into *out (n of them). 0, or a negative code. */
static int read_attempts(const char *path, struct sched_attempt **out, int *n, int *succeeded)
{
    struct mg_event_reader rd;
    struct mg_event ev;
    struct sched_attempt *as = NULL, *cur = NULL;
    int na = 0, cap = 0, rc = mg_event_reader_open(&rd, path);
    if (rc < 0)
        return rc;
    *succeeded = 0;
    while (mg_event_read(&rd, &ev)) {
        if (ev.kind == MG_EV_ATTEMPT_START) {
            const struct mg_ev_attempt_start *x = &ev.u.attempt_start;
            if (na == cap) {
                int ncap = cap ? cap * 2 : 16;
                struct sched_attempt *m = realloc(as, (size_t)ncap * sizeof(*m));
                if (!m) {
                    rc = -ENOMEM;
                    break;
                }
                as = m;
                cap = ncap;
            }
            cur = &as[na++];
            memset(cur, 0, sizeof(*cur));
            cur->attempt = x->attempt;
            cur->world = x->world_size;
            cur->nodes = x->group_world_size;
            cur->node_rank = x->group_rank;
            cur->first_rank = x->first_rank;
            cur->nproc = x->nproc;
            cur->end_step = -1;
        } else if (ev.kind == MG_EV_RESUME && cur && ev.u.resume.attempt == cur->attempt &&
                   ev.u.resume.from && ev.u.resume.step >= 0 && !cur->resumed) {
            const struct mg_ev_resume *x = &ev.u.resume;
            cur->resumed = 1;
            mg_fmt(cur->from, sizeof(cur->from), "%s", x->from);
            cur->step = x->step;
            cur->src_rank = x->source_rank;
            mg_fmt(cur->source, sizeof(cur->source), "%s", x->source ? x->source : "");
            cur->src_world = x->source_world_size;
            mg_fmt(cur->ckpt, sizeof(cur->ckpt), "%s", x->checkpoint ? x->checkpoint : "");
        } else if (ev.kind == MG_EV_ATTEMPT_END && cur &&
                   ev.u.attempt_end.attempt == cur->attempt) {
            cur->end_step = ev.u.attempt_end.step;
        } else if (ev.kind == MG_EV_RUN_END) {
            *succeeded = ev.u.run_end.result && !strcmp(ev.u.run_end.result, "succeeded");
        } else if (ev.kind == MG_EV_RUN_START) {
            *succeeded = 0; /* another invocation: its own end decides */
        }
    }
    mg_event_reader_close(&rd);
    if (rc < 0) {
        free(as);
        return rc;
    }
    *out = as;
    *n = na;
    return 0;
}

/* The segments: each attempt that said where it went on from begins one at
 * that step, and ends those that reached past it (the steps redone after a
 * failure, or abandoned by a resume from an older state, are not the run's). */
static int build(const struct sched_attempt *as, int na, struct segment *seg)
{
    int ns = 0;
    for (int i = 0; i < na; i++) {
        if (!as[i].resumed)
            continue;
        int64_t s = as[i].step;
        while (ns > 0 && seg[ns - 1].first >= s)
            ns--;
        if (ns > 0)
            seg[ns - 1].last = s;
        seg[ns++] = (struct segment){&as[i], s, -1};
    }
    return ns;
}

int mg_logs_schedule(FILE *out, const struct logs_opts *lo, const char *dir, char *err, size_t cap)
{
    struct run_ent *runs = NULL;
    struct sched_attempt *as = NULL;
    int n = 0, na = 0, succeeded = 0, rc = mg_logs_runs_matching(dir, lo, &runs, &n, err, cap);
    if (rc)
        return rc;
    const char *sel = lo->run ? lo->run : runs[n - 1].id;
    char path[PATH_MAX + 300];
    mg_fmt(path, sizeof(path), "%s/%s/events.jsonl", dir, sel);
    rc = read_attempts(path, &as, &na, &succeeded);
    if (rc < 0) {
        mg_seterr(err, cap, rc, "cannot read the event log of run '%s' (%s): %s", sel, path,
                  mg_strerror(rc));
        goto out;
    }
    struct segment *seg = calloc((size_t)(na ? na : 1), sizeof(*seg));
    if (!seg) {
        rc = mg_seterr(err, cap, -ENOMEM, "out of memory");
        goto out;
    }
    int ns = build(as, na, seg);
    if (ns == 0) {
        rc = mg_seterr(err, cap, -ENOENT,
                       "run '%s' records no resume in %s: its workers did not say where they "
                       "went on from (a program not built on libmg, an mglaunch older than the "
                       "resume event, or --hang-timeout 0, which lends no progress record)",
                       sel, path);
        free(seg);
        goto out;
    }
    /* scripts/replay.sh reads these lines (the "# ... did not succeed" header,
     * and "attempt A: world size W (N node...), steps F-L, from ..." with the
     * disk source's path in parentheses last): a change here changes it too,
     * and tests/integration/replay.t runs both. */
    fprintf(out, "# run %s: %d segment%s%s\n", sel, ns, ns == 1 ? "" : "s",
            succeeded ? "" : " (the run did not succeed: its last segment ends where it stopped)");
    for (int i = 0; i < ns; i++) {
        const struct sched_attempt *a = seg[i].a;
        char last[32], src[MG_EV_LINE_MAX / 16 + 96], ranks[64];
        int64_t l = seg[i].last;
        if (l < 0 && !succeeded)
            l = a->end_step; /* where it stopped, or unknown */
        if (l >= 0)
            mg_fmt(last, sizeof(last), "%" PRId64, l);
        else
            mg_fmt(last, sizeof(last), "%s", succeeded ? "end" : "?");
        if (a->first_rank >= 0)
            mg_fmt(ranks, sizeof(ranks), "; here node %d, ranks %d-%d", a->node_rank, a->first_rank,
                   a->first_rank + a->nproc - 1);
        else
            ranks[0] = '\0';
        source_text(a, src, sizeof(src));
        fprintf(out, "attempt %d: world size %d (%d node%s%s), steps %" PRId64 "-%s, %s\n",
                a->attempt, a->world, a->nodes, a->nodes == 1 ? "" : "s", ranks, seg[i].first, last,
                src);
    }
    free(seg);
    rc = 0;
out:
    free(as);
    free(runs);
    return rc;
}
