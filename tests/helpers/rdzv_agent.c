/* A scripted rendezvous agent for the protocol tests: joins rounds through
 * launcher/rdzv/rdzv_proto.h exactly as mglaunch does (in steps, one thread; the
 * agent hosting the store serves it between the steps), but instead of
 * running workers it follows a script and prints one line per event on stdout.
 *
 *   rdzv_agent --backend etcd|c10d|static --endpoint H:P --id RUN --nnodes MIN[:MAX]
 *              [--nproc N] [--node_rank R] [--max_restarts N] [--conf K=V,...]
 *              [--host NAME] [--addr ADDR] [--is_host 0|1] --script STEP,STEP,...
 *
 * Steps: join | run:MS (tick; on RESTART print it and rejoin) | fail:CODE |
 *        finish | sleep:MS | await:FILE (until FILE exists) | leave | exit:CODE
 * Lines: "formed round=R node_rank=N rank_base=B world=W nnodes=K master=A:P restarts=C",
 *        "event restart|failed|done reason=... ms=T msg=...", "error rc=... msg=..." */
#include "mg_err.h"
#include "net.h"
#include "rdzv_proto.h"
#include "kv_open.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct mg_rdzv *rdzv;
static struct mg_kv_host *host;
static int64_t t0;
static char *steps;

/* Between two steps that found nothing to do, as mglaunch's loop: a remote
 * backend's step already waited; the agent hosting the store serves it until
 * it changes or the rendezvous has a deadline. */
static void between_steps(void)
{
    if (host)
        mg_kv_host_serve(host, mg_rdzv_wait_ms(rdzv));
}

static int step_block(void)
{
    return host ? 0 : MG_RDZV_SLICE_MS;
}

static void quit(int code)
{
    fflush(stdout);
    if (rdzv && !mg_rdzv_close_begin(rdzv, host != NULL, ""))
        while (!mg_rdzv_close_step(rdzv))
            between_steps();
    mg_rdzv_release(rdzv);
    mg_kv_host_release(host);
    free(steps);
    exit(code);
}

static const char *reason_name(enum mg_rdzv_reason r)
{
    switch (r) {
    case MG_RDZV_R_FAILURE:
        return "failure";
    case MG_RDZV_R_NODE_DIED:
        return "node_died";
    case MG_RDZV_R_NODE_JOINED:
        return "membership";
    case MG_RDZV_R_LEASE_LOST:
        return "lease_lost";
    default:
        return "none";
    }
}

static void event(const char *what)
{
    printf("event %s reason=%s ms=%lld msg=%s\n", what, reason_name(mg_rdzv_last_reason(rdzv)),
           (long long)(mg_now_ms() - t0), mg_rdzv_message(rdzv));
    fflush(stdout);
}

static int fatal(int rc)
{
    printf("error rc=%d (%s) msg=%s\n", rc, mg_strerror(rc), mg_rdzv_message(rdzv));
    quit(rc == -MG_EPEER ? 3 : rc == -MG_ECLOSED ? 4 : rc == -ETIMEDOUT ? 5 : 1);
    return rc;
}

/* Joins; on an error exits through fatal(), or returns it when soft. */
static int join_soft(int soft)
{
    struct mg_rdzv_world w;
    int rc = mg_rdzv_join_begin(rdzv);
    while (rc == 0) {
        rc = mg_rdzv_join_step(rdzv, &w, step_block());
        if (rc == 0)
            between_steps();
    }
    if (rc < 0 && soft)
        return rc;
    if (rc < 0)
        fatal(rc);
    if (w.master_fd >= 0)
        close(w.master_fd);
    printf("formed round=%d node_rank=%d rank_base=%d world=%d nnodes=%d master=%s:%d "
           "restarts=%d ms=%lld\n",
           w.round, w.node_rank, w.rank_base, w.world_size, w.nnodes, w.master_addr, w.master_port,
           w.restart_count, (long long)(mg_now_ms() - t0));
    fflush(stdout);
    return 0;
}

static void join(void)
{
    join_soft(0);
}

/* Serves the hosted store (if any) for ms. */
static void pause_serving(int ms)
{
    int64_t end = mg_now_ms() + ms;
    while (mg_now_ms() < end)
        mg_kv_host_serve(host, mg_ms_until(end));
}

/* The event loop of a real agent, minus the workers. */
static void run(int ms)
{
    int64_t end = mg_now_ms() + ms;
    while (mg_now_ms() < end) {
        int t = mg_rdzv_timeout_ms(rdzv), left = mg_ms_until(end);
        if (t < 0 || t > left)
            t = left;
        mg_kv_host_serve(host, t);
        enum mg_rdzv_event ev = mg_rdzv_tick(rdzv);
        if (ev == MG_RDZV_RESTART) {
            event("restart");
            join();
        } else if (ev == MG_RDZV_FAILED) {
            event("failed");
            quit(3);
        } else if (ev == MG_RDZV_DONE) {
            event("done");
            quit(0);
        }
    }
}

/* The exit barrier. */
static int finish(void)
{
    int rc = mg_rdzv_finish_begin(rdzv);
    while (rc == MG_RDZV_NONE) {
        rc = mg_rdzv_finish_step(rdzv, step_block());
        if (rc == MG_RDZV_NONE)
            between_steps();
    }
    return rc;
}

int main(int argc, char **argv)
{
    struct mg_rdzv_conf conf;
    const char *backend = "etcd", *endpoint = NULL, *run_id = "test", *script = "join";
    const char *conf_text = "", *hostname = NULL, *addr = NULL;
    int min = 1, max = 1, nproc = 1, node_rank = -1, max_restarts = 0, is_host = -2;
    char err[1024], ns[MG_KV_MAX_KEY], hn[256] = "localhost";
    enum mg_rdzv_backend b;
    struct mg_kv *kv;
    int rc;

    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    t0 = mg_now_ms();
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--backend"))
            backend = v;
        else if (!strcmp(k, "--endpoint"))
            endpoint = v;
        else if (!strcmp(k, "--id"))
            run_id = v;
        else if (!strcmp(k, "--nnodes")) {
            if (sscanf(v, "%d:%d", &min, &max) != 2)
                max = min = atoi(v);
        } else if (!strcmp(k, "--nproc"))
            nproc = atoi(v);
        else if (!strcmp(k, "--node_rank"))
            node_rank = atoi(v);
        else if (!strcmp(k, "--max_restarts"))
            max_restarts = atoi(v);
        else if (!strcmp(k, "--conf"))
            conf_text = v;
        else if (!strcmp(k, "--host"))
            hostname = v;
        else if (!strcmp(k, "--addr"))
            addr = v;
        else if (!strcmp(k, "--is_host"))
            is_host = atoi(v);
        else if (!strcmp(k, "--script"))
            script = v;
        else {
            fprintf(stderr, "rdzv_agent: unknown option %s\n", k);
            return 2;
        }
    }
    if (!endpoint || mg_rdzv_backend_parse(backend, &b) < 0) {
        fprintf(stderr, "rdzv_agent: need --endpoint and a known --backend\n");
        return 2;
    }
    gethostname(hn, sizeof(hn));
    mg_rdzv_conf_init(&conf);
    if (mg_rdzv_conf_parse(&conf, conf_text, err, sizeof(err)) < 0 ||
        mg_rdzv_conf_finish(&conf, b, NULL, err, sizeof(err)) < 0) {
        fprintf(stderr, "rdzv_agent: %s\n", err);
        return 2;
    }
    if (is_host > -2)
        conf.is_host = is_host;
    struct mg_kv_open_opts s = {
        .backend = b,
        .endpoint = endpoint,
        .run_id = run_id,
        .conf = &conf,
        .deadline_ms = mg_now_ms() + conf.join_timeout_ms,
        .abort_fd = -1,
        .node_rank = node_rank,
    };
    rc = mg_kv_open(&s, &kv, &host, ns, sizeof(ns), err, sizeof(err));
    if (rc < 0) {
        printf("error rc=%d (%s) msg=%s\n", rc, mg_strerror(rc), err);
        return 1;
    }
    struct mg_rdzv_opts o = {
        .kv = kv,
        .ns = ns,
        .min_nodes = min,
        .max_nodes = max,
        .node_rank = node_rank,
        .nproc = nproc,
        .max_restarts = max_restarts,
        .hostname = hostname ? hostname : hn,
        .advertise = addr ? addr : "127.0.0.1",
        .conf = &conf,
    };
    rc = mg_rdzv_new(&rdzv, &o, err, sizeof(err));
    if (rc < 0) {
        printf("error rc=%d msg=%s\n", rc, err);
        return 1;
    }

    char *save = NULL;
    steps = strdup(script);
    for (char *st = strtok_r(steps, ",", &save); st; st = strtok_r(NULL, ",", &save)) {
        char *arg = strchr(st, ':');
        int val = arg ? atoi(arg + 1) : 0;
        if (arg)
            *arg = 0;
        if (!strcmp(st, "join")) {
            join();
        } else if (!strcmp(st, "run")) {
            run(val);
        } else if (!strcmp(st, "sleep")) {
            pause_serving(val);
        } else if (!strcmp(st, "await")) {
            while (access(arg + 1, F_OK) != 0)
                pause_serving(10);
        } else if (!strcmp(st, "leave")) {
            mg_rdzv_leave(rdzv);
        } else if (!strcmp(st, "exit")) {
            fflush(stdout);
            _exit(val);
        } else if (!strcmp(st, "fail")) {
            struct mg_rdzv_failure f = {.rank = 0, .local_rank = 0, .exit_code = val, .pid = 1};
            snprintf(f.host, sizeof(f.host), "%s", o.hostname);
            snprintf(f.message, sizeof(f.message), "scripted failure");
            enum mg_rdzv_event ev = mg_rdzv_worker_failed(rdzv, &f);
            if (ev == MG_RDZV_FAILED) {
                event("failed");
                quit(val);
            }
            event("restart");
            /* The next round decides whether the restart counts; past
             * --max_restarts the job ends here with the worker's code. */
            if (join_soft(1) == -MG_EPEER) {
                printf("event failed reason=failure ms=%lld msg=%s\n",
                       (long long)(mg_now_ms() - t0), mg_rdzv_message(rdzv));
                quit(val);
            }
        } else if (!strcmp(st, "finish")) {
            for (;;) {
                rc = finish();
                if (rc == MG_RDZV_RESTART) {
                    event("restart");
                    join();
                    continue;
                }
                if (rc == MG_RDZV_DONE) {
                    event("done");
                } else if (rc == MG_RDZV_FAILED) {
                    event("failed");
                    quit(3);
                } else {
                    event("barrier_timeout");
                }
                break;
            }
        } else {
            fprintf(stderr, "rdzv_agent: unknown step %s\n", st);
            quit(2);
        }
    }
    quit(0);
    return 0;
}
