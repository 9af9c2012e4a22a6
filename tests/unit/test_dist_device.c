/* The communicator follows the compute device (dist.h, mg_dist_opts): NCCL
 * only for CUDA, MG_COMM=auto picking it on CUDA, and ranks that chose their
 * device with --device auto agreeing on it through the store before any
 * communicator starts. Two forked ranks over loopback; a backend that says
 * CUDA is enough for dist.c, which only reads its device and stream.
 * timeout: 60 */
#include "tap.h"
#include "backend.h"
#include "dist.h"
#include "mg_err.h"
#include "net.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int free_port(void)
{
    int port, fd = mg_listen_tcp("127.0.0.1", 0, 1, &port);
    if (fd < 0)
        BAIL_OUT("no free port");
    close(fd);
    return port;
}

struct outcome {
    int rc;
    char err[1024];
};

/* Rank r of 2 calls mg_dist_init with its own device (cuda[r]) and auto flag. */
static void run_pair(const int cuda[2], int device_auto, const char *comm_mode,
                     struct outcome out[2])
{
    int port = free_port(), fds[2][2];
    pid_t pid[2];
    fflush(stdout);
    for (int r = 0; r < 2; r++) {
        if (pipe(fds[r]) != 0)
            BAIL_OUT("pipe");
        pid[r] = fork();
        if (pid[r] < 0)
            BAIL_OUT("fork");
        if (pid[r] == 0) {
            char v[16];
            struct outcome o = {0};
            struct mg_backend fake = {.device = cuda[r] ? MG_DEVICE_CUDA : MG_DEVICE_CPU};
            struct mg_dist_opts opts = {.backend = &fake,
                                        .device_index = 0,
                                        .device_auto = device_auto,
                                        .auto_why = cuda[r] ? "" : "no NVIDIA driver (test)"};
            struct mg_dist *d = NULL;
            snprintf(v, sizeof(v), "%d", r);
            setenv("RANK", v, 1);
            setenv("LOCAL_RANK", v, 1);
            setenv("WORLD_SIZE", "2", 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            snprintf(v, sizeof(v), "%d", port);
            setenv("MASTER_PORT", v, 1);
            setenv("MG_COMM_INIT_TIMEOUT", "20", 1);
            setenv("MG_COMM", comm_mode, 1);
            o.rc = mg_dist_init(&d, &opts, o.err, sizeof(o.err));
            if (o.rc == 0)
                o.rc = mg_dist_finalize(d, 20000);
            mg_dist_release(d);
            close(fds[r][0]);
            _exit(write(fds[r][1], &o, sizeof(o)) == (ssize_t)sizeof(o) ? 0 : 1);
        }
        close(fds[r][1]);
    }
    for (int r = 0; r < 2; r++) {
        memset(&out[r], 0, sizeof(out[r]));
        out[r].rc = -EIO;
        if (read(fds[r][0], &out[r], sizeof(out[r])) != (ssize_t)sizeof(out[r]))
            snprintf(out[r].err, sizeof(out[r].err), "rank %d died", r);
        close(fds[r][0]);
        waitpid(pid[r], NULL, 0);
    }
}

int main(void)
{
    struct outcome o[2];
    static const int cpu[2] = {0, 0}, mixed[2] = {1, 0}, gpus[2] = {1, 1};

    /* NCCL reduces device memory: refused for a CPU run before any store starts */
    run_pair(cpu, 0, "nccl", o);
    for (int r = 0; r < 2; r++) {
        is_int(o[r].rc, -MG_ECONFIG, "MG_COMM=nccl on the CPU: rank %d refuses", r);
        ok(strstr(o[r].err, "MG_COMM=nccl: NCCL reduces GPU memory, and this run computes on "
                            "the CPU"),
           "... saying why: %s", o[r].err);
    }

    /* --device auto on both ranks, both on the CPU: they agree, and the CPU
     * communicator runs */
    run_pair(cpu, 1, "auto", o);
    for (int r = 0; r < 2; r++)
        is_int(o[r].rc, 0, "--device auto, the CPU on both ranks: rank %d is set up (%s)", r,
               o[r].err);

    /* one rank found a GPU, the other did not: both stop at once, naming
     * the rank on the CPU and its reason */
    run_pair(mixed, 1, "auto", o);
    for (int r = 0; r < 2; r++) {
        is_int(o[r].rc, -MG_ECONFIG,
               "--device auto, CUDA on rank 0 and the CPU on rank 1: rank "
               "%d stops",
               r);
        ok(strstr(o[r].err, "--device auto: 1 of the 2 ranks found a usable GPU and 1 did not "
                            "(rank 1: no NVIDIA driver (test)): every rank must compute on the "
                            "same device"),
           "... the same message on both: %s", o[r].err);
    }

    /* both on CUDA: they agree, and MG_COMM=auto picks NCCL, which (with no
     * GPU here) says why it cannot start; a GPU machine gets a communicator.
     * Rank 1 may find the store gone with rank 0, which hosts it and stops
     * at NCCL first: rank 0's words are the ones that count. */
    run_pair(gpus, 1, "auto", o);
    for (int r = 0; r < 2; r++)
        ok(!strstr(o[r].err, "found a usable GPU and"), "CUDA on both ranks: they agree (rank %d)",
           r);
    ok(o[0].rc == 0 || strstr(o[0].err, "NVIDIA driver") || strstr(o[0].err, "NCCL") ||
           strstr(o[0].err, "CUDA device"),
       "... and MG_COMM=auto means NCCL: %s", o[0].rc ? o[0].err : "it started");
    diag("rank 1: %s", o[1].rc ? o[1].err : "it started");
    return done_testing();
}
