/* The store's wire codec (see store_proto.h and docs/store-protocol.md). */
#include "store_proto.h"
#include "mg_err.h"
#include "sha256.h"

#include <errno.h>
#include <string.h>

/* ---- handshake --------------------------------------------------------------- */

/* Both hellos: magic, u16, u16, u32, nonce (docs/store-protocol.md). */
static void hello_put(uint8_t *out, uint16_t a, uint16_t b, uint32_t c, const uint8_t *nonce)
{
    memcpy(out, MG_SP_MAGIC, 4);
    mg_sp_put16(out + 4, a);
    mg_sp_put16(out + 6, b);
    mg_sp_put32(out + 8, c);
    memcpy(out + 12, nonce, MG_SP_NONCE_LEN);
}

static int hello_get(const uint8_t *in, uint16_t *a, uint16_t *b, uint32_t *c, uint8_t *nonce)
{
    if (memcmp(in, MG_SP_MAGIC, 4) != 0)
        return -MG_EPROTO;
    *a = mg_sp_get16(in + 4);
    *b = mg_sp_get16(in + 6);
    *c = mg_sp_get32(in + 8);
    memcpy(nonce, in + 12, MG_SP_NONCE_LEN);
    return 0;
}

void mg_sp_hello_encode(uint8_t out[MG_SP_HELLO_LEN], const struct mg_sp_hello *h)
{
    hello_put(out, h->version, h->flags, h->lease_ms, h->nonce);
}

int mg_sp_hello_decode(const uint8_t in[MG_SP_HELLO_LEN], struct mg_sp_hello *h)
{
    return hello_get(in, &h->version, &h->flags, &h->lease_ms, h->nonce);
}

void mg_sp_shello_encode(uint8_t out[MG_SP_SHELLO_LEN], const struct mg_sp_shello *h)
{
    hello_put(out, h->version, h->status, h->flags, h->nonce);
}

int mg_sp_shello_decode(const uint8_t in[MG_SP_SHELLO_LEN], struct mg_sp_shello *h)
{
    return hello_get(in, &h->version, &h->status, &h->flags, h->nonce);
}

void mg_sp_auth_reply_encode(uint8_t out[MG_SP_AUTH_REPLY_LEN], uint16_t status,
                             const uint8_t proof[MG_SP_PROOF_LEN])
{
    mg_sp_put16(out, status);
    mg_sp_put16(out + 2, 0);
    if (proof)
        memcpy(out + 4, proof, MG_SP_PROOF_LEN);
    else
        memset(out + 4, 0, MG_SP_PROOF_LEN);
}

void mg_sp_auth_reply_decode(const uint8_t in[MG_SP_AUTH_REPLY_LEN], uint16_t *status,
                             uint8_t proof[MG_SP_PROOF_LEN])
{
    *status = mg_sp_get16(in);
    memcpy(proof, in + 4, MG_SP_PROOF_LEN);
}

static void proof(const char *label, const char *token, const uint8_t *cnonce,
                  const uint8_t *snonce, uint8_t *out)
{
    struct mg_hmac_sha256 c;
    mg_hmac_sha256_init(&c, token, strlen(token));
    mg_hmac_sha256_update(&c, label, strlen(label));
    mg_hmac_sha256_update(&c, cnonce, MG_SP_NONCE_LEN);
    mg_hmac_sha256_update(&c, snonce, MG_SP_NONCE_LEN);
    mg_hmac_sha256_final(&c, out);
}

void mg_sp_client_proof(const char *token, const uint8_t cnonce[MG_SP_NONCE_LEN],
                        const uint8_t snonce[MG_SP_NONCE_LEN], uint8_t out[MG_SP_PROOF_LEN])
{
    proof("mg-store-v1 client", token, cnonce, snonce, out);
}

void mg_sp_server_proof(const char *token, const uint8_t cnonce[MG_SP_NONCE_LEN],
                        const uint8_t snonce[MG_SP_NONCE_LEN], uint8_t out[MG_SP_PROOF_LEN])
{
    proof("mg-store-v1 server", token, cnonce, snonce, out);
}

/* ---- frame header ---------------------------------------------------------------- */

void mg_sp_hdr_encode(uint8_t out[MG_SP_HDR_LEN], const struct mg_sp_hdr *h)
{
    mg_sp_put32(out, h->len);
    out[4] = h->op;
    out[5] = h->flags;
    mg_sp_put16(out + 6, h->status);
    mg_sp_put32(out + 8, h->id);
}

void mg_sp_hdr_decode(const uint8_t in[MG_SP_HDR_LEN], struct mg_sp_hdr *h)
{
    h->len = mg_sp_get32(in);
    h->op = in[4];
    h->flags = in[5];
    h->status = mg_sp_get16(in + 6);
    h->id = mg_sp_get32(in + 8);
}

#define KEYF  (2 + MG_STORE_MAX_KEY)
#define VALF  (4 + MG_STORE_MAX_VALUE)
#define KEYSF (2 + MG_STORE_MAX_WAIT_KEYS * KEYF)

uint32_t mg_sp_max_body(uint8_t op)
{
    if (op & MG_SP_REPLY) {
        switch (op & ~MG_SP_REPLY) {
        case MG_SP_PING:
        case MG_SP_SET:
        case MG_SP_DELETE:
            return 8;
        case MG_SP_GET:
        case MG_SP_CAS:
        case MG_SP_WATCH:
            return 8 + VALF;
        case MG_SP_ADD:
            return 16;
        case MG_SP_LIST:
            return 8 + (uint32_t)MG_STORE_MAX_LIST * KEYF;
        default: /* WAIT, CHECK, ERROR, unknown: no body */
            return 0;
        }
    }
    switch (op) {
    case MG_SP_PING:
        return 0;
    case MG_SP_SET:
        return KEYF + VALF;
    case MG_SP_GET:
        return 4 + KEYF;
    case MG_SP_ADD:
        return 8 + KEYF;
    case MG_SP_CAS:
        return KEYF + 2 * VALF;
    case MG_SP_WAIT:
        return 4 + KEYSF;
    case MG_SP_CHECK:
        return KEYSF;
    case MG_SP_DELETE:
        return KEYF;
    case MG_SP_WATCH:
        return 12 + KEYF;
    case MG_SP_LIST:
        return 4 + KEYF;
    default:
        return MG_SP_MAX_UNKNOWN_BODY;
    }
}

int mg_sp_hdr_check(const struct mg_sp_hdr *h, int reply)
{
    /* A reply to an opcode this side does not know carries no body (its
     * bound is 0), so it can still be parsed for its status. */
    if (reply && !(h->op & MG_SP_REPLY))
        return -MG_EPROTO;
    return h->len > mg_sp_max_body(h->op) ? -MG_ETOOBIG : 0;
}

/* ---- body reader ----------------------------------------------------------------- */

struct rd {
    const uint8_t *p, *end;
    int err;
};

static const uint8_t *rd_take(struct rd *r, size_t n)
{
    if (r->err)
        return NULL;
    if ((size_t)(r->end - r->p) < n) {
        r->err = -MG_ETRUNC;
        return NULL;
    }
    const uint8_t *p = r->p;
    r->p += n;
    return p;
}

static uint16_t rd_u16(struct rd *r)
{
    const uint8_t *p = rd_take(r, 2);
    return p ? mg_sp_get16(p) : 0;
}

static uint32_t rd_u32(struct rd *r)
{
    const uint8_t *p = rd_take(r, 4);
    return p ? mg_sp_get32(p) : 0;
}

static int64_t rd_i64(struct rd *r)
{
    const uint8_t *p = rd_take(r, 8);
    return p ? (int64_t)mg_sp_get64(p) : 0;
}

static void rd_fail(struct rd *r, int err)
{
    if (!r->err)
        r->err = err;
}

int mg_sp_key_check(const uint8_t *key, size_t klen, int is_prefix)
{
    if (klen > MG_STORE_MAX_KEY)
        return -MG_ETOOBIG;
    if (klen == 0 && !is_prefix)
        return -EINVAL;
    if (klen && memchr(key, 0, klen))
        return -EINVAL;
    return 0;
}

/* A key: u16 length + bytes. The length is judged before the bytes are taken,
 * so an oversized length reads as "too big", not as "truncated". */
static const uint8_t *rd_key(struct rd *r, size_t *klen, int is_prefix)
{
    size_t n = rd_u16(r);
    if (r->err)
        return NULL;
    if (n > MG_STORE_MAX_KEY) {
        rd_fail(r, -MG_ETOOBIG);
        return NULL;
    }
    const uint8_t *k = rd_take(r, n);
    if (k) {
        int rc = mg_sp_key_check(k, n, is_prefix);
        if (rc)
            rd_fail(r, rc);
    }
    *klen = n;
    return k;
}

static const uint8_t *rd_val(struct rd *r, size_t *vlen)
{
    size_t n = rd_u32(r);
    if (r->err)
        return NULL;
    if (n > MG_STORE_MAX_VALUE) {
        rd_fail(r, -MG_ETOOBIG);
        return NULL;
    }
    *vlen = n;
    return rd_take(r, n);
}

static void rd_keys(struct rd *r, int *nkeys, const uint8_t **keys, size_t *keys_len)
{
    int n = rd_u16(r);
    if (r->err)
        return;
    if (n < 1 || n > MG_STORE_MAX_WAIT_KEYS) {
        rd_fail(r, n ? -MG_ETOOBIG : -EINVAL);
        return;
    }
    const uint8_t *start = r->p;
    for (int i = 0; i < n && !r->err; i++) {
        size_t kl;
        rd_key(r, &kl, 0);
    }
    *nkeys = n;
    *keys = start;
    *keys_len = (size_t)(r->p - start);
}

static int rd_done(struct rd *r)
{
    if (!r->err && r->p != r->end)
        r->err = -MG_EPROTO;
    return r->err;
}

int mg_sp_keys_next(const uint8_t **p, const uint8_t *end, const uint8_t **key, size_t *klen)
{
    if (*p == end)
        return 0;
    if (end - *p < 2)
        return -MG_ETRUNC;
    size_t n = mg_sp_get16(*p);
    if ((size_t)(end - *p - 2) < n)
        return -MG_ETRUNC;
    *key = *p + 2;
    *klen = n;
    *p += 2 + n;
    return 1;
}

size_t mg_sp_keys_put(uint8_t *out, const uint8_t *key, size_t klen)
{
    mg_sp_put16(out, (uint16_t)klen);
    memcpy(out + 2, key, klen);
    return 2 + klen;
}

/* ---- requests -------------------------------------------------------------------- */

static unsigned allowed_flags(uint8_t op)
{
    if (op == MG_SP_SET)
        return MG_SP_F_EPHEMERAL;
    if (op == MG_SP_CAS)
        return MG_SP_F_EXPECT_ABSENT;
    return 0;
}

int mg_sp_req_decode(const struct mg_sp_hdr *h, const uint8_t *body, struct mg_sp_req *q)
{
    struct rd r = {body, body + h->len, 0};
    memset(q, 0, sizeof(*q));
    q->op = h->op;
    q->flags = h->flags;
    q->id = h->id;
    if (h->op < MG_SP_PING || h->op > MG_SP_OP_MAX)
        return -MG_EUNSUPPORTED;
    if (h->len > mg_sp_max_body(h->op))
        return -MG_ETOOBIG;
    switch (h->op) {
    case MG_SP_PING:
        break;
    case MG_SP_SET:
        q->key = rd_key(&r, &q->klen, 0);
        q->val = rd_val(&r, &q->vlen);
        break;
    case MG_SP_GET:
        q->timeout_ms = rd_u32(&r);
        q->key = rd_key(&r, &q->klen, 0);
        break;
    case MG_SP_ADD:
        q->num = rd_i64(&r);
        q->key = rd_key(&r, &q->klen, 0);
        break;
    case MG_SP_CAS:
        q->key = rd_key(&r, &q->klen, 0);
        q->val = rd_val(&r, &q->vlen);
        q->val2 = rd_val(&r, &q->vlen2);
        if (!r.err && (h->flags & MG_SP_F_EXPECT_ABSENT) && q->vlen)
            r.err = -EINVAL;
        break;
    case MG_SP_WAIT:
        q->timeout_ms = rd_u32(&r);
        rd_keys(&r, &q->nkeys, &q->keys, &q->keys_len);
        break;
    case MG_SP_CHECK:
        rd_keys(&r, &q->nkeys, &q->keys, &q->keys_len);
        break;
    case MG_SP_DELETE:
        q->key = rd_key(&r, &q->klen, 0);
        break;
    case MG_SP_WATCH:
        q->num = rd_i64(&r);
        q->timeout_ms = rd_u32(&r);
        q->key = rd_key(&r, &q->klen, 0);
        break;
    case MG_SP_LIST:
        q->max = rd_u32(&r);
        q->key = rd_key(&r, &q->klen, 1);
        if (!r.err && q->max > MG_STORE_MAX_LIST)
            r.err = -MG_ETOOBIG;
        break;
    }
    int rc = rd_done(&r);
    if (!rc && (h->flags & ~allowed_flags(h->op)))
        rc = -EINVAL;
    return rc;
}

int mg_sp_req_check(const struct mg_sp_req *q)
{
    int rc = 0;
    if (q->op < MG_SP_PING || q->op > MG_SP_OP_MAX)
        return -MG_EUNSUPPORTED;
    if (q->flags & ~allowed_flags(q->op))
        return -EINVAL;
    switch (q->op) {
    case MG_SP_SET:
    case MG_SP_CAS:
        if (q->vlen > MG_STORE_MAX_VALUE || q->vlen2 > MG_STORE_MAX_VALUE)
            return -MG_ETOOBIG;
        if (q->op == MG_SP_CAS && (q->flags & MG_SP_F_EXPECT_ABSENT) && q->vlen)
            return -EINVAL;
        /* fall through */
    case MG_SP_GET:
    case MG_SP_ADD:
    case MG_SP_DELETE:
    case MG_SP_WATCH:
        rc = mg_sp_key_check(q->key, q->klen, 0);
        break;
    case MG_SP_LIST:
        rc = mg_sp_key_check(q->key, q->klen, 1);
        if (!rc && q->max > MG_STORE_MAX_LIST)
            rc = -MG_ETOOBIG;
        break;
    case MG_SP_WAIT:
    case MG_SP_CHECK:
        if (q->nkeys < 1)
            return -EINVAL;
        if (q->nkeys > MG_STORE_MAX_WAIT_KEYS)
            return -MG_ETOOBIG;
        break;
    }
    return rc;
}

static size_t req_fixed(uint8_t op)
{
    switch (op) {
    case MG_SP_GET:
    case MG_SP_LIST:
        return 4;
    case MG_SP_ADD:
        return 8;
    case MG_SP_WAIT:
        return 6;
    case MG_SP_CHECK:
        return 2;
    case MG_SP_WATCH:
        return 12;
    default:
        return 0;
    }
}

static size_t req_tail(const struct mg_sp_req *q)
{
    return q->op == MG_SP_SET ? q->vlen : q->op == MG_SP_CAS ? q->vlen2 : 0;
}

size_t mg_sp_req_size(const struct mg_sp_req *q)
{
    size_t n = MG_SP_HDR_LEN + req_fixed(q->op);
    switch (q->op) {
    case MG_SP_WAIT:
    case MG_SP_CHECK:
        n += q->keys_len;
        break;
    case MG_SP_PING:
        break;
    default:
        n += 2 + q->klen;
    }
    if (q->op == MG_SP_SET)
        n += 4 + q->vlen;
    else if (q->op == MG_SP_CAS)
        n += 8 + q->vlen + q->vlen2;
    return n;
}

size_t mg_sp_req_head_size(const struct mg_sp_req *q)
{
    return mg_sp_req_size(q) - req_tail(q);
}

static uint8_t *put_key(uint8_t *p, const uint8_t *key, size_t klen)
{
    return p + mg_sp_keys_put(p, key, klen);
}

size_t mg_sp_req_encode(uint8_t *out, const struct mg_sp_req *q, int with_tail)
{
    struct mg_sp_hdr h = {.len = (uint32_t)(mg_sp_req_size(q) - MG_SP_HDR_LEN),
                          .op = q->op,
                          .flags = q->flags,
                          .id = q->id};
    uint8_t *p = out + MG_SP_HDR_LEN;
    mg_sp_hdr_encode(out, &h);
    switch (q->op) {
    case MG_SP_SET:
        p = put_key(p, q->key, q->klen);
        mg_sp_put32(p, (uint32_t)q->vlen);
        p += 4;
        if (with_tail && q->vlen) {
            memcpy(p, q->val, q->vlen);
            p += q->vlen;
        }
        break;
    case MG_SP_GET:
        mg_sp_put32(p, q->timeout_ms);
        p = put_key(p + 4, q->key, q->klen);
        break;
    case MG_SP_ADD:
        mg_sp_put64(p, (uint64_t)q->num);
        p = put_key(p + 8, q->key, q->klen);
        break;
    case MG_SP_CAS:
        p = put_key(p, q->key, q->klen);
        mg_sp_put32(p, (uint32_t)q->vlen);
        if (q->vlen)
            memcpy(p + 4, q->val, q->vlen);
        p += 4 + q->vlen;
        mg_sp_put32(p, (uint32_t)q->vlen2);
        p += 4;
        if (with_tail && q->vlen2) {
            memcpy(p, q->val2, q->vlen2);
            p += q->vlen2;
        }
        break;
    case MG_SP_WAIT:
        mg_sp_put32(p, q->timeout_ms);
        p += 4;
        /* fall through */
    case MG_SP_CHECK:
        mg_sp_put16(p, (uint16_t)q->nkeys);
        memcpy(p + 2, q->keys, q->keys_len);
        p += 2 + q->keys_len;
        break;
    case MG_SP_DELETE:
        p = put_key(p, q->key, q->klen);
        break;
    case MG_SP_WATCH:
        mg_sp_put64(p, (uint64_t)q->num);
        mg_sp_put32(p + 8, q->timeout_ms);
        p = put_key(p + 12, q->key, q->klen);
        break;
    case MG_SP_LIST:
        mg_sp_put32(p, q->max);
        p = put_key(p + 4, q->key, q->klen);
        break;
    }
    return (size_t)(p - out);
}

/* ---- replies ----------------------------------------------------------------------- */

int mg_sp_reply_decode(const struct mg_sp_hdr *h, const uint8_t *body, struct mg_sp_reply *y)
{
    struct rd r = {body, body + h->len, 0};
    memset(y, 0, sizeof(*y));
    y->op = h->op & (uint8_t)~MG_SP_REPLY;
    y->flags = h->flags;
    y->status = h->status;
    y->id = h->id;
    int rc = mg_sp_hdr_check(h, 1);
    if (rc)
        return rc;
    if (h->status != MG_SP_OK || y->op == MG_SP_ERROR)
        return rd_done(&r);
    switch (y->op) {
    case MG_SP_PING:
    case MG_SP_SET:
    case MG_SP_DELETE:
        y->rev = rd_i64(&r);
        break;
    case MG_SP_GET:
    case MG_SP_CAS:
    case MG_SP_WATCH:
        y->rev = rd_i64(&r);
        y->val = rd_val(&r, &y->vlen);
        break;
    case MG_SP_ADD:
        y->rev = rd_i64(&r);
        y->num = rd_i64(&r);
        break;
    case MG_SP_LIST: {
        y->total = rd_u32(&r);
        y->nkeys = rd_u32(&r);
        if (!r.err && (y->nkeys > MG_STORE_MAX_LIST || y->nkeys > y->total))
            r.err = -MG_ETOOBIG;
        y->keys = r.p;
        for (uint32_t i = 0; i < y->nkeys && !r.err; i++) {
            size_t kl;
            rd_key(&r, &kl, 0);
        }
        y->keys_len = (size_t)(r.p - y->keys);
        break;
    }
    }
    return rd_done(&r);
}

static size_t reply_body(const struct mg_sp_reply *y)
{
    if (y->status != MG_SP_OK)
        return 0;
    switch (y->op) {
    case MG_SP_PING:
    case MG_SP_SET:
    case MG_SP_DELETE:
        return 8;
    case MG_SP_GET:
    case MG_SP_CAS:
    case MG_SP_WATCH:
        return 12 + y->vlen;
    case MG_SP_ADD:
        return 16;
    case MG_SP_LIST:
        return 8 + y->keys_len;
    default:
        return 0;
    }
}

static size_t reply_tail(const struct mg_sp_reply *y)
{
    if (y->status != MG_SP_OK)
        return 0;
    if (y->op == MG_SP_LIST)
        return y->keys_len;
    return (y->op == MG_SP_GET || y->op == MG_SP_CAS || y->op == MG_SP_WATCH) ? y->vlen : 0;
}

size_t mg_sp_reply_size(const struct mg_sp_reply *y)
{
    return MG_SP_HDR_LEN + reply_body(y);
}

size_t mg_sp_reply_head_size(const struct mg_sp_reply *y)
{
    return mg_sp_reply_size(y) - reply_tail(y);
}

size_t mg_sp_reply_encode(uint8_t *out, const struct mg_sp_reply *y, int with_tail)
{
    struct mg_sp_hdr h = {.len = (uint32_t)reply_body(y),
                          .op = y->op | MG_SP_REPLY,
                          .flags = y->flags,
                          .status = y->status,
                          .id = y->id};
    uint8_t *p = out + MG_SP_HDR_LEN;
    mg_sp_hdr_encode(out, &h);
    if (y->status != MG_SP_OK)
        return MG_SP_HDR_LEN;
    switch (y->op) {
    case MG_SP_PING:
    case MG_SP_SET:
    case MG_SP_DELETE:
        mg_sp_put64(p, (uint64_t)y->rev);
        p += 8;
        break;
    case MG_SP_GET:
    case MG_SP_CAS:
    case MG_SP_WATCH:
        mg_sp_put64(p, (uint64_t)y->rev);
        mg_sp_put32(p + 8, (uint32_t)y->vlen);
        p += 12;
        if (with_tail && y->vlen) {
            memcpy(p, y->val, y->vlen);
            p += y->vlen;
        }
        break;
    case MG_SP_ADD:
        mg_sp_put64(p, (uint64_t)y->rev);
        mg_sp_put64(p + 8, (uint64_t)y->num);
        p += 16;
        break;
    case MG_SP_LIST:
        mg_sp_put32(p, y->total);
        mg_sp_put32(p + 4, y->nkeys);
        p += 8;
        if (with_tail && y->keys_len) {
            memcpy(p, y->keys, y->keys_len);
            p += y->keys_len;
        }
        break;
    }
    return (size_t)(p - out);
}

/* ---- status codes ------------------------------------------------------------------ */

int mg_sp_status_err(uint16_t status)
{
    switch (status) {
    case MG_SP_OK:
        return 0;
    case MG_SP_NOKEY:
        return -MG_ENOKEY;
    case MG_SP_TIMEDOUT:
        return -ETIMEDOUT;
    case MG_SP_TOOBIG:
        return -MG_ETOOBIG;
    case MG_SP_NOSPACE:
        return -ENOSPC;
    case MG_SP_BUSY:
        return -EBUSY;
    case MG_SP_UNSUPPORTED:
        return -MG_EUNSUPPORTED;
    case MG_SP_INVAL:
        return -EINVAL;
    case MG_SP_RANGE:
        return -ERANGE;
    case MG_SP_VERSION:
        return -MG_EVERSION;
    case MG_SP_AUTH:
        return -MG_EAUTH;
    default:
        return -MG_EPROTO;
    }
}

uint16_t mg_sp_err_status(int err)
{
    switch (err) {
    case 0:
        return MG_SP_OK;
    case -MG_ENOKEY:
        return MG_SP_NOKEY;
    case -ETIMEDOUT:
        return MG_SP_TIMEDOUT;
    case -MG_ETOOBIG:
        return MG_SP_TOOBIG;
    case -ENOSPC:
    case -ENOMEM:
        return MG_SP_NOSPACE;
    case -EBUSY:
        return MG_SP_BUSY;
    case -MG_EUNSUPPORTED:
        return MG_SP_UNSUPPORTED;
    case -EINVAL:
        return MG_SP_INVAL;
    case -ERANGE:
        return MG_SP_RANGE;
    case -MG_EVERSION:
        return MG_SP_VERSION;
    case -MG_EAUTH:
        return MG_SP_AUTH;
    default:
        return MG_SP_PROTO;
    }
}

const char *mg_sp_op_name(uint8_t op)
{
    static const char *const names[] = {
        [MG_SP_PING] = "ping",   [MG_SP_SET] = "set",       [MG_SP_GET] = "get",
        [MG_SP_ADD] = "add",     [MG_SP_CAS] = "cas",       [MG_SP_WAIT] = "wait",
        [MG_SP_CHECK] = "check", [MG_SP_DELETE] = "delete", [MG_SP_WATCH] = "watch",
        [MG_SP_LIST] = "list",
    };
    op &= (uint8_t)~MG_SP_REPLY;
    if (op == MG_SP_ERROR)
        return "error";
    return op >= MG_SP_PING && op <= MG_SP_OP_MAX ? names[op] : "unknown";
}
