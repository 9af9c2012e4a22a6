/* store_proto.c: the wire codec. The worked example of docs/store-protocol.md
 * byte for byte, round trips of every request and reply, every bound (at and
 * one past it), truncated and corrupt bodies, and the status mapping. */
#include "mg_err.h"
#include "store_proto.h"
#include "tap.h"
#include "store_frames.h"

#include <errno.h>

/* timeout: 60 */

static void hex(const uint8_t *d, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
    out[2 * n] = '\0';
}

/* Encodes q and decodes it back from the wire bytes. */
static int roundtrip(const struct mg_sp_req *q, struct mg_sp_req *out, uint8_t *buf)
{
    size_t n = mg_sp_req_encode(buf, q, 1);
    struct mg_sp_hdr h;
    if (n != mg_sp_req_size(q))
        return -1000;
    mg_sp_hdr_decode(buf, &h);
    if (h.len != n - MG_SP_HDR_LEN || mg_sp_hdr_check(&h, 0))
        return -1001;
    return mg_sp_req_decode(&h, buf + MG_SP_HDR_LEN, out);
}

/* Every shorter declared length of a valid frame must fail to decode, and
 * one byte more too. */
static int truncations_fail(const uint8_t *frame, int reply)
{
    struct mg_sp_hdr h;
    mg_sp_hdr_decode(frame, &h);
    uint32_t full = h.len;
    uint8_t *copy = malloc(full + 1);
    memcpy(copy, frame + MG_SP_HDR_LEN, full);
    copy[full] = 0;
    int bad = 0;
    for (uint32_t len = 0; len < full; len++) {
        h.len = len;
        struct mg_sp_req q;
        struct mg_sp_reply y;
        int rc = reply ? mg_sp_reply_decode(&h, copy, &y) : mg_sp_req_decode(&h, copy, &q);
        if (rc != -MG_ETRUNC && rc != -MG_EPROTO && rc != -EINVAL)
            bad++;
    }
    h.len = full + 1;
    struct mg_sp_req q;
    struct mg_sp_reply y;
    int rc = reply ? mg_sp_reply_decode(&h, copy, &y) : mg_sp_req_decode(&h, copy, &q);
    if (rc != -MG_EPROTO && rc != -MG_ETOOBIG) /* too big: fixed-size bodies */
        bad++;
    free(copy);
    return bad;
}

static void worked_example(void)
{
    uint8_t buf[128];
    char h[512];
    struct mg_sp_req q = {.op = MG_SP_SET,
                          .id = 1,
                          .key = (const uint8_t *)"job/1",
                          .klen = 5,
                          .val = (const uint8_t *)"hi",
                          .vlen = 2};
    size_t n = mg_sp_req_encode(buf, &q, 1);
    hex(buf, n, h);
    is_str(h,
           "0d00000002000000010000000500"
           "6a6f622f31"
           "02000000"
           "6869",
           "doc example: SET job/1 = hi");
    struct mg_sp_reply y = {.op = MG_SP_SET, .id = 1, .rev = 7};
    n = mg_sp_reply_encode(buf, &y, 1);
    hex(buf, n, h);
    is_str(h,
           "080000008200000001000000"
           "0700000000000000",
           "doc example: its reply");
    struct mg_sp_reply e = {.op = MG_SP_GET, .id = 2, .status = MG_SP_NOKEY};
    n = mg_sp_reply_encode(buf, &e, 1);
    hex(buf, n, h);
    is_str(h, "000000008300010002000000", "doc example: GET reply with status NOKEY");

    struct mg_sp_hello he = {.version = 1, .flags = MG_SP_HELLO_AUTH, .lease_ms = 5000};
    memset(he.nonce, 1, sizeof(he.nonce));
    mg_sp_hello_encode(buf, &he);
    hex(buf, 12, h);
    is_str(h,
           "4d47535401000100"
           "88130000",
           "doc example: client hello header");
    uint8_t cn[32], sn[32], p[32];
    memset(cn, 1, 32);
    memset(sn, 2, 32);
    mg_sp_client_proof("secret", cn, sn, p);
    hex(p, 32, h);
    is_str(h, "723627bbc37737cfb303678d50036f2651ad79b51c710e81f8c9825b08497aae",
           "doc example: client proof");
    mg_sp_server_proof("secret", cn, sn, p);
    hex(p, 32, h);
    is_str(h, "37ee9847a24339ac63fa6afe9381a12348f36261ab1cf305a9a8acc5ddb9fba6",
           "doc example: server proof");

    struct mg_sp_hello back;
    mg_sp_hello_encode(buf, &he);
    is_int(mg_sp_hello_decode(buf, &back), 0, "hello decodes");
    ok(back.version == 1 && back.flags == 1 && back.lease_ms == 5000 &&
           !memcmp(back.nonce, he.nonce, 32),
       "hello round-trips");
    buf[0] = 'X';
    is_int(mg_sp_hello_decode(buf, &back), -MG_EPROTO, "bad magic: EPROTO");
    struct mg_sp_shello sh = {.version = 1, .status = MG_SP_AUTH, .flags = 1}, sb;
    mg_sp_shello_encode(buf, &sh);
    is_int(mg_sp_shello_decode(buf, &sb), 0, "server hello decodes");
    ok(sb.status == MG_SP_AUTH && sb.flags == 1, "server hello round-trips");
    uint16_t st;
    mg_sp_auth_reply_encode(buf, MG_SP_OK, p);
    mg_sp_auth_reply_decode(buf, &st, cn);
    ok(st == 0 && !memcmp(cn, p, 32), "auth reply round-trips");
}

static void requests(void)
{
    static uint8_t buf[1 << 20];
    struct mg_sp_req q, r;
    uint8_t packed[64];
    size_t pl = 0;
    pl += mg_sp_keys_put(packed + pl, (const uint8_t *)"a", 1);
    pl += mg_sp_keys_put(packed + pl, (const uint8_t *)"bb", 2);

    struct mg_sp_req cases[] = {
        {.op = MG_SP_PING, .id = 9},
        {.op = MG_SP_SET,
         .flags = MG_SP_F_EPHEMERAL,
         .key = (const uint8_t *)"k",
         .klen = 1,
         .val = (const uint8_t *)"value",
         .vlen = 5},
        {.op = MG_SP_GET, .timeout_ms = 1234, .key = (const uint8_t *)"key", .klen = 3},
        {.op = MG_SP_ADD, .num = -42, .key = (const uint8_t *)"ctr", .klen = 3},
        {.op = MG_SP_CAS,
         .key = (const uint8_t *)"c",
         .klen = 1,
         .val = (const uint8_t *)"old",
         .vlen = 3,
         .val2 = (const uint8_t *)"new!",
         .vlen2 = 4},
        {.op = MG_SP_CAS,
         .flags = MG_SP_F_EXPECT_ABSENT,
         .key = (const uint8_t *)"c",
         .klen = 1,
         .val2 = (const uint8_t *)"first",
         .vlen2 = 5},
        {.op = MG_SP_WAIT, .timeout_ms = 77, .nkeys = 2, .keys = packed, .keys_len = pl},
        {.op = MG_SP_CHECK, .nkeys = 2, .keys = packed, .keys_len = pl},
        {.op = MG_SP_DELETE, .key = (const uint8_t *)"gone", .klen = 4},
        {.op = MG_SP_WATCH,
         .num = 123456789012345,
         .timeout_ms = 5,
         .key = (const uint8_t *)"w",
         .klen = 1},
        {.op = MG_SP_LIST, .max = 10, .key = (const uint8_t *)"pre/", .klen = 4},
        {.op = MG_SP_LIST, .max = 0, .key = (const uint8_t *)"", .klen = 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        q = cases[i];
        q.id = (uint32_t)(100 + i);
        const char *name = mg_sp_op_name(q.op);
        is_int(mg_sp_req_check(&q), 0, "%s request passes the check", name);
        is_int(roundtrip(&q, &r, buf), 0, "%s request round-trips", name);
        ok(r.op == q.op && r.flags == q.flags && r.id == q.id && r.timeout_ms == q.timeout_ms &&
               r.num == q.num && r.max == q.max && r.klen == q.klen &&
               (!q.klen || !memcmp(r.key, q.key, q.klen)) && r.vlen == q.vlen &&
               (!q.vlen || !memcmp(r.val, q.val, q.vlen)) && r.vlen2 == q.vlen2 &&
               (!q.vlen2 || !memcmp(r.val2, q.val2, q.vlen2)) && r.nkeys == q.nkeys &&
               r.keys_len == q.keys_len && (!q.keys_len || !memcmp(r.keys, q.keys, q.keys_len)),
           "%s fields equal", name);
        /* The head plus the tail is the whole frame. */
        uint8_t head[256];
        size_t hn = mg_sp_req_encode(head, &q, 0);
        ok(hn == mg_sp_req_head_size(&q) && !memcmp(head, buf, hn), "%s head is a prefix", name);
        is_int(truncations_fail(buf, 0), 0, "%s: every truncation and an extra byte fail", name);
    }
    const uint8_t *p = packed, *k;
    size_t kl;
    is_int(mg_sp_keys_next(&p, packed + pl, &k, &kl), 1, "packed keys: first");
    ok(kl == 1 && *k == 'a', "first is a");
    is_int(mg_sp_keys_next(&p, packed + pl, &k, &kl), 1, "packed keys: second");
    is_int(mg_sp_keys_next(&p, packed + pl, &k, &kl), 0, "packed keys: end");
    p = packed;
    is_int(mg_sp_keys_next(&p, packed + 2, &k, &kl), -MG_ETRUNC, "packed keys: truncated");
}

/* Builds a raw body and decodes it as a request. */
static int decode_raw(uint8_t op, uint8_t flags, const uint8_t *body, uint32_t len)
{
    struct mg_sp_hdr h = {.len = len, .op = op, .flags = flags};
    struct mg_sp_req q;
    return mg_sp_req_decode(&h, body, &q);
}

static void bounds_and_corruption(void)
{
    uint8_t *b = calloc(1, MG_SP_MAX_FRAME + 16);
    uint32_t n;

    /* key: MAX_KEY fine, one more too big, 0 and NUL invalid */
    mg_sp_put16(b, MG_STORE_MAX_KEY);
    memset(b + 2, 'k', MG_STORE_MAX_KEY);
    is_int(decode_raw(MG_SP_DELETE, 0, b, 2 + MG_STORE_MAX_KEY), 0, "key of MAX_KEY bytes");
    mg_sp_put16(b, MG_STORE_MAX_KEY + 1);
    memset(b + 2, 'k', MG_STORE_MAX_KEY + 1);
    is_int(decode_raw(MG_SP_DELETE, 0, b, 2 + MG_STORE_MAX_KEY + 1), -MG_ETOOBIG,
           "key of MAX_KEY+1 bytes: ETOOBIG");
    mg_sp_put16(b, 0xffff);
    is_int(decode_raw(MG_SP_DELETE, 0, b, 2 + 100), -MG_ETOOBIG,
           "key length 65535 in a short frame: ETOOBIG, not a read past the end");
    mg_sp_put16(b, 0);
    is_int(decode_raw(MG_SP_DELETE, 0, b, 2), -EINVAL, "empty key: EINVAL");
    mg_sp_put16(b, 3);
    memcpy(b + 2, "a\0b", 3);
    is_int(decode_raw(MG_SP_DELETE, 0, b, 5), -EINVAL, "NUL inside a key: EINVAL");
    mg_sp_put16(b, 0);
    mg_sp_put32(b, 5);
    mg_sp_put16(b + 4, 0);
    is_int(decode_raw(MG_SP_LIST, 0, b, 6), 0, "empty prefix is fine for LIST");
    mg_sp_put32(b, MG_STORE_MAX_LIST + 1);
    is_int(decode_raw(MG_SP_LIST, 0, b, 6), -MG_ETOOBIG, "LIST max over MAX_LIST: ETOOBIG");
    mg_sp_put32(b, MG_STORE_MAX_LIST);
    is_int(decode_raw(MG_SP_LIST, 0, b, 6), 0, "LIST max of MAX_LIST");

    /* value: MAX_VALUE fine, one more too big */
    mg_sp_put16(b, 1);
    b[2] = 'v';
    mg_sp_put32(b + 3, MG_STORE_MAX_VALUE);
    n = 7 + MG_STORE_MAX_VALUE;
    is_int(decode_raw(MG_SP_SET, 0, b, n), 0, "value of MAX_VALUE bytes");
    mg_sp_put32(b + 3, MG_STORE_MAX_VALUE + 1);
    is_int(decode_raw(MG_SP_SET, 0, b, n + 1), -MG_ETOOBIG, "value of MAX_VALUE+1: ETOOBIG");
    mg_sp_put32(b + 3, 0xffffffffu);
    is_int(decode_raw(MG_SP_SET, 0, b, 20), -MG_ETOOBIG, "value length 4 GiB: ETOOBIG");
    mg_sp_put32(b + 3, 10);
    is_int(decode_raw(MG_SP_SET, 0, b, 12), -MG_ETRUNC, "value cut short: ETRUNC");
    mg_sp_put32(b + 3, 0);
    is_int(decode_raw(MG_SP_SET, 0x2, b, 7), -EINVAL, "unknown SET flag: EINVAL");
    is_int(decode_raw(MG_SP_GET, 0x1, (const uint8_t *)"\0\0\0\0\1\0g", 7), -EINVAL,
           "flag on GET: EINVAL");
    /* CAS expecting absence must not carry an expected value */
    mg_sp_put16(b, 1);
    b[2] = 'c';
    mg_sp_put32(b + 3, 1);
    b[7] = 'x';
    mg_sp_put32(b + 8, 0);
    is_int(decode_raw(MG_SP_CAS, 0, b, 12), 0, "CAS with expected value");
    is_int(decode_raw(MG_SP_CAS, MG_SP_F_EXPECT_ABSENT, b, 12), -EINVAL,
           "CAS expect-absent with an expected value: EINVAL");

    /* number of keys: 1..MAX_WAIT_KEYS */
    mg_sp_put16(b, 0);
    is_int(decode_raw(MG_SP_CHECK, 0, b, 2), -EINVAL, "CHECK with 0 keys: EINVAL");
    mg_sp_put16(b, MG_STORE_MAX_WAIT_KEYS + 1);
    is_int(decode_raw(MG_SP_CHECK, 0, b, 2), -MG_ETOOBIG, "CHECK with MAX+1 keys: ETOOBIG");
    mg_sp_put16(b, MG_STORE_MAX_WAIT_KEYS);
    uint8_t *p = b + 2;
    for (int i = 0; i < MG_STORE_MAX_WAIT_KEYS; i++) {
        mg_sp_put16(p, MG_STORE_MAX_KEY);
        memset(p + 2, 'a' + i % 26, MG_STORE_MAX_KEY);
        p += 2 + MG_STORE_MAX_KEY;
    }
    n = (uint32_t)(p - b);
    is_int(n, mg_sp_max_body(MG_SP_CHECK), "the largest CHECK body is the bound");
    is_int(decode_raw(MG_SP_CHECK, 0, b, n), 0, "CHECK with MAX keys of MAX bytes");
    is_int(decode_raw(MG_SP_CHECK, 0, b, n - 1), -MG_ETRUNC, "last key cut: ETRUNC");

    /* header bounds, every opcode */
    int hdr_ok = 1;
    for (int op = 0; op < 256; op++) {
        struct mg_sp_hdr h = {.op = (uint8_t)op, .len = mg_sp_max_body((uint8_t)op)};
        if (mg_sp_hdr_check(&h, 0) != 0)
            hdr_ok = 0;
        h.len++;
        if (mg_sp_hdr_check(&h, 0) != -MG_ETOOBIG)
            hdr_ok = 0;
        if (mg_sp_max_body((uint8_t)op) > MG_SP_MAX_FRAME)
            hdr_ok = 0;
    }
    ok(hdr_ok, "every opcode: its bound passes, one byte more is ETOOBIG, all under MAX_FRAME");
    struct mg_sp_hdr hh = {.op = MG_SP_CAS, .len = 0xffffffffu};
    is_int(mg_sp_hdr_check(&hh, 0), -MG_ETOOBIG, "4 GiB frame: ETOOBIG");
    is_int(mg_sp_max_body(MG_SP_CAS), 2 + MG_STORE_MAX_KEY + 2 * (4 + MG_STORE_MAX_VALUE),
           "CAS bound: key and two maximal values");
    is_int(decode_raw(0x42, 0, b, 10), -MG_EUNSUPPORTED, "unknown opcode: EUNSUPPORTED");
    is_int(mg_sp_max_body(0x42), MG_SP_MAX_UNKNOWN_BODY, "unknown opcode bound");
    free(b);
}

static void replies(void)
{
    static uint8_t buf[4096];
    uint8_t keys[32];
    size_t kl = mg_sp_keys_put(keys, (const uint8_t *)"x/1", 3);
    kl += mg_sp_keys_put(keys + kl, (const uint8_t *)"x/2", 3);
    struct mg_sp_reply cases[] = {
        {.op = MG_SP_PING, .rev = 5},
        {.op = MG_SP_SET, .rev = 6},
        {.op = MG_SP_GET, .rev = 7, .val = (const uint8_t *)"val", .vlen = 3},
        {.op = MG_SP_ADD, .rev = 8, .num = -3},
        {.op = MG_SP_CAS,
         .flags = MG_SP_F_SWAPPED | MG_SP_F_PRESENT,
         .rev = 9,
         .val = (const uint8_t *)"n",
         .vlen = 1},
        {.op = MG_SP_WAIT},
        {.op = MG_SP_CHECK, .flags = MG_SP_F_PRESENT},
        {.op = MG_SP_DELETE, .flags = MG_SP_F_PRESENT, .rev = 10},
        {.op = MG_SP_WATCH, .rev = 11},
        {.op = MG_SP_LIST, .total = 5, .nkeys = 2, .keys = keys, .keys_len = kl},
        {.op = MG_SP_GET, .status = MG_SP_TIMEDOUT},
        {.op = MG_SP_ERROR, .status = MG_SP_TOOBIG},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct mg_sp_reply y = cases[i], r;
        struct mg_sp_hdr h;
        y.id = (uint32_t)i;
        const char *name = mg_sp_op_name(y.op);
        size_t n = mg_sp_reply_encode(buf, &y, 1);
        ok(n == mg_sp_reply_size(&y), "%s reply size", name);
        mg_sp_hdr_decode(buf, &h);
        is_int(mg_sp_reply_decode(&h, buf + MG_SP_HDR_LEN, &r), 0, "%s reply decodes", name);
        ok(r.op == y.op && r.flags == y.flags && r.status == y.status && r.id == y.id &&
               r.rev == y.rev && r.num == y.num && r.vlen == y.vlen &&
               (!y.vlen || !memcmp(r.val, y.val, y.vlen)) && r.total == y.total &&
               r.nkeys == y.nkeys && r.keys_len == y.keys_len,
           "%s reply fields equal", name);
        if (h.len)
            is_int(truncations_fail(buf, 1), 0, "%s reply: every truncation fails", name);
    }
    struct mg_sp_hdr h = {.op = MG_SP_GET, .len = 0};
    struct mg_sp_reply r;
    is_int(mg_sp_reply_decode(&h, buf, &r), -MG_EPROTO, "a request opcode as a reply: EPROTO");
    h.op = 0x42 | MG_SP_REPLY;
    h.status = MG_SP_UNSUPPORTED;
    is_int(mg_sp_reply_decode(&h, buf, &r), 0, "reply to an unknown opcode decodes");
    is_int(r.status, MG_SP_UNSUPPORTED, "with its status");
    h.len = 1;
    is_int(mg_sp_reply_decode(&h, buf, &r), -MG_ETOOBIG, "but may not carry a body");
    /* LIST claiming more keys than match */
    mg_sp_put32(buf, 1);
    mg_sp_put32(buf + 4, 2);
    h = (struct mg_sp_hdr){.op = MG_SP_LIST | MG_SP_REPLY, .len = 8};
    is_int(mg_sp_reply_decode(&h, buf, &r), -MG_ETOOBIG, "LIST reply with nkeys > total");
    h = (struct mg_sp_hdr){.op = MG_SP_WAIT | MG_SP_REPLY, .len = 1};
    is_int(mg_sp_reply_decode(&h, buf, &r), -MG_ETOOBIG, "WAIT reply with a body: over bound");
}

static void statuses(void)
{
    int good = 1;
    for (int s = 0; s <= MG_SP_STATUS_MAX; s++)
        if (s != MG_SP_PROTO && mg_sp_err_status(mg_sp_status_err((uint16_t)s)) != s)
            good = 0;
    ok(good, "every status maps to an error code and back");
    is_int(mg_sp_status_err(MG_SP_NOKEY), -MG_ENOKEY, "NOKEY is -MG_ENOKEY");
    is_int(mg_sp_status_err(MG_SP_TIMEDOUT), -ETIMEDOUT, "TIMEDOUT is -ETIMEDOUT");
    is_int(mg_sp_status_err(999), -MG_EPROTO, "an unknown status is a protocol error");
    is_int(mg_sp_err_status(-MG_ETRUNC), MG_SP_PROTO, "a truncated body answers PROTO");
}

/* Decoding never reads past the body (ASan watches an exact-size copy) and
 * anything accepted re-encodes to the same bytes. Fixed seed. */
static void fuzz(void)
{
    unsigned seed = 12345;
    int accepted = 0, rejected = 0, mismatch = 0;
    for (int iter = 0; iter < 200000; iter++) {
        uint8_t frame[256];
        size_t n = random_frame(&seed, frame);
        struct mg_sp_hdr h;
        mg_sp_hdr_decode(frame, &h);
        uint8_t *body = malloc(h.len ? h.len : 1);
        memcpy(body, frame + MG_SP_HDR_LEN, h.len);
        struct mg_sp_req q;
        if (mg_sp_req_decode(&h, body, &q) == 0) {
            uint8_t out[256];
            accepted++;
            if (mg_sp_req_size(&q) != n) {
                mismatch++;
            } else {
                mg_sp_req_encode(out, &q, 1);
                mismatch += memcmp(out, frame, n) != 0;
            }
        } else {
            rejected++;
        }
        struct mg_sp_reply y;
        h.op |= MG_SP_REPLY;
        if (mg_sp_reply_decode(&h, body, &y) == 0 && y.status == 0 &&
            mg_sp_reply_size(&y) != MG_SP_HDR_LEN + h.len)
            mismatch++;
        free(body);
    }
    ok(accepted > 50000 && rejected > 20000, "mutated frames: %d accepted, %d rejected", accepted,
       rejected);
    is_int(mismatch, 0, "every accepted frame re-encodes to the same bytes");
}

int main(void)
{
    worked_example();
    requests();
    bounds_and_corruption();
    replies();
    statuses();
    fuzz();
    return done_testing();
}
