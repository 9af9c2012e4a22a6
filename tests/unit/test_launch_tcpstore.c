/* The agent store's TCPStore side (launcher/tcpstore.c) behind mg's store
 * server (its foreign handler), served from a poll loop as the agent does:
 * both framings byte by byte as torch's TCPStore.cpp writes them (torch
 * 1.13-2.1's, and later torch's VALIDATE and PING), wait and cancel, the
 * bounds; then Debian's torch (1.13) as a real client, when it is here.
 * mg's own clients keep working on the same port.
 * timeout: 60 */
#include "mg_err.h"
#include "net.h"
#include "store.h"
#include "tap.h"
#include "tcpstore.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static struct mg_store_server *srv;
static struct mg_tcpstore *ts;
static int stop_fd[2];

/* The agent's loop, in miniature: the store server and the TCPStore side. */
static void *loop(void *arg)
{
    (void)arg;
    struct pollfd fds[256];
    for (;;) {
        fds[0] = (struct pollfd){.fd = stop_fd[0], .events = POLLIN};
        int a = mg_store_server_pollfds(srv, fds + 1, 128);
        int b = mg_tcpstore_pollfds(ts, fds + 1 + a, 127 - a);
        if (poll(fds, (nfds_t)(1 + a + b), mg_store_server_timeout_ms(srv)) < 0)
            continue;
        if (fds[0].revents)
            return NULL;
        mg_store_server_process(srv, fds + 1, a);
        mg_tcpstore_process(ts, fds + 1 + a, b);
    }
}

static int port;

static int dial(void)
{
    return mg_connect_tcp("127.0.0.1", port, mg_now_ms() + 2000);
}

/* ---- requests as torch writes them ---- */

struct msg {
    uint8_t b[4096];
    size_t n;
};

static void m_u8(struct msg *m, uint8_t v)
{
    m->b[m->n++] = v;
}
static void m_raw(struct msg *m, const void *p, size_t n)
{
    memcpy(m->b + m->n, p, n);
    m->n += n;
}
static void m_u64(struct msg *m, uint64_t v)
{
    m_raw(m, &v, 8);
}
static void m_str(struct msg *m, const char *s)
{
    m_u64(m, strlen(s));
    m_raw(m, s, strlen(s));
}

static int sendm(int fd, const struct msg *m)
{
    return write(fd, m->b, m->n) == (ssize_t)m->n ? 0 : -1;
}

static int recv_n(int fd, void *p, size_t n)
{
    return mg_read_full(fd, p, n, mg_now_ms() + 3000) < 0 ? -1 : 0;
}

static int64_t recv_i64(int fd)
{
    int64_t v = -999;
    recv_n(fd, &v, 8);
    return v;
}

static char *recv_vec(int fd)
{
    static char buf[1024];
    uint64_t n = 0;
    if (recv_n(fd, &n, 8) || n >= sizeof(buf) || recv_n(fd, buf, (size_t)n))
        return "<error>";
    buf[n] = '\0';
    return buf;
}

static int readable(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, ms) == 1;
}

/* torch 1.13-2.1: SET=0 COMPARE_SET=1 GET=2 ADD=3 CHECK=4 WAIT=5 GETNUMKEYS=6
 * WATCH_KEY=7 DELETE_KEY=8 APPEND=9 MULTI_GET=10 MULTI_SET=11 CANCEL_WAIT=12 */
static void legacy(void)
{
    struct msg m = {0};
    int c = dial(), c2 = dial();
    ok(c >= 0 && c2 >= 0, "legacy: two clients connect");
    m_u8(&m, 3); /* ADD init/ 1: TCPStore's first query (waitForWorkers) */
    m_str(&m, "init/");
    m_u64(&m, 1);
    sendm(c, &m);
    is_int((int)recv_i64(c), 1, "ADD init/ 1 -> 1");
    m.n = 0;
    m_u8(&m, 0); /* SET /k1 v1: no reply */
    m_str(&m, "/k1");
    m_str(&m, "v1");
    m_u8(&m, 2); /* GET /k1, pipelined */
    m_str(&m, "/k1");
    sendm(c, &m);
    is_str(recv_vec(c), "v1", "SET then GET");
    m.n = 0;
    m_u8(&m, 1); /* COMPARE_SET /k1 v1 -> v2 */
    m_str(&m, "/k1");
    m_str(&m, "v1");
    m_str(&m, "v2");
    m_u8(&m, 1); /* COMPARE_SET /k1 nope -> (unchanged) */
    m_str(&m, "/k1");
    m_str(&m, "nope");
    m_str(&m, "v3");
    m_u8(&m, 1); /* COMPARE_SET /new "" -> created */
    m_str(&m, "/new");
    m_str(&m, "");
    m_str(&m, "fresh");
    sendm(c, &m);
    is_str(recv_vec(c), "v2", "COMPARE_SET swaps when it matches");
    is_str(recv_vec(c), "v2", "  and answers the current value when not");
    is_str(recv_vec(c), "fresh", "  and creates a missing key expected empty");
    m.n = 0;
    m_u8(&m, 5); /* WAIT [/later]: parked */
    m_u64(&m, 1);
    m_str(&m, "/later");
    sendm(c, &m);
    ok(!readable(c, 200), "WAIT for a missing key is parked");
    m.n = 0;
    m_u8(&m, 3); /* another client ADDs it */
    m_str(&m, "/later");
    m_u64(&m, 5);
    sendm(c2, &m);
    is_int((int)recv_i64(c2), 5, "ADD /later 5 -> 5");
    uint8_t r = 9;
    ok(recv_n(c, &r, 1) == 0 && r == 0, "the parked WAIT ends (STOP_WAITING)");
    m.n = 0;
    m_u8(&m, 3);
    m_str(&m, "/later");
    m_u64(&m, -2);
    m_u8(&m, 4); /* CHECK [/later, /none] */
    m_u64(&m, 2);
    m_str(&m, "/later");
    m_str(&m, "/none");
    m_u8(&m, 6); /* GETNUMKEYS */
    m_u8(&m, 8); /* DELETE_KEY /k1 */
    m_str(&m, "/k1");
    m_u8(&m, 8); /* again */
    m_str(&m, "/k1");
    sendm(c, &m);
    is_int((int)recv_i64(c), 3, "ADD -2 -> 3 (values are decimal text)");
    ok(recv_n(c, &r, 1) == 0 && r == 1, "CHECK with a missing key: NOT_READY");
    is_int((int)recv_i64(c), 4, "GETNUMKEYS counts every key (init/ too)");
    is_int((int)recv_i64(c), 1, "DELETE_KEY: 1 deleted");
    is_int((int)recv_i64(c), 0, "  then 0");
    m.n = 0;
    m_u8(&m, 7); /* WATCH_KEY: not served */
    m_str(&m, "/k");
    sendm(c2, &m);
    char x;
    ok(readable(c2, 2000) && read(c2, &x, 1) == 0, "WATCH_KEY: the client is disconnected");
    close(c);
    close(c2);
}

/* later torch: VALIDATE=0 SET=1 COMPARE_SET=2 GET=3 ADD=4 CHECK=5 WAIT=6
 * GETNUMKEYS=7 DELETE_KEY=8 APPEND=9 MULTI_GET=10 MULTI_SET=11 CANCEL_WAIT=12 PING=13 */
static void validated(void)
{
    struct msg m = {0};
    uint32_t magic = 0x3C85F7CE, nonce = 4242, got = 0;
    int c = dial();
    m_u8(&m, 0); /* VALIDATE: no reply */
    m_raw(&m, &magic, 4);
    m_u8(&m, 13); /* PING */
    m_raw(&m, &nonce, 4);
    sendm(c, &m);
    ok(recv_n(c, &got, 4) == 0 && got == nonce, "VALIDATE, then PING answers its nonce");
    m.n = 0;
    m_u8(&m, 1); /* SET a 1 */
    m_str(&m, "a");
    m_str(&m, "1");
    m_u8(&m, 9); /* APPEND a 23 */
    m_str(&m, "a");
    m_str(&m, "23");
    m_u8(&m, 11); /* MULTI_SET b=x c=y */
    m_u64(&m, 2);
    m_str(&m, "b");
    m_str(&m, "x");
    m_str(&m, "c");
    m_str(&m, "y");
    m_u8(&m, 10); /* MULTI_GET a c */
    m_u64(&m, 2);
    m_str(&m, "a");
    m_str(&m, "c");
    m_u8(&m, 4); /* ADD n 7 */
    m_str(&m, "n");
    m_u64(&m, 7);
    sendm(c, &m);
    is_str(recv_vec(c), "123", "SET, APPEND, MULTI_SET, MULTI_GET: a is 123");
    is_str(recv_vec(c), "y", "  and c is y");
    is_int((int)recv_i64(c), 7, "ADD n 7");
    m.n = 0;
    m_u8(&m, 6); /* WAIT [missing] */
    m_u64(&m, 1);
    m_str(&m, "missing");
    sendm(c, &m);
    ok(!readable(c, 200), "WAIT parked");
    m.n = 0;
    m_u8(&m, 12); /* CANCEL_WAIT, as the client does at its timeout */
    sendm(c, &m);
    uint8_t r = 0;
    ok(recv_n(c, &r, 1) == 0 && r == 1, "CANCEL_WAIT: WAIT_CANCELED");
    m.n = 0;
    m_u8(&m, 5); /* CHECK [a, b] */
    m_u64(&m, 2);
    m_str(&m, "a");
    m_str(&m, "b");
    sendm(c, &m);
    ok(recv_n(c, &r, 1) == 0 && r == 0, "CHECK [a, b]: READY");
    is_int((int)mg_tcpstore_nkeys(ts) >= 4, 1, "the keys live in the TCPStore table");
    mg_tcpstore_clear(ts);
    is_int((int)mg_tcpstore_nkeys(ts), 0, "clear forgets them (a new round)");
    m.n = 0;
    uint32_t wrong = 0x12345678;
    m_u8(&m, 0); /* VALIDATE, then VALIDATE with a wrong magic */
    m_raw(&m, &magic, 4);
    m_u8(&m, 0);
    m_raw(&m, &wrong, 4);
    int c2 = dial();
    sendm(c2, &m);
    char x;
    ok(readable(c2, 2000) && read(c2, &x, 1) == 0, "a wrong magic: disconnected");
    m.n = 0;
    m_u8(&m, 1);
    m_u64(&m, 1ull << 40); /* a key length over the bound */
    int c3 = dial();
    sendm(c3, &m);
    ok(readable(c3, 2000) && read(c3, &x, 1) == 0, "a length over the bound: disconnected");
    close(c);
    close(c2);
    close(c3);
}

static void mg_clients(void)
{
    struct mg_store_opts o = {.host = "127.0.0.1", .port = port, .timeout_ms = 2000};
    struct mg_store *st = NULL;
    is_int(mg_store_connect(&st, &o), 0, "an mg client on the same port");
    ok(st && mg_store_set(st, "mgkey", "v", 1, 0) == 0, "  is served by mg's store");
    mg_store_release(st);
}

/* Debian's torch as the client: its own framing, its waits and timeouts. */
static void real_torch(void)
{
    static const char script[] =
        "import datetime, sys, torch.distributed as d\n"
        "s = d.TCPStore('127.0.0.1', int(sys.argv[1]), 2, False, datetime.timedelta(seconds=5))\n"
        "p = d.PrefixStore('/worker/attempt_0', s)\n"
        "p.set('k', 'v1')\n"
        "assert p.get('k') == b'v1'\n"
        "assert p.add('n', 3) == 3 and p.add('n', 4) == 7\n"
        "assert p.compare_set('k', 'v1', 'v2') == b'v2'\n"
        "p.wait(['k'])\n"
        "assert p.delete_key('k') and not p.delete_key('k')\n"
        "try:\n"
        "    p.wait(['never'], datetime.timedelta(milliseconds=300))\n"
        "    raise SystemExit('wait did not time out')\n"
        "except RuntimeError:\n"
        "    pass\n"
        "print('torch ok', s.num_keys())\n";
    if (access("/usr/bin/python3", X_OK) ||
        system("/usr/bin/python3 -c 'import torch.distributed' 2>/dev/null") != 0) {
        diag("Debian's python3-torch is not installed: no real torch client");
        return;
    }
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 -c \"$MG_TS_SCRIPT\" %d 2>&1", port);
    setenv("MG_TS_SCRIPT", script, 1);
    FILE *f = popen(cmd, "r");
    char out[2048] = "";
    size_t n = f ? fread(out, 1, sizeof(out) - 1, f) : 0;
    out[n] = '\0';
    int st = f ? pclose(f) : -1;
    is_int(st, 0, "torch's TCPStore client against the agent store: %s", out);
    ok(strstr(out, "torch ok") != NULL,
       "  set, get, add, compare_set, wait, delete, a wait timeout");
}

/* ---- the limits, on a store of small ones driven directly (socketpairs) ---- */

static char reported[8][400];
static int nreported;

static void on_report(void *ctx, const char *line)
{
    (void)ctx;
    if (nreported < 8)
        snprintf(reported[nreported++], sizeof(reported[0]), "%s", line);
}

static void pump(struct mg_tcpstore *t)
{
    struct pollfd fds[8];
    for (int turn = 0; turn < 20; turn++) {
        int n = mg_tcpstore_pollfds(t, fds, 8);
        if (n <= 0 || poll(fds, (nfds_t)n, 10) <= 0)
            continue;
        mg_tcpstore_process(t, fds, n);
    }
}

static int adopt_pair(struct mg_tcpstore *t, int *client)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0)
        return -errno;
    *client = sv[0];
    return mg_tcpstore_adopt(t, sv[1], NULL, 0);
}

static int eof_soon(int fd)
{
    char b[4096];
    for (;;) {
        if (!readable(fd, 2000))
            return 0;
        ssize_t r = read(fd, b, sizeof(b));
        if (r <= 0)
            return 1;
    }
}

static void small_limits(void)
{
    struct mg_tcpstore_limits lim = {.max_value = 100,
                                     .max_keys = 3,
                                     .max_bytes = 100000,
                                     .max_clients = 2,
                                     .max_buffered = 65536,
                                     .max_pending = 300};
    struct mg_tcpstore *t;
    struct msg m;
    int a, b, c;
    char val[101];
    memset(val, 'v', sizeof(val));
    if (mg_tcpstore_new(&t, &lim, on_report, NULL)) {
        ok(0, "a store with small limits");
        return;
    }
    is_int(adopt_pair(t, &a), 0, "small limits: a client");
    m.n = 0;
    for (int i = 0; i < 3; i++) { /* legacy SET=0: three keys, the limit */
        char key[8];
        snprintf(key, sizeof(key), "k%d", i);
        m_u8(&m, 0);
        m_str(&m, key);
        m_u64(&m, 100);
        m_raw(&m, val, 100);
    }
    sendm(a, &m);
    pump(t);
    is_int((int)mg_tcpstore_nkeys(t), 3, "  three keys of 100 bytes held");
    m.n = 0;
    m_u8(&m, 0);
    m_str(&m, "k3");
    m_u64(&m, 1);
    m_raw(&m, "x", 1);
    sendm(a, &m);
    pump(t);
    ok(eof_soon(a), "  a fourth key: disconnected");
    ok(nreported == 1 &&
           strstr(reported[0], "refused a client: a new key with 3 keys held, the limit"),
       "  the agent's log says which limit: %s", nreported ? reported[0] : "(nothing)");
    close(a);

    /* replies a client does not read: its requests wait, they are not refused */
    is_int(adopt_pair(t, &b), 0, "a client that does not read its replies");
    m.n = 0;
    for (int i = 0; i < 10; i++) { /* GET=2 of a 100-byte value: 108 bytes a reply */
        m_u8(&m, 2);
        m_str(&m, "k0");
    }
    sendm(b, &m);
    pump(t);
    size_t got = 0;
    char buf[4096];
    while (got < 10 * 108 && readable(b, 2000)) {
        ssize_t r = read(b, buf, sizeof(buf));
        if (r <= 0)
            break;
        got += (size_t)r;
        pump(t);
    }
    is_int((int)got, 10 * 108, "  ten replies of 108 bytes past a pending limit of 300: all come");
    is_int(mg_tcpstore_nclients(t), 1, "  and it is still connected");

    /* connections: the third of a limit of two (a second later: the log
     * takes a line a second) */
    usleep(1100 * 1000);
    is_int(adopt_pair(t, &a), 0, "a second connection");
    int rc = adopt_pair(t, &c);
    ok(rc == -EMFILE, "  a third: refused (%d)", rc);
    ok(eof_soon(c), "  its socket closed");
    ok(nreported == 2 && strstr(reported[1], "2 connections open, the limit"),
       "  the agent's log says so: %s", nreported > 1 ? reported[1] : "(nothing)");
    close(a);
    close(b);
    close(c);
    mg_tcpstore_release(t);
}

int main(void)
{
    struct mg_store_server_opts o = {
        .host = "127.0.0.1", .foreign = mg_tcpstore_adopt, .foreign_ctx = NULL};
    pthread_t th;
    if (mg_tcpstore_new(&ts, NULL, NULL, NULL) || pipe(stop_fd))
        skip_all("no memory");
    o.foreign_ctx = ts;
    if (mg_store_server_start(&srv, &o))
        skip_all("cannot start a store server here");
    port = mg_store_server_port(srv);
    pthread_create(&th, NULL, loop, NULL);
    legacy();
    validated();
    mg_clients();
    real_torch();
    small_limits();
    ssize_t w = write(stop_fd[1], "x", 1);
    (void)w;
    pthread_join(th, NULL);
    mg_tcpstore_release(ts);
    mg_store_server_release(srv);
    return done_testing();
}
