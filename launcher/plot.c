/* The metrics plot (plot.h): JSON lines records in, one standalone SVG out.
 * The SVG is written by hand: a few element kinds (rect, line, polyline,
 * circle, text) cover it, and hand-written output keeps mglaunch free of a
 * drawing library. Numbers that reach an attribute are always finite. */
#include "plot.h"
#include "fs.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json.h"
#include "mg_err.h"

enum series {
    S_TRAIN_LOSS,
    S_EVAL_LOSS,
    S_TRAIN_ACC,
    S_EVAL_ACC,
    S_COUNT
};

static const struct {
    const char *type, *key, *name;
    int panel, eval;
} series_info[S_COUNT] = {
    {"train", "loss", "train", 0, 0},
    {"eval", "test_loss", "eval", 0, 1},
    {"train", "accuracy", "train", 1, 0},
    {"eval", "test_accuracy", "eval", 1, 1},
};

static const char *const panel_name[2] = {"loss", "accuracy"};

/* Tableau's ten colours: distinct, and readable on white. */
static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define NCOLORS ((int)(sizeof(palette) / sizeof(palette[0])))

struct point {
    long long step;
    double v; /* NaN for a value that is not finite */
    uint32_t seq;
    int32_t att; /* index into mg_plot.att */
    uint8_t series;
    uint8_t marked; /* the record said "replay": true */
};

struct attempt {
    int number;
    char label[64]; /* "" for "attempt N" */
    int have_points, have_start;
    long long lo, hi; /* steps of its points */
    long long start;  /* its "start" record's step */
};

struct mg_plot {
    struct point *pts;
    long npts, cap;
    struct attempt *att;
    int natt, attcap, last;
    long records, skipped;
    uint32_t seq;
};

int mg_plot_new(struct mg_plot **out)
{
    *out = calloc(1, sizeof(**out));
    return *out ? 0 : -ENOMEM;
}

void mg_plot_free(struct mg_plot *p)
{
    if (!p)
        return;
    free(p->pts);
    free(p->att);
    free(p);
}

long mg_plot_skipped(const struct mg_plot *p)
{
    return p->skipped;
}

long mg_plot_records(const struct mg_plot *p)
{
    return p->records;
}

/* ---- reading ------------------------------------------------------------------------------ */

static int attempt_index(struct mg_plot *p, int number)
{
    if (p->last < p->natt && p->att[p->last].number == number)
        return p->last;
    for (int i = 0; i < p->natt; i++)
        if (p->att[i].number == number)
            return p->last = i;
    if (p->natt == MG_PLOT_MAX_ATTEMPTS)
        return -MG_ETOOBIG;
    if (p->natt == p->attcap) {
        int cap = p->attcap ? 2 * p->attcap : 8;
        struct attempt *a = realloc(p->att, (size_t)cap * sizeof(*a));
        if (!a)
            return -ENOMEM;
        p->att = a;
        p->attcap = cap;
    }
    memset(&p->att[p->natt], 0, sizeof(p->att[0]));
    p->att[p->natt].number = number;
    return p->last = p->natt++;
}

int mg_plot_label(struct mg_plot *p, int number, const char *label)
{
    int att = attempt_index(p, number);
    if (att < 0)
        return att;
    snprintf(p->att[att].label, sizeof(p->att[att].label), "%s", label ? label : "");
    return 0;
}

static int add_point(struct mg_plot *p, int att, int series, long long step, double v, int marked)
{
    if (p->npts == MG_PLOT_MAX_POINTS)
        return -MG_ETOOBIG;
    if (p->npts == p->cap) {
        long cap = p->cap ? 2 * p->cap : 256;
        struct point *n = realloc(p->pts, (size_t)cap * sizeof(*n));
        if (!n)
            return -ENOMEM;
        p->pts = n;
        p->cap = cap;
    }
    struct point *pt = &p->pts[p->npts++];
    pt->step = step;
    pt->v = isfinite(v) ? v : NAN;
    pt->seq = p->seq++;
    pt->att = att;
    pt->series = (uint8_t)series;
    pt->marked = (uint8_t)marked;
    struct attempt *a = &p->att[att];
    if (!a->have_points || step < a->lo)
        a->lo = step;
    if (!a->have_points || step > a->hi)
        a->hi = step;
    a->have_points = 1;
    return 0;
}

/* One line: 0 (used or ignored), 1 (skipped), or a negative code. */
static int add_line(struct mg_plot *p, const char *line, size_t len, int hint)
{
    struct mg_json_tok toks[256];
    struct mg_json doc;
    char type[16];
    long long step, restart;
    int t;

    if (len > MG_PLOT_LINE_MAX)
        return 1;
    if (mg_json_parse(&doc, line, len, toks, 256) < 1 || toks[0].type != MG_JSON_OBJECT)
        return 1;
    t = mg_json_get(&doc, 0, "type");
    if (t < 0 || mg_json_str(&doc, t, type, sizeof(type)) < 0)
        return 0;
    int is_start = strcmp(type, "start") == 0;
    if (!is_start && strcmp(type, "train") != 0 && strcmp(type, "eval") != 0)
        return 0;
    t = mg_json_get(&doc, 0, "step");
    if (t < 0 || mg_json_int(&doc, t, &step) < 0 || step < 0)
        return 1;
    int number = hint >= 0 ? hint : 0;
    t = hint < 0 ? mg_json_get(&doc, 0, "restart") : -1;
    if (t >= 0 && mg_json_int(&doc, t, &restart) == 0 && restart >= 0 && restart <= 1000000000)
        number = (int)restart;
    int att = attempt_index(p, number);
    if (att < 0)
        return att;
    if (is_start) {
        p->att[att].start = step;
        p->att[att].have_start = 1;
        return 0;
    }
    int marked = 0;
    t = mg_json_get(&doc, 0, "replay");
    if (t >= 0)
        mg_json_bool(&doc, t, &marked);
    int used = 0;
    for (int s = 0; s < S_COUNT; s++) {
        double v;
        if (strcmp(series_info[s].type, type) != 0)
            continue;
        t = mg_json_get(&doc, 0, series_info[s].key);
        if (t < 0)
            continue;
        if (toks[t].type == MG_JSON_NULL)
            v = NAN;
        else if (toks[t].type != MG_JSON_NUMBER)
            continue;
        else if (mg_json_double(&doc, t, &v) < 0)
            v = INFINITY; /* out of double's range */
        int rc = add_point(p, att, s, step, v, marked);
        if (rc < 0)
            return rc;
        used = 1;
    }
    p->records += used;
    return 0;
}

int mg_plot_add_jsonl(struct mg_plot *p, const char *text, size_t len, int attempt)
{
    size_t i = 0;
    while (i < len) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - text) : len;
        size_t n = end - i;
        if (n && text[i + n - 1] == '\r')
            n--;
        if (n) {
            int rc = add_line(p, text + i, n, attempt);
            if (rc < 0)
                return rc;
            p->skipped += rc;
        }
        i = end + 1;
    }
    return 0;
}

#define READ_CHUNK (1 << 20)

int mg_plot_add_file(struct mg_plot *p, const char *path, int attempt, long long *offset,
                     size_t max, int final)
{
    int fd = mg_open_regular(path);
    if (fd < 0)
        return fd;
    char *buf = malloc(READ_CHUNK);
    int rc = buf ? 0 : -ENOMEM;
    size_t have = 0, total = 0;
    long long off = *offset;
    while (rc == 0 && (!max || total < max)) {
        size_t want = READ_CHUNK - have;
        if (max && want > max - total)
            want = max - total;
        ssize_t n = pread(fd, buf + have, want, (off_t)(off + (long long)have));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = -errno;
            break;
        }
        have += (size_t)n;
        total += (size_t)n;
        int eof = n == 0 || (max && total >= max);
        char *nl = memrchr(buf, '\n', have);
        size_t use = nl ? (size_t)(nl - buf) + 1 : 0;
        if (!nl && have == READ_CHUNK)
            use = have; /* a line longer than a chunk: not a record, skipped whole */
        if (eof && final)
            use = have;
        if (use) {
            rc = mg_plot_add_jsonl(p, buf, use, attempt);
            off += (long long)use;
            memmove(buf, buf + use, have - use);
            have -= use;
        }
        if (eof)
            break;
    }
    free(buf);
    close(fd);
    *offset = off;
    return rc;
}

/* ---- output buffer ------------------------------------------------------------------------ */

struct out {
    char *p;
    size_t len, cap;
    int err;
};

__attribute__((format(printf, 2, 3))) static void put(struct out *o, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        if (o->err)
            return;
        size_t room = o->cap - o->len;
        va_start(ap, fmt);
        int n = vsnprintf(o->p ? o->p + o->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            o->err = -EINVAL;
            return;
        }
        if ((size_t)n < room) {
            o->len += (size_t)n;
            return;
        }
        size_t cap = o->cap ? 2 * o->cap : 65536;
        while (cap - o->len <= (size_t)n)
            cap *= 2;
        char *b = realloc(o->p, cap);
        if (!b) {
            o->err = -ENOMEM;
            return;
        }
        o->p = b;
        o->cap = cap;
    }
}

/* Text for an element's content or an attribute: markup characters escaped,
 * and bytes that are not printable ASCII shown as '?' (XML 1.0 forbids most
 * control characters, and a title may come from anywhere). */
static void put_text(struct out *o, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        switch (c) {
        case '&':
            put(o, "&amp;");
            break;
        case '<':
            put(o, "&lt;");
            break;
        case '>':
            put(o, "&gt;");
            break;
        case '"':
            put(o, "&quot;");
            break;
        case '\'':
            put(o, "&apos;");
            break;
        default:
            put(o, "%c", c >= 0x20 && c < 0x7f ? c : '?');
        }
    }
}

/* ---- axes ---------------------------------------------------------------------------------- */

struct axis {
    double lo, hi; /* the drawn range: the first and last tick */
    double step;   /* between ticks */
    int nticks;
};

/* Ticks at 1, 2 or 5 times a power of ten that enclose [lo, hi] in about
 * target intervals. lo and hi must be finite. */
static void nice_axis(struct axis *a, double lo, double hi, int target, double min_step)
{
    if (!(hi > lo)) {
        double d = fabs(lo) > 1e-300 ? fabs(lo) * 0.1 : 1.0;
        lo -= d;
        hi += d;
    }
    double raw = (hi - lo) / target;
    double mag = pow(10.0, floor(log10(raw)));
    double f = raw / mag;
    double step = (f <= 1.0 ? 1.0 : f <= 2.0 ? 2.0 : f <= 5.0 ? 5.0 : 10.0) * mag;
    if (step < min_step)
        step = min_step;
    a->step = step;
    a->lo = floor(lo / step) * step;
    a->hi = ceil(hi / step) * step;
    if (!(a->hi > a->lo))
        a->hi = a->lo + step;
    a->nticks = (int)floor((a->hi - a->lo) / step + 0.5) + 1;
    if (a->nticks > 50) /* rounding at the edge of double's range */
        a->nticks = 50;
}

/* A tick label: plain decimals for everyday magnitudes, "1.5e12" otherwise. */
static void tick_label(char *buf, size_t cap, double v, double step)
{
    if (fabs(v) < step * 1e-9)
        v = 0.0;
    if (v == 0.0) {
        snprintf(buf, cap, "0");
        return;
    }
    double m = fabs(v);
    if (m >= 1e6 || m < 1e-4 || step < 1e-4) {
        int digits = (int)floor(log10(m)) - (int)floor(log10(step));
        if (digits < 0)
            digits = 0;
        if (digits > 6)
            digits = 6;
        char e[48], *x;
        snprintf(e, sizeof(e), "%.*e", digits, v);
        x = strchr(e, 'e');
        if (x) { /* "1.50e+12" -> "1.50e12", "2e-05" -> "2e-5" */
            int ex = atoi(x + 1);
            snprintf(x, sizeof(e) - (size_t)(x - e), "e%d", ex);
        }
        snprintf(buf, cap, "%s", e);
        return;
    }
    int dec = (int)-floor(log10(step) + 1e-9);
    if (dec < 0)
        dec = 0;
    snprintf(buf, cap, "%.*f", dec, v);
}

/* ---- rendering ----------------------------------------------------------------------------- */

#define W        960
#define H        660
#define PLOT_L   80.0
#define PLOT_R   740.0
#define PANEL_H  230.0
#define LEGEND_X 765.0
#define CLAMP    1e300 /* values beyond are drawn at the edge: their difference stays finite */

static const double panel_top[2] = {60.0, 360.0};

struct ctx {
    const struct mg_plot *p;
    struct out *o;
    struct axis x, y[2];
    int *order;       /* attempt indexes by number */
    int *rank;        /* per attempt index: its position in order */
    long long *prior; /* per attempt index: the highest step of the attempts
                         before it (-1: none); steps up to it are replays */
};

static double clampv(double v)
{
    return v > CLAMP ? CLAMP : v < -CLAMP ? -CLAMP : v;
}

static double px(const struct ctx *c, long long step)
{
    return PLOT_L + ((double)step - c->x.lo) / (c->x.hi - c->x.lo) * (PLOT_R - PLOT_L);
}

static double py(const struct ctx *c, int panel, double v)
{
    const struct axis *a = &c->y[panel];
    double f = (clampv(v) - a->lo) / (a->hi - a->lo);
    return panel_top[panel] + PANEL_H - f * PANEL_H;
}

static const char *color(const struct ctx *c, int att)
{
    return palette[c->rank[att] % NCOLORS];
}

static void draw_axes(struct ctx *c, int panel)
{
    struct out *o = c->o;
    double top = panel_top[panel], bottom = top + PANEL_H;
    char lab[64];
    put(o, "<g class=\"axes\" data-metric=\"%s\">\n", panel_name[panel]);
    put(o,
        "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fff\" "
        "stroke=\"#444\"/>\n",
        PLOT_L, top, PLOT_R - PLOT_L, PANEL_H);
    for (int i = 0; i < c->y[panel].nticks; i++) {
        double v = c->y[panel].lo + i * c->y[panel].step;
        double y = py(c, panel, v);
        tick_label(lab, sizeof(lab), v, c->y[panel].step);
        put(o,
            "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\"/>"
            "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
            PLOT_L, y, PLOT_R, y, PLOT_L - 5, y, PLOT_L, y, PLOT_L - 8, y + 4, lab);
    }
    for (int i = 0; i < c->x.nticks; i++) {
        double v = c->x.lo + i * c->x.step;
        double x = PLOT_L + (v - c->x.lo) / (c->x.hi - c->x.lo) * (PLOT_R - PLOT_L);
        tick_label(lab, sizeof(lab), v, c->x.step);
        put(o,
            "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\"/>"
            "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
            x, top, x, bottom, x, bottom, x, bottom + 5, x, bottom + 18, lab);
    }
    put(o,
        "<text class=\"label\" transform=\"translate(%.1f %.1f) rotate(-90)\" "
        "text-anchor=\"middle\">%s</text>\n",
        PLOT_L - 58, top + PANEL_H / 2, panel_name[panel]);
    if (panel == 1)
        put(o, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n",
            (PLOT_L + PLOT_R) / 2, bottom + 38);
    put(o, "</g>\n");
}

/* Where attempt att (not the first) resumed: its start record, else its first step. */
static long long resumed_at(const struct attempt *a)
{
    return a->have_start ? a->start : a->lo;
}

/* The shaded band of steps each restart trained again, and its restart line.
 * With labels, only the labels (drawn outside the panel's clip). */
static void draw_restarts(struct ctx *c, int panel, int labels)
{
    struct out *o = c->o;
    double top = panel_top[panel];
    for (int k = 1; k < c->p->natt; k++) {
        int ai = c->order[k];
        const struct attempt *a = &c->p->att[ai];
        long long from = resumed_at(a), prior = c->prior[ai];
        if (!a->have_points && !a->have_start)
            continue;
        double x = px(c, from);
        if (labels) {
            char name[96];
            if (a->label[0])
                snprintf(name, sizeof(name), "%s", a->label);
            else
                snprintf(name, sizeof(name), "restart %d", a->number);
            put(o, "<text class=\"restart-label\" x=\"%.1f\" y=\"%.1f\" fill=\"%s\">", x + 3,
                top - 6 - 11.0 * ((k - 1) % 3), color(c, ai));
            put_text(o, name);
            put(o, " (from step %lld)</text>\n", from);
            continue;
        }
        if (prior >= 0 && a->have_points && from <= prior && a->lo <= prior) {
            long long to = a->hi < prior ? a->hi : prior;
            double x0 = px(c, from), x1 = px(c, to);
            put(o,
                "<rect class=\"replay-band\" data-attempt=\"%d\" x=\"%.1f\" y=\"%.1f\" "
                "width=\"%.1f\" height=\"%.1f\" fill=\"%s\" fill-opacity=\"0.12\">"
                "<title>attempt %d trained steps %lld to %lld again</title></rect>\n",
                a->number, x0, top, x1 - x0, PANEL_H, color(c, ai), a->number, from, to);
        }
        put(o,
            "<line class=\"restart\" data-attempt=\"%d\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
            "y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\" stroke-dasharray=\"6,3\"/>\n",
            a->number, x, top, x, top + PANEL_H, color(c, ai));
    }
}

/* One curve: the points of a series from one attempt, in record order
 * (pts[0..n)). A NaN or infinite value breaks the line and is a cross at the
 * top of the panel. */
static void draw_curve(struct ctx *c, int s, int ai, const struct point *const *pts, long n)
{
    struct out *o = c->o;
    const struct attempt *a = &c->p->att[ai];
    int panel = series_info[s].panel, eval = series_info[s].eval;
    const char *col = color(c, ai);
    put(o,
        "<g class=\"curve\" data-metric=\"%s\" data-series=\"%s\" data-attempt=\"%d\" "
        "data-records=\"%ld\" stroke=\"%s\" fill=\"none\" stroke-width=\"%s\"%s>\n",
        panel_name[panel], series_info[s].name, a->number, n, col, eval ? "1.5" : "1.8",
        eval ? " stroke-dasharray=\"5,3\"" : "");
    long i = 0;
    while (i < n) {
        if (isnan(pts[i]->v)) {
            put(o,
                "<text class=\"nonfinite\" x=\"%.1f\" y=\"%.1f\" fill=\"%s\" stroke=\"none\" "
                "text-anchor=\"middle\">&#215;<title>step %lld: not a finite number</title>"
                "</text>\n",
                px(c, pts[i]->step), panel_top[panel] + 12, col, pts[i]->step);
            i++;
            continue;
        }
        long j = i;
        while (j < n && !isnan(pts[j]->v))
            j++;
        put(o, "<polyline points=\"");
        for (long k = i; k < j; k++)
            put(o, "%s%.1f,%.1f", k > i ? " " : "", px(c, pts[k]->step), py(c, panel, pts[k]->v));
        put(o, "\"/>\n");
        for (long k = i; k < j; k++) {
            /* Eval points, and lone points a line cannot show, get a dot. */
            if (eval || j - i == 1)
                put(o, "<circle class=\"dot\" cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n",
                    px(c, pts[k]->step), py(c, panel, pts[k]->v), col);
        }
        i = j;
    }
    /* Rings on replayed steps. */
    for (long k = 0; k < n; k++) {
        const struct point *pt = pts[k];
        if (isnan(pt->v) || !(pt->marked || pt->step <= c->prior[ai]))
            continue;
        put(o,
            "<circle class=\"replay-point\" cx=\"%.1f\" cy=\"%.1f\" r=\"4.5\" stroke-width=\"1\" "
            "stroke-dasharray=\"none\"/>\n",
            px(c, pt->step), py(c, panel, pt->v));
    }
    put(o, "</g>\n");
}

static void draw_legend(struct ctx *c)
{
    struct out *o = c->o;
    double y = panel_top[0];
    int shown = 0;
    put(o, "<g class=\"legend\">\n");
    put(o, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\">attempts</text>\n", LEGEND_X, y);
    for (int k = 0; k < c->p->natt; k++) {
        const struct attempt *a = &c->p->att[c->order[k]];
        if (shown == 12) {
            y += 18;
            put(o, "<text x=\"%.1f\" y=\"%.1f\">and %d more</text>\n", LEGEND_X + 28, y,
                c->p->natt - k);
            break;
        }
        y += 18;
        shown++;
        char name[96];
        if (a->label[0])
            snprintf(name, sizeof(name), "%s", a->label);
        else
            snprintf(name, sizeof(name), "attempt %d%s", a->number, k == 0 ? "" : " (restart)");
        put(o,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
            "stroke-width=\"3\"/><text x=\"%.1f\" y=\"%.1f\">",
            LEGEND_X, y - 4, LEGEND_X + 22, y - 4, color(c, c->order[k]), LEGEND_X + 28, y);
        put_text(o, name);
        put(o, "</text>\n");
    }
    y += 30;
    put(o, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\">marks</text>\n", LEGEND_X, y);
    y += 18;
    put(o,
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\" "
        "stroke-width=\"1.8\"/><text x=\"%.1f\" y=\"%.1f\">train</text>\n",
        LEGEND_X, y - 4, LEGEND_X + 22, y - 4, LEGEND_X + 28, y);
    y += 18;
    put(o,
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\" "
        "stroke-width=\"1.5\" stroke-dasharray=\"5,3\"/><circle cx=\"%.1f\" cy=\"%.1f\" "
        "r=\"2.5\" fill=\"#444\"/><text x=\"%.1f\" y=\"%.1f\">eval (test set)</text>\n",
        LEGEND_X, y - 4, LEGEND_X + 22, y - 4, LEGEND_X + 11, y - 4, LEGEND_X + 28, y);
    y += 18;
    put(o,
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\" "
        "stroke-width=\"1.5\" stroke-dasharray=\"6,3\"/><text x=\"%.1f\" y=\"%.1f\">restart: "
        "resumed here</text>\n",
        LEGEND_X + 11, y - 12, LEGEND_X + 11, y + 2, LEGEND_X + 28, y);
    y += 18;
    put(o,
        "<rect x=\"%.1f\" y=\"%.1f\" width=\"22\" height=\"12\" fill=\"#444\" "
        "fill-opacity=\"0.15\"/><text x=\"%.1f\" y=\"%.1f\">steps trained again</text>\n",
        LEGEND_X, y - 10, LEGEND_X + 28, y);
    y += 18;
    put(o,
        "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4.5\" fill=\"none\" stroke=\"#444\"/><text "
        "x=\"%.1f\" y=\"%.1f\">replayed step</text>\n",
        LEGEND_X + 11, y - 4, LEGEND_X + 28, y);
    y += 18;
    put(o,
        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#444\">&#215;</text><text "
        "x=\"%.1f\" y=\"%.1f\">NaN or infinite</text>\n",
        LEGEND_X + 11, y, LEGEND_X + 28, y);
    put(o, "</g>\n");
}

static int cmp_attempt(const void *a, const void *b, void *arg)
{
    const struct attempt *att = arg;
    int x = att[*(const int *)a].number, y = att[*(const int *)b].number;
    return (x > y) - (x < y);
}

/* Points by series, then attempt (by number), then record order. */
static int cmp_point(const void *a, const void *b, void *arg)
{
    const int *rank = arg;
    const struct point *p = *(const struct point *const *)a, *q = *(const struct point *const *)b;
    if (p->series != q->series)
        return p->series < q->series ? -1 : 1;
    if (rank[p->att] != rank[q->att])
        return rank[p->att] < rank[q->att] ? -1 : 1;
    return (p->seq > q->seq) - (p->seq < q->seq);
}

int mg_plot_svg(const struct mg_plot *p, const struct mg_plot_opts *opts, char **svg, size_t *len)
{
    struct out o = {0};
    struct ctx c = {.p = p, .o = &o};
    const struct point **sorted = NULL;
    const char *title = opts && opts->title ? opts->title : "metrics";
    int rc = -ENOMEM;

    *svg = NULL;
    *len = 0;
    c.order = malloc(((size_t)p->natt + 1) * sizeof(int));
    c.rank = malloc(((size_t)p->natt + 1) * sizeof(int));
    c.prior = malloc(((size_t)p->natt + 1) * sizeof(long long));
    sorted = malloc(((size_t)p->npts + 1) * sizeof(*sorted));
    if (!c.order || !c.rank || !c.prior || !sorted)
        goto out;
    for (int i = 0; i < p->natt; i++)
        c.order[i] = i;
    qsort_r(c.order, (size_t)p->natt, sizeof(int), cmp_attempt, p->att);
    long long prior = -1;
    for (int k = 0; k < p->natt; k++) {
        const struct attempt *a = &p->att[c.order[k]];
        c.rank[c.order[k]] = k;
        c.prior[c.order[k]] = prior;
        if (a->have_points && a->hi > prior)
            prior = a->hi;
    }
    for (long i = 0; i < p->npts; i++)
        sorted[i] = &p->pts[i];
    qsort_r(sorted, (size_t)p->npts, sizeof(*sorted), cmp_point, c.rank);

    /* Ranges: every step drawn (points and restart lines); finite values. */
    int have_x = 0, have_y[2] = {0, 0};
    double xlo = 0, xhi = 0, ylo[2] = {0, 0}, yhi[2] = {0, 0};
    for (long i = 0; i < p->npts; i++) {
        const struct point *pt = &p->pts[i];
        double s = (double)pt->step;
        int panel = series_info[pt->series].panel;
        if (!have_x || s < xlo)
            xlo = s;
        if (!have_x || s > xhi)
            xhi = s;
        have_x = 1;
        if (isnan(pt->v))
            continue;
        double v = clampv(pt->v);
        if (!have_y[panel] || v < ylo[panel])
            ylo[panel] = v;
        if (!have_y[panel] || v > yhi[panel])
            yhi[panel] = v;
        have_y[panel] = 1;
    }
    for (int i = 0; i < p->natt; i++) {
        double s = (double)p->att[i].start;
        if (!p->att[i].have_start)
            continue;
        if (!have_x || s < xlo)
            xlo = s;
        if (!have_x || s > xhi)
            xhi = s;
        have_x = 1;
    }
    nice_axis(&c.x, have_x ? xlo : 0, have_x ? xhi : 100, 8, 1.0);
    for (int k = 0; k < 2; k++) {
        if (k == 1 && (!have_y[1] || (ylo[1] >= 0 && yhi[1] <= 1)))
            nice_axis(&c.y[1], 0, 1, 5, 0); /* accuracy as a fraction: all of [0, 1] */
        else
            nice_axis(&c.y[k], have_y[k] ? ylo[k] : 0, have_y[k] ? yhi[k] : 1, 5, 0);
    }

    put(&o,
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
        "viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Arial, Helvetica, sans-serif\" "
        "font-size=\"12\">\n<title>",
        W, H, W, H);
    put_text(&o, title);
    put(&o,
        " - loss and accuracy by step</title>\n"
        "<style>.grid{stroke:#e4e4e4;stroke-width:1}.tick{fill:#333;font-size:11px}"
        ".label{fill:#111;font-weight:bold}.replay-point{fill:none}</style>\n"
        "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n"
        "<text class=\"label\" x=\"%.1f\" y=\"24\" font-size=\"15\">",
        PLOT_L);
    put_text(&o, title);
    put(&o,
        "</text>\n<text class=\"summary\" x=\"%.1f\" y=\"40\" fill=\"#555\">%ld record%s, "
        "%d attempt%s</text>\n",
        PLOT_L, p->records, p->records == 1 ? "" : "s", p->natt, p->natt == 1 ? "" : "s");
    for (int panel = 0; panel < 2; panel++) {
        put(&o,
            "<defs><clipPath id=\"clip%d\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
            "height=\"%.1f\"/></clipPath></defs>\n",
            panel, PLOT_L - 6, panel_top[panel] - 4, PLOT_R - PLOT_L + 12, PANEL_H + 8);
        draw_axes(&c, panel);
        put(&o, "<g class=\"panel\" data-metric=\"%s\" clip-path=\"url(#clip%d)\">\n",
            panel_name[panel], panel);
        draw_restarts(&c, panel, 0);
        long i = 0;
        while (i < p->npts) {
            long j = i;
            while (j < p->npts && sorted[j]->series == sorted[i]->series &&
                   sorted[j]->att == sorted[i]->att)
                j++;
            if (series_info[sorted[i]->series].panel == panel)
                draw_curve(&c, sorted[i]->series, sorted[i]->att, sorted + i, j - i);
            i = j;
        }
        put(&o, "</g>\n");
        if (panel == 0)
            draw_restarts(&c, panel, 1);
    }
    if (p->npts == 0)
        put(&o,
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#555\" "
            "font-size=\"15\">no metrics records</text>\n",
            (PLOT_L + PLOT_R) / 2, panel_top[0] + PANEL_H / 2);
    draw_legend(&c);
    put(&o, "</svg>\n");
    rc = o.err;
    if (rc == 0) {
        *svg = o.p;
        *len = o.len;
        o.p = NULL;
    }
out:
    free(o.p);
    free(sorted);
    free(c.order);
    free(c.rank);
    free(c.prior);
    return rc;
}
