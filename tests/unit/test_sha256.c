/* sha256.c: FIPS 180-4 SHA-256 and RFC 4231 HMAC-SHA256 test vectors,
 * incremental updates split at every offset, constant-time compare. */
#include "sha256.h"
#include "tap.h"

/* timeout: 60 */

static void hex(const uint8_t *d, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

static void check_sha(const void *msg, size_t len, const char *want, const char *name)
{
    uint8_t d[32];
    char h[65];
    mg_sha256(msg, len, d);
    hex(d, 32, h);
    is_str(h, want, "SHA-256 %s", name);
}

static void check_hmac(const void *key, size_t klen, const void *msg, size_t len, const char *want,
                       const char *name)
{
    uint8_t d[32];
    char h[65];
    mg_hmac_sha256(key, klen, msg, len, d);
    hex(d, 32, h);
    is_str(h, want, "HMAC-SHA256 %s", name);
}

int main(void)
{
    check_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "empty");
    check_sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "abc");
    const char *m2 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    check_sha(m2, strlen(m2), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
              "448-bit message");
    const char *m3 =
        "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopq"
        "klmnopqrlmnopqrsmnopqrstnopqrstu";
    check_sha(m3, strlen(m3), "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1",
              "896-bit message");

    static char million[1000000];
    memset(million, 'a', sizeof(million));
    check_sha(million, sizeof(million),
              "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
              "one million 'a'");

    /* Incremental updates must not depend on how the input is split. */
    uint8_t whole[32], part[32];
    mg_sha256(m3, strlen(m3), whole);
    int split_ok = 1;
    for (size_t cut = 0; cut <= strlen(m3); cut++) {
        struct mg_sha256 c;
        mg_sha256_init(&c);
        mg_sha256_update(&c, m3, cut);
        mg_sha256_update(&c, m3 + cut, strlen(m3) - cut);
        mg_sha256_final(&c, part);
        split_ok &= memcmp(whole, part, 32) == 0;
    }
    ok(split_ok, "SHA-256 is the same for every split point");
    /* Lengths around the padding boundary (55, 56, 63, 64 bytes). */
    static const char *pad_want[] = {
        "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318",
        "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a",
        "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34",
        "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb",
    };
    static const size_t pad_len[] = {55, 56, 63, 64};
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof(name), "%zu x 'a'", pad_len[i]);
        check_sha(million, pad_len[i], pad_want[i], name);
    }

    uint8_t k1[20], k3[20], d3[50], k4[25], d4[50], k6[131];
    memset(k1, 0x0b, sizeof(k1));
    check_hmac(k1, 20, "Hi There", 8,
               "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7", "RFC 4231 #1");
    const char *m = "what do ya want for nothing?";
    check_hmac("Jefe", 4, m, strlen(m),
               "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", "RFC 4231 #2");
    memset(k3, 0xaa, sizeof(k3));
    memset(d3, 0xdd, sizeof(d3));
    check_hmac(k3, 20, d3, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
               "RFC 4231 #3");
    for (int i = 0; i < 25; i++)
        k4[i] = (uint8_t)(i + 1);
    memset(d4, 0xcd, sizeof(d4));
    check_hmac(k4, 25, d4, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
               "RFC 4231 #4");
    memset(k6, 0xaa, sizeof(k6));
    m = "Test Using Larger Than Block-Size Key - Hash Key First";
    check_hmac(k6, 131, m, strlen(m),
               "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54", "RFC 4231 #6");
    m = "This is a test using a larger than block-size key and a larger than block-size data. "
        "The key needs to be hashed before being used by the HMAC algorithm.";
    check_hmac(k6, 131, m, strlen(m),
               "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2", "RFC 4231 #7");

    /* Incremental HMAC equals the one-shot form. */
    struct mg_hmac_sha256 hc;
    mg_hmac_sha256_init(&hc, "Jefe", 4);
    mg_hmac_sha256_update(&hc, "what do ya ", 11);
    mg_hmac_sha256_update(&hc, "want for nothing?", 17);
    mg_hmac_sha256_final(&hc, part);
    mg_hmac_sha256("Jefe", 4, "what do ya want for nothing?", 28, whole);
    ok(memcmp(part, whole, 32) == 0, "incremental HMAC equals one-shot");

    ok(mg_memeq_ct("abcd", "abcd", 4), "memeq_ct: equal");
    ok(!mg_memeq_ct("abcd", "abce", 4), "memeq_ct: last byte differs");
    ok(!mg_memeq_ct("xbcd", "abcd", 4), "memeq_ct: first byte differs");
    ok(mg_memeq_ct("a", "b", 0), "memeq_ct: empty is equal");
    return done_testing();
}
