/* What the scale swarm measures (swarm.h): the requests the simulated nodes
 * make, counted by a wrapper around the rendezvous' key-value backend; the
 * store's CPU, memory and requests; the probe client's latency; and the
 * flooding clients. */
#include "swarm.h"
#include "http.h"
#include "kv_etcd.h"
#include "net.h"
#include "store.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ---- counting the backend's requests ------------------------------------------- */

static const struct mg_kv_ops *real_ops; /* the backend's own (one kind per process) */

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void count(enum kv_op op, int64_t t0)
{
    struct opstat *o = &sh->ops[atomic_load(&sh->phase)][op];
    atomic_fetch_add(&o->n, 1);
    atomic_fetch_add(&o->us, (uint64_t)(now_us() - t0));
}

static int c_get(struct mg_kv *kv, const char *key, char **val, size_t *len, int64_t *rev)
{
    int64_t t0 = now_us();
    int rc = real_ops->get(kv, key, val, len, rev);
    count(OP_GET, t0);
    return rc;
}

static int c_set(struct mg_kv *kv, const char *key, const void *val, size_t len, int flags)
{
    int64_t t0 = now_us();
    int rc = real_ops->set(kv, key, val, len, flags);
    count(OP_SET, t0);
    return rc;
}

static int c_cas(struct mg_kv *kv, const char *key, const void *expected, size_t elen,
                 const void *desired, size_t dlen, int flags, char **cur, size_t *curlen)
{
    int64_t t0 = now_us();
    int rc = real_ops->cas(kv, key, expected, elen, desired, dlen, flags, cur, curlen);
    count(OP_CAS, t0);
    return rc;
}

static int c_add(struct mg_kv *kv, const char *key, int64_t delta, int64_t *result)
{
    int64_t t0 = now_us();
    int rc = real_ops->add(kv, key, delta, result);
    count(OP_ADD, t0);
    return rc;
}

static int c_del(struct mg_kv *kv, const char *key)
{
    int64_t t0 = now_us();
    int rc = real_ops->del(kv, key);
    count(OP_DEL, t0);
    return rc;
}

static int c_list(struct mg_kv *kv, const char *prefix, int max, int want_values,
                  struct mg_kv_entry **out, int *n)
{
    /* the list itself; the gets of its values go through c_get */
    int64_t t0 = now_us();
    int rc = real_ops->list(kv, prefix, max, want_values, out, n);
    count(OP_LIST, t0);
    return rc;
}

static int c_wait(struct mg_kv *kv, const char *key, int64_t since_rev, int timeout_ms)
{
    int64_t t0 = now_us();
    int rc = real_ops->wait(kv, key, since_rev, timeout_ms);
    count(OP_WAIT, t0);
    return rc;
}

static int c_watch(struct mg_kv *kv, const char *key, int64_t since_rev, int timeout_ms,
                   int park_ms, char **val, size_t *len)
{
    /* counted per call: a call that takes up the parked watch of the last
     * one sends nothing (the store's own count, form_requests, is exact) */
    int64_t t0 = now_us();
    int rc = real_ops->watch(kv, key, since_rev, timeout_ms, park_ms, val, len);
    count(OP_WAIT, t0);
    return rc;
}

/* n requests, pipelined: each counted, with their share of the time */
static void count_n(enum kv_op op, int64_t t0, int n)
{
    struct opstat *o = &sh->ops[atomic_load(&sh->phase)][op];
    atomic_fetch_add(&o->n, (uint64_t)n);
    atomic_fetch_add(&o->us, (uint64_t)(now_us() - t0));
}

static int c_get_many(struct mg_kv *kv, const char *const *keys, int n, char **vals, size_t *lens,
                      int64_t *revs)
{
    int64_t t0 = now_us();
    int rc = real_ops->get_many(kv, keys, n, vals, lens, revs);
    count_n(OP_GET, t0, n);
    return rc;
}

static int c_set_many(struct mg_kv *kv, const char *const *keys, const char *const *vals,
                      const size_t *lens, int n)
{
    int64_t t0 = now_us();
    int rc = real_ops->set_many(kv, keys, vals, lens, n);
    count_n(OP_SET, t0, n);
    return rc;
}

static int c_del_many(struct mg_kv *kv, const char *const *keys, int n)
{
    int64_t t0 = now_us();
    int rc = real_ops->del_many(kv, keys, n);
    count_n(OP_DEL, t0, n);
    return rc;
}

static int c_count(struct mg_kv *kv, const char *prefix, int *n)
{
    int64_t t0 = now_us();
    int rc = real_ops->count(kv, prefix, n);
    count(OP_LIST, t0);
    return rc;
}

static int c_keepalive(struct mg_kv *kv)
{
    int64_t t0 = now_us();
    int rc = real_ops->keepalive(kv);
    count(OP_PING, t0);
    return rc;
}

/* Every node of a process has the same kind (with --hosted, node 0 has a process of its
 * own), so one table serves them. */
void count_requests(struct mg_kv *kv)
{
    static struct mg_kv_ops c;
    static pthread_mutex_t lk = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&lk);
    if (!real_ops) {
        real_ops = kv->ops;
        c = *real_ops;
        c.get = c_get;
        c.set = c_set;
        c.cas = c_cas;
        c.add = c_add;
        c.del = c_del;
        c.list = c_list;
        c.wait = c_wait;
        c.keepalive = c_keepalive;
        c.watch = real_ops->watch ? c_watch : NULL;
        c.get_many = real_ops->get_many ? c_get_many : NULL;
        c.set_many = real_ops->set_many ? c_set_many : NULL;
        c.count = real_ops->count ? c_count : NULL;
        c.del_many = real_ops->del_many ? c_del_many : NULL;
    }
    if (kv->ops == real_ops)
        kv->ops = &c;
    pthread_mutex_unlock(&lk);
}

/* ---- the measurements ---------------------------------------------------------- */

static pid_t server_pid;
static const char *stats_file, *etcd_ep;
static int hosted_port;

void measure_target(pid_t pid, const char *file, int hosted, const char *etcd)
{
    server_pid = pid;
    stats_file = file;
    hosted_port = hosted;
    etcd_ep = etcd;
}

/* etcd's count of the gRPC calls it began (grpc_server_started_total, every
 * method summed), from its /metrics; 0 when that cannot be read. Only the
 * main thread samples, so one client serves. */
static uint64_t etcd_requests(void)
{
    static struct mg_http *h;
    char url[128], err[256];
    struct mg_http_response res;
    static const char name[] = "grpc_server_started_total{";
    struct mg_http_opts ho = {.proxy = ""};
    if (!h && mg_http_open(&h, &ho, err, sizeof(err)) < 0)
        return 0;
    snprintf(url, sizeof(url), "http://%s/metrics", etcd_ep);
    struct mg_http_request req = {.url = url, .timeout_ms = 5000, .abort_fd = -1};
    if (mg_http_request(h, &req, &res) < 0 || res.status != 200)
        return 0;
    double total = 0;
    for (const char *p = res.body; p && *p;) {
        const char *nl = strchr(p, '\n');
        if (!strncmp(p, name, sizeof(name) - 1)) {
            const char *v = strchr(p, '}');
            if (v && (!nl || v < nl))
                total += strtod(v + 1, NULL);
        }
        p = nl ? nl + 1 : NULL;
    }
    return (uint64_t)total;
}

static uint64_t read_requests(void)
{
    if (hosted_port)
        return atomic_load(&sh->host_requests);
    if (etcd_ep)
        return etcd_requests();
    if (!stats_file || server_pid <= 0)
        return 0;
    unlink(stats_file);
    kill(server_pid, SIGUSR1);
    for (int i = 0; i < 200; i++) {
        FILE *f = fopen(stats_file, "r");
        if (f) {
            char line[512];
            unsigned long long r = 0;
            const char *p;
            if (fgets(line, sizeof(line), f) && (p = strstr(line, "requests=")))
                r = strtoull(p + 9, NULL, 10);
            fclose(f);
            return r;
        }
        usleep(5000);
    }
    return 0;
}

void take(struct sample *s)
{
    char path[64], line[512];
    memset(s, 0, sizeof(*s));
    s->t = mg_now_ms();
    s->requests = read_requests();
    if (server_pid <= 0)
        return;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)server_pid);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fgets(line, sizeof(line), f)) {
            char *p = strrchr(line, ')');
            unsigned long ut = 0, st = 0;
            if (p &&
                sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2)
                s->cpu_s = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
        }
        fclose(f);
    }
    snprintf(path, sizeof(path), "/proc/%d/status", (int)server_pid);
    f = fopen(path, "r");
    if (f) {
        while (fgets(line, sizeof(line), f)) {
            if (!strncmp(line, "VmRSS:", 6))
                s->rss_kb = atol(line + 6);
            else if (!strncmp(line, "VmHWM:", 6))
                s->hwm_kb = atol(line + 6);
        }
        fclose(f);
    }
}

/* The probe: one more client, a GET every 10 ms; the worst latency seen. */
_Atomic int probe_stop;
_Atomic int64_t probe_max_us, probe_count, probe_errors;

/* One probe GET's latency, from a. */
static void probe_took(const struct timespec *a)
{
    struct timespec b;
    clock_gettime(CLOCK_MONOTONIC, &b);
    int64_t us = (b.tv_sec - a->tv_sec) * 1000000 + (b.tv_nsec - a->tv_nsec) / 1000;
    if (us > atomic_load(&probe_max_us))
        atomic_store(&probe_max_us, us);
    atomic_fetch_add(&probe_count, 1);
}

/* The probe of an etcd: a GET through the rendezvous' own etcd backend. */
static void *probe_etcd(const char *ep)
{
    struct mg_kv *kv;
    char err[512];
    struct mg_kv_etcd_opts o = {.endpoints = ep, .timeout_ms = 5000, .lease_ttl_ms = 5000};
    if (mg_kv_etcd_open(&kv, &o, err, sizeof(err)) < 0 ||
        kv->ops->set(kv, "/mg/probe", "x", 1, 0) < 0) {
        atomic_fetch_add(&probe_errors, 1);
        if (kv)
            kv->ops->release(kv);
        return NULL;
    }
    while (!atomic_load(&probe_stop)) {
        struct timespec a;
        char *v = NULL;
        size_t len;
        clock_gettime(CLOCK_MONOTONIC, &a);
        int rc = kv->ops->get(kv, "/mg/probe", &v, &len, NULL);
        free(v);
        if (rc < 0) {
            atomic_fetch_add(&probe_errors, 1);
            break;
        }
        probe_took(&a);
        usleep(10000);
    }
    kv->ops->release(kv);
    return NULL;
}

void *probe_main(void *arg)
{
    const char *ep = arg;
    struct mg_hostport hp;
    struct mg_store *st = NULL;
    if (etcd_ep)
        return probe_etcd(ep);
    if (mg_parse_hostport(ep, 0, &hp) < 0)
        return NULL;
    struct mg_store_opts o = {.host = hp.host, .port = hp.port, .timeout_ms = 5000};
    if (mg_store_connect(&st, &o) < 0) {
        atomic_fetch_add(&probe_errors, 1);
        return NULL;
    }
    mg_store_set(st, "probe", "x", 1, 0);
    while (!atomic_load(&probe_stop)) {
        struct timespec a;
        void *v = NULL;
        size_t len;
        clock_gettime(CLOCK_MONOTONIC, &a);
        int rc = mg_store_get(st, "probe", &v, &len, 0);
        free(v);
        if (rc < 0) {
            atomic_fetch_add(&probe_errors, 1);
            break;
        }
        probe_took(&a);
        usleep(10000);
    }
    mg_store_release(st);
    return NULL;
}

/* A flooder (--flood): one more client that writes GET requests as fast as
 * the socket takes them and never reads a reply. The store stops reading a
 * connection whose replies queue up (docs/store-protocol.md, Bounds), and
 * serves the others meanwhile. */
_Atomic int64_t flood_bytes;

void *flood_main(void *arg)
{
    const char *ep = arg;
    struct mg_hostport hp;
    struct mg_store *st = NULL;
    /* 64 GETs of "flood" without a wait, 23 bytes each: the header (body
     * length 11, opcode 3, id i), u32 timeout 0, the key (u16 5, "flood") */
    unsigned char frames[64 * 23];
    memset(frames, 0, sizeof(frames));
    for (int i = 0; i < 64; i++) {
        unsigned char *f = frames + i * 23;
        f[0] = 11;
        f[4] = 0x03;
        f[8] = (unsigned char)i;
        f[16] = 5;
        memcpy(f + 18, "flood", 5);
    }
    if (mg_parse_hostport(ep, 0, &hp) < 0)
        return NULL;
    struct mg_store_opts o = {.host = hp.host, .port = hp.port, .timeout_ms = 5000};
    if (mg_store_connect(&st, &o) < 0)
        return NULL;
    int fd = mg_store_fd(st);
    size_t off = 0;
    while (!atomic_load(&probe_stop)) {
        ssize_t w = send(fd, frames + off, sizeof(frames) - off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) {
            atomic_fetch_add(&flood_bytes, w);
            off = (off + (size_t)w) % sizeof(frames);
        } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            break; /* the store closed it */
        } else {
            usleep(1000); /* the socket is full: the store stopped reading it */
        }
    }
    mg_store_release(st);
    return NULL;
}

static const char *const op_names[OP_N] = {"get", "set",  "cas",  "add",
                                           "del", "list", "wait", "ping"};

uint64_t ops_line(int p, char *buf, size_t cap)
{
    uint64_t total = 0;
    size_t off = 0;
    buf[0] = 0;
    for (int op = 0; op < OP_N; op++) {
        uint64_t n = atomic_load(&sh->ops[p][op].n), us = atomic_load(&sh->ops[p][op].us);
        total += n;
        if (n && off < cap)
            off +=
                (size_t)snprintf(buf + off, cap - off, "%s%s=%llu/%lluus", off ? " " : "",
                                 op_names[op], (unsigned long long)n, (unsigned long long)(us / n));
    }
    return total;
}
