/* Worker processes: finding the program, building each worker's environment
 * (torchrun's contract, docs/environment.md), counting GPUs without CUDA,
 * and spawning a worker in its own process group with its exec failure
 * reported back to the launcher. */
#ifndef MG_PROC_H
#define MG_PROC_H

#include <stddef.h>
#include <sys/types.h>

/* ---- the program ---------------------------------------------------------------- */

struct mg_prog {
    char path[4096];     /* what execve runs ("" when nothing was found: exec reports ENOENT) */
    const char *lead[4]; /* argv entries before the user's: {python, "-u", "-m"} or none */
    int nlead;
    char lead_buf[512];
};

struct mg_prog_req {
    const char *program;  /* the first positional argument */
    int module;           /* -m: python3 -u -m program */
    int no_python;        /* run program directly even if it ends in .py */
    const char *python;   /* PYTHON_EXEC or NULL for "python3" */
    const char *path_env; /* PATH or NULL */
    const char *self_dir; /* directory of the mglaunch executable, or NULL */
};

/* Decides what to execute: a .py program (or -m) runs under python3 -u; a
 * bare name is looked up in PATH and then next to mglaunch. Returns -ENOENT
 * when the program (or the python interpreter) does not exist anywhere; out
 * is filled in all the same. Something that exists but cannot be executed is
 * left for the worker's exec to report (126/127). */
int mg_prog_resolve(const struct mg_prog_req *req, struct mg_prog *out);

/* Searches name in a PATH string for an executable regular file. 0 or -ENOENT. */
int mg_path_search(const char *name, const char *path_env, char *out, size_t cap);

/* ---- the environment ------------------------------------------------------------- */

struct mg_worker_env {
    int local_rank, rank, group_rank, role_rank;
    const char *role_name;
    int local_world_size, world_size, group_world_size, role_world_size;
    const char *master_addr;
    int master_port;
    int restart_count, max_restarts;
    const char *run_id;
    const char *error_file;
    const char *cuda_visible_devices; /* NULL: leave the inherited value alone */
};

/* Builds a worker's envp: base minus every variable set here, plus torchrun's
 * variables, OMP_NUM_THREADS=1 when unset in base and local_world_size > 1,
 * NCCL_ASYNC_ERROR_HANDLING (inherited or 1). The result is one allocation
 * (free() it). Returns 0 or -ENOMEM / -E2BIG. */
int mg_env_build(char *const *base, const struct mg_worker_env *we, char ***out);

/* Value of name in an envp array, or NULL. */
const char *mg_env_get(char *const *env, const char *name);
/* The same, from the process environment when env is NULL. */
const char *mg_env_lookup(char *const *env, const char *name);

/* When process pid started, in clock ticks after boot (/proc/<pid>/stat field
 * 22): with the pid, it tells a live process from a later one that reused the
 * pid. -1 when it cannot be read. */
long long mg_proc_start_time(int pid);

/* ---- GPUs ------------------------------------------------------------------------ */

/* GPUs on the machine, from /proc/driver/nvidia/gpus (one entry per GPU) or
 * else /dev/nvidiaN. The directories are parameters for the tests; NULL
 * selects the real ones. */
int mg_gpu_count_system(const char *proc_gpus_dir, const char *dev_dir);

/* GPUs a process sees under CUDA_VISIBLE_DEVICES=cvd on a machine with
 * system_count GPUs (-1: unknown): CUDA's rules, entries up to the first
 * invalid one (a negative or out-of-range index); GPU-/MIG- UUIDs count.
 * cvd NULL means unset: all of them. */
int mg_gpu_count_visible(const char *cvd, int system_count);

/* ---- spawning -------------------------------------------------------------------- */

struct mg_spawn_req {
    const char *path; /* execve path */
    char *const *argv;
    char *const *envp;
    int stdin_fd;  /* dup'ed onto 0, or -1 to inherit */
    int stdout_fd; /* pipe write ends dup'ed onto 1 and 2 */
    int stderr_fd;
    int sentinel_fd; /* -1, or where the child announces its process group */
};

struct mg_spawned {
    pid_t pid;      /* also the worker's process group id */
    int exec_errno; /* the exec failed with this errno: the child exits 127/126 */
};

/* vforks and execs. In the child: own process group, PR_SET_PDEATHSIG
 * SIGKILL, signal mask and SIGPIPE restored, group announced to the
 * sentinel, stdio set up, execve. When exec fails, the child stores the errno
 * in the parent's memory (vfork shares it until exec) and exits 127 (not
 * found) or 126 (cannot execute); mg_spawn returns with exec_errno set. */
int mg_spawn(const struct mg_spawn_req *req, struct mg_spawned *out);

/* ---- statuses ---------------------------------------------------------------------- */

/* "SIGSEGV" (or "SIG62"); buf is used for unnamed ones. */
const char *mg_signame(int sig, char *buf, size_t cap);
/* Parses "SIGTERM", "TERM" or "15". Returns the number or -EINVAL. */
int mg_signum(const char *name);
/* Shell-style code for a wait status: the exit code, or 128+signal. */
int mg_status_code(int wstatus);

#endif
