/* Fuzz harness: the store protocol's codec (common/store_proto.c), as a
 * server and a client see bytes from the wire: the three handshake messages,
 * then frames, each decoded as a request and as a reply. Whatever decodes
 * must pass the encoder's own checks and encode back to the very same bytes. */
#include "fuzz.h"
#include "store_proto.h"

#include <stdlib.h>
#include <string.h>

static void handshake(const uint8_t *p, size_t n)
{
    struct mg_sp_hello h;
    struct mg_sp_shello sh;
    uint8_t out[MG_SP_HELLO_LEN], proof[MG_SP_PROOF_LEN];
    uint16_t status;

    if (n >= MG_SP_HELLO_LEN && mg_sp_hello_decode(p, &h) == 0) {
        mg_sp_hello_encode(out, &h);
        if (memcmp(out, p, MG_SP_HELLO_LEN))
            fuzz_fail("a hello does not encode back to itself");
    }
    if (n >= MG_SP_SHELLO_LEN && mg_sp_shello_decode(p, &sh) == 0) {
        mg_sp_shello_encode(out, &sh);
        if (memcmp(out, p, MG_SP_SHELLO_LEN))
            fuzz_fail("a server hello does not encode back to itself");
    }
    if (n >= MG_SP_AUTH_REPLY_LEN)
        mg_sp_auth_reply_decode(p, &status, proof);
}

static void request(const struct mg_sp_hdr *h, const uint8_t *frame)
{
    struct mg_sp_req q;
    if (mg_sp_req_decode(h, frame + MG_SP_HDR_LEN, &q))
        return;
    if (mg_sp_req_check(&q))
        fuzz_fail("a decoded request (op %u) fails the encoder's check", q.op);
    size_t size = mg_sp_req_size(&q);
    if (size != MG_SP_HDR_LEN + (size_t)h->len)
        fuzz_fail("request op %u: %zu bytes decoded, %zu to encode", q.op,
                  MG_SP_HDR_LEN + (size_t)h->len, size);
    uint8_t *out = malloc(size);
    /* (A request's status field is ignored on receipt, as reserved fields are:
     * it encodes as 0.) */
    if (mg_sp_req_encode(out, &q, 1) != size || memcmp(out, frame, 6) ||
        memcmp(out + 8, frame + 8, size - 8) || mg_sp_get16(out + 6) != 0)
        fuzz_fail("request op %u does not encode back to its bytes", q.op);
    free(out);
}

static void reply(const struct mg_sp_hdr *h, const uint8_t *frame)
{
    struct mg_sp_reply y;
    if (mg_sp_reply_decode(h, frame + MG_SP_HDR_LEN, &y))
        return;
    size_t size = mg_sp_reply_size(&y);
    if (size != MG_SP_HDR_LEN + (size_t)h->len)
        fuzz_fail("reply op %u: %zu bytes decoded, %zu to encode", y.op,
                  MG_SP_HDR_LEN + (size_t)h->len, size);
    uint8_t *out = malloc(size);
    if (mg_sp_reply_encode(out, &y, 1) != size || memcmp(out, frame, size))
        fuzz_fail("reply op %u does not encode back to its bytes", y.op);
    free(out);
    mg_sp_status_err(y.status);
    mg_sp_op_name(y.op);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    handshake(data, size);
    /* Frames, back to back, after an optional 1-byte skip so that both
     * alignments of the handshake's leftovers are reached. */
    size_t off = size && (data[0] & 0x80) ? 1 : 0;
    while (size - off >= MG_SP_HDR_LEN) {
        struct mg_sp_hdr h;
        mg_sp_hdr_decode(data + off, &h);
        int as_req = mg_sp_hdr_check(&h, 0), as_reply = mg_sp_hdr_check(&h, 1);
        if ((size_t)h.len > size - off - MG_SP_HDR_LEN)
            break;
        /* An exact-size copy: a read past the frame is a read past the buffer. */
        uint8_t *frame = malloc(MG_SP_HDR_LEN + h.len);
        memcpy(frame, data + off, MG_SP_HDR_LEN + h.len);
        if (!as_req)
            request(&h, frame);
        if (!as_reply)
            reply(&h, frame);
        free(frame);
        off += MG_SP_HDR_LEN + h.len;
    }
    return 0;
}
