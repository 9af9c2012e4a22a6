/* Writes a training run's metrics through libmg's metrics API, for the tests
 * that read the files with other tools (tests/integration/metrics_*.t) and for
 * the plot's inputs. The records follow what train writes: a start record,
 * hparams, a train record every --every steps, an eval every --eval-every
 * steps, a summary at the end.
 *
 *   metrics_write [--jsonl FILE] [--tb DIR] [--csv DIR] [--run-id ID]
 *                 [--restart N] [--rank N] [--from STEP] [--to STEP]
 *                 [--every N] [--eval-every N] [--nan-at STEP] [--hold SECS]
 *
 * --from is the step training resumes from (0: a fresh start), --to the last
 * step; --nan-at makes that step's loss NaN; --hold sleeps before closing, so
 * a test can read the files of a writer that is still running. The first
 * write error is printed once, and the exit status is 3 (output incomplete). */
#include "metrics/metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long num(const char *flag, const char *v)
{
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || x < 0) {
        fprintf(stderr, "metrics_write: %s needs a number >= 0\n", flag);
        exit(2);
    }
    return x;
}

int main(int argc, char **argv)
{
    struct mg_metrics_config cfg = {0};
    long from = 0, to = 100, every = 10, eval_every = 50, nan_at = -1, hold = 0;
    char err[MG_ERRMSG_LEN];

    for (int i = 1; i < argc; i += 2) { /* every flag takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "metrics_write: %s needs a value\n", a);
            return 2;
        }
        if (strcmp(a, "--jsonl") == 0)
            cfg.jsonl_path = v;
        else if (strcmp(a, "--tb") == 0)
            cfg.tb_dir = v;
        else if (strcmp(a, "--csv") == 0)
            cfg.csv_dir = v;
        else if (strcmp(a, "--run-id") == 0)
            cfg.run_id = v;
        else if (strcmp(a, "--restart") == 0)
            cfg.restart = (int)num(a, v);
        else if (strcmp(a, "--rank") == 0)
            cfg.rank = (int)num(a, v);
        else if (strcmp(a, "--from") == 0)
            from = num(a, v);
        else if (strcmp(a, "--to") == 0)
            to = num(a, v);
        else if (strcmp(a, "--every") == 0)
            every = num(a, v);
        else if (strcmp(a, "--eval-every") == 0)
            eval_every = num(a, v);
        else if (strcmp(a, "--nan-at") == 0)
            nan_at = num(a, v);
        else if (strcmp(a, "--hold") == 0)
            hold = num(a, v);
        else {
            fprintf(stderr, "metrics_write: unknown argument '%s'\n", a);
            return 2;
        }
    }
    if (every < 1 || eval_every < 1) {
        fprintf(stderr, "metrics_write: --every and --eval-every must be >= 1\n");
        return 2;
    }

    struct mg_metrics *m;
    if (mg_metrics_open(&m, &cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "metrics_write: %s\n", err);
        return 1;
    }
    mg_metrics_start(m, from);
    struct mg_metric hp[] = {mg_metric_text("model", "mlp"), mg_metric_real("lr", 0.05, 0),
                             mg_metric_int("batch_size", 32)};
    mg_metrics_hparams(m, hp, 3);
    for (long s = from + every; s <= to; s += every) {
        double loss = s == nan_at ? 0.0 / 0.0 : 2.3 / (1.0 + (double)s / 100.0);
        struct mg_metric tr[] = {
            mg_metric_int("epoch", 1 + s / 1000),
            mg_metric_real("loss", loss, 7),
            mg_metric_real("accuracy", 1.0 - loss / 2.5, 6),
            mg_metric_real("lr", 0.05, 9),
            mg_metric_real("samples_per_s", 5000.0, 6),
            mg_metric_real("time_s", (double)s / 100, 0),
        };
        mg_metrics_record(m, "train", s, tr, 6);
        if (s % eval_every == 0) {
            struct mg_metric ev[] = {mg_metric_int("epoch", 1 + s / 1000),
                                     mg_metric_real("test_loss", loss * 1.1, 7),
                                     mg_metric_real("test_accuracy", 1.0 - loss / 2.4, 6),
                                     mg_metric_int("test_samples", 1000)};
            mg_metrics_record(m, "eval", s, ev, 4);
        }
    }
    struct mg_metric su[] = {mg_metric_int("epoch", 1 + to / 1000),
                             mg_metric_real("test_accuracy", 0.875, 6),
                             mg_metric_text("param_hash", "5c0d1a0e8e6b2f11")};
    mg_metrics_record(m, "summary", to, su, 3);
    if (hold)
        sleep((unsigned)hold);
    if (mg_metrics_close(m, err, sizeof(err)) < 0) {
        fprintf(stderr, "metrics_write: metrics incomplete: %s\n", err);
        return 3;
    }
    return 0;
}
