/* Thousands of simulated rendezvous nodes in a few processes, for the scale
 * benchmark (tests/bench/scale.sh) and its test (tests/integration/rdzv_swarm.t).
 * Each node is one thread running the real client side of the rendezvous
 * (launcher/rdzv/rdzv_proto.h: join in steps, the heartbeat tick that
 * watches the members, re-forming on a death) over its own socket, against
 * a real store: mg's store server (storesrv) at --endpoint, or, with
 * --hosted, the store that node 0 hosts in its own process from its loop,
 * as the c10d agent on the endpoint host does; or, with --etcd, an etcd
 * server through mg's etcd backend (launcher/rdzv/kv_etcd.c: the JSON
 * gateway, a lease per node for its ephemeral keys). The worker side is left
 * out.
 * What it measures, and how, is swarm/swarm_measure.c's.
 *
 *   rdzv_swarm --nodes N [--procs P] [--endpoint H:P | --hosted PORT | --etcd H:P]
 *              [--kill K] [--steady-ms MS] [--conf K=V,...] [--id RUN]
 *              [--server-pid PID] [--stats-file F] [--timeout-s S]
 *              [--join-twice 0|1] [--leave L] [--flood F] [--arrive-ms MS]
 *              [--nice N] [--rt]
 *
 * Phases (shared memory between the processes): every node connects; all
 * join at once (--arrive-ms W: node i begins its join at i/N of a window of
 * W ms, as the nodes of a large job arrive over time; the forming time is
 * still counted from the last node's join); steady state for --steady-ms (heartbeats only); K nodes
 * die (their connections close, no goodbye, as a SIGKILLed agent's do); the
 * survivors re-form. A probe client does a GET every 10 ms throughout.
 * --nice N: the node threads run at nice N, the store (storesrv, or node 0's
 * thread hosting it), the probe and the main thread at the caller's: the
 * store as on a host of its own, not starved by thousands of node threads
 * on the same cores (scale.sh says so when it is used). --rt: the probe's
 * thread and node 0's thread hosting the store run under SCHED_FIFO (a
 * real-time priority, which takes CAP_SYS_NICE; storesrv is started under
 * chrt by scale.sh): on a machine shared with thousands of node threads,
 * even at nice 19 they outweigh the store once they are runnable together
 * (after a change woke them all), and then the probe measures waiting for
 * a core, not the store; with --rt it measures the store's own queue.
 * Misbehaving nodes and clients, as docs/rendezvous.md and
 * docs/store-protocol.md say they are handled: --join-twice 1: node 1 joins
 * the open round, then begins its join again before the round closes (a
 * retried join), and still counts once; --leave L: the last L nodes join the
 * open round and leave it before it closes (a signal while they wait), and
 * the round forms without them; --flood F: F more clients pipeline requests
 * at the store without reading a reply from when the nodes join to the end,
 * and the store serves the others meanwhile.
 * Prints key=value lines: times, the store's CPU, RSS and requests, the
 * requests the nodes made by kind (form_ops, reform_ops: calls of the
 * backend's operations and their mean latency, counted by a wrapper around
 * them; and every 5 s on stderr while a phase lasts), the probe's worst
 * latency, and check=ok when every node got a distinct rank
 * in one round of N - L (then N - L - K) nodes with the same master, else
 * check=FAIL with the reason. Exit 0 only with check=ok. */
#include "kv_open.h"
#include "mg_err.h"
#include "net.h"
#include "rdzv_proto.h"
#include "store.h"
#include "swarm/swarm.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct shared *sh;
static struct mg_rdzv_conf conf;
static const char *endpoint, *etcd_ep, *run_id = "swarm";
static int node_nice, use_rt;

/* --rt: this thread at real-time priority 1; says so once when refused. */
static void go_rt(const char *who)
{
    struct sched_param sp = {.sched_priority = 1};
    int rc = pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp);
    if (rc)
        fprintf(stderr, "rdzv_swarm: --rt: cannot give %s a real-time priority: %s\n", who,
                strerror(rc));
}
static int hosted_port, nnodes, nkill, join_twice, nleave, nflood, arrive_ms;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

/* Sleeps until the phase reaches at least p or ms pass (ms < 0: no bound). */
static void await_phase(int p, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (ms >= 0) {
        ts.tv_sec += ms / 1000;
        ts.tv_nsec += (long)(ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&mu);
    while (atomic_load(&sh->phase) < p) {
        if (ms < 0)
            pthread_cond_wait(&cv, &mu);
        else if (pthread_cond_timedwait(&cv, &mu, &ts) == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&mu);
}

struct node {
    int idx;
    struct mg_rdzv *rdzv;
    struct mg_kv_host *host;
};

static void note_err(struct node_res *res, int rc, const char *what, const char *msg)
{
    res->err = rc;
    snprintf(res->msg, sizeof(res->msg), "%s: %.150s (%s)", what, msg, mg_strerror(rc));
    atomic_fetch_add(&sh->failed, 1);
}

static void host_stats(struct node *nd)
{
    struct mg_store_server_stats st;
    if (nd->host && mg_kv_host_stats(nd->host, &st) == 0)
        atomic_store(&sh->host_requests, st.requests);
}

/* Joins (in steps, serving the hosted store between them as mglaunch does). */
static int join(struct node *nd, struct mg_rdzv_world *w)
{
    int rc = mg_rdzv_join_begin(nd->rdzv);
    while (rc == 0) {
        rc = mg_rdzv_join_step(nd->rdzv, w, nd->host ? 0 : MG_RDZV_SLICE_MS);
        if (rc == 0 && nd->host) {
            mg_kv_host_serve(nd->host, mg_rdzv_wait_ms(nd->rdzv));
            host_stats(nd);
        }
    }
    if (rc == 1 && w->master_fd >= 0)
        close(w->master_fd);
    return rc < 0 ? rc : 0;
}

static void *node_main(void *arg)
{
    struct node *nd = arg;
    struct node_res *res = &sh->res[nd->idx];
    struct mg_rdzv_world w;
    struct mg_kv *kv;
    char err[1024], ns[MG_KV_MAX_KEY], name[32], ep[64];
    struct mg_rdzv_conf c = conf;
    int rc;

    if (hosted_port)
        snprintf(ep, sizeof(ep), "127.0.0.1:%d", hosted_port);
    else
        snprintf(ep, sizeof(ep), "%s", etcd_ep ? etcd_ep : endpoint);
    c.is_host = hosted_port && nd->idx == 0;
    if (node_nice && !c.is_host)
        setpriority(PRIO_PROCESS, (id_t)gettid(), node_nice); /* this thread only */
    if (use_rt && c.is_host)
        go_rt("the thread hosting the store");
    struct mg_kv_open_opts s = {
        .backend = etcd_ep ? MG_RDZV_ETCD : MG_RDZV_C10D,
        .endpoint = ep,
        .run_id = run_id,
        .conf = &c,
        .deadline_ms = mg_now_ms() + c.join_timeout_ms,
        .abort_fd = -1,
        .node_rank = -1,
        .max_nodes = nnodes,
    };
    rc = mg_kv_open(&s, &kv, &nd->host, ns, sizeof(ns), err, sizeof(err));
    if (rc < 0) {
        note_err(res, rc, "connect", err);
        atomic_fetch_add(&sh->connected, 1);
        return NULL;
    }
    count_requests(kv);
    snprintf(name, sizeof(name), "n%05d", nd->idx);
    struct mg_rdzv_opts o = {
        .kv = kv,
        .ns = ns,
        .min_nodes = nnodes - nkill - nleave,
        .max_nodes = nnodes,
        .node_rank = -1,
        .nproc = 1,
        .hostname = name,
        .advertise = "127.0.0.1",
        .conf = &c,
    };
    rc = mg_rdzv_new(&nd->rdzv, &o, err, sizeof(err));
    if (rc < 0) {
        kv->ops->release(kv);
        note_err(res, rc, "rdzv", err);
        atomic_fetch_add(&sh->connected, 1);
        return NULL;
    }
    atomic_fetch_add(&sh->connected, 1);
    /* The hosting node serves while the others connect. */
    while (atomic_load(&sh->phase) < P_JOIN) {
        if (nd->host) {
            mg_kv_host_serve(nd->host, 10);
            host_stats(nd);
        } else {
            /* A real agent joins as soon as it connects; one that waits
             * here renews its lease, or the store drops it as silent. */
            await_phase(P_JOIN, (int)(c.heartbeat_interval_ms));
            if (atomic_load(&sh->phase) < P_JOIN && kv->ops->keepalive(kv) < 0) {
                note_err(res, -EIO, "keepalive", mg_kv_error(kv));
                goto out;
            }
        }
    }

    if (res->leaver) {
        /* Joins the open round (the first step does, then waits), then
         * leaves before it closes, as an agent stopped by a signal does. */
        rc = mg_rdzv_join_begin(nd->rdzv);
        if (rc == 0)
            rc = mg_rdzv_join_step(nd->rdzv, &w, MG_RDZV_SLICE_MS);
        if (rc != 0) {
            note_err(res, rc < 0 ? rc : -EPROTO, "leaver's join",
                     rc < 0 ? mg_rdzv_message(nd->rdzv) : "the round formed before it left");
            goto out;
        }
        mg_rdzv_leave(nd->rdzv);
        res->left = 1;
        atomic_fetch_add(&sh->left, 1);
        goto out;
    }
    /* the others join once the leavers have joined and left */
    while (atomic_load(&sh->left) < nleave && !atomic_load(&sh->failed)) {
        if (nd->host) {
            mg_kv_host_serve(nd->host, 1);
            host_stats(nd);
        } else {
            usleep(1000);
        }
    }
    if (arrive_ms > 0 && !nd->host) {
        /* --arrive-ms: node i begins its join i/N of the window after the
         * first, as the nodes of a large job arrive over time; it renews
         * its lease meanwhile, as an agent does from its loop */
        int64_t at = atomic_load(&sh->t_join0) + (int64_t)nd->idx * arrive_ms / nnodes;
        while (mg_now_ms() < at) {
            int64_t left = at - mg_now_ms();
            if (left > c.heartbeat_interval_ms) {
                usleep((useconds_t)c.heartbeat_interval_ms * 1000);
                if (kv->ops->keepalive(kv) < 0) {
                    note_err(res, -EIO, "keepalive", mg_kv_error(kv));
                    goto out;
                }
            } else if (left > 0) {
                usleep((useconds_t)left * 1000);
            }
        }
    }
    res->t_join = mg_now_ms();
    if (join_twice && nd->idx == 1) {
        /* The same agent beginning its join again while the round is open
         * (a retried join): it joined already, and counts once. */
        rc = mg_rdzv_join_begin(nd->rdzv);
        if (rc == 0)
            rc = mg_rdzv_join_step(nd->rdzv, &w, 0); /* joins, and returns at once */
        if (rc == 1 && w.master_fd >= 0)
            close(w.master_fd);
        if (rc < 0) {
            note_err(res, rc, "first join", mg_rdzv_message(nd->rdzv));
            goto out;
        }
    }
    rc = join(nd, &w);
    if (rc < 0) {
        note_err(res, rc, "join", mg_rdzv_message(nd->rdzv));
        goto out;
    }
    res->t_formed = mg_now_ms();
    res->round = w.round;
    res->rank = w.node_rank;
    res->nnodes = w.nnodes;
    res->mport = w.master_port;
    atomic_fetch_add(&sh->formed, 1);

    /* The agent's loop, minus the workers. */
    while (atomic_load(&sh->phase) < P_STOP) {
        if (res->victim && atomic_load(&sh->phase) >= P_KILL) {
            res->dead = 1;
            goto out; /* closes the connection without a word */
        }
        /* Until the next heartbeat, or a phase change (the victims' cue):
         * a node that woke every 50 ms instead made 10,000 formed nodes
         * 200,000 wakeups a second, which starved the others of the two
         * cores while they formed. The hosting node serves its store in
         * short turns meanwhile. */
        int t = mg_rdzv_timeout_ms(nd->rdzv);
        if (t < 0 || t > (nd->host ? 50 : 1000))
            t = nd->host ? 50 : 1000;
        if (nd->host) {
            mg_kv_host_serve(nd->host, t);
            host_stats(nd);
        } else {
            await_phase(atomic_load(&sh->phase) + 1, t);
        }
        enum mg_rdzv_event ev = mg_rdzv_tick(nd->rdzv);
        if (ev == MG_RDZV_RESTART && res->victim && atomic_load(&sh->phase) >= P_KILL) {
            /* A victim whose thread ran late (the others' deaths moved the
             * round before it got to its own): it dies now, rather than join
             * the new round and die in it. */
            res->dead = 1;
            goto out;
        }
        if (ev == MG_RDZV_RESTART) {
            rc = join(nd, &w);
            if (rc < 0) {
                note_err(res, rc, "rejoin", mg_rdzv_message(nd->rdzv));
                goto out;
            }
            res->t_reformed = mg_now_ms();
            res->round2 = w.round;
            res->rank2 = w.node_rank;
            res->nnodes2 = w.nnodes;
            res->mport2 = w.master_port;
            atomic_fetch_add(&sh->reformed, 1);
        } else if (ev == MG_RDZV_FAILED || ev == MG_RDZV_DONE) {
            note_err(res, -MG_EPEER, "run", mg_rdzv_message(nd->rdzv));
            goto out;
        }
    }
    /* The hosting node serves until the others are gone. */
    while (nd->host && atomic_load(&sh->exited) < sh->n - 1) {
        mg_kv_host_serve(nd->host, 10);
        host_stats(nd);
    }
out:
    atomic_fetch_add(&sh->exited, 1);
    while (nd->host && atomic_load(&sh->exited) < sh->n) {
        mg_kv_host_serve(nd->host, 10);
        host_stats(nd);
    }
    /* A SIGKILLed agent revokes nothing: with etcd its lease (and so its
     * key) lives until it runs out, heartbeat_timeout after the last
     * keepalive. Releasing it now would revoke the lease, as an agent's
     * orderly exit does, so a dead node's client waits for the end. */
    if (res->dead && etcd_ep)
        await_phase(P_STOP, -1);
    mg_rdzv_release(nd->rdzv);
    mg_kv_host_release(nd->host);
    nd->rdzv = NULL;
    return NULL;
}

/* One process's share of the nodes: first..last-1. */
static int child_main(int first, int last)
{
    int n = last - first;
    struct node *nodes = calloc((size_t)n, sizeof(*nodes));
    pthread_t *th = calloc((size_t)n, sizeof(*th));
    pthread_attr_t at;
    if (!nodes || !th)
        return 1;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 256 << 10);
    for (int i = 0; i < n; i++) {
        nodes[i].idx = first + i;
        int rc = pthread_create(&th[i], &at, node_main, &nodes[i]);
        if (rc) {
            fprintf(stderr, "rdzv_swarm: cannot start node thread %d: %s\n", first + i,
                    strerror(rc));
            _exit(1);
        }
    }
    /* Relays phase changes to the threads of this process. */
    int seen = atomic_load(&sh->phase);
    while (atomic_load(&sh->exited) < sh->n) {
        int p = atomic_load(&sh->phase);
        if (p != seen) {
            pthread_mutex_lock(&mu);
            pthread_cond_broadcast(&cv);
            pthread_mutex_unlock(&mu);
            seen = p;
        }
        usleep(2000);
        int done = 1;
        for (int i = 0; i < n && done; i++)
            done = nodes[i].rdzv == NULL && (p == P_STOP || sh->res[first + i].err ||
                                             sh->res[first + i].dead || sh->res[first + i].left);
        if (done)
            break;
    }
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    free(th);
    free(nodes);
    return 0;
}

static pid_t server_pid;
static const char *stats_file;

/* When a round did not form: what the backend holds of round 0 (the live
 * agents, the joins, the count, the close's claim), through one more
 * client, so that a failed run says how far the round got. */
static void say_round(void)
{
    struct mg_rdzv_conf c = conf;
    struct mg_kv *kv;
    struct mg_kv_host *host;
    char ep[64], ns[MG_KV_MAX_KEY], err[1024], k[MG_KV_MAX_KEY + 16];
    static const char *const counted[] = {"a/", "r/0/j/"};
    int n[2] = {-1, -1};
    if (hosted_port)
        snprintf(ep, sizeof(ep), "127.0.0.1:%d", hosted_port);
    else
        snprintf(ep, sizeof(ep), "%s", etcd_ep ? etcd_ep : endpoint);
    c.is_host = 0;
    struct mg_kv_open_opts o = {
        .backend = etcd_ep ? MG_RDZV_ETCD : MG_RDZV_C10D,
        .endpoint = ep,
        .run_id = run_id,
        .conf = &c,
        .deadline_ms = mg_now_ms() + 5000,
        .abort_fd = -1,
        .node_rank = -1,
    };
    if (mg_kv_open(&o, &kv, &host, ns, sizeof(ns), err, sizeof(err)) < 0) {
        printf("round0 unknown=%s\n", err);
        return;
    }
    for (int i = 0; i < 2; i++) {
        snprintf(k, sizeof(k), "%s/%s", ns, counted[i]);
        struct mg_kv_entry *e = NULL;
        if (kv->ops->count)
            kv->ops->count(kv, k, &n[i]);
        else if (kv->ops->list(kv, k, MG_RDZV_MAX_NODES, 0, &e, &n[i]) == 0)
            mg_kv_free_list(e, n[i]);
    }
    char *cnt = NULL, *closing = NULL;
    size_t len;
    snprintf(k, sizeof(k), "%s/r/0/n", ns);
    kv->ops->get(kv, k, &cnt, &len, NULL);
    snprintf(k, sizeof(k), "%s/r/0/closing", ns);
    kv->ops->get(kv, k, &closing, &len, NULL);
    printf("round0 alive=%d joined=%d count=%s closing=%s\n", n[0], n[1], cnt ? cnt : "-",
           closing ? closing : "-");
    free(cnt);
    free(closing);
    kv->ops->release(kv);
}

/* Waits until *ctr reaches want, at most until deadline; 0 or -ETIMEDOUT.
 * Says on stderr every 5 s how far it got, and the requests so far. */
static int wait_count(_Atomic int *ctr, int want, int64_t deadline, const char *what)
{
    int64_t t0 = mg_now_ms(), next = t0 + 5000;
    while (atomic_load(ctr) + atomic_load(&sh->failed) < want) {
        int64_t now = mg_now_ms();
        if (now >= deadline)
            return -ETIMEDOUT;
        if (now >= next) {
            char ops[512];
            uint64_t n = ops_line(atomic_load(&sh->phase), ops, sizeof(ops));
            fprintf(stderr, "rdzv_swarm: %s: %d of %d after %.1f s; %llu requests: %s\n", what,
                    atomic_load(ctr), want, (double)(now - t0) / 1000.0, (unsigned long long)n,
                    ops);
            next = now + 5000;
        }
        usleep(1000);
    }
    return atomic_load(&sh->failed) ? -EIO : 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: rdzv_swarm --nodes N [--procs P] (--endpoint H:P | --hosted PORT | --etcd H:P) "
            "[--kill K] [--steady-ms MS] [--conf K=V,...] [--id RUN] [--server-pid PID] "
            "[--stats-file F] [--timeout-s S] [--join-twice 1] [--leave L] [--flood F] "
            "[--arrive-ms MS] [--nice N] [--rt]\n");
    exit(2);
}

static int check_fail(const char *why)
{
    printf("check=FAIL %s\n", why);
    for (int i = 0; i < sh->n; i++)
        if (sh->res[i].err) {
            printf("first_error=node %d: %s\n", i, sh->res[i].msg);
            break;
        }
    return 1;
}

/* Every listed node formed one round of want nodes: distinct ranks 0..want-1,
 * one master. second: the re-formed round. */
static int check_world(int second, int want, char *why, size_t cap)
{
    char *seen = calloc((size_t)want, 1);
    int round = -1, mport = -1, got = 0;
    for (int i = 0; i < sh->n; i++) {
        struct node_res *r = &sh->res[i];
        if ((second && r->victim) || r->leaver)
            continue;
        int rd = second ? r->round2 : r->round, rk = second ? r->rank2 : r->rank;
        int nn = second ? r->nnodes2 : r->nnodes, mp = second ? r->mport2 : r->mport;
        if (round < 0) {
            round = rd;
            mport = mp;
        }
        if (rd != round || nn != want || mp != mport || rk < 0 || rk >= want || seen[rk]) {
            snprintf(why, cap,
                     "node %d: round %d rank %d of %d, master port %d; expected round %d, "
                     "a rank of its own among %d, master port %d",
                     i, rd, rk, nn, mp, round, want, mport);
            free(seen);
            return -1;
        }
        seen[rk] = 1;
        got++;
    }
    free(seen);
    if (got != want) {
        snprintf(why, cap, "%d nodes formed, expected %d", got, want);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int procs = 4, steady_ms = 3000, timeout_s = 120;
    const char *conf_text = "";
    char err[1024];

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--rt")) { /* a flag: takes no value */
            use_rt = 1;
            continue;
        }
        if (!v)
            usage();
        i++;
        if (!strcmp(a, "--nodes"))
            nnodes = atoi(v);
        else if (!strcmp(a, "--procs"))
            procs = atoi(v);
        else if (!strcmp(a, "--endpoint"))
            endpoint = v;
        else if (!strcmp(a, "--hosted"))
            hosted_port = atoi(v);
        else if (!strcmp(a, "--etcd"))
            etcd_ep = v;
        else if (!strcmp(a, "--kill"))
            nkill = atoi(v);
        else if (!strcmp(a, "--steady-ms"))
            steady_ms = atoi(v);
        else if (!strcmp(a, "--conf"))
            conf_text = v;
        else if (!strcmp(a, "--id"))
            run_id = v;
        else if (!strcmp(a, "--server-pid"))
            server_pid = atoi(v);
        else if (!strcmp(a, "--stats-file"))
            stats_file = v;
        else if (!strcmp(a, "--timeout-s"))
            timeout_s = atoi(v);
        else if (!strcmp(a, "--join-twice"))
            join_twice = atoi(v);
        else if (!strcmp(a, "--leave"))
            nleave = atoi(v);
        else if (!strcmp(a, "--flood"))
            nflood = atoi(v);
        else if (!strcmp(a, "--arrive-ms"))
            arrive_ms = atoi(v);
        else if (!strcmp(a, "--nice"))
            node_nice = atoi(v);
        else
            usage();
    }
    if (nnodes < 2 || nnodes > MG_RDZV_MAX_NODES || procs < 1 || nkill < 0 || nleave < 0 ||
        nflood < 0 || nflood > 64 || arrive_ms < 0 || nkill + nleave >= nnodes - 2 ||
        (!endpoint + !hosted_port + !etcd_ep) != 2 || (etcd_ep && nflood))
        usage();
    if (procs > nnodes)
        procs = nnodes;
    mg_rdzv_conf_init(&conf);
    if (mg_rdzv_conf_parse(&conf, conf_text, err, sizeof(err)) < 0 ||
        mg_rdzv_conf_finish(&conf, etcd_ep ? MG_RDZV_ETCD : MG_RDZV_C10D, NULL, err, sizeof(err)) <
            0) {
        fprintf(stderr, "rdzv_swarm: %s\n", err);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);

    /* Per process: a socket and a reserved MASTER_PORT per node (etcd: two
     * sockets, the requests' and the watches'), and the hosted store's
     * connections in the process of node 0. */
    int per = (nnodes + procs - 1) / procs;
    rlim_t need = (rlim_t)(hosted_port ? nnodes + 2 * per : (etcd_ep ? 3 : 2) * per) + 64;
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < need) {
        if (rl.rlim_max < need) {
            fprintf(stderr,
                    "rdzv_swarm: %d nodes in %d processes need %llu open files per process, and "
                    "the hard limit (ulimit -Hn) is %llu: use more --procs, or raise the hard "
                    "limit (limits.conf, systemd's LimitNOFILE)\n",
                    nnodes, procs, (unsigned long long)need, (unsigned long long)rl.rlim_max);
            return 2;
        }
        rl.rlim_cur = need;
        if (setrlimit(RLIMIT_NOFILE, &rl)) {
            fprintf(stderr, "rdzv_swarm: cannot raise the open-file limit to %llu: %s\n",
                    (unsigned long long)need, strerror(errno));
            return 2;
        }
    }

    size_t shsz = sizeof(*sh) + (size_t)nnodes * sizeof(struct node_res);
    sh = mmap(NULL, shsz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("rdzv_swarm: mmap");
        return 1;
    }
    sh->n = nnodes;
    /* Leavers last; victims spread over the others, never the hosting node 0
     * (nor node 1 with --join-twice). */
    for (int k = 0; k < nleave; k++)
        sh->res[nnodes - 1 - k].leaver = 1;
    for (int k = 0; k < nkill; k++)
        sh->res[2 + (int)((int64_t)k * (nnodes - 2 - nleave) / nkill)].victim = 1;

    /* With --hosted, node 0 has a process of its own: its CPU and memory are
     * the hosted store's (and one agent's). */
    pid_t *kids = calloc((size_t)procs + 1, sizeof(*kids));
    int nk = 0, first = 0;
    if (hosted_port) {
        kids[nk] = fork();
        if (kids[nk] == 0)
            _exit(child_main(0, 1));
        server_pid = kids[nk++];
        first = 1;
    }
    int rest = nnodes - first;
    for (int p = 0; p < procs && first < nnodes; p++) {
        int cnt = rest / procs + (p < rest % procs);
        kids[nk] = fork();
        if (kids[nk] == 0)
            _exit(child_main(first, first + cnt));
        nk++;
        first += cnt;
    }

    measure_target(server_pid, stats_file, hosted_port, etcd_ep);
    int64_t deadline = mg_now_ms() + (int64_t)timeout_s * 1000;
    int rc = 0, fail = 0;
    char why[512] = "";
    struct sample s0, s1, s2, s3;
    pthread_t probe, flooders[64];
    char pep[64];
    int have_probe = 0, nflooders = 0, nform = nnodes - nleave;

    rc = wait_count(&sh->connected, nnodes, deadline, "connected");
    if (rc < 0) {
        snprintf(why, sizeof(why), "connecting: %s", rc == -EIO ? "a node failed" : "timed out");
        fail = 1;
        goto stop;
    }
    if (hosted_port)
        snprintf(pep, sizeof(pep), "127.0.0.1:%d", hosted_port);
    else
        snprintf(pep, sizeof(pep), "%s", etcd_ep ? etcd_ep : endpoint);
    have_probe = pthread_create(&probe, NULL, probe_main, pep) == 0;
    if (have_probe && use_rt) {
        struct sched_param sp = {.sched_priority = 1};
        int prc = pthread_setschedparam(probe, SCHED_FIFO, &sp);
        if (prc)
            fprintf(stderr, "rdzv_swarm: --rt: cannot give the probe a real-time priority: %s\n",
                    strerror(prc));
    }
    usleep(100000);
    take(&s0);
    printf("connected nodes=%d store_rss_kb=%ld\n", nnodes, s0.rss_kb);
    for (int i = 0; i < nflood; i++)
        if (pthread_create(&flooders[nflooders], NULL, flood_main, pep) == 0)
            nflooders++;
    atomic_store(&sh->t_join0, mg_now_ms());
    atomic_store(&sh->phase, P_JOIN);
    rc = wait_count(&sh->formed, nform, deadline, "formed");
    if (rc < 0) {
        snprintf(why, sizeof(why), "forming: %s (%d of %d formed)",
                 rc == -EIO ? "a node failed" : "timed out", atomic_load(&sh->formed), nform);
        say_round();
        fail = 1;
        goto stop;
    }
    take(&s1);
    int64_t last_join = 0, last_formed = 0, first_formed = INT64_MAX;
    for (int i = 0; i < nnodes; i++) {
        if (sh->res[i].t_join > last_join)
            last_join = sh->res[i].t_join;
        if (sh->res[i].t_formed > last_formed)
            last_formed = sh->res[i].t_formed;
        if (sh->res[i].t_formed && sh->res[i].t_formed < first_formed)
            first_formed = sh->res[i].t_formed;
    }
    if (check_world(0, nform, why, sizeof(why)) < 0) {
        fail = 1;
        goto stop;
    }
    printf("form_ms=%lld form_requests=%llu form_store_cpu_s=%.2f\n",
           (long long)(last_formed - last_join), (unsigned long long)(s1.requests - s0.requests),
           s1.cpu_s - s0.cpu_s);
    /* the first to know its rank is the closer: how long closing took, and
     * then telling everyone */
    printf("form_first_ms=%lld join_window_ms=%lld\n", (long long)(first_formed - last_join),
           (long long)(last_join - atomic_load(&sh->t_join0)));
    {
        char ops[512];
        uint64_t n = ops_line(P_JOIN, ops, sizeof(ops));
        printf("form_ops=%llu per_node=%.1f %s\n", (unsigned long long)n, (double)n / nform, ops);
    }

    atomic_store(&sh->phase, P_STEADY);
    usleep((useconds_t)steady_ms * 1000);
    take(&s2);
    double secs = (double)(s2.t - s1.t) / 1000.0;
    printf("steady_s=%.1f hb_requests_per_s=%.0f hb_store_cpu=%.3f\n", secs,
           (double)(s2.requests - s1.requests) / secs, (s2.cpu_s - s1.cpu_s) / secs);

    if (nkill > 0) {
        int64_t tk = mg_now_ms();
        atomic_store(&sh->phase, P_KILL);
        rc = wait_count(&sh->reformed, nform - nkill, deadline, "re-formed");
        if (rc < 0) {
            snprintf(why, sizeof(why), "re-forming: %s (%d of %d re-formed)",
                     rc == -EIO ? "a node failed" : "timed out", atomic_load(&sh->reformed),
                     nform - nkill);
            fail = 1;
            goto stop;
        }
        int64_t last = 0;
        for (int i = 0; i < nnodes; i++)
            if (!sh->res[i].victim && sh->res[i].t_reformed > last)
                last = sh->res[i].t_reformed;
        if (check_world(1, nform - nkill, why, sizeof(why)) < 0) {
            fail = 1;
            goto stop;
        }
        take(&s3);
        printf("killed=%d reform_ms=%lld reform_requests=%llu\n", nkill, (long long)(last - tk),
               (unsigned long long)(s3.requests - s2.requests));
        char ops[512];
        uint64_t n = ops_line(P_KILL, ops, sizeof(ops));
        printf("reform_ops=%llu per_node=%.1f %s\n", (unsigned long long)n,
               (double)n / (nform - nkill), ops);
    }
    take(&s3);
    printf("store_rss_kb=%ld store_hwm_kb=%ld store_cpu_s=%.2f requests=%llu\n", s3.rss_kb,
           s3.hwm_kb, s3.cpu_s, (unsigned long long)s3.requests);
stop:
    atomic_store(&sh->phase, P_STOP);
    if (have_probe) {
        atomic_store(&probe_stop, 1);
        pthread_join(probe, NULL);
        printf("probe_gets=%lld probe_max_ms=%.1f probe_errors=%lld\n",
               (long long)atomic_load(&probe_count), (double)atomic_load(&probe_max_us) / 1000.0,
               (long long)atomic_load(&probe_errors));
    }
    for (int i = 0; i < nflooders; i++)
        pthread_join(flooders[i], NULL);
    if (nflood)
        printf("flooders=%d flood_sent_kb=%lld\n", nflooders,
               (long long)atomic_load(&flood_bytes) / 1024);
    for (int i = 0; i < nk; i++) {
        int st;
        int64_t end = mg_now_ms() + 20000;
        while (waitpid(kids[i], &st, WNOHANG) == 0) {
            if (mg_now_ms() > end) {
                kill(kids[i], SIGKILL);
                waitpid(kids[i], &st, 0);
                break;
            }
            usleep(5000);
        }
    }
    free(kids);
    if (fail)
        return check_fail(why);
    printf("check=ok\n");
    return 0;
}