/* A worker for the multi-node launcher tests: prints the environment it got
 * as one line, and checks that MASTER_ADDR:MASTER_PORT really leads to rank 0
 * (rank 0 listens there, every other rank connects and trades its rank).
 *
 *   mn_worker [--stamp FILE] [--reach] [--sleep SECS] [--sleep-at NODES:SECS]
 *             [--fail RANK:CODE]
 *
 * --stamp FILE   first, append "NS rank=R group_world=G" to FILE (NS: CLOCK_MONOTONIC
 *                nanoseconds, comparable across processes of this machine)
 * --reach        the reachability check above (20 s to complete); with
 *                TORCHELASTIC_USE_AGENT_STORE=True (the static backend across
 *                nodes) MASTER_PORT is the agent's store: every rank joins it as
 *                libmg does (runtime/dist.h) and they trade their ranks there
 * --sleep SECS   then stay up (until SIGTERM)
 * --sleep-at N:S stay up S seconds only while the group has N nodes
 *                (GROUP_WORLD_SIZE): a job that runs until its membership changes
 * --fail R:C     the worker with RANK R exits with code C on the job's first
 *                attempt (TORCHELASTIC_RESTART_COUNT 0)
 * Line: "env rank=.. local_rank=.. world=.. group_rank=.. group_world=..
 *        local_world=.. master=ADDR:PORT restart=.. run_id=.." and "reach ok". */
#include "net.h"
#include "store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <time.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v ? v : "";
}

static int die(const char *what, int rc)
{
    fprintf(stderr, "mn_worker rank %s: %s: %s\n", env("RANK"), what, strerror(-rc));
    return 1;
}

/* Through the agent's store, in the attempt's namespace, as libmg joins it. */
static int reach_agent_store(int rank, int world, const char *addr, int port)
{
    char prefix[64], key[64];
    struct mg_store *st = NULL;
    snprintf(prefix, sizeof(prefix), "/worker/attempt_%s/", env("TORCHELASTIC_RESTART_COUNT"));
    struct mg_store_opts o = {.host = addr,
                              .port = port,
                              .prefix = prefix,
                              .token = getenv("MG_AGENT_STORE_TOKEN"),
                              .connect_timeout_ms = 20000,
                              .timeout_ms = 20000};
    int rc = mg_store_connect(&st, &o);
    if (rc)
        return die("join the agent store at MASTER_ADDR:MASTER_PORT", rc);
    snprintf(key, sizeof(key), "reach/%d", rank);
    rc = mg_store_set(st, key, "ok", 2, 0);
    for (int r = 0; r < world && !rc; r++) {
        void *v = NULL;
        snprintf(key, sizeof(key), "reach/%d", r);
        rc = mg_store_get(st, key, &v, NULL, 20000);
        free(v);
    }
    mg_store_release(st);
    return rc ? die("trade ranks in the agent store", rc) : 0;
}

static int reach(int rank, int world, const char *addr, int port)
{
    int64_t deadline = mg_now_ms() + 20000;
    uint32_t v;
    int rc;

    if (world < 2)
        return 0;
    if (strcmp(env("TORCHELASTIC_USE_AGENT_STORE"), "True") == 0)
        return reach_agent_store(rank, world, addr, port);
    if (rank == 0) {
        int lfd = mg_listen_tcp(NULL, port, 128, NULL);
        if (lfd < 0)
            return die("listen on MASTER_PORT", lfd);
        for (int i = 1; i < world; i++) {
            int fd = accept(lfd, NULL, NULL);
            if (fd < 0)
                return die("accept", -errno);
            if ((rc = mg_read_full(fd, &v, 4, deadline)) < 0)
                return die("read", rc);
            v = htonl(0x6f6b0000u | (ntohl(v) & 0xffff));
            if ((rc = mg_write_full(fd, &v, 4, deadline)) < 0)
                return die("write", rc);
            close(fd);
        }
        close(lfd);
        return 0;
    }
    for (;;) {
        int fd = mg_connect_tcp(addr, port, mg_now_ms() + 1000);
        if (fd < 0) {
            if (mg_now_ms() > deadline)
                return die("connect to MASTER_ADDR:MASTER_PORT", fd);
            usleep(20000);
            continue;
        }
        v = htonl((uint32_t)rank);
        if ((rc = mg_write_full(fd, &v, 4, deadline)) < 0 ||
            (rc = mg_read_full(fd, &v, 4, deadline)) < 0) {
            close(fd);
            if (mg_now_ms() > deadline)
                return die("talk to rank 0", rc);
            continue; /* something else held the port a moment ago */
        }
        close(fd);
        if (ntohl(v) != (0x6f6b0000u | (uint32_t)rank)) {
            fprintf(stderr, "mn_worker rank %d: MASTER_PORT answered something else\n", rank);
            return 1;
        }
        return 0;
    }
}

int main(int argc, char **argv)
{
    int do_reach = 0, fail_rank = -1, fail_code = 0, at_nodes = -1;
    const char *stamp = NULL;
    double sleep_s = 0, at_s = 0;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reach"))
            do_reach = 1;
        else if (!strcmp(argv[i], "--sleep") && i + 1 < argc)
            sleep_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "--stamp") && i + 1 < argc)
            stamp = argv[++i];
        else if (!strcmp(argv[i], "--sleep-at") && i + 1 < argc)
            sscanf(argv[++i], "%d:%lf", &at_nodes, &at_s);
        else if (!strcmp(argv[i], "--fail") && i + 1 < argc)
            sscanf(argv[++i], "%d:%d", &fail_rank, &fail_code);
        else {
            fprintf(stderr, "mn_worker: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (stamp) {
        struct timespec ts;
        char line[128];
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int n = snprintf(line, sizeof(line), "%lld rank=%s group_world=%s\n",
                         (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec, env("RANK"),
                         env("GROUP_WORLD_SIZE"));
        int fd = open(stamp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd < 0 || write(fd, line, (size_t)n) != n)
            return die("write the stamp file", -errno);
        close(fd);
    }
    int rank = atoi(env("RANK")), world = atoi(env("WORLD_SIZE"));
    printf("env rank=%s local_rank=%s world=%s group_rank=%s group_world=%s local_world=%s "
           "master=%s:%s restart=%s run_id=%s\n",
           env("RANK"), env("LOCAL_RANK"), env("WORLD_SIZE"), env("GROUP_RANK"),
           env("GROUP_WORLD_SIZE"), env("LOCAL_WORLD_SIZE"), env("MASTER_ADDR"), env("MASTER_PORT"),
           env("TORCHELASTIC_RESTART_COUNT"), env("TORCHELASTIC_RUN_ID"));
    fflush(stdout);
    if (rank == fail_rank && atoi(env("TORCHELASTIC_RESTART_COUNT")) == 0) {
        fprintf(stderr, "mn_worker rank %d: failing on purpose with %d\n", rank, fail_code);
        return fail_code;
    }
    if (do_reach) {
        if (reach(rank, world, env("MASTER_ADDR"), atoi(env("MASTER_PORT"))))
            return 1;
        printf("reach ok rank=%d\n", rank);
        fflush(stdout);
    }
    if (at_nodes >= 0 && atoi(env("GROUP_WORLD_SIZE")) == at_nodes)
        sleep_s = at_s;
    if (sleep_s > 0) {
        int64_t end = mg_now_ms() + (int64_t)(sleep_s * 1000);
        while (mg_now_ms() < end)
            usleep(50000);
    }
    return 0;
}
