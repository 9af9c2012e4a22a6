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
    is_int(parse(&c, "prefix=/jobs/mg/", err, sizeof(err)), 0, "prefix");
    is_str(c.prefix, "/jobs/mg", "  trailing slash dropped");
    is_int(parse(&c, "", err, sizeof(err)), 0, "empty conf");
    is_int(parse(&c, "is_host=0", err, sizeof(err)), 0, "is_host=0");
    is_int(c.is_host, 0, "  false");

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
    bad_finish("cacert=/etc/hostname", MG_RDZV_C10D, "cacert");
    bad_finish("prefix=/x", MG_RDZV_STATIC, "prefix");
    bad_finish("is_host=1", MG_RDZV_ETCD, "is_host");
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
