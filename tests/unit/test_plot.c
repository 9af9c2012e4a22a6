/* plot.c: the SVG of a run's metrics, read back by parsers that share no code
 * with the writer: xmllint says it is well-formed XML, and Python's
 * xml.etree counts, for each curve, its points, its non-finite marks and its
 * replay rings, which must match the records given. Also: restarts and
 * their bands, every number in an attribute finite, and the edge cases
 * (no records, one point, huge steps, huge and tiny values, a hostile title,
 * lines that are not records). */
#include "plot.h"
#include "mg_err.h"
#include "tap.h"

#include <errno.h>
#include <unistd.h>

/* timeout: 60 */

static char tmp[256];

/* Counts what the SVG holds, one line per fact. */
static const char *checker =
    "import math, re, sys\n"
    "import xml.etree.ElementTree as ET\n"
    "NS = '{http://www.w3.org/2000/svg}'\n"
    "root = ET.parse(sys.argv[1]).getroot()\n"
    "def cls(e): return e.get('class', '')\n"
    "for g in root.iter(NS + 'g'):\n"
    "    if cls(g) != 'curve':\n"
    "        continue\n"
    "    pts = sum(len(p.get('points').split()) for p in g.iter(NS + 'polyline'))\n"
    "    nf = sum(1 for t in g.iter(NS + 'text') if cls(t) == 'nonfinite')\n"
    "    rings = sum(1 for c in g.iter(NS + 'circle') if cls(c) == 'replay-point')\n"
    "    print('curve', g.get('data-metric'), g.get('data-series'), g.get('data-attempt'),\n"
    "          pts, nf, rings)\n"
    "print('restart', sum(1 for e in root.iter() if cls(e) == 'restart'))\n"
    "print('band', sum(1 for e in root.iter() if cls(e) == 'replay-band'))\n"
    "print('labels', ' '.join(e.text for e in root.iter() if cls(e) == 'restart-label'))\n"
    "bad = 0\n"
    "for e in root.iter():\n"
    "    for k in ('x', 'y', 'x1', 'y1', 'x2', 'y2', 'cx', 'cy', 'r', 'width', 'height'):\n"
    "        v = e.get(k)\n"
    "        if v is not None and not v.endswith('%') and not math.isfinite(float(v)):\n"
    "            bad += 1\n"
    "    for p in (e.get('points') or '').split():\n"
    "        bad += sum(1 for v in p.split(',') if not math.isfinite(float(v)))\n"
    "print('nonfinite-numbers', bad)\n"
    "print('title', root.find(NS + 'title').text)\n"
    "print('nothing', sum(1 for t in root.iter(NS + 'text') if t.text == 'no metrics records'))\n"
    "leg = [g for g in root.iter(NS + 'g') if cls(g) == 'legend']\n"
    "print('legend', ' | '.join(t.text for g in leg for t in g.iter(NS + 'text') if t.text))\n"
    "ticks = [t.text for t in root.iter(NS + 'text') if cls(t) == 'tick']\n"
    "print('ticks', len(ticks), ' '.join(ticks[:40]))\n";

struct text {
    char *p;
    size_t len, cap;
};

__attribute__((format(printf, 2, 3))) static void add(struct text *t, const char *fmt, ...)
{
    va_list ap;
    if (t->cap - t->len < 4096) {
        t->cap = t->cap ? 2 * t->cap : 1 << 16;
        t->p = realloc(t->p, t->cap);
    }
    va_start(ap, fmt);
    t->len += (size_t)vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
}

/* Renders p to a file and runs the checker on it; returns its output. */
static char *render_and_check(struct mg_plot *p, const char *title, const char *name)
{
    char path[400], cmd[1200];
    static char out[1 << 16];
    char *svg;
    size_t len;
    struct mg_plot_opts o = {.title = title};
    out[0] = '\0';
    if (mg_plot_svg(p, &o, &svg, &len) != 0) {
        ok(0, "%s: rendered", name);
        return out;
    }
    is_int(strlen(svg), len, "%s: rendered, %zu bytes, length as said", name, len);
    snprintf(path, sizeof(path), "%s/%s.svg", tmp, name);
    FILE *f = fopen(path, "w");
    fwrite(svg, 1, len, f);
    fclose(f);
    free(svg);
    snprintf(cmd, sizeof(cmd), "xmllint --noout '%s' 2>&1", path);
    ok(system(cmd) == 0, "%s: xmllint parses it", name);
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 '%s/check.py' '%s' 2>&1", tmp, path);
    FILE *pp = popen(cmd, "r");
    size_t n = pp ? fread(out, 1, sizeof(out) - 1, pp) : 0;
    out[n] = '\0';
    int rc = pp ? pclose(pp) : -1;
    ok(rc == 0, "%s: Python's xml.etree reads it", name);
    if (rc != 0)
        diag("%s", out);
    return out;
}

static void has(const char *out, const char *line, const char *what)
{
    ok(strstr(out, line) != NULL, "%s (%.*s)", what, (int)strcspn(line, "\n"), line);
    if (!strstr(out, line))
        diag("%s", out);
}

/* A run of three attempts: attempt 0 reaches step 200 (a NaN loss at 70);
 * attempt 1 resumes from 120 and marks its steps up to 200 as replays (both
 * in one file, told apart by their restart fields); attempt 3's file (its
 * number given by the caller, its records' restart field 0 ignored, as after
 * a second launcher invocation) has no marks: its steps up to 260 are
 * replays all the same. */
static void run_of_three(void)
{
    struct mg_plot *p;
    struct text a = {0}, b = {0};
    mg_plot_new(&p);
    add(&a, "{\"type\":\"start\",\"step\":0,\"restart\":0}\n");
    for (int s = 10; s <= 200; s += 10) {
        if (s == 70)
            add(&a,
                "{\"type\":\"train\",\"step\":70,\"loss\":null,\"accuracy\":0.5,\"restart\":0}\n");
        else
            add(&a, "{\"type\":\"train\",\"step\":%d,\"loss\":%g,\"accuracy\":%g,\"restart\":0}\n",
                s, 2.3 / (1 + s / 50.0), 1 - 1 / (1 + s / 50.0));
        if (s % 50 == 0)
            add(&a,
                "{\"type\":\"eval\",\"step\":%d,\"test_loss\":%g,\"test_accuracy\":%g,"
                "\"restart\":0}\n",
                s, 2.5 / (1 + s / 50.0), 0.9 - 1 / (1 + s / 50.0));
    }
    add(&a, "{\"type\":\"summary\",\"step\":200,\"test_loss\":0.4,\"restart\":0}\n");
    add(&a, "not json at all\n\n{\"type\":\"train\",\"loss\":1}\r\n");
    add(&a, "{\"type\":\"start\",\"step\":120,\"restart\":1,\"prior_step\":200}\n");
    for (int s = 130; s <= 260; s += 10) {
        add(&a, "{\"type\":\"train\",\"step\":%d,\"loss\":%g,\"accuracy\":%g,\"restart\":1%s}\n", s,
            2.2 / (1 + s / 50.0), 1 - 1.1 / (1 + s / 50.0), s <= 200 ? ",\"replay\":true" : "");
        if (s % 50 == 0)
            add(&a,
                "{\"type\":\"eval\",\"step\":%d,\"test_loss\":%g,\"test_accuracy\":%g,"
                "\"restart\":1%s}\n",
                s, 2.4 / (1 + s / 50.0), 0.9 - 1.1 / (1 + s / 50.0),
                s <= 200 ? ",\"replay\":true" : "");
    }
    is_int(mg_plot_add_jsonl(p, a.p, a.len, -1), 0, "attempts 0 and 1 in one file");
    add(&b, "{\"type\":\"start\",\"step\":240,\"restart\":0}\n");
    for (int s = 250; s <= 300; s += 10)
        add(&b, "{\"type\":\"train\",\"step\":%d,\"loss\":%g,\"accuracy\":0.9,\"restart\":0}\n", s,
            0.5 - s / 1e3);
    b.len--; /* the last line without its '\n', as in a file being written */
    is_int(mg_plot_add_jsonl(p, b.p, b.len, 3), 0, "attempt 3's own file");
    is_int(mg_plot_records(p), 20 + 4 + 14 + 3 + 6, "records with values: 47");
    is_int(mg_plot_skipped(p), 2, "skipped: the line that is not JSON, the record without a step");

    const char *out = render_and_check(p, "run job7", "three");
    has(out, "curve loss train 0 19 1 0\n", "attempt 0 train loss: 19 points and the NaN's cross");
    has(out, "curve accuracy train 0 20 0 0\n", "attempt 0 train accuracy: 20 points");
    has(out, "curve loss eval 0 4 0 0\n", "attempt 0 eval loss: 4 points");
    has(out, "curve accuracy eval 0 4 0 0\n", "attempt 0 eval accuracy: 4 points");
    has(out, "curve loss train 1 14 0 8\n", "attempt 1 train loss: 14 points, 8 replays ringed");
    has(out, "curve accuracy train 1 14 0 8\n", "attempt 1 train accuracy: the same");
    has(out, "curve loss eval 1 3 0 2\n", "attempt 1 eval loss: 3 points, 2 replays");
    has(out, "curve loss train 3 6 0 2\n",
        "attempt 3: 6 points; 250 and 260 are replays though unmarked");
    has(out, "restart 4\n", "a restart line for attempts 1 and 3 in each panel");
    has(out, "band 4\n", "a band of steps trained again for each, in each panel");
    has(out, "labels restart 1 (from step 120) restart 3 (from step 240)\n",
        "restarts labelled with the step they resumed from");
    has(out, "nonfinite-numbers 0\n", "every number in an attribute is finite");
    has(out, "title run job7 - loss and accuracy by step\n", "the document's title");
    has(out, "nothing 0\n", "no 'no records' note");
    has(out, "ticks 25 0 0.5 1.0 1.5 2.0 0 50 100 150 200 250 300 0 0.2 0.4 0.6 0.8 1.0 0 50 ",
        "ticks: loss 0..2, accuracy 0..1, steps 0..300 under each panel");
    free(a.p);
    free(b.p);
    mg_plot_free(p);
}

static void edges(void)
{
    struct mg_plot *p;
    const char *out;

    mg_plot_new(&p);
    out = render_and_check(p, NULL, "empty");
    has(out, "nothing 1\n", "no records: says so");
    has(out, "title metrics - loss and accuracy by step\n", "default title");
    has(out, "nonfinite-numbers 0\n", "no records: numbers finite");
    mg_plot_free(p);

    mg_plot_new(&p);
    const char *one = "{\"type\":\"train\",\"step\":5,\"loss\":0.7,\"accuracy\":0.5}\n";
    mg_plot_add_jsonl(p, one, strlen(one), 0);
    out = render_and_check(p, "one", "one");
    has(out, "curve loss train 0 1 0 0\n", "one record: a curve of one point");
    has(out, "nonfinite-numbers 0\n", "one point: numbers finite");
    mg_plot_free(p);

    mg_plot_new(&p);
    char big[512];
    snprintf(
        big, sizeof(big),
        "{\"type\":\"train\",\"step\":4611686018427387904,\"loss\":1e308,\"accuracy\":-1e308}\n"
        "{\"type\":\"train\",\"step\":4611686018427388000,\"loss\":-1e308,\"accuracy\":1e-300}\n"
        "{\"type\":\"train\",\"step\":9223372036854775807,\"loss\":1e999,\"accuracy\":2}\n");
    mg_plot_add_jsonl(p, big, strlen(big), 0);
    out = render_and_check(p, "huge", "huge");
    has(out, "curve loss train 0 2 1 0\n", "huge values: 2 points, 1e999 is not finite");
    has(out, "nonfinite-numbers 0\n", "huge steps and values: numbers finite");
    ok(strstr(out, "e18") != NULL, "step ticks in exponent form (e18)");
    mg_plot_free(p);

    mg_plot_new(&p);
    const char *flat = "{\"type\":\"eval\",\"step\":0,\"test_loss\":3,\"test_accuracy\":0.25}\n"
                       "{\"type\":\"eval\",\"step\":0,\"test_loss\":3,\"test_accuracy\":0.25}\n";
    mg_plot_add_jsonl(p, flat, strlen(flat), 0);
    out = render_and_check(p, "a<b & \"c\" 'd'\x01\xff", "flat");
    has(out, "curve loss eval 0 2 0 0\n", "the same step and value twice: 2 points");
    has(out, "nonfinite-numbers 0\n", "a zero range: numbers finite");
    has(out, "title a<b & \"c\" 'd'?? - loss", "markup in the title escaped, odd bytes as '?'");
    mg_plot_free(p);
}

/* A file read in pieces, as the dashboard reads a file being written: whole
 * lines only until final, at most max bytes a call, the offset moving on. */
static void from_file(void)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/m.jsonl", tmp);
    FILE *f = fopen(path, "w");
    for (int s = 1; s <= 100; s++)
        fprintf(f, "{\"type\":\"train\",\"step\":%d,\"loss\":%g,\"accuracy\":0.5}\n", s, 1.0 / s);
    /* the last record without its '\n': being written, or the writer died there */
    fputs("{\"type\":\"train\",\"step\":101,\"loss\":0.01,\"accuracy\":0.5}", f);
    fclose(f);
    struct mg_plot *p;
    long long off = 0;
    mg_plot_new(&p);
    is_int(mg_plot_add_file(p, path, 0, &off, 1000, 0), 0, "the first 1000 bytes");
    long first = mg_plot_records(p);
    ok(first > 0 && first < 100 && off > 0 && off <= 1000, "whole lines of them: %ld, offset %lld",
       first, off);
    is_int(mg_plot_add_file(p, path, 0, &off, 0, 0), 0, "the rest");
    is_int(mg_plot_records(p), 100, "100 records: the line being written waits");
    long long at = off;
    is_int(mg_plot_add_file(p, path, 0, &off, 0, 0), 0, "nothing new");
    ok(off == at && mg_plot_records(p) == 100, "the offset stays before the unfinished line");
    is_int(mg_plot_add_file(p, path, 0, &off, 0, 1), 0, "final: the last line too");
    is_int(mg_plot_records(p), 101, "101 records");
    long long zero = 0;
    snprintf(path, sizeof(path), "%s/none.jsonl", tmp);
    is_int(mg_plot_add_file(p, path, 0, &zero, 0, 1), -ENOENT, "a missing file: -ENOENT");
    const char *out = render_and_check(p, "file", "file");
    has(out, "curve loss train 0 101 0 0\n", "the SVG has a point per record");
    mg_plot_free(p);
}

/* A job of two runs (train's rerun resumed the first one's checkpoint): the
 * earlier run's attempt under a lower number, both labelled; a label with
 * markup characters is escaped. */
static void labelled(void)
{
    struct mg_plot *p;
    is_int(mg_plot_new(&p), 0, "labels: new plot");
    struct text a = {0}, b = {0};
    for (int s = 10; s <= 50; s += 10)
        add(&a, "{\"type\":\"train\",\"step\":%d,\"loss\":1.0,\"accuracy\":0.5}\n", s);
    add(&b, "{\"type\":\"start\",\"step\":40,\"resumed_run\":\"r1\"}\n");
    for (int s = 50; s <= 80; s += 10)
        add(&b, "{\"type\":\"train\",\"step\":%d,\"loss\":0.8,\"accuracy\":0.6}\n", s);
    /* the rerun's file first: the numbers, not the order of reading, say which comes first */
    is_int(mg_plot_add_jsonl(p, b.p, b.len, 1000000), 0, "labels: the rerun's records");
    is_int(mg_plot_add_jsonl(p, a.p, a.len, 0), 0, "labels: the first run's records");
    is_int(mg_plot_label(p, 0, "run 1 <a> & attempt 0"), 0, "labels: the first run's label");
    is_int(mg_plot_label(p, 1000000, "run 2 attempt 0"), 0, "labels: the rerun's label");
    const char *out = render_and_check(p, "runs r1, r2", "labels");
    has(out, "legend attempts | run 1 <a> & attempt 0 | run 2 attempt 0 | marks",
        "the legend names both runs' attempts, the first run first, escaped");
    has(out, "labels run 2 attempt 0 (from step 40)\n", "the rerun's line at the step it resumed");
    has(out, "curve loss train 1000000 4 0 1\n",
        "the rerun's 4 points; 50, which the first run had reached, ringed as trained again");
    has(out, "band 2\n", "its band of steps trained again, in each panel");
    free(a.p);
    free(b.p);
    mg_plot_free(p);
}

int main(void)
{
    snprintf(tmp, sizeof(tmp), "%s/mgplot.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmp))
        BAIL_OUT("mkdtemp");
    char path[400];
    snprintf(path, sizeof(path), "%s/check.py", tmp);
    FILE *f = fopen(path, "w");
    fputs(checker, f);
    fclose(f);
    if (system("xmllint --version >/dev/null 2>&1") != 0 ||
        system("/usr/bin/python3 -c 'import xml.etree' 2>/dev/null") != 0)
        skip_all("xmllint or /usr/bin/python3 missing (scripts/deps.sh)");
    run_of_three();
    edges();
    from_file();
    labelled();
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        diag("could not remove %s", tmp);
    return done_testing();
}
