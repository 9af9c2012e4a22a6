/* A small bounded JSON writer and parser, shared by the launcher (error files,
 * the event log), the runtime (error files) and the rendezvous backends.
 *
 * Writer: appends to a caller-supplied buffer of fixed capacity. Calls never
 * fail individually; an overflow or misuse is remembered and reported once by
 * mg_jsonw_finish(). Strings are escaped; invalid UTF-8 bytes become U+FFFD so
 * the output is always valid JSON.
 *
 * Parser: tokenizes one JSON text into a caller-supplied token array (no
 * allocation, no recursion beyond MG_JSON_MAX_DEPTH). Tokens are laid out in
 * document order; an object's children are key, value, key, value, ...; each
 * token records the index just past its subtree, so siblings are walked with
 * mg_json_next(). Accessors read values out of the original text. */
#ifndef MG_JSON_H
#define MG_JSON_H

#include <stddef.h>
#include <stdint.h>

#define MG_JSON_MAX_DEPTH 64

/* ---- writer ------------------------------------------------------------------ */

struct mg_jsonw {
    char *buf;
    size_t cap, len;
    int depth;
    int err;                                /* first error: -MG_ETOOBIG or -EINVAL */
    unsigned char first[MG_JSON_MAX_DEPTH]; /* no member written yet at this depth */
    unsigned char in_obj[MG_JSON_MAX_DEPTH];
    int want_value; /* a key was written; the value comes next */
};

void mg_jsonw_init(struct mg_jsonw *w, char *buf, size_t cap);
void mg_jsonw_obj_begin(struct mg_jsonw *w);
void mg_jsonw_obj_end(struct mg_jsonw *w);
void mg_jsonw_arr_begin(struct mg_jsonw *w);
void mg_jsonw_arr_end(struct mg_jsonw *w);
void mg_jsonw_key(struct mg_jsonw *w, const char *key);
void mg_jsonw_str(struct mg_jsonw *w, const char *s); /* NULL writes null */
void mg_jsonw_strn(struct mg_jsonw *w, const char *s, size_t n);
void mg_jsonw_int(struct mg_jsonw *w, long long v);
void mg_jsonw_double(struct mg_jsonw *w, double v); /* non-finite values write null */
void mg_jsonw_bool(struct mg_jsonw *w, int v);
void mg_jsonw_null(struct mg_jsonw *w);

/* key + value shorthands */
void mg_jsonw_kstr(struct mg_jsonw *w, const char *key, const char *s);
void mg_jsonw_kint(struct mg_jsonw *w, const char *key, long long v);
void mg_jsonw_kdouble(struct mg_jsonw *w, const char *key, double v);
void mg_jsonw_kbool(struct mg_jsonw *w, const char *key, int v);

/* NUL-terminates the buffer. Returns the length, or -MG_ETOOBIG when the
 * buffer was too small, or -EINVAL for unbalanced or misplaced calls. */
int mg_jsonw_finish(struct mg_jsonw *w);

/* ---- parser ------------------------------------------------------------------ */

enum mg_json_type {
    MG_JSON_NULL,
    MG_JSON_BOOL,
    MG_JSON_NUMBER,
    MG_JSON_STRING,
    MG_JSON_ARRAY,
    MG_JSON_OBJECT,
};

struct mg_json_tok {
    enum mg_json_type type;
    uint32_t start, len; /* source span; for strings, inside the quotes */
    int32_t size;        /* arrays: elements; objects: members; else 0 */
    int32_t next;        /* index of the token after this one's subtree */
};

struct mg_json {
    const char *text;
    size_t len;
    struct mg_json_tok *toks;
    int ntok, cap;
};

/* Parses text[0..len) (one value, surrounding whitespace allowed). Returns the
 * token count, -MG_ETOOBIG when cap tokens are not enough or nesting exceeds
 * MG_JSON_MAX_DEPTH, -MG_EFORMAT for malformed input. */
int mg_json_parse(struct mg_json *doc, const char *text, size_t len, struct mg_json_tok *toks,
                  int cap);

/* Index of the token after tok's subtree (its next sibling), or doc->ntok. */
int mg_json_next(const struct mg_json *doc, int tok);
/* Value token of member key in object obj; -MG_ENOKEY when absent or obj is
 * not an object. */
int mg_json_get(const struct mg_json *doc, int obj, const char *key);
/* Follows a dotted path of member names ("message.extraInfo.timestamp"). */
int mg_json_path(const struct mg_json *doc, int obj, const char *path);
/* Array element i; -MG_ENOKEY when out of range. */
int mg_json_at(const struct mg_json *doc, int arr, int i);

/* Copies a string value, unescaped, NUL-terminated and truncated to cap-1
 * bytes (cut at a UTF-8 character boundary). Returns the full unescaped
 * length (like snprintf), or -EINVAL when tok is not a string. */
int mg_json_str(const struct mg_json *doc, int tok, char *buf, size_t cap);
/* Integer value of a number token, or of a string holding an integer
 * ("1700000000", the way torch writes timestamps). -EINVAL / -ERANGE. */
int mg_json_int(const struct mg_json *doc, int tok, long long *out);
int mg_json_double(const struct mg_json *doc, int tok, double *out);
int mg_json_bool(const struct mg_json *doc, int tok, int *out);

#endif
