/* What the files of `mglaunch logs` (and the dashboard) share: a run as its
 * event log and its directories tell it (logs_read.c builds it, logs_cmd.c
 * prints it, logs_runs.c lists and filters the runs), and the options.
 * logs_follow.c prints, tails, greps and follows the log files. */
#ifndef MG_LOGS_INTERNAL_H
#define MG_LOGS_INTERNAL_H

#include "agent.h"

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct logs_opts;

/* ---- a run ---- */

struct lworker {
    int local_rank, rank, pid;
    int64_t start_ms;
    int exited;
    char outcome[16];
    int exit_code;
    char signal[24];
    char message[256];
    char exec_error[96];
    char oom[200]; /* killed by the kernel's OOM killer: what says so */
    int64_t duration_ms;
    int from_errfile; /* no event log: known to have failed from its error.json alone */
    /* Its worker_logs event: "saved", "not saved", "cut short: <why>" per
     * stream ("" without one), and a failed worker's stderr tail as the
     * launcher kept it when stderr.log lacks it (malloc'd, or NULL). */
    int logs_known;
    char out_log[96], err_log[96];
    char *stderr_tail;
};

struct lattempt {
    int attempt, restart_count, nproc;
    int64_t start_ms;
    int ended;
    char result[16];
    int64_t duration_ms;
    struct lworker *w;
    int nw, cap;
};

struct lroot {
    int attempt, rank, local_rank, pid, exit_code;
    int exit_unknown; /* from an error file alone (torchrun's logs): no exit code */
    char signal[24];
    char message[512];
    char host[256];
    int64_t time_ms;
};

struct lrun {
    char id[256];
    char dir[PATH_MAX];
    int has_events;
    int64_t start_ms;
    int pid;
    long long proc_start;
    char host[256];
    int nproc, max_restarts, invocations, logs_saved;
    int ended;
    char result[16];
    int exit_code;
    char signal[24];
    char error[256];
    int has_root;
    struct lroot root;
    int has_first_fail;
    struct lroot first_fail;       /* fallback root cause when the launcher died */
    struct mg_remote_cause remote; /* set: the job's root cause was on another node */
    struct lattempt *a;
    int na, acap;
    int alive;
    /* A torchrun log directory (<run_id>_<random>, no event log): the run
     * id it was given, and whether any error file says a worker failed. */
    int torchrun;
    char torchrun_id[256];
    int errfiles;
    /* What it ran (logs_runs.c): the command as typed after mglaunch's
     * options (the program by its file name), and its program (a script's
     * or binary's file name, or -m's module). */
    char cmd[512];
    char prog[256];
};

/* Builds r from <base>/<id>: its event log (lines cut or not JSON are
 * skipped) and the attempt directories the log does not mention. */
int mg_logs_load_run(struct lrun *r, const char *base, const char *id);
void mg_logs_run_free(struct lrun *r);
/* r's attempt number attempt; with create, added when it is not there (NULL
 * when out of memory, or for a negative attempt). */
struct lattempt *mg_logs_find_attempt(struct lrun *r, int attempt, int create);
/* Whether name is a torchrun run directory (run_id, "_", 8 characters of
 * [a-z0-9_]); if so, its run id into run_id. */
int mg_logs_torchrun_dir_name(const char *name, char *run_id, size_t cap);

struct run_ent {
    char id[256];
    int64_t start_ms;
    char cmd[512]; /* lrun's, filled by mg_logs_runs */
};

/* ---- logs_runs.c: the run list, what a run ran, and the run filters ---- */

/* Sets r->cmd and r->prog from run_start's argv. */
void mg_logs_set_command(struct lrun *r, char *const *argv, int argc);
/* Whether r ran program (its file name, with or without the extension, or
 * its module) and its command contains cmd; a NULL filter matches all. */
int mg_logs_run_matches(const struct lrun *r, const char *program, const char *cmd);
/* The command column: cmd cut to width characters, ending "..." when cut. */
void mg_logs_command_column(const char *cmd, int width, char *buf, size_t cap);

/* --run ID as given: a run directory of dir, or else the run id torchrun
 * gave (its directory is ID_<random>; the newest such). Returns the
 * directory's name (id itself, or buf). */
const char *mg_logs_resolve_run(const char *dir, const char *id, char *buf, size_t cap);

/* The runs in dir, oldest first (by their event logs' start). Returns 0, or
 * a negative code with err set (-ENOENT: there are none). */
int mg_logs_runs(const char *dir, struct run_ent **runs, int *n, char *err, size_t cap);
/* The same, only the runs that match lo's program and --cmd filters
 * (-ENOENT, err set, when none does). */
int mg_logs_runs_matching(const char *dir, const struct logs_opts *lo, struct run_ent **runs,
                          int *n, char *err, size_t cap);

/* The run directories in dir (those with an event log or an attempt
 * directory), unsorted, start_ms from the directory's time: without reading
 * any event log. 0 or -errno. */
int mg_logs_list_runs(const char *dir, struct run_ent **runs, int *n);

/* Whether the launcher of a run that has not ended still runs (same host,
 * pid and start time). */
int mg_logs_launcher_alive(const struct lrun *r);
/* "running", "succeeded", "failed (exit 3)", "launcher died", ... */
void mg_logs_run_status(const struct lrun *r, char *buf, size_t cap);
/* "running", "failed: exit 3 after 1.2 s", ... */
void mg_logs_worker_state(const struct lrun *r, const struct lworker *w, char *buf, size_t cap);
/* The root cause block as the failure summary has it (or the first failure
 * of a run that recovered). Returns 0 when the run has no failure. */
int mg_logs_print_root(FILE *out, const struct lrun *r);

/* ---- options ---- */

struct logs_opts {
    const char *dir;
    const char *run;
    int attempt; /* -1 last, -2 all */
    int attempt_given;
    int ranks[256];
    int nranks;
    int streams; /* 1 out, 2 err, 3 both */
    long tail;   /* -1: all */
    int follow;
    const char *grep;
    int content;
    const char *plot; /* --plot FILE.svg ("-": stdout) */
    int schedule;     /* --schedule */
    int help;
    const char *program; /* runs of this program only (the argument after LOG_DIR) */
    const char *cmd;     /* --cmd TEXT: runs whose command contains TEXT */
    int program_only;    /* the one argument was taken as PROGRAM: no such directory */
};

/* Prints the selected lines of the selected files, following them with
 * --follow. Returns 0, or a negative code with err set. */
int mg_logs_content(FILE *out, const struct logs_opts *lo, const char *dir, char *err, size_t cap);

/* --plot: the run's metrics (every attempt's, or --attempt's) as an SVG file
 * (logs_plot.c). Returns 0, or a negative code with err set. */
int mg_logs_plot(FILE *out, const struct logs_opts *lo, const char *dir, char *err, size_t cap);

/* --schedule: the membership schedule of the run's event log, a segment a
 * line (logs_schedule.c). Returns 0, or a negative code with err set. */
int mg_logs_schedule(FILE *out, const struct logs_opts *lo, const char *dir, char *err, size_t cap);

/* ---- a job's earlier runs on the plot (logs_plot.c; the dashboard's too) ---- */

#define MG_LOGS_JOB_RUNS 16 /* runs of one job drawn together, at most */

/* The runs of run id's job in the log directory base, earliest first and id
 * last: the run whose checkpoint id resumed (its metrics' first start
 * record's "resumed_run", docs/metrics.md), the run that one resumed, and so
 * on, while their directories are in base. Returns how many (1: id alone). */
int mg_logs_job_runs(const char *base, const char *id, char (*ids)[256], int max);

struct mg_plot;
/* The plot's number of attempt a of the job's run k (0: the earliest): the
 * attempts of earlier runs come first; a run alone keeps its numbers. */
int mg_logs_plot_number(int k, int attempt);

/* Adds the metrics of the n - 1 earlier runs in ids (as mg_logs_job_runs
 * gives them) to p, each attempt under mg_logs_plot_number and labelled "run
 * K attempt A", and labels the last run's attempts (those of r, numbered
 * mg_logs_plot_number(n - 1, a) by the caller) the same way when n > 1. *files counts the files read. 0, or a negative
 * code (-MG_ETOOBIG: what fitted is kept). */
int mg_logs_plot_earlier(struct mg_plot *p, const char *base, char (*ids)[256], int n,
                         const struct lrun *r, int *files);

/* The plot's title: "run ID", or with earlier runs "runs A, B, ID (one job, each run
 * resuming the one before)". */
void mg_logs_plot_title(char *buf, size_t cap, char (*ids)[256], int n);

#endif
