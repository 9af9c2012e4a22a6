/* A worker for the GPU benchmark (tests/bench/gpu.sh): it joins the job the
 * launcher's environment describes, one GPU per rank (device LOCAL_RANK),
 * through the NCCL communicator, and
 *
 *   nccl_rank bench ITERS SIZES...   times ITERS allreduces of each size in
 *                                    bytes (after 5 untimed ones), in the
 *                                    communicator's registered memory; rank 0
 *                                    prints "bytes us_per_op algbw_GBps busbw_GBps"
 *
 * Bus bandwidth is nccl-tests': size / time x 2(n-1)/n. The buffer holds
 * integers, so every sum is exact; the last result is checked on every rank,
 * and a wrong one fails the run (a fast wrong answer is not a result).
 * Until train sets up NCCL itself (phase 2 of issue 10) this does what
 * dist.c will: rank 0 hosts the store on MASTER_PORT, every rank joins it. */
#include "backend.h"
#include "comm.h"
#include "dist.h"
#include "mg_err.h"
#include "store.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int my_rank = -1;

__attribute__((noreturn, format(printf, 1, 2))) static void die(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "nccl_rank: rank %d: %s\n", my_rank, msg);
    exit(1);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    struct mg_dist_env env;
    char err[MG_ERRMSG_LEN];
    struct mg_store_server *srv = NULL;
    struct mg_store *st;
    struct mg_backend *be;
    struct mg_comm *c;

    if (argc < 4 || strcmp(argv[1], "bench"))
        die("usage: nccl_rank bench ITERS SIZES...");
    int iters = atoi(argv[2]);
    if (mg_dist_env_read(&env, err, sizeof(err)) < 0)
        die("%s", err);
    my_rank = env.rank;
    if (env.rank == 0) {
        /* alone (world size 1, no MASTER_PORT): a store on a port of its own */
        struct mg_store_server_opts so = {.host = env.world == 1 ? "127.0.0.1" : NULL,
                                          .port = env.world == 1 ? 0 : env.master_port,
                                          .listen_fd = -1};
        if (mg_store_server_start(&srv, &so) < 0 || mg_store_server_start_thread(srv) < 0)
            die("cannot host the store on port %d", env.master_port);
        if (env.world == 1) {
            snprintf(env.master_addr, sizeof(env.master_addr), "127.0.0.1");
            env.master_port = mg_store_server_port(srv);
        }
    }
    struct mg_store_opts co = {.host = env.master_addr,
                               .port = env.master_port,
                               .connect_timeout_ms = 60000,
                               .timeout_ms = 60000};
    if (mg_store_connect(&st, &co) < 0)
        die("cannot connect to the store at %s:%d", env.master_addr, env.master_port);
    struct mg_backend_opts bo = {.device_index = env.local_rank};
    if (mg_backend_open(MG_DEVICE_CUDA, &bo, &be, err, sizeof(err)) < 0)
        die("%s", err);
    struct mg_comm_opts opts = {.rank = env.rank,
                                .world = env.world,
                                .mode = MG_COMM_NCCL,
                                .init_timeout_ms = 120000,
                                .timeout_ms = 120000,
                                .run_id = env.run_id,
                                .restart_count = env.restart_count,
                                .device_index = env.local_rank,
                                .stream = be->stream};
    if (mg_comm_nccl_create(&c, st, &opts, err, sizeof(err)) < 0)
        die("%s", err);
    if (env.rank == 0)
        fprintf(stderr, "nccl_rank: %s; %s\n", c->desc, be->name);

    size_t maxb = 0;
    for (int i = 3; i < argc; i++) {
        size_t b = strtoull(argv[i], NULL, 10);
        maxb = b > maxb ? b : maxb;
    }
    size_t maxn = (maxb + 3) / 4;
    float *host = malloc(maxn * 4), *dev;
    if (!host || mg_comm_mem_alloc(c, maxn * 4, (void **)&dev, MG_COMM_DEFAULT_TIMEOUT) < 0)
        die("out of memory for %zu bytes", maxn * 4);
    for (int a = 3; a < argc; a++) {
        size_t n = (strtoull(argv[a], NULL, 10) + 3) / 4;
        for (size_t i = 0; i < n; i++)
            host[i] = (float)((int)(i % 255) - 127);
        for (int it = 0; it < 5; it++)
            if (mg_comm_allreduce(c, dev, n, MG_REDUCE_SUM, MG_COMM_DEFAULT_TIMEOUT) < 0)
                die("%s", mg_comm_errmsg(c));
        /* every rank starts the timed part together */
        if (mg_comm_barrier(c, MG_COMM_DEFAULT_TIMEOUT) < 0)
            die("%s", mg_comm_errmsg(c));
        double t0 = now_s();
        for (int it = 0; it < iters; it++)
            if (mg_comm_allreduce(c, dev, n, MG_REDUCE_SUM, MG_COMM_DEFAULT_TIMEOUT) < 0)
                die("%s", mg_comm_errmsg(c));
        double us = (now_s() - t0) / iters * 1e6;
        /* then one on known data, checked */
        be->ops->upload(be, dev, host, n * 4);
        be->ops->sync(be);
        if (mg_comm_allreduce(c, dev, n, MG_REDUCE_SUM, MG_COMM_DEFAULT_TIMEOUT) < 0)
            die("%s", mg_comm_errmsg(c));
        float *got = malloc(n * 4);
        be->ops->download(be, got, dev, n * 4);
        for (size_t i = 0; i < n; i++)
            if (got[i] != host[i] * (float)env.world)
                die("allreduce of %zu floats: element %zu is %g, not %g", n, i, got[i],
                    host[i] * (float)env.world);
        free(got);
        double bytes = (double)n * 4, algbw = bytes / us / 1e3;
        if (env.rank == 0)
            printf("%zu %.2f %.2f %.2f\n", n * 4, us, algbw,
                   algbw * 2.0 * (env.world - 1) / env.world);
    }
    if (mg_comm_barrier(c, MG_COMM_DEFAULT_TIMEOUT) < 0)
        die("%s", mg_comm_errmsg(c));
    mg_comm_mem_free(c, dev);
    mg_comm_release(c);
    mg_backend_release(be);
    mg_store_release(st);
    if (srv)
        mg_store_server_release(srv);
    free(host);
    return 0;
}
