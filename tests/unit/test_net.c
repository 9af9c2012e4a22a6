/* net.c: host:port parsing, listen/connect on loopback, full reads and writes, deadlines. */
#include "mg_err.h"
#include "net.h"
#include "tap.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void parse_cases(void)
{
    struct mg_hostport hp;
    is_int(mg_parse_hostport("node1:29500", 1, &hp), 0, "host:port parses");
    is_str(hp.host, "node1", "host");
    is_int(hp.port, 29500, "port");
    is_int(mg_parse_hostport("node1", 2379, &hp), 0, "bare host parses");
    is_int(hp.port, 2379, "default port used");
    is_int(mg_parse_hostport("[::1]:80", 1, &hp), 0, "bracketed v6 parses");
    is_str(hp.host, "::1", "v6 host without brackets");
    is_int(hp.port, 80, "v6 port");
    is_int(mg_parse_hostport("fe80::1", 7, &hp), 0, "bare v6 parses");
    is_str(hp.host, "fe80::1", "bare v6 host kept whole");
    is_int(mg_parse_hostport("h:70000", 1, &hp), -EINVAL, "port out of range");
    is_int(mg_parse_hostport("h:12x", 1, &hp), -EINVAL, "port with junk");
    is_int(mg_parse_hostport(":80", 1, &hp), -EINVAL, "empty host");
    is_int(mg_parse_hostport("h:", 1, &hp), -EINVAL, "empty port");
    is_int(mg_parse_hostport("[::1", 1, &hp), -EINVAL, "unclosed bracket");
    is_int(mg_parse_hostport("http://u:p@h:x", 1, &hp), -EINVAL, "a URL is no host");
    is_int(mg_parse_hostport("http://h:2379", 1, &hp), -EINVAL, "  nor one without a password");
    is_int(mg_parse_hostport("a:b:c", 1, &hp), -EINVAL, "colons that are no IPv6 address");
    is_int(mg_parse_hostport("fe80::1%eth0", 7, &hp), 0, "v6 with a zone parses");
    is_int(mg_parse_hostport("[fe80::1%eth0]:80", 7, &hp), 0, "  and bracketed");
}

static void socket_cases(void)
{
    int port = 0;
    int lfd = mg_listen_tcp("127.0.0.1", 0, 8, &port);
    ok(lfd >= 0 && port > 0, "listen on an ephemeral loopback port (%d)", port);
    int c = mg_connect_tcp("127.0.0.1", port, mg_now_ms() + 2000);
    ok(c >= 0, "connect");
    int s = accept(lfd, NULL, NULL);
    ok(s >= 0, "accept");

    char out[100000], in[100000];
    for (size_t i = 0; i < sizeof(out); i++)
        out[i] = (char)(i * 7);
    is_int(mg_write_full(c, out, sizeof(out), mg_now_ms() + 2000), 0, "write 100 kB");
    is_int(mg_read_full(s, in, sizeof(in), mg_now_ms() + 2000), 0, "read 100 kB");
    ok(memcmp(in, out, sizeof(in)) == 0, "bytes arrive intact");

    int64_t t0 = mg_now_ms();
    is_int(mg_read_full(s, in, 1, mg_now_ms() + 100), -ETIMEDOUT, "read times out");
    ok(mg_now_ms() - t0 >= 90, "after the deadline");

    char name[64];
    is_int(mg_sock_local_addr(c, name, sizeof(name)), 0, "local address");
    is_str(name, "127.0.0.1", "local address is numeric v4");

    close(c);
    is_int(mg_read_full(s, in, 1, mg_now_ms() + 1000), -MG_ECLOSED, "EOF is MG_ECLOSED");
    close(s);
    close(lfd);

    int rc = mg_connect_tcp("127.0.0.1", port, mg_now_ms() + 1000);
    is_int(rc, -ECONNREFUSED, "nobody listening: refused");
    rc = mg_connect_tcp("no-such-host.invalid", port, mg_now_ms() + 1000);
    ok(rc == -MG_ENONAME || rc == -MG_ERESOLVE, "unknown name: %s", mg_strerror(rc));
    /* Never errno's ENOENT, which reads "No such file or directory". */
    ok(strstr(mg_strerror(rc), "does not resolve") != NULL, "said as such: %s", mg_strerror(rc));
}

int main(void)
{
    parse_cases();
    socket_cases();
    return done_testing();
}
