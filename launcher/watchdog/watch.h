/* The progress watchdog in the agent: it lends each local rank a progress
 * record (MG_PROGRESS_FD, rankmem.h), reads the records from a timer of the
 * agent's loop while an attempt runs, and acts on a hung rank (watchdog.h
 * judges): one line at once, the hung rank killed and named as the
 * attempt's failure, the others stopped, and the group restarted like after
 * any failure. */
#ifndef MG_WATCH_H
#define MG_WATCH_H

#include "filetimer.h"
#include "pytb.h"
#include "ticker.h"

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct mg_agent;

struct mg_watch {
    int kind;                /* the records' rankmem kind; -1: the watchdog is off */
    double floor_s;          /* --hang-timeout */
    int armed;               /* a check is scheduled */
    int said_remote;         /* this attempt's wait for another node was reported */
    int said_resume;         /* this attempt's resume event was written */
    struct mg_filetimer ft;  /* torch's file timer; ft.fd -1: off */
    int ft_poller;           /* its FIFO's poller id, -1: none */
    int ft_bad_said;         /* bad requests told this attempt */
    struct mg_ticker ticker; /* progress lines on the nodes other than node rank 0 */
    int py_kind;             /* Python tracebacks' rank memory (pytb.h); -1: off */
    char py_dir[PATH_MAX];   /* the hook's directory, "" when none */
    /* Stacks being taken before a hung rank is signalled (watch_stacks.c):
     * Python tracebacks first, then the native stacks (stacks.h). */
    struct {
        int active;
        int phase;                  /* 1: Python tracebacks, 2: native stacks */
        int culprit, pid, sig;      /* the hung rank's local rank, the process, its signal */
        const char *kind, *verdict; /* for mg_workers_condemn (static strings) */
        char why[512];
        int *pids;               /* per local rank: the process whose stacks are taken */
        pid_t *child;            /* per local rank: the tool, 0: none */
        struct mg_pytb_take *py; /* per local rank */
        int64_t deadline;
    } dump;
};

/* With --hang-timeout > 0: the records, one per local rank. A failure to
 * create them turns the watchdog off with a warning into warn (""
 * otherwise); the run goes on. */
void mg_watch_setup(struct mg_agent *ag, struct mg_watch *wd, char *warn, size_t cap);
/* With TORCHELASTIC_ENABLE_FILE_TIMER=1 in mglaunch's environment, as
 * torchrun: the FIFO (TORCHELASTIC_TIMER_FILE, or a new one whose path the
 * workers get in that variable) and its reader in the loop. 0, or a
 * negative errno with a message in err (the run cannot start: the workers
 * would fail to send their requests). */
int mg_watch_filetimer_setup(struct mg_agent *ag, struct mg_watch *wd, char *err, size_t cap);
/* MG_NODE_PROGRESS_EVERY (ticker.h). 0, or -EINVAL with a message in err. */
int mg_watch_ticker_setup(struct mg_agent *ag, struct mg_watch *wd, char *err, size_t cap);
/* Closes the FIFO (and removes one made here). */
void mg_watch_release(struct mg_agent *ag, struct mg_watch *wd);
/* Before an attempt's workers start: the old records are void; checks
 * begin. */
void mg_watch_attempt_start(struct mg_agent *ag, struct mg_watch *wd);
/* The event log's "resume" (events.h): once an attempt's first local rank
 * that says so has said where its training went on from (progress_rec.h),
 * once per attempt. Called from the check timer and at the attempt's end. */
void mg_watch_resume_event(struct mg_agent *ag, struct mg_watch *wd);
/* The lowest step this node's ranks had done by their records (the
 * attempt's end), or -1 when the watchdog is off or no rank kept one. */
int64_t mg_watch_lowest_step(struct mg_agent *ag, const struct mg_watch *wd);

/* For Python workers (the program runs under Python), unless
 * MG_PYTHON_TRACEBACKS=0: the hook's directory, a rank memory per local
 * rank and the workers' variables (pytb.h). A failure leaves Python
 * tracebacks off with a warning into warn ("" otherwise). */
void mg_watch_python_setup(struct mg_agent *ag, struct mg_watch *wd, char *warn, size_t cap);

/* ---- watch_stacks.c: stacks before a hung rank is signalled ---- */

/* Starts taking the stacks of every running local rank, culprit first
 * (pids: per local rank, the process to take, 0: the worker); then sig goes
 * to pid and the worker is condemned (kind, verdict, why:
 * mg_workers_condemn). Goes on from the check timer. */
void mg_watch_stacks_begin(struct mg_agent *ag, struct mg_watch *wd, int culprit, const int *pids,
                           int sig, int pid, const char *kind, const char *verdict,
                           const char *why);
/* 1 once done (the signal sent), 0 while tracebacks or tools are awaited.
 * give_up: the attempt ended another way: the tools are stopped, nothing is
 * sent. */
int mg_watch_stacks_step(struct mg_agent *ag, struct mg_watch *wd, int give_up);

#endif
