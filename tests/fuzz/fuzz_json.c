/* Fuzz harness: the JSON parser (common/json.c) and what reads through it
 * from files other programs write: a worker's torch error file
 * (launcher/errfile.c). Every token of a parsed document is read back in
 * every way the API offers. */
#include "errfile.h"
#include "fuzz.h"
#include "json.h"

#include <stdlib.h>
#include <string.h>

#define TOKS 512

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct mg_json doc;
    struct mg_json_tok *toks = malloc(TOKS * sizeof(*toks));
    char *text = malloc(size ? size : 1), buf[64];
    memcpy(text, data, size);

    int n = mg_json_parse(&doc, text, size, toks, TOKS);
    for (int i = 0; i < n; i++) {
        long long v;
        double d;
        int b;
        if (toks[i].next <= i || toks[i].next > n)
            fuzz_fail("token %d: next %d of %d", i, toks[i].next, n);
        if ((size_t)toks[i].start + toks[i].len > size)
            fuzz_fail("token %d spans %u+%u of %zu bytes", i, toks[i].start, toks[i].len, size);
        int len = mg_json_str(&doc, i, buf, sizeof(buf));
        if (len >= 0 && strlen(buf) >= sizeof(buf))
            fuzz_fail("token %d: a string not cut to its buffer", i);
        mg_json_int(&doc, i, &v);
        mg_json_double(&doc, i, &d);
        mg_json_bool(&doc, i, &b);
        mg_json_at(&doc, i, 0);
        mg_json_at(&doc, i, 3);
        mg_json_get(&doc, i, "message");
        mg_json_next(&doc, i);
    }
    if (n > 0)
        mg_json_path(&doc, 0, "message.extraInfo.timestamp");

    struct mg_errfile ef;
    mg_errfile_parse(text, size, &ef);
    free(text);
    free(toks);
    return 0;
}
