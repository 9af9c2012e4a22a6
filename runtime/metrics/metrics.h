/* The metrics API of libmg: the training loop records scalars through one
 * object, and each output format is a sink behind it (JSON lines, TensorBoard
 * event files, Lightning's CSV layout), so adding an output is an addition,
 * not an edit to the loop. docs/metrics.md describes the files.
 *
 * Every write is checked. A sink whose write fails stops writing (a torn
 * record is the last thing in its file) and the first failure is kept, with
 * the file and the reason, so the program can report it once and exit with a
 * status that says its output is incomplete; the other sinks go on. The
 * training itself never stops for a metrics error.
 *
 * Not thread-safe: one thread (the training loop's) records. */
#ifndef MG_METRICS_H
#define MG_METRICS_H

#include <stddef.h>

#include "mg_err.h"

/* Bounds on what a record may hold (-EINVAL beyond them). */
#define MG_METRICS_MAX_FIELDS 64
#define MG_METRICS_KEY_MAX    64  /* bytes of a field name or a kind, without the NUL */
#define MG_METRICS_TEXT_MAX   256 /* bytes of a text value */

enum mg_metric_type {
    MG_METRIC_REAL,
    MG_METRIC_INT,
    MG_METRIC_TEXT,
};

/* One field of a record. Build them with the helpers below. */
struct mg_metric {
    const char *key; /* [A-Za-z0-9_.-], 1..MG_METRICS_KEY_MAX bytes */
    enum mg_metric_type type;
    double real;
    long long i;
    const char *text;
    int digits; /* REAL: significant digits kept in the text formats (JSON, CSV);
                   0 keeps all (the shortest text that reads back exactly) */
};

static inline struct mg_metric mg_metric_real(const char *key, double v, int digits)
{
    struct mg_metric f = {.key = key, .type = MG_METRIC_REAL, .real = v, .digits = digits};
    return f;
}

static inline struct mg_metric mg_metric_int(const char *key, long long v)
{
    struct mg_metric f = {.key = key, .type = MG_METRIC_INT, .i = v};
    return f;
}

static inline struct mg_metric mg_metric_text(const char *key, const char *v)
{
    struct mg_metric f = {.key = key, .type = MG_METRIC_TEXT, .text = v};
    return f;
}

struct mg_metrics_config {
    /* Sinks: each NULL is off. */
    const char *jsonl_path; /* JSON lines appended to this file (--metrics) */
    const char *tb_dir;     /* a new events.out.tfevents.* file in this directory */
    const char *csv_dir;    /* <csv_dir>/version_<N>/metrics.csv and hparams.yaml */
    /* The run's identity, carried by every JSON record. */
    const char *run_id; /* TORCHELASTIC_RUN_ID; NULL when not under a launcher */
    int restart;        /* TORCHELASTIC_RESTART_COUNT */
    int rank;           /* TensorBoard and CSV are written by rank 0 only: other
                           ranks get no such sink (and no error) */
    const char *host;   /* NULL: gethostname() */
    /* The highest step this run (run_id) recorded before this process started,
     * when the caller knows it (prior_step_set); otherwise it is read from the
     * end of jsonl_path (mg_metrics_last_step). Records at or below it are
     * replays: marked in JSON and CSV, so curves do not double back silently. */
    int prior_step_set;
    long prior_step; /* -1: none */
    /* Clock of wall times in seconds since the Unix epoch; NULL: the real one
     * (tests pin it to get byte-exact files). */
    double (*now)(void);
};

struct mg_metrics;

/* Opens the sinks that cfg names. 0, or a negative code with the reason in
 * err ("cannot create TensorBoard file 'dir/events...': Permission denied");
 * nothing stays open then. */
int mg_metrics_open(struct mg_metrics **out, const struct mg_metrics_config *cfg, char *err,
                    size_t errlen);

/* Marks the start of this process's training at step (0, or the step of the
 * checkpoint it resumed from): a "start" JSON record, and a SessionLog START
 * event for TensorBoard, whose readers then drop the older points at or after
 * step (a restart's replayed steps replace the first attempt's). */
int mg_metrics_start(struct mg_metrics *m, long step);
/* The same, for a process that resumed a checkpoint another run wrote (the
 * same job run again): its JSON start record also names that run
 * ("resumed_run"), so that a plot can put the earlier run's records first.
 * from_run NULL or "": as mg_metrics_start. */
int mg_metrics_start_resumed(struct mg_metrics *m, long step, const char *from_run);

/* One record: a kind ("train", "eval", "summary", ...; [a-z0-9_]) and its
 * fields at step. JSON lines get it whole; TensorBoard gets each number as a
 * scalar tagged "<kind>/<key>" ("epoch" alone), CSV the same names as columns.
 * Returns 0, the first write error of the metrics (negative, sticky; see
 * mg_metrics_errmsg), or -EINVAL for a record out of bounds (nothing written). */
int mg_metrics_record(struct mg_metrics *m, const char *kind, long step,
                      const struct mg_metric *fields, int n);

/* One scalar under its own tag ("straggler/step_time_max_s"): a "scalar" JSON
 * record {"tag", "value"}, a TensorBoard scalar, a CSV column. */
int mg_metrics_scalar(struct mg_metrics *m, long step, const char *tag, double value);

/* The run's settings: an "hparams" JSON record, CSV's hparams.yaml, and a
 * TensorBoard text summary (a table under the tag "hparams"). */
int mg_metrics_hparams(struct mg_metrics *m, const struct mg_metric *fields, int n);

/* Makes what was written durable (fdatasync), e.g. next to a checkpoint.
 * Returns the first error, as mg_metrics_record. */
int mg_metrics_flush(struct mg_metrics *m);

/* The first error's message ("cannot write metrics file 'x': No space left on
 * device"), or "" when there was none. */
const char *mg_metrics_errmsg(const struct mg_metrics *m);

/* Flushes, closes every file and frees m (NULL is fine). Returns 0, or the
 * first error of m's life, with its message copied into err. */
int mg_metrics_close(struct mg_metrics *m, char *err, size_t errlen);

/* The files m writes, for copying them elsewhere (train --upload): the JSON
 * lines file, the TensorBoard file, CSV's metrics.csv and hparams.yaml (these
 * two may not exist yet). Up to max paths go into paths, valid until
 * mg_metrics_close; returns how many. */
int mg_metrics_files(const struct mg_metrics *m, const char **paths, int max);

/* The highest step that run_id's train, eval and summary records reach in the
 * JSON lines file path (its last 1 MiB is read): 0 with *step set, -1 when
 * none; -MG_ENOKEY when the file is missing or holds no such record. */
int mg_metrics_last_step(const char *path, const char *run_id, long *step);

#endif
