/* What train shows as it goes (see train_internal.h): lines on standard
 * output above the progress bar, the bar itself, a lost output said once,
 * and --profile-startup's line. */
#include "rtutil.h"
#include "train_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* The first failed write of a stream is reported, once, with the file and
 * the reason; the run goes on (its checkpoints are its real output) and
 * exits with EXIT_INCOMPLETE. */
static void lost_stdout(struct progress *p, int err)
{
    if (p->stdout_lost)
        return;
    p->stdout_lost = 1;
    fprintf(stderr,
            TRAIN_PROG ": cannot write to standard output: %s (progress and results from here "
                       "on are lost; the exit status will be %d)\n",
            strerror(err), EXIT_INCOMPLETE);
}

void flush_stdout(struct progress *p)
{
    if (fflush(stdout) == EOF || ferror(stdout)) {
        int e = errno ? errno : EIO;
        clearerr(stdout);
        lost_stdout(p, e);
    }
}

/* Prints a line above the progress bar (or just a line without a terminal). */
void say(struct progress *p, const char *fmt, ...)
{
    va_list ap;
    if (p->tty)
        fputs("\r\033[K", stdout);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    flush_stdout(p);
    p->last_draw = 0;
}

void draw_bar(struct progress *p, long step, long total, long epoch, long epochs, double loss,
              double lr, double rate, double eta)
{
    char bar[31];
    int width = 30, fill = total ? (int)((double)step * width / (double)total) : width;
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '-';
    bar[width] = 0;
    long e = (long)(eta + 0.5);
    printf("\r\033[Kepoch %ld/%ld [%s] %3d%% step %ld/%ld loss %.4f lr %.4g %.0f samples/s "
           "eta %ld:%02ld",
           epoch, epochs, bar, total ? (int)(100.0 * (double)step / (double)total) : 100, step,
           total, loss, lr, rate, e / 60, e % 60);
    flush_stdout(p);
}

/* ---- --profile-startup ------------------------------------------------------------------ */

static const char *const phase_names[PH_COUNT] = {"dist",       "backend", "data",      "model",
                                                  "checkpoint", "sync",    "first step"};

struct profile prof;

void profile_start(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    prof.t0 = prof.mark = mg_seconds();
    prof.wall0 = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The time since the last mark goes to phase ph. */
void profile_mark(enum phase ph)
{
    double now = mg_seconds();
    prof.ms[ph] += (now - prof.mark) * 1e3;
    prof.mark = now;
}

/* One line on stderr, on every rank, once the first step is done: the wall
 * clock times let a benchmark line it up with the launcher's events. */
void profile_print(int rank)
{
    char buf[512];
    int n = 0;
    if (!prof.on || prof.printed)
        return;
    prof.printed = 1;
    for (int i = 0; i < PH_COUNT; i++)
        n += snprintf(buf + n, sizeof(buf) - (size_t)n, "%s%s %.1f ms", i ? ", " : "",
                      phase_names[i], prof.ms[i]);
    double total = (prof.mark - prof.t0) * 1e3;
    fprintf(stderr,
            TRAIN_PROG ": startup: rank %d: %s; total %.1f ms (main at %.6f, first step done at "
                       "%.6f, unix time)\n",
            rank, buf, total, prof.wall0, prof.wall0 + total / 1e3);
}

/* The first failed metrics write is said when it happens; the training goes
 * on (its checkpoints are its real output) and exits with EXIT_INCOMPLETE. */
void check_output(struct run *r, int rc)
{
    if (rc >= 0 || r->out_failed)
        return;
    r->out_failed = 1;
    fprintf(stderr,
            TRAIN_PROG ": %s (no more records are written there; the exit status will be %d)\n",
            mg_metrics_errmsg(r->out.metrics), EXIT_INCOMPLETE);
}
