/* Line splitting and prefix templates for worker output (see output.h). */
#include "output.h"
#include "mg_err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mg_linebuf_init(struct mg_linebuf *lb, size_t cap)
{
    memset(lb, 0, sizeof(*lb));
    lb->cap = cap ? cap : MG_LINE_MAX;
}

void mg_linebuf_release(struct mg_linebuf *lb)
{
    free(lb->buf);
    lb->buf = NULL;
    lb->len = 0;
}

static void emit(struct mg_linebuf *lb, const char *text, size_t len, enum mg_line_end end,
                 mg_line_fn fn, void *ctx)
{
    fn(ctx, text, len, end);
    lb->after_cr = end == MG_LINE_CR;
}

/* Appends to the held partial line, passing on full pieces. */
static int hold(struct mg_linebuf *lb, const char *data, size_t n, mg_line_fn fn, void *ctx)
{
    if (!lb->buf) {
        lb->buf = malloc(lb->cap);
        if (!lb->buf) {
            /* No memory: pass the bytes on as they are rather than drop them. */
            emit(lb, data, n, MG_LINE_CUT, fn, ctx);
            return -ENOMEM;
        }
    }
    while (n) {
        size_t room = lb->cap - lb->len;
        size_t k = n < room ? n : room;
        memcpy(lb->buf + lb->len, data, k);
        lb->len += k;
        data += k;
        n -= k;
        if (lb->len == lb->cap) {
            emit(lb, lb->buf, lb->len, MG_LINE_CUT, fn, ctx);
            lb->len = 0;
        }
    }
    return 0;
}

int mg_linebuf_feed(struct mg_linebuf *lb, const char *data, size_t n, mg_line_fn fn, void *ctx)
{
    int rc = 0;
    while (n) {
        /* The '\n' right after a '\r' that ended the previous piece. */
        if (lb->after_cr && lb->len == 0 && data[0] == '\n') {
            emit(lb, "", 0, MG_LINE_CRLF, fn, ctx);
            data++;
            n--;
            continue;
        }
        const char *nl = memchr(data, '\n', n);
        const char *cr = memchr(data, '\r', nl ? (size_t)(nl - data) : n);
        const char *end = cr ? cr : nl;
        if (!end) {
            int r = hold(lb, data, n, fn, ctx);
            if (r)
                rc = r;
            lb->after_cr = 0;
            return rc;
        }
        size_t seg = (size_t)(end - data);
        enum mg_line_end how = cr ? MG_LINE_CR : MG_LINE_NL;
        if (lb->len) {
            /* Complete the held line; pieces longer than cap go out cut. */
            if (lb->len + seg > lb->cap) {
                size_t k = lb->cap - lb->len;
                int r = hold(lb, data, k, fn, ctx); /* emits one full CUT piece */
                if (r)
                    rc = r;
                data += k;
                n -= k;
                continue;
            }
            memcpy(lb->buf + lb->len, data, seg);
            emit(lb, lb->buf, lb->len + seg, how, fn, ctx);
            lb->len = 0;
        } else {
            /* Straight from the input, in cap-sized pieces. */
            const char *p = data;
            size_t left = seg;
            while (left > lb->cap) {
                emit(lb, p, lb->cap, MG_LINE_CUT, fn, ctx);
                p += lb->cap;
                left -= lb->cap;
            }
            emit(lb, p, left, how, fn, ctx);
        }
        data += seg + 1;
        n -= seg + 1;
    }
    return rc;
}

void mg_linebuf_flush(struct mg_linebuf *lb, mg_line_fn fn, void *ctx)
{
    if (lb->len)
        emit(lb, lb->buf, lb->len, MG_LINE_EOF, fn, ctx);
    lb->len = 0;
    lb->after_cr = 0;
}

/* ---- templates ---------------------------------------------------------------- */

static int is_ident(char c, int first)
{
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (!first && c >= '0' && c <= '9');
}

/* Reads a placeholder at s (just after '$'): "{name}" or "name". Sets *name,
 * *nlen and returns the bytes consumed, or 0 when it is not a placeholder. */
static size_t placeholder(const char *s, const char **name, size_t *nlen, int *braced)
{
    size_t i = 0;
    *braced = s[0] == '{';
    if (*braced)
        i = 1;
    if (!is_ident(s[i], 1))
        return 0;
    size_t b = i;
    while (is_ident(s[i], 0))
        i++;
    *name = s + b;
    *nlen = i - b;
    if (*braced) {
        if (s[i] != '}')
            return 0;
        i++;
    }
    return i;
}

static int name_is(const char *name, size_t n, const char *want)
{
    return strlen(want) == n && memcmp(name, want, n) == 0;
}

int mg_prefix_expand(const char *tmpl, const struct mg_prefix_vars *v, char *out, size_t cap,
                     const char **bad)
{
    size_t len = 0;
    int overflow = 0;

    if (!tmpl || !cap)
        return -EINVAL;
    for (const char *p = tmpl; *p;) {
        char num[24];
        const char *val = NULL;
        size_t vlen;
        if (*p != '$') {
            val = p;
            vlen = 1;
            p++;
        } else if (p[1] == '$') {
            val = "$";
            vlen = 1;
            p += 2;
        } else {
            const char *name;
            size_t nlen;
            int braced;
            size_t used = placeholder(p + 1, &name, &nlen, &braced);
            if (!used) {
                if (bad)
                    *bad = p;
                return -EINVAL;
            }
            if (name_is(name, nlen, "role_name")) {
                val = v->role_name ? v->role_name : "";
            } else if (name_is(name, nlen, "local_rank")) {
                snprintf(num, sizeof(num), "%d", v->local_rank);
                val = num;
            } else if (name_is(name, nlen, "rank")) {
                snprintf(num, sizeof(num), "%d", v->rank);
                val = num;
            } else if (name_is(name, nlen, "hostname")) {
                val = v->hostname ? v->hostname : "";
            } else {
                if (bad)
                    *bad = p;
                return -EINVAL;
            }
            vlen = strlen(val);
            p += 1 + used;
        }
        if (len + vlen >= cap) {
            overflow = 1;
            continue; /* keep scanning so a bad placeholder is still reported */
        }
        memcpy(out + len, val, vlen);
        len += vlen;
    }
    out[len] = '\0';
    return overflow ? -MG_ETOOBIG : (int)len;
}

int mg_subst_local_rank(const char *arg, int local_rank, char *out, size_t cap)
{
    size_t len = 0;
    char num[24];
    snprintf(num, sizeof(num), "%d", local_rank);
    for (const char *p = arg; *p;) {
        const char *val = p;
        size_t vlen = 1, step = 1;
        if (*p == '$') {
            const char *name;
            size_t nlen;
            int braced;
            size_t used = p[1] == '$' ? 0 : placeholder(p + 1, &name, &nlen, &braced);
            if (p[1] == '$') {
                vlen = 1;
                step = 2;
            } else if (used && name_is(name, nlen, "local_rank")) {
                val = num;
                vlen = strlen(num);
                step = 1 + used;
            }
        }
        if (len + vlen >= cap)
            return -MG_ETOOBIG;
        memcpy(out + len, val, vlen);
        len += vlen;
        p += step;
    }
    out[len] = '\0';
    return (int)len;
}

size_t mg_tail_lines(const char *tail, size_t len, int cut, int max_lines, char *out, size_t cap)
{
    const char *s = tail, *end = tail + len;
    size_t n = 0;

    if (!cap)
        return 0;
    if (cut) { /* the first line was cut by the ring: drop it */
        const char *nl = memchr(s, '\n', len);
        s = nl ? nl + 1 : end;
    }
    while (end > s && (end[-1] == '\n' || end[-1] == '\r'))
        end--;
    /* Walk back max_lines line ends. */
    const char *start = end;
    int lines = 0;
    while (start > s) {
        if (start[-1] == '\n' && ++lines >= max_lines)
            break;
        start--;
    }
    /* Copy line by line; of a line with '\r' redraws keep only the last state. */
    while (start < end) {
        const char *nl = memchr(start, '\n', (size_t)(end - start));
        const char *le = nl ? nl : end;
        const char *ls = start;
        for (const char *q = start; q < le; q++)
            if (*q == '\r' && q + 1 < le)
                ls = q + 1;
        size_t k = (size_t)(le - ls);
        if (k && ls[k - 1] == '\r')
            k--;
        if (n + k + 1 >= cap)
            k = cap - 1 - n; /* n < cap - 1 holds here */
        memcpy(out + n, ls, k);
        n += k;
        if (nl && n + 1 < cap)
            out[n++] = '\n';
        start = nl ? nl + 1 : end;
        if (n + 1 >= cap)
            break;
    }
    out[n] = '\0';
    return n;
}
