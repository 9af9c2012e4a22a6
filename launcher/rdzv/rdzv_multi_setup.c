/* The multi-node rendezvous, set up (see rdzv_multi.h): the backend, the
 * endpoint, the run id and the node's address worked out from the flags, the
 * environment and a Slurm allocation, then the store opened (or hosted) and
 * the protocol started. Driving it from the agent's loop is rdzv_multi.c. */
#include "rdzv_multi.h"
#include "rdzv_multi_internal.h"
#include "mg_err.h"
#include "net.h"
#include "kv_open.h"
#include "node_order.h"
#include "rdzv_conf.h"
#include "rdzv_proto.h"
#include "slurm.h"
#include "tcpstore.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#define STATIC_DEFAULT_PORT 29500

/* text may hold several lines: each becomes a "mglaunch: " line. */
static void add_notice(struct multi *m, const char *text)
{
    while (*text) {
        size_t n = strlen(m->notice), len = strcspn(text, "\n");
        snprintf(m->notice + n, sizeof(m->notice) - n, "%s%.*s", n ? "\nmglaunch: " : "", (int)len,
                 text);
        text += len + (text[len] == '\n');
    }
}

/* A refused TCPStore client, in the agent's log. */
static void ts_report(void *ctx, const char *line)
{
    mg_multi_note(ctx, "%s", line);
}

/* What mg_rdzv_multi_create works out, step by step, before the rendezvous
 * exists. */
struct plan {
    int min, max;  /* --nnodes, or the Slurm allocation's */
    int node_rank; /* static: this node's; -1: assigned by the rendezvous */
    int node_rank_given;
    const char *master_addr;
    int slurm;       /* mg_slurm_detect: 1 in an allocation */
    int sched_index; /* node_order.h: the scheduler's index of this node, -1: none */
    struct mg_slurm sl;
    char endpoint[MG_HOST_MAX + 16];
    char ns[MG_KV_MAX_KEY]; /* the key namespace of the run */
};

/* What kv_open has to say while it retries the endpoint (before the agent
 * exists). */
static void on_progress(void *ctx, const char *msg)
{
    struct multi *m = ctx;
    if (m->first_wait[0]) {
        mg_multi_note(m, "%s", m->first_wait);
        m->first_wait[0] = 0;
    }
    mg_multi_note(m, "%s", msg);
}

static struct multi *multi_new(FILE *status)
{
    struct multi *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->timer = -1;
    m->poller = -1;
    m->ts_poller = -1;
    m->abort_fd = -1;
    m->exit_fd = -1;
    m->status = status;
    gethostname(m->hostname, sizeof(m->hostname) - 1);
    if (!m->hostname[0])
        snprintf(m->hostname, sizeof(m->hostname), "localhost");
    return m;
}

int mg_rdzv_multi_wanted(const struct mg_launch_opts *o, char *const *env)
{
    struct mg_slurm sl;
    char err[256];

    if (o->nnodes_max > 1 || strncmp(o->rdzv_backend, "etcd", 4) == 0)
        return 1;
    if (o->nnodes_given || o->standalone)
        return 0;
    /* Under srun on several nodes, without --nnodes: the allocation decides. */
    return mg_slurm_detect(env, &sl, err, sizeof(err)) == 1 && sl.nnodes > 1;
}

/* --rdzv_conf, parsed and checked against the backend. */
static int read_conf(struct mg_rdzv_conf *c, enum mg_rdzv_backend b, const struct mg_launch_opts *o,
                     char *const *env, char *err, size_t errcap)
{
    mg_rdzv_conf_init(c);
    int rc = mg_rdzv_conf_parse(c, o->rdzv_conf, err, errcap);
    if (rc == 0 && o->exit_barrier_timeout > 0) {
        /* torchrun's flag, over mg's older --rdzv_conf key */
        double ms = o->exit_barrier_timeout * 1000.0;
        c->exit_barrier_timeout_ms = ms > INT_MAX ? INT_MAX : (int)(ms + 0.5);
        if (c->exit_barrier_timeout_ms < 1)
            c->exit_barrier_timeout_ms = 1;
    }
    return rc ? rc : mg_rdzv_conf_finish(c, b, env, err, errcap);
}

int mg_rdzv_multi_check_conf(const struct mg_launch_opts *o, char *const *env, char *notes,
                             size_t notescap, char *err, size_t errcap)
{
    struct mg_rdzv_conf c;
    enum mg_rdzv_backend b;

    if (mg_rdzv_backend_parse(o->rdzv_backend, &b) < 0)
        b = MG_RDZV_C10D;
    int rc = read_conf(&c, b, o, env, err, errcap);
    if (rc == 0 && notescap)
        snprintf(notes, notescap, "%s", c.notes);
    return rc;
}

/* Without --nnodes, a Slurm allocation says how many nodes there are, which
 * one this is, and where the master is (unless the flags say). */
static int take_slurm(const struct mg_launch_opts *o, char *const *env, struct multi *m,
                      struct plan *p, char *err, size_t errcap)
{
    char line[512];

    p->slurm = mg_slurm_detect(env, &p->sl, err, errcap);
    if (o->nnodes_given)
        return 0;
    if (p->slurm < 0)
        return p->slurm;
    if (p->slurm == 1) {
        p->min = p->max = p->sl.nnodes;
        if (!p->node_rank_given) {
            p->node_rank = p->sl.node_rank;
            p->node_rank_given = 1;
        }
        if (!p->master_addr)
            p->master_addr = p->sl.master_addr;
        int n = snprintf(line, sizeof(line), "%s: --nnodes %d, --node_rank %d, --master_addr %s",
                         strcmp(p->sl.scheduler, "slurm") ? "SkyPilot" : "Slurm", p->max,
                         p->node_rank, p->master_addr);
        if (o->master_port <= 0 && m->backend == MG_RDZV_STATIC && mg_slurm_default_port(&p->sl))
            n += snprintf(line + n, sizeof(line) - (size_t)n, ", --master_port %d (the job's)",
                          mg_slurm_default_port(&p->sl));
        snprintf(line + n, sizeof(line) - (size_t)n, " (from %s; give the flags to override)",
                 p->sl.vars);
        add_notice(m, line);
    }
    return 0;
}

/* Where the nodes meet: for static, the store rank 0 hosts at --master_addr
 * and --master_port; otherwise --rdzv_endpoint. */
static int pick_endpoint(const struct mg_launch_opts *o, struct multi *m, struct plan *p, char *err,
                         size_t errcap)
{
    if (m->backend != MG_RDZV_STATIC) {
        if (!o->rdzv_endpoint || !*o->rdzv_endpoint)
            return mg_seterr(
                err, errcap, -EINVAL,
                "--rdzv_endpoint is required with --rdzv_backend %s (host:port of the %s)",
                mg_rdzv_backend_name(m->backend),
                m->backend == MG_RDZV_ETCD ? "etcd server" : "agent hosting the store");
        snprintf(p->endpoint, sizeof(p->endpoint), "%s", o->rdzv_endpoint);
        p->node_rank = -1; /* assigned by the rendezvous */
        return 0;
    }
    const char *a = p->master_addr ? p->master_addr : "127.0.0.1";
    /* Under Slurm, a port of the job's own: jobs sharing a node do not meet
     * on 29500 (mg_slurm_default_port). */
    int port = o->master_port > 0                                   ? o->master_port
               : p->slurm == 1 && mg_slurm_default_port(&p->sl) > 0 ? mg_slurm_default_port(&p->sl)
                                                                    : STATIC_DEFAULT_PORT;
    mg_format_hostport(p->endpoint, sizeof(p->endpoint), a, port);
    snprintf(m->store_host, sizeof(m->store_host), "%s", a);
    m->store_port = port;
    if (!p->node_rank_given && p->max > 1)
        add_notice(m, "warning: --rdzv_backend static with several nodes and no --node_rank: "
                      "this node takes rank 0; give each node its own --node_rank");
    if (p->node_rank >= p->max)
        return mg_seterr(err, errcap, -EINVAL, "--node_rank %d: must be less than --nnodes %d",
                         p->node_rank, p->max);
    if (p->min != p->max)
        return mg_seterr(err, errcap, -EINVAL,
                         "--nnodes %d:%d: the static backend needs a fixed node count; use c10d "
                         "or etcd for an elastic range",
                         p->min, p->max);
    return 0;
}

/* The run id namespaces everything: nodes of one job must share it,
 * different jobs must not. */
static int pick_run_id(const struct mg_launch_opts *o, struct multi *m, const struct plan *p,
                       char *err, size_t errcap)
{
    if (o->rdzv_id) {
        snprintf(m->run_id, sizeof(m->run_id), "%s", o->rdzv_id);
    } else if (p->slurm == 1 && p->sl.job_id[0]) {
        snprintf(m->run_id, sizeof(m->run_id), "%s-%s", p->sl.scheduler, p->sl.job_id);
    } else if (m->backend == MG_RDZV_ETCD) {
        return mg_seterr(
            err, errcap, -EINVAL,
            "--rdzv_id is required with --rdzv_backend etcd: every node of a job must pass "
            "the same id, and different jobs different ones; without it, jobs sharing this "
            "etcd would share their rendezvous (torchrun's default 'none' does that)");
    } else {
        snprintf(m->run_id, sizeof(m->run_id), "none");
        if (m->backend == MG_RDZV_C10D)
            add_notice(m, "warning: no --rdzv_id: using 'none'; a second job given the same "
                          "--rdzv_endpoint would join this one. Pass the same --rdzv_id to every "
                          "node of a job (for example the scheduler's job id).");
    }
    return 0;
}

/* Connects to the backend (hosting the store on the endpoint host), retrying
 * until join_timeout. */
static int open_backend(struct multi *m, struct plan *p, struct mg_kv **kv, char *err,
                        size_t errcap)
{
    struct mg_kv_open_opts s = {
        .backend = m->backend,
        .endpoint = p->endpoint,
        .run_id = m->run_id,
        .conf = &m->conf,
        .deadline_ms = mg_now_ms() + m->conf.join_timeout_ms,
        .abort_fd = -1,
        .node_rank = m->backend == MG_RDZV_STATIC ? p->node_rank : -1,
        .max_nodes = p->max,
        .progress = on_progress,
        .progress_ctx = m,
    };
    /* A static node other than 0 waits for node 0 in particular: say whom. */
    if (m->backend == MG_RDZV_STATIC && p->node_rank != 0)
        snprintf(m->first_wait, sizeof(m->first_wait),
                 "rendezvous (static): waiting for node 0 (--node_rank 0) to host the store at %s "
                 "(--master_addr:--master_port)",
                 p->endpoint);
    struct mg_tcpstore_limits lim;
    mg_tcpstore_limits_for(&lim, m->world);
    if (m->backend == MG_RDZV_STATIC && mg_tcpstore_new(&m->ts, &lim, ts_report, m) == 0) {
        s.foreign = mg_tcpstore_adopt;
        s.foreign_ctx = m->ts;
    }
    int rc = mg_kv_open(&s, kv, &m->host, p->ns, sizeof(p->ns), err, errcap);
    /* A node that gave up before its first "still waiting" (a short
     * join_timeout, a slow machine) still says whom it waited for. */
    if (rc < 0 && rc != -EADDRINUSE && rc != -MG_EAUTH && rc != -EINVAL && m->first_wait[0])
        mg_multi_note(m, "%s", m->first_wait);
    m->first_wait[0] = 0;
    if (rc == -EADDRINUSE && m->backend == MG_RDZV_STATIC) {
        /* Node 0 stops at once; the others wait for it, saying so. */
        size_t n = strlen(err);
        snprintf(err + n, errcap - n,
                 " (another program, or another job on this machine, holds it: give every node "
                 "the same free --master_port)");
    }
    if (rc < 0)
        return rc;
    if (!m->host) { /* another node hosts the agent store */
        mg_tcpstore_release(m->ts);
        m->ts = NULL;
    }

    /* A remote backend that stops answering holds a request up to its
     * timeout: a terminating signal cuts that short (the agent blocks these
     * signals and reads them from its own signalfd; this one is only polled). */
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGINT);
    sigaddset(&term, SIGTERM);
    sigaddset(&term, SIGHUP);
    sigaddset(&term, SIGQUIT);
    m->abort_fd = signalfd(-1, &term, SFD_NONBLOCK | SFD_CLOEXEC);
    (*kv)->abort_fd = m->abort_fd;
    m->kv = *kv;
    return 0;
}

static int is_loopback(const char *addr)
{
    return strncmp(addr, "127.", 4) == 0 || strcmp(addr, "::1") == 0;
}

/* This node's address for MASTER_ADDR when it is rank 0. Never the bare host
 * name first, as torchrun does: in a Kubernetes pod it resolves only inside
 * that pod (pytorch/pytorch#150532), so the other pods' workers would wait
 * for a name they cannot resolve. */
static void pick_advertise(const struct mg_launch_opts *o, struct multi *m, struct mg_kv *kv,
                           const char *static_master, char *out, size_t cap)
{
    char num[MG_HOST_MAX], local[MG_HOST_MAX];
    if (o->local_addr) {
        snprintf(out, cap, "%s", o->local_addr);
        return;
    }
    /* The static rank 0 is the master: every other agent resolves and
     * reaches that name to join. */
    if (static_master) {
        snprintf(out, cap, "%s", static_master);
        return;
    }
    /* The address the others reach this node at: its side of its connection
     * to the backend, or, hosting the store, the address a connection to the
     * endpoint leaves from. Loopback reaches no other machine: then the host
     * name, when it resolves to something else. */
    int have = mg_kv_local_addr(kv, m->host, local, sizeof(local)) == 0;
    if (have && !is_loopback(local))
        snprintf(out, cap, "%s", local);
    else if (mg_resolve_numeric(m->hostname, num, sizeof(num)) == 0 && !is_loopback(num))
        snprintf(out, cap, "%s", m->hostname);
    else
        snprintf(out, cap, "%s", have ? local : m->hostname);
}

/* Starts the protocol over the backend, which it takes over (and releases on
 * failure). */
static int start_rdzv(const struct mg_launch_opts *o, struct multi *m, const struct plan *p,
                      struct mg_kv *kv, char *err, size_t errcap)
{
    char advertise[MG_HOST_MAX];
    pick_advertise(o, m, kv, m->host && m->backend == MG_RDZV_STATIC ? p->master_addr : NULL,
                   advertise, sizeof(advertise));
    struct mg_rdzv_opts ro = {
        .kv = kv,
        .ns = p->ns,
        .min_nodes = p->min,
        .max_nodes = p->max,
        .node_rank = m->backend == MG_RDZV_STATIC ? p->node_rank : -1,
        .has_sched_index = p->sched_index >= 0,
        .sched_index = p->sched_index,
        .nproc = o->nproc,
        .max_restarts = o->max_restarts,
        .hostname = m->hostname,
        .advertise = advertise,
        .conf = &m->conf,
    };
    int rc = mg_rdzv_new(&m->r, &ro, err, errcap);
    if (rc < 0)
        kv->ops->release(kv);
    return rc;
}

int mg_rdzv_multi_create(const struct mg_launch_opts *o, char *const *env, FILE *status,
                         const struct mg_rdzv_ops **ops, void **impl, char *err, size_t errcap)
{
    struct multi *m = multi_new(status);
    struct plan p = {
        .min = o->nnodes_min,
        .max = o->nnodes_max,
        .node_rank = o->node_rank,
        .node_rank_given = o->node_rank_given,
        .master_addr = o->master_addr,
    };
    struct mg_kv *kv = NULL;
    int rc;

    if (!m)
        return -ENOMEM;
    rc = mg_rdzv_backend_parse(o->rdzv_backend, &m->backend);
    if (rc < 0) {
        snprintf(err, errcap, "--rdzv_backend %s: expected static, c10d or etcd", o->rdzv_backend);
        goto fail;
    }
    if ((rc = take_slurm(o, env, m, &p, err, errcap)) < 0 ||
        (rc = read_conf(&m->conf, m->backend, o, env, err, errcap)) < 0)
        goto fail;
    p.sched_index = mg_rdzv_sched_index(env, m->hostname, NULL, err, errcap);
    if (p.sched_index < -1) {
        rc = p.sched_index;
        goto fail;
    }
    add_notice(m, m->conf.notes);
    m->nproc = o->nproc;
    m->world = p.max > 0 && o->nproc > 0 && p.max <= INT_MAX / o->nproc ? p.max * o->nproc : 1;
    if ((rc = pick_endpoint(o, m, &p, err, errcap)) < 0 ||
        (rc = pick_run_id(o, m, &p, err, errcap)) < 0 ||
        (rc = open_backend(m, &p, &kv, err, errcap)) < 0 ||
        (rc = start_rdzv(o, m, &p, kv, err, errcap)) < 0)
        goto fail;
    m->ops = mg_multi_ops;
    m->ops.name = mg_rdzv_backend_name(m->backend);
    *ops = &m->ops;
    *impl = m;
    return 0;
fail:
    mg_multi_release(m); /* m->r is NULL: what is open is the host and abort_fd */
    return rc;
}

const char *mg_rdzv_multi_run_id(void *impl)
{
    return ((struct multi *)impl)->run_id;
}

const char *mg_rdzv_multi_notice(void *impl)
{
    struct multi *m = impl;
    return m && m->notice[0] ? m->notice : NULL;
}
