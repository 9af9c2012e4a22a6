/* The etcd backend (launcher/rdzv/kv_etcd.c) against a real etcd 3.4 that this test
 * starts on loopback with a temporary data dir and free ports, and stops and
 * removes on every exit path (atexit, SIGTERM/SIGINT, and PDEATHSIG if killed):
 * the rendezvous backends' shared conformance table (kv_cases.h), then what
 * is etcd's own (endpoints, gateway, leases, failover, etcd going away).
 * timeout: 90 */
#include "kv_etcd.h"
#include "mg_err.h"
#include "net.h"
#include "kv_cases.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/timerfd.h>
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
    struct mg_kv_etcd_opts o = {.endpoints = ep, .timeout_ms = 3000, .lease_ttl_ms = ttl_ms};
    struct mg_kv *kv = NULL;
    char err[512];
    int rc = mg_kv_etcd_open(&kv, &o, err, sizeof(err));
    if (rc < 0)
        BAIL_OUT("mg_kv_etcd_open(%s): %s", ep, err);
    return kv;
}

static struct mg_kv *open_fix(void *ctx)
{
    return open_kv(endpoint, 2000);
}

int main(void)
{
    struct mg_kv *kv, *kv2;
    char err[512], *val;
    size_t len;
    int64_t rev;
    int rc;

    {
        struct mg_kv_etcd_opts o = {.endpoints = "ftp://x:1"};
        rc = mg_kv_etcd_open(&kv, &o, err, sizeof(err));
        ok(rc == -EINVAL && strstr(err, "ftp://x:1"), "bad scheme refused: %s", err);
        o.endpoints = "host:99999";
        rc = mg_kv_etcd_open(&kv, &o, err, sizeof(err));
        ok(rc == -EINVAL && strstr(err, "host:99999"), "bad port refused: %s", err);
        o.endpoints = "";
        rc = mg_kv_etcd_open(&kv, &o, err, sizeof(err));
        ok(rc == -EINVAL, "empty endpoint refused: %s", err);
        o.endpoints = "127.0.0.1:1";
        o.libcurl = "libnosuchcurl.so.9";
        rc = mg_kv_etcd_open(&kv, &o, err, sizeof(err));
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
        ok(rc == -MG_ENONAME, "unknown name: -MG_ENONAME (%d)", rc);
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
    is_str(mg_kv_etcd_api_prefix(kv), "/v3/", "etcd 3.4 serves the gateway at /v3/");

    /* What every rendezvous backend must do (kv_cases.h). */
    {
        struct kv_fixture f = {
            .name = "etcd", .open = open_fix, .open_other = open_fix, .wait_blocks = 1};
        kv_cases(&f, "/t");
    }

    /* etcd's own: leases expire without keepalive, and a late one says so. */
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

    /* etcd that stops answering (stopped, not gone): a request gives up as
     * soon as abort_fd is readable (libcurl looks about once a second). */
    {
        int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
        struct itimerspec its = {.it_value = {.tv_nsec = 300000000L}};
        kv->ops->set(kv, "/t/stall", "1", 1, 0);
        kill(etcd_pid, SIGSTOP);
        waitpid(etcd_pid, NULL, WUNTRACED); /* stopped for sure */
        timerfd_settime(tfd, 0, &its, NULL);
        kv->abort_fd = tfd;
        rc = kv->ops->get(kv, "/t/stall", &val, &len, NULL);
        is_int(rc, -EINTR, "etcd stopped answering: the request gives up on abort_fd");
        ok(strstr(mg_kv_error(kv), "interrupted") != NULL, "  saying so: %s", mg_kv_error(kv));
        is_int(kv->ops->wait(kv, "/t/stall", 1, 60000), -EINTR, "  a watch too");
        kv->abort_fd = -1;
        close(tfd);
        kill(etcd_pid, SIGCONT);
        rc = kv->ops->get(kv, "/t/stall", &val, &len, NULL);
        ok(rc == 0, "answering again: requests work (%d)", rc);
        free(rc == 0 ? val : NULL);
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
