/* A store server for the integration tests and benchmarks, run the way the
 * launcher runs it: one poll() loop watching its signals and the server's
 * descriptors (or, with --thread, the runtime's background thread).
 *
 *   storesrv [--host H] [--port P] [--token T] [--port-file F] [--stats-file F]
 *            [--max-clients N] [--max-waiters N] [--max-store-bytes N]
 *            [--max-buffer-bytes N] [--handshake-timeout MS] [--frame-timeout MS]
 *            [--thread] [--turn-log F] [--turn-log-ms MS]
 *
 * Writes the port to --port-file once listening. SIGUSR1 writes the server's
 * statistics to --stats-file (key=value, one line; the longest turn's work
 * as turn_max_*); SIGTERM / SIGINT stop it. --turn-log F: a line for every
 * turn of the loop that took --turn-log-ms (20) or more, with what it did and
 * its CPU time (a turn whose wall time far exceeds its CPU time waited for a
 * core), to find where a client's latency goes.
 * Signals reach the loop through a self-pipe rather than a signalfd: sanitizer
 * builds run a thread of their own that does not block signals, so a signalfd
 * would let SIGUSR1 kill the process there. */
#include "mg_err.h"
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int write_file(const char *path, const char *text)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -errno;
    fputs(text, f);
    if (fclose(f))
        return -errno;
    return rename(tmp, path) ? -errno : 0;
}

/* How long the loop's own turns took and how late its timed wake-ups came
 * (the machine's run queue, not the server): told apart in the stats. */
static int64_t turn_max_us, turn_cpu_max_us, late_max_us;

static int64_t cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* The time this process's threads waited on a run queue (the kernel's
 * schedstat), in ms; -1 when not available. */
static double run_delay_ms(void)
{
    unsigned long long run = 0, wait = 0;
    FILE *f = fopen("/proc/self/schedstat", "r");
    if (!f)
        return -1;
    int ok = fscanf(f, "%llu %llu", &run, &wait) == 2;
    fclose(f);
    return ok ? (double)wait / 1e6 : -1;
}

/* A turn's work, as key=value pairs with a prefix. */
static int turn_text(char *out, size_t cap, const char *p, const struct mg_store_server_turn *t)
{
    return snprintf(out, cap,
                    "%sms=%.1f %sevents=%d %srequests=%d %swoken=%d %stimed_out=%d %sflushed=%d "
                    "%sscanned=%d %saccepted=%d %sclosed=%d",
                    p, (double)t->us / 1000.0, p, t->events, p, t->requests, p, t->woken, p,
                    t->timed_out, p, t->flushed, p, t->scanned, p, t->accepted, p, t->closed);
}

static void write_stats(struct mg_store_server *srv, const char *path)
{
    struct mg_store_server_stats s;
    char line[1024], mx[400];
    if (!path)
        return;
    mg_store_server_stats(srv, &s);
    turn_text(mx, sizeof(mx), "srv_turn_max_", &s.turn_max);
    snprintf(line, sizeof(line),
             "clients=%d waiters=%d keys=%zu stored_bytes=%zu buffer_bytes=%zu revision=%lld "
             "dropped=%llu leases_expired=%llu requests=%llu turns=%llu turn_max_ms=%.1f "
             "turn_cpu_max_ms=%.1f late_max_ms=%.1f run_delay_ms=%.0f %s\n",
             s.clients, s.waiters, s.keys, s.stored_bytes, s.buffer_bytes, (long long)s.revision,
             (unsigned long long)s.dropped, (unsigned long long)s.leases_expired,
             (unsigned long long)s.requests, (unsigned long long)s.turns,
             (double)turn_max_us / 1000.0, (double)turn_cpu_max_us / 1000.0,
             (double)late_max_us / 1000.0, run_delay_ms(), mx);
    write_file(path, line);
}

/* --turn-log: one line per slow turn (t: ms since the start; gap: ms since
 * the previous turn ended, in poll or waiting for a core). */
static void log_turn(FILE *f, struct mg_store_server *srv, int64_t t_start, int64_t t1, int64_t t2,
                     int64_t gap_us, int64_t cpu_us_)
{
    struct mg_store_server_stats s;
    char text[400];
    mg_store_server_stats(srv, &s);
    turn_text(text, sizeof(text), "", &s.turn_last);
    fprintf(f, "t=%.0f wall_ms=%.1f cpu_ms=%.1f gap_ms=%.1f clients=%d waiters=%d %s\n",
            (double)(t1 - t_start) / 1000.0, (double)(t2 - t1) / 1000.0, (double)cpu_us_ / 1000.0,
            (double)gap_us / 1000.0, s.clients, s.waiters, text);
}

static int sig_w = -1;

static void on_signal(int sig)
{
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    ssize_t rc = write(sig_w, &b, 1);
    (void)rc;
    errno = saved;
}

static void usage(void)
{
    fprintf(stderr, "usage: storesrv [--host H] [--port P] [--token T] [--port-file F] "
                    "[--stats-file F] [--max-clients N] [--max-waiters N] [--max-store-bytes N] "
                    "[--max-buffer-bytes N] [--handshake-timeout MS] [--frame-timeout MS] "
                    "[--thread] [--turn-log F] [--turn-log-ms MS]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    struct mg_store_server_opts o = {.host = "127.0.0.1"};
    const char *port_file = NULL, *stats_file = NULL, *turn_log = NULL;
    int thread = 0, rc, turn_log_ms = 20;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--thread")) {
            thread = 1;
            continue;
        }
        if (!v)
            usage();
        i++;
        if (!strcmp(a, "--host"))
            o.host = v;
        else if (!strcmp(a, "--port"))
            o.port = atoi(v);
        else if (!strcmp(a, "--token"))
            o.token = v;
        else if (!strcmp(a, "--port-file"))
            port_file = v;
        else if (!strcmp(a, "--stats-file"))
            stats_file = v;
        else if (!strcmp(a, "--max-clients"))
            o.max_clients = atoi(v);
        else if (!strcmp(a, "--max-waiters"))
            o.max_waiters = atoi(v);
        else if (!strcmp(a, "--max-store-bytes"))
            o.max_store_bytes = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--max-buffer-bytes"))
            o.max_buffer_bytes = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--handshake-timeout"))
            o.handshake_timeout_ms = atoi(v);
        else if (!strcmp(a, "--frame-timeout"))
            o.frame_timeout_ms = atoi(v);
        else if (!strcmp(a, "--turn-log"))
            turn_log = v;
        else if (!strcmp(a, "--turn-log-ms"))
            turn_log_ms = atoi(v);
        else
            usage();
    }
    FILE *tlog = NULL;
    if (turn_log && !(tlog = fopen(turn_log, "w"))) {
        fprintf(stderr, "storesrv: cannot write '%s': %s\n", turn_log, strerror(errno));
        return 1;
    }

    int sp[2];
    if (pipe2(sp, O_CLOEXEC | O_NONBLOCK)) {
        fprintf(stderr, "storesrv: pipe: %s\n", strerror(errno));
        return 1;
    }
    int sfd = sp[0];
    sig_w = sp[1];
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);

    struct mg_store_server *srv;
    if ((rc = mg_store_server_start(&srv, &o))) {
        fprintf(stderr, "storesrv: cannot listen on '%s:%d': %s\n", o.host, o.port,
                mg_strerror(rc));
        return 1;
    }
    if (thread && (rc = mg_store_server_start_thread(srv))) {
        fprintf(stderr, "storesrv: cannot start the server thread: %s\n", mg_strerror(rc));
        return 1;
    }
    if (port_file) {
        char text[32];
        snprintf(text, sizeof(text), "%d\n", mg_store_server_port(srv));
        if ((rc = write_file(port_file, text))) {
            fprintf(stderr, "storesrv: cannot write '%s': %s\n", port_file, mg_strerror(rc));
            return 1;
        }
    }

    struct pollfd *fds = NULL;
    int cap = 0, done = 0;
    int64_t t_start = now_us(), t_prev = t_start;
    while (!done) {
        int n = 1, timeout = -1;
        int need = 1 + (thread ? 0 : mg_store_server_nfds(srv));
        if (need > cap) {
            cap = need * 2;
            fds = realloc(fds, (size_t)cap * sizeof(*fds));
            if (!fds) {
                fprintf(stderr, "storesrv: out of memory\n");
                return 1;
            }
        }
        fds[0] = (struct pollfd){.fd = sfd, .events = POLLIN};
        if (!thread) {
            int k = mg_store_server_pollfds(srv, fds + 1, cap - 1);
            if (k < 0) {
                cap = 0;
                continue;
            }
            n += k;
            timeout = mg_store_server_timeout_ms(srv);
        }
        int64_t t0 = now_us();
        int pr = poll(fds, (nfds_t)n, timeout);
        if (pr < 0 && errno != EINTR) {
            fprintf(stderr, "storesrv: poll: %s\n", strerror(errno));
            return 1;
        }
        int64_t t1 = now_us();
        if (pr == 0 && timeout >= 0 && t1 - t0 - (int64_t)timeout * 1000 > late_max_us)
            late_max_us = t1 - t0 - (int64_t)timeout * 1000;
        if (!thread) {
            int64_t c1 = cpu_us();
            mg_store_server_process(srv, fds + 1, n - 1);
            int64_t t2 = now_us(), c2 = cpu_us();
            if (c2 - c1 > turn_cpu_max_us)
                turn_cpu_max_us = c2 - c1;
            if (t2 - t1 > turn_max_us)
                turn_max_us = t2 - t1;
            if (tlog && t2 - t1 >= (int64_t)turn_log_ms * 1000)
                log_turn(tlog, srv, t_start, t1, t2, t1 - t_prev, c2 - c1);
            t_prev = t2;
        }
        unsigned char sig;
        while (read(sfd, &sig, 1) == 1) {
            if (sig == SIGUSR1)
                write_stats(srv, stats_file);
            else
                done = 1;
        }
    }
    write_stats(srv, stats_file);
    mg_store_server_release(srv);
    if (tlog)
        fclose(tlog);
    free(fds);
    close(sfd);
    close(sig_w);
    return 0;
}
