/* --rdzv_conf parsing and validation (launcher/rdzv/rdzv_conf.c).
 * timeout: 30 */
#include "rdzv_conf.h"
#include "tap.h"

#include <errno.h>

static int parse(struct mg_rdzv_conf *c, const char *text, char *err, size_t n)
{
    mg_rdzv_conf_init(c);
    err[0] = 0;
    return mg_rdzv_conf_parse(c, text, err, n);
}

static void bad(const char *text, const char *must_name)
{
    struct mg_rdzv_conf c;
    char err[512];
    int rc = parse(&c, text, err, sizeof(err));
    is_int(rc, -EINVAL, "rejects '%s'", text);
    ok(strstr(err, must_name) != NULL, "  message names '%s': %s", must_name, err);
}

static void bad_finish(const char *text, enum mg_rdzv_backend b, const char *must_name)
{
    struct mg_rdzv_conf c;
    char err[512];
    char *env[] = {NULL};
    int rc = parse(&c, text, err, sizeof(err));
    if (rc == 0)
        rc = mg_rdzv_conf_finish(&c, b, env, err, sizeof(err));
    is_int(rc, -EINVAL, "finish rejects '%s' for %s", text, mg_rdzv_backend_name(b));
    ok(strstr(err, must_name) != NULL, "  message names '%s': %s", must_name, err);
}

static struct mg_rdzv_conf c_last;

/* Accepted by parse and finish, with a note that says why it has no effect. */
static void noted_finish(const char *text, enum mg_rdzv_backend b, const char *note)
{
    char err[512];
    char *env[] = {NULL};
    int rc = parse(&c_last, text, err, sizeof(err));
    if (rc == 0)
        rc = mg_rdzv_conf_finish(&c_last, b, env, err, sizeof(err));
    is_int(rc, 0, "'%s' accepted for %s (%s)", text, mg_rdzv_backend_name(b), err);
    ok(strstr(c_last.notes, note) != NULL, "  with a note '%s': %s", note, c_last.notes);
}

int main(void)
{
    struct mg_rdzv_conf c;
    char err[512];
    int ms;

    mg_rdzv_conf_init(&c);
    is_int(c.join_timeout_ms, 600000, "default join_timeout 600 s (torchrun's)");
    is_int(c.last_call_timeout_ms, 30000, "default last_call_timeout 30 s");
    is_int(c.heartbeat_interval_ms, 1000, "default heartbeat_interval 1 s");
    is_int(c.heartbeat_timeout_ms, 5000, "default heartbeat_timeout 5 s");
    is_int(c.is_host, -1, "is_host decided from the endpoint by default");
    is_str(c.prefix, "/mg/rdzv", "default etcd prefix");

    is_int(mg_rdzv_parse_duration_ms("30", &ms), 0, "duration '30'");
    is_int(ms, 30000, "  is 30000 ms");
    is_int(mg_rdzv_parse_duration_ms("0.25", &ms), 0, "duration '0.25'");
    is_int(ms, 250, "  is 250 ms");
    is_int(mg_rdzv_parse_duration_ms("150ms", &ms), 0, "duration '150ms'");
    is_int(ms, 150, "  is 150 ms");
    is_int(mg_rdzv_parse_duration_ms("2s", &ms), 0, "duration '2s'");
    is_int(ms, 2000, "  is 2000 ms");
    ok(mg_rdzv_parse_duration_ms("abc", &ms) < 0, "duration 'abc' rejected");
    ok(mg_rdzv_parse_duration_ms("-1", &ms) < 0, "negative duration rejected");
    ok(mg_rdzv_parse_duration_ms("5m", &ms) < 0, "unknown unit rejected");
    ok(mg_rdzv_parse_duration_ms("1e12", &ms) < 0, "huge duration rejected");

    is_int(parse(&c,
                 "join_timeout=20,last_call_timeout=0.5,close_timeout=3,heartbeat_interval=200ms,"
                 "heartbeat_timeout=2,is_host=true,token=s3cret,exit_barrier_timeout=9,"
                 "read_timeout=7",
                 err, sizeof(err)),
           0, "a full conf parses");
    is_int(c.join_timeout_ms, 20000, "join_timeout");
    is_int(c.last_call_timeout_ms, 500, "last_call_timeout");
    is_int(c.close_timeout_ms, 3000, "close_timeout");
    is_int(c.heartbeat_interval_ms, 200, "heartbeat_interval");
    is_int(c.heartbeat_timeout_ms, 2000, "heartbeat_timeout");
    is_int(c.exit_barrier_timeout_ms, 9000, "exit_barrier_timeout");
    is_int(c.read_timeout_ms, 7000, "read_timeout");
    is_int(c.is_host, 1, "is_host");
    is_str(c.token, "s3cret", "token");

    is_int(parse(&c, "last_call_timeout=0", err, sizeof(err)), 0, "last_call_timeout may be 0");
    is_int(parse(&c, "keep_alive_interval=2,keep_alive_max_attempt=4", err, sizeof(err)), 0,
           "torchrun's keep_alive keys");
    is_int(c.heartbeat_interval_ms, 2000, "  keep_alive_interval is heartbeat_interval");
    is_int(c.heartbeat_timeout_ms, 8000, "  heartbeat_timeout = interval x max_attempt");
    is_int(parse(&c, "keep_alive_interval=5", err, sizeof(err)), 0, "keep_alive_interval alone");
    is_int(c.heartbeat_timeout_ms, 15000, "  heartbeat_timeout = 3 intervals (torchrun's default)");
    is_int(parse(&c, "prefix=/jobs/mg/", err, sizeof(err)), 0, "prefix");
    is_str(c.prefix, "/jobs/mg", "  trailing slash dropped");
    is_int(parse(&c, "", err, sizeof(err)), 0, "empty conf");
    is_int(parse(&c, "is_host=0", err, sizeof(err)), 0, "is_host=0");
    is_int(c.is_host, 0, "  false");

    /* torchrun's names (1.13 and 2.x) for mg's settings */
    is_int(parse(&c, "timeout=3600", err, sizeof(err)), 0, "timeout (static, etcd)");
    is_int(c.join_timeout_ms, 3600000, "  is join_timeout");
    is_int(parse(&c, "etcd_prefix=/torchelastic/p2p,ca_cert=/a,ssl_cert=/b,ssl_cert_key=/c", err,
                 sizeof(err)),
           0, "etcd's and etcd-v2's names");
    is_str(c.prefix, "/torchelastic/p2p", "  etcd_prefix is prefix");
    is_str(c.cacert, "/a", "  ca_cert is cacert");
    is_str(c.cert, "/b", "  ssl_cert is cert");
    is_str(c.key, "/c", "  ssl_cert_key is key");
    is_int(parse(&c, "protocol=https", err, sizeof(err)), 0, "protocol=https");
    ok(c.https, "  etcd over https");
    is_int(parse(&c, "protocol=HTTP", err, sizeof(err)), 0, "protocol=HTTP");
    ok(!c.https, "  plain http");
    is_int(parse(&c, "store_type=tcp", err, sizeof(err)), 0, "store_type=tcp");
    is_str(c.notes, "", "  nothing to say");
    is_int(parse(&c, "use_libuv=True", err, sizeof(err)), 0, "use_libuv=True");
    ok(strstr(c.notes, "use_libuv=True: no effect") != NULL, "  noted: %s", c.notes);
    is_int(parse(&c, "rank=1,is_host=T", err, sizeof(err)), 0, "rank=1 (torchrun's static)");
    ok(strstr(c.notes, "rank=1: ignored; --node_rank") != NULL, "  noted: %s", c.notes);
    is_int(c.is_host, 1, "  is_host=T is true (torch's get_as_bool)");
    is_int(parse(&c, " join_timeout = 7 , read_timeout=3 ", err, sizeof(err)), 0,
           "spaces around keys and values (torchrun strips them)");
    is_int(c.join_timeout_ms, 7000, "  join_timeout 7 s");
    is_int(parse(&c, "join_timeout=3,join_timeout=4", err, sizeof(err)), 0,
           "one name twice: the last wins, as in torchrun's dict");
    is_int(c.join_timeout_ms, 4000, "  4 s");
    /* TorchX's dist.ddp: both names; torchrun's c10d reads join_timeout, its
     * static and etcd backends timeout. */
    noted_finish("join_timeout=1800,close_timeout=600,timeout=1800", MG_RDZV_C10D, "");
    is_int(c_last.join_timeout_ms, 1800000, "  TorchX's conf: join_timeout 1800 s");
    is_int(c_last.close_timeout_ms, 600000, "  close_timeout 600 s");
    is_str(c_last.notes, "", "  equal values: nothing to say");
    noted_finish("timeout=5,join_timeout=6", MG_RDZV_C10D,
                 "join_timeout=6s and timeout=5s differ; the c10d backend uses join_timeout");
    is_int(c_last.join_timeout_ms, 6000, "  c10d: join_timeout wins");
    noted_finish("join_timeout=6,timeout=5", MG_RDZV_STATIC, "the static backend uses timeout");
    is_int(c_last.join_timeout_ms, 5000, "  static: timeout wins");
    noted_finish("join_timeout=6,timeout=5", MG_RDZV_ETCD, "the etcd backend uses timeout");
    is_int(c_last.join_timeout_ms, 5000, "  etcd: timeout wins");
    is_int(parse(&c, "timeout=9", err, sizeof(err)), 0, "timeout alone");
    is_int(c.join_timeout_ms, 9000, "  is the join timeout");
    bad("timeout=0,join_timeout=6", "timeout=0: must be positive");
    bad("cacert=/a,ca_cert=/b", "cacert and ca_cert");
    bad("store_type=file", "no file store");
    bad("store_type=redis", "store_type=redis");
    bad("protocol=ftp", "protocol=ftp");
    bad("use_libuv=perhaps", "use_libuv=perhaps");
    bad("rank=-1", "rank=-1");
    bad("bogus=1", "known: join_timeout, timeout, last_call_timeout");
    mg_rdzv_conf_init(&c);
    is_int(c.exclude_after, 0, "node exclusion off by default");
    is_int(parse(&c, "exclude_after=3,exclude_window=90,exclude_cooldown=5m", err, sizeof(err)),
           -EINVAL, "exclude_cooldown=5m is not a duration");
    is_int(parse(&c, "exclude_after=3,exclude_window=90,exclude_cooldown=300", err, sizeof(err)), 0,
           "node exclusion's keys");
    ok(c.exclude_after == 3 && c.exclude_window_ms == 90000 && c.exclude_cooldown_ms == 300000,
       "  3 failures within 90 s: out for 300 s");
    bad("exclude_after=-1",
        "exclude_after=-1: expected a number of failures from 0 (never) to 100");
    bad("exclude_after=101", "exclude_after=101");
    bad("exclude_window=0", "exclude_window=0: must be positive");
    bad("bogus=1", "use_libuv, rank, exclude_after, exclude_window, exclude_cooldown)");
    bad("bogus=1", "bogus");
    bad("join_timeout=abc", "join_timeout=abc");
    bad("join_timeout=0", "join_timeout");
    bad("heartbeat_timeout=-3", "heartbeat_timeout");
    bad("is_host=maybe", "is_host=maybe");
    bad("noequals", "noequals");
    bad("=5", "=5");
    bad("token=", "token");
    bad("prefix=relative", "prefix=relative");
    bad("keep_alive_max_attempt=0", "keep_alive_max_attempt");
    bad("heartbeat_timeout=9,keep_alive_max_attempt=3", "keep_alive_max_attempt");
    {
        char big[MG_RDZV_CONF_MAX + 10];
        memset(big, 'a', sizeof(big) - 1);
        big[sizeof(big) - 1] = 0;
        bad(big, "limit");
        char tok[400] = "token=";
        memset(tok + 6, 'x', 300);
        tok[306] = 0;
        bad(tok, "token");
    }

    bad_finish("heartbeat_interval=2,heartbeat_timeout=3", MG_RDZV_C10D, "heartbeat_timeout");
    bad_finish("heartbeat_interval=5ms", MG_RDZV_C10D, "heartbeat_interval");
    bad_finish("heartbeat_interval=0.5,heartbeat_timeout=1.5", MG_RDZV_ETCD, "heartbeat_timeout");
    noted_finish("cacert=/etc/hostname", MG_RDZV_C10D, "cacert: applies to the etcd backend");
    is_str(c_last.cacert, "", "  and dropped");
    noted_finish("prefix=/x", MG_RDZV_STATIC, "prefix: applies to the etcd backend");
    is_str(c_last.prefix, "/mg/rdzv", "  and the default kept");
    noted_finish("protocol=https", MG_RDZV_C10D, "protocol: applies to the etcd backend");
    ok(!c_last.https, "  and dropped");
    noted_finish("is_host=1", MG_RDZV_ETCD, "is_host: the etcd backend has no store to host");
    is_int(c_last.is_host, -1, "  and dropped");
    noted_finish("store_type=tcp", MG_RDZV_ETCD, "store_type: applies to the c10d backend only");
    bad_finish("cacert=/nonexistent/ca.pem", MG_RDZV_ETCD, "cacert=/nonexistent/ca.pem");
    bad_finish("cert=/etc/hostname", MG_RDZV_ETCD, "key");
    bad_finish("join_timeout=5,last_call_timeout=10", MG_RDZV_C10D, "last_call_timeout");

    {
        char *env[] = {"MG_RDZV_TOKEN=fromenv", NULL};
        parse(&c, "", err, sizeof(err));
        is_int(mg_rdzv_conf_finish(&c, MG_RDZV_C10D, env, err, sizeof(err)), 0, "finish ok");
        is_str(c.token, "fromenv", "MG_RDZV_TOKEN used when the conf has no token");
        parse(&c, "token=fromconf", err, sizeof(err));
        is_int(mg_rdzv_conf_finish(&c, MG_RDZV_C10D, env, err, sizeof(err)), 0, "finish ok");
        is_str(c.token, "fromconf", "the conf's token wins over MG_RDZV_TOKEN");
        parse(&c, "cacert=/etc/hostname", err, sizeof(err));
        is_int(mg_rdzv_conf_finish(&c, MG_RDZV_ETCD, env, err, sizeof(err)), 0,
               "etcd with a readable cacert");
    }

    {
        enum mg_rdzv_backend b;
        ok(mg_rdzv_backend_parse("c10d", &b) == 0 && b == MG_RDZV_C10D, "backend c10d");
        ok(mg_rdzv_backend_parse("etcd", &b) == 0 && b == MG_RDZV_ETCD, "backend etcd");
        ok(mg_rdzv_backend_parse("etcd-v3", &b) == 0 && b == MG_RDZV_ETCD, "backend etcd-v3");
        ok(mg_rdzv_backend_parse("static", &b) == 0 && b == MG_RDZV_STATIC, "backend static");
        ok(mg_rdzv_backend_parse("etcd-v2", &b) < 0, "etcd-v2 is not supported");
        ok(mg_rdzv_backend_parse("zk", &b) < 0, "unknown backend");
    }
    return done_testing();
}
