/* The progress watchdog's judgement: from copies of the local ranks'
 * progress records (common/progress_rec.h) and their /proc states, whether
 * a rank is hung, which one is the cause, and the one line that says so.
 * No I/O here: watch.c reads the records and acts on the verdict.
 *
 * A rank's bound is max(--hang-timeout, MG_HANG_STEPS x its slowest recent
 * step). Before its first step, and while it sets up, writes a checkpoint
 * or finishes, the bound is its collective timeout plus MG_HANG_MARGIN_MS:
 * the last resort, after the worker's own timeout had its chance to say
 * more. A rank that waits inside a collective is not the cause of its own
 * wait: the cause is a rank past its bound that is not in the collective
 * (spinning, blocked before it, in the kernel), or stopped. When every
 * local rank waits in a collective and the job spans nodes, the missing
 * rank is elsewhere: that is reported, not acted on. */
#ifndef MG_WATCHDOG_H
#define MG_WATCHDOG_H

#include "procstate.h"
#include "progress_rec.h"

#include <stddef.h>
#include <stdint.h>

#define MG_HANG_STEPS     10
#define MG_HANG_MARGIN_MS 5000

struct mg_watch_rank {
    int local_rank, rank, pid;
    int live; /* rec is this worker's own (magic and pid match) */
    struct mg_progress rec;
    struct mg_procstate ps; /* state 0: not read */
};

struct mg_hang_verdict {
    int culprit; /* index of the hung rank, -1: none */
    int remote;  /* every local rank waits for a rank on another node */
    char line[2048];
    char why[512]; /* the failure's message in the summary */
};

/* A rank's bound in microseconds, and how it was found ("the 10 s floor",
 * "10 x its slowest recent step, 1.2 s", "its collective timeout, 300 s,
 * + 5 s") into how. */
int64_t mg_watch_bound_us(const struct mg_progress *rec, double floor_s, char *how, size_t cap);

/* The collective a rank waits in (its newest entry, started), or NULL. */
const struct mg_progress_coll *mg_watch_waiting(const struct mg_progress *rec);

/* Whether rank i is past its bound at now_us. */
int mg_watch_stale(const struct mg_watch_rank *r, double floor_s, int64_t now_us);

/* The verdict over n local ranks. multi_node: the job has ranks on other
 * nodes. host names this node in the line. Returns 1 when v holds a hung
 * rank or a remote wait (v->remote), 0 when nothing is wrong. */
int mg_watch_judge(const struct mg_watch_rank *r, int n, int multi_node, double floor_s,
                   int64_t now_us, const char *host, struct mg_hang_verdict *v);

/* "allreduce #1234 (bucket 2, 814 KB)" into buf. */
const char *mg_watch_coll_text(const struct mg_progress_coll *c, char *buf, size_t cap);

#endif
