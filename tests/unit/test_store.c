/* The store server and client on loopback in one process: every call, the
 * blocking ones woken by other clients and by the hosting process, ephemeral
 * keys and leases, bounds, authentication, version mismatch, connect retry,
 * memory bounds, and the poll-loop integration the launcher uses. */
#include "mg_err.h"
#include "net.h"
#include "store.h"
#include "store_proto.h"
#include "tap.h"
#include "store_frames.h"

#include <errno.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

/* timeout: 120 */

static struct mg_store *conn(int port, const char *token, int lease_ms)
{
    struct mg_store_opts o = {.host = "127.0.0.1",
                              .port = port,
                              .token = token,
                              .connect_timeout_ms = 5000,
                              .timeout_ms = 5000,
                              .lease_ms = lease_ms};
    struct mg_store *st = NULL;
    int rc = mg_store_connect(&st, &o);
    if (rc)
        diag("connect to %d: %s", port, mg_strerror(rc));
    return st;
}

static int conn_rc(int port, const char *token)
{
    struct mg_store_opts o = {
        .port = port, .token = token, .connect_timeout_ms = 2000, .timeout_ms = 2000};
    struct mg_store *st = NULL;
    int rc = mg_store_connect(&st, &o);
    mg_store_release(st);
    return rc;
}

static struct mg_store_server *server(const char *token)
{
    struct mg_store_server_opts o = {.host = "127.0.0.1", .token = token};
    struct mg_store_server *srv;
    if (mg_store_server_start(&srv, &o) || mg_store_server_start_thread(srv))
        BAIL_OUT("cannot start a store server");
    return srv;
}

/* Something to do from another thread after a delay. */
struct later {
    int port;
    struct mg_store_server *srv; /* local set when non-NULL */
    const char *key, *val;
    int delay_ms;
    int del;
    pthread_t th;
};

static void *later_run(void *arg)
{
    struct later *l = arg;
    poll(NULL, 0, l->delay_ms);
    if (l->srv) {
        mg_store_server_local_set(l->srv, l->key, l->val, strlen(l->val), 0);
        return NULL;
    }
    struct mg_store *st = conn(l->port, NULL, 0);
    if (!st)
        return NULL;
    if (l->del)
        mg_store_delete(st, l->key);
    else
        mg_store_set(st, l->key, l->val, strlen(l->val), 0);
    mg_store_release(st);
    return NULL;
}

static void later_start(struct later *l)
{
    pthread_create(&l->th, NULL, later_run, l);
}

static void later_join(struct later *l)
{
    pthread_join(l->th, NULL);
}

static int wait_stat(struct mg_store_server *srv, int clients, int ms)
{
    struct mg_store_server_stats s;
    int64_t end = mg_now_ms() + ms;
    do {
        mg_store_server_stats(srv, &s);
        if (s.clients == clients)
            return 1;
        poll(NULL, 0, 5);
    } while (mg_now_ms() < end);
    diag("clients: %d, want %d", s.clients, clients);
    return 0;
}

static void basic_calls(int port)
{
    struct mg_store *st = conn(port, NULL, 0);
    void *v = NULL;
    size_t len = 0;
    int64_t n = 0;

    ok(st != NULL, "client connects");
    is_int(mg_store_ping(st), 0, "ping");
    is_int(mg_store_set(st, "a", "hello", 5, 0), 0, "set a");
    is_int(mg_store_get(st, "a", &v, &len, 0), 0, "get a");
    ok(len == 5 && v && strcmp(v, "hello") == 0, "value round-trips, NUL-terminated");
    free(v);
    is_int(mg_store_set(st, "bin", "x\0y", 3, 0), 0, "binary value");
    mg_store_get(st, "bin", &v, &len, 0);
    ok(len == 3 && memcmp(v, "x\0y", 3) == 0, "binary value intact");
    free(v);
    is_int(mg_store_set(st, "empty", "", 0, 0), 0, "empty value");
    v = NULL;
    is_int(mg_store_get(st, "empty", &v, &len, 0), 0, "get empty value");
    ok(v && len == 0, "empty value has length 0");
    free(v);
    is_int(mg_store_get(st, "missing", &v, &len, 0), -MG_ENOKEY, "missing key, no wait: ENOKEY");
    is_int(mg_store_get(st, "missing", &v, &len, 50), -ETIMEDOUT, "missing key, wait: ETIMEDOUT");

    is_int(mg_store_add(st, "ctr", 5, &n), 0, "add to a missing key");
    is_int(n, 5, "starts from 0");
    mg_store_add(st, "ctr", -7, &n);
    is_int(n, -2, "negative delta");
    mg_store_get(st, "ctr", &v, &len, 0);
    is_str(v, "-2", "stored as decimal text");
    free(v);
    is_int(mg_store_add(st, "a", 1, &n), -ERANGE, "add to a non-integer: ERANGE");
    mg_store_set(st, "big", "9223372036854775807", 19, 0);
    is_int(mg_store_add(st, "big", 1, &n), -ERANGE, "add overflow: ERANGE");

    void *cur = NULL;
    size_t cl = 0;
    is_int(mg_store_compare_set(st, "cas", NULL, 0, "v1", 2, &cur, &cl), 1,
           "compare_set on absent key swaps");
    ok(cur && cl == 2 && memcmp(cur, "v1", 2) == 0, "current is the new value");
    free(cur);
    is_int(mg_store_compare_set(st, "cas", NULL, 0, "v2", 2, &cur, &cl), 0,
           "expect-absent on existing key does not swap");
    ok(cur && memcmp(cur, "v1", 2) == 0, "current is the old value");
    free(cur);
    is_int(mg_store_compare_set(st, "cas", "v1", 2, "v3", 2, NULL, NULL), 1, "matching swap");
    is_int(mg_store_compare_set(st, "cas", "v1", 2, "v4", 2, &cur, &cl), 0, "stale expected");
    ok(cur && memcmp(cur, "v3", 2) == 0, "current after failed swap");
    free(cur);
    is_int(mg_store_compare_set(st, "nocas", "x", 1, "y", 1, &cur, &cl), 0,
           "expected value on absent key: no swap");
    ok(cur == NULL && cl == 0, "current NULL for absent key");

    const char *keys[] = {"a", "ctr", "cas"};
    is_int(mg_store_check(st, keys, 3), 1, "check: all present");
    const char *keys2[] = {"a", "nope"};
    is_int(mg_store_check(st, keys2, 2), 0, "check: one missing");
    is_int(mg_store_wait(st, keys, 3, 100), 0, "wait: present at once");
    is_int(mg_store_wait(st, keys2, 2, 50), -ETIMEDOUT, "wait: times out");
    is_int(mg_store_wait(st, keys2, 2, 0), -ETIMEDOUT, "wait 0: checks once");

    is_int(mg_store_delete(st, "a"), 1, "delete existing");
    is_int(mg_store_delete(st, "a"), 0, "delete again: did not exist");
    is_int(mg_store_get(st, "a", &v, &len, 0), -MG_ENOKEY, "deleted key is gone");

    mg_store_set(st, "ls/b", "1", 1, 0);
    mg_store_set(st, "ls/a", "1", 1, 0);
    mg_store_set(st, "ls/c/d", "1", 1, 0);
    mg_store_set(st, "lt", "1", 1, 0);
    char **list;
    int nl;
    is_int(mg_store_list(st, "ls/", -1, &list, &nl), 3, "list: 3 keys match the prefix");
    ok(nl == 3 && !strcmp(list[0], "ls/a") && !strcmp(list[1], "ls/b") &&
           !strcmp(list[2], "ls/c/d"),
       "list is sorted");
    mg_store_free_list(list, nl);
    is_int(mg_store_list(st, "ls/", 2, &list, &nl), 3, "list with max: total still 3");
    ok(nl == 2 && !strcmp(list[1], "ls/b"), "list with max: first 2");
    mg_store_free_list(list, nl);
    is_int(mg_store_list(st, "zz", -1, &list, &nl), 0, "list: no match");
    is_int(nl, 0, "no keys");
    mg_store_free_list(list, nl);
    int all = mg_store_list(st, "", -1, &list, &nl);
    ok(all >= 9 && nl == all, "empty prefix lists everything (%d)", all);
    mg_store_free_list(list, nl);
    mg_store_release(st);
}

static void blocking_calls(struct mg_store_server *srv, int port)
{
    struct mg_store *st = conn(port, NULL, 0);
    void *v = NULL;
    size_t len;
    int64_t rev, rev2;

    struct later l1 = {.port = port, .key = "late", .val = "soon", .delay_ms = 50};
    later_start(&l1);
    is_int(mg_store_get(st, "late", &v, &len, 5000), 0, "get waits for another client's set");
    is_str(v, "soon", "and returns its value");
    free(v);
    later_join(&l1);

    struct later l2 = {.srv = srv, .key = "local", .val = "host", .delay_ms = 50};
    later_start(&l2);
    is_int(mg_store_get(st, "local", &v, &len, 5000), 0, "get waits for the host's local set");
    is_str(v, "host", "local value");
    free(v);
    later_join(&l2);

    const char *keys[] = {"w1", "w2"};
    struct later l3 = {.port = port, .key = "w1", .val = "1", .delay_ms = 20};
    struct later l4 = {.port = port, .key = "w2", .val = "1", .delay_ms = 60};
    later_start(&l3);
    later_start(&l4);
    is_int(mg_store_wait(st, keys, 2, 5000), 0, "wait for two keys set by others");
    later_join(&l3);
    later_join(&l4);

    mg_store_set(st, "wk", "v1", 2, 0);
    is_int(mg_store_watch(st, "wk", -1, 0, &rev, &v, &len), 0, "watch since -1: at once");
    ok(rev > 0 && v && !strcmp(v, "v1"), "current revision %lld and value", (long long)rev);
    free(v);
    is_int(mg_store_watch(st, "wk", rev, 50, &rev2, &v, &len), -ETIMEDOUT,
           "watch without change times out");
    is_int(mg_store_watch(st, "wk", rev - 1, 50, &rev2, NULL, NULL), 0,
           "watch with an older revision returns at once");
    is_int(rev2, rev, "with the key's revision");
    struct later l5 = {.port = port, .key = "wk", .val = "v2", .delay_ms = 30};
    later_start(&l5);
    is_int(mg_store_watch(st, "wk", rev, 5000, &rev2, &v, &len), 0, "watch wakes on a set");
    ok(rev2 > rev && v && !strcmp(v, "v2"), "new revision and value");
    free(v);
    later_join(&l5);
    struct later l6 = {.port = port, .key = "wk", .del = 1, .delay_ms = 30};
    later_start(&l6);
    v = (void *)1;
    is_int(mg_store_watch(st, "wk", rev2, 5000, &rev, &v, &len), 0, "watch wakes on a delete");
    ok(rev > rev2 && v == NULL && len == 0, "reports the key absent");
    later_join(&l6);
    is_int(mg_store_watch(st, "wk", rev - 1, 0, &rev2, &v, &len), 0,
           "a tombstone keeps the deletion revision");
    ok(rev2 == rev && v == NULL, "watch on a deleted key since before its deletion");
    is_int(mg_store_watch(st, "never", 0, 30, &rev, NULL, NULL), -ETIMEDOUT,
           "watch on a key that never existed waits for its creation");

    mg_store_release(st);
}

static void ephemeral_and_leases(struct mg_store_server *srv, int port)
{
    struct mg_store *w = conn(port, NULL, 0), *e = conn(port, NULL, 0);
    int64_t rev, rev2;
    void *v;
    size_t len;
    struct mg_store_server_stats s0, s1;

    is_int(mg_store_set(e, "eph/1", "alive", 5, MG_STORE_EPHEMERAL), 0, "ephemeral set");
    mg_store_watch(w, "eph/1", -1, 0, &rev, NULL, NULL);
    mg_store_release(e);
    is_int(mg_store_watch(w, "eph/1", rev, 5000, &rev2, &v, &len), 0,
           "watcher wakes when the owner disconnects");
    ok(rev2 > rev && v == NULL, "the ephemeral key is gone, with a new revision");

    /* A plain set takes an ephemeral key over. */
    e = conn(port, NULL, 0);
    mg_store_set(e, "eph/2", "x", 1, MG_STORE_EPHEMERAL);
    mg_store_set(w, "eph/2", "y", 1, 0);
    mg_store_release(e);
    ok(wait_stat(srv, 1, 2000), "owner gone");
    is_int(mg_store_get(w, "eph/2", &v, &len, 0), 0, "a key made persistent survives its owner");
    free(v);

    /* Lease: a client that stops sending but keeps its socket open. */
    mg_store_server_stats(srv, &s0);
    struct mg_store *l = conn(port, NULL, 200);
    ok(l != NULL, "client with a 200 ms lease");
    mg_store_set(l, "hb/node1", "1", 1, MG_STORE_EPHEMERAL);
    mg_store_watch(w, "hb/node1", -1, 0, &rev, NULL, NULL);
    is_int(mg_store_watch(w, "hb/node1", rev, 5000, &rev2, &v, &len), 0,
           "silent leaseholder: its key is deleted after the lease");
    ok(v == NULL, "heartbeat key absent");
    mg_store_server_stats(srv, &s1);
    is_int(s1.leases_expired - s0.leases_expired, 1, "one lease expired");
    is_int(mg_store_ping(l), -MG_ECLOSED, "the expired client finds its connection closed");
    is_int(mg_store_ping(l), -MG_ECLOSED, "and stays closed");
    mg_store_release(l);

    /* Pinging in time keeps it (wide margins: the machine may be loaded). */
    l = conn(port, NULL, 600);
    mg_store_set(l, "hb/node2", "1", 1, MG_STORE_EPHEMERAL);
    int alive = 1;
    for (int i = 0; i < 16; i++) {
        poll(NULL, 0, 50);
        alive &= mg_store_ping(l) == 0;
    }
    ok(alive, "pings every 50 ms keep a 600 ms lease past its length");
    is_int(mg_store_get(w, "hb/node2", &v, &len, 0), 0, "key still there");
    free(v);
    /* A blocking call longer than the lease: the client pings by itself. */
    struct later la = {.port = port, .key = "after-lease", .val = "1", .delay_ms = 1500};
    later_start(&la);
    is_int(mg_store_get(l, "after-lease", &v, &len, 5000), 0,
           "a 1500 ms blocking get on a 600 ms lease succeeds (the client pings meanwhile)");
    free(v);
    later_join(&la);
    is_int(mg_store_get(w, "hb/node2", &v, &len, 0), 0, "ephemeral key survived the long call");
    free(v);
    mg_store_release(l);
    mg_store_release(w);
    ok(wait_stat(srv, 0, 2000), "every connection is gone after release");
    mg_store_server_stats(srv, &s1);
    is_int(s1.waiters, 0, "no parked request left behind");
}

static void bounds(int port)
{
    struct mg_store *st = conn(port, NULL, 0);
    char key[MG_STORE_MAX_KEY + 2];
    void *v;
    size_t len;

    memset(key, 'k', sizeof(key));
    key[MG_STORE_MAX_KEY] = '\0';
    is_int(mg_store_set(st, key, "1", 1, 0), 0, "key of MG_STORE_MAX_KEY bytes");
    key[MG_STORE_MAX_KEY] = 'k';
    key[MG_STORE_MAX_KEY + 1] = '\0';
    is_int(mg_store_set(st, key, "1", 1, 0), -MG_ETOOBIG, "key one byte longer: ETOOBIG");
    is_int(mg_store_set(st, "", "1", 1, 0), -EINVAL, "empty key: EINVAL");
    is_int(mg_store_set(st, "x", "1", 1, 0x10), -EINVAL, "unknown flag: EINVAL");

    size_t big = MG_STORE_MAX_VALUE;
    char *val = malloc(big + 1);
    for (size_t i = 0; i < big + 1; i++)
        val[i] = (char)(i * 131 + 7);
    is_int(mg_store_set(st, "big", val, big, 0), 0, "16 MiB value");
    v = NULL;
    is_int(mg_store_get(st, "big", &v, &len, 0), 0, "get 16 MiB value");
    ok(v && len == big && memcmp(v, val, big) == 0, "16 MiB value intact");
    free(v);
    is_int(mg_store_set(st, "big", val, big + 1, 0), -MG_ETOOBIG, "value one byte over: ETOOBIG");
    is_int(mg_store_compare_set(st, "big", val, big, "small", 5, NULL, NULL), 1,
           "compare_set against a 16 MiB value");
    free(val);
    is_int(mg_store_ping(st), 0, "connection fine after the refusals");

    const char *keys[MG_STORE_MAX_WAIT_KEYS + 1];
    for (int i = 0; i <= MG_STORE_MAX_WAIT_KEYS; i++)
        keys[i] = "big";
    is_int(mg_store_check(st, keys, MG_STORE_MAX_WAIT_KEYS), 1, "check with the most keys");
    is_int(mg_store_check(st, keys, MG_STORE_MAX_WAIT_KEYS + 1), -MG_ETOOBIG,
           "one key more: ETOOBIG");
    keys[3] = "absent-1";
    keys[7] = "absent-1"; /* the same missing key twice in one wait */
    is_int(mg_store_wait(st, keys, MG_STORE_MAX_WAIT_KEYS, 20), -ETIMEDOUT,
           "wait on many keys, one repeated and missing");
    is_int(mg_store_ping(st), 0, "server fine after the repeated key");
    mg_store_release(st);
}

/* A fake server that answers the hello with whatever it is given. */
struct fake {
    int lfd, port;
    uint8_t reply[MG_SP_SHELLO_LEN];
    pthread_t th;
};

static void *fake_run(void *arg)
{
    struct fake *f = arg;
    int fd = accept(f->lfd, NULL, NULL);
    uint8_t hello[MG_SP_HELLO_LEN];
    if (fd >= 0 && mg_read_full(fd, hello, sizeof(hello), mg_now_ms() + 5000) == 0)
        mg_write_full(fd, f->reply, sizeof(f->reply), mg_now_ms() + 5000);
    poll(NULL, 0, 50);
    if (fd >= 0)
        close(fd);
    return NULL;
}

static int fake_connect(const uint8_t *reply)
{
    struct fake f;
    f.lfd = mg_listen_tcp("127.0.0.1", 0, 4, &f.port);
    memcpy(f.reply, reply, sizeof(f.reply));
    pthread_create(&f.th, NULL, fake_run, &f);
    int rc = conn_rc(f.port, NULL);
    pthread_join(f.th, NULL);
    close(f.lfd);
    return rc;
}

static void handshakes(void)
{
    struct mg_store_server *srv = server("s3cret");
    int port = mg_store_server_port(srv);
    struct mg_store *st = conn(port, "s3cret", 0);
    ok(st != NULL, "right token: connected");
    ok(st && mg_store_set(st, "k", "v", 1, 0) == 0, "and works");
    mg_store_release(st);
    is_int(conn_rc(port, "wrong"), -MG_EAUTH, "wrong token: EAUTH");
    is_int(conn_rc(port, NULL), -MG_EAUTH, "no token against a server that wants one: EAUTH");
    struct mg_store_server_stats s;
    ok(wait_stat(srv, 0, 2000), "rejected clients are dropped");
    mg_store_server_stats(srv, &s);
    ok(s.dropped >= 2, "and counted as dropped (%llu)", (unsigned long long)s.dropped);
    mg_store_server_release(srv);

    srv = server(NULL);
    port = mg_store_server_port(srv);
    is_int(conn_rc(port, "s3cret"), -MG_EAUTH,
           "a token against a server without one: EAUTH (it cannot prove the token)");

    /* A raw client speaking a future version gets a clean answer. */
    int fd = mg_connect_tcp("127.0.0.1", port, mg_now_ms() + 2000);
    struct mg_sp_hello h = {.version = 2};
    uint8_t buf[MG_SP_HELLO_LEN];
    struct mg_sp_shello sh;
    mg_sp_hello_encode(buf, &h);
    mg_write_full(fd, buf, sizeof(buf), mg_now_ms() + 2000);
    is_int(mg_read_full(fd, buf, MG_SP_SHELLO_LEN, mg_now_ms() + 2000), 0, "server answers v2");
    mg_sp_shello_decode(buf, &sh);
    is_int(sh.status, MG_SP_VERSION, "with status VERSION");
    is_int(sh.version, MG_SP_WIRE_VERSION, "and its own version");
    is_int(mg_read_full(fd, buf, 1, mg_now_ms() + 2000), -MG_ECLOSED, "then closes");
    close(fd);
    mg_store_server_release(srv);

    struct mg_sp_shello v2 = {.version = 2, .status = MG_SP_VERSION};
    uint8_t reply[MG_SP_SHELLO_LEN];
    mg_sp_shello_encode(reply, &v2);
    is_int(fake_connect(reply), -MG_EVERSION, "client: a server of another version: EVERSION");
    memcpy(reply, "HTTP", 4);
    is_int(fake_connect(reply), -MG_EPROTO, "client: not an mg store: EPROTO");
}

struct delayed_server {
    int port;
    struct mg_store_server *srv;
    pthread_t th;
};

static void *delayed_start(void *arg)
{
    struct delayed_server *d = arg;
    poll(NULL, 0, 300);
    struct mg_store_server_opts o = {.host = "127.0.0.1", .port = d->port};
    if (mg_store_server_start(&d->srv, &o) == 0)
        mg_store_server_start_thread(d->srv);
    return NULL;
}

static void connect_retry(void)
{
    int port = 0, lfd = mg_listen_tcp("127.0.0.1", 0, 1, &port);
    close(lfd);
    struct delayed_server d = {.port = port};
    pthread_create(&d.th, NULL, delayed_start, &d);
    struct mg_store *st = conn(port, NULL, 0);
    ok(st != NULL, "connect retries until the server comes up");
    pthread_join(d.th, NULL);
    mg_store_release(st);
    mg_store_server_release(d.srv);

    struct mg_store_opts o = {.host = "no-such-host.invalid", .port = 1, .connect_timeout_ms = 200};
    int rc = mg_store_connect(&st, &o);
    ok(rc == -MG_ENONAME || rc == -MG_ERESOLVE, "unresolvable name: %s after retrying",
       mg_strerror(rc));
    o.host = "127.0.0.1";
    o.port = port;
    rc = mg_store_connect(&st, &o);
    is_int(rc, -ECONNREFUSED, "nobody listening: ECONNREFUSED after retrying");
}

static void local_access(struct mg_store_server *srv, int port)
{
    struct mg_store *st = conn(port, NULL, 0);
    size_t len = 0;
    int64_t rev = 0, crev = -1;
    is_int(mg_store_server_local_set(srv, "loc", "abc", 3, 0), 0, "local set");
    void *v;
    mg_store_get(st, "loc", &v, &len, 0);
    is_str(v, "abc", "client sees the local set");
    free(v);
    mg_store_set(st, "rem", "remote", 6, 0);
    v = NULL;
    is_int(mg_store_server_local_get(srv, "rem", &v, &len, &rev), 0, "local get");
    ok(v && len == 6 && memcmp(v, "remote", 6) == 0, "sees the client's set");
    ok(v && ((char *)v)[len] == '\0', "a NUL-terminated copy");
    mg_store_watch(st, "rem", -1, 0, &crev, NULL, NULL);
    ok(rev > 0 && rev == crev, "with the key's revision, as a client's watch reports it");
    free(v);
    is_int(mg_store_server_local_get(srv, "nokey", &v, &len, NULL), -MG_ENOKEY, "local miss");
    mg_store_release(st);
}

static void memory_bounds(void)
{
    struct mg_store_server_opts o = {.host = "127.0.0.1", .max_store_bytes = 1 << 20};
    struct mg_store_server *srv;
    mg_store_server_start(&srv, &o);
    mg_store_server_start_thread(srv);
    int port = mg_store_server_port(srv);
    struct mg_store *a = conn(port, NULL, 0), *b = conn(port, NULL, 0);
    char *val = calloc(1, 2 << 20);
    is_int(mg_store_set(a, "huge", val, 2 << 20, 0), -ENOSPC, "over max_store_bytes: ENOSPC");
    is_int(mg_store_set(a, "fits", val, 1000, 0), 0, "a small value still fits");
    for (int i = 0; i < 3; i++)
        mg_store_set(a, "fits", val, 700 << 10, 0); /* replacing must not count twice */
    is_int(mg_store_set(a, "fits", val, 700 << 10, 0), 0, "replacing a value reuses its room");
    free(val);

    mg_store_release(a);
    mg_store_release(b);
    mg_store_server_release(srv);
}

/* Two parked requests against max_waiters = 1: the second is refused. */
struct parked {
    int port;
    int rc;
};

static void *park_one(void *arg)
{
    struct parked *p = arg;
    struct mg_store *st = conn(p->port, NULL, 0);
    void *v = NULL;
    size_t len;
    p->rc = mg_store_get(st, "gate", &v, &len, 5000);
    free(v);
    mg_store_release(st);
    return NULL;
}

static void waiter_bound(void)
{
    struct mg_store_server_opts o = {.host = "127.0.0.1", .max_waiters = 1};
    struct mg_store_server *srv;
    struct mg_store_server_stats s;
    mg_store_server_start(&srv, &o);
    mg_store_server_start_thread(srv);
    int port = mg_store_server_port(srv);
    struct parked p = {.port = port, .rc = 1};
    pthread_t th;
    pthread_create(&th, NULL, park_one, &p);
    int64_t end = mg_now_ms() + 5000;
    do {
        poll(NULL, 0, 5);
        mg_store_server_stats(srv, &s);
    } while (s.waiters < 1 && mg_now_ms() < end);
    is_int(s.waiters, 1, "one request parked");
    struct mg_store *st = conn(port, NULL, 0);
    void *v;
    size_t len;
    is_int(mg_store_get(st, "gate", &v, &len, 1000), -EBUSY,
           "a second one over max_waiters: EBUSY");
    mg_store_set(st, "gate", "open", 4, 0);
    pthread_join(th, NULL);
    is_int(p.rc, 0, "the parked one is answered");
    mg_store_release(st);
    mg_store_server_release(srv);
}

/* The launcher's way: the caller's own poll loop. */
struct loop {
    struct mg_store_server *srv;
    volatile int stop, paused, pause_ack;
    volatile int saw_deadline; /* a timeout between 20 and 300 ms: the parked get's */
    pthread_t th;
};

static void *loop_run(void *arg)
{
    struct loop *l = arg;
    struct pollfd fds[64];
    while (!l->stop) {
        l->pause_ack = l->paused;
        if (l->paused) {
            poll(NULL, 0, 5);
            continue;
        }
        int n = mg_store_server_pollfds(l->srv, fds, 64);
        int t = mg_store_server_timeout_ms(l->srv);
        if (t > 20 && t <= 300)
            l->saw_deadline = 1;
        if (t < 0 || t > 20)
            t = 20; /* to notice stop */
        poll(fds, (nfds_t)n, t);
        mg_store_server_process(l->srv, fds, n);
    }
    return NULL;
}

static void poll_loop_mode(void)
{
    struct mg_store_server_opts o = {.host = "127.0.0.1"};
    struct loop l = {0};
    mg_store_server_start(&l.srv, &o);
    int port = mg_store_server_port(l.srv);
    is_int(mg_store_server_timeout_ms(l.srv), -1, "idle server: no timeout");
    struct pollfd few[1];
    is_int(mg_store_server_pollfds(l.srv, few, 0), -ENOSPC, "pollfds: ENOSPC when too few");
    ok(mg_store_server_nfds(l.srv) >= 1, "nfds says how many");
    pthread_create(&l.th, NULL, loop_run, &l);
    struct mg_store *st = conn(port, NULL, 0);
    ok(st != NULL, "poll-loop server: connected");
    is_int(mg_store_set(st, "p", "1", 1, 0), 0, "poll-loop server: set");
    void *v;
    size_t len;
    struct later lt = {.port = port, .key = "pl", .val = "x", .delay_ms = 50};
    later_start(&lt);
    is_int(mg_store_get(st, "pl", &v, &len, 5000), 0, "poll-loop server: blocking get woken");
    free(v);
    later_join(&lt);
    is_int(mg_store_get(st, "never", &v, &len, 300), -ETIMEDOUT,
           "poll-loop server: parked get times out");
    ok(l.saw_deadline, "timeout_ms followed the parked request's deadline");
    mg_store_release(st);

    /* A reply that comes after its call gave up is skipped by the next call. */
    struct mg_store_opts qo = {.port = port, .timeout_ms = 50};
    struct mg_store *quick;
    mg_store_connect(&quick, &qo);
    l.paused = 1;
    while (!l.pause_ack)
        poll(NULL, 0, 1);
    is_int(mg_store_set(quick, "q", "1", 1, 0), -ETIMEDOUT, "server stalled: the call times out");
    l.paused = 0;
    is_int(mg_store_set(quick, "q", "22", 2, 0), 0, "next call works, skipping the late reply");
    is_int(mg_store_get(quick, "q", &v, &len, 0), 0, "and the replies stay in step");
    is_str(v, "22", "with the right value");
    free(v);
    mg_store_release(quick);
    l.stop = 1;
    pthread_join(l.th, NULL);
    mg_store_server_release(l.srv);
}

/* Many clients at once, each with a handful of calls (a rendezvous). */
struct agent {
    int port, rank, n, rc;
    pthread_t th;
};

static void *agent_run(void *arg)
{
    struct agent *a = arg;
    struct mg_store *st = conn(a->port, NULL, 0);
    char key[32];
    int64_t r;
    a->rc = -1;
    if (!st)
        return NULL;
    snprintf(key, sizeof(key), "agent/%d", a->rank);
    if (mg_store_set(st, key, "up", 2, MG_STORE_EPHEMERAL) || mg_store_add(st, "joined", 1, &r))
        goto out;
    const char *k = "joined";
    char want[16];
    snprintf(want, sizeof(want), "%d", a->n);
    /* wait until everyone joined: watch the counter */
    int64_t rev = -1;
    for (;;) {
        void *v = NULL;
        size_t len;
        if (mg_store_watch(st, k, rev, 10000, &rev, &v, &len))
            goto out;
        int done = v && strcmp(v, want) == 0;
        free(v);
        if (done)
            break;
    }
    a->rc = 0;
out:
    mg_store_release(st);
    return NULL;
}

static void many_clients(struct mg_store_server *srv, int port)
{
    enum {
        N = 64
    };
    static struct agent ag[N];
    for (int i = 0; i < N; i++) {
        ag[i] = (struct agent){.port = port, .rank = i, .n = N};
        pthread_create(&ag[i].th, NULL, agent_run, &ag[i]);
    }
    int good = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(ag[i].th, NULL);
        good += ag[i].rc == 0;
    }
    is_int(good, N, "%d concurrent agents join and all see the full count", N);
    ok(wait_stat(srv, 0, 3000), "all agents gone");
    struct mg_store *st = conn(port, NULL, 0);
    char **keys;
    int nk;
    is_int(mg_store_list(st, "agent/", -1, &keys, &nk), 0, "their ephemeral keys are gone");
    mg_store_free_list(keys, nk);
    mg_store_release(st);
}

/* The host goes away (rank 0 exits): a parked client learns it at once. */
struct blocked {
    int port, rc;
    int64_t took_ms;
};

static void *block_get(void *arg)
{
    struct blocked *b = arg;
    struct mg_store *st = conn(b->port, NULL, 0);
    void *v = NULL;
    size_t len;
    int64_t t0 = mg_now_ms();
    b->rc = mg_store_get(st, "never-set", &v, &len, 20000);
    b->took_ms = mg_now_ms() - t0;
    if (!b->rc)
        free(v);
    if (b->rc == -MG_ECLOSED)
        b->rc = mg_store_ping(st) == -MG_ECLOSED ? b->rc : 0;
    mg_store_release(st);
    return NULL;
}

static void server_goes_away(void)
{
    struct mg_store_server *srv = server(NULL);
    struct mg_store_server_stats s;
    struct blocked b = {.port = mg_store_server_port(srv)};
    pthread_t th;
    pthread_create(&th, NULL, block_get, &b);
    int64_t end = mg_now_ms() + 5000;
    do {
        poll(NULL, 0, 5);
        mg_store_server_stats(srv, &s);
    } while (s.waiters < 1 && mg_now_ms() < end);
    mg_store_server_release(srv);
    pthread_join(th, NULL);
    is_int(b.rc, -MG_ECLOSED, "server released under a parked get: the client gets ECLOSED");
    ok(b.took_ms < 15000, "long before the get's own timeout");
}

/* At max_clients new connections wait in the backlog until one leaves. */
static void client_limit(void)
{
    struct mg_store_server_opts o = {.host = "127.0.0.1", .max_clients = 2};
    struct mg_store_server *srv;
    mg_store_server_start(&srv, &o);
    mg_store_server_start_thread(srv);
    int port = mg_store_server_port(srv);
    struct mg_store *a = conn(port, NULL, 0), *b = conn(port, NULL, 0), *c;
    struct mg_store_opts qo = {.port = port, .connect_timeout_ms = 300, .timeout_ms = 300};
    is_int(mg_store_connect(&c, &qo), -MG_ENOANSWER,
           "a third client waits at max_clients = 2: connected, its hello not answered");
    ok(wait_stat(srv, 2, 2000), "the server holds 2 connections");
    mg_store_release(a);
    c = conn(port, NULL, 0);
    ok(c != NULL, "once one leaves, the next gets in");
    ok(c && mg_store_ping(c) == 0, "and is served");
    mg_store_release(b);
    mg_store_release(c);
    mg_store_server_release(srv);
}

/* Many keys: the table grows, deletions beyond the tombstone cap are
 * forgotten, and watches on forgotten keys answer at once. */
/* LIST reads an ordered index that sets and deletes keep, and shares the
 * keys of one reply with the same list at the same revision: keys set in a
 * scrambled order, some deleted, come back sorted and complete for every
 * prefix, and a change between two equal lists shows in the second. */
static void list_index(void)
{
    struct mg_store_server *srv = server(NULL);
    struct mg_store *st = conn(mg_store_server_port(srv), NULL, 0);
    enum {
        N = 3000
    };
    char key[48], want[48];
    int bad = 0, deleted = 0;
    /* 1777 is prime to N: every i once, in a scrambled order. */
    for (int k = 0; k < N; k++) {
        int i = (int)((k * 1777L) % N);
        snprintf(key, sizeof(key), "ix/%c/%04d", 'a' + i % 3, i);
        bad += mg_store_set(st, key, "v", 1, 0) != 0;
    }
    for (int i = 0; i < N; i += 7) { /* delete every 7th */
        snprintf(key, sizeof(key), "ix/%c/%04d", 'a' + i % 3, i);
        bad += mg_store_delete(st, key) != 1;
        deleted++;
    }
    is_int(bad, 0, "%d keys set in a scrambled order, %d deleted", N, deleted);
    mg_store_set(st, "ix", "v", 1, 0);   /* the prefix itself, shorter */
    mg_store_set(st, "ix0", "v", 1, 0);  /* past the run of "ix/" */
    mg_store_set(st, "iw/z", "v", 1, 0); /* before it */
    for (int p = 0; p < 3; p++) {
        char prefix[8], **keys;
        int nk, n, expect = 0, order = 0;
        snprintf(prefix, sizeof(prefix), "ix/%c/", 'a' + p);
        n = mg_store_list(st, prefix, -1, &keys, &nk);
        for (int i = p, j = 0; i < N; i += 3) {
            if (i % 7 == 0)
                continue;
            snprintf(want, sizeof(want), "ix/%c/%04d", 'a' + p, i);
            order += j < nk && strcmp(keys[j], want) == 0;
            j++;
            expect++;
        }
        ok(n == expect && nk == expect && order == expect, "prefix %s: %d keys, all, in order (%d)",
           prefix, expect, n);
        mg_store_free_list(keys, nk);
    }
    char **keys;
    int nk;
    int all = mg_store_list(st, "ix", -1, &keys, &nk);
    ok(all == N - deleted + 2 && nk == all && !strcmp(keys[0], "ix") &&
           !strcmp(keys[nk - 1], "ix0"),
       "prefix \"ix\": the key equal to it first, the one past the run last (%d)", all);
    mg_store_free_list(keys, nk);
    int before = mg_store_list(st, "ix/a/", 5, &keys, &nk);
    mg_store_free_list(keys, nk);
    mg_store_set(st, "ix/a/0000x", "v", 1, 0);
    int after = mg_store_list(st, "ix/a/", 5, &keys, &nk);
    ok(after == before + 1 && nk == 5 && !strcmp(keys[0], "ix/a/0000x"),
       "the same list after a change has the new key (%d, then %d)", before, after);
    mg_store_free_list(keys, nk);
    mg_store_release(st);
    mg_store_server_release(srv);
}

static void many_keys(void)
{
    struct mg_store_server *srv = server(NULL);
    struct mg_store *st = conn(mg_store_server_port(srv), NULL, 0);
    char key[32];
    int bad = 0;
    enum {
        N = 20000
    };
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof(key), "many/%05d", i);
        bad += mg_store_set(st, key, key, strlen(key), 0) != 0;
    }
    is_int(bad, 0, "%d keys set", N);
    char **keys;
    int nk;
    is_int(mg_store_list(st, "many/", 0, &keys, &nk), N, "list with max 0 counts them");
    is_int(nk, 0, "and returns none");
    mg_store_free_list(keys, nk);
    is_int(mg_store_list(st, "many/1", 3, &keys, &nk), 10000, "a narrower prefix");
    ok(nk == 3 && !strcmp(keys[0], "many/10000") && !strcmp(keys[2], "many/10002"),
       "first keys in order");
    mg_store_free_list(keys, nk);
    int64_t first_rev;
    mg_store_watch(st, "many/00000", -1, 0, &first_rev, NULL, NULL);
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof(key), "many/%05d", i);
        bad += mg_store_delete(st, key) != 1;
    }
    is_int(bad, 0, "all deleted");
    int64_t rev;
    void *v = (void *)1;
    size_t len;
    is_int(mg_store_watch(st, "many/00000", first_rev, 0, &rev, &v, &len), 0,
           "watch on a key whose deletion was forgotten answers at once");
    ok(rev > first_rev && v == NULL, "reporting it absent, at a later revision");
    is_int(mg_store_watch(st, "many/19999", first_rev + 2 * N - 2, 0, &rev, NULL, NULL), 0,
           "a remembered deletion keeps its own revision");
    is_int(rev, first_rev + 2 * N - 1, "the last deletion's revision");
    struct mg_store_server_stats s;
    mg_store_server_stats(srv, &s);
    is_int(s.keys, 0, "no key left");
    ok(s.stored_bytes < 16384 * 200, "stored bytes bounded by the remembered deletions (%zu)",
       s.stored_bytes);
    mg_store_release(st);
    mg_store_server_release(srv);
}

/* A raw client pipelines many large GETs before reading anything: the server
 * stops reading it while its replies pile up, and must resume the buffered
 * requests once the client drains them. */
static void pipelined_backpressure(void)
{
    struct mg_store_server *srv = server(NULL);
    int port = mg_store_server_port(srv);
    size_t vlen = 1 << 20;
    char *val = malloc(vlen);
    memset(val, 'p', vlen);
    mg_store_server_local_set(srv, "pipe", val, vlen, 0);
    free(val);

    int fd = mg_connect_tcp("127.0.0.1", port, mg_now_ms() + 2000);
    uint8_t hello[MG_SP_HELLO_LEN] = {0}, sh[MG_SP_SHELLO_LEN];
    struct mg_sp_hello h = {.version = MG_SP_WIRE_VERSION};
    mg_sp_hello_encode(hello, &h);
    mg_write_full(fd, hello, sizeof(hello), mg_now_ms() + 2000);
    mg_read_full(fd, sh, sizeof(sh), mg_now_ms() + 2000);
    enum {
        N = 12
    };
    uint8_t req[64];
    for (int i = 0; i < N; i++) {
        struct mg_sp_req q = {
            .op = MG_SP_GET, .id = (uint32_t)(i + 1), .key = (const uint8_t *)"pipe", .klen = 4};
        size_t n = mg_sp_req_encode(req, &q, 1);
        mg_write_full(fd, req, n, mg_now_ms() + 2000);
    }
    poll(NULL, 0, 100); /* let the replies pile up */
    int good = 0;
    uint8_t *buf = malloc(MG_SP_HDR_LEN + 12 + vlen);
    for (int i = 0; i < N; i++) {
        struct mg_sp_hdr hd;
        if (mg_read_full(fd, buf, MG_SP_HDR_LEN, mg_now_ms() + 3000))
            break;
        mg_sp_hdr_decode(buf, &hd);
        if (hd.len > 12 + vlen || mg_read_full(fd, buf, hd.len, mg_now_ms() + 3000))
            break;
        good += hd.id == (uint32_t)(i + 1) && hd.status == 0 && hd.len == 12 + vlen;
    }
    free(buf);
    is_int(good, N, "%d pipelined 1 MiB GETs all answered, in order, past the output bound", N);
    close(fd);
    mg_store_server_release(srv);
}

/* Random well-framed requests from a raw client, then random headers: the
 * server answers or drops, never crashes (ASan in the sanitizer build), and
 * a well-behaved client is served throughout. Fixed seed. */
static void fuzz_server(void)
{
    struct mg_store_server *srv = server(NULL);
    int port = mg_store_server_port(srv);
    struct mg_store *good = conn(port, NULL, 0);
    unsigned seed = 777;
    int rounds = 0, good_ok = 0;
    for (int c = 0; c < 40; c++) {
        int fd = mg_connect_tcp("127.0.0.1", port, mg_now_ms() + 2000);
        uint8_t hello[MG_SP_HELLO_LEN], sh[MG_SP_SHELLO_LEN];
        struct mg_sp_hello h = {.version = MG_SP_WIRE_VERSION};
        mg_sp_hello_encode(hello, &h);
        mg_write_full(fd, hello, sizeof(hello), mg_now_ms() + 2000);
        mg_read_full(fd, sh, sizeof(sh), mg_now_ms() + 2000);
        for (int i = 0; i < 200; i++) {
            uint8_t frame[256];
            size_t n;
            if (i % 2 == 0) {
                /* A request, valid or slightly broken. */
                n = random_frame(&seed, frame);
            } else {
                /* Random bytes under a header within the opcode's bound. */
                struct mg_sp_hdr fh = {.len = (uint32_t)(rand_r(&seed) % 80),
                                       .op = (uint8_t)(rand_r(&seed) % 12),
                                       .flags = (uint8_t)(rand_r(&seed) % 3),
                                       .id = (uint32_t)i};
                if (fh.len > mg_sp_max_body(fh.op))
                    fh.len = mg_sp_max_body(fh.op);
                mg_sp_hdr_encode(frame, &fh);
                for (uint32_t k = 0; k < fh.len; k++) {
                    int r = rand_r(&seed);
                    frame[MG_SP_HDR_LEN + k] = (uint8_t)(r % 3 == 0 ? r % 6 : 'a' + r % 26);
                }
                n = MG_SP_HDR_LEN + fh.len;
            }
            /* The last connections end with a header of a random length. */
            int last = c >= 30 && i == 100;
            if (last) {
                mg_sp_put32(frame, (uint32_t)rand_r(&seed) * 7919u);
                n = MG_SP_HDR_LEN;
            }
            if (mg_write_full(fd, frame, n, mg_now_ms() + 2000))
                break;
            rounds++;
            if (last)
                break;
        }
        /* Drain what it answered, then hang up. */
        char sink[65536];
        while (mg_read_full(fd, sink, 1, mg_now_ms() + 20) == 0)
            (void)recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
        close(fd);
        good_ok += mg_store_set(good, "fuzz-good", "1", 1, 0) == 0;
    }
    ok(rounds >= 40, "%d random frames sent on 40 connections", rounds);
    is_int(good_ok, 40, "a well-behaved client was served after every fuzzing connection");
    ok(wait_stat(srv, 1, 3000), "every fuzzing connection is gone");
    mg_store_release(good);
    mg_store_server_release(srv);
}

/* The launcher may hand over a socket it bound earlier (to hold the port). */
static void given_socket(void)
{
    int port = 0, lfd = mg_listen_tcp("127.0.0.1", 0, 16, &port);
    struct mg_store_server_opts o = {.listen_fd = lfd};
    struct mg_store_server *srv;
    is_int(mg_store_server_start(&srv, &o), 0, "server on a given listening socket");
    is_int(mg_store_server_port(srv), port, "reports its port");
    mg_store_server_start_thread(srv);
    struct mg_store *st = conn(port, NULL, 0);
    ok(st && mg_store_ping(st) == 0, "serves on it");
    mg_store_release(st);
    mg_store_server_release(srv);
    int c = mg_connect_tcp("127.0.0.1", port, mg_now_ms() + 1000);
    ok(c >= 0, "the socket stays open after release: the caller owns it");
    if (c >= 0)
        close(c);
    close(lfd);
}

/* Another protocol on the same port: a connection whose first bytes are
 * not the handshake's goes to the foreign handler, with those bytes; mg's
 * clients are served as before. */
static int foreign_fd = -1;
static char foreign_got[64];
static size_t foreign_n;

static int on_foreign(void *ctx, int fd, const void *bytes, size_t n)
{
    (void)ctx;
    foreign_fd = fd;
    foreign_n = n < sizeof(foreign_got) ? n : sizeof(foreign_got);
    memcpy(foreign_got, bytes, foreign_n);
    return 0;
}

static void foreign_protocol(void)
{
    struct mg_store_server_opts o = {.host = "127.0.0.1", .foreign = on_foreign};
    struct mg_store_server *srv;
    is_int(mg_store_server_start(&srv, &o), 0, "server with a foreign handler");
    mg_store_server_start_thread(srv);
    int port = mg_store_server_port(srv);
    int c = mg_connect_tcp("127.0.0.1", port, mg_now_ms() + 1000);
    static const char q[] = "\x03\x05\0\0\0\0\0\0\0init/";
    ok(c >= 0 && write(c, q, sizeof(q) - 1) == (ssize_t)(sizeof(q) - 1), "a TCPStore-like client");
    for (int i = 0; i < 200 && foreign_fd < 0; i++)
        poll(NULL, 0, 10);
    ok(foreign_fd >= 0, "handed over");
    ok(foreign_n >= 1 && memcmp(foreign_got, q, foreign_n) == 0, "with the bytes it sent (%zu)",
       foreign_n);
    if (foreign_fd >= 0) {
        ok(write(foreign_fd, "ok", 2) == 2, "the socket is the handler's to answer on");
        char buf[2];
        ok(read(c, buf, 2) == 2 && memcmp(buf, "ok", 2) == 0, "and the client gets it");
        close(foreign_fd);
    }
    if (c >= 0)
        close(c);
    struct mg_store *st = conn(port, NULL, 0);
    ok(st && mg_store_set(st, "k", "v", 1, 0) == 0, "mg's clients are served as before");
    mg_store_release(st);
    struct mg_store_server_stats stats;
    mg_store_server_stats(srv, &stats);
    is_int((int)stats.dropped, 0, "a handed-over connection is not counted as dropped");
    mg_store_server_release(srv);
}

/* A client's prefix: its own namespace in a store it shares. */
static void prefixed_client(int port)
{
    struct mg_store_opts o = {.port = port, .timeout_ms = 2000, .prefix = "/worker/attempt_1/"};
    struct mg_store *p = NULL, *plain = conn(port, NULL, 0);
    void *v = NULL;
    char **keys = NULL;
    int n = 0;
    is_int(mg_store_connect(&p, &o), 0, "a client with a prefix");
    ok(p && mg_store_set(p, "a", "1", 1, 0) == 0, "  sets a");
    ok(plain && mg_store_get(plain, "/worker/attempt_1/a", &v, NULL, 0) == 0 && v &&
           strcmp(v, "1") == 0,
       "  which is /worker/attempt_1/a in the store");
    free(v);
    v = NULL;
    ok(mg_store_get(p, "a", &v, NULL, 0) == 0 && v && strcmp(v, "1") == 0, "  and a to it");
    free(v);
    int64_t r = 0;
    ok(mg_store_add(p, "n", 2, &r) == 0 && r == 2, "  add");
    const char *want[] = {"a", "n"};
    is_int(mg_store_wait(p, want, 2, 100), 0, "  wait on its keys");
    is_int(mg_store_check(p, want, 2), 1, "  check");
    is_int(mg_store_list(p, "", -1, &keys, &n), 2, "  list: its two keys");
    ok(n == 2 && strcmp(keys[0], "a") == 0 && strcmp(keys[1], "n") == 0, "  without the prefix");
    mg_store_free_list(keys, n);
    is_int(mg_store_delete(p, "a"), 1, "  delete");
    is_int(mg_store_get(plain, "/worker/attempt_1/a", &v, NULL, 0), -MG_ENOKEY, "  gone");
    mg_store_release(p);
    mg_store_release(plain);
}

/* mg_store_get_many / _set_many (pipelined, more than one batch of 64) and
 * a watch parked across calls (mg_store_watch_begin / _end). */
static void pipelined_and_parked(struct mg_store_server *srv, int port)
{
    struct mg_store *st = conn(port, NULL, 0);
    enum {
        N = 150
    };
    char kb[N][32], vb[N][32];
    const char *keys[N];
    const void *vals[N];
    size_t lens[N], glens[N];
    void *got[N];
    int64_t revs[N];

    for (int i = 0; i < N; i++) {
        snprintf(kb[i], sizeof(kb[i]), "many/%03d", i);
        snprintf(vb[i], sizeof(vb[i]), "value %d", i * 7);
        keys[i] = kb[i];
        vals[i] = vb[i];
        lens[i] = strlen(vb[i]);
    }
    is_int(mg_store_set_many(st, keys, vals, lens, N - 1, 0), 0, "set_many: 149 keys");
    is_int(mg_store_get_many(st, keys, N, got, glens, revs), 0, "get_many: 150 keys, one absent");
    int right = 1;
    for (int i = 0; i < N - 1; i++)
        right &= got[i] && glens[i] == lens[i] && !memcmp(got[i], vb[i], lens[i]) && revs[i] > 0;
    ok(right, "get_many: every value and revision, in order");
    ok(got[N - 1] == NULL, "get_many: the absent key's value is NULL");
    for (int i = 0; i < N; i++)
        free(got[i]);
    is_int(mg_store_delete_many(st, keys, N), 0, "delete_many: 150 keys, one absent");
    is_int(mg_store_get_many(st, keys, N, got, glens, NULL), 0, "get_many after it");
    right = 1;
    for (int i = 0; i < N; i++)
        right &= got[i] == NULL;
    ok(right, "every key is gone");
    is_int(mg_store_ping(st), 0, "the connection is usable after them");

    /* a parked watch: not there yet, still parked, then woken by a set */
    void *v = NULL;
    size_t len = 0;
    int64_t rev = 0;
    is_int(mg_store_watch_end(st, 0, &rev, &v, &len), -ENOENT, "watch_end without a watch: ENOENT");
    is_int(mg_store_watch_begin(st, "parked", 0, 5000), 0, "watch_begin");
    is_int(mg_store_watch_end(st, 50, &rev, &v, &len), -EAGAIN, "not yet: EAGAIN, still parked");
    struct later l = {.srv = srv, .key = "parked", .val = "here", .delay_ms = 50};
    later_start(&l);
    is_int(mg_store_watch_end(st, 3000, &rev, &v, &len), 0, "the set wakes it");
    ok(v && len == 4 && !strcmp(v, "here") && rev > 0, "with the value and its revision");
    free(v);
    later_join(&l);
    /* another call drops a parked watch; its late reply is skipped */
    is_int(mg_store_watch_begin(st, "parked2", 0, 200), 0, "a second watch_begin");
    is_int(mg_store_set(st, "other", "x", 1, 0), 0, "another call meanwhile");
    is_int(mg_store_watch_end(st, 0, &rev, &v, &len), -ENOENT, "the parked watch was dropped");
    poll(NULL, 0, 300); /* its TIMEDOUT reply arrives, to be skipped */
    v = NULL;
    is_int(mg_store_get(st, "other", &v, &len, 0), 0, "the next call skips the late reply");
    ok(v && !strcmp(v, "x"), "and gets its own");
    free(v);
    /* the server's timeout ends a parked watch with ETIMEDOUT */
    is_int(mg_store_watch_begin(st, "never", 0, 100), 0, "a watch of 100 ms");
    is_int(mg_store_watch_end(st, 3000, &rev, &v, &len), -ETIMEDOUT, "ETIMEDOUT at its timeout");
    mg_store_release(st);
}

int main(void)
{
    struct mg_store_server *srv = server(NULL);
    int port = mg_store_server_port(srv);
    ok(port > 0, "server listens on %d", port);
    basic_calls(port);
    prefixed_client(port);
    blocking_calls(srv, port);
    ephemeral_and_leases(srv, port);
    bounds(port);
    local_access(srv, port);
    many_clients(srv, port);
    pipelined_and_parked(srv, port);
    mg_store_server_release(srv);
    handshakes();
    connect_retry();
    memory_bounds();
    waiter_bound();
    poll_loop_mode();
    server_goes_away();
    client_limit();
    many_keys();
    list_index();
    given_socket();
    foreign_protocol();
    pipelined_backpressure();
    fuzz_server();
    return done_testing();
}
