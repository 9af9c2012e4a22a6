/* The rendezvous' pure parts (launcher/rdzv/rdzv_proto.c): node descriptors and
 * the documented rank order; and the hostname checks of launcher/rdzv/kv_open.c.
 * timeout: 30 */
#include "mg_err.h"
#include "kv_open.h"
#include "rdzv_proto.h"
#include "tap.h"

static struct mg_rdzv_desc d(const char *id, const char *host, int prev, int fixed)
{
    struct mg_rdzv_desc x;
    memset(&x, 0, sizeof(x));
    snprintf(x.id, sizeof(x.id), "%s", id);
    snprintf(x.host, sizeof(x.host), "%s", host);
    snprintf(x.addr, sizeof(x.addr), "10.0.0.1");
    x.port = 1234;
    x.nproc = 2;
    x.prev = prev;
    x.fixed = fixed;
    return x;
}

static void order(struct mg_rdzv_desc *v, int n, const char *want, const char *what)
{
    char got[256] = "";
    mg_rdzv_rank_order(v, n);
    for (int i = 0; i < n; i++) {
        strcat(got, v[i].id);
        if (i + 1 < n)
            strcat(got, " ");
    }
    is_str(got, want, "%s", what);
}

int main(void)
{
    struct mg_rdzv_desc x, y;
    char buf[1024];

    x = d("node1-42-abcd", "node1", 3, -1);
    int n = mg_rdzv_desc_format(&x, buf, sizeof(buf));
    ok(n > 0, "format: %s", buf);
    is_int(mg_rdzv_desc_parse(buf, &y), 0, "parse what format wrote");
    ok(!strcmp(y.id, x.id) && !strcmp(y.host, x.host) && !strcmp(y.addr, x.addr) &&
           y.port == 1234 && y.nproc == 2 && y.prev == 3 && y.fixed == -1,
       "round trip keeps every field");
    is_int(mg_rdzv_desc_parse("id=a host=b addr=c port=1 nproc=1 prev=-1 fixed=-1 future=x", &y), 0,
           "an unknown field (a newer agent) is skipped");
    is_int(mg_rdzv_desc_parse("id=a host=b addr=c port=1 nproc=1 prev=-1", &y), -MG_EFORMAT,
           "a missing field is an error");
    is_int(mg_rdzv_desc_parse("id=a host=b addr=c port=99999 nproc=1 prev=-1 fixed=-1", &y),
           -MG_EFORMAT, "a port out of range is an error");
    is_int(mg_rdzv_desc_parse("id=a host=b addr=c port=1 nproc=0 prev=-1 fixed=-1", &y),
           -MG_EFORMAT, "nproc 0 is an error");
    is_int(mg_rdzv_desc_parse("garbage", &y), -MG_EFORMAT, "garbage is an error");
    {
        char big[600];
        memset(big, 'h', sizeof(big));
        memcpy(big, "host=", 5);
        big[sizeof(big) - 1] = 0;
        is_int(mg_rdzv_desc_parse(big, &y), -MG_EFORMAT, "an over-long field is an error");
    }
    is_int(mg_rdzv_desc_parse("id=a host=b addr=c port=1 nproc=1 prev=-1 fixed=-1\nid=z", &y), 0,
           "parsing stops at the end of the line");

    {
        struct mg_rdzv_desc v[] = {d("c-1", "gpu03", -1, -1), d("a-1", "gpu01", -1, -1),
                                   d("b-2", "gpu02", -1, -1), d("b-1", "gpu02", -1, -1)};
        order(v, 4, "a-1 b-1 b-2 c-1", "a new group: by host name, then agent id");
    }
    {
        struct mg_rdzv_desc v[] = {d("new", "aaa", -1, -1), d("x", "zzz", 1, -1),
                                   d("y", "mmm", 0, -1), d("z", "bbb", 2, -1)};
        order(v, 4, "y x z new", "members of the previous round keep their order; newcomers last");
    }
    {
        struct mg_rdzv_desc v[] = {d("p", "h1", 0, 2), d("q", "h2", 1, 0), d("r", "h0", -1, 1)};
        order(v, 3, "q r p", "a fixed --node_rank (static) decides over everything");
    }

    ok(mg_kv_is_local_host("127.0.0.1"), "127.0.0.1 is this machine");
    ok(mg_kv_is_local_host("localhost"), "localhost is this machine");
    ok(!mg_kv_is_local_host("192.0.2.77"), "a TEST-NET address is not");
    ok(!mg_kv_is_local_host("nosuchhost.invalid"), "an unknown name is not");
    return done_testing();
}
