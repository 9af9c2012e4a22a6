/* Bounded JSON writer and parser (see json.h). */
#include "json.h"
#include "mg_err.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- writer ------------------------------------------------------------------ */

void mg_jsonw_init(struct mg_jsonw *w, char *buf, size_t cap)
{
    memset(w, 0, sizeof(*w));
    w->buf = buf;
    w->cap = cap;
    if (!buf || cap == 0)
        w->err = -MG_ETOOBIG;
    else
        buf[0] = '\0';
}

static void put(struct mg_jsonw *w, const char *s, size_t n)
{
    if (w->err)
        return;
    if (n >= w->cap - w->len) { /* keep one byte for the NUL */
        w->err = -MG_ETOOBIG;
        return;
    }
    memcpy(w->buf + w->len, s, n);
    w->len += n;
}

static void putc1(struct mg_jsonw *w, char c)
{
    put(w, &c, 1);
}

/* Comma and placement checks before any value. */
static void before_value(struct mg_jsonw *w)
{
    if (w->err)
        return;
    if (w->want_value) {
        w->want_value = 0;
        return;
    }
    if (w->depth == 0) {
        if (w->len)
            w->err = -EINVAL; /* a second top-level value */
        return;
    }
    if (w->in_obj[w->depth - 1]) {
        w->err = -EINVAL; /* object member without a key */
        return;
    }
    if (!w->first[w->depth - 1])
        putc1(w, ',');
    w->first[w->depth - 1] = 0;
}

static void open_container(struct mg_jsonw *w, int obj)
{
    before_value(w);
    if (w->err)
        return;
    if (w->depth >= MG_JSON_MAX_DEPTH) {
        w->err = -EINVAL;
        return;
    }
    putc1(w, obj ? '{' : '[');
    w->first[w->depth] = 1;
    w->in_obj[w->depth] = (unsigned char)obj;
    w->depth++;
}

static void close_container(struct mg_jsonw *w, int obj)
{
    if (w->err)
        return;
    if (w->depth == 0 || w->in_obj[w->depth - 1] != obj || w->want_value) {
        w->err = -EINVAL;
        return;
    }
    w->depth--;
    putc1(w, obj ? '}' : ']');
}

void mg_jsonw_obj_begin(struct mg_jsonw *w)
{
    open_container(w, 1);
}

void mg_jsonw_obj_end(struct mg_jsonw *w)
{
    close_container(w, 1);
}

void mg_jsonw_arr_begin(struct mg_jsonw *w)
{
    open_container(w, 0);
}

void mg_jsonw_arr_end(struct mg_jsonw *w)
{
    close_container(w, 0);
}

/* Length of a valid UTF-8 sequence at s (n bytes available), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    unsigned cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

static void put_escaped(struct mg_jsonw *w, const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0, run = 0; /* bytes [i-run, i) are copied verbatim */

    putc1(w, '"');
    while (i < n && !w->err) {
        unsigned c = s[i];
        const char *esc = NULL;
        char hex[8];
        size_t ulen = 1;

        if (c == '"')
            esc = "\\\"";
        else if (c == '\\')
            esc = "\\\\";
        else if (c == '\n')
            esc = "\\n";
        else if (c == '\r')
            esc = "\\r";
        else if (c == '\t')
            esc = "\\t";
        else if (c == '\b')
            esc = "\\b";
        else if (c == '\f')
            esc = "\\f";
        else if (c < 0x20) {
            snprintf(hex, sizeof(hex), "\\u%04x", c);
            esc = hex;
        } else if (c >= 0x80) {
            ulen = utf8_len(s + i, n - i);
            if (!ulen) {
                esc = "\xef\xbf\xbd"; /* U+FFFD for an invalid byte */
                ulen = 1;
            }
        }
        if (esc) {
            put(w, (const char *)s + i - run, run);
            run = 0;
            put(w, esc, strlen(esc));
            i += ulen;
        } else {
            run += ulen;
            i += ulen;
        }
    }
    put(w, (const char *)s + i - run, run);
    putc1(w, '"');
}

void mg_jsonw_key(struct mg_jsonw *w, const char *key)
{
    if (w->err)
        return;
    if (w->depth == 0 || !w->in_obj[w->depth - 1] || w->want_value || !key) {
        w->err = -EINVAL;
        return;
    }
    if (!w->first[w->depth - 1])
        putc1(w, ',');
    w->first[w->depth - 1] = 0;
    put_escaped(w, key, strlen(key));
    putc1(w, ':');
    w->want_value = 1;
}

void mg_jsonw_strn(struct mg_jsonw *w, const char *s, size_t n)
{
    before_value(w);
    put_escaped(w, s, n);
}

void mg_jsonw_str(struct mg_jsonw *w, const char *s)
{
    if (!s) {
        mg_jsonw_null(w);
        return;
    }
    mg_jsonw_strn(w, s, strlen(s));
}

void mg_jsonw_int(struct mg_jsonw *w, long long v)
{
    char num[32];
    int n = snprintf(num, sizeof(num), "%lld", v);
    before_value(w);
    put(w, num, (size_t)n);
}

void mg_jsonw_double(struct mg_jsonw *w, double v)
{
    char num[40];
    if (!isfinite(v)) {
        mg_jsonw_null(w);
        return;
    }
    int n = snprintf(num, sizeof(num), "%.17g", v);
    /* Prefer the shortest form that reads back exactly. */
    for (int prec = 6; prec < 17; prec++) {
        char tryb[40];
        int m = snprintf(tryb, sizeof(tryb), "%.*g", prec, v);
        if (strtod(tryb, NULL) == v) {
            memcpy(num, tryb, (size_t)m + 1);
            n = m;
            break;
        }
    }
    before_value(w);
    put(w, num, (size_t)n);
}

void mg_jsonw_bool(struct mg_jsonw *w, int v)
{
    before_value(w);
    put(w, v ? "true" : "false", v ? 4 : 5);
}

void mg_jsonw_null(struct mg_jsonw *w)
{
    before_value(w);
    put(w, "null", 4);
}

void mg_jsonw_kstr(struct mg_jsonw *w, const char *key, const char *s)
{
    mg_jsonw_key(w, key);
    mg_jsonw_str(w, s);
}

void mg_jsonw_kint(struct mg_jsonw *w, const char *key, long long v)
{
    mg_jsonw_key(w, key);
    mg_jsonw_int(w, v);
}

void mg_jsonw_kdouble(struct mg_jsonw *w, const char *key, double v)
{
    mg_jsonw_key(w, key);
    mg_jsonw_double(w, v);
}

void mg_jsonw_kbool(struct mg_jsonw *w, const char *key, int v)
{
    mg_jsonw_key(w, key);
    mg_jsonw_bool(w, v);
}

int mg_jsonw_finish(struct mg_jsonw *w)
{
    if (!w->err && (w->depth || w->want_value))
        w->err = -EINVAL;
    if (w->buf && w->cap)
        w->buf[w->len] = '\0'; /* put() always leaves room for it */
    return w->err ? w->err : (int)w->len;
}

/* ---- parser ------------------------------------------------------------------ */

struct parser {
    const char *s;
    size_t n, pos;
    struct mg_json_tok *toks;
    int ntok, cap;
};

static void skip_ws(struct parser *p)
{
    while (p->pos < p->n) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

static int new_tok(struct parser *p, enum mg_json_type type, size_t start)
{
    if (p->ntok >= p->cap)
        return -MG_ETOOBIG;
    struct mg_json_tok *t = &p->toks[p->ntok];
    t->type = type;
    t->start = (uint32_t)start;
    t->len = 0;
    t->size = 0;
    t->next = 0;
    return p->ntok++;
}

static int is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int parse_string(struct parser *p)
{
    size_t start = ++p->pos; /* past the quote */
    while (p->pos < p->n) {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c == '"') {
            int t = new_tok(p, MG_JSON_STRING, start);
            if (t < 0)
                return t;
            p->toks[t].len = (uint32_t)(p->pos - start);
            p->toks[t].next = t + 1;
            p->pos++;
            return t;
        }
        if (c < 0x20)
            return -MG_EFORMAT;
        if (c == '\\') {
            if (++p->pos >= p->n)
                return -MG_EFORMAT;
            char e = p->s[p->pos];
            if (e == 'u') {
                if (p->pos + 4 >= p->n)
                    return -MG_EFORMAT;
                for (int i = 1; i <= 4; i++)
                    if (!is_hex(p->s[p->pos + i]))
                        return -MG_EFORMAT;
                p->pos += 4;
            } else if (!strchr("\"\\/bfnrt", e) || e == '\0') {
                return -MG_EFORMAT;
            }
        }
        p->pos++;
    }
    return -MG_EFORMAT;
}

static int parse_number(struct parser *p)
{
    size_t start = p->pos;
    const char *s = p->s;
    if (p->pos < p->n && s[p->pos] == '-')
        p->pos++;
    if (p->pos >= p->n || !is_digit(s[p->pos]))
        return -MG_EFORMAT;
    if (s[p->pos] == '0')
        p->pos++;
    else
        while (p->pos < p->n && is_digit(s[p->pos]))
            p->pos++;
    if (p->pos < p->n && s[p->pos] == '.') {
        p->pos++;
        if (p->pos >= p->n || !is_digit(s[p->pos]))
            return -MG_EFORMAT;
        while (p->pos < p->n && is_digit(s[p->pos]))
            p->pos++;
    }
    if (p->pos < p->n && (s[p->pos] == 'e' || s[p->pos] == 'E')) {
        p->pos++;
        if (p->pos < p->n && (s[p->pos] == '+' || s[p->pos] == '-'))
            p->pos++;
        if (p->pos >= p->n || !is_digit(s[p->pos]))
            return -MG_EFORMAT;
        while (p->pos < p->n && is_digit(s[p->pos]))
            p->pos++;
    }
    int t = new_tok(p, MG_JSON_NUMBER, start);
    if (t < 0)
        return t;
    p->toks[t].len = (uint32_t)(p->pos - start);
    p->toks[t].next = t + 1;
    return t;
}

static int parse_literal(struct parser *p, const char *word, enum mg_json_type type)
{
    size_t len = strlen(word);
    if (p->n - p->pos < len || memcmp(p->s + p->pos, word, len) != 0)
        return -MG_EFORMAT;
    int t = new_tok(p, type, p->pos);
    if (t < 0)
        return t;
    p->toks[t].len = (uint32_t)len;
    p->toks[t].next = t + 1;
    p->pos += len;
    return t;
}

static int parse_value(struct parser *p, int depth);

static int parse_container(struct parser *p, int depth, int obj)
{
    if (depth >= MG_JSON_MAX_DEPTH)
        return -MG_ETOOBIG;
    int t = new_tok(p, obj ? MG_JSON_OBJECT : MG_JSON_ARRAY, p->pos);
    if (t < 0)
        return t;
    char close = obj ? '}' : ']';
    p->pos++;
    skip_ws(p);
    if (p->pos < p->n && p->s[p->pos] == close) {
        p->pos++;
    } else {
        for (;;) {
            skip_ws(p);
            if (obj) {
                if (p->pos >= p->n || p->s[p->pos] != '"')
                    return -MG_EFORMAT;
                int k = parse_string(p);
                if (k < 0)
                    return k;
                skip_ws(p);
                if (p->pos >= p->n || p->s[p->pos] != ':')
                    return -MG_EFORMAT;
                p->pos++;
            }
            int v = parse_value(p, depth + 1);
            if (v < 0)
                return v;
            p->toks[t].size++;
            skip_ws(p);
            if (p->pos >= p->n)
                return -MG_EFORMAT;
            if (p->s[p->pos] == ',') {
                p->pos++;
                continue;
            }
            if (p->s[p->pos] == close) {
                p->pos++;
                break;
            }
            return -MG_EFORMAT;
        }
    }
    p->toks[t].len = (uint32_t)(p->pos - p->toks[t].start);
    p->toks[t].next = p->ntok;
    return t;
}

static int parse_value(struct parser *p, int depth)
{
    skip_ws(p);
    if (p->pos >= p->n)
        return -MG_EFORMAT;
    switch (p->s[p->pos]) {
    case '{':
        return parse_container(p, depth, 1);
    case '[':
        return parse_container(p, depth, 0);
    case '"':
        return parse_string(p);
    case 't':
        return parse_literal(p, "true", MG_JSON_BOOL);
    case 'f':
        return parse_literal(p, "false", MG_JSON_BOOL);
    case 'n':
        return parse_literal(p, "null", MG_JSON_NULL);
    default:
        return parse_number(p);
    }
}

int mg_json_parse(struct mg_json *doc, const char *text, size_t len, struct mg_json_tok *toks,
                  int cap)
{
    struct parser p = {.s = text, .n = len, .toks = toks, .cap = cap};
    memset(doc, 0, sizeof(*doc));
    if (!text || len > UINT32_MAX)
        return -EINVAL;
    int rc = parse_value(&p, 0);
    if (rc < 0)
        return rc;
    skip_ws(&p);
    if (p.pos != p.n)
        return -MG_EFORMAT;
    doc->text = text;
    doc->len = len;
    doc->toks = toks;
    doc->ntok = p.ntok;
    doc->cap = cap;
    return p.ntok;
}

static int valid_tok(const struct mg_json *doc, int tok)
{
    return doc && tok >= 0 && tok < doc->ntok;
}

int mg_json_next(const struct mg_json *doc, int tok)
{
    if (!valid_tok(doc, tok))
        return doc ? doc->ntok : 0;
    return doc->toks[tok].next;
}

static int str_eq(const struct mg_json *doc, int tok, const char *str);

int mg_json_get(const struct mg_json *doc, int obj, const char *key)
{
    if (!valid_tok(doc, obj) || doc->toks[obj].type != MG_JSON_OBJECT)
        return -MG_ENOKEY;
    int k = obj + 1;
    for (int i = 0; i < doc->toks[obj].size; i++) {
        int v = k + 1;
        if (str_eq(doc, k, key))
            return v;
        k = doc->toks[v].next;
    }
    return -MG_ENOKEY;
}

int mg_json_path(const struct mg_json *doc, int obj, const char *path)
{
    char name[256];
    int tok = obj;
    while (*path) {
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        if (n >= sizeof(name))
            return -MG_ENOKEY;
        memcpy(name, path, n);
        name[n] = '\0';
        tok = mg_json_get(doc, tok, name);
        if (tok < 0)
            return tok;
        path += n + (dot ? 1 : 0);
    }
    return tok;
}

int mg_json_at(const struct mg_json *doc, int arr, int i)
{
    if (!valid_tok(doc, arr) || doc->toks[arr].type != MG_JSON_ARRAY || i < 0 ||
        i >= doc->toks[arr].size)
        return -MG_ENOKEY;
    int t = arr + 1;
    while (i-- > 0)
        t = doc->toks[t].next;
    return t;
}

static unsigned hex4(const char *s)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v = v * 16 + (unsigned)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
}

static size_t encode_utf8(unsigned cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Unescapes a string token into buf (may be NULL); returns the full length. */
static int unescape(const struct mg_json *doc, int tok, char *buf, size_t cap)
{
    if (!valid_tok(doc, tok) || doc->toks[tok].type != MG_JSON_STRING)
        return -EINVAL;
    const char *s = doc->text + doc->toks[tok].start;
    size_t n = doc->toks[tok].len, total = 0, out = 0;
    int full = 0;
    for (size_t i = 0; i < n;) {
        char ch[4];
        size_t clen;
        if (s[i] != '\\') {
            /* copy a whole UTF-8 sequence at once so truncation keeps it intact */
            clen = 1;
            if ((unsigned char)s[i] >= 0xc0)
                while (i + clen < n && clen < 4 && ((unsigned char)s[i + clen] & 0xc0) == 0x80)
                    clen++;
            memcpy(ch, s + i, clen);
            i += clen;
        } else {
            char e = s[i + 1];
            i += 2;
            switch (e) {
            case 'b':
                ch[0] = '\b';
                clen = 1;
                break;
            case 'f':
                ch[0] = '\f';
                clen = 1;
                break;
            case 'n':
                ch[0] = '\n';
                clen = 1;
                break;
            case 'r':
                ch[0] = '\r';
                clen = 1;
                break;
            case 't':
                ch[0] = '\t';
                clen = 1;
                break;
            case 'u': {
                unsigned cp = hex4(s + i);
                i += 4;
                if (cp >= 0xd800 && cp <= 0xdbff && i + 6 <= n && s[i] == '\\' && s[i + 1] == 'u') {
                    unsigned lo = hex4(s + i + 2);
                    if (lo >= 0xdc00 && lo <= 0xdfff) {
                        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                        i += 6;
                    }
                }
                if (cp >= 0xd800 && cp <= 0xdfff)
                    cp = 0xfffd; /* lone surrogate */
                clen = encode_utf8(cp, ch);
                break;
            }
            default: /* " \ / */
                ch[0] = e;
                clen = 1;
                break;
            }
        }
        total += clen;
        if (!full && buf && cap && out + clen <= cap - 1) {
            memcpy(buf + out, ch, clen);
            out += clen;
        } else {
            full = 1;
        }
    }
    if (buf && cap)
        buf[out] = '\0';
    return total > INT32_MAX ? INT32_MAX : (int)total;
}

int mg_json_str(const struct mg_json *doc, int tok, char *buf, size_t cap)
{
    return unescape(doc, tok, buf, cap);
}

/* A string token equals str (after unescaping). */
static int str_eq(const struct mg_json *doc, int tok, const char *str)
{
    if (!valid_tok(doc, tok) || doc->toks[tok].type != MG_JSON_STRING)
        return 0;
    size_t want = strlen(str);
    const char *raw = doc->text + doc->toks[tok].start;
    if (!memchr(raw, '\\', doc->toks[tok].len)) /* fast path: nothing escaped */
        return doc->toks[tok].len == want && memcmp(raw, str, want) == 0;
    char buf[512];
    if (want >= sizeof(buf))
        return 0;
    int n = unescape(doc, tok, buf, sizeof(buf));
    return n >= 0 && (size_t)n == want && memcmp(buf, str, want) == 0;
}

/* The token's text as a NUL-terminated number candidate. */
static int number_text(const struct mg_json *doc, int tok, char *buf, size_t cap)
{
    if (!valid_tok(doc, tok))
        return -EINVAL;
    const struct mg_json_tok *t = &doc->toks[tok];
    if (t->type == MG_JSON_NUMBER) {
        if (t->len >= cap)
            return -ERANGE;
        memcpy(buf, doc->text + t->start, t->len);
        buf[t->len] = '\0';
        return 0;
    }
    if (t->type == MG_JSON_STRING) {
        int n = unescape(doc, tok, buf, cap);
        if (n < 0)
            return n;
        if ((size_t)n >= cap)
            return -ERANGE;
        return 0;
    }
    return -EINVAL;
}

int mg_json_int(const struct mg_json *doc, int tok, long long *out)
{
    char buf[64], *end;
    int rc = number_text(doc, tok, buf, sizeof(buf));
    if (rc)
        return rc;
    const char *s = buf;
    while (*s == ' ')
        s++;
    if (!*s)
        return -EINVAL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end == '.' || *end == 'e' || *end == 'E') {
        double d = strtod(s, &end);
        if (*end || d != floor(d) || d < -9.2e18 || d > 9.2e18)
            return -EINVAL;
        *out = (long long)d;
        return 0;
    }
    if (errno == ERANGE)
        return -ERANGE;
    if (*end)
        return -EINVAL;
    *out = v;
    return 0;
}

int mg_json_double(const struct mg_json *doc, int tok, double *out)
{
    char buf[64], *end;
    int rc = number_text(doc, tok, buf, sizeof(buf));
    if (rc)
        return rc;
    if (!buf[0])
        return -EINVAL;
    double d = strtod(buf, &end);
    if (*end)
        return -EINVAL;
    *out = d;
    return 0;
}

int mg_json_bool(const struct mg_json *doc, int tok, int *out)
{
    if (!valid_tok(doc, tok) || doc->toks[tok].type != MG_JSON_BOOL)
        return -EINVAL;
    *out = doc->text[doc->toks[tok].start] == 't';
    return 0;
}
