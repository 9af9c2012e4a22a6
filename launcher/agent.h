/* The agent: mglaunch's supervisor for the workers of one node.
 *
 * One thread, one poll() loop (loop.h). The loop watches a signalfd, every
 * worker's stdout and stderr pipe, and whatever descriptors the rendezvous
 * backend registers (pollers); its timeout is the nearest deadline (SIGKILL
 * after the grace period, restart backoff, pipe drain, backend timers).
 * Signals are blocked and read from the signalfd, so nothing runs in signal
 * context.
 *
 * Each round: the rendezvous backend forms the group (mg_agent_group_formed),
 * the agent claims a new attempt directory, builds every worker's argv and
 * environment, spawns them, and supervises. The first failure stops the
 * others (the stop signal, then SIGKILL after --shutdown_timeout); then the
 * group restarts while restarts are left, after the documented backoff.
 *
 * Multi-node backends plug in through struct mg_rdzv_ops plus the calls in the
 * "for rendezvous backends" section; they never block the loop for long
 * (docs/rendezvous.md, "The agent's loop"). The rendezvous store the agent
 * may host is one of the loop's pollers: there is no other thread.
 *
 * agent.c holds the rounds and this API, agent_setup.c its creation and
 * release, workers_spawn.c and workers.c the worker processes, relay.c their
 * output (agent_internal.h), events.c the event log it writes. */
#ifndef MG_AGENT_H
#define MG_AGENT_H

#include "loop.h"
#include "net.h"
#include "numa.h"
#include "opts.h"
#include "rankmem.h"

#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

struct mg_agent;

#define MG_GROUP_TOKEN_LEN 64 /* hex digits: 256 bits */

/* ---- the group a round forms ---------------------------------------------------- */

struct mg_group {
    int group_rank;       /* GROUP_RANK: this node's rank among the nodes */
    int group_world_size; /* GROUP_WORLD_SIZE: nodes in the group */
    int world_size;       /* WORLD_SIZE: workers in the group */
    int rank_offset;      /* RANK of this node's local rank 0 */
    int role_rank_offset; /* ROLE_RANK of local rank 0 */
    int role_world_size;  /* ROLE_WORLD_SIZE */
    char master_addr[MG_HOST_MAX];
    int master_port;
    int master_fd; /* socket holding master_port until the workers start, or -1;
                      the agent closes it just before spawning */
    /* Multi-node: the job's failure restarts so far, counted across nodes
     * (TORCHELASTIC_RESTART_COUNT; --max_restarts applies to it). Without
     * has_restart_count the agent counts its own. */
    int has_restart_count;
    int restart_count;
    /* The static backend across nodes: the workers' store is the one node
     * rank 0's agent hosts at master_addr:master_port for the agents
     * (TORCHELASTIC_USE_AGENT_STORE=True, torchrun's agent store), with
     * this token (NULL: none). */
    int use_agent_store;
    const char *agent_store_token;
    /* MG_STORE_TOKEN for the workers, so that rank 0's store lets in only
     * this job's ranks: "" for none (an inherited MG_STORE_TOKEN wins). */
    char store_token[MG_GROUP_TOKEN_LEN + 1];
};

struct mg_round_info {
    int round;         /* 0, 1, ... within this invocation */
    int restart_count; /* failure restarts so far (TORCHELASTIC_RESTART_COUNT) */
    int local_world_size;
};

/* Outcome of a round, reported to the backend. */
enum mg_round_result {
    MG_ROUND_SUCCEEDED, /* every local worker exited 0 */
    MG_ROUND_FAILED,    /* a local worker failed */
    MG_ROUND_STOPPED,   /* stopped by a signal or a restart request */
};

struct mg_rdzv_ops {
    const char *name;
    /* Starts forming the group for a round. The backend reports success with
     * mg_agent_group_formed() (now, or later from a poller/timer callback)
     * or a fatal error with mg_agent_fail(). Returns 0 or a negative code. */
    int (*next_round)(void *impl, struct mg_agent *ag, const struct mg_round_info *info);
    /* The local workers of the round have all exited. A backend may call
     * mg_agent_request_restart() from here (e.g. to re-form after a peer
     * failed). Optional. */
    void (*round_ended)(void *impl, struct mg_agent *ag, enum mg_round_result result);
    /* The agent is about to exit with this code. Optional. */
    void (*shutdown)(void *impl, struct mg_agent *ag, int exit_code);
    /* Frees the backend. Optional. */
    void (*release)(void *impl);
};

/* ---- configuration -------------------------------------------------------------------- */

struct mg_agent_config {
    const struct mg_launch_opts *opts; /* resolved (mg_opts_resolve) */
    const char *run_id;
    const char *hostname;
    const char *exec_path; /* what execve runs */
    char **argv;           /* worker argv (argv[0] as shown to the program) */
    int argc;
    char **environ;      /* the launcher's environment, the base of every worker's */
    const char *log_dir; /* base directory (given, or the private default) */
    int log_dir_given;   /* --log_dir: save every stream */
    int stdin_fd;        /* workers' stdin, or -1 to inherit */
    int on_tty;          /* mglaunch runs in the foreground of a terminal, its stdin: the
                            shown ranks run on pseudo-terminals (pty.h) */
    int out_fd, err_fd;  /* the console */
    FILE *status;        /* the launcher's own messages (NULL: none) */
    int sentinel;        /* start the sentinel (sentinel.h) */
    const struct mg_rdzv_ops *rdzv;
    void *rdzv_impl;
    const struct mg_numa_place *numa; /* --numa-binding: one per local rank, or NULL */
    /* A .py program (or -m): the interpreter it runs under, and what chose
     * it ("from PYTHON_EXEC", ...); NULL for any other program. */
    const char *python;
    const char *python_source;
};

/* ---- results ---------------------------------------------------------------------------- */

#define MG_MAX_FAILURES 256

/* One worker failure (a worker stopped by the agent is not one). */
struct mg_failure {
    int attempt, restart_count;
    int rank, local_rank;
    pid_t pid;
    int exit_code;       /* shell-style: the code, or 128+signal */
    int signo;           /* 0 for a normal exit */
    int exec_errno;      /* the program could not be executed */
    int64_t wall_ms;     /* when it was seen (ms since the epoch) */
    int64_t seen_ms;     /* the same on mg_now_ms()'s clock */
    int64_t duration_ms; /* how long the worker ran */
    char message[256];   /* from error.json, shortened */
    char oom[200];       /* killed by the kernel's OOM killer: what says so; "" otherwise */
    char verdict[64];    /* mglaunch's watchdogs killed it: "was hung", ... ("": no) */
};

/* The root cause (the first failure of the run), in full. */
struct mg_root_cause {
    struct mg_failure f;
    char exec_error[128]; /* why the program could not be executed, "" when it could */
    char host[MG_HOST_MAX];
    char error_file[4096];
    char message[2048];
    char traceback[8192];
    char stderr_tail[4096]; /* its last lines of stderr */
    char log_path[4096];    /* its attempt/rank directory */
    int logs_saved;         /* stdout.log/stderr.log exist there */
    int stderr_kept;        /* stderr_tail is all the launcher saw of it (it watched the pipe) */
    char logs_note[128];    /* "stderr.log cut short: disk full", or "" */
    int exit_unknown;       /* known from its error file alone (a torchrun log directory) */
};

/* The root cause when it was on another node, as the rendezvous recorded
 * it: a worker there, or the node itself, lost (rank -1). */
struct mg_remote_cause {
    int set;
    int rank, local_rank; /* -1: the node was lost */
    int exit_code, signo;
    long pid;
    int64_t wall_ms;
    int first_rank, nranks; /* a lost node's ranks (nranks 0: unknown) */
    char host[MG_HOST_MAX];
    char node[128]; /* its agent's id */
    char message[512];
};

struct mg_attempt_summary {
    int attempt, restart_count;
    int nfailed, nstopped;
    int first_failure; /* index into failures, or -1 */
    int64_t duration_ms;
};

struct mg_agent_result {
    int exit_code;
    int signo; /* the signal that ended the launcher, or 0 */
    int ok;
    int error; /* a launcher-side error (negative code), or 0 */
    char error_msg[512];
    int rounds;
    int restarts;
    struct mg_failure failures[MG_MAX_FAILURES];
    int nfailures, failures_dropped;
    struct mg_attempt_summary *attempts; /* rounds entries */
    struct mg_root_cause root;
    int root_failure; /* which of failures[] root is (-1: none yet) */
    /* set: the run's root cause was on another node; root (when there is
     * one) is this node's first failure, which followed it */
    struct mg_remote_cause remote;
    char run_dir[4096];
    char run_id[160];
    char hint[768]; /* what to try, when the failure says it (every rank missing a module) */
};

/* ---- life cycle ------------------------------------------------------------------------- */

/* Creates the agent (signalfd, run directory, event log). Blocks the signals
 * it handles in the calling thread. Returns 0 or a negative code with
 * *out NULL; err gets a message. */
int mg_agent_create(struct mg_agent **out, const struct mg_agent_config *cfg, char *err,
                    size_t errcap);
/* Runs rounds until success, exhausted restarts, a fatal error or a signal.
 * Returns the exit code for mglaunch. */
int mg_agent_run(struct mg_agent *ag);
const struct mg_agent_result *mg_agent_result(const struct mg_agent *ag);
void mg_agent_release(struct mg_agent *ag);

/* ---- for rendezvous backends (and other code running in the loop) ----------------- */

enum mg_restart_kind {
    MG_RESTART_FAILURE,    /* counts against --max_restarts */
    MG_RESTART_MEMBERSHIP, /* the group changed: does not count (torchrun's rule) */
};

/* The group for the current round is formed; copies g. */
int mg_agent_group_formed(struct mg_agent *ag, const struct mg_group *g);
/* Stops the local workers (stop signal, then SIGKILL after the grace period)
 * and forms the group again. Safe from any callback, in any state. */
void mg_agent_request_restart(struct mg_agent *ag, enum mg_restart_kind kind, const char *reason);
/* Ends the run: stops the workers and exits with exit_code (a rendezvous
 * timeout, a closed store...). msg is printed by mglaunch. */
void mg_agent_fail(struct mg_agent *ag, int exit_code, const char *msg);
/* Before mg_agent_fail: the job's root cause was on another node (rc); the
 * summary names it, and this node's own failures as what followed. */
void mg_agent_remote_cause(struct mg_agent *ag, const struct mg_remote_cause *rc);
/* From round_ended(SUCCEEDED): do not exit yet (a multi-node exit barrier).
 * The backend later calls mg_agent_finish(), or mg_agent_request_restart()
 * when the job restarts elsewhere, or mg_agent_fail(). */
void mg_agent_hold_exit(struct mg_agent *ag);
/* Ends a held exit with exit_code. */
void mg_agent_finish(struct mg_agent *ag, int exit_code);
/* From round_ended(MG_ROUND_FAILED): the backend takes the failure over (a
 * multi-node job re-forms the group on every node and counts the restart
 * there, see mg_group.restart_count): form the group again, without counting
 * a restart or exiting. Ignored when the program could not be started. */
void mg_agent_excuse_failure(struct mg_agent *ag, const char *reason);

/* From shutdown(): keep the loop running (signals, pollers, timers) after
 * the run ended, until mg_agent_linger_end() or deadline_ms (mg_now_ms()
 * clock); a terminating signal ends it at once. mg_agent_run returns then,
 * with the run's exit code. The agent hosting the rendezvous store uses it
 * to keep serving the store until the other agents have read the outcome. */
void mg_agent_linger(struct mg_agent *ag, int64_t deadline_ms);
void mg_agent_linger_end(struct mg_agent *ag);

/* A source of descriptors for the agent's loop: the fields of struct
 * mg_poller (loop.h), which says what each does. The store server's
 * mg_store_server_pollfds / _process / _timeout_ms have these shapes. */
struct mg_agent_poller {
    int (*fill)(void *ctx, struct pollfd *fds, int max);
    int (*process)(void *ctx, const struct pollfd *fds, int n);
    int (*timeout_ms)(void *ctx);
    void *ctx;
};

/* Returns an id (>= 0) for mg_agent_remove_poller, or -ENOSPC when the
 * loop's MG_LOOP_MAX_POLLERS are taken (the agent's own pipes hold one). */
int mg_agent_add_poller(struct mg_agent *ag, const struct mg_agent_poller *p);
void mg_agent_remove_poller(struct mg_agent *ag, int id);

typedef void (*mg_agent_timer_fn)(struct mg_agent *ag, void *ctx);
/* Calls fn once at deadline_ms (mg_now_ms() clock). Returns an id, or
 * -ENOSPC when the loop's MG_LOOP_MAX_TIMERS are taken. */
int mg_agent_add_timer(struct mg_agent *ag, int64_t deadline_ms, mg_agent_timer_fn fn, void *ctx);
void mg_agent_cancel_timer(struct mg_agent *ag, int id);

/* ---- memory lent to the workers (rankmem.h) ---------------------------------------- */

#define MG_AGENT_RANKMEM_MAX 4

/* Registers a memory that each local rank keeps for the whole run: one memfd
 * per local rank ("mg-<name>-<local_rank>"), size bytes, zeroed, created
 * now. Every attempt's worker of that rank inherits its own (and no other
 * rank's), with the descriptor's number in the environment variable env
 * (docs/environment.md). Returns the kind (>= 0) for mg_agent_rankmem,
 * -ENOSPC past MG_AGENT_RANKMEM_MAX kinds, -EINVAL for a bad name, or
 * -errno (nothing is kept then). Call it before mg_agent_run. */
int mg_agent_rankmem_add(struct mg_agent *ag, const char *env, const char *name, size_t size);
/* That kind's region of local_rank (the agent's mapping), or NULL. */
struct mg_rankmem *mg_agent_rankmem(struct mg_agent *ag, int kind, int local_rank);

/* ---- restart backoff (docs/cli.md "Restarts") -------------------------------------- */

#define MG_BACKOFF_WINDOW_MS 10000 /* an attempt shorter than this failed "quickly" */
#define MG_BACKOFF_BASE_MS   100
#define MG_BACKOFF_MAX_MS    10000

struct mg_backoff {
    int streak; /* consecutive quick failures before this one */
};

/* Delay before restarting after an attempt that ran ran_ms: none for the
 * first restart and after any attempt that ran at least the window; then
 * 100 ms, doubling with each further quick failure, at most 10 s. */
int64_t mg_backoff_next(struct mg_backoff *b, int64_t ran_ms);

#endif
