/* The event log's schema (docs/logs.md, "The event log"), in one place: a
 * struct per event, the writer the agent calls for each, and the parser that
 * `mglaunch logs` reads them back with. The file is a public contract, so
 * writer and parser are tested against each other (test_launch_events.c).
 *
 * The same structs serve both directions. Writing, a NULL string leaves an
 * optional field out; reading, a field that is absent comes back NULL (a
 * string) or -1 (attempt, local_rank, rank) or 0 (any other number). Strings
 * read back point into the reader and stay valid until its next line. */
#ifndef MG_EVENTS_H
#define MG_EVENTS_H

#include "logdir.h"

#include <stdint.h>
#include <stdio.h>

struct mg_json_tok;

#define MG_EV_ARGV_MAX    64          /* run_start keeps this many arguments ... */
#define MG_EV_ARGV_BYTES  4096        /* ... or this many bytes of them, then "..." */
#define MG_EV_MESSAGE_MAX 1024        /* worker_exit's message is cut to this many bytes */
#define MG_EV_LINE_MAX    (64 * 1024) /* the reader skips longer lines */

enum mg_event_kind {
    MG_EV_OTHER, /* an event this reader does not know: ignore it */
    MG_EV_RUN_START,
    MG_EV_ATTEMPT_START,
    MG_EV_WORKER_START,
    MG_EV_WORKER_EXIT,
    MG_EV_SIGNAL,
    MG_EV_KILL,
    MG_EV_ATTEMPT_END,
    MG_EV_RESTART,
    MG_EV_RUN_END,
    MG_EV_WORKER_LOGS,
    MG_EV_RESUME,
};

struct mg_ev_run_start {
    const char *run_id, *host;
    int pid;
    long long proc_start; /* the launcher's start time (mg_proc_start_time) */
    const char *version;
    int nproc, max_restarts;
    const char *role, *rdzv_backend;
    int logs_saved;    /* --log_dir: every stream is saved */
    char *const *argv; /* the workers' command line; cut, marked "...", when long */
    int argc;
};

struct mg_ev_attempt_start {
    int attempt, restart_count, round, nproc;
    int world_size, group_rank, group_world_size;
    int first_rank; /* this node's ranks: first_rank .. first_rank + nproc - 1 (-1: not known) */
    const char *master_addr;
    int master_port;
    const char *dir;
};

/* worker_start; also the first fields of worker_exit. */
struct mg_ev_worker {
    int attempt, local_rank, rank, pid;
};

struct mg_ev_worker_exit {
    struct mg_ev_worker w;
    const char *outcome;    /* "succeeded", "failed", "stopped" */
    int exit_code;          /* shell-style */
    const char *signal;     /* "SIGSEGV" when killed by one */
    const char *exec_error; /* strerror text when the program could not be executed */
    int64_t duration_ms;
    const char *message; /* from its error file */
    const char *oom;     /* killed by the kernel's OOM killer: what says so (oom.h) */
};

/* worker_logs: what became of a worker's output, once its attempt's pipes
 * are drained; written for a failed worker and for one whose log files
 * were cut short, so that `mglaunch logs` can say what it knows. */
struct mg_ev_worker_logs {
    struct mg_ev_worker w;
    const char *out, *err;   /* "saved", "not saved", "cut short: <why>" */
    const char *stderr_tail; /* a failed worker's last stderr lines, when stderr.log lacks them */
};

struct mg_ev_signal {
    const char *signal;
    int forwarded_only; /* SIGUSR1/SIGUSR2: passed to the workers, nothing else */
};

struct mg_ev_kill {
    int attempt, workers;
    const char *reason;
};

struct mg_ev_attempt_end {
    int attempt;
    const char *result; /* "succeeded", "failed", "stopped" */
    int failed, stopped;
    int64_t duration_ms;
    int64_t step; /* the steps this node's ranks had done at the end (the lowest); -1: not known */
};

/* resume: where an attempt's training went on from, as its ranks said
 * (the progress record, progress_rec.h), once per attempt per node: the
 * step every rank goes on from, and the state's source. */
struct mg_ev_resume {
    int attempt, rank;      /* the rank that said: this node's first that did */
    int world_size;         /* the attempt's */
    const char *from;       /* "start", "memory", "disk" */
    int64_t step, epoch;    /* the step it goes on from; its 1-based epoch */
    const char *source;     /* memory: "own" (each rank its own snapshot), "rank" (source_rank's,
                           sent to every rank), "shards" (ZeRO-1 shards gathered) */
    int source_rank;        /* "rank": the rank whose snapshot every rank took; else -1 */
    int source_world_size;  /* the world size the state was written at; 0: not known */
    const char *checkpoint; /* disk: the checkpoint file */
};

struct mg_ev_restart {
    int restart_count, max_restarts;
    int64_t backoff_ms;
    const char *reason;
};

struct mg_ev_root_cause {
    int attempt, rank, local_rank, pid, exit_code;
    const char *signal, *host;
    int64_t time_ms; /* when the failure was seen */
    const char *message;
};

/* The job's root cause when it was on another node (the rendezvous'
 * record): a rank there, or the node itself, lost (rank -1). */
struct mg_ev_remote_cause {
    int rank, local_rank, pid, exit_code;
    const char *signal, *host, *node;
    int64_t time_ms;
    int first_rank, nranks; /* a lost node's ranks (nranks 0: unknown) */
    const char *message;
};

struct mg_ev_run_end {
    const char *result; /* "succeeded", "failed", "signaled", "error" */
    int exit_code, rounds, restarts;
    const char *signal, *error;
    int has_root; /* root: this node's first failure */
    struct mg_ev_root_cause root;
    int has_remote; /* the job's root cause was on another node */
    struct mg_ev_remote_cause remote;
};

/* ---- writing: one line each, queued on the run directory's event log ---- */

/* Wall-clock milliseconds since the epoch, the events' "time_ms". */
int64_t mg_wall_ms(void);

void mg_event_run_start(struct mg_rundir *rd, const struct mg_ev_run_start *e);
void mg_event_attempt_start(struct mg_rundir *rd, const struct mg_ev_attempt_start *e);
void mg_event_worker_start(struct mg_rundir *rd, const struct mg_ev_worker *e);
void mg_event_worker_exit(struct mg_rundir *rd, const struct mg_ev_worker_exit *e);
void mg_event_worker_logs(struct mg_rundir *rd, const struct mg_ev_worker_logs *e);
void mg_event_signal(struct mg_rundir *rd, const struct mg_ev_signal *e);
void mg_event_kill(struct mg_rundir *rd, const struct mg_ev_kill *e);
void mg_event_attempt_end(struct mg_rundir *rd, const struct mg_ev_attempt_end *e);
void mg_event_restart(struct mg_rundir *rd, const struct mg_ev_restart *e);
void mg_event_resume(struct mg_rundir *rd, const struct mg_ev_resume *e);
void mg_event_run_end(struct mg_rundir *rd, const struct mg_ev_run_end *e);

/* What worker_logs' stdout and stderr say, as one note for a person:
 * "stderr.log cut short: disk full" (ENOSPC's text becomes "disk full"),
 * or "" when neither was cut short. */
void mg_event_logs_note(const char *out, const char *err, char *buf, size_t cap);

/* ---- reading ---- */

struct mg_event {
    enum mg_event_kind kind;
    const char *name; /* the "event" field */
    int64_t time_ms;
    union {
        struct mg_ev_run_start run_start;
        struct mg_ev_attempt_start attempt_start;
        struct mg_ev_worker worker_start;
        struct mg_ev_worker_exit worker_exit;
        struct mg_ev_signal signal;
        struct mg_ev_kill kill;
        struct mg_ev_attempt_end attempt_end;
        struct mg_ev_restart restart;
        struct mg_ev_run_end run_end;
        struct mg_ev_worker_logs worker_logs;
        struct mg_ev_resume resume;
    } u;
};

struct mg_event_reader {
    FILE *f;
    char *line; /* MG_EV_LINE_MAX */
    char *strs; /* the current event's strings, unescaped */
    struct mg_json_tok *toks;
    char *argv[MG_EV_ARGV_MAX + 2];
};

/* Opens an event log. Returns 0 or a negative errno (-ENOENT: there is none). */
int mg_event_reader_open(struct mg_event_reader *r, const char *path);
/* The next event: 1, or 0 at the end. Lines that are not a JSON object, or
 * are cut (a launcher killed mid-write) or longer than MG_EV_LINE_MAX, are
 * skipped. */
int mg_event_read(struct mg_event_reader *r, struct mg_event *ev);
void mg_event_reader_close(struct mg_event_reader *r);

#endif
