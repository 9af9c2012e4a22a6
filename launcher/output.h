/* Worker output on its way to the console: the line prefix template
 * ("[${role_name}${local_rank}]:") and the line splitter that turns a pipe's
 * byte stream into whole lines, so lines of two ranks never mix on the console.
 *
 * The splitter treats '\n' and '\r' as line ends (so progress bars redraw as
 * they do on a terminal), holds a partial line until its end arrives, and
 * never holds more than its capacity: a longer line is passed on in pieces,
 * each marked MG_LINE_CUT. Memory per stream is bounded by that capacity. */
#ifndef MG_OUTPUT_H
#define MG_OUTPUT_H

#include <stddef.h>

#define MG_LINE_MAX 16384 /* longest piece the splitter holds */

/* How a piece handed to the callback ended. */
enum mg_line_end {
    MG_LINE_NL,   /* '\n' */
    MG_LINE_CR,   /* '\r' (progress bar redraw) */
    MG_LINE_CRLF, /* the '\n' of a "\r\n" whose '\r' ended the previous piece: text is empty */
    MG_LINE_CUT,  /* no end yet: the line was longer than the capacity */
    MG_LINE_EOF,  /* the stream ended without a line end */
};

/* Called once per piece; text is not NUL-terminated. */
typedef void (*mg_line_fn)(void *ctx, const char *text, size_t len, enum mg_line_end end);

struct mg_linebuf {
    char *buf; /* partial line, allocated on first use */
    size_t len, cap;
    int after_cr; /* the last piece ended with '\r' */
};

/* cap: bytes held at most (0 = MG_LINE_MAX). */
void mg_linebuf_init(struct mg_linebuf *lb, size_t cap);
/* Feeds bytes. Returns 0, or -ENOMEM (the bytes are then passed on as cut pieces). */
int mg_linebuf_feed(struct mg_linebuf *lb, const char *data, size_t n, mg_line_fn fn, void *ctx);
/* At end of stream: passes on a held partial line (MG_LINE_EOF). */
void mg_linebuf_flush(struct mg_linebuf *lb, mg_line_fn fn, void *ctx);
void mg_linebuf_release(struct mg_linebuf *lb);

struct mg_prefix_vars {
    const char *role_name;
    int local_rank;
    int rank;
    const char *hostname;
};

#define MG_PREFIX_DEFAULT "[${role_name}${local_rank}]:"

/* Expands a template: ${role_name} ${local_rank} ${rank} ${hostname}, the
 * same names without braces, and $$ for a literal '$' (Python's
 * string.Template rules, which torchrun uses). Returns the length, -EINVAL
 * for an unknown or malformed placeholder (*bad, if given, points at it), or
 * -MG_ETOOBIG when out is too small. */
int mg_prefix_expand(const char *tmpl, const struct mg_prefix_vars *v, char *out, size_t cap,
                     const char **bad);

/* torchrun's argument macro: "${local_rank}" (and "$local_rank") in a worker
 * argument becomes the local rank, "$$" becomes "$", anything else stays
 * (string.Template.safe_substitute). Returns the length or -MG_ETOOBIG. */
int mg_subst_local_rank(const char *arg, int local_rank, char *out, size_t cap);

/* The last max_lines lines (at most cap-1 bytes) of a byte tail, for the
 * failure summary: drops a leading partial line when the tail was cut, and
 * replaces '\r' progress redraws by their last state. Returns the length. */
size_t mg_tail_lines(const char *tail, size_t len, int cut, int max_lines, char *out, size_t cap);

#endif
