/* The bounded JSON writer and parser (common/json.h): round trips, escapes,
 * torch's error-file shapes, bounds and malformed input. */
#include "json.h"
#include "mg_err.h"
#include "tap.h"

#include <errno.h>

static void test_writer(void)
{
    char buf[256];
    struct mg_jsonw w;

    mg_jsonw_init(&w, buf, sizeof(buf));
    mg_jsonw_obj_begin(&w);
    mg_jsonw_kstr(&w, "event", "worker_exit");
    mg_jsonw_kint(&w, "rank", -3);
    mg_jsonw_kbool(&w, "ok", 0);
    mg_jsonw_kdouble(&w, "t", 0.5);
    mg_jsonw_key(&w, "list");
    mg_jsonw_arr_begin(&w);
    mg_jsonw_int(&w, 1);
    mg_jsonw_null(&w);
    mg_jsonw_str(&w, "a\"b\\c\n\t\x01");
    mg_jsonw_arr_end(&w);
    mg_jsonw_key(&w, "empty");
    mg_jsonw_obj_begin(&w);
    mg_jsonw_obj_end(&w);
    mg_jsonw_obj_end(&w);
    int n = mg_jsonw_finish(&w);
    is_str(buf,
           "{\"event\":\"worker_exit\",\"rank\":-3,\"ok\":false,\"t\":0.5,\"list\":[1,null,"
           "\"a\\\"b\\\\c\\n\\t\\u0001\"],\"empty\":{}}",
           "writer output");
    is_int(n, (int)strlen(buf), "finish returns the length");

    /* invalid UTF-8 becomes U+FFFD, valid multibyte passes through */
    mg_jsonw_init(&w, buf, sizeof(buf));
    mg_jsonw_str(&w, "\xc3\xa9-\xff-\xe2\x82");
    ok(mg_jsonw_finish(&w) > 0, "string with bad UTF-8 encodes");
    is_str(buf, "\"\xc3\xa9-\xef\xbf\xbd-\xef\xbf\xbd\xef\xbf\xbd\"", "bad bytes replaced");

    /* overflow is reported once, and the buffer stays NUL-terminated */
    char small[8];
    mg_jsonw_init(&w, small, sizeof(small));
    mg_jsonw_str(&w, "0123456789");
    is_int(mg_jsonw_finish(&w), -MG_ETOOBIG, "overflow reported");
    ok(strlen(small) < sizeof(small), "overflowed buffer terminated");

    /* misuse */
    mg_jsonw_init(&w, buf, sizeof(buf));
    mg_jsonw_obj_begin(&w);
    mg_jsonw_int(&w, 1); /* value without key */
    mg_jsonw_obj_end(&w);
    is_int(mg_jsonw_finish(&w), -EINVAL, "value without key rejected");
    mg_jsonw_init(&w, buf, sizeof(buf));
    mg_jsonw_arr_begin(&w);
    is_int(mg_jsonw_finish(&w), -EINVAL, "unbalanced rejected");
    mg_jsonw_init(&w, buf, sizeof(buf));
    mg_jsonw_arr_begin(&w);
    mg_jsonw_obj_end(&w);
    is_int(mg_jsonw_finish(&w), -EINVAL, "mismatched close rejected");
    mg_jsonw_init(&w, buf, sizeof(buf));
    mg_jsonw_double(&w, 1.0 / 0.0);
    mg_jsonw_finish(&w);
    is_str(buf, "null", "infinity written as null");
}

static void test_torch_error_file(void)
{
    /* The shape torch's ErrorHandler.record_exception writes. */
    const char *text =
        "{\"message\": {\"message\": \"ValueError: bad \\u00e9\\ud83d\\ude00\", "
        "\"extraInfo\": {\"py_callstack\": \"Traceback (most recent call last):\\n"
        "  File \\\"x.py\\\"\\nValueError: bad\\n\", \"timestamp\": \"1700000000\"}}}";
    struct mg_json_tok toks[32];
    struct mg_json doc;
    char buf[256];
    long long ts = 0;

    ok(mg_json_parse(&doc, text, strlen(text), toks, 32) > 0, "torch error file parses");
    int m = mg_json_path(&doc, 0, "message.message");
    ok(m >= 0, "message.message found");
    mg_json_str(&doc, m, buf, sizeof(buf));
    is_str(buf, "ValueError: bad \xc3\xa9\xf0\x9f\x98\x80", "unescaped with surrogate pair");
    int cs = mg_json_path(&doc, 0, "message.extraInfo.py_callstack");
    mg_json_str(&doc, cs, buf, sizeof(buf));
    ok(strstr(buf, "File \"x.py\"\nValueError") != NULL, "traceback unescaped");
    is_int(mg_json_int(&doc, mg_json_path(&doc, 0, "message.extraInfo.timestamp"), &ts), 0,
           "string timestamp read as integer");
    is_int(ts, 1700000000, "timestamp value");
    is_int(mg_json_path(&doc, 0, "message.errorCode"), -MG_ENOKEY, "absent key");

    /* The other shape torch accepts: message as a plain string. */
    const char *t2 = "{\"message\":\"boom\",\"timestamp\":12,\"rank\":3}";
    ok(mg_json_parse(&doc, t2, strlen(t2), toks, 32) > 0, "string-message variant parses");
    int mt = mg_json_get(&doc, 0, "message");
    is_int(doc.toks[mt].type, MG_JSON_STRING, "message is a string");
    ok(mg_json_int(&doc, mg_json_get(&doc, 0, "timestamp"), &ts) == 0 && ts == 12,
       "numeric timestamp");
}

static void test_parser(void)
{
    struct mg_json_tok toks[64];
    struct mg_json doc;
    char buf[64];
    long long v;
    double d;
    int b;

    const char *t = " [1, -2.5e3, true, false, null, \"x\", {\"a\": [], \"b\": {}}] ";
    int n = mg_json_parse(&doc, t, strlen(t), toks, 64);
    is_int(n, 12, "token count");
    is_int(toks[0].size, 7, "array size");
    ok(mg_json_int(&doc, mg_json_at(&doc, 0, 0), &v) == 0 && v == 1, "int element");
    ok(mg_json_double(&doc, mg_json_at(&doc, 0, 1), &d) == 0 && d == -2500.0, "double element");
    ok(mg_json_bool(&doc, mg_json_at(&doc, 0, 2), &b) == 0 && b == 1, "true");
    ok(mg_json_bool(&doc, mg_json_at(&doc, 0, 3), &b) == 0 && b == 0, "false");
    is_int(toks[mg_json_at(&doc, 0, 4)].type, MG_JSON_NULL, "null");
    int o = mg_json_at(&doc, 0, 6);
    is_int(toks[o].type, MG_JSON_OBJECT, "object element");
    is_int(toks[mg_json_get(&doc, o, "b")].type, MG_JSON_OBJECT, "nested object lookup");
    is_int(mg_json_at(&doc, 0, 7), -MG_ENOKEY, "index out of range");
    is_int(mg_json_next(&doc, o), n, "next skips the subtree");
    is_int(mg_json_int(&doc, mg_json_at(&doc, 0, 5), &v), -EINVAL, "non-numeric string");
    is_int(mg_json_int(&doc, mg_json_at(&doc, 0, 1), &v), 0, "integral double as int");
    is_int(v, -2500, "value of integral double");

    /* truncation keeps UTF-8 characters whole and reports the full length */
    const char *u = "\"\xc3\xa9\xc3\xa9\xc3\xa9\"";
    mg_json_parse(&doc, u, strlen(u), toks, 4);
    is_int(mg_json_str(&doc, 0, buf, 4), 6, "full length returned");
    is_str(buf, "\xc3\xa9", "cut at a character boundary");

    const char *bad[] = {"",          "{",        "[1,]",   "{\"a\" 1}", "01",         "1.",
                         "\"\\x\"",   "\"a\nb\"", "tru",    "[1] 2",     "{\"a\":1,}", "-",
                         "\"\\u12\"", "1e",       "[\"a\"", "{1:2}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        is_int(mg_json_parse(&doc, bad[i], strlen(bad[i]), toks, 64), -MG_EFORMAT,
               "malformed input %zu rejected", i);

    is_int(mg_json_parse(&doc, "[1,2,3]", 7, toks, 3), -MG_ETOOBIG, "token cap enforced");
    char deep[200];
    memset(deep, '[', 100);
    memset(deep + 100, ']', 100);
    is_int(mg_json_parse(&doc, deep, 200, toks, 64), -MG_ETOOBIG, "nesting cap enforced");
}

static void test_roundtrip(void)
{
    char buf[512], back[256];
    struct mg_jsonw w;
    struct mg_json_tok toks[16];
    struct mg_json doc;
    const char *nasty = "tab\there \"quoted\" back\\slash \x1f ctl \xe2\x9c\x93 \r\n";

    mg_jsonw_init(&w, buf, sizeof(buf));
    mg_jsonw_obj_begin(&w);
    mg_jsonw_kstr(&w, "s", nasty);
    mg_jsonw_kint(&w, "big", 9007199254740993LL);
    mg_jsonw_kdouble(&w, "f", 0.1);
    mg_jsonw_obj_end(&w);
    ok(mg_jsonw_finish(&w) > 0, "encoded");
    ok(mg_json_parse(&doc, buf, strlen(buf), toks, 16) > 0, "re-parsed");
    mg_json_str(&doc, mg_json_get(&doc, 0, "s"), back, sizeof(back));
    is_str(back, nasty, "string survives a round trip");
    long long v;
    mg_json_int(&doc, mg_json_get(&doc, 0, "big"), &v);
    is_int(v, 9007199254740993LL, "64-bit integer survives");
    double d;
    mg_json_double(&doc, mg_json_get(&doc, 0, "f"), &d);
    ok(d == 0.1, "double survives");
}

int main(void)
{
    test_writer();
    test_torch_error_file();
    test_parser();
    test_roundtrip();
    return done_testing();
}
