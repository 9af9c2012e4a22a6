/* What metrics.c shares with its sinks (metrics_jsonl.c, metrics_tb.c,
 * metrics_csv.c): the record as sinks see it, the sink's ops table, and the
 * helpers that keep every sink's error handling the same. */
#ifndef MG_METRICS_INTERNAL_H
#define MG_METRICS_INTERNAL_H

#include <sys/types.h>

#include "metrics.h"

#define MG_METRICS_ID_MAX 128 /* bytes of a run id or host name kept */

/* A record as the sinks see it: validated, with its wall time and replay mark. */
struct mg_metrics_rec {
    const char *kind; /* "train", ...; "scalar" for mg_metrics_scalar */
    const char *tag;  /* scalar records only: fields[0] is its "value" */
    long step;
    const struct mg_metric *fields;
    int n;
    double wall_time;
    int replay;
};

struct mg_metrics_sink;

struct mg_metrics_sink_ops {
    /* Each returns 0, or what mg_metrics_fail returned. A NULL op does nothing. */
    int (*record)(struct mg_metrics *m, struct mg_metrics_sink *s, const struct mg_metrics_rec *r);
    int (*start)(struct mg_metrics *m, struct mg_metrics_sink *s, long step, double wall_time);
    int (*hparams)(struct mg_metrics *m, struct mg_metrics_sink *s, const struct mg_metrics_rec *r);
    int (*flush)(struct mg_metrics *m, struct mg_metrics_sink *s);
    /* Closes the sink's files and frees it; errors as the others. */
    int (*close)(struct mg_metrics *m, struct mg_metrics_sink *s);
};

/* The head of every sink's own struct. */
struct mg_metrics_sink {
    const struct mg_metrics_sink_ops *ops;
    int broken;           /* a write failed: the sink writes nothing more */
    const char *files[2]; /* the files it writes (the sink's own strings), for
                             mg_metrics_files; NULL when fewer */
};

struct mg_metrics {
    struct mg_metrics_sink *sinks[3];
    int nsinks;
    /* identity */
    char run_id[MG_METRICS_ID_MAX];
    int has_run_id;
    int restart, rank;
    char host[MG_METRICS_ID_MAX];
    pid_t pid;
    long prior_step;                         /* records at or below it are replays; -1: none */
    char resumed_run[MG_METRICS_ID_MAX + 1]; /* the start record's, "" for none */
    double (*now)(void);
    /* the first error */
    int err;
    char errmsg[MG_ERRMSG_LEN];
};

/* Records the first error (later ones are dropped: the first is the cause),
 * marks sink s broken (when not NULL) and returns m->err. */
__attribute__((format(printf, 4, 5))) int
mg_metrics_fail(struct mg_metrics *m, struct mg_metrics_sink *s, int code, const char *fmt, ...);

/* write() of the whole buffer, retried on EINTR and short writes: 0 or -errno. */
int mg_metrics_write_all(int fd, const void *buf, size_t len);

/* fdatasync that ignores files which cannot be synced (pipes, /dev/full):
 * 0 or -errno. */
int mg_metrics_sync(int fd);

/* v rounded to digits significant digits (0: unchanged). */
double mg_metrics_round(double v, int digits);

/* Text of a number for CSV and YAML: the shortest form that reads back to
 * mg_metrics_round(v, digits); "nan", "inf", "-inf" for the others. */
void mg_metrics_fmt_real(char *buf, size_t cap, double v, int digits);

/* The name of field f of record r in TensorBoard and CSV: r->tag for a scalar
 * record, "epoch" for the epoch field, else "<kind>/<key>". */
void mg_metrics_tag(char *buf, size_t cap, const struct mg_metrics_rec *r,
                    const struct mg_metric *f);

/* The sinks. Each returns 0 with *out set, or the error's code with the
 * message in err. */
int mg_metrics_jsonl_open(struct mg_metrics *m, const char *path, struct mg_metrics_sink **out,
                          char *err, size_t errlen);
int mg_metrics_tb_open(struct mg_metrics *m, const char *dir, struct mg_metrics_sink **out,
                       char *err, size_t errlen);
int mg_metrics_csv_open(struct mg_metrics *m, const char *dir, struct mg_metrics_sink **out,
                        char *err, size_t errlen);

#endif
