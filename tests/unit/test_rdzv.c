/* The rendezvous' pure parts (launcher/rdzv/rdzv_proto.c): node descriptors and
 * the documented rank order (with launcher/rdzv/node_order.c: scheduler
 * indexes, natural host name order); and the hostname checks of
 * launcher/rdzv/kv_open.c.
 * timeout: 30 */
#include "mg_err.h"
#include "kv_open.h"
#include "node_order.h"
#include "rdzv_proto.h"
#include "tap.h"

#include <errno.h>

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
    x.idx = -1;
    return x;
}

static struct mg_rdzv_desc di(const char *id, const char *host, int prev, int idx)
{
    struct mg_rdzv_desc x = d(id, host, prev, -1);
    x.idx = idx;
    return x;
}

static int index_of(char **env, const char *host, const char *want_src)
{
    char err[256] = "";
    const char *src = NULL;
    int i = mg_rdzv_sched_index(env, host, &src, err, sizeof(err));
    if (i >= 0 && (!src || strcmp(src, want_src)))
        diag("index %d from %s, expected from %s", i, src ? src : "(null)", want_src);
    return i >= 0 && src && strcmp(src, want_src) ? -100 : i;
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
    is_int(y.idx, -1, "  an agent from before idx=: no index");
    x.idx = 7;
    mg_rdzv_desc_format(&x, buf, sizeof(buf));
    is_int(mg_rdzv_desc_parse(buf, &y), 0, "idx= round trip");
    is_int(y.idx, 7, "  the index kept");
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
        struct mg_rdzv_desc v[12];
        char id[12][16], host[16];
        static const int shuffled[12] = {7, 10, 0, 3, 11, 1, 9, 2, 5, 8, 4, 6};
        for (int i = 0; i < 12; i++) {
            snprintf(id[i], sizeof(id[i]), "n%d", shuffled[i]);
            snprintf(host, sizeof(host), "mg-train-%d", shuffled[i]);
            v[i] = d(id[i], host, -1, -1);
        }
        order(v, 12, "n0 n1 n2 n3 n4 n5 n6 n7 n8 n9 n10 n11",
              "host names in natural order: mg-train-2 before mg-train-10");
    }
    {
        struct mg_rdzv_desc v[] = {di("a", "zeta", -1, 2), di("b", "alpha", -1, -1),
                                   di("c", "beta", -1, 0), di("e", "gamma", -1, 10),
                                   di("f", "delta", -1, 1)};
        order(v, 5, "c f a e b", "the scheduler's index first, nodes without one after");
    }
    {
        /* A re-formation: survivors 1 and 3 (ranks 0 and 1 last round), a
         * replacement for index 0 and a newcomer with index 2: placement
         * decides, and the survivors keep their relative order. */
        struct mg_rdzv_desc v[] = {di("s3", "h3", 1, 3), di("new0", "h0b", -1, 0),
                                   di("s1", "h1", 0, 1), di("new2", "h2", -1, 2)};
        order(v, 4, "new0 s1 new2 s3", "indexes across a re-formation: survivors keep their order");
        struct mg_rdzv_desc w[] = {di("s", "h9", 1, -1), di("t", "h1", 0, -1),
                                   di("n", "h0", -1, -1)};
        order(w, 3, "t s n", "without indexes: survivors first, in their order");
    }
    {
        is_int(mg_rdzv_natcmp("mg-train-2", "mg-train-10"), -1, "natcmp: 2 before 10");
        is_int(mg_rdzv_natcmp("node10", "node9"), 1, "natcmp: 10 after 9");
        is_int(mg_rdzv_natcmp("node01", "node1") != 0, 1, "natcmp: node01 and node1 differ");
        is_int(mg_rdzv_natcmp("node01", "node2"), -1, "natcmp: leading zeros by value");
        is_int(mg_rdzv_natcmp("a", "a"), 0, "natcmp: equal");
        is_int(mg_rdzv_natcmp("rack1-node2", "rack1-node"), 1, "natcmp: a prefix first");
        is_int(mg_rdzv_natcmp("gpu-a", "gpu-1"), 1, "natcmp: bytes otherwise");
        is_int(mg_rdzv_natcmp("n99999999999999999999999", "n100000000000000000000000"), -1,
               "natcmp: digit runs longer than a long");
    }
    {
        char *none[] = {NULL};
        char *job[] = {"SLURM_NODEID=5", "JOB_COMPLETION_INDEX=3", NULL};
        char *slurm[] = {"SLURM_NODEID=5", "SKYPILOT_NODE_RANK=1", NULL};
        char *sky[] = {"SKYPILOT_NODE_RANK=1", "VC_TASK_INDEX=4", NULL};
        char *vc[] = {"VC_TASK_INDEX=4", "JOB_COMPLETION_INDEX=", NULL};
        char *pod[] = {"KUBERNETES_SERVICE_HOST=10.96.0.1", NULL};
        char *bad[] = {"JOB_COMPLETION_INDEX=x1", NULL};
        char *neg[] = {"SKYPILOT_NODE_RANK=-1", NULL};
        char err[256];
        is_int(index_of(none, "mg-train-3", ""), -1, "no index outside a scheduler");
        is_int(index_of(job, "h", "JOB_COMPLETION_INDEX"), 3, "JOB_COMPLETION_INDEX first");
        is_int(index_of(slurm, "h", "SLURM_NODEID"), 5, "then SLURM_NODEID");
        is_int(index_of(sky, "h", "SKYPILOT_NODE_RANK"), 1, "then SKYPILOT_NODE_RANK");
        is_int(index_of(vc, "h", "VC_TASK_INDEX"), 4, "then VC_TASK_INDEX (empty ones skipped)");
        is_int(index_of(pod, "mg-train-12", "the pod name"), 12, "in a pod: its name's ordinal");
        is_int(index_of(pod, "mg-train-abc", ""), -1, "  none when the name ends otherwise");
        is_int(index_of(none, "node-7", ""), -1, "  outside Kubernetes a name is only a name");
        is_int(mg_rdzv_sched_index(bad, "h", NULL, err, sizeof(err)), -EINVAL,
               "a malformed index is an error");
        ok(strstr(err, "JOB_COMPLETION_INDEX='x1'") != NULL, "  naming it: %s", err);
        is_int(mg_rdzv_sched_index(neg, "h", NULL, err, sizeof(err)), -EINVAL,
               "a negative one too");
    }
    {
        struct mg_rdzv_desc v[] = {d("new", "aaa", -1, -1), d("x", "zzz", 1, -1),
                                   d("y", "mmm", 0, -1), d("z", "bbb", 2, -1)};
        order(v, 4, "y x z new", "members of the previous round keep their order; newcomers last");
    }
    {
        struct mg_rdzv_desc v[] = {d("p", "h1", 0, 2), d("q", "h2", 1, 0), d("r", "h0", -1, 1),
                                   di("s", "h", -1, 0)};
        v[2].idx = 5;
        order(v, 4, "q r p s", "a fixed --node_rank (static) decides over everything");
    }

    ok(mg_kv_is_local_host("127.0.0.1"), "127.0.0.1 is this machine");
    ok(mg_kv_is_local_host("localhost"), "localhost is this machine");
    ok(!mg_kv_is_local_host("192.0.2.77"), "a TEST-NET address is not");
    ok(!mg_kv_is_local_host("nosuchhost.invalid"), "an unknown name is not");
    /* the first heartbeat after forming: within (0, interval], spread evenly */
    {
        uint64_t rnd = 0x2545F4914F6CDD1Dull;
        int buckets[10] = {0}, inside = 1;
        for (int i = 0; i < 100000; i++) {
            rnd ^= rnd << 13, rnd ^= rnd >> 7, rnd ^= rnd << 17;
            int64_t t = mg_rdzv_first_tick_ms(rnd, 5000);
            if (t < 1 || t > 5000)
                inside = 0;
            else
                buckets[(t - 1) / 500]++;
        }
        int even = 1;
        for (int b = 0; b < 10; b++)
            even &= buckets[b] > 9000 && buckets[b] < 11000;
        ok(inside, "first heartbeat: always within (0, interval]");
        ok(even, "first heartbeat: each tenth of the interval takes about a tenth of the nodes");
        is_int(mg_rdzv_first_tick_ms(0, 5000), 1, "first heartbeat: never at once");
        is_int(mg_rdzv_first_tick_ms(4999, 5000), 5000, "first heartbeat: at most one interval");
        is_int(mg_rdzv_first_tick_ms(12345, 1), 1, "first heartbeat: an interval of 1 ms");
    }
    return done_testing();
}
