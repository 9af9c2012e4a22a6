/* The distributed context of a worker: who it is (from the launcher's
 * environment, mglaunch's or torchrun's), the store it bootstraps through, and
 * its communicator. Also the error file a failing worker leaves for the
 * launcher (TORCHELASTIC_ERROR_FILE, torchrun's JSON format).
 *
 * Environment (docs/distributed.md): RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID,
 * TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
 * TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_ERROR_FILE; and mg's own
 * MG_STORE_TOKEN, MG_AGENT_STORE, MG_AGENT_STORE_TOKEN, MG_COMM, MG_COMM_TIMEOUT,
 * MG_COMM_INIT_TIMEOUT, MG_COMM_HOST, MG_COMM_ADDR. The communicator follows the
 * compute device (mg_dist_opts.backend): NCCL for CUDA under MG_COMM=auto.
 * With neither RANK nor WORLD_SIZE set, the worker runs alone (world size 1).
 *
 * With world size > 1, rank 0 hosts the store on MASTER_PORT in a background
 * thread, the way torch.distributed does when TORCHELASTIC_USE_AGENT_STORE is
 * False: on MASTER_ADDR itself when it is one of this machine's addresses
 * (loopback stays loopback), else on every interface; with MG_STORE_TOKEN
 * (mglaunch sets it), only clients holding the token get in. Every rank
 * connects to MASTER_ADDR:MASTER_PORT, retrying until the init timeout. With
 * TORCHELASTIC_USE_AGENT_STORE=True the launcher's agent hosts the store
 * there instead (mglaunch's static backend across nodes, which says so with
 * MG_AGENT_STORE=mg): every rank, rank 0 too, joins it, in the namespace
 * /worker/attempt_<TORCHELASTIC_RESTART_COUNT>/ as torch's workers do, with
 * MG_AGENT_STORE_TOKEN when the agents' store has one. torchrun's own agent
 * store speaks torch's TCPStore, which libmg does not: an error says what
 * to use instead. */
#ifndef MG_DIST_H
#define MG_DIST_H

#include "comm.h"
#include "net.h"
#include "store.h"

#include <limits.h>

#define MG_DIST_RUN_ID_MAX 128
#define MG_DIST_MAX_WORLD  (1 << 20)

struct mg_dist_env {
    int launched; /* RANK or WORLD_SIZE was set */
    int rank, world;
    int local_rank, local_world;
    int group_rank;
    int restart_count, max_restarts;
    char master_addr[MG_HOST_MAX];
    int master_port;
    char run_id[MG_DIST_RUN_ID_MAX + 1];
    int use_agent_store; /* -1 unset, 0 False, 1 True */
    int agent_store_mg;  /* the agent's store is mg's (MG_AGENT_STORE=mg) */
    char error_file[PATH_MAX];
    char store_token[MG_STORE_MAX_TOKEN + 1]; /* MG_STORE_TOKEN, "" = none */
    int single_host; /* LOCAL_WORLD_SIZE == WORLD_SIZE: every rank on this machine */
    int cuda_device; /* MG_CUDA_DEVICE: the CUDA device instead of LOCAL_RANK; -1 unset */
    /* MG_TEST_COMM_THREAD=1 (tests): at world size 1 too, the communicator the device asks
     * for (NCCL on a GPU) and DDP's communication thread, so one GPU runs the overlap path */
    int test_comm_thread;
};

/* Reads and validates the launcher's variables. A bad value returns -EINVAL
 * with a message naming the variable and the value in err. */
int mg_dist_env_read(struct mg_dist_env *env, char *err, size_t errlen);

struct mg_store;
struct mg_store_server;

struct mg_dist {
    struct mg_dist_env env;
    int rank, world, local_rank, local_world;
    char hostname[MG_HOST_MAX];
    struct mg_store_server *server; /* rank 0 only */
    struct mg_store *store;         /* NULL at world size 1 */
    struct mg_comm *comm;
    const struct mg_dist_opts *opts; /* during mg_dist_init only */
};

struct mg_backend;

struct mg_dist_opts {
    int init_timeout_ms; /* 0: MG_COMM_INIT_TIMEOUT, else 300 s */
    /* The compute backend, made before the communicator: on CUDA, MG_COMM=auto
     * is NCCL on device_index (LOCAL_RANK) behind the backend's stream, and a
     * CPU communicator (MG_COMM=cpu, shm, tcp) works as well (DDP stages the
     * gradients through host memory). NULL: the CPU. MG_COMM=nccl needs CUDA. */
    const struct mg_backend *backend;
    int device_index;
    /* Each rank chose its device by itself (--device auto): before the
     * communicator starts, the ranks check through the store that they all
     * chose the same, and fail at once, naming a rank that differs, when
     * not (its reason in auto_why) instead of waiting on mismatched
     * communicators until the init timeout. */
    int device_auto;
    const char *auto_why; /* why --device auto chose the CPU on this rank ("" / NULL) */
    /* Optional: what the program should tell its user while mg_dist_init
     * works (libmg prints nothing): a wait for the store or for a peer that
     * lasts more than a few seconds, with the reason (the resolver's or the
     * kernel's word: the name does not resolve, connection refused, no
     * route to host), again every 30 s until the init timeout; and, on rank 0,
     * a warning when its store is open to other machines without a token. */
    void (*progress)(void *ctx, const char *msg);
    void *progress_ctx;
};

/* Reads the environment, hosts or joins the store and creates the
 * communicator. On failure returns a negative code and a message in err. */
int mg_dist_init(struct mg_dist **out, const struct mg_dist_opts *opts, char *err, size_t errlen);
/* A final barrier: rank 0, which hosts the store, must not go before the
 * others are done with it. */
int mg_dist_finalize(struct mg_dist *d, int timeout_ms);
void mg_dist_release(struct mg_dist *d);

/* ---- the error file ------------------------------------------------------------- */

/* Writes torchrun's error file to path (atomically: a temporary file renamed):
 *   {"message": {"message": MESSAGE,
 *                "extraInfo": {"py_callstack": TEXT, "timestamp": "UNIX SECONDS",
 *                              "rank": "R", "local_rank": "L", "hostname": "H",
 *                              "pid": "P", "program": "PROG"}}}
 * rank / local_rank < 0 are written as "unknown". */
int mg_error_file_write(const char *path, const char *prog, const char *message, int rank,
                        int local_rank, const char *hostname);

/* For main files on a fatal error: writes the file named by
 * TORCHELASTIC_ERROR_FILE (does nothing, returning 0, when it is unset), taking
 * the rank from d, or from RANK / LOCAL_RANK when d is NULL. */
int mg_error_file_record(const struct mg_dist *d, const char *prog, const char *message);

#endif
