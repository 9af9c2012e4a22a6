/* Finding and hiding secrets in text (redact.h). One scanner serves the
 * command line that the event log records and the messages the programs
 * print, so what is hidden is the same everywhere. */
#include "redact.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct out {
    char *p;
    size_t cap, n;
};

static void emit(struct out *o, const char *s, size_t n)
{
    for (size_t i = 0; i < n && o->n + 1 < o->cap; i++)
        o->p[o->n++] = s[i];
    if (o->cap)
        o->p[o->n] = '\0';
}

static int name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
}

/* A value ends at a separator of lists, queries and shell words. */
static int value_end(char c)
{
    return c == '\0' || strchr(",;& \t\n\r'\"", c) != NULL;
}

static int has_ci(const char *s, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (strncasecmp(s + i, needle, k) == 0)
            return 1;
    return 0;
}

/* A name that says its value is a secret. Not "key" alone (etcd's --key is a
 * file) nor "pwd" (PWD is the working directory). */
static int secret_name(const char *s, size_t n)
{
    static const char *const names[] = {
        "token",       "passw",       "secret",     "apikey",      "api_key",
        "api-key",     "access_key",  "access-key", "accesskey",   "credential",
        "private_key", "private-key", "privatekey", "session_key", "auth_key",
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (has_ci(s, n, names[i]))
            return 1;
    return 0;
}

static int all_digits(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

int mg_redact(const char *text, char *out, size_t cap)
{
    struct out o = {out, cap, 0};
    int hidden = 0;
    const char *s = text ? text : "";
    if (cap)
        out[0] = '\0';
    size_t i = 0, len = strlen(s);
    while (i < len) {
        if (strncmp(s + i, "://", 3) == 0) {
            /* scheme://[userinfo@]host...: the authority ends at / ? # or a space */
            size_t a = i + 3, e = a, at = 0;
            while (e < len && !strchr("/?# \t\n'\"", s[e]))
                e++;
            for (size_t k = a; k < e; k++)
                if (s[k] == '@')
                    at = k;
            emit(&o, s + i, 3);
            if (at) {
                const char *colon = memchr(s + a, ':', at - a);
                if (colon)
                    emit(&o, s + a, (size_t)(colon - (s + a)) + 1);
                emit(&o, MG_REDACTED, strlen(MG_REDACTED));
                hidden = 1;
                i = at; /* the '@' and the host go out as they are */
            } else {
                i = a;
            }
            continue;
        }
        if (strncasecmp(s + i, "Bearer ", 7) == 0) { /* an HTTP Authorization header's */
            size_t e = i + 7;
            while (e < len && !value_end(s[e]))
                e++;
            emit(&o, s + i, 7);
            if (e > i + 7) {
                emit(&o, MG_REDACTED, strlen(MG_REDACTED));
                hidden = 1;
            }
            i = e;
            continue;
        }
        if ((s[i] == '=' || s[i] == ':') && i > 0) {
            /* NAME=VALUE, NAME='VALUE', NAME="VALUE", and JSON's "NAME": "VALUE" */
            size_t nb = i, ne = i, v = i + 1;
            if (s[i] == ':') {
                if (s[i - 1] != '"') { /* only a quoted name: URLs and times have colons */
                    emit(&o, s + i, 1);
                    i++;
                    continue;
                }
                ne = nb = i - 1;
                while (v < len && (s[v] == ' ' || s[v] == '\t'))
                    v++;
            }
            while (nb > 0 && name_char(s[nb - 1]))
                nb--;
            size_t vb = v, e = v;
            char q = v < len && (s[v] == '\'' || s[v] == '"') ? s[v] : 0;
            if (q) {
                vb = e = v + 1;
                while (e < len && s[e] != q)
                    e++;
            } else if (s[i] == ':') {
                e = vb; /* a JSON number, true or null: not a secret string */
            } else {
                while (e < len && !value_end(s[e]))
                    e++;
            }
            /* digits alone are a count (max_tokens=2048), except a password's */
            int count = all_digits(s + vb, e - vb) && !has_ci(s + nb, ne - nb, "passw") &&
                        !has_ci(s + nb, ne - nb, "secret");
            if (secret_name(s + nb, ne - nb) && e > vb && !count) {
                emit(&o, s + i, vb - i); /* '=' or ':' and what stands before the value */
                emit(&o, MG_REDACTED, strlen(MG_REDACTED));
                hidden = 1;
                i = e; /* a closing quote goes out as it is */
                continue;
            }
        }
        emit(&o, s + i, 1);
        i++;
    }
    return hidden;
}

int mg_redact_arg(const char *prev, const char *arg, char *out, size_t cap)
{
    const char *a = arg ? arg : "";
    size_t n = strlen(a);
    /* --token X: the flag names a secret and carries no value of its own */
    if (prev && prev[0] == '-' && !strchr(prev, '=') && secret_name(prev, strlen(prev)) &&
        a[0] != '-' && n &&
        (!all_digits(a, n) || has_ci(prev, strlen(prev), "passw") ||
         has_ci(prev, strlen(prev), "secret"))) {
        if (cap) {
            strncpy(out, MG_REDACTED, cap - 1);
            out[cap - 1] = '\0';
        }
        return 1;
    }
    return mg_redact(a, out, cap);
}

void mg_redact_inplace(char *buf, size_t cap)
{
    if (!buf || !cap)
        return;
    char *tmp = malloc(cap);
    if (!tmp) { /* never the secret: the message is lost instead */
        strncpy(buf, "(a message with a secret, hidden: out of memory)", cap - 1);
        buf[cap - 1] = '\0';
        return;
    }
    if (mg_redact(buf, tmp, cap))
        memcpy(buf, tmp, strlen(tmp) + 1);
    free(tmp);
}
