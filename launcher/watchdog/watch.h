/* The progress watchdog in the agent: it lends each local rank a progress
 * record (MG_PROGRESS_FD, rankmem.h), reads the records from a timer of the
 * agent's loop while an attempt runs, and acts on a hung rank (watchdog.h
 * judges): one line at once, the hung rank killed and named as the
 * attempt's failure, the others stopped, and the group restarted like after
 * any failure. */
#ifndef MG_WATCH_H
#define MG_WATCH_H

#include <stddef.h>
#include <stdint.h>

struct mg_agent;

struct mg_watch {
    int kind;        /* the records' rankmem kind; -1: the watchdog is off */
    double floor_s;  /* --hang-timeout */
    int armed;       /* a check is scheduled */
    int said_remote; /* this attempt's wait for another node was reported */
};

/* With --hang-timeout > 0: the records, one per local rank. A failure to
 * create them turns the watchdog off with a warning into warn (""
 * otherwise); the run goes on. */
void mg_watch_setup(struct mg_agent *ag, struct mg_watch *wd, char *warn, size_t cap);
/* Before an attempt's workers start: the old records are void; checks
 * begin. */
void mg_watch_attempt_start(struct mg_agent *ag, struct mg_watch *wd);

#endif
