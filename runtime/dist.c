/* The worker's distributed context (see dist.h): the launcher's environment,
 * validated; the store, hosted by rank 0 and joined by everyone; the
 * communicator built through it, for the compute device the ranks agree on. */
#include "dist.h"
#include "progress.h"
#include "backend.h"
#include "comm.h"
#include "mg_err.h"
#include "net.h"
#include "store.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* Reads an optional integer variable in [lo, hi]. Returns 1 when set, 0 when
 * unset (or empty), -EINVAL (with a message) when malformed or out of range. */
static int env_int(const char *name, long lo, long hi, int *out, char *err, size_t errlen)
{
    const char *v = getenv(name);
    char *end;
    if (!v || !*v)
        return 0;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        mg_seterr(err, errlen, 0, "%s='%.64s': expected an integer from %ld to %ld", name, v, lo,
                  hi);
        return -EINVAL;
    }
    *out = (int)x;
    return 1;
}

int mg_dist_env_read(struct mg_dist_env *env, char *err, size_t errlen)
{
    int rc, has_rank, has_world, has_lr, has_lw;
    const char *v;

    memset(env, 0, sizeof(*env));
    env->world = env->local_world = 1;
    env->use_agent_store = -1;
    env->max_restarts = -1;
    env->cuda_device = -1;
    if (env_int("MG_CUDA_DEVICE", 0, 1023, &env->cuda_device, err, errlen) < 0 ||
        env_int("MG_TEST_COMM_THREAD", 0, 1, &env->test_comm_thread, err, errlen) < 0)
        return -EINVAL;

    if ((has_world = env_int("WORLD_SIZE", 1, MG_DIST_MAX_WORLD, &env->world, err, errlen)) < 0)
        return -EINVAL;
    if ((has_rank = env_int("RANK", 0, MG_DIST_MAX_WORLD - 1, &env->rank, err, errlen)) < 0)
        return -EINVAL;
    if (has_rank != has_world) {
        mg_seterr(err, errlen, 0, "%s is set but %s is not: a launcher sets both",
                  has_rank ? "RANK" : "WORLD_SIZE", has_rank ? "WORLD_SIZE" : "RANK");
        return -EINVAL;
    }
    env->launched = has_rank;
    if (env->rank >= env->world) {
        mg_seterr(err, errlen, 0, "RANK=%d: must be below WORLD_SIZE=%d", env->rank, env->world);
        return -EINVAL;
    }
    if ((has_lw = env_int("LOCAL_WORLD_SIZE", 1, env->world, &env->local_world, err, errlen)) < 0)
        return -EINVAL;
    if ((has_lr = env_int("LOCAL_RANK", 0, env->world - 1, &env->local_rank, err, errlen)) < 0)
        return -EINVAL;
    if (has_lw && has_lr && env->local_rank >= env->local_world) {
        mg_seterr(err, errlen, 0, "LOCAL_RANK=%d: must be below LOCAL_WORLD_SIZE=%d",
                  env->local_rank, env->local_world);
        return -EINVAL;
    }
    if (!has_lw && !has_lr && env->launched) {
        env->local_rank = env->rank;
        env->local_world = env->world;
    }
    if (env_int("GROUP_RANK", 0, MG_DIST_MAX_WORLD - 1, &env->group_rank, err, errlen) < 0)
        return -EINVAL;
    if (env_int("TORCHELASTIC_RESTART_COUNT", 0, INT32_MAX, &env->restart_count, err, errlen) < 0)
        return -EINVAL;
    if (env_int("TORCHELASTIC_MAX_RESTARTS", 0, INT32_MAX, &env->max_restarts, err, errlen) < 0)
        return -EINVAL;

    if ((v = getenv("TORCHELASTIC_RUN_ID")) && *v) {
        if (strlen(v) > MG_DIST_RUN_ID_MAX) {
            mg_seterr(err, errlen, 0, "TORCHELASTIC_RUN_ID is %zu characters long: at most %d",
                      strlen(v), MG_DIST_RUN_ID_MAX);
            return -EINVAL;
        }
        snprintf(env->run_id, sizeof(env->run_id), "%s", v);
    } else {
        snprintf(env->run_id, sizeof(env->run_id), "none");
    }
    if ((v = getenv("TORCHELASTIC_USE_AGENT_STORE")) && *v) {
        if (!strcasecmp(v, "true") || !strcmp(v, "1")) {
            env->use_agent_store = 1;
        } else if (!strcasecmp(v, "false") || !strcmp(v, "0")) {
            env->use_agent_store = 0;
        } else {
            mg_seterr(err, errlen, 0,
                      "TORCHELASTIC_USE_AGENT_STORE='%.32s': expected True or False", v);
            return -EINVAL;
        }
    }
    if ((v = getenv("MG_STORE_TOKEN")) && *v) {
        if (strlen(v) > MG_STORE_MAX_TOKEN) {
            mg_seterr(err, errlen, 0, "MG_STORE_TOKEN is %zu characters long: at most %d",
                      strlen(v), MG_STORE_MAX_TOKEN);
            return -EINVAL;
        }
        snprintf(env->store_token, sizeof(env->store_token), "%s", v);
    }
    env->single_host = has_lw && env->local_world == env->world;
    if ((v = getenv("TORCHELASTIC_ERROR_FILE")) && *v) {
        if (strlen(v) >= sizeof(env->error_file)) {
            mg_seterr(err, errlen, 0, "TORCHELASTIC_ERROR_FILE is longer than %zu characters",
                      sizeof(env->error_file) - 1);
            return -EINVAL;
        }
        snprintf(env->error_file, sizeof(env->error_file), "%s", v);
    }

    /* The store is needed only with company (or a test's forced communicator). */
    if (env->world > 1 || env->test_comm_thread) {
        v = getenv("MASTER_ADDR");
        if (!v || !*v) {
            mg_seterr(err, errlen, 0,
                      "MASTER_ADDR is not set (WORLD_SIZE=%d): rank 0's address is needed",
                      env->world);
            return -EINVAL;
        }
        if (strlen(v) >= sizeof(env->master_addr)) {
            mg_seterr(err, errlen, 0, "MASTER_ADDR is longer than %zu characters",
                      sizeof(env->master_addr) - 1);
            return -EINVAL;
        }
        snprintf(env->master_addr, sizeof(env->master_addr), "%s", v);
        rc = env_int("MASTER_PORT", 1, 65535, &env->master_port, err, errlen);
        if (rc < 0)
            return -EINVAL;
        if (rc == 0) {
            mg_seterr(err, errlen, 0,
                      "MASTER_PORT is not set (WORLD_SIZE=%d): the store's port is needed",
                      env->world);
            return -EINVAL;
        }
        env->agent_store_mg = (v = getenv("MG_AGENT_STORE")) && strcmp(v, "mg") == 0;
        if (env->use_agent_store == 1 && !env->agent_store_mg) {
            mg_seterr(
                err, errlen, 0,
                "TORCHELASTIC_USE_AGENT_STORE=True: the launcher's agent hosts the store, and "
                "torchrun's (its default static rendezvous) speaks torch's TCPStore, which mg "
                "workers do not. Run under mglaunch, or give torchrun "
                "--rdzv_backend=c10d --rdzv_endpoint=HOST:PORT (or --standalone on one node)");
            return -MG_ECONFIG;
        }
    }
    return 0;
}

/* --device auto decided on each rank: all CUDA or all CPU, or every rank
 * fails now with the same message (a CPU communicator and NCCL would each wait
 * for the others until the init timeout). Counters in the store: the CUDA
 * ranks, then the ranks done, the last of which says so; a CPU rank leaves
 * its reason under cpu/<rank> first, for the message. */
static int agree_on_device(struct mg_dist *d, int on_cuda, const char *why, int timeout_ms,
                           char *err, size_t errlen)
{
    char pre[MG_DIST_RUN_ID_MAX + 64], k[MG_DIST_RUN_ID_MAX + 96], **keys = NULL;
    int64_t n, cuda;
    void *val = NULL;
    size_t len = 0;
    int nkeys = 0, rc;
    snprintf(pre, sizeof(pre), "mg/device/%s/%d/", d->env.run_id, d->env.restart_count);
    snprintf(k, sizeof(k), "%scpu/%d", pre, d->rank);
    rc = on_cuda ? 0 : mg_store_set(d->store, k, why ? why : "", why ? strlen(why) : 0, 0);
    if (!rc) {
        snprintf(k, sizeof(k), "%scuda", pre);
        rc = mg_store_add(d->store, k, on_cuda ? 1 : 0, NULL);
    }
    if (!rc) {
        snprintf(k, sizeof(k), "%sranks", pre);
        rc = mg_store_add(d->store, k, 1, &n);
    }
    char done[sizeof(k)];
    const char *wait_for = done;
    snprintf(done, sizeof(done), "%sall", pre);
    if (!rc && n == d->world)
        rc = mg_store_set(d->store, done, "1", 1, 0);
    if (!rc)
        rc = mg_store_wait(d->store, &wait_for, 1, timeout_ms);
    snprintf(k, sizeof(k), "%scuda", pre);
    if (!rc)
        rc = mg_store_get(d->store, k, &val, &len, 0);
    if (rc < 0)
        return mg_seterr(err, errlen, rc,
                         "--device auto: cannot compare the ranks' devices through the store: %s",
                         rc == -ETIMEDOUT ? "timed out waiting for the other ranks"
                                          : mg_strerror(rc));
    cuda = strtoll(val, NULL, 10);
    free(val);
    if (cuda == 0 || cuda == d->world)
        return 0;
    /* the lowest rank on the CPU, and its reason */
    int first = -1;
    snprintf(k, sizeof(k), "%scpu/", pre);
    if (mg_store_list(d->store, k, -1, &keys, &nkeys) >= 0) {
        for (int i = 0; i < nkeys; i++) {
            int r = atoi(keys[i] + strlen(k));
            first = first < 0 || r < first ? r : first;
        }
        mg_store_free_list(keys, nkeys);
    }
    val = NULL;
    len = 0;
    snprintf(k, sizeof(k), "%scpu/%d", pre, first);
    if (first >= 0)
        mg_store_get(d->store, k, &val, &len, 0);
    mg_seterr(err, errlen, -MG_ECONFIG,
              "--device auto: %lld of the %d ranks found a usable GPU and %lld did not "
              "(rank %d: %.300s): every rank must compute on the same device; give --device "
              "cuda or --device cpu",
              (long long)cuda, d->world, (long long)(d->world - cuda), first,
              val && len ? (const char *)val : "no reason given");
    free(val);
    /* rank 0 hosts the store: it leaves once every rank has read the reason */
    snprintf(k, sizeof(k), "%sread", pre);
    snprintf(done, sizeof(done), "%sread_all", pre);
    if (mg_store_add(d->store, k, 1, &n) == 0 && n == d->world)
        mg_store_set(d->store, done, "1", 1, 0);
    if (d->rank == 0)
        mg_store_wait(d->store, &wait_for, 1, 10000);
    return -MG_ECONFIG;
}

/* mg_dist_opts.progress, when the program gave one. */
__attribute__((format(printf, 2, 3))) static void say(const struct mg_dist *d, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    if (!d->opts || !d->opts->progress)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    d->opts->progress(d->opts->progress_ctx, msg);
}

/* Who hosts the workers' store (torch's rule: TORCHELASTIC_USE_AGENT_STORE). */
static const char *store_host_is(const struct mg_dist *d)
{
    return d->env.use_agent_store == 1 ? "the launcher's agent store" : "hosted by rank 0";
}

/* Why a connection to the store failed, in words a user can act on. */
static const char *store_why(const struct mg_dist *d, int rc)
{
    if (rc == -ECONNREFUSED && d->env.use_agent_store == 1)
        return "connection refused (nothing listens there: the launcher's agent on node 0 has "
               "not started its store, or MASTER_ADDR names another machine)";
    if (rc == -MG_EAUTH && d->env.use_agent_store == 1)
        return "authentication failed: MG_AGENT_STORE_TOKEN differs from the agents' rendezvous "
               "token, or one side has none";
    switch (rc) {
    case -ECONNREFUSED:
        return "connection refused (nothing listens there: rank 0 has not started its store, "
               "or MASTER_ADDR names another machine)";
    case -ETIMEDOUT:
        return "connection timed out (no answer from that host: a firewall, or the wrong address)";
    case -MG_EAUTH:
        return "authentication failed: MG_STORE_TOKEN differs from rank 0's, or one side has "
               "none";
    default:
        return mg_strerror(rc);
    }
}

static void store_progress(void *ctx, int rc, int waited_ms, int left_ms)
{
    const struct mg_dist *d = ctx;
    say(d,
        "rank %d: waiting for the store at %s:%d (MASTER_ADDR:MASTER_PORT, %s): %s; %d s so "
        "far, giving up in %d s (MG_COMM_INIT_TIMEOUT)",
        d->rank, d->env.master_addr, d->env.master_port, store_host_is(d), store_why(d, rc),
        waited_ms / 1000, (left_ms + 999) / 1000);
}

/* Rank 0's store: on MASTER_ADDR when this machine holds it. */
static int host_store(struct mg_dist *d, char *err, size_t errlen)
{
    char bind[MG_HOST_MAX];
    const char *token = d->env.store_token[0] ? d->env.store_token : NULL;
    enum mg_store_bind how =
        mg_store_bind_addr(d->env.master_addr, d->env.single_host, bind, sizeof(bind));
    struct mg_store_server_opts so = {
        .host = bind, .port = d->env.master_port, .listen_fd = -1, .token = token};
    int rc = mg_store_server_start(&d->server, &so);
    if (rc) {
        mg_seterr(err, errlen, 0, "rank 0 cannot host the store on %s port %d (MASTER_PORT): %s",
                  bind[0] ? bind : "every interface,", d->env.master_port, mg_strerror(rc));
        return rc;
    }
    if (how != MG_STORE_BIND_LOOPBACK && !token)
        say(d,
            "warning: rank 0's store listens on %s port %d without a token: anyone who can "
            "reach that port can end the job. Give every rank the same secret in "
            "MG_STORE_TOKEN (mglaunch does for a single-node job, and from MG_RDZV_TOKEN for "
            "several nodes)",
            bind[0] ? bind : "every interface,", d->env.master_port);
    rc = mg_store_server_start_thread(d->server);
    if (rc)
        mg_seterr(err, errlen, 0, "cannot start the store's thread: %s", mg_strerror(rc));
    return rc;
}

int mg_dist_init(struct mg_dist **out, const struct mg_dist_opts *opts, char *err, size_t errlen)
{
    struct mg_dist *d = calloc(1, sizeof(*d));
    int rc;
    if (!d) {
        mg_seterr(err, errlen, 0, "out of memory");
        return -ENOMEM;
    }
    rc = mg_dist_env_read(&d->env, err, errlen);
    if (rc)
        goto fail;
    d->rank = d->env.rank;
    d->world = d->env.world;
    d->local_rank = d->env.local_rank;
    d->local_world = d->env.local_world;
    if (gethostname(d->hostname, sizeof(d->hostname) - 1) < 0)
        snprintf(d->hostname, sizeof(d->hostname), "unknown");
    d->opts = opts;
    /* mglaunch's watchdog reads it from here on (a bootstrap that waits
     * is setup, which it bounds by the collective timeout). */
    if (mg_progress_open() < 0)
        say(d,
            "warning: MG_PROGRESS_FD='%.32s' names no progress record: mglaunch's watchdog "
            "cannot see this rank (a launcher other than mglaunch should not set it)",
            getenv("MG_PROGRESS_FD"));
    mg_progress_identify(d->rank, MG_COMM_TIMEOUT_DEFAULT_MS);

    /* MG_TEST_COMM_THREAD: NCCL at world size 1 on a GPU (the CPU communicators need two) */
    int forced =
        d->env.test_comm_thread && opts && opts->backend && opts->backend->device == MG_DEVICE_CUDA;
    if (d->world == 1 && !forced) {
        rc = mg_comm_single_create(&d->comm);
        if (rc) {
            mg_seterr(err, errlen, 0, "cannot create the communicator: %s", mg_strerror(rc));
            goto fail;
        }
        *out = d;
        return 0;
    }

    d->opts = opts; /* for the messages below; not kept */
    struct mg_comm_opts copts = {.rank = d->rank, .world = d->world};
    rc = mg_comm_opts_from_env(&copts, err, errlen);
    if (rc)
        goto fail;
    if (opts && opts->init_timeout_ms > 0)
        copts.init_timeout_ms = opts->init_timeout_ms;
    else if (!copts.init_timeout_ms)
        copts.init_timeout_ms = MG_COMM_TIMEOUT_DEFAULT_MS;
    copts.run_id = d->env.run_id;
    copts.restart_count = d->env.restart_count;
    const struct mg_backend *be = opts ? opts->backend : NULL;
    copts.on_cuda = be && be->device == MG_DEVICE_CUDA;
    copts.device_index = copts.on_cuda ? opts->device_index : -1;
    copts.stream = be ? be->stream : NULL;
    if (copts.mode == MG_COMM_NCCL && !copts.on_cuda) {
        rc = mg_seterr(err, errlen, -MG_ECONFIG,
                       "MG_COMM=nccl: NCCL reduces GPU memory, and this run computes on the CPU; "
                       "give --device cuda, or MG_COMM=auto");
        goto fail;
    }
    if (opts) {
        copts.progress = opts->progress;
        copts.progress_ctx = opts->progress_ctx;
    }

    /* torch's rule: the agent's store when TORCHELASTIC_USE_AGENT_STORE,
     * each attempt in a namespace of its own (rendezvous.py _create_c10d_store). */
    char prefix[64] = "";
    const char *token = d->env.store_token[0] ? d->env.store_token : NULL;
    if (d->env.use_agent_store == 1) {
        snprintf(prefix, sizeof(prefix), "/worker/attempt_%d/", d->env.restart_count);
        token = getenv("MG_AGENT_STORE_TOKEN");
    } else if (d->rank == 0 && (rc = host_store(d, err, errlen))) {
        goto fail;
    }
    struct mg_store_opts co = {
        .host = d->env.master_addr,
        .port = d->env.master_port,
        .token = token && *token ? token : NULL,
        .prefix = prefix,
        .connect_timeout_ms = copts.init_timeout_ms,
        .timeout_ms = copts.init_timeout_ms,
        .progress = store_progress,
        .progress_ctx = d,
    };
    rc = mg_store_connect(&d->store, &co);
    if (rc) {
        mg_seterr(err, errlen, 0,
                  "cannot connect to the store at %s:%d (MASTER_ADDR:MASTER_PORT, %s): %s",
                  d->env.master_addr, d->env.master_port, store_host_is(d), store_why(d, rc));
        goto fail;
    }
    if (opts && opts->device_auto) {
        rc = agree_on_device(d, copts.on_cuda, opts->auto_why, copts.init_timeout_ms, err, errlen);
        if (rc)
            goto fail;
    }
    char cerr[512];
    rc = mg_comm_create(&d->comm, d->store, &copts, cerr, sizeof(cerr));
    if (rc) {
        mg_seterr(err, errlen, 0, "cannot set up communication between the %d ranks: %s", d->world,
                  cerr);
        goto fail;
    }
    d->opts = NULL;
    mg_progress_identify(d->rank, d->comm->timeout_ms > 0 ? d->comm->timeout_ms
                                                          : MG_COMM_TIMEOUT_DEFAULT_MS);
    *out = d;
    return 0;

fail:
    mg_dist_release(d);
    return rc;
}

int mg_dist_finalize(struct mg_dist *d, int timeout_ms)
{
    if (!d || !d->comm)
        return 0;
    return mg_comm_barrier(d->comm, timeout_ms);
}

void mg_dist_release(struct mg_dist *d)
{
    if (!d)
        return;
    mg_comm_release(d->comm);
    if (d->store)
        mg_store_release(d->store);
    if (d->server)
        mg_store_server_release(d->server);
    free(d);
}
