/* The rendezvous backends over mg's store, checked by the shared conformance
 * table (kv_cases.h; test_etcd.c runs it against etcd): the store client
 * (launcher/rdzv/kv_store.c) and the in-process backend of the agent hosting the
 * store (launcher/rdzv/kv_hosted.c), both on a real server, served here by its
 * thread. Then what is the host's alone: its loop learns of remote changes
 * from mg_kv_host_process, with the server driven by one thread as in
 * mglaunch; and how it tells whether its endpoint leads to its own store.
 * And the client gives up a call to a store that stopped answering as soon
 * as its abort_fd is readable (the launcher's terminating signals).
 * timeout: 60 */
#include "mg_err.h"
#include "net.h"
#include "kv_open.h"
#include "kv_hosted.h"
#include "kv_store.h"
#include "store.h"
#include "kv_cases.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/timerfd.h>

static struct mg_store_server *srv;
static int port;

static struct mg_kv *open_client(void *ctx)
{
    struct mg_kv_store_opts o = {
        .host = "127.0.0.1", .port = port, .connect_timeout_ms = 5000, .timeout_ms = 5000};
    struct mg_kv *kv = NULL;
    char err[512];
    if (mg_kv_store_open(&kv, &o, err, sizeof(err)) < 0)
        BAIL_OUT("mg_kv_store_open: %s", err);
    return kv;
}

static struct mg_kv *open_local(void *ctx)
{
    struct mg_kv *kv = NULL;
    if (mg_kv_hosted_open(&kv, srv, "127.0.0.1:test") < 0)
        BAIL_OUT("mg_kv_hosted_open");
    return kv;
}

/* A remote client's write, from another process, while this one serves the
 * store from a single thread. */
static pid_t remote_set(int p, const char *key, int delay_ms)
{
    pid_t kid = fork();
    if (kid == 0) {
        struct mg_store *st;
        struct mg_store_opts o = {.host = "127.0.0.1", .port = p, .timeout_ms = 5000};
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        usleep((useconds_t)delay_ms * 1000);
        if (mg_store_connect(&st, &o) < 0 || mg_store_ping(st) < 0)
            _exit(1);
        if (key && mg_store_set(st, key, "r", 1, 0) < 0)
            _exit(1);
        mg_store_release(st);
        _exit(0);
    }
    return kid;
}

static void host_loop(void)
{
    struct mg_rdzv_conf conf;
    struct mg_kv_open_opts s = {
        .backend = MG_RDZV_C10D, .run_id = "hl", .conf = &conf, .abort_fd = -1, .node_rank = -1};
    struct mg_kv_host *h = NULL;
    struct mg_kv *kv = NULL;
    char ep[64], ns[MG_KV_MAX_KEY], err[512], k[MG_KV_MAX_KEY + 8];
    int rc, st;

    mg_rdzv_conf_init(&conf);
    mg_rdzv_conf_finish(&conf, MG_RDZV_C10D, NULL, err, sizeof(err));
    conf.is_host = 1;
    int p0 = -1, fd = mg_listen_tcp("127.0.0.1", 0, 1, &p0);
    close(fd);
    snprintf(ep, sizeof(ep), "127.0.0.1:%d", p0);
    s.endpoint = ep;
    s.deadline_ms = mg_now_ms() + 5000;
    rc = mg_kv_open(&s, &kv, &h, ns, sizeof(ns), err, sizeof(err));
    ok(rc == 0 && h && kv, "hosting: the backend opens with the store here (%s)", rc ? err : "");
    if (rc)
        return;
    is_str(kv->ops->name, "hosted", "hosting: the agent's own backend is the in-process one");
    is_int(mg_kv_host_port(h), p0, "hosting: on the endpoint's port");
    {
        char addr[MG_HOST_MAX];
        ok(mg_kv_local_addr(kv, h, addr, sizeof(addr)) == 0 && !strcmp(addr, "127.0.0.1"),
           "hosting: advertises the address it reaches the endpoint from");
    }

    /* A ping changes nothing; a remote set does, and says so. */
    pid_t kid = remote_set(p0, NULL, 0);
    int changed = 0;
    while (waitpid(kid, &st, WNOHANG) == 0)
        changed |= mg_kv_host_serve(h, 20) == 1;
    ok(WIFEXITED(st) && WEXITSTATUS(st) == 0, "served by this thread: a remote client pings");
    is_int(changed, 0, "a ping is not a change");
    snprintf(k, sizeof(k), "%s/x", ns);
    kid = remote_set(p0, k, 0);
    changed = 0;
    while (!changed && waitpid(kid, &st, WNOHANG) == 0)
        changed = mg_kv_host_serve(h, 20) == 1;
    waitpid(kid, &st, 0);
    is_int(changed, 1, "a remote write: the loop learns the store changed");
    int64_t rev = 0;
    ok(kv->ops->get(kv, k, NULL, NULL, &rev) == 0, "and the in-process backend reads it");
    is_int(kv->ops->wait(kv, k, rev, INT_MAX), 0, "its wait answers at once");
    kv->ops->set(kv, k, "l", 1, 0);
    is_int(mg_kv_host_serve(h, 0), 0, "a local write is not reported as a remote change");
    kv->ops->release(kv);
    mg_kv_host_release(h);
}

/* How a hosting agent tells whether its endpoint leads to its own store (a
 * service or NAT address may): a connection it makes arrives there, or not. */
static void own_peer(void)
{
    struct mg_store_server *a, *b;
    struct mg_store_server_opts so = {.host = NULL};
    if (mg_store_server_start(&a, &so) < 0 || mg_store_server_start(&b, &so) < 0)
        BAIL_OUT("servers");
    int fd = mg_connect_tcp("127.0.0.1", mg_store_server_port(a), mg_now_ms() + 2000);
    ok(fd >= 0, "connected to the first store");
    is_int(mg_store_server_is_own_peer(a, fd, 200), 1, "it arrived at that store");
    is_int(mg_store_server_is_own_peer(b, fd, 50), 0, "not at another one");
    close(fd);
    mg_store_server_release(a);
    mg_store_server_release(b);
}

/* A store that stops answering (its process stopped): a call blocked on it
 * gives up as soon as abort_fd is readable, and the connection stays usable. */
static void stalled(void)
{
    int pfd[2], sport = 0;
    if (pipe(pfd) < 0)
        BAIL_OUT("pipe");
    pid_t kid = fork();
    if (kid == 0) {
        struct mg_store_server *x;
        struct mg_store_server_opts so = {.host = "127.0.0.1"};
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (mg_store_server_start(&x, &so) < 0 || mg_store_server_start_thread(x) < 0)
            _exit(1);
        int p = mg_store_server_port(x);
        if (write(pfd[1], &p, sizeof(p)) != (ssize_t)sizeof(p))
            _exit(1);
        for (;;)
            pause();
    }
    close(pfd[1]);
    if (read(pfd[0], &sport, sizeof(sport)) != (ssize_t)sizeof(sport))
        BAIL_OUT("stalled store did not start");
    close(pfd[0]);
    port = sport;
    struct mg_kv *kv = open_client(NULL);
    is_int(kv->ops->set(kv, "/s/k", "1", 1, 0), 0, "stalled: a store that answers");
    kill(kid, SIGSTOP);
    int st;
    waitpid(kid, &st, WUNTRACED); /* stopped for sure */
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
    struct itimerspec its = {.it_value = {.tv_nsec = 300000000L}};
    timerfd_settime(tfd, 0, &its, NULL);
    kv->abort_fd = tfd;
    int rc = kv->ops->get(kv, "/s/k", NULL, NULL, NULL);
    is_int(rc, -EINTR, "stopped: a request gives up when abort_fd becomes readable");
    ok(strstr(mg_kv_error(kv), "interrupted") != NULL, "saying so: %s", mg_kv_error(kv));
    is_int(kv->ops->wait(kv, "/s/k", 1, 60000), -EINTR, "a wait too");
    kv->abort_fd = -1;
    close(tfd);
    kill(kid, SIGCONT);
    is_int(kv->ops->get(kv, "/s/k", NULL, NULL, NULL), 0,
           "answering again: the same connection still works");
    kv->ops->release(kv);
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
}

int main(void)
{
    struct mg_store_server_opts so = {.host = "127.0.0.1"};
    signal(SIGPIPE, SIG_IGN);
    if (mg_store_server_start(&srv, &so) < 0 || mg_store_server_start_thread(srv) < 0)
        BAIL_OUT("cannot start a store");
    port = mg_store_server_port(srv);

    struct kv_fixture client = {
        .name = "store client", .open = open_client, .open_other = open_client, .wait_blocks = 1};
    struct kv_fixture local = {
        .name = "in-process", .open = open_local, .open_other = open_client, .wait_blocks = 0};
    kv_cases(&client, "/t/client");
    kv_cases(&local, "/t/local");

    /* The host's ephemeral keys are its own: a remote plain set takes one over. */
    {
        struct mg_kv *l = open_local(NULL), *c = open_client(NULL);
        l->ops->set(l, "/h/e", "host", 4, MG_KV_EPHEMERAL);
        c->ops->set(c, "/h/e", "mine", 4, 0);
        l->ops->release(l);
        ok(kvc_is_val(c, "/h/e", "mine"), "in-process: a key another client set again is theirs");
        c->ops->release(c);
    }
    mg_store_server_release(srv);

    host_loop();
    own_peer();
    stalled();
    return done_testing();
}
