/* The NCCL communicator's bootstrap between real processes, on a machine
 * without a GPU: what NCCL can do there (make a unique id, open its bootstrap
 * listener) it does for real, through the store the ranks share.
 *
 * - Rank 0's unique id reaches every rank through the store, byte for byte.
 * - The key is scoped to the restart: ranks of a restarted group that start
 *   before rank 0 wait for its new id, and never read the old one.
 * - A rank whose rank 0 never comes gives up at the init timeout, saying what
 *   it waited for.
 * - Starting the communicator without a usable device fails on every rank
 *   with a one-line error: NCCL's own words when the caller has set the
 *   device (device -1), the driver's when mg sets it; and each rank's failure
 *   is in the store, for the others to name.
 * NCCL listens on loopback only (NCCL_SOCKET_IFNAME=lo) and sends nothing.
 * timeout: 180 */
#include "comm.h"
#include "gpu_test.h"
#include "mg_err.h"
#include "store.h"
#include "tap.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const struct mg_gpu_plugin *plugin;
static struct mg_store_server *server;
static int port;

/* What a child rank reports back through its pipe. */
struct result {
    int rc;
    unsigned char id[MG_NCCL_ID_BYTES];
    double seconds;
    char msg[MG_ERRMSG_LEN];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static struct mg_store *connect_store(void)
{
    struct mg_store *st;
    struct mg_store_opts o = {.host = "127.0.0.1", .port = port, .timeout_ms = 20000};
    return mg_store_connect(&st, &o) == 0 ? st : NULL;
}

enum what {
    EXCHANGE,   /* the plugin's nccl_exchange_id */
    CREATE,     /* mg_comm_nccl_create (the loader: probe, then the plugin) */
    CREATE_RAW, /* the plugin's comm_create, without the loader's probe */
};

struct job {
    enum what what;
    int rank, world, restart, device, init_timeout_ms;
    const char *run_id;
    int delay_ms;         /* before starting */
    const char *blocking; /* NCCL_COMM_BLOCKING in the rank's environment, or NULL */
};

static pid_t start_rank(const struct job *j, int *fd)
{
    int p[2];
    if (pipe(p) != 0)
        BAIL_OUT("pipe: %s", strerror(errno));
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        BAIL_OUT("fork: %s", strerror(errno));
    if (pid > 0) {
        close(p[1]);
        *fd = p[0];
        return pid;
    }
    close(p[0]);
    struct result r = {0};
    if (j->delay_ms)
        usleep((useconds_t)j->delay_ms * 1000);
    if (j->blocking)
        setenv("NCCL_COMM_BLOCKING", j->blocking, 1);
    struct mg_store *st = connect_store();
    struct mg_comm_opts o = {.rank = j->rank,
                             .world = j->world,
                             .mode = MG_COMM_NCCL,
                             .init_timeout_ms = j->init_timeout_ms,
                             .timeout_ms = 5000,
                             .run_id = j->run_id,
                             .restart_count = j->restart,
                             .device_index = j->device};
    struct mg_comm *c = NULL;
    double t0 = now_s();
    if (!st) {
        r.rc = -ECONNREFUSED;
        snprintf(r.msg, sizeof(r.msg), "cannot connect to the store");
    } else if (j->what == EXCHANGE) {
        r.rc = plugin->nccl_exchange_id(st, &o, r.id, r.msg, sizeof(r.msg));
    } else if (j->what == CREATE) {
        r.rc = mg_comm_nccl_create(&c, st, &o, r.msg, sizeof(r.msg));
    } else {
        r.rc = plugin->comm_create(&c, st, &o, r.msg, sizeof(r.msg));
    }
    r.seconds = now_s() - t0;
    if (c)
        mg_comm_release(c);
    if (write(p[1], &r, sizeof(r)) != (ssize_t)sizeof(r))
        _exit(3);
    if (st)
        mg_store_release(st);
    _exit(0);
}

/* Starts the jobs, waits for all, fills res[i]. */
static void run_ranks(const struct job *jobs, int n, struct result *res)
{
    pid_t pids[8];
    int fds[8];
    for (int i = 0; i < n; i++)
        pids[i] = start_rank(&jobs[i], &fds[i]);
    for (int i = 0; i < n; i++) {
        size_t got = 0;
        ssize_t k;
        memset(&res[i], 0, sizeof(res[i]));
        while (got < sizeof(res[i]) &&
               (k = read(fds[i], (char *)&res[i] + got, sizeof(res[i]) - got)) > 0)
            got += (size_t)k;
        close(fds[i]);
        int stc;
        waitpid(pids[i], &stc, 0);
        if (got != sizeof(res[i])) {
            res[i].rc = -EPIPE;
            snprintf(res[i].msg, sizeof(res[i].msg), "rank died (status %d)", stc);
        }
    }
}

static int nonzero(const unsigned char *id)
{
    for (int i = 0; i < MG_NCCL_ID_BYTES; i++)
        if (id[i])
            return 1;
    return 0;
}

static void test_exchange(void)
{
    struct job jobs[3];
    struct result res[3];
    for (int r = 0; r < 3; r++)
        jobs[r] = (struct job){
            .what = EXCHANGE, .rank = r, .world = 3, .run_id = "boot", .init_timeout_ms = 20000};
    run_ranks(jobs, 3, res);
    int good = 1;
    for (int r = 0; r < 3; r++)
        good &= res[r].rc == 0;
    ok(good, "3 ranks exchange the NCCL id through the store (%s%s%s)", res[0].msg, res[1].msg,
       res[2].msg);
    ok(good && nonzero(res[0].id) && !memcmp(res[0].id, res[1].id, MG_NCCL_ID_BYTES) &&
           !memcmp(res[0].id, res[2].id, MG_NCCL_ID_BYTES),
       "every rank holds rank 0's %d bytes", MG_NCCL_ID_BYTES);

    /* the restart: ranks 1 and 2 start first, while attempt 0's id is in the store */
    unsigned char old[MG_NCCL_ID_BYTES];
    memcpy(old, res[0].id, sizeof(old));
    jobs[0].delay_ms = 300;
    for (int r = 0; r < 3; r++)
        jobs[r].restart = 1;
    run_ranks(jobs, 3, res);
    good = res[0].rc == 0 && res[1].rc == 0 && res[2].rc == 0;
    ok(good && !memcmp(res[0].id, res[1].id, MG_NCCL_ID_BYTES) &&
           !memcmp(res[0].id, res[2].id, MG_NCCL_ID_BYTES),
       "restart 1: the ranks that came before rank 0 waited for its new id");
    ok(good && memcmp(res[0].id, old, MG_NCCL_ID_BYTES) != 0,
       "... which is not the id of restart 0 (the key is scoped to the restart)");

    /* rank 0 never comes */
    struct job lone = {.what = EXCHANGE,
                       .rank = 1,
                       .world = 2,
                       .run_id = "boot",
                       .restart = 2,
                       .init_timeout_ms = 1000};
    run_ranks(&lone, 1, res);
    is_int(res[0].rc, -ETIMEDOUT, "without rank 0, a rank gives up at the init timeout");
    ok(strstr(res[0].msg, "waiting for rank 0's NCCL id (store key mg/nccl/boot/2/id): timed out"),
       "... saying what it waited for: %s", res[0].msg);
    diag("it gave up after %.1f s (init timeout 1 s)", res[0].seconds);
}

static void test_create_without_device(void)
{
    char why[MG_ERRMSG_LEN];
    struct job jobs[2];
    struct result res[2];
    if (mg_gpu_probe(0, NULL, why, sizeof(why)) == 0) {
        diag("this machine has a usable GPU: the no-device checks do not apply");
        return;
    }
    /* the caller set the device: NCCL's own message */
    for (int r = 0; r < 2; r++)
        jobs[r] = (struct job){.what = CREATE,
                               .rank = r,
                               .world = 2,
                               .run_id = "nodev",
                               .device = -1,
                               .init_timeout_ms = 20000};
    run_ranks(jobs, 2, res);
    for (int r = 0; r < 2; r++) {
        ok(res[r].rc < 0 && strstr(res[r].msg, "ncclCommInitRankConfig: ") &&
               strstr(res[r].msg, "(ncclUnhandledCudaError)") && !strchr(res[r].msg, '\n'),
           "rank %d: NCCL's error, in one line: %s", r, res[r].msg);
        diag("rank %d gave up after %.2f s", r, res[r].seconds);
    }
    /* the failure is in the store, for the others */
    char key[64], *val = NULL;
    size_t len = 0;
    snprintf(key, sizeof(key), "mg/nccl/nodev/0/fail/1");
    int rc = mg_store_server_local_get(server, key, (void **)&val, &len, NULL);
    ok(rc == 0 && val && strstr(val, "ncclCommInitRankConfig"),
       "rank 1's failure is in the store (%s): %s", key, val ? val : "(none)");
    free(val);

    /* mg sets the device: the driver probe answers first */
    for (int r = 0; r < 2; r++)
        jobs[r] = (struct job){.what = CREATE,
                               .rank = r,
                               .world = 2,
                               .run_id = "nodev",
                               .restart = 1,
                               .device = r,
                               .init_timeout_ms = 20000};
    run_ranks(jobs, 2, res);
    for (int r = 0; r < 2; r++)
        ok(res[r].rc < 0 && !strcmp(res[r].msg, why),
           "rank %d, device %d: the driver probe's message: %s", r, r, res[r].msg);
    /* the plugin alone sets it and says what CUDA said */
    for (int r = 0; r < 2; r++)
        jobs[r] = (struct job){.what = CREATE_RAW,
                               .rank = r,
                               .world = 2,
                               .run_id = "nodev",
                               .restart = 2,
                               .device = r,
                               .init_timeout_ms = 20000};
    run_ranks(jobs, 2, res);
    for (int r = 0; r < 2; r++)
        ok(res[r].rc < 0 && strstr(res[r].msg, "cudaSetDevice: ") &&
               strstr(res[r].msg, "(cudaErrorInsufficientDriver)"),
           "rank %d, the plugin without the probe: CUDA's message: %s", r, res[r].msg);
}

/* NCCL_COMM_BLOCKING=1 would override the non-blocking config the timeouts rely on:
 * refused before anything waits, on every rank, and the others are told through the store.
 * NCCL_COMM_BLOCKING=0 is what mg asks for anyway: it goes on (to NCCL's own failure here). */
static void test_blocking_env(void)
{
    struct job jobs[2];
    struct result res[2];
    for (int r = 0; r < 2; r++)
        jobs[r] = (struct job){.what = CREATE_RAW,
                               .rank = r,
                               .world = 2,
                               .run_id = "blocking",
                               .device = -1,
                               .init_timeout_ms = 20000,
                               .blocking = "1"};
    run_ranks(jobs, 2, res);
    for (int r = 0; r < 2; r++)
        ok(res[r].rc == -EINVAL &&
               strstr(res[r].msg, "NCCL_COMM_BLOCKING=1 is set: it makes NCCL's setup block") &&
               strstr(res[r].msg, "unset it") && res[r].seconds < 10,
           "rank %d: NCCL_COMM_BLOCKING=1 refused at once (%.2f s): %s", r, res[r].seconds,
           res[r].msg);
    char key[64], *val = NULL;
    size_t len = 0;
    snprintf(key, sizeof(key), "mg/nccl/blocking/0/fail/1");
    int rc = mg_store_server_local_get(server, key, (void **)&val, &len, NULL);
    ok(rc == 0 && val && strstr(val, "NCCL_COMM_BLOCKING"),
       "... and in the store for the others: %s", val ? val : "(none)");
    free(val);

    char why[MG_ERRMSG_LEN];
    if (mg_gpu_probe(0, NULL, why, sizeof(why)) == 0)
        return; /* with a device, NCCL_COMM_BLOCKING=0 would start a real communicator */
    for (int r = 0; r < 2; r++) {
        jobs[r].restart = 1;
        jobs[r].blocking = "0";
    }
    run_ranks(jobs, 2, res);
    for (int r = 0; r < 2; r++)
        ok(res[r].rc < 0 && !strstr(res[r].msg, "NCCL_COMM_BLOCKING") &&
               strstr(res[r].msg, "ncclCommInitRankConfig"),
           "rank %d: NCCL_COMM_BLOCKING=0 is not refused: %s", r, res[r].msg);
}

int main(void)
{
    plugin = gpu_test_plugin_or_skip();
    /* NCCL's bootstrap listener on loopback; no InfiniBand probing */
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
    setenv("NCCL_IB_DISABLE", "1", 1);
    signal(SIGPIPE, SIG_IGN);
    struct mg_store_server_opts so = {.host = "127.0.0.1", .port = 0, .listen_fd = -1};
    if (mg_store_server_start(&server, &so) < 0 || mg_store_server_start_thread(server) < 0)
        BAIL_OUT("cannot start a store");
    port = mg_store_server_port(server);
    test_exchange();
    test_create_without_device();
    test_blocking_env();
    mg_store_server_release(server);
    return done_testing();
}
