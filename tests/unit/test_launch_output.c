/* Worker output handling (launcher/output.h): the line splitter with '\r',
 * partial and over-long lines, the prefix template, torchrun's ${local_rank}
 * argument macro, and the stderr tail used by the failure summary. */
#include "output.h"
#include "mg_err.h"
#include "tap.h"

#include <errno.h>

/* Collects pieces as "text|END" records. */
static char got[65536];
static size_t gotlen;

static void collect(void *ctx, const char *text, size_t len, enum mg_line_end end)
{
    static const char *names[] = {"NL", "CR", "CRLF", "CUT", "EOF"};
    (void)ctx;
    if (gotlen + len + 8 >= sizeof(got)) {
        gotlen = sizeof(got) / 2; /* the big-input test only counts pieces */
        return;
    }
    gotlen += (size_t)snprintf(got + gotlen, sizeof(got) - gotlen, "[%.*s|%s]", (int)len, text,
                               names[end]);
}

static void reset(void)
{
    gotlen = 0;
    got[0] = '\0';
}

static void feed_all(struct mg_linebuf *lb, const char *s)
{
    mg_linebuf_feed(lb, s, strlen(s), collect, NULL);
}

static void test_splitter(void)
{
    struct mg_linebuf lb;

    mg_linebuf_init(&lb, 0);
    reset();
    feed_all(&lb, "one\ntwo\n");
    is_str(got, "[one|NL][two|NL]", "whole lines");

    reset();
    feed_all(&lb, "par");
    is_str(got, "", "a partial line is held");
    feed_all(&lb, "tial li");
    feed_all(&lb, "ne\nnext");
    is_str(got, "[partial line|NL]", "completed across three reads");
    mg_linebuf_flush(&lb, collect, NULL);
    is_str(got, "[partial line|NL][next|EOF]", "held text flushed at EOF");

    reset();
    feed_all(&lb, "10%\r20%\r30%\rdone\n");
    is_str(got, "[10%|CR][20%|CR][30%|CR][done|NL]", "progress bar redraws");

    reset();
    feed_all(&lb, "win\r\nline2\r");
    feed_all(&lb, "\nx\n");
    is_str(got, "[win|CR][|CRLF][line2|CR][|CRLF][x|NL]", "CRLF, also split across reads");

    reset();
    feed_all(&lb, "\n\n");
    is_str(got, "[|NL][|NL]", "empty lines");
    mg_linebuf_release(&lb);

    /* Bounded: a long line comes out in pieces of the capacity. */
    mg_linebuf_init(&lb, 4);
    reset();
    feed_all(&lb, "abcdefghij\n");
    is_str(got, "[abcd|CUT][efgh|CUT][ij|NL]", "long line cut from the input");
    reset();
    feed_all(&lb, "ab");
    feed_all(&lb, "cdefg");
    feed_all(&lb, "hi\n");
    is_str(got, "[abcd|CUT][efgh|CUT][i|NL]", "long line cut while held");
    reset();
    feed_all(&lb, "xyz");
    feed_all(&lb, "12\n");
    is_str(got, "[xyz1|CUT][2|NL]", "held part plus end over capacity");
    ok(lb.len == 0, "nothing held after the end");
    mg_linebuf_release(&lb);

    /* Megabytes without a newline never grow past the capacity. */
    mg_linebuf_init(&lb, 1024);
    static char big[100000];
    memset(big, 'x', sizeof(big));
    size_t pieces = 0;
    reset();
    for (int i = 0; i < 50; i++) {
        mg_linebuf_feed(&lb, big, sizeof(big), collect, NULL);
        pieces += gotlen > 0;
        ok(lb.len < 1024, "held bytes stay under the cap (round %d)", i);
        reset();
    }
    ok(pieces == 50, "pieces keep coming out");
    mg_linebuf_release(&lb);
}

static void test_prefix(void)
{
    char out[256];
    const char *bad = NULL;
    struct mg_prefix_vars v = {"trainer", 3, 11, "node7"};

    is_int(mg_prefix_expand(MG_PREFIX_DEFAULT, &v, out, sizeof(out), NULL), 11, "default");
    is_str(out, "[trainer3]:", "default prefix like torchrun's");
    mg_prefix_expand("${hostname}:${rank}/${local_rank} ", &v, out, sizeof(out), NULL);
    is_str(out, "node7:11/3 ", "all placeholders");
    mg_prefix_expand("$role_name-$rank $$ cost", &v, out, sizeof(out), NULL);
    is_str(out, "trainer-11 $ cost", "bare names and $$");
    is_int(mg_prefix_expand("[${nope}]", &v, out, sizeof(out), &bad), -EINVAL,
           "unknown placeholder");
    is_str(bad, "${nope}]", "points at it");
    is_int(mg_prefix_expand("$", &v, out, sizeof(out), NULL), -EINVAL, "lone $");
    is_int(mg_prefix_expand("${rank", &v, out, sizeof(out), NULL), -EINVAL, "unclosed brace");
    is_int(mg_prefix_expand("${rank}${rank}", &v, out, 4, NULL), -MG_ETOOBIG, "too small");
}

static void test_subst(void)
{
    char out[128];
    is_int(mg_subst_local_rank("--local_rank=${local_rank}", 5, out, sizeof(out)), 14,
           "macro length");
    is_str(out, "--local_rank=5", "${local_rank}");
    mg_subst_local_rank("$local_rank:$rank:${other}:$$", 2, out, sizeof(out));
    is_str(out, "2:$rank:${other}:$", "safe_substitute rules");
    mg_subst_local_rank("plain", 1, out, sizeof(out));
    is_str(out, "plain", "untouched");
    is_int(mg_subst_local_rank("${local_rank}", 12345, out, 3), -MG_ETOOBIG, "bounded");
}

static void test_tail(void)
{
    char out[256];
    const char *t = "cut-part\nline1\nline2\nline3\n";
    mg_tail_lines(t, strlen(t), 1, 2, out, sizeof(out));
    is_str(out, "line2\nline3", "last two lines, cut head dropped");
    mg_tail_lines(t, strlen(t), 0, 10, out, sizeof(out));
    is_str(out, "cut-part\nline1\nline2\nline3", "all lines when not cut");
    const char *p = "a\nstep 1\rstep 2\rstep 3\n";
    mg_tail_lines(p, strlen(p), 0, 10, out, sizeof(out));
    is_str(out, "a\nstep 3", "a progress bar shows its last state");
    mg_tail_lines("no newline", 10, 0, 3, out, sizeof(out));
    is_str(out, "no newline", "unterminated last line");
    mg_tail_lines("abcdefgh\n", 9, 0, 3, out, 5);
    is_str(out, "abcd", "bounded by the output size");
}

static void test_fmt(void)
{
    char b[8];
    is_int(mg_fmt(b, sizeof(b), "%s", "1234567"), 7, "fits");
    is_int(mg_fmt(b, sizeof(b), "%s", "12345678"), -ENAMETOOLONG, "truncation reported");
    is_str(b, "1234567", "truncated and terminated");
}

int main(void)
{
    test_splitter();
    test_prefix();
    test_subst();
    test_tail();
    test_fmt();
    return done_testing();
}
