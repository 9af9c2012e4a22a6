/* The etcd backend (launcher/etcd.c) against a real etcd 3.4 that this test
 * starts on loopback with a temporary data dir and free ports, and stops and
 * removes on every exit path (atexit, SIGTERM/SIGINT, and PDEATHSIG if killed).
 * timeout: 90 */
#include "etcd.h"
#include "mg_err.h"
#include "net.h"
#include "../tap.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static pid_t etcd_pid = -1;
static char etcd_dir[256];
static char endpoint[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void etcd_stop(void)
{
    if (etcd_pid > 0) {
        kill(etcd_pid, SIGKILL);
        waitpid(etcd_pid, NULL, 0);
        etcd_pid = -1;
    }
}

static void cleanup(void)
{
    etcd_stop();
    if (etcd_dir[0]) {
        nftw(etcd_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        etcd_dir[0] = 0;
    }
}

static void on_signal(int sig)
{
    cleanup();
    signal(sig, SIG_DFL);
    raise(sig);
}

static int free_port(void)
{
    int port, fd = mg_listen_tcp("127.0.0.1", 0, 1, &port);
    if (fd < 0)
        return -1;
    close(fd);
    return port;
}

static int etcd_start(void)
{
    const char *tmp = getenv("TMPDIR");
    char data[300], logf[300], curl[64], purl[64], cluster[96];
    int cport = free_port(), pport = free_port();

    snprintf(etcd_dir, sizeof(etcd_dir), "%s/mgetcd.XXXXXX", tmp ? tmp : "/tmp");
    if (!mkdtemp(etcd_dir)) {
        etcd_dir[0] = 0;
        return -errno;
    }
    snprintf(data, sizeof(data), "%s/data", etcd_dir);
    snprintf(logf, sizeof(logf), "%s/etcd.log", etcd_dir);
    snprintf(curl, sizeof(curl), "http://127.0.0.1:%d", cport);
    snprintf(purl, sizeof(purl), "http://127.0.0.1:%d", pport);
    snprintf(cluster, sizeof(cluster), "default=%s", purl);
    snprintf(endpoint, sizeof(endpoint), "127.0.0.1:%d", cport);
    etcd_pid = fork();
    if (etcd_pid < 0)
        return -errno;
    if (etcd_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(logf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl("/usr/bin/etcd", "etcd", "--name", "default", "--data-dir", data,
              "--listen-client-urls", curl, "--advertise-client-urls", curl, "--listen-peer-urls",
              purl, "--initial-advertise-peer-urls", purl, "--initial-cluster", cluster,
              (char *)NULL);
        _exit(127);
    }
    return 0;
}

static struct mg_kv *open_kv(const char *ep, int ttl_ms)
{
    struct mg_etcd_opts o = {.endpoints = ep, .timeout_ms = 3000, .lease_ttl_ms = ttl_ms};
    struct mg_kv *kv = NULL;
    char err[512];
    int rc = mg_etcd_open(&kv, &o, err, sizeof(err));
    if (rc < 0)
        BAIL_OUT("mg_etcd_open(%s): %s", ep, err);
    return kv;
}

static void b64_case(const char *in, const char *want)
{
    char enc[64], dec[64];
    size_t n = mg_base64_encode(in, strlen(in), enc);
    is_str(enc, want, "base64('%s')", in);
    int m = mg_base64_decode(enc, n, dec, sizeof(dec));
    ok(m == (int)strlen(in) && memcmp(dec, in, (size_t)m) == 0, "  decodes back");
}

int main(void)
{
    struct mg_kv *kv, *kv2;
    char err[512], *val, *cur;
    size_t len;
    int64_t rev, rev2, sum;
    int rc;

    b64_case("", "");
    b64_case("f", "Zg==");
    b64_case("fo", "Zm8=");
    b64_case("foo", "Zm9v");
    b64_case("foobar", "Zm9vYmFy");
    {
        char d[8];
        ok(mg_base64_decode("Zm9v!", 5, d, sizeof(d)) == -EINVAL, "base64: bad character");
        ok(mg_base64_decode("Zm9vYmFy", 8, d, 3) == -ENOSPC, "base64: output bound");
    }

    {
        struct mg_etcd_opts o = {.endpoints = "ftp://x:1"};
        rc = mg_etcd_open(&kv, &o, err, sizeof(err));
        ok(rc == -EINVAL && strstr(err, "ftp://x:1"), "bad scheme refused: %s", err);
        o.endpoints = "host:99999";
        rc = mg_etcd_open(&kv, &o, err, sizeof(err));
        ok(rc == -EINVAL && strstr(err, "host:99999"), "bad port refused: %s", err);
        o.endpoints = "";
        rc = mg_etcd_open(&kv, &o, err, sizeof(err));
        ok(rc == -EINVAL, "empty endpoint refused: %s", err);
        o.endpoints = "127.0.0.1:1";
        o.libcurl = "libnosuchcurl.so.9";
        rc = mg_etcd_open(&kv, &o, err, sizeof(err));
        ok(rc == -MG_EUNSUPPORTED && strstr(err, "libnosuchcurl.so.9"),
           "missing libcurl explained: %s", err);
    }

    if (access("/usr/bin/etcd", X_OK) < 0) {
        diag("etcd-server is not installed (apt-get install etcd-server): skipping the rest");
        return done_testing();
    }
    atexit(cleanup);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGHUP, on_signal);
    if (etcd_start() < 0)
        BAIL_OUT("cannot start etcd");

    /* Unreachable and unresolvable endpoints are reported with the endpoint and the op. */
    {
        char ep[64];
        snprintf(ep, sizeof(ep), "127.0.0.1:%d", free_port());
        kv = open_kv(ep, 2000);
        rc = kv->ops->get(kv, "k", &val, &len, NULL);
        ok(rc == -ECONNREFUSED, "nothing listening: -ECONNREFUSED (%d)", rc);
        ok(strstr(mg_kv_error(kv), ep) && strstr(mg_kv_error(kv), "kv/range"),
           "message names the endpoint and the request: %s", mg_kv_error(kv));
        kv->ops->release(kv);
        kv = open_kv("nosuchhost.invalid:2379", 2000);
        rc = kv->ops->get(kv, "k", &val, &len, NULL);
        ok(rc == -ENOENT, "unknown name: -ENOENT (%d)", rc);
        ok(strstr(mg_kv_error(kv), "nosuchhost.invalid"), "message names the host: %s",
           mg_kv_error(kv));
        kv->ops->release(kv);
    }

    kv = open_kv(endpoint, 2000);
    /* etcd takes a moment to start: wait for it to answer. */
    for (int i = 0; i < 200; i++) {
        rc = kv->ops->get(kv, "/probe", &val, &len, NULL);
        if (rc == -MG_ENOKEY)
            break;
        usleep(50000);
    }
    is_int(rc, -MG_ENOKEY, "a missing key is -MG_ENOKEY");
    is_str(mg_etcd_api_prefix(kv), "/v3/", "etcd 3.4 serves the gateway at /v3/");

    is_int(kv->ops->set(kv, "/t/a", "hello", 5, 0), 0, "set");
    rc = kv->ops->get(kv, "/t/a", &val, &len, &rev);
    ok(rc == 0 && len == 5 && strcmp(val, "hello") == 0, "get returns the value");
    ok(rev > 0, "and a revision (%lld)", (long long)rev);
    free(val);
    {
        char bin[4] = {0, 1, (char)0xff, 'x'};
        kv->ops->set(kv, "/t/bin", bin, 4, 0);
        rc = kv->ops->get(kv, "/t/bin", &val, &len, NULL);
        ok(rc == 0 && len == 4 && memcmp(val, bin, 4) == 0, "binary values round-trip");
        free(val);
        kv->ops->set(kv, "/t/empty", "", 0, 0);
        rc = kv->ops->get(kv, "/t/empty", &val, &len, NULL);
        ok(rc == 0 && len == 0 && val && val[0] == 0, "an empty value is not a missing key");
        free(val);
    }

    rc = kv->ops->cas(kv, "/t/c", NULL, 0, "v1", 2, 0, &cur, &len);
    ok(rc == 1 && cur && strcmp(cur, "v1") == 0, "cas on a missing key creates it");
    free(cur);
    rc = kv->ops->cas(kv, "/t/c", NULL, 0, "v2", 2, 0, &cur, &len);
    ok(rc == 0 && cur && strcmp(cur, "v1") == 0, "cas expecting no key fails, shows 'v1'");
    free(cur);
    rc = kv->ops->cas(kv, "/t/c", "v1", 2, "v3", 2, 0, &cur, &len);
    ok(rc == 1 && strcmp(cur, "v3") == 0, "cas v1 -> v3");
    free(cur);
    rc = kv->ops->cas(kv, "/t/c", "zz", 2, "v4", 2, 0, &cur, &len);
    ok(rc == 0 && strcmp(cur, "v3") == 0, "cas with a wrong expectation fails");
    free(cur);
    rc = kv->ops->cas(kv, "/t/none", "zz", 2, "v4", 2, 0, &cur, &len);
    ok(rc == 0 && cur == NULL, "cas expecting a value of a missing key fails, cur NULL");

    ok(kv->ops->add(kv, "/t/n", 5, &sum) == 0 && sum == 5, "add on a missing key");
    ok(kv->ops->add(kv, "/t/n", -2, &sum) == 0 && sum == 3, "add -2");
    ok(kv->ops->add(kv, "/t/a", 1, &sum) == -EINVAL, "add to a non-integer is refused");

    /* add is atomic across clients. */
    {
        const int procs = 4, each = 25;
        pid_t kids[4];
        for (int p = 0; p < procs; p++) {
            kids[p] = fork();
            if (kids[p] == 0) {
                struct mg_kv *k = open_kv(endpoint, 2000);
                for (int i = 0; i < each; i++)
                    if (k->ops->add(k, "/t/race", 1, NULL) < 0)
                        _exit(1);
                k->ops->release(k);
                _exit(0);
            }
        }
        int bad = 0;
        for (int p = 0; p < procs; p++) {
            int st;
            waitpid(kids[p], &st, 0);
            bad += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
        }
        kv->ops->get(kv, "/t/race", &val, &len, NULL);
        is_int(bad, 0, "concurrent adders all succeeded");
        is_str(val, "100", "4 clients x 25 adds = 100");
        free(val);
    }

    {
        struct mg_kv_entry *e;
        int n;
        kv->ops->set(kv, "/t/l/b", "2", 1, 0);
        kv->ops->set(kv, "/t/l/a", "1", 1, 0);
        kv->ops->set(kv, "/t/l/c", "3", 1, 0);
        kv->ops->set(kv, "/t/lx", "no", 2, 0);
        rc = kv->ops->list(kv, "/t/l/", 100, 1, &e, &n);
        ok(rc == 0 && n == 3, "list by prefix: 3 keys (%d)", n);
        ok(n == 3 && strcmp(e[0].key, "/t/l/a") == 0 && strcmp(e[2].key, "/t/l/c") == 0, "sorted");
        ok(n == 3 && strcmp(e[1].val, "2") == 0 && e[1].rev > 0, "with values and revisions");
        mg_kv_free_list(e, n);
        rc = kv->ops->list(kv, "/t/l/", 2, 0, &e, &n);
        ok(rc == 0 && n == 2 && e[0].val == NULL, "list honours max, keys only");
        mg_kv_free_list(e, n);
        rc = kv->ops->list(kv, "/nothing/", 10, 1, &e, &n);
        ok(rc == 0 && n == 0 && e == NULL, "empty list");
    }

    is_int(kv->ops->del(kv, "/t/a"), 1, "delete an existing key");
    is_int(kv->ops->del(kv, "/t/a"), 0, "delete a missing key");

    /* wait */
    kv->ops->set(kv, "/t/w", "1", 1, 0);
    kv->ops->get(kv, "/t/w", NULL, NULL, &rev);
    is_int(kv->ops->wait(kv, "/t/w", rev, 200), 0, "wait without a change times out");
    {
        pid_t kid = fork();
        if (kid == 0) {
            usleep(200000);
            struct mg_kv *k = open_kv(endpoint, 2000);
            k->ops->set(k, "/t/w", "2", 1, 0);
            k->ops->set(k, "/t/new", "x", 1, 0);
            k->ops->release(k);
            _exit(0);
        }
        rc = kv->ops->wait(kv, "/t/w", rev, 10000);
        is_int(rc, 1, "wait sees a change made by another client");
        is_int(kv->ops->wait(kv, "/t/new", 0, 10000), 1, "wait for a key to exist");
        waitpid(kid, NULL, 0);
        kv->ops->set(kv, "/t/w", "3", 1, 0);
        is_int(kv->ops->wait(kv, "/t/w", rev, 5000), 1, "a change already made counts");
        kv->ops->get(kv, "/t/w", NULL, NULL, &rev2);
        kv->ops->del(kv, "/t/w");
        is_int(kv->ops->wait(kv, "/t/w", rev2, 5000), 1, "a deletion is a change");
    }

    /* Ephemeral keys: revoked on release, expired without keepalive. */
    kv2 = open_kv(endpoint, 2000);
    is_int(kv2->ops->keepalive(kv2), 0, "keepalive without a lease is a no-op");
    is_int(kv2->ops->set(kv2, "/t/eph", "me", 2, MG_KV_EPHEMERAL), 0, "ephemeral set");
    ok(mg_etcd_lease_id(kv2) != 0, "a lease was granted");
    is_int(kv2->ops->keepalive(kv2), 0, "keepalive renews it");
    rc = kv->ops->get(kv, "/t/eph", &val, &len, NULL);
    ok(rc == 0, "another client sees the ephemeral key");
    free(rc == 0 ? val : NULL);
    kv2->ops->release(kv2);
    is_int(kv->ops->get(kv, "/t/eph", &val, &len, NULL), -MG_ENOKEY,
           "release revokes the lease: the key is gone at once");

    kv2 = open_kv(endpoint, 2000);
    kv2->ops->set(kv2, "/t/eph2", "me", 2, MG_KV_EPHEMERAL);
    kv->ops->get(kv, "/t/eph2", NULL, NULL, &rev);
    rc = kv->ops->wait(kv, "/t/eph2", rev, 10000);
    is_int(rc, 1, "without keepalive the lease expires and the key is deleted");
    is_int(kv->ops->get(kv, "/t/eph2", &val, &len, NULL), -MG_ENOKEY, "  it is gone");
    rc = kv2->ops->keepalive(kv2);
    is_int(rc, -EKEYEXPIRED, "the late keepalive says the lease expired");
    ok(strstr(mg_kv_error(kv2), "expired") != NULL, "  %s", mg_kv_error(kv2));
    is_int(kv2->ops->set(kv2, "/t/eph3", "x", 1, MG_KV_EPHEMERAL), 0,
           "a new ephemeral set takes a new lease");
    kv2->ops->release(kv2);

    /* Failover: the first endpoint is dead, the second answers. */
    {
        char two[160];
        snprintf(two, sizeof(two), "127.0.0.1:%d,http://%s", free_port(), endpoint);
        kv2 = open_kv(two, 2000);
        ok(kv2->ops->set(kv2, "/t/fo", "1", 1, 0) == 0, "falls over to the next endpoint");
        kv2->ops->release(kv2);
    }

    /* etcd stopped: a clear error, fast, not a hang. */
    etcd_stop();
    {
        rc = kv->ops->get(kv, "/t/c", &val, &len, NULL);
        ok(rc == -ECONNREFUSED, "etcd stopped: get fails (%d)", rc);
        ok(strstr(mg_kv_error(kv), endpoint) != NULL, "  naming the endpoint: %s", mg_kv_error(kv));
        rc = kv->ops->wait(kv, "/t/c", 1, 1000);
        ok(rc < 0, "etcd stopped: wait fails too (%d): %s", rc, mg_kv_error(kv));
    }
    kv->ops->release(kv);
    return done_testing();
}
