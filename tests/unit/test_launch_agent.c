/* The agent's interface for rendezvous backends (launcher/agent.h), driven by
 * a backend written here the way a multi-node one would be: it forms the
 * group late from a timer, watches a descriptor through a poller, asks for a
 * membership restart (which must not count against --max_restarts), and ends
 * a run with mg_agent_fail. Real workers (/bin/sh) run under the agent.
 * timeout: 60 */
#include "agent.h"
#include "opts.h"
#include "tap.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

extern char **environ;

static char tmp[] = "/tmp/mgtest-agent.XXXXXX";

struct backend {
    int mode; /* 0: membership restart, 1: fail */
    int rounds, formed_late, polled, ended_results[8], nended, shutdown_code;
    int pipe_rd;
    int poller;
};

static void form(struct mg_agent *ag, void *ctx)
{
    struct backend *b = ctx;
    struct mg_group g = {.group_rank = 0,
                         .group_world_size = 1,
                         .world_size = 2,
                         .rank_offset = 0,
                         .role_rank_offset = 0,
                         .role_world_size = 2,
                         .master_addr = "127.0.0.1",
                         .master_port = 29999,
                         .master_fd = -1};
    b->formed_late++;
    mg_agent_group_formed(ag, &g);
}

static void give_up(struct mg_agent *ag, void *ctx)
{
    (void)ctx;
    mg_agent_fail(ag, 42, "rendezvous closed by the test");
}

static int next_round(void *impl, struct mg_agent *ag, const struct mg_round_info *info)
{
    struct backend *b = impl;
    b->rounds++;
    /* Not at once: the way a store-based rendezvous completes later. */
    if (mg_agent_add_timer(ag, mg_now_ms() + 30, form, b) < 0)
        return -ENOSPC;
    if (b->mode == 1 && info->round == 0)
        mg_agent_add_timer(ag, mg_now_ms() + 300, give_up, b);
    return 0;
}

static void round_ended(void *impl, struct mg_agent *ag, enum mg_round_result r)
{
    struct backend *b = impl;
    (void)ag;
    if (b->nended < 8)
        b->ended_results[b->nended++] = (int)r;
}

static void shutdown_cb(void *impl, struct mg_agent *ag, int code)
{
    struct backend *b = impl;
    (void)ag;
    b->shutdown_code = code;
}

static struct mg_agent *g_ag;

static int fill(void *ctx, struct pollfd *fds, int max)
{
    struct backend *b = ctx;
    if (max < 1)
        return -ENOSPC;
    fds[0].fd = b->pipe_rd;
    fds[0].events = POLLIN;
    return 1;
}

static int process(void *ctx, const struct pollfd *fds, int n)
{
    struct backend *b = ctx;
    char buf[64];
    if (n < 1 || !fds[0].revents)
        return 0;
    if (read(b->pipe_rd, buf, sizeof(buf)) > 0) {
        b->polled++;
        /* A peer changed: re-form the group; this is not a failure. */
        mg_agent_request_restart(g_ag, MG_RESTART_MEMBERSHIP, "a node joined");
    }
    return 0;
}

static const struct mg_rdzv_ops ops = {
    .name = "test",
    .next_round = next_round,
    .round_ended = round_ended,
    .shutdown = shutdown_cb,
};

static struct mg_agent *make(struct mg_launch_opts *o, struct backend *b, char *script,
                             const char *run_id)
{
    char err[512];
    char *argv[] = {
        "mglaunch", "--nproc_per_node", "2", "--shutdown_timeout", "2", "sh", "-c", script, NULL};
    struct mg_host_info host = {.ncpu = 2};
    if (mg_opts_parse(o, 8, argv, NULL, err, sizeof(err)) ||
        mg_opts_resolve(o, &host, err, sizeof(err)))
        BAIL_OUT("options: %s", err);
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    static char *wargv[4];
    wargv[0] = "sh";
    wargv[1] = "-c";
    wargv[2] = script;
    wargv[3] = NULL;
    struct mg_agent_config cfg = {
        .opts = o,
        .run_id = run_id,
        .hostname = "testhost",
        .exec_path = "/bin/sh",
        .argv = wargv,
        .argc = 3,
        .environ = environ,
        .log_dir = tmp,
        .log_dir_given = 1,
        .stdin_fd = -1,
        .out_fd = null,
        .err_fd = null,
        .status = NULL,
        .sentinel = 1,
        .rdzv = &ops,
        .rdzv_impl = b,
    };
    struct mg_agent *ag;
    if (mg_agent_create(&ag, &cfg, err, sizeof(err)))
        BAIL_OUT("agent: %s", err);
    return ag;
}

int main(void)
{
    struct mg_launch_opts o;
    int p[2];
    char script[512];

    if (!mkdtemp(tmp))
        BAIL_OUT("mkdtemp");
    if (pipe(p) < 0) /* the write end stays inheritable: fd 3 of the workers below */
        BAIL_OUT("pipe");
    fcntl(p[0], F_SETFD, FD_CLOEXEC);

    /* Round 0: rank 0 writes to the pipe (the poller sees it and asks for a
     * membership restart) and both sleep until stopped. Round 1: exit 0. */
    snprintf(script, sizeof(script),
             "case \"$TORCHELASTIC_ERROR_FILE\" in */attempt_0/*) "
             "[ \"$RANK\" = 0 ] && echo joined >&%d; exec sleep 30;; esac; "
             "echo \"$TORCHELASTIC_RESTART_COUNT $WORLD_SIZE $MASTER_PORT\"",
             p[1]);
    struct backend b = {.mode = 0, .pipe_rd = p[0]};
    struct mg_agent *ag = make(&o, &b, script, "membership");
    g_ag = ag;
    struct mg_agent_poller pl = {.fill = fill, .process = process, .ctx = &b};
    ok(mg_agent_add_poller(ag, &pl) >= 0, "poller registered");
    int code = mg_agent_run(ag);
    const struct mg_agent_result *r = mg_agent_result(ag);
    is_int(code, 0, "the run succeeds after re-forming");
    is_int(b.rounds, 2, "two rounds");
    is_int(b.formed_late, 2, "formed from the timer each time");
    is_int(b.polled, 1, "the poller saw the descriptor");
    is_int(r->restarts, 0, "a membership restart does not count against --max_restarts");
    is_int(b.nended, 2, "round_ended called for each round");
    is_int(b.ended_results[0], MG_ROUND_STOPPED, "round 0 was stopped");
    is_int(b.ended_results[1], MG_ROUND_SUCCEEDED, "round 1 succeeded");
    is_int(b.shutdown_code, 0, "shutdown told the exit code");
    char path[600], line[128] = "";
    snprintf(path, sizeof(path), "%s/membership/attempt_1/1/stdout.log", tmp);
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(line, sizeof(line), f))
            line[0] = '\0';
        fclose(f);
    }
    is_str(line, "0 2 29999\n", "round 1 workers: restart count 0, the group's size and port");
    mg_agent_release(ag);
    mg_opts_release(&o);

    /* mg_agent_fail while the workers run: they are stopped, the code is ours. */
    struct backend b2 = {.mode = 1, .pipe_rd = -1};
    ag = make(&o, &b2, "exec sleep 30", "fail");
    g_ag = ag;
    code = mg_agent_run(ag);
    r = mg_agent_result(ag);
    is_int(code, 42, "mg_agent_fail sets the exit code");
    is_str(r->error_msg, "rendezvous closed by the test", "and the message");
    is_int(r->nfailures, 0, "stopped workers are not failures");
    is_int(b2.shutdown_code, 42, "shutdown saw it");
    mg_agent_release(ag);
    mg_opts_release(&o);

    close(p[0]);
    close(p[1]);
    snprintf(path, sizeof(path), "rm -rf '%s'", tmp);
    if (system(path) != 0)
        diag("could not remove %s", tmp);
    return done_testing();
}
