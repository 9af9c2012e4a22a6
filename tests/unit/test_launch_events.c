/* The event log (launcher/events.h): every event written with its writer and
 * read back with the parser `mglaunch logs` uses, field by field, so the two
 * sides of the contract in docs/logs.md cannot drift apart. Also: optional
 * fields left out and read back as absent, the caps (argv, message), and the
 * reader skipping what a killed launcher or a stranger left in the file. */
#include "events.h"
#include "logdir.h"
#include "tap.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmp[] = "/tmp/mgtest-events.XXXXXX";

/* Strings that need escaping, so the round trip goes through the JSON rules. */
#define ODD "quote \" backslash \\ tab \t newline \n \xc3\xa9"

static int64_t t_before, t_after;

static void write_all(struct mg_rundir *rd)
{
    char *argv[] = {"python3", "-u", "train.py", "--lr", ODD, NULL};
    struct mg_ev_run_start rs = {
        .run_id = "job-1",
        .host = "node07",
        .pid = 4100,
        .proc_start = 123456789012LL,
        .version = "1.2.3",
        .nproc = 8,
        .max_restarts = 3,
        .role = "trainer",
        .rdzv_backend = "c10d",
        .logs_saved = 1,
        .argv = argv,
        .argc = 5,
    };
    struct mg_ev_attempt_start as = {
        .attempt = 4,
        .restart_count = 2,
        .round = 5,
        .nproc = 8,
        .world_size = 16,
        .group_rank = 1,
        .group_world_size = 2,
        .first_rank = 8,
        .master_addr = "10.0.0.7",
        .master_port = 29500,
        .dir = "/logs/job-1/attempt_4",
    };
    struct mg_ev_worker ws = {.attempt = 4, .local_rank = 3, .rank = 11, .pid = 4170};
    struct mg_ev_worker_exit we = {
        .w = {.attempt = 4, .local_rank = 3, .rank = 11, .pid = 4170},
        .outcome = "failed",
        .exit_code = 139,
        .signal = "SIGSEGV",
        .exec_error = "Permission denied",
        .duration_ms = 12345,
        .message = ODD,
    };
    struct mg_ev_worker_exit we_min = {
        .w = {.attempt = 4, .local_rank = 2, .rank = 10, .pid = 4169},
        .outcome = "succeeded",
    };
    struct mg_ev_worker_logs wl = {
        .w = {.attempt = 4, .local_rank = 3, .rank = 11, .pid = 4170},
        .out = "not saved",
        .err = "cut short: No space left on device",
        .stderr_tail = ODD,
    };
    struct mg_ev_signal sg = {.signal = "SIGTERM"};
    struct mg_ev_signal sg_fwd = {.signal = "SIGUSR1", .forwarded_only = 1};
    struct mg_ev_kill k = {.attempt = 4, .workers = 7, .reason = "grace period over"};
    struct mg_ev_attempt_end ae = {.attempt = 4,
                                   .result = "failed",
                                   .failed = 1,
                                   .stopped = 7,
                                   .duration_ms = 12400,
                                   .step = 41};
    struct mg_ev_resume rs_mem = {.attempt = 4,
                                  .rank = 8,
                                  .world_size = 16,
                                  .from = "memory",
                                  .source = "rank",
                                  .step = 33,
                                  .epoch = 2,
                                  .source_rank = 3,
                                  .source_world_size = 24};
    struct mg_ev_resume rs_disk = {.attempt = 4,
                                   .rank = 8,
                                   .world_size = 16,
                                   .from = "disk",
                                   .step = 30,
                                   .epoch = 1,
                                   .source_rank = -1,
                                   .checkpoint = ODD};
    struct mg_ev_restart r = {
        .restart_count = 3, .max_restarts = 5, .backoff_ms = 200, .reason = "worker failed"};
    struct mg_ev_run_end re = {
        .result = "signaled",
        .exit_code = 143,
        .rounds = 5,
        .restarts = 3,
        .signal = "SIGTERM",
        .error = "rendezvous closed",
        .has_root = 1,
        .root = {.attempt = 4,
                 .rank = 11,
                 .local_rank = 3,
                 .pid = 4170,
                 .exit_code = 139,
                 .signal = "SIGSEGV",
                 .host = "node07",
                 .time_ms = 1710411312830LL,
                 .message = ODD},
        .has_remote = 1,
        .remote = {.rank = -1,
                   .local_rank = -1,
                   .exit_code = 1,
                   .host = "node08",
                   .node = "node08-77-ab12cd34",
                   .time_ms = 1710411312840LL,
                   .first_rank = 8,
                   .nranks = 4,
                   .message = "node node08 stopped sending heartbeats"},
    };
    struct mg_ev_run_end re_min = {.result = "succeeded", .rounds = 1};

    t_before = mg_wall_ms();
    mg_event_run_start(rd, &rs);
    mg_event_attempt_start(rd, &as);
    mg_event_worker_start(rd, &ws);
    mg_event_worker_exit(rd, &we);
    mg_event_worker_exit(rd, &we_min);
    mg_event_worker_logs(rd, &wl);
    mg_event_signal(rd, &sg);
    mg_event_signal(rd, &sg_fwd);
    mg_event_kill(rd, &k);
    mg_event_resume(rd, &rs_mem);
    mg_event_resume(rd, &rs_disk);
    mg_event_attempt_end(rd, &ae);
    mg_event_restart(rd, &r);
    mg_event_run_end(rd, &re);
    mg_event_run_end(rd, &re_min);
    t_after = mg_wall_ms();
}

/* The next event, checked to be of this kind; what describes it. */
static int next(struct mg_event_reader *r, struct mg_event *ev, enum mg_event_kind kind,
                const char *name, const char *what)
{
    if (!mg_event_read(r, ev)) {
        ok(0, "%s%s read back", name, what);
        return 0;
    }
    is_int(ev->kind, kind, "%s%s read back", name, what);
    is_str(ev->name, name, "  event name");
    ok(ev->time_ms >= t_before && ev->time_ms <= t_after, "  time_ms is the wall clock");
    return ev->kind == kind;
}

static void read_all(struct mg_event_reader *r)
{
    struct mg_event ev;

    if (next(r, &ev, MG_EV_RUN_START, "run_start", "")) {
        const struct mg_ev_run_start *x = &ev.u.run_start;
        is_str(x->run_id, "job-1", "  run_id");
        is_str(x->host, "node07", "  host");
        is_int(x->pid, 4100, "  pid");
        is_int(x->proc_start, 123456789012LL, "  proc_start");
        is_str(x->version, "1.2.3", "  version");
        is_int(x->nproc, 8, "  nproc");
        is_int(x->max_restarts, 3, "  max_restarts");
        is_str(x->role, "trainer", "  role");
        is_str(x->rdzv_backend, "c10d", "  rdzv_backend");
        is_int(x->logs_saved, 1, "  logs_saved");
        is_int(x->argc, 5, "  argv: every argument");
        if (x->argc == 5) {
            is_str(x->argv[0], "python3", "  argv[0]");
            is_str(x->argv[2], "train.py", "  argv[2]");
            is_str(x->argv[4], ODD, "  argv[4], escaped and back");
            ok(x->argv[5] == NULL, "  argv ends with NULL");
        }
    }
    if (next(r, &ev, MG_EV_ATTEMPT_START, "attempt_start", "")) {
        const struct mg_ev_attempt_start *x = &ev.u.attempt_start;
        is_int(x->attempt, 4, "  attempt");
        is_int(x->restart_count, 2, "  restart_count");
        is_int(x->round, 5, "  round");
        is_int(x->nproc, 8, "  nproc");
        is_int(x->world_size, 16, "  world_size");
        is_int(x->group_rank, 1, "  group_rank");
        is_int(x->group_world_size, 2, "  group_world_size");
        is_int(x->first_rank, 8, "  first_rank");
        is_str(x->master_addr, "10.0.0.7", "  master_addr");
        is_int(x->master_port, 29500, "  master_port");
        is_str(x->dir, "/logs/job-1/attempt_4", "  dir");
    }
    if (next(r, &ev, MG_EV_WORKER_START, "worker_start", "")) {
        const struct mg_ev_worker *x = &ev.u.worker_start;
        is_int(x->attempt, 4, "  attempt");
        is_int(x->local_rank, 3, "  local_rank");
        is_int(x->rank, 11, "  rank");
        is_int(x->pid, 4170, "  pid");
    }
    if (next(r, &ev, MG_EV_WORKER_EXIT, "worker_exit", "")) {
        const struct mg_ev_worker_exit *x = &ev.u.worker_exit;
        is_int(x->w.attempt, 4, "  attempt");
        is_int(x->w.local_rank, 3, "  local_rank");
        is_int(x->w.rank, 11, "  rank");
        is_int(x->w.pid, 4170, "  pid");
        is_str(x->outcome, "failed", "  outcome");
        is_int(x->exit_code, 139, "  exit_code");
        is_str(x->signal, "SIGSEGV", "  signal");
        is_str(x->exec_error, "Permission denied", "  exec_error");
        is_int(x->duration_ms, 12345, "  duration_ms");
        is_str(x->message, ODD, "  message");
    }
    if (next(r, &ev, MG_EV_WORKER_EXIT, "worker_exit", " without its optional fields")) {
        const struct mg_ev_worker_exit *x = &ev.u.worker_exit;
        is_int(x->w.local_rank, 2, "  local_rank");
        is_str(x->outcome, "succeeded", "  outcome");
        is_int(x->exit_code, 0, "  exit_code");
        ok(!x->signal && !x->exec_error && !x->message, "  signal, exec_error, message absent");
    }
    if (next(r, &ev, MG_EV_WORKER_LOGS, "worker_logs", "")) {
        const struct mg_ev_worker_logs *x = &ev.u.worker_logs;
        is_int(x->w.attempt, 4, "  attempt");
        is_int(x->w.local_rank, 3, "  local_rank");
        is_int(x->w.rank, 11, "  rank");
        is_str(x->out, "not saved", "  stdout");
        is_str(x->err, "cut short: No space left on device", "  stderr");
        is_str(x->stderr_tail, ODD, "  stderr_tail, escaped and back");
    }
    if (next(r, &ev, MG_EV_SIGNAL, "signal", "")) {
        is_str(ev.u.signal.signal, "SIGTERM", "  signal");
        is_int(ev.u.signal.forwarded_only, 0, "  not forwarded_only");
    }
    if (next(r, &ev, MG_EV_SIGNAL, "signal", ", forwarded")) {
        is_str(ev.u.signal.signal, "SIGUSR1", "  signal");
        is_int(ev.u.signal.forwarded_only, 1, "  forwarded_only");
    }
    if (next(r, &ev, MG_EV_KILL, "kill", "")) {
        is_int(ev.u.kill.attempt, 4, "  attempt");
        is_int(ev.u.kill.workers, 7, "  workers");
        is_str(ev.u.kill.reason, "grace period over", "  reason");
    }
    if (next(r, &ev, MG_EV_RESUME, "resume", ", from memory")) {
        const struct mg_ev_resume *x = &ev.u.resume;
        is_int(x->attempt, 4, "  attempt");
        is_int(x->rank, 8, "  rank");
        is_int(x->world_size, 16, "  world_size");
        is_str(x->from, "memory", "  from");
        is_int(x->step, 33, "  step");
        is_int(x->epoch, 2, "  epoch");
        is_str(x->source, "rank", "  source");
        is_int(x->source_rank, 3, "  source_rank");
        is_int(x->source_world_size, 24, "  source_world_size");
        ok(!x->checkpoint, "  no checkpoint");
    }
    if (next(r, &ev, MG_EV_RESUME, "resume", ", from disk")) {
        const struct mg_ev_resume *x = &ev.u.resume;
        is_str(x->from, "disk", "  from");
        is_int(x->step, 30, "  step");
        ok(!x->source, "  source absent");
        is_int(x->source_rank, -1, "  source_rank absent: -1");
        is_int(x->source_world_size, 0, "  source_world_size absent: 0");
        is_str(x->checkpoint, ODD, "  checkpoint, escaped and back");
    }
    if (next(r, &ev, MG_EV_ATTEMPT_END, "attempt_end", "")) {
        const struct mg_ev_attempt_end *x = &ev.u.attempt_end;
        is_int(x->attempt, 4, "  attempt");
        is_str(x->result, "failed", "  result");
        is_int(x->failed, 1, "  failed");
        is_int(x->stopped, 7, "  stopped");
        is_int(x->duration_ms, 12400, "  duration_ms");
        is_int(x->step, 41, "  step");
    }
    if (next(r, &ev, MG_EV_RESTART, "restart", "")) {
        const struct mg_ev_restart *x = &ev.u.restart;
        is_int(x->restart_count, 3, "  restart_count");
        is_int(x->max_restarts, 5, "  max_restarts");
        is_int(x->backoff_ms, 200, "  backoff_ms");
        is_str(x->reason, "worker failed", "  reason");
    }
    if (next(r, &ev, MG_EV_RUN_END, "run_end", "")) {
        const struct mg_ev_run_end *x = &ev.u.run_end;
        is_str(x->result, "signaled", "  result");
        is_int(x->exit_code, 143, "  exit_code");
        is_int(x->rounds, 5, "  rounds");
        is_int(x->restarts, 3, "  restarts");
        is_str(x->signal, "SIGTERM", "  signal");
        is_str(x->error, "rendezvous closed", "  error");
        is_int(x->has_root, 1, "  root_cause");
        is_int(x->root.attempt, 4, "  root_cause.attempt");
        is_int(x->root.rank, 11, "  root_cause.rank");
        is_int(x->root.local_rank, 3, "  root_cause.local_rank");
        is_int(x->root.pid, 4170, "  root_cause.pid");
        is_int(x->root.exit_code, 139, "  root_cause.exit_code");
        is_str(x->root.signal, "SIGSEGV", "  root_cause.signal");
        is_str(x->root.host, "node07", "  root_cause.host");
        is_int(x->root.time_ms, 1710411312830LL, "  root_cause.time_ms");
        is_str(x->root.message, ODD, "  root_cause.message");
        is_int(x->has_remote, 1, "  remote_cause");
        is_int(x->remote.rank, -1, "  remote_cause.rank (a lost node)");
        is_str(x->remote.host, "node08", "  remote_cause.host");
        is_str(x->remote.node, "node08-77-ab12cd34", "  remote_cause.node");
        is_int(x->remote.time_ms, 1710411312840LL, "  remote_cause.time_ms");
        is_int(x->remote.first_rank, 8, "  remote_cause.first_rank");
        is_int(x->remote.nranks, 4, "  remote_cause.nranks");
        ok(!x->remote.signal, "  remote_cause.signal absent");
        is_str(x->remote.message, "node node08 stopped sending heartbeats",
               "  remote_cause.message");
    }
    if (next(r, &ev, MG_EV_RUN_END, "run_end", " without its optional fields")) {
        const struct mg_ev_run_end *x = &ev.u.run_end;
        is_str(x->result, "succeeded", "  result");
        is_int(x->rounds, 1, "  rounds");
        ok(!x->signal && !x->error, "  signal and error absent");
        is_int(x->has_root, 0, "  no root_cause");
        is_int(x->has_remote, 0, "  no remote_cause");
    }
    ok(!mg_event_read(r, &ev), "nothing more");
}

/* run_start's argv and worker_exit's message are capped (docs/logs.md). */
static void test_caps(const char *path)
{
    static char big[3000], *argv[100];
    struct mg_rundir rd;
    struct mg_event_reader r;
    struct mg_event ev;
    memset(big, 'x', sizeof(big) - 1);
    for (int i = 0; i < 100; i++)
        argv[i] = "arg";
    struct mg_ev_run_start many = {.run_id = "c", .argv = argv, .argc = 100};
    struct mg_ev_run_start longer = {.run_id = "c", .argv = (char *[]){big, big, "z"}, .argc = 3};
    struct mg_ev_worker_exit we = {.outcome = "failed", .message = big};

    if (mg_rundir_open(&rd, tmp, "caps"))
        BAIL_OUT("rundir");
    mg_event_run_start(&rd, &many);
    mg_event_run_start(&rd, &longer);
    mg_event_worker_exit(&rd, &we);
    mg_rundir_close(&rd);
    if (mg_event_reader_open(&r, path))
        BAIL_OUT("reader");
    mg_event_read(&r, &ev);
    is_int(ev.u.run_start.argc, MG_EV_ARGV_MAX + 1, "argv: %d arguments, then a mark",
           MG_EV_ARGV_MAX);
    is_str(ev.u.run_start.argv[MG_EV_ARGV_MAX], "...", "the mark is \"...\"");
    mg_event_read(&r, &ev);
    is_int(ev.u.run_start.argc, 2, "argv: cut at %d bytes", MG_EV_ARGV_BYTES);
    is_str(ev.u.run_start.argv[1], "...", "and marked");
    mg_event_read(&r, &ev);
    is_int(strlen(ev.u.worker_exit.message), MG_EV_MESSAGE_MAX, "message cut to %d bytes",
           MG_EV_MESSAGE_MAX);
    mg_event_reader_close(&r);
}

/* What a killed launcher, a longer line or a future version may leave. */
static void test_skips(const char *path)
{
    struct mg_event_reader r;
    struct mg_event ev;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    char *huge = malloc(MG_EV_LINE_MAX + 100);
    if (fd < 0 || !huge)
        BAIL_OUT("open");
    memset(huge, ' ', MG_EV_LINE_MAX + 100);
    memcpy(huge, "{\"event\":\"kill\"", 15);
    huge[MG_EV_LINE_MAX + 98] = '}';
    huge[MG_EV_LINE_MAX + 99] = '\n';
    const char *lines[] = {
        "not json\n",
        "[1,2]\n",
        "{\"event\":\"checkpoint\",\"time_ms\":5,\"step\":100}\n",
        NULL, /* the huge line */
        "{\"event\":\"signal\",\"time_ms\":7,\"signal\":\"SIGINT\",\"new_field\":[1]}\n",
        "{\"event\":\"kill\",\"attempt\":1", /* cut: no line end */
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
        const char *l = lines[i] ? lines[i] : huge;
        size_t n = lines[i] ? strlen(l) : MG_EV_LINE_MAX + 100;
        if (write(fd, l, n) != (ssize_t)n)
            BAIL_OUT("write");
    }
    close(fd);
    free(huge);
    if (mg_event_reader_open(&r, path))
        BAIL_OUT("reader");
    ok(mg_event_read(&r, &ev) == 1 && ev.kind == MG_EV_OTHER, "an unknown event is read");
    is_str(ev.name, "checkpoint", "  with its name");
    is_int(ev.time_ms, 5, "  and time");
    ok(mg_event_read(&r, &ev) == 1 && ev.kind == MG_EV_SIGNAL,
       "non-JSON, non-object and too long lines skipped; unknown fields ignored");
    is_str(ev.u.signal.signal, "SIGINT", "  its field");
    ok(!mg_event_read(&r, &ev), "a line cut at the end of the file is skipped");
    mg_event_reader_close(&r);
    is_int(mg_event_reader_open(&r, "/nonexistent/events.jsonl"), -ENOENT, "no event log: -ENOENT");
}

int main(void)
{
    struct mg_rundir rd;
    struct mg_event_reader r;
    char path[256];

    if (!mkdtemp(tmp))
        BAIL_OUT("mkdtemp");
    if (mg_rundir_open(&rd, tmp, "job-1"))
        BAIL_OUT("rundir");
    write_all(&rd);
    mg_rundir_close(&rd);
    snprintf(path, sizeof(path), "%s/job-1/%s", tmp, MG_EVENTS_FILE);
    is_int(mg_event_reader_open(&r, path), 0, "event log opened");
    read_all(&r);
    mg_event_reader_close(&r);

    snprintf(path, sizeof(path), "%s/caps/%s", tmp, MG_EVENTS_FILE);
    test_caps(path);
    snprintf(path, sizeof(path), "%s/odd.jsonl", tmp);
    test_skips(path);

    snprintf(path, sizeof(path), "rm -rf '%s'", tmp);
    if (system(path) != 0)
        diag("could not remove %s", tmp);
    return done_testing();
}
