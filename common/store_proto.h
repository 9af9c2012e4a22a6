/* The store's wire format (docs/store-protocol.md is the reference): handshake
 * messages, the frame header, request and reply bodies, their bounds and the
 * status codes. Shared by the server, the client, the raw test client and the
 * unit tests. Pure functions on byte buffers: no I/O, no allocation.
 *
 * Prefix mg_sp_ / MG_SP_ ("store protocol"). Integers are little-endian. */
#ifndef MG_STORE_PROTO_H
#define MG_STORE_PROTO_H

#include "store.h"

#include <stddef.h>
#include <stdint.h>

#define MG_SP_MAGIC          "MGST"
#define MG_SP_WIRE_VERSION   1
#define MG_SP_NONCE_LEN      32
#define MG_SP_PROOF_LEN      32
#define MG_SP_HELLO_LEN      44 /* client hello */
#define MG_SP_SHELLO_LEN     44 /* server hello */
#define MG_SP_AUTH_LEN       32 /* client proof */
#define MG_SP_AUTH_REPLY_LEN 36 /* status, reserved, server proof */
#define MG_SP_HDR_LEN        12
#define MG_SP_MAX_LEASE_MS   86400000u
/* The largest frame body: a compare_set with two maximal values. */
#define MG_SP_MAX_FRAME (2 * MG_STORE_MAX_VALUE + 4096)
/* Body bound for an opcode this version does not know (answered UNSUPPORTED). */
#define MG_SP_MAX_UNKNOWN_BODY 65536u

enum mg_sp_op {
    MG_SP_PING = 0x01,
    MG_SP_SET = 0x02,
    MG_SP_GET = 0x03,
    MG_SP_ADD = 0x04,
    MG_SP_CAS = 0x05,
    MG_SP_WAIT = 0x06,
    MG_SP_CHECK = 0x07,
    MG_SP_DELETE = 0x08,
    MG_SP_WATCH = 0x09,
    MG_SP_LIST = 0x0a,
    MG_SP_OP_MAX = 0x0a,
    MG_SP_REPLY = 0x80, /* or'ed into the opcode of a reply */
    MG_SP_ERROR = 0x7f, /* reply only (byte 0xff): the stream cannot be followed; the
                           server closes after it */
};

enum mg_sp_flags {
    MG_SP_F_EPHEMERAL = 1 << 0,     /* SET request */
    MG_SP_F_EXPECT_ABSENT = 1 << 0, /* CAS request: swap only if the key does not exist */
    MG_SP_F_PRESENT = 1 << 0,       /* replies: the key exists (CHECK: every key exists) */
    MG_SP_F_SWAPPED = 1 << 1,       /* CAS reply: the swap happened */
};

enum mg_sp_hello_flags {
    MG_SP_HELLO_AUTH = 1 << 0, /* client: I hold a token; server: a token is required */
};

enum mg_sp_status {
    MG_SP_OK = 0,
    MG_SP_NOKEY = 1,       /* the key does not exist */
    MG_SP_TIMEDOUT = 2,    /* a blocking request reached its timeout */
    MG_SP_TOOBIG = 3,      /* a length or count is over its bound */
    MG_SP_NOSPACE = 4,     /* the server's memory bound for stored data is reached */
    MG_SP_BUSY = 5,        /* too many parked requests */
    MG_SP_PROTO = 6,       /* malformed body */
    MG_SP_UNSUPPORTED = 7, /* unknown opcode */
    MG_SP_INVAL = 8,       /* invalid argument: empty key, NUL in a key, unknown flag, bad lease */
    MG_SP_RANGE = 9,       /* ADD: the value is not a decimal int64, or the sum overflows */
    MG_SP_VERSION = 10,    /* handshake: protocol version not supported */
    MG_SP_AUTH = 11,       /* handshake: authentication failed */
    MG_SP_STATUS_MAX = 11,
};

/* ---- handshake --------------------------------------------------------------- */

struct mg_sp_hello {
    uint16_t version;
    uint16_t flags; /* MG_SP_HELLO_AUTH */
    uint32_t lease_ms;
    uint8_t nonce[MG_SP_NONCE_LEN];
};

struct mg_sp_shello {
    uint16_t version;
    uint16_t status;
    uint32_t flags; /* MG_SP_HELLO_AUTH */
    uint8_t nonce[MG_SP_NONCE_LEN];
};

void mg_sp_hello_encode(uint8_t out[MG_SP_HELLO_LEN], const struct mg_sp_hello *h);
/* -MG_EPROTO when the magic is wrong. The version is not judged here. */
int mg_sp_hello_decode(const uint8_t in[MG_SP_HELLO_LEN], struct mg_sp_hello *h);
void mg_sp_shello_encode(uint8_t out[MG_SP_SHELLO_LEN], const struct mg_sp_shello *h);
int mg_sp_shello_decode(const uint8_t in[MG_SP_SHELLO_LEN], struct mg_sp_shello *h);
void mg_sp_auth_reply_encode(uint8_t out[MG_SP_AUTH_REPLY_LEN], uint16_t status,
                             const uint8_t proof[MG_SP_PROOF_LEN]);
void mg_sp_auth_reply_decode(const uint8_t in[MG_SP_AUTH_REPLY_LEN], uint16_t *status,
                             uint8_t proof[MG_SP_PROOF_LEN]);

/* HMAC-SHA256(token, "mg-store-v1 client" || cnonce || snonce), and the same
 * with "mg-store-v1 server" for the server's proof. */
void mg_sp_client_proof(const char *token, const uint8_t cnonce[MG_SP_NONCE_LEN],
                        const uint8_t snonce[MG_SP_NONCE_LEN], uint8_t out[MG_SP_PROOF_LEN]);
void mg_sp_server_proof(const char *token, const uint8_t cnonce[MG_SP_NONCE_LEN],
                        const uint8_t snonce[MG_SP_NONCE_LEN], uint8_t out[MG_SP_PROOF_LEN]);

/* ---- frames -------------------------------------------------------------------- */

struct mg_sp_hdr {
    uint32_t len; /* body bytes after the header */
    uint8_t op;
    uint8_t flags;
    uint16_t status; /* replies only */
    uint32_t id;     /* chosen by the client, echoed in the reply */
};

void mg_sp_hdr_encode(uint8_t out[MG_SP_HDR_LEN], const struct mg_sp_hdr *h);
void mg_sp_hdr_decode(const uint8_t in[MG_SP_HDR_LEN], struct mg_sp_hdr *h);
/* Largest body a frame with this opcode may carry (request or reply opcode). */
uint32_t mg_sp_max_body(uint8_t op);
/* 0, or -MG_ETOOBIG when h->len is over mg_sp_max_body(h->op), or (reply
 * set) -MG_EPROTO for an opcode without the reply bit. */
int mg_sp_hdr_check(const struct mg_sp_hdr *h, int reply);

/* A request. Decoding points into the body (no copies). */
struct mg_sp_req {
    uint8_t op, flags;
    uint32_t id;
    uint32_t timeout_ms; /* GET, WAIT, WATCH */
    int64_t num;         /* ADD: delta; WATCH: since_rev */
    uint32_t max;        /* LIST */
    const uint8_t *key;  /* key, or LIST's prefix */
    size_t klen;
    const uint8_t *val; /* SET: value; CAS: expected */
    size_t vlen;
    const uint8_t *val2; /* CAS: desired */
    size_t vlen2;
    int nkeys;           /* WAIT, CHECK */
    const uint8_t *keys; /* WAIT, CHECK: nkeys packed keys (u16 length + bytes) */
    size_t keys_len;
};

/* 0, or: -MG_ETRUNC (body ends inside a field), -MG_EPROTO (bytes after the
 * last field), -MG_ETOOBIG (a length or count over its bound), -EINVAL (empty
 * key, NUL in a key, an unknown flag), -MG_EUNSUPPORTED (unknown opcode). */
int mg_sp_req_decode(const struct mg_sp_hdr *h, const uint8_t *body, struct mg_sp_req *r);
/* Checks the bounds of a request before encoding (same codes as decoding). */
int mg_sp_req_check(const struct mg_sp_req *r);
/* Encoded frame size, header included; the "head" is everything but the
 * trailing value (SET's value, CAS's desired), so that a large value can be
 * sent from where it lies. */
size_t mg_sp_req_size(const struct mg_sp_req *r);
size_t mg_sp_req_head_size(const struct mg_sp_req *r);
/* Writes the head (with_tail 0) or the whole frame into out, which must hold
 * mg_sp_req_head_size / mg_sp_req_size bytes. For WAIT and CHECK, keys and
 * keys_len must already hold the packed keys (see mg_sp_keys_put). Returns the
 * bytes written. */
size_t mg_sp_req_encode(uint8_t *out, const struct mg_sp_req *r, int with_tail);

/* Packed key lists (WAIT and CHECK requests, LIST replies). */
size_t mg_sp_keys_put(uint8_t *out, const uint8_t *key, size_t klen);
/* Reads the next key at *p (before end): 1 and advances, 0 at end, -MG_ETRUNC. */
int mg_sp_keys_next(const uint8_t **p, const uint8_t *end, const uint8_t **key, size_t *klen);
/* 0 when a key is 1..MG_STORE_MAX_KEY bytes without NUL (prefix: 0 bytes allowed). */
int mg_sp_key_check(const uint8_t *key, size_t klen, int is_prefix);

/* A reply. Error statuses carry an empty body. */
struct mg_sp_reply {
    uint8_t op, flags; /* op without MG_SP_REPLY */
    uint16_t status;
    uint32_t id;
    int64_t rev; /* PING, DELETE: store revision; SET, GET, ADD, CAS, WATCH: the key's */
    int64_t num; /* ADD: the new value */
    const uint8_t *val;
    size_t vlen;
    uint32_t total; /* LIST: keys matching */
    uint32_t nkeys; /* LIST: keys in this reply */
    const uint8_t *keys;
    size_t keys_len;
};

int mg_sp_reply_decode(const struct mg_sp_hdr *h, const uint8_t *body, struct mg_sp_reply *r);
size_t mg_sp_reply_size(const struct mg_sp_reply *r);
/* The head is all but the tail: a GET, CAS or WATCH reply's value, a LIST
 * reply's keys (the server sends those from a blob it shares). */
size_t mg_sp_reply_head_size(const struct mg_sp_reply *r);
size_t mg_sp_reply_encode(uint8_t *out, const struct mg_sp_reply *r, int with_tail);

/* Wire status <-> the negative codes the API returns. */
int mg_sp_status_err(uint16_t status);
uint16_t mg_sp_err_status(int err);
const char *mg_sp_op_name(uint8_t op);

/* Little-endian helpers. */
static inline void mg_sp_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void mg_sp_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void mg_sp_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t mg_sp_get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}
static inline uint32_t mg_sp_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t mg_sp_get64(const uint8_t *p)
{
    return (uint64_t)mg_sp_get32(p) | (uint64_t)mg_sp_get32(p + 4) << 32;
}

#endif
