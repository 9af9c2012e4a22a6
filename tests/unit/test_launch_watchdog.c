/* The watchdog's verdict (launcher/watchdog/watchdog.h) on records made
 * here: the bound (floor, steps, the last resort before the first step and
 * in a checkpoint), the hung rank among waiters, a stopped rank inside a
 * collective, every rank waiting (one node: the one behind; several: the
 * missing rank is elsewhere, reported, not acted on), nothing wrong; and a
 * process's state from a /proc tree written here (procstate.h); torch's
 * file-timer requests: set, release, expiry order, refusals (filetimer.h).
 * timeout: 30 */
#include "filetimer.h"
#include "procstate.h"
#include "ticker.h"
#include "watchdog.h"
#include "tap.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define S 1000000LL /* a second in microseconds */

static void rec_init(struct mg_watch_rank *r, int rank, int64_t beat_us, int64_t step_us)
{
    memset(r, 0, sizeof(*r));
    r->rank = r->local_rank = rank;
    r->pid = 100 + rank;
    r->live = 1;
    r->rec.magic = MG_PROGRESS_MAGIC;
    r->rec.version = MG_PROGRESS_VERSION;
    r->rec.pid = r->pid;
    r->rec.rank = rank;
    r->rec.phase = MG_PH_COMPUTE;
    r->rec.beat_us = beat_us;
    r->rec.step = 40;
    r->rec.coll_timeout_ms = 300000;
    r->rec.steps_done = 40;
    for (int i = 0; i < MG_PROGRESS_STEPS; i++)
        r->rec.step_us[i] = step_us;
    r->rec.coll_next = 1;
    r->ps.state = 'R';
}

/* Records collectives 1..done finished, and done+1 started when waiting. */
static void colls(struct mg_watch_rank *r, uint64_t done, int waiting, int64_t since)
{
    for (uint64_t s = 1; s <= done + (waiting ? 1 : 0); s++) {
        struct mg_progress_coll *c = &r->rec.ring[s % MG_PROGRESS_RING];
        c->seq = s;
        c->op = MG_PROG_ALLREDUCE;
        c->bucket = 2;
        c->bytes = 814 * 1024;
        c->state = s <= done ? MG_CS_DONE : MG_CS_STARTED;
        c->start_us = s <= done ? 0 : since;
    }
    r->rec.coll_next = done + (waiting ? 2 : 1);
}

static void test_bounds(void)
{
    struct mg_watch_rank r;
    char how[160];
    rec_init(&r, 0, 0, S / 100);
    is_int((int)(mg_watch_bound_us(&r.rec, 10, how, sizeof(how)) / 1000), 10000, "the floor");
    ok(strstr(how, "--hang-timeout 10 s") != NULL, "says so: %s", how);
    rec_init(&r, 0, 0, 3 * S);
    is_int((int)(mg_watch_bound_us(&r.rec, 10, how, sizeof(how)) / 1000), 30000,
           "10 x the slowest recent step when longer");
    ok(strstr(how, "10 x its slowest recent step, 3 s") != NULL, "says so: %s", how);
    r.rec.steps_done = 0;
    is_int((int)(mg_watch_bound_us(&r.rec, 10, how, sizeof(how)) / 1000), 305000,
           "before the first step: the collective timeout + 5 s");
    rec_init(&r, 0, 0, S / 100);
    r.rec.phase = MG_PH_CHECKPOINT;
    is_int((int)(mg_watch_bound_us(&r.rec, 10, how, sizeof(how)) / 1000), 305000,
           "in a checkpoint: the same");
    ok(strstr(how, "a checkpoint") != NULL, "says so: %s", how);
}

static void test_judge(void)
{
    struct mg_watch_rank r[3];
    struct mg_hang_verdict v;
    int64_t now = 100 * S;

    /* ranks 0 and 2 wait in #1234 since 12 s; rank 1 spins after #1233 */
    for (int i = 0; i < 3; i++)
        rec_init(&r[i], i, now - 12 * S, S / 10);
    colls(&r[0], 1233, 1, now - 12 * S);
    colls(&r[1], 1233, 0, 0);
    colls(&r[2], 1233, 1, now - 12 * S);
    is_int(mg_watch_judge(r, 3, 0, 10, now, "h", &v), 1, "a verdict");
    is_int(v.culprit, 1, "the rank outside the collective is hung");
    ok(strstr(v.line, "rank 1 (local rank 1, host h, pid 101) is hung: no progress for 12.0 s") &&
           strstr(v.line, "ranks 0,2 wait in allreduce #1234 (bucket 2, 814 KB) since 12.0 s") &&
           strstr(v.line, "rank 1 last finished #1233"),
       "the line lines the ranks up: %s", v.line);
    static const char want[] =
        "hung: no progress for 12.0 s in forward/backward of step 41 (40 done); ";
    ok(!strncmp(v.why, want, sizeof(want) - 1), "why, in train's count of steps: %s", v.why);

    /* within its bound: nothing */
    is_int(mg_watch_judge(r, 3, 0, 20, now, "h", &v), 0, "under a 20 s floor: nothing");

    /* rank 1 stopped inside the collective too: still the cause */
    colls(&r[1], 1233, 1, now - 12 * S);
    r[1].ps.state = 'T';
    is_int(mg_watch_judge(r, 3, 0, 10, now, "h", &v), 1, "stopped inside: a verdict");
    is_int(v.culprit, 1, "the stopped rank");
    ok(strstr(v.line, ", inside allreduce #1234") != NULL, "it was inside: %s", v.line);

    /* every rank waits, none stopped: several nodes -> elsewhere */
    r[1].ps.state = 'S';
    is_int(mg_watch_judge(r, 3, 1, 10, now, "h", &v), 1, "all waiting, several nodes: reported");
    ok(v.remote && v.culprit < 0, "as a wait for another node, nobody here blamed");
    ok(strstr(v.line, "ranks 0,1,2 wait in allreduce #1234") && strstr(v.line, "on another node"),
       "says so: %s", v.line);

    /* one node: the rank behind is the cause */
    colls(&r[2], 1232, 1, now - 12 * S);
    is_int(mg_watch_judge(r, 3, 0, 10, now, "h", &v), 1, "all waiting, one node: a verdict");
    is_int(v.culprit, 2, "the rank in the older collective");

    /* no records (a Python worker): nothing */
    for (int i = 0; i < 3; i++)
        r[i].live = 0;
    is_int(mg_watch_judge(r, 3, 0, 10, now, "h", &v), 0, "no records: nothing");
}

static void test_procstate(void)
{
    char root[] = "/tmp/mgtest-procstate.XXXXXX", path[256], buf[160];
    struct mg_procstate ps;
    if (!mkdtemp(root))
        BAIL_OUT("mkdtemp");
    snprintf(path, sizeof(path), "%s/proc", root);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/proc/42", root);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/proc/42/stat", root);
    FILE *f = fopen(path, "w");
    fputs("42 (a) b) (c) S 1 42 42 0 -1\n", f);
    fclose(f);
    snprintf(path, sizeof(path), "%s/proc/42/wchan", root);
    f = fopen(path, "w");
    fputs("pipe_read", f);
    fclose(f);
    is_int(mg_procstate_read(root, 42, &ps), 0, "read");
    ok(ps.state == 'S', "the state after a name with ') ' in it");
    is_str(mg_procstate_text(&ps, buf, sizeof(buf)), "sleeping in the kernel (S, in pipe_read)",
           "described");
    is_int(mg_procstate_read(root, 43, &ps), -ESRCH, "a process that is gone");
    is_str(mg_procstate_text(&ps, buf, sizeof(buf)), "gone", "described");
    snprintf(path, sizeof(path), "rm -rf '%s'", root);
    if (system(path) != 0)
        diag("could not remove %s", root);
}

static void test_filetimer(void)
{
    struct mg_filetimer ft;
    struct mg_filetimer_entry e;
    char why[160], err[256];
    is_int(mg_filetimer_open(&ft, NULL, "/tmp", err, sizeof(err)), 0, "a FIFO of its own");
    struct stat st;
    ok(stat(ft.path, &st) == 0 && S_ISFIFO(st.st_mode), "it is a FIFO: %s", ft.path);
#define REQ(pid, scope, exp, sig)                                                                  \
    "{\"version\": 1, \"pid\": " #pid ", \"scope_id\": \"" scope "\", \"expiration_time\": " #exp  \
    ", \"signal\": " #sig "}"
    static const char *const set[] = {REQ(7, "a", 105.5, 9), REQ(7, "b", 103, 15),
                                      REQ(8, "a", 200, 9), REQ(8, "a", -1, 0)};
    for (int i = 0; i < 4; i++)
        is_int(mg_filetimer_apply(&ft, set[i], strlen(set[i]), 100, why, sizeof(why)), 0,
               "request %d applied", i);
    is_int(ft.n, 2, "two timers: the third was released");
    is_int(mg_filetimer_take_expired(&ft, 104, &e), 1, "at 104 s: one expired");
    ok(e.pid == 7 && !strcmp(e.scope, "b") && e.sig == 15 && e.expires == 103, "the earlier one");
    is_int(mg_filetimer_take_expired(&ft, 104, &e), 0, "nothing else yet");
    is_int(mg_filetimer_take_expired(&ft, 106, &e), 1, "at 106 s, the other");
    static const struct {
        const char *line, *why;
    } bad[] = {
        {"[1]", "not a JSON object"},
        {"{\"pid\": 0, \"scope_id\": \"a\", \"expiration_time\": 1, \"signal\": 9}", "no \"pid\""},
        {"{\"pid\": 3, \"scope_id\": 5, \"expiration_time\": 1, \"signal\": 9}", "no \"scope_id\""},
        {"{\"pid\": 3, \"scope_id\": \"a\", \"signal\": 9}", "no \"expiration_time\""},
        {"{\"pid\": 3, \"scope_id\": \"a\", \"expiration_time\": 1, \"signal\": 99}",
         "no \"signal\""},
        {"{\"version\": 2, \"pid\": 3, \"scope_id\": \"a\", \"expiration_time\": 1, \"signal\": 9}",
         "\"version\" is not 1"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        is_int(mg_filetimer_apply(&ft, bad[i].line, strlen(bad[i].line), 100, why, sizeof(why)),
               -EINVAL, "refused: %s", bad[i].line);
        ok(!strncmp(why, bad[i].why, strlen(bad[i].why)), "why: %s", why);
    }
    is_int(ft.n, 0, "nothing set by them");
    /* a worker that died in the middle of a line: the next attempt's first
     * request is not glued to its remains */
    int w = open(ft.path, O_WRONLY | O_NONBLOCK);
    ok(w >= 0, "the FIFO opens for writing");
    static const char part[] = "{\"version\": 1, \"pid\": 7, \"sco";
    ok(write(w, part, strlen(part)) == (ssize_t)strlen(part), "half a request written");
    is_int(mg_filetimer_read(&ft, 100, NULL, NULL), 0, "half a line applies nothing");
    mg_filetimer_clear(&ft);
    static const char whole[] = REQ(9, "c", 150, 9) "\n";
    ok(write(w, whole, strlen(whole)) == (ssize_t)strlen(whole), "a new attempt's request");
    is_int(mg_filetimer_read(&ft, 100, NULL, NULL), 1, "after a clear, it is applied whole");
    is_int(ft.n, 1, "one timer set");
    close(w);
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s", ft.path);
    mg_filetimer_release(&ft);
    ok(access(path, F_OK) != 0, "the FIFO it made is removed");
    is_int(mg_filetimer_open(&ft, "/proc/version", NULL, err, sizeof(err)), -EEXIST,
           "a path that is not a FIFO: refused");
    is_str(err, "TORCHELASTIC_TIMER_FILE='/proc/version' exists and is not a FIFO", "says so");
}

/* The node's progress lines: off, the first step, the interval, the rate. */
static void test_ticker(void)
{
    struct mg_ticker t;
    char line[256];
    char *none[] = {NULL}, *two[] = {"MG_NODE_PROGRESS_EVERY=2", NULL};
    char *off[] = {"MG_NODE_PROGRESS_EVERY=0", NULL}, *bad[] = {"MG_NODE_PROGRESS_EVERY=2s", NULL};
    is_int(mg_ticker_init(&t, none), 0, "ticker: unset");
    is_int((int)t.every_ms, MG_TICKER_EVERY_S * 1000, "every 30 s by default");
    is_int(mg_ticker_init(&t, bad), -EINVAL, "'2s' refused");
    is_int(mg_ticker_init(&t, off), 0, "0 accepted");
    is_int(mg_ticker_due(&t, 5, 1000, "ranks 2-3 here", line, sizeof(line)), 0, "0: no line ever");
    mg_ticker_init(&t, two);
    is_int(mg_ticker_due(&t, 0, 1000, "ranks 2-3 here", line, sizeof(line)), 0,
           "no line before the first step");
    is_int(mg_ticker_due(&t, 1, 1100, "ranks 2-3 here", line, sizeof(line)), 1, "the first step");
    ok(strstr(line, "ranks 2-3 here took their first step; a line here every 2 s") == line,
       "says so: %s", line);
    is_int(mg_ticker_due(&t, 50, 3000, "ranks 2-3 here", line, sizeof(line)), 0,
           "nothing before the interval");
    is_int(mg_ticker_due(&t, 201, 3100, "ranks 2-3 here", line, sizeof(line)), 1, "then a line");
    is_str(line, "ranks 2-3 here: step 201, 100.0 steps/s", "the step and the rate");
    mg_ticker_reset(&t);
    is_int(mg_ticker_due(&t, 3, 3200, "ranks 2-3 here", line, sizeof(line)), 1,
           "a new attempt: its first step says so again");
}

int main(void)
{
    test_bounds();
    test_judge();
    test_procstate();
    test_filetimer();
    test_ticker();
    return done_testing();
}
