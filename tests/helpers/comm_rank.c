/* A worker for the communication tests and benchmarks: it joins the job the
 * launcher's environment describes (mg_dist_init) and then
 *
 *   comm_rank check [MAX_BYTES]   runs every collective check (tests/lib/comm_check.h)
 *   comm_rank check-registered [MAX_BYTES]
 *                                 the allreduce checks in registered memory;
 *                                 zero-copy expected above 64 KiB on one host
 *                                 (unless MG_COMM_ZEROCOPY=0)
 *   comm_rank info                prints rank, world, layout; nothing else
 *   comm_rank loop VICTIM MS [--registered]
 *                                 loops over 16 MB allreduces (in registered
 *                                 memory); rank VICTIM SIGKILLs itself after MS
 *                                 milliseconds
 *   comm_rank hang VICTIM SECS    rank VICTIM sleeps SECS instead of calling allreduce
 *   comm_rank steps N VICTIM AT KIND
 *                                 N training-like steps (a 1 ms computation, a
 *                                 64 KB allreduce), told to mglaunch's watchdog
 *                                 (runtime/progress.h); in the first attempt,
 *                                 rank VICTIM hangs at step AT: stop (SIGSTOP
 *                                 to itself), spin (a loop in its own code),
 *                                 sleep (blocked before the step's collective),
 *                                 vfork (in uninterruptible sleep in the kernel:
 *                                 the parent of a vfork child that sleeps),
 *                                 or none; rank 0 prints when its first step is done
 *   comm_rank progress-cost       the progress calls of one step, timed (ns per step)
 *   comm_rank bench [--registered] SIZES...
 *                                 times allreduce for each size in bytes; rank 0
 *                                 prints "bytes us_per_op" lines. --registered:
 *                                 in the communicator's registered memory
 *                                 (mg_comm_mem_alloc, zero-copy on one host)
 *   comm_rank memcpy SIZE         (alone) prints memcpy bandwidth in GB/s
 *   comm_rank tcp SIZE            (alone) prints loopback TCP bandwidth in GB/s
 *
 * Every failure is printed as "comm_rank: rank R: message", recorded in
 * TORCHELASTIC_ERROR_FILE, and exits 1. */
#include "comm_check.h"
#include "dist.h"
#include "mg_err.h"
#include "net.h"
#include "progress.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static struct mg_dist *dist;

__attribute__((noreturn, format(printf, 1, 2))) static void die(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (dist)
        fprintf(stderr, "comm_rank: rank %d: %s\n", dist->rank, msg);
    else
        fprintf(stderr, "comm_rank: %s\n", msg);
    mg_error_file_record(dist, "comm_rank", msg);
    exit(1);
}

static void *killer(void *arg)
{
    usleep((useconds_t)(long)arg * 1000);
    raise(SIGKILL);
    return NULL;
}

static int cmd_loop(int victim, long ms, int registered)
{
    size_t n = 4u << 20;
    float *buf = NULL;
    pthread_t t;
    if (registered) {
        void *p;
        if (mg_comm_mem_alloc(dist->comm, n * sizeof(float), &p, MG_COMM_DEFAULT_TIMEOUT))
            die("registering memory: %s", mg_comm_errmsg(dist->comm));
        buf = p;
    } else {
        buf = calloc(n, sizeof(float));
    }
    if (!buf)
        die("out of memory");
    if (dist->rank == victim)
        pthread_create(&t, NULL, killer, (void *)ms);
    for (;;) {
        int rc = mg_comm_allreduce(dist->comm, buf, n, MG_REDUCE_SUM, MG_COMM_DEFAULT_TIMEOUT);
        if (rc)
            die("%s", mg_comm_errmsg(dist->comm));
    }
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void hang_now(const char *kind)
{
    fprintf(stderr, "comm_rank: rank %d hangs (%s) at %.6f\n", dist->rank, kind, wall_now());
    if (!strcmp(kind, "stop"))
        raise(SIGSTOP);
    else if (!strcmp(kind, "spin"))
        for (volatile unsigned long i = 0;; i++)
            ;
    else if (!strcmp(kind, "sleep"))
        sleep(3600);
    else if (!strcmp(kind, "vfork") && vfork() == 0) {
        /* the parent waits, uninterruptibly, until the child execs or exits */
        sleep(3600);
        _exit(0);
    }
    die("did not hang (%s)", kind);
}

static int cmd_steps(long n, int victim, long at, const char *kind)
{
    float x[16384] = {0};
    const char *rc_env = getenv("TORCHELASTIC_RESTART_COUNT");
    int first = !rc_env || !strcmp(rc_env, "0");
    for (long s = 0; s < n; s++) {
        mg_progress_step_begin();
        mg_progress_phase(MG_PH_COMPUTE);
        if (first && dist->rank == victim && s == at)
            hang_now(kind);
        int64_t t0 = mg_now_us();
        while (mg_now_us() - t0 < 1000)
            ;
        mg_progress_phase(MG_PH_SYNC);
        mg_progress_next_bucket(0);
        if (mg_comm_allreduce(dist->comm, x, 16384, MG_REDUCE_SUM, MG_COMM_DEFAULT_TIMEOUT))
            die("%s", mg_comm_errmsg(dist->comm));
        mg_progress_step_end(s + 1);
        if (s == 0 && dist->rank == 0) /* for tests/bench/hang.sh */
            fprintf(stderr, "comm_rank: first step done at %.6f (restart %s)\n", wall_now(),
                    rc_env ? rc_env : "0");
    }
    printf("rank %d: %ld steps\n", dist->rank, n);
    return 0;
}

/* What the watchdog costs a step: the progress calls of one training step
 * with one bucket's collective (runtime/progress.h), timed. */
static int cmd_progress_cost(void)
{
    long n = 2000000;
    int64_t best = INT64_MAX;
    for (int r = 0; r < 5; r++) {
        int64_t t0 = mg_now_us();
        for (long i = 0; i < n; i++) {
            mg_progress_step_begin();
            mg_progress_phase(MG_PH_DATA);
            mg_progress_phase(MG_PH_COMPUTE);
            mg_progress_next_bucket(0);
            uint64_t seq = mg_progress_coll_begin(MG_PROG_ALLREDUCE, 65536);
            mg_progress_coll_end(seq, 0);
            mg_progress_phase(MG_PH_SYNC);
            mg_progress_phase(MG_PH_OPTIMIZER);
            mg_progress_step_end(i + 1);
        }
        int64_t t = mg_now_us() - t0;
        best = t < best ? t : best;
    }
    printf("%.1f ns per step (%s)\n", (double)best * 1000.0 / (double)n,
           getenv("MG_PROGRESS_FD") ? "recording" : "no record");
    return 0;
}

static int cmd_hang(int victim, int secs)
{
    float x[1024] = {0};
    if (dist->rank == victim) {
        sleep((unsigned)secs);
        return 0;
    }
    if (mg_comm_allreduce(dist->comm, x, 1024, MG_REDUCE_SUM, MG_COMM_DEFAULT_TIMEOUT))
        die("%s", mg_comm_errmsg(dist->comm));
    return 0;
}

static int cmd_bench(int argc, char **argv)
{
    struct mg_comm *c = dist->comm;
    size_t maxb = 0;
    int registered = argc > 0 && !strcmp(argv[0], "--registered");
    if (registered) {
        argc--;
        argv++;
    }
    for (int i = 0; i < argc; i++)
        if ((size_t)atoll(argv[i]) > maxb)
            maxb = (size_t)atoll(argv[i]);
    float *buf = NULL;
    if (registered) {
        void *p;
        int rc = mg_comm_mem_alloc(c, maxb + 4, &p, MG_COMM_DEFAULT_TIMEOUT);
        if (rc)
            die("registering %zu bytes: %s", maxb + 4,
                *mg_comm_errmsg(c) ? mg_comm_errmsg(c) : mg_strerror(rc));
        buf = p;
    } else {
        buf = malloc(maxb + 4);
    }
    if (!buf)
        die("out of memory");
    uint64_t zc0 = c->zerocopy;
    for (size_t i = 0; i < maxb / 4; i++)
        buf[i] = cc_val(c->rank, i, 7);
    for (int a = 0; a < argc; a++) {
        size_t bytes = (size_t)atoll(argv[a]), n = bytes / 4;
        /* About 0.3 s per size, at least 5 iterations, agreed by rank 0's timing. */
        int iters = 5;
        float probe[1];
        for (int w = 0; w < 3; w++)
            if (mg_comm_allreduce(c, buf, n, MG_REDUCE_AVG, MG_COMM_DEFAULT_TIMEOUT))
                die("%s", mg_comm_errmsg(c));
        int64_t t0 = mg_now_us();
        for (int i = 0; i < 5; i++)
            if (mg_comm_allreduce(c, buf, n, MG_REDUCE_AVG, MG_COMM_DEFAULT_TIMEOUT))
                die("%s", mg_comm_errmsg(c));
        double per = (double)(mg_now_us() - t0) / 5;
        probe[0] = (float)(300000.0 / (per > 1 ? per : 1));
        if (mg_comm_broadcast(c, probe, sizeof(probe), 0, MG_COMM_DEFAULT_TIMEOUT))
            die("%s", mg_comm_errmsg(c));
        iters = probe[0] < 5 ? 5 : probe[0] > 20000 ? 20000 : (int)probe[0];
        if (mg_comm_barrier(c, MG_COMM_DEFAULT_TIMEOUT))
            die("%s", mg_comm_errmsg(c));
        t0 = mg_now_us();
        for (int i = 0; i < iters; i++)
            if (mg_comm_allreduce(c, buf, n, MG_REDUCE_AVG, MG_COMM_DEFAULT_TIMEOUT))
                die("%s", mg_comm_errmsg(c));
        double us = (double)(mg_now_us() - t0) / iters;
        /* Averaging identical inputs' averages keeps the values bounded;
         * check one allreduce's result against the exact answer. */
        for (size_t i = 0; i < n; i++)
            buf[i] = cc_val(c->rank, i, 7);
        if (mg_comm_allreduce(c, buf, n, MG_REDUCE_SUM, MG_COMM_DEFAULT_TIMEOUT))
            die("%s", mg_comm_errmsg(c));
        for (size_t i = 0; i < n; i += 97) {
            double want = 0, mag = 0;
            for (int q = 0; q < c->world; q++) {
                want += cc_val(q, i, 7);
                mag += fabs(cc_val(q, i, 7));
            }
            if (fabs(buf[i] - want) > mag * c->world * 1.2e-7)
                die("bench: allreduce of %zu bytes gave a wrong sum at %zu", bytes, i);
        }
        for (size_t i = 0; i < n; i++)
            buf[i] = cc_val(c->rank, i, 7);
        if (c->rank == 0)
            printf("%zu %.2f\n", bytes, us);
        fflush(stdout);
    }
    /* Say so when registered memory gave no zero-copy (another layout, or
     * MG_COMM_ZEROCOPY=0): the figures are then those of the staging path. */
    if (registered && c->rank == 0 && c->zerocopy == zc0)
        fprintf(stderr, "comm_rank: bench: no allreduce was zero-copy (%s)\n", c->desc);
    if (registered)
        mg_comm_mem_free(c, buf);
    else
        free(buf);
    return 0;
}

static double gbps(size_t bytes, int64_t us)
{
    return (double)bytes / (double)(us > 0 ? us : 1) / 1e3;
}

static int cmd_memcpy(size_t size)
{
    char *a = malloc(size), *b = malloc(size);
    if (!a || !b)
        die("out of memory");
    memset(a, 1, size);
    memset(b, 2, size);
    int iters = (int)((1ull << 30) / size) + 2;
    int64_t best = INT64_MAX;
    for (int rep = 0; rep < 3; rep++) {
        int64_t t0 = mg_now_us();
        for (int i = 0; i < iters; i++) {
            memcpy(i & 1 ? a : b, i & 1 ? b : a, size);
            __asm__ volatile("" ::: "memory");
        }
        int64_t t = mg_now_us() - t0;
        if (t < best)
            best = t;
    }
    printf("%.2f\n", gbps(size * (size_t)iters, best));
    return 0;
}

/* One sender process, one receiver, over 127.0.0.1: a single stream. */
static int cmd_tcp(size_t size)
{
    int port, lfd = mg_listen_tcp("127.0.0.1", 0, 1, &port);
    if (lfd < 0)
        die("listen: %s", mg_strerror(lfd));
    size_t total = (size_t)1 << 30;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = mg_connect_tcp("127.0.0.1", port, mg_now_ms() + 10000);
        char *buf = calloc(1, size);
        for (size_t sent = 0; fd >= 0 && buf && sent < total; sent += size)
            if (mg_write_full(fd, buf, size, -1))
                _exit(1);
        _exit(0);
    }
    int fd = accept(lfd, NULL, NULL);
    char *buf = malloc(size);
    if (fd < 0 || !buf)
        die("accept failed");
    int64_t t0 = mg_now_us();
    size_t got = 0;
    for (;;) {
        ssize_t k = recv(fd, buf, size, 0);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    int64_t t = mg_now_us() - t0;
    waitpid(pid, NULL, 0);
    if (got != total)
        die("tcp: received %zu of %zu bytes", got, total);
    printf("%.2f\n", gbps(got, t));
    close(fd);
    close(lfd);
    return 0;
}

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : "check";
    char err[1024];

    if (!strcmp(cmd, "memcpy"))
        return cmd_memcpy(argc > 2 ? (size_t)atoll(argv[2]) : 64u << 20);
    if (!strcmp(cmd, "tcp"))
        return cmd_tcp(argc > 2 ? (size_t)atoll(argv[2]) : 1u << 20);

    int rc = mg_dist_init(&dist, NULL, err, sizeof(err));
    if (rc)
        die("%s", err);
    struct mg_comm *c = dist->comm;
    if (!strcmp(cmd, "info")) {
        printf("rank %d world %d local_rank %d local_world %d hosts %d: %s\n", c->rank, c->world,
               c->local_rank, c->local_world, c->nhosts, c->desc);
    } else if (!strcmp(cmd, "check")) {
        struct cc_opts o = {.max_bytes = argc > 2 ? (size_t)atoll(argv[2]) : 16u << 20,
                            .rank_order = c->rank_ordered};
        int bad = cc_run_all(c, &o);
        if (bad)
            die("%d collective checks failed", bad);
        printf("rank %d: all collective checks passed (%s)\n", c->rank, c->desc);
    } else if (!strcmp(cmd, "check-registered")) {
        struct cc_opts o = {.max_bytes = argc > 2 ? (size_t)atoll(argv[2]) : 16u << 20,
                            .rank_order = c->rank_ordered};
        const char *z = getenv("MG_COMM_ZEROCOPY");
        int bad = cc_run_registered(c, &o, z && !strcmp(z, "0") ? SIZE_MAX : (64u << 10) + 1);
        if (bad)
            die("%d checks in registered memory failed", bad);
        printf("rank %d: all checks in registered memory passed, %llu zero-copy (%s)\n", c->rank,
               (unsigned long long)c->zerocopy, c->desc);
    } else if (!strcmp(cmd, "loop") && argc > 3) {
        cmd_loop(atoi(argv[2]), atol(argv[3]), argc > 4 && !strcmp(argv[4], "--registered"));
    } else if (!strcmp(cmd, "hang") && argc > 3) {
        cmd_hang(atoi(argv[2]), atoi(argv[3]));
    } else if (!strcmp(cmd, "progress-cost")) {
        cmd_progress_cost();
    } else if (!strcmp(cmd, "steps") && argc > 5) {
        cmd_steps(atol(argv[2]), atoi(argv[3]), atol(argv[4]), argv[5]);
    } else if (!strcmp(cmd, "bench")) {
        cmd_bench(argc - 2, argv + 2);
    } else {
        die("unknown command '%s'", cmd);
    }
    rc = mg_dist_finalize(dist, MG_COMM_DEFAULT_TIMEOUT);
    if (rc)
        die("%s", mg_comm_errmsg(c));
    mg_dist_release(dist);
    return 0;
}
