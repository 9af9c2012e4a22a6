/* The plot of a run's metrics: loss and accuracy against step, every attempt
 * of the run on one chart, as a standalone SVG that any browser shows (no
 * script, no font or file from elsewhere). Launcher side: it reads the JSON
 * lines records that libmg's metrics module writes (docs/metrics.md) with
 * common/json.h, so mglaunch needs no libmg to draw them.
 *
 * What it shows: two panels (loss; accuracy) sharing the step axis. Each
 * attempt has its colour; train records are solid lines, eval records dashed
 * lines with dots. A restart is a vertical line at the step it resumed from,
 * labelled "restart N"; the steps it trained again are shaded, and the points
 * of replayed steps are ringed. A NaN or infinite value is a cross at the top
 * of its panel. Axes have ticks, labels and a grid; a legend explains it all. */
#ifndef MG_PLOT_H
#define MG_PLOT_H

#include <stddef.h>

#define MG_PLOT_MAX_POINTS   (1L << 20) /* values kept over all records (-MG_ETOOBIG beyond) */
#define MG_PLOT_MAX_ATTEMPTS 4096
#define MG_PLOT_LINE_MAX     (64 * 1024) /* a longer line is skipped */

struct mg_plot;

struct mg_plot_opts {
    const char *title; /* e.g. "run 20240611-101500-ab12cd"; NULL: "metrics" */
};

int mg_plot_new(struct mg_plot **out);
void mg_plot_free(struct mg_plot *p);

/* Adds the records in len bytes of JSON lines text: "train" (loss, accuracy),
 * "eval" (test_loss, test_accuracy) and "start" records; others are ignored.
 * attempt >= 0: every record belongs to that attempt (a file of one attempt,
 * e.g. <log_dir>/<run>/attempt_<n>/: attempt numbers never repeat, restart
 * counts do across launcher invocations); attempt < 0: each record belongs to
 * the attempt its "restart" field names (0 without one). A last line without
 * its '\n' is read too (a file being written may end in one: it is skipped if
 * it does not parse). Returns 0, or -MG_ETOOBIG when a bound above is passed
 * (what fitted is kept). */
int mg_plot_add_jsonl(struct mg_plot *p, const char *text, size_t len, int attempt);

/* Adds the records of the JSON lines file path from byte *offset on (0: the
 * whole file) to the end, or at most max bytes of it (0: no limit), and moves
 * *offset past what it read: whole lines only, so a file being written can
 * be read again from *offset later; with final, a last line without its '\n'
 * is read too. Reads in pieces of MG_PLOT_LINE_MAX bytes or more: memory does
 * not grow with the file. Returns 0, -ENOENT when there is no such file, -errno,
 * or -MG_ETOOBIG (as mg_plot_add_jsonl). */
int mg_plot_add_file(struct mg_plot *p, const char *path, int attempt, long long *offset,
                     size_t max, int final);

/* Names attempt number in the legend and at its restart line ("run 1
 * attempt 0" for the attempts of a job's earlier runs, drawn first by giving
 * them lower numbers); without a label an attempt is "attempt N". The label
 * is cut at 63 bytes. 0, -ENOMEM or -MG_ETOOBIG (too many attempts). */
int mg_plot_label(struct mg_plot *p, int number, const char *label);

/* Lines that were not a record: not JSON, or without a step. */
long mg_plot_skipped(const struct mg_plot *p);
/* Records that gave the plot at least one value. */
long mg_plot_records(const struct mg_plot *p);

/* Renders the SVG into a new NUL-terminated buffer (*svg, free() it) of *len
 * bytes. 0, or -ENOMEM. */
int mg_plot_svg(const struct mg_plot *p, const struct mg_plot_opts *o, char **svg, size_t *len);

#endif
