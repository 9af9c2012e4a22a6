/* A raw store client (and fake server) for the integration tests: it sends
 * exactly the bytes it is told to, well-formed or not, and reports what comes
 * back, so the tests can check that garbage, oversized lengths, half frames,
 * wrong proofs and floods are handled.
 *
 *   storeraw HOST:PORT ACTION...
 *     hello [VERSION [LEASE_MS [FLAGS]]]  client hello; prints "shello version=V status=S auth=A"
 *     auth TOKEN          sends the proof for TOKEN; prints "auth status=S server=ok|bad"
 *     send HEX            raw bytes
 *     garbage N           N random bytes
 *     frame OP LEN        a frame header declaring LEN body bytes, and nothing else
 *     half-set            a SET header declaring 100 body bytes, then 10 of them
 *     set KEY VAL [eph]   a well-formed SET; prints "reply op=.. status=S rev=R"
 *     get KEY             a well-formed GET; prints "reply op=.. status=S value=V"
 *     reply               reads one frame; prints "reply op=.. status=S ..."
 *     sleep MS
 *     expect-eof MS       drains until the server closes; prints "eof" or fails (exit 1)
 *     expect-open MS      fails (exit 1) when the server closes within MS
 *     flood N MS          N more connections, each sending half a hello, held MS
 *
 *   storeraw --listen PORT_FILE [--token T] [--dump FILE]
 *     a fake server: accepts one client, answers its hello (asking for a token
 *     when --token is given, with the proofs computed from that token), then
 *     records every byte the client sent to FILE until it closes. */
#include "mg_err.h"
#include "net.h"
#include "sha256.h"
#include "store_proto.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

static int fd = -1;
static struct mg_hostport hp;
static uint8_t cnonce[MG_SP_NONCE_LEN], snonce[MG_SP_NONCE_LEN];
static uint32_t next_id = 1;

static void die(const char *what, int rc)
{
    fprintf(stderr, "storeraw: %s: %s\n", what, mg_strerror(rc));
    exit(1);
}

static void put(const void *buf, size_t len)
{
    int rc = mg_write_full(fd, buf, len, mg_now_ms() + 5000);
    if (rc)
        die("send", rc);
}

static void get(void *buf, size_t len)
{
    int rc = mg_read_full(fd, buf, len, mg_now_ms() + 5000);
    if (rc)
        die("receive", rc);
}

static int unhex(const char *s, uint8_t *out, size_t cap)
{
    size_t n = strlen(s) / 2;
    if (n > cap)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        out[i] = (uint8_t)v;
    }
    return (int)n;
}

static void print_reply(void)
{
    uint8_t hdr[MG_SP_HDR_LEN];
    struct mg_sp_hdr h;
    struct mg_sp_reply y;
    get(hdr, sizeof(hdr));
    mg_sp_hdr_decode(hdr, &h);
    if (mg_sp_hdr_check(&h, 1)) {
        printf("reply bad-header op=%d len=%u\n", h.op, h.len);
        exit(1);
    }
    uint8_t *body = malloc(h.len + 1);
    get(body, h.len);
    if (mg_sp_reply_decode(&h, body, &y)) {
        printf("reply bad-body op=%d\n", h.op);
        exit(1);
    }
    printf("reply op=%s status=%d rev=%lld", mg_sp_op_name(h.op), y.status, (long long)y.rev);
    if (y.val)
        printf(" value=%.*s", (int)y.vlen, (const char *)y.val);
    printf("\n");
    free(body);
}

static void send_req(struct mg_sp_req *q)
{
    uint8_t buf[4096];
    q->id = next_id++;
    if (mg_sp_req_size(q) > sizeof(buf))
        die("request", -MG_ETOOBIG);
    put(buf, mg_sp_req_encode(buf, q, 1));
}

static int wait_eof(int ms)
{
    int64_t end = mg_now_ms() + ms;
    char buf[4096];
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int rc = poll(&p, 1, mg_ms_until(end));
        if (rc <= 0)
            return 0;
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
            return 1;
    }
}

static void flood(int n, int ms)
{
    int *fds = calloc((size_t)n, sizeof(int)), opened = 0;
    struct mg_sp_hello h = {.version = MG_SP_WIRE_VERSION};
    uint8_t buf[MG_SP_HELLO_LEN];
    mg_sp_hello_encode(buf, &h);
    for (int i = 0; i < n; i++) {
        fds[i] = mg_connect_tcp(hp.host, hp.port, mg_now_ms() + 2000);
        if (fds[i] >= 0) {
            opened++;
            mg_write_full(fds[i], buf, MG_SP_HELLO_LEN / 2, mg_now_ms() + 1000);
        }
    }
    poll(NULL, 0, ms);
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(fds);
    printf("flood %d\n", opened);
}

/* The fake server: handshake as told, then record the client's bytes. */
static int fake_server(const char *port_file, const char *token, const char *dump)
{
    int port, lfd = mg_listen_tcp("127.0.0.1", 0, 4, &port);
    if (lfd < 0)
        die("listen", lfd);
    FILE *pf = fopen(port_file, "w");
    if (!pf)
        die("port file", -errno);
    fprintf(pf, "%d\n", port);
    fclose(pf);
    fd = accept(lfd, NULL, NULL);
    if (fd < 0)
        die("accept", -errno);
    FILE *out = dump ? fopen(dump, "w") : NULL;
    uint8_t buf[4096];
    struct mg_sp_hello h;
    get(buf, MG_SP_HELLO_LEN);
    if (out)
        fwrite(buf, 1, MG_SP_HELLO_LEN, out);
    mg_sp_hello_decode(buf, &h);
    struct mg_sp_shello sh = {.version = MG_SP_WIRE_VERSION, .flags = token ? MG_SP_HELLO_AUTH : 0};
    if (token && getrandom(sh.nonce, sizeof(sh.nonce), 0) != (ssize_t)sizeof(sh.nonce))
        die("getrandom", -errno);
    mg_sp_shello_encode(buf, &sh);
    put(buf, MG_SP_SHELLO_LEN);
    if (token) {
        uint8_t proof[MG_SP_PROOF_LEN];
        /* The client may hang up instead of proving itself. */
        if (mg_read_full(fd, buf, MG_SP_AUTH_LEN, mg_now_ms() + 5000) == 0) {
            if (out)
                fwrite(buf, 1, MG_SP_AUTH_LEN, out);
            mg_sp_server_proof(token, h.nonce, sh.nonce, proof);
            mg_sp_auth_reply_encode(buf, MG_SP_OK, proof);
            put(buf, MG_SP_AUTH_REPLY_LEN);
        }
    }
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0)
            break;
        if (out)
            fwrite(buf, 1, (size_t)n, out);
    }
    if (out)
        fclose(out);
    close(fd);
    close(lfd);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "--listen")) {
        const char *token = NULL, *dump = NULL;
        for (int i = 3; i + 1 < argc; i += 2) {
            if (!strcmp(argv[i], "--token"))
                token = argv[i + 1];
            else if (!strcmp(argv[i], "--dump"))
                dump = argv[i + 1];
        }
        return fake_server(argv[2], token, dump);
    }
    if (argc < 2 || mg_parse_hostport(argv[1], 0, &hp) || !hp.port) {
        fprintf(stderr, "usage: storeraw HOST:PORT ACTION... | storeraw --listen PORT_FILE\n");
        return 2;
    }
    fd = mg_connect_tcp(hp.host, hp.port, mg_now_ms() + 5000);
    if (fd < 0)
        die("connect", fd);
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *arg1 = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "hello")) {
            struct mg_sp_hello h = {.version = MG_SP_WIRE_VERSION};
            struct mg_sp_shello sh;
            uint8_t buf[MG_SP_HELLO_LEN];
            /* Optional numeric arguments, in order. */
            uint32_t *fields[] = {NULL, NULL, NULL};
            uint32_t ver = h.version, lease = 0, flags = 0;
            fields[0] = &ver;
            fields[1] = &lease;
            fields[2] = &flags;
            for (int k = 0; k < 3 && i + 1 < argc && argv[i + 1][0] >= '0' && argv[i + 1][0] <= '9';
                 k++)
                *fields[k] = (uint32_t)strtoul(argv[++i], NULL, 0);
            h.version = (uint16_t)ver;
            h.lease_ms = lease;
            h.flags = (uint16_t)flags;
            if (getrandom(h.nonce, sizeof(h.nonce), 0) != (ssize_t)sizeof(h.nonce))
                die("getrandom", -errno);
            memcpy(cnonce, h.nonce, sizeof(cnonce));
            mg_sp_hello_encode(buf, &h);
            put(buf, sizeof(buf));
            get(buf, MG_SP_SHELLO_LEN);
            if (mg_sp_shello_decode(buf, &sh))
                die("server hello", -MG_EPROTO);
            memcpy(snonce, sh.nonce, sizeof(snonce));
            printf("shello version=%d status=%d auth=%d\n", sh.version, sh.status,
                   (sh.flags & MG_SP_HELLO_AUTH) ? 1 : 0);
        } else if (!strcmp(a, "auth") && arg1) {
            uint8_t proof[MG_SP_PROOF_LEN], reply[MG_SP_AUTH_REPLY_LEN], want[MG_SP_PROOF_LEN];
            uint16_t status;
            mg_sp_client_proof(arg1, cnonce, snonce, proof);
            put(proof, sizeof(proof));
            get(reply, sizeof(reply));
            mg_sp_auth_reply_decode(reply, &status, proof);
            mg_sp_server_proof(arg1, cnonce, snonce, want);
            printf("auth status=%d server=%s\n", status,
                   mg_memeq_ct(want, proof, sizeof(want)) ? "ok" : "bad");
            i++;
        } else if (!strcmp(a, "send") && arg1) {
            uint8_t buf[4096];
            int n = unhex(arg1, buf, sizeof(buf));
            if (n < 0)
                die("send: bad hex", -EINVAL);
            put(buf, (size_t)n);
            i++;
        } else if (!strcmp(a, "garbage") && arg1) {
            size_t n = strtoul(arg1, NULL, 10);
            uint8_t *buf = malloc(n);
            for (size_t k = 0; k < n; k++)
                buf[k] = (uint8_t)rand();
            /* The server may close before taking it all: that is the point. */
            mg_write_full(fd, buf, n, mg_now_ms() + 2000);
            free(buf);
            i++;
        } else if (!strcmp(a, "frame") && i + 2 < argc) {
            struct mg_sp_hdr h = {.op = (uint8_t)strtoul(argv[i + 1], NULL, 0),
                                  .len = (uint32_t)strtoul(argv[i + 2], NULL, 0),
                                  .id = next_id++};
            uint8_t buf[MG_SP_HDR_LEN];
            mg_sp_hdr_encode(buf, &h);
            put(buf, sizeof(buf));
            i += 2;
        } else if (!strcmp(a, "half-set")) {
            uint8_t buf[MG_SP_HDR_LEN + 10] = {0};
            struct mg_sp_hdr h = {.op = MG_SP_SET, .len = 100, .id = next_id++};
            mg_sp_hdr_encode(buf, &h);
            put(buf, sizeof(buf));
        } else if (!strcmp(a, "set") && i + 2 < argc) {
            struct mg_sp_req q = {.op = MG_SP_SET,
                                  .key = (const uint8_t *)argv[i + 1],
                                  .klen = strlen(argv[i + 1]),
                                  .val = (const uint8_t *)argv[i + 2],
                                  .vlen = strlen(argv[i + 2])};
            i += 2;
            if (i + 1 < argc && !strcmp(argv[i + 1], "eph")) {
                q.flags = MG_SP_F_EPHEMERAL;
                i++;
            }
            send_req(&q);
            print_reply();
        } else if (!strcmp(a, "get") && arg1) {
            struct mg_sp_req q = {
                .op = MG_SP_GET, .key = (const uint8_t *)arg1, .klen = strlen(arg1)};
            send_req(&q);
            print_reply();
            i++;
        } else if (!strcmp(a, "reply")) {
            print_reply();
        } else if (!strcmp(a, "sleep") && arg1) {
            poll(NULL, 0, atoi(arg1));
            i++;
        } else if (!strcmp(a, "expect-eof") && arg1) {
            int64_t t0 = mg_now_ms();
            if (!wait_eof(atoi(arg1))) {
                printf("no-eof\n");
                return 1;
            }
            printf("eof after %lld ms\n", (long long)(mg_now_ms() - t0));
            i++;
        } else if (!strcmp(a, "expect-open") && arg1) {
            if (wait_eof(atoi(arg1))) {
                printf("closed\n");
                return 1;
            }
            printf("open\n");
            i++;
        } else if (!strcmp(a, "flood") && i + 2 < argc) {
            flood(atoi(argv[i + 1]), atoi(argv[i + 2]));
            i += 2;
        } else {
            fprintf(stderr, "storeraw: bad action '%s'\n", a);
            return 2;
        }
    }
    close(fd);
    return 0;
}
