/* The log layout (docs/logs.md):
 *
 *   <log_dir>/<run_id>/events.jsonl                  the launcher's event log
 *   <log_dir>/<run_id>/attempt_<n>/<local_rank>/{stdout.log,stderr.log,error.json}
 *
 * Attempt numbers continue across invocations with the same run id and are
 * claimed with mkdir, so no directory is ever reused; log files are created
 * with O_EXCL, so none is ever overwritten. The event log is one JSON object
 * per line, appended with single write() calls so it can be read while the
 * run goes on and is still valid after the launcher was killed. */
#ifndef MG_LOGDIR_H
#define MG_LOGDIR_H

#include <limits.h>
#include <stddef.h>

#define MG_EVENTS_FILE "events.jsonl"
#define MG_EVENT_BUF   (64 * 1024)

struct mg_rundir {
    char dir[PATH_MAX]; /* <log_dir>/<run_id> */
    int events_fd;
    char *ev; /* pending event lines */
    size_t evlen;
    int ev_err;           /* first write error of the event log */
    long long ev_reserve; /* bytes to hold ahead of the event log's end (0: none) */
    long long ev_held_to; /* the offset up to which they are held */
};

/* ${TMPDIR:-/tmp}/mglaunch-<uid>, created mode 0700 and checked to be ours
 * (not a symlink, not someone else's). */
int mg_logdir_default(char *buf, size_t cap);

/* A fresh run id: "<YYYYmmdd-HHMMSS>-<6 hex digits>". */
int mg_run_id_generate(char *buf, size_t cap);

/* Creates <log_dir>/<run_id> (and log_dir) and opens its event log. */
int mg_rundir_open(struct mg_rundir *rd, const char *log_dir, const char *run_id);
/* Holds bytes of disk ahead of the event log's end from now on (fallocate
 * past its end, its size unchanged; renewed as it grows), so that the
 * events saying the workers' logs filled the disk still fit. Best effort:
 * a filesystem without fallocate holds none. The space stays allocated to
 * the file (another launcher may append to it: releasing would race). */
void mg_rundir_reserve(struct mg_rundir *rd, long long bytes);
/* Claims the next attempt directory and its rank subdirectories.
 * *attempt gets the number, path the directory. */
int mg_rundir_new_attempt(struct mg_rundir *rd, int nproc, int *attempt, char *path, size_t cap);
/* Queues one event line (a JSON object without the newline). Lines are
 * written by mg_rundir_flush, or at once when the queue is full. */
void mg_rundir_event(struct mg_rundir *rd, const char *json, size_t len);
int mg_rundir_flush(struct mg_rundir *rd);
void mg_rundir_close(struct mg_rundir *rd);

/* N for a directory name "attempt_N", -1 for any other name. */
int mg_attempt_number(const char *name);
/* The largest attempt number a directory or the event log may name. */
#define MG_ATTEMPT_MAX 100000000
/* The highest attempt number under a run directory, or -1. */
int mg_rundir_last_attempt(const char *rundir);

#endif
