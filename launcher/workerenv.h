/* What a worker runs and the environment it runs in: finding the program
 * (PATH, then next to mglaunch; a .py under python3 -u), and building each
 * worker's envp with torchrun's variables (docs/environment.md). */
#ifndef MG_WORKERENV_H
#define MG_WORKERENV_H

#include <stddef.h>

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
    int run_path;         /* --run_path: python3 -u program whatever its name (wins over
                             no_python, as in torchrun) */
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
    /* mg's own: where the run's logs are on this node (<log_dir>/<run_id>)
     * and the attempt directory's number, so rank 0 can put its metrics
     * beside them (MG_RUN_LOG_DIR, MG_ATTEMPT; NULL and -1: not set) */
    const char *run_log_dir;
    int attempt;
    /* The agent hosts the workers' store at MASTER_ADDR:MASTER_PORT (the
     * static backend across nodes): TORCHELASTIC_USE_AGENT_STORE=True, and
     * MG_AGENT_STORE=mg so that libmg joins it (runtime/dist.h), with
     * MG_AGENT_STORE_TOKEN when the store has a token (NULL: none). */
    int use_agent_store;
    const char *agent_store_token;
    const char *store_token; /* MG_STORE_TOKEN; NULL or "": leave it alone */
    /* More entries of mg's own, "NAME=value" (the descriptors of the memory
     * the agent lends the worker, rankmem.h), NULL-terminated; the base's
     * variables of the same names are dropped. NULL: none. */
    char *const *extra;
};

/* Builds a worker's envp: base minus every variable set here (and
 * MG_AGENT_STORE, MG_AGENT_STORE_TOKEN), plus torchrun's variables,
 * MG_RUN_LOG_DIR and MG_ATTEMPT, the extra entries, OMP_NUM_THREADS=1 when unset in base and
 * local_world_size > 1, NCCL_ASYNC_ERROR_HANDLING and
 * TORCH_NCCL_ASYNC_ERROR_HANDLING (each inherited or 1), MG_STORE_TOKEN when
 * store_token is given and base has none. The result is one allocation
 * (free() it). Returns 0 or -ENOMEM / -E2BIG. */
int mg_env_build(char *const *base, const struct mg_worker_env *we, char ***out);

#endif
