/* What the parts of the agent share, and nobody else: struct mg_agent with
 * its workers and their output streams. agent.c runs the rounds (the state
 * machine, restarts, results, the backend API), agent_setup.c creates and
 * releases the agent; workers_spawn.c prepares and spawns the processes of an
 * attempt, workers.c reaps and stops them and keeps their exits; relay.c
 * routes their output to the log files and the console, and the keyboard to
 * a worker on a pseudo-terminal. */
#ifndef MG_AGENT_INTERNAL_H
#define MG_AGENT_INTERNAL_H

#include "agent.h"
#include "logdir.h"
#include "loop.h"
#include "oom.h"
#include "output.h"
#include "pty.h"
#include "sentinel.h"
#include "watch.h"

#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <sys/types.h>

#define READ_CHUNK  (64 * 1024)
#define CONSOLE_BUF (64 * 1024)
#define DRAIN_MS    1000 /* how long pipes may stay open after every worker exited */
#define PREFIX_MAX  512
/* A worker failure seen this long before mglaunch's own stop signal (SIGTERM
 * and the like) was the stop's: Slurm's scancel, systemd or a whole job's
 * deletion signal every process at once, and a worker (or its peer on another
 * node) may exit before mglaunch reads its own signal. Such a failure is
 * "stopped", not the root cause; and a run about to exit on such a failure
 * waits this long for the signal (docs/cli.md, Signals). */
#define STOP_WINDOW_MS         1000
#define MG_AGENT_EXTRA_ENV_MAX 4 /* mg_agent_env_add */
/* A worker still there this long after SIGKILL (uninterruptible sleep in
 * a driver or a file system) is reported and no longer waited for; long
 * enough for a GPU process to give its memory back. */
#define UNKILLABLE_MS 15000

enum stream_console {
    CON_NONE = -1,
    CON_OUT = 0,
    CON_ERR = 1,
};

struct stream {
    int fd;         /* pipe read end, -1 once closed */
    int file_fd;    /* stdout.log / stderr.log, -1 once closed, -2 when not saved */
    int file_errno; /* why writing file_fd failed (it was cut short there), or 0 */
    int console;    /* enum stream_console */
    int prefixed;
    int tee; /* -t selects it: its lines may be duplicated (filt_fd) */
    int pty; /* a pseudo-terminal's master: relayed as it comes, not by lines */
    int at_line_start;
    struct mg_linebuf lb;
};

enum outcome {
    W_IDLE,
    W_RUNNING,
    W_SUCCEEDED,
    W_FAILED,
    W_STOPPED,
};

struct worker {
    int local_rank, rank;
    pid_t pid;
    enum outcome outcome;
    int stop_sent;       /* the signal the launcher sent it to stop (0: none) */
    int exiting_at_stop; /* it was already exiting when the others were stopped */
    int group_pending;   /* the stop signal has reached the worker, not yet its group */
    int group_left;      /* it exited, its group has the stop signal: SIGKILL at the grace end */
    int wstatus;
    int exec_errno;
    int64_t start_ms, end_ms;
    struct stream out, err;
    char prefix[PREFIX_MAX];
    size_t prefix_len;
    char *tail; /* last MG_STDERR_TAIL_BYTES of stderr */
    size_t tail_len;
    int tail_cut;
    char **envp;
    char **argv; /* only when an argument uses ${local_rank} */
    int failure; /* index into the result's failures, or -1 */
    struct mg_oom_watch oom;
    char hang[512];       /* a watchdog condemned it: why ("" otherwise) */
    char verdict[64];     /* and in short: "was hung", "overstayed its file timer" */
    int64_t kill_ms;      /* when it was sent SIGKILL (0: not yet) */
    int has_pty;          /* runs on pseudo-terminals (pty.h) */
    struct mg_pty pty[2]; /* stdin+stdout (its controlling terminal), stderr */
};

struct console {
    int fd;
    char *buf;
    size_t len;
    int broken;
    const void *last; /* the stream that wrote the last piece */
};

enum state {
    ST_FORMING,
    ST_RUNNING,
    ST_BACKOFF,
    ST_HOLD,   /* succeeded; the backend holds the exit (mg_agent_hold_exit) */
    ST_ENDING, /* failed; waiting out STOP_WINDOW_MS for a stop signal before exiting */
    ST_DONE,
};

struct mg_agent {
    struct mg_agent_config cfg;
    const struct mg_launch_opts *o;
    int nproc;
    struct worker *w;
    struct mg_loop loop;
    struct mg_rundir rd;
    struct console con[2];
    char *rbuf;
    int *pipe_owner;          /* worker*2+stream of each pipe handed to the loop (-1: the tty) */
    char cvd[MG_GPU_IDS_MAX]; /* CUDA_VISIBLE_DEVICES for --gpu_ids, "" = leave alone */
    int filt_fd[2];           /* the attempt's filtered_stdout.log / filtered_stderr.log, or -1 */
    struct mg_tty tty;        /* mglaunch's terminal when workers get pseudo-terminals */
    /* A pseudo-terminal's line in progress on the console (a prompt): taken
     * off while another worker's line is written, then put back. */
    struct {
        const struct stream *s;
        const struct worker *w;
        char buf[1024];
        size_t len;
        int erase; /* the console is a terminal: erase the line, not just end it */
    } pend;
    struct mg_sentinel sent;
    int sentinel_restarts;

    enum state state;
    int group_ready;
    struct mg_group group;
    int round;
    int restarts_left;
    int attempt;
    char attempt_dir[PATH_MAX];
    int64_t attempt_start_ms;
    int running;    /* started and not yet reaped */
    int open_pipes; /* pipe read ends still open */
    int stopping;
    int64_t kill_deadline, drain_deadline, backoff_deadline;
    int64_t group_deadline;            /* when the stop signal goes to the workers' groups */
    int attempt_failed, attempt_fatal; /* fatal: 1 a program not started, 2 MG_EXIT_NO_RETRY */
    int restart_req, hold_req;
    enum mg_restart_kind restart_kind;
    char restart_reason[256];
    int term_sig, nterm;
    int fail_req, fail_code;
    int64_t hold_failure_until; /* a failure that a stop may have caused: ST_ENDING until then */
    int end_code;               /* ST_ENDING's exit code */
    int64_t end_deadline;
    struct mg_backoff backoff;
    int lingering; /* ST_DONE, but the backend still needs the loop (mg_agent_linger) */
    int64_t linger_deadline;
    struct {
        mg_agent_timer_fn fn;
        void *ctx;
    } timers[MG_LOOP_MAX_TIMERS]; /* the backends' timers, by loop timer id */

    sigset_t stop_set;  /* signals that stop the run (--signals-to-handle) */
    sigset_t reset_set; /* signals the workers get with their default action */

    /* Memories lent to the workers, kept for the run (mg_agent_rankmem_add):
     * per kind, its variable and one region per local rank. */
    struct {
        char env[64];
        struct mg_rankmem *m;
    } rankmem[MG_AGENT_RANKMEM_MAX];
    int nrankmem;
    struct mg_watch watch; /* the watchdogs (watchdog/watch.h) */
    /* More variables of the workers' environment ("NAME=value", malloc'd:
     * mg_agent_env_add): the file timer's FIFO, the Python hook's. */
    char *extra_env[MG_AGENT_EXTRA_ENV_MAX];
    int nextra_env;

    struct mg_agent_result res;
    int attempts_cap;
    long long proc_start; /* /proc/self/stat starttime, to tell a dead launcher */
};

/* How the workers of an attempt ended. */
struct mg_attempt_tally {
    int nfailed, nstopped;
    int first_failure; /* index into the result's failures, or -1 */
};

/* ---- agent.c ---- */

/* Adds "NAME=value" (taken: freed with the agent) to every worker's
 * environment. 0, or -ENOSPC past MG_AGENT_EXTRA_ENV_MAX (entry freed). */
int mg_agent_env_add(struct mg_agent *ag, char *entry);

/* Records the launcher's own failure (the first one wins) for the result. */
__attribute__((format(printf, 3, 4))) void mg_agent_error(struct mg_agent *ag, int err,
                                                          const char *fmt, ...);
/* Acts now on a stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) that is
 * pending for mglaunch and not read yet, so that a worker exit it caused is
 * classified after it. */
void mg_agent_take_stop_signal(struct mg_agent *ag);
/* Sets up ag's loop: the signals it handles (blocked, read from a
 * signalfd) and the workers' pipes, first in every poll. 0, or a negative
 * code with err set. */
int mg_agent_loop_init(struct mg_agent *ag, char *err, size_t errcap);

/* ---- workers_spawn.c ---- */

/* <attempt_dir>/<local_rank>, and its error.json (TORCHELASTIC_ERROR_FILE) */
void mg_worker_dir(const struct mg_agent *ag, int local_rank, char *buf, size_t cap);
void mg_worker_errfile_path(const struct mg_agent *ag, int local_rank, char *buf, size_t cap);
/* Frees what prepare built for w's spawn (its argv and environment). */
void mg_worker_setup_release(struct worker *w);

/* ---- workers.c (mg_workers_prepare and mg_workers_spawn: workers_spawn.c) ---- */

/* Resets the workers for the attempt in ag->attempt_dir and builds, before
 * the first fork, everything each needs: environment, argv, console prefix,
 * log files. A failure is recorded with mg_agent_error. */
void mg_workers_prepare(struct mg_agent *ag);
/* Spawns the prepared workers, until one fails to start (recorded with
 * mg_agent_error) or cannot be executed (then the others would fail alike). */
void mg_workers_spawn(struct mg_agent *ag);
/* Sends sig to every running worker's process group. */
void mg_workers_signal(struct mg_agent *ag, int sig);
/* Sends sig to every running worker process alone: a notice (SIGUSR1/2,
 * Slurm's warning before the time limit) is for the program, which decides
 * what its children hear; a child without a handler would die of it. */
void mg_workers_notify(struct mg_agent *ag, int sig);
/* Asks the running workers to stop with sig; SIGKILL at the grace deadline. */
void mg_workers_stop(struct mg_agent *ag, int sig);
/* SIGKILL to every running worker now; logs a kill event with why. */
void mg_workers_kill(struct mg_agent *ag, const char *why);
/* The stop signal to the process groups of the workers it has reached
 * alone (--stop_group_delay). */
void mg_workers_stop_groups(struct mg_agent *ag);
/* Whether a process group a stopped worker left behind still has members
 * (they get SIGKILL at the grace period's end, as workers do). */
int mg_workers_groups_left(struct mg_agent *ag);
/* A watchdog condemned local rank i: sig goes at once to pid (its process
 * group when pid is the worker's own: the progress watchdog's SIGKILL,
 * which a stopped process obeys too), and the worker will be the attempt's
 * failure, whatever its exit, with why as its message and verdict ("was
 * hung") in the summary; the others are stopped (SIGTERM, grace period,
 * SIGKILL). kind names it in the event log ("hung", "file timer"). */
void mg_workers_condemn(struct mg_agent *ag, int i, int sig, int pid, const char *kind,
                        const char *verdict, const char *why);
/* Workers still there UNKILLABLE_MS after SIGKILL: reported, and counted
 * as exited (killed) so the attempt can end. Returns the next such deadline
 * (mg_now_ms clock), or -1. */
int64_t mg_workers_unkillable(struct mg_agent *ag, int64_t now);
/* mglaunch's own stop signal has just come: the failures seen less than
 * STOP_WINDOW_MS ago were the stop's. They become "stopped" (a second
 * worker_exit event, and attempt_end when their attempt already ended) and
 * leave the result and its root cause. */
void mg_workers_excuse_recent(struct mg_agent *ag);
/* Collects every exited child (workers and the sentinel). */
void mg_workers_reap(struct mg_agent *ag);
/* Once every worker exited: reads the pipes to the end, closes the logs,
 * counts outcomes and fills the root cause of the run's first failure. */
void mg_workers_end(struct mg_agent *ag, struct mg_attempt_tally *t);
/* Kills what still runs and frees the per-worker state. */
void mg_workers_release(struct mg_agent *ag);

/* ---- worker_logs.c ---- */

/* After the drain: a worker_logs event for each failed worker and each one
 * whose log file was cut short (what was saved, a failed one's stderr tail). */
void mg_workers_report_logs(struct mg_agent *ag);
/* "stderr.log cut short: disk full", or "" when its logs were not cut. */
void mg_worker_logs_note(const struct worker *w, char *buf, size_t cap);

/* ---- relay.c ---- */

/* A launcher message on cfg.status, after the workers' pending output. */
__attribute__((format(printf, 2, 3))) void mg_agent_note(struct mg_agent *ag, const char *fmt, ...);
void mg_workers_flush(struct mg_agent *ag);
/* Reads what the pipes still hold (a bounded amount: a writer may have
 * escaped), closes them and flushes the console. */
void mg_workers_drain(struct mg_agent *ag);
/* The loop poller over the workers' pipes. */
int mg_workers_fill(void *ctx, struct pollfd *fds, int max);
int mg_workers_process(void *ctx, const struct pollfd *fds, int n);
/* After SIGWINCH: the terminal's size to every worker's pseudo-terminals. */
void mg_workers_resize(struct mg_agent *ag);
/* Whether a worker with a pseudo-terminal is running (the terminal's
 * settings follow: mg_tty_raw while one is). */
int mg_workers_on_pty(const struct mg_agent *ag);

#endif
