/* Store benchmark driver (tests/bench/store.sh): N client threads, each with
 * its own connection, run one operation in a loop; prints ops/s and latency
 * percentiles, and checks the results (a fast wrong answer fails).
 *
 *   storebench HOST:PORT OP CLIENTS OPS_PER_CLIENT [--token T]
 *     OP: set | get | add | wait | wake | rendezvous
 *
 * wake: pairs of clients bounce a counter through watch, so each operation is
 * one set waking one parked watch on another connection.
 * rendezvous: every client connects, takes a rank with add, publishes its
 * address, waits for all the others' and lists them (what a launcher's
 * rendezvous does); prints the time until the last client is done.
 *
 * Output: "OP CLIENTS ops/s p50_us p99_us" (rendezvous: "rendezvous CLIENTS
 * total_ms p50_ms max_ms"), or "storebench: ..." on stderr and exit 1. */
#include "mg_err.h"
#include "net.h"
#include "store.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct mg_hostport hp;
static const char *token;
static const char *op;
static int nclients, nops;
static pthread_barrier_t start;
static char run[32]; /* namespaces one run's keys */

struct worker {
    int id;
    pthread_t th;
    int64_t *lat_us; /* per operation; rendezvous: one total */
    int rc;
    const char *what;
};

static struct mg_store *connect_one(void)
{
    struct mg_store_opts o = {.host = hp.host,
                              .port = hp.port,
                              .token = token,
                              .connect_timeout_ms = 10000,
                              .timeout_ms = 30000};
    struct mg_store *st = NULL;
    int rc = mg_store_connect(&st, &o);
    return rc ? NULL : st;
}

static int fail(struct worker *w, const char *what, int rc)
{
    w->rc = rc ? rc : -MG_EPROTO;
    w->what = what;
    return w->rc;
}

static int run_ops(struct worker *w, struct mg_store *st)
{
    char key[64], val[64], peer[64];
    int64_t r;
    snprintf(key, sizeof(key), "bench/%d", w->id);
    int vl = snprintf(val, sizeof(val), "value-of-client-%d", w->id);
    if (mg_store_set(st, key, val, (size_t)vl, 0))
        return fail(w, "prepare", -EIO);
    const char *keys[1] = {key};
    /* wake: clients 2k and 2k+1 bounce a counter. */
    char mine[64];
    snprintf(peer, sizeof(peer), "wake/%d", w->id ^ 1);
    snprintf(mine, sizeof(mine), "wake/%d", w->id);
    int64_t peer_rev = 0;
    pthread_barrier_wait(&start);
    for (int i = 0; i < nops; i++) {
        int64_t t0 = mg_now_us();
        int rc = 0;
        if (!strcmp(op, "set")) {
            rc = mg_store_set(st, key, val, (size_t)vl, 0);
        } else if (!strcmp(op, "get")) {
            void *v = NULL;
            size_t len;
            rc = mg_store_get(st, key, &v, &len, 0);
            if (!rc && (len != (size_t)vl || memcmp(v, val, len)))
                rc = -MG_EPROTO;
            free(v);
        } else if (!strcmp(op, "add")) {
            rc = mg_store_add(st, "bench-counter", 1, &r);
        } else if (!strcmp(op, "wait")) {
            rc = mg_store_wait(st, keys, 1, 1000);
        } else if (!strcmp(op, "wake")) {
            /* Even clients set first; each waits for the peer's answer. */
            char num[32];
            int nl = snprintf(num, sizeof(num), "%d", i);
            if (w->id % 2 == 0)
                rc = mg_store_set(st, mine, num, (size_t)nl, 0);
            while (!rc) {
                void *v = NULL;
                size_t len;
                rc = mg_store_watch(st, peer, peer_rev, 10000, &peer_rev, &v, &len);
                int got = !rc && v && atoi(v) == i;
                free(v);
                if (got)
                    break;
            }
            if (!rc && w->id % 2 == 1)
                rc = mg_store_set(st, mine, num, (size_t)nl, 0);
        }
        if (rc)
            return fail(w, op, rc);
        w->lat_us[i] = mg_now_us() - t0;
    }
    return 0;
}

static int run_rendezvous(struct worker *w)
{
    char key[64], addr[64], **list = NULL;
    const char *keys[MG_STORE_MAX_WAIT_KEYS];
    int64_t rank, t0;
    int rc, n;
    pthread_barrier_wait(&start);
    t0 = mg_now_us();
    struct mg_store *st = connect_one();
    if (!st)
        return fail(w, "connect", -ECONNREFUSED);
    snprintf(key, sizeof(key), "%s/joined", run);
    if ((rc = mg_store_add(st, key, 1, &rank)))
        goto out;
    snprintf(key, sizeof(key), "%s/node/%lld", run, (long long)(rank - 1));
    int al = snprintf(addr, sizeof(addr), "10.0.0.%d:29500", w->id);
    if ((rc = mg_store_set(st, key, addr, (size_t)al, MG_STORE_EPHEMERAL)))
        goto out;
    /* Everyone's key, in chunks of MG_STORE_MAX_WAIT_KEYS. */
    char(*names)[64] = malloc((size_t)nclients * sizeof(*names));
    if (!names) {
        rc = -ENOMEM;
        goto out;
    }
    for (int base = 0; base < nclients && !rc; base += MG_STORE_MAX_WAIT_KEYS) {
        int k = 0;
        for (int i = base; i < nclients && k < MG_STORE_MAX_WAIT_KEYS; i++, k++) {
            snprintf(names[i], sizeof(names[i]), "%s/node/%d", run, i);
            keys[k] = names[i];
        }
        rc = mg_store_wait(st, keys, k, 30000);
    }
    free(names);
    if (rc)
        goto out;
    n = 0;
    snprintf(key, sizeof(key), "%s/node/", run);
    rc = mg_store_list(st, key, -1, &list, &n);
    mg_store_free_list(list, n);
    if (rc >= 0 && n != nclients)
        rc = -MG_EPROTO;
    if (rc > 0)
        rc = 0;
    w->lat_us[0] = mg_now_us() - t0;
    /* Stay connected (the keys are ephemeral) until every client has listed. */
    pthread_barrier_wait(&start);
out:
    mg_store_release(st);
    if (rc)
        return fail(w, "rendezvous", rc);
    return 0;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    if (!strcmp(op, "rendezvous")) {
        if (run_rendezvous(w))
            pthread_barrier_wait(&start); /* do not leave the others waiting */
        return NULL;
    }
    struct mg_store *st = connect_one();
    if (!st) {
        fail(w, "connect", -ECONNREFUSED);
        pthread_barrier_wait(&start);
        return NULL;
    }
    run_ops(w, st);
    mg_store_release(st);
    return NULL;
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 5 || mg_parse_hostport(argv[1], 0, &hp) || !hp.port) {
        fprintf(stderr, "usage: storebench HOST:PORT OP CLIENTS OPS [--token T]\n");
        return 2;
    }
    op = argv[2];
    nclients = atoi(argv[3]);
    nops = atoi(argv[4]);
    if (argc >= 7 && !strcmp(argv[5], "--token"))
        token = argv[6];
    int rdzv = !strcmp(op, "rendezvous");
    snprintf(run, sizeof(run), "rdzv/%d-%lld", (int)getpid(), (long long)mg_now_us());
    if (rdzv)
        nops = 1;
    if (nclients < 1 || nclients > 4096 || nops < 1 || (!strcmp(op, "wake") && nclients % 2)) {
        fprintf(stderr, "storebench: bad client or op count\n");
        return 2;
    }
    struct worker *w = calloc((size_t)nclients, sizeof(*w));
    int64_t *lat = calloc((size_t)nclients * (size_t)nops, sizeof(*lat));
    pthread_barrier_init(&start, NULL, (unsigned)nclients);
    int64_t t0 = mg_now_us();
    for (int i = 0; i < nclients; i++) {
        w[i].id = i;
        w[i].lat_us = lat + (size_t)i * (size_t)nops;
        pthread_create(&w[i].th, NULL, worker_main, &w[i]);
    }
    int bad = 0;
    for (int i = 0; i < nclients; i++) {
        pthread_join(w[i].th, NULL);
        if (w[i].rc && bad++ < 5)
            fprintf(stderr, "storebench: client %d: %s: %s\n", i, w[i].what, mg_strerror(w[i].rc));
    }
    int64_t wall = mg_now_us() - t0;
    if (bad)
        return 1;
    size_t total = (size_t)nclients * (size_t)nops;
    qsort(lat, total, sizeof(*lat), cmp64);
    if (rdzv) {
        /* Clients started together: the slowest one is the rendezvous time. */
        printf("rendezvous %d %.1f %.1f %.1f\n", nclients, lat[total - 1] / 1000.0,
               lat[total / 2] / 1000.0, lat[total - 1] / 1000.0);
        return 0;
    }
    if (!strcmp(op, "add")) {
        /* Check: the counter must hold exactly every increment. */
        struct mg_store *st = connect_one();
        void *v = NULL;
        size_t len;
        int rc = st ? mg_store_get(st, "bench-counter", &v, &len, 0) : -ECONNREFUSED;
        long long got = v ? atoll(v) : -1;
        free(v);
        mg_store_release(st);
        if (rc || got < (long long)total) {
            fprintf(stderr, "storebench: counter is %lld, want at least %zu\n", got, total);
            return 1;
        }
    }
    printf("%s %d %.0f %.1f %.1f\n", op, nclients, total / (wall / 1e6), (double)lat[total / 2],
           (double)lat[total * 99 / 100]);
    free(lat);
    free(w);
    return 0;
}
