/* metrics.c and metrics_jsonl.c: the JSON lines records exactly (today's
 * fields first, then wall time and identity), rounding, non-finite numbers,
 * start/hparams/scalar records, replay marks from a known prior step and from
 * the file's own past, mg_metrics_last_step, refused records, and write
 * failures: /dev/full reported once with the file and the reason while the
 * other sinks go on. */
#include "metrics/metrics.h"
#include "json.h"
#include "tap.h"

#include <errno.h>
#include <math.h>
#include <unistd.h>

/* timeout: 60 */

static char tmp[256];
static int ticks;

static double pinned_clock(void)
{
    return 1700000000.0 + 0.25 * ticks++;
}

/* Line i (0-based) of a file, without its '\n'; "" when absent. */
static const char *line_of(const char *path, int i)
{
    static char buf[8192];
    FILE *f = fopen(path, "r");
    buf[0] = '\0';
    if (!f)
        return buf;
    for (int k = 0; k <= i; k++) {
        if (!fgets(buf, sizeof(buf), f)) {
            buf[0] = '\0';
            break;
        }
    }
    fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
    return buf;
}

static int count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    int n = 0, c;
    if (!f)
        return -1;
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

static struct mg_metrics *open_jsonl(const char *path, const char *run_id, int restart)
{
    char err[MG_ERRMSG_LEN] = "";
    struct mg_metrics_config cfg = {.jsonl_path = path,
                                    .run_id = run_id,
                                    .restart = restart,
                                    .host = "node1",
                                    .now = pinned_clock};
    struct mg_metrics *m = NULL;
    ticks = 0;
    if (mg_metrics_open(&m, &cfg, err, sizeof(err)) < 0)
        diag("open: %s", err);
    return m;
}

static void records(void)
{
    char path[300], want[1024];
    snprintf(path, sizeof(path), "%s/records.jsonl", tmp);
    struct mg_metrics *m = open_jsonl(path, "job-1", 0);
    ok(m != NULL, "open a JSON lines sink");
    struct mg_metric tr[] = {
        mg_metric_int("epoch", 1),
        mg_metric_real("loss", 2.302585092994046, 7),
        mg_metric_real("accuracy", 0.125, 6),
        mg_metric_real("lr", 0.1, 9),
        mg_metric_real("samples_per_s", 12345.678, 6),
        mg_metric_real("time_s", 1.5, 0),
    };
    is_int(mg_metrics_record(m, "train", 10, tr, 6), 0, "train record");
    struct mg_metric ev[] = {mg_metric_int("epoch", 1), mg_metric_real("test_loss", NAN, 7),
                             mg_metric_real("test_accuracy", INFINITY, 6),
                             mg_metric_int("test_samples", 10000)};
    is_int(mg_metrics_record(m, "eval", 10, ev, 4), 0, "eval record with NaN and inf");
    struct mg_metric su[] = {mg_metric_int("epoch", 2), mg_metric_real("samples", 1280, 0),
                             mg_metric_text("param_hash", "5c0d1a0e8e6b2f11"),
                             mg_metric_text("note", "a \"quoted\"\nline\x01")};
    is_int(mg_metrics_record(m, "summary", 20, su, 4), 0, "summary record with texts");
    is_int(mg_metrics_scalar(m, 20, "straggler/step_time_max_s", 0.5), 0, "scalar record");
    struct mg_metric hp[] = {mg_metric_real("lr", 0.1, 0), mg_metric_text("model", "mlp")};
    is_int(mg_metrics_hparams(m, hp, 2), 0, "hparams record");
    is_int(mg_metrics_start(m, 0), 0, "start record");
    is_int(mg_metrics_flush(m), 0, "flush");
    is_int(mg_metrics_close(m, NULL, 0), 0, "close");

    is_str(line_of(path, 0),
           "{\"type\":\"train\",\"step\":10,\"epoch\":1,\"loss\":2.302585,\"accuracy\":0.125,"
           "\"lr\":0.1,\"samples_per_s\":12345.7,\"time_s\":1.5,\"wall_time\":1700000000,"
           "\"run_id\":\"job-1\",\"restart\":0,\"rank\":0}",
           "train: today's fields in today's order, rounded to their digits, then wall time "
           "and identity");
    is_str(line_of(path, 1),
           "{\"type\":\"eval\",\"step\":10,\"epoch\":1,\"test_loss\":null,\"test_accuracy\":null,"
           "\"test_samples\":10000,\"wall_time\":1700000000.25,\"run_id\":\"job-1\",\"restart\":0,"
           "\"rank\":0}",
           "eval: NaN and inf are null");
    is_str(line_of(path, 2),
           "{\"type\":\"summary\",\"step\":20,\"epoch\":2,\"samples\":1280,"
           "\"param_hash\":\"5c0d1a0e8e6b2f11\",\"note\":\"a \\\"quoted\\\"\\nline\\u0001\","
           "\"wall_time\":1700000000.5,\"run_id\":\"job-1\",\"restart\":0,\"rank\":0}",
           "summary: texts escaped");
    is_str(line_of(path, 3),
           "{\"type\":\"scalar\",\"step\":20,\"tag\":\"straggler/step_time_max_s\",\"value\":0.5,"
           "\"wall_time\":1700000000.75,\"run_id\":\"job-1\",\"restart\":0,\"rank\":0}",
           "scalar: tag and value");
    is_str(line_of(path, 4),
           "{\"type\":\"hparams\",\"lr\":0.1,\"model\":\"mlp\",\"wall_time\":1700000001,"
           "\"run_id\":\"job-1\",\"restart\":0,\"rank\":0}",
           "hparams: the settings");
    snprintf(want, sizeof(want),
             "{\"type\":\"start\",\"step\":0,\"host\":\"node1\",\"pid\":%d,"
             "\"wall_time\":1700000001.25,\"run_id\":\"job-1\",\"restart\":0,\"rank\":0}",
             (int)getpid());
    is_str(line_of(path, 5), want, "start: host and pid, no prior_step on a fresh file");
    is_int(count_lines(path), 6, "six lines");

    /* Every line is one JSON object that common/json.h parses back. */
    int bad = 0;
    for (int i = 0; i < 6; i++) {
        struct mg_json_tok toks[64];
        struct mg_json doc;
        const char *l = line_of(path, i);
        if (mg_json_parse(&doc, l, strlen(l), toks, 64) < 1 || toks[0].type != MG_JSON_OBJECT)
            bad++;
    }
    is_int(bad, 0, "every line parses as a JSON object");

    /* Without a launcher: run_id null; the rank is the caller's. */
    snprintf(path, sizeof(path), "%s/norun.jsonl", tmp);
    char err[MG_ERRMSG_LEN];
    struct mg_metrics_config cfg = {.jsonl_path = path, .rank = 3, .now = pinned_clock};
    struct mg_metrics *n;
    ticks = 0;
    is_int(mg_metrics_open(&n, &cfg, err, sizeof(err)), 0, "open without a run id");
    mg_metrics_scalar(n, 1, "x", 1);
    mg_metrics_close(n, NULL, 0);
    is_str(line_of(path, 0),
           "{\"type\":\"scalar\",\"step\":1,\"tag\":\"x\",\"value\":1,\"wall_time\":1700000000,"
           "\"run_id\":null,\"restart\":0,\"rank\":3}",
           "run_id null without a launcher; rank as given");
}

static void refused(void)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/refused.jsonl", tmp);
    struct mg_metrics *m = open_jsonl(path, "r", 0);
    struct mg_metric one = mg_metric_real("loss", 1, 0);
    struct mg_metric dup[] = {mg_metric_real("loss", 1, 0), mg_metric_real("loss", 2, 0)};
    struct mg_metric reserved = mg_metric_int("wall_time", 1);
    struct mg_metric badkey = mg_metric_int("a b", 1);
    char longtext[MG_METRICS_TEXT_MAX + 2];
    memset(longtext, 'x', sizeof(longtext) - 1);
    longtext[sizeof(longtext) - 1] = '\0';
    struct mg_metric toolong = mg_metric_text("t", longtext);
    struct mg_metric many[MG_METRICS_MAX_FIELDS + 1];
    char names[MG_METRICS_MAX_FIELDS + 1][8];
    for (int i = 0; i <= MG_METRICS_MAX_FIELDS; i++) {
        snprintf(names[i], sizeof(names[i]), "f%d", i);
        many[i] = mg_metric_int(names[i], i);
    }
    is_int(mg_metrics_record(m, "Train", 1, &one, 1), -EINVAL, "a kind with upper case");
    is_int(mg_metrics_record(m, "", 1, &one, 1), -EINVAL, "an empty kind");
    is_int(mg_metrics_record(m, "train", -1, &one, 1), -EINVAL, "a negative step");
    is_int(mg_metrics_record(m, "train", 1, dup, 2), -EINVAL, "a key twice");
    is_int(mg_metrics_record(m, "train", 1, &reserved, 1), -EINVAL, "a reserved key");
    is_int(mg_metrics_record(m, "train", 1, &badkey, 1), -EINVAL, "a key with a space");
    is_int(mg_metrics_record(m, "train", 1, &toolong, 1), -EINVAL, "a text over the bound");
    is_int(mg_metrics_record(m, "train", 1, many, MG_METRICS_MAX_FIELDS + 1), -EINVAL,
           "more fields than the bound");
    is_int(mg_metrics_record(m, "train", 1, many, MG_METRICS_MAX_FIELDS), 0,
           "exactly the bound is fine");
    is_int(mg_metrics_scalar(m, 1, "step", 1), -EINVAL, "a scalar named step");
    is_int(mg_metrics_scalar(m, 1, "a,b", 1), -EINVAL, "a scalar tag with a comma");
    is_str(mg_metrics_errmsg(m), "", "refusals are not write errors");
    is_int(mg_metrics_close(m, NULL, 0), 0, "close: no error");
    is_int(count_lines(path), 1, "only the accepted record was written");
    is_int(mg_metrics_record(NULL, "train", 1, &one, 1), -EINVAL, "NULL metrics");
    is_int(mg_metrics_close(NULL, NULL, 0), 0, "closing NULL is fine");
}

static void replay(void)
{
    char path[300], err[MG_ERRMSG_LEN];
    long step = -7;
    snprintf(path, sizeof(path), "%s/replay.jsonl", tmp);

    is_int(mg_metrics_last_step(path, "job", &step), -MG_ENOKEY, "last step of a missing file");
    /* Attempt 0 of job: steps 10..50, then another run's step 900. */
    struct mg_metrics *m = open_jsonl(path, "job", 0);
    mg_metrics_start(m, 0);
    for (int s = 10; s <= 50; s += 10) {
        struct mg_metric f = mg_metric_real("loss", 1.0 / s, 0);
        mg_metrics_record(m, "train", s, &f, 1);
    }
    mg_metrics_close(m, NULL, 0);
    m = open_jsonl(path, "other", 0);
    struct mg_metric f = mg_metric_real("loss", 0.5, 0);
    mg_metrics_record(m, "train", 900, &f, 1);
    struct mg_metric hp = mg_metric_int("batch", 4);
    mg_metrics_hparams(m, &hp, 1);
    mg_metrics_close(m, NULL, 0);
    /* A record cut short by a crash: not counted. */
    FILE *fp = fopen(path, "a");
    fputs("{\"type\":\"train\",\"step\":7000,\"run_id\":\"job\"", fp);
    fclose(fp);

    is_int(mg_metrics_last_step(path, "job", &step), 0, "last step of job found");
    is_int(step, 50, "job's last step is 50 (other runs, start records and a torn line ignored)");
    is_int(mg_metrics_last_step(path, "nobody", &step), -MG_ENOKEY, "an absent run: -MG_ENOKEY");

    /* Attempt 1 resumes from a checkpoint at step 30 and appends to the same
     * file: the torn line is ended first, so it does not swallow a record. */
    int before = count_lines(path) + 1;
    m = open_jsonl(path, "job", 1);
    mg_metrics_start(m, 30);
    for (int s = 40; s <= 60; s += 10) {
        struct mg_metric g = mg_metric_real("loss", 1.0 / s, 0);
        mg_metrics_record(m, "train", s, &g, 1);
    }
    mg_metrics_close(m, NULL, 0);
    ok(strstr(line_of(path, before), "\"type\":\"start\",\"step\":30,\"prior_step\":50,") != NULL,
       "the start record says where it resumed and what came before: %s", line_of(path, before));
    ok(strstr(line_of(path, before + 1), "\"step\":40,") &&
           strstr(line_of(path, before + 1), "\"restart\":1,\"rank\":0,\"replay\":true}"),
       "step 40 is a replay: %s", line_of(path, before + 1));
    ok(strstr(line_of(path, before + 2), "\"step\":50,") &&
           strstr(line_of(path, before + 2), "\"replay\":true}"),
       "step 50 is a replay");
    ok(strstr(line_of(path, before + 3), "\"step\":60,") &&
           !strstr(line_of(path, before + 3), "replay"),
       "step 60 is new: no mark");

    /* The caller may know better than the file (a per-attempt file). */
    snprintf(path, sizeof(path), "%s/known.jsonl", tmp);
    struct mg_metrics_config cfg = {.jsonl_path = path,
                                    .run_id = "job",
                                    .restart = 2,
                                    .prior_step_set = 1,
                                    .prior_step = 20,
                                    .now = pinned_clock};
    is_int(mg_metrics_open(&m, &cfg, err, sizeof(err)), 0, "open with a known prior step");
    mg_metrics_scalar(m, 20, "x", 1);
    mg_metrics_scalar(m, 21, "x", 1);
    mg_metrics_close(m, NULL, 0);
    ok(strstr(line_of(path, 0), "\"replay\":true") != NULL, "step 20 <= prior step: replay");
    ok(strstr(line_of(path, 1), "replay") == NULL, "step 21: new");

    /* Only the file's last MiB is read. */
    snprintf(path, sizeof(path), "%s/big.jsonl", tmp);
    fp = fopen(path, "w");
    fputs("{\"type\":\"train\",\"step\":5,\"run_id\":\"old\"}\n", fp);
    for (int i = 0; i < 20000; i++)
        fprintf(fp, "{\"type\":\"train\",\"step\":%d,\"run_id\":\"big\",\"pad\":\"%060d\"}\n", i,
                0);
    fclose(fp);
    is_int(mg_metrics_last_step(path, "big", &step), 0, "a 1.9 MB file: found");
    is_int(step, 19999, "its last step");
    is_int(mg_metrics_last_step(path, "old", &step), -MG_ENOKEY,
           "a record before the last MiB is not seen (documented bound)");
}

static void failures(void)
{
    char err[MG_ERRMSG_LEN] = "", tb[300], path[300];
    struct mg_metrics *m;

    /* A sink on /dev/full: every write fails with ENOSPC. */
    snprintf(tb, sizeof(tb), "%s/tb-beside-full", tmp);
    struct mg_metrics_config cfg = {.jsonl_path = "/dev/full", .tb_dir = tb, .host = "h"};
    is_int(mg_metrics_open(&m, &cfg, err, sizeof(err)), 0, "open /dev/full (%s)", err);
    struct mg_metric f = mg_metric_real("loss", 1, 0);
    is_int(mg_metrics_record(m, "train", 1, &f, 1), -ENOSPC, "the first record fails: ENOSPC");
    is_str(mg_metrics_errmsg(m), "cannot write metrics file '/dev/full': No space left on device",
           "message names the file and the reason");
    is_int(mg_metrics_record(m, "train", 2, &f, 1), -ENOSPC, "the next record: the same error");
    is_int(mg_metrics_scalar(m, 3, "x", 1), -ENOSPC, "a scalar: the same error");
    is_int(mg_metrics_flush(m), -ENOSPC, "flush: the same error");
    is_int(mg_metrics_close(m, err, sizeof(err)), -ENOSPC, "close: the same error");
    is_str(err, "cannot write metrics file '/dev/full': No space left on device",
           "close: the message, once");
    /* The TensorBoard sink beside it got all three records. */
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "test $(cat %s/events.out.tfevents.* | wc -c) -gt 150", tb);
    ok(system(cmd) == 0, "the other sink went on writing");

    /* A missing directory: open fails, nothing left open. */
    snprintf(path, sizeof(path), "%s/no/such/dir/m.jsonl", tmp);
    struct mg_metrics_config c2 = {.jsonl_path = path};
    m = (struct mg_metrics *)&c2;
    is_int(mg_metrics_open(&m, &c2, err, sizeof(err)), -ENOENT, "open in a missing directory");
    ok(m == NULL, "no object returned");
    ok(strstr(err, "cannot open metrics file") && strstr(err, path) &&
           strstr(err, "No such file or directory"),
       "message: %s", err);
    is_int(mg_metrics_open(&m, NULL, err, sizeof(err)), -EINVAL, "no configuration: -EINVAL");
}

/* The files of every sink, for train --upload: JSON lines, the TensorBoard
 * file, CSV's metrics.csv and hparams.yaml. */
static void files(void)
{
    char path[300], tb[300], csv[300], err[MG_ERRMSG_LEN] = "";
    snprintf(path, sizeof(path), "%s/files.jsonl", tmp);
    snprintf(tb, sizeof(tb), "%s/files_tb", tmp);
    snprintf(csv, sizeof(csv), "%s/files_csv", tmp);
    struct mg_metrics_config cfg = {.jsonl_path = path, .tb_dir = tb, .csv_dir = csv};
    struct mg_metrics *m = NULL;
    is_int(mg_metrics_open(&m, &cfg, err, sizeof(err)), 0, "open three sinks (%s)", err);
    const char *f[8];
    is_int(mg_metrics_files(m, f, 8), 4, "four files");
    is_str(f[0], path, "the JSON lines file");
    ok(strncmp(f[1], tb, strlen(tb)) == 0 && strstr(f[1], "/events.out.tfevents."),
       "the TensorBoard file: %s", f[1]);
    char want[400];
    snprintf(want, sizeof(want), "%s/version_0/metrics.csv", csv);
    is_str(f[2], want, "CSV's metrics.csv");
    snprintf(want, sizeof(want), "%s/version_0/hparams.yaml", csv);
    is_str(f[3], want, "CSV's hparams.yaml");
    is_int(mg_metrics_files(m, f, 2), 2, "no more than max");
    is_int(mg_metrics_files(NULL, f, 8), 0, "none without metrics");
    mg_metrics_close(m, NULL, 0);
}

int main(void)
{
    snprintf(tmp, sizeof(tmp), "%s/mgmetrics.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmp))
        BAIL_OUT("mkdtemp");
    records();
    refused();
    replay();
    failures();
    files();
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        diag("could not remove %s", tmp);
    return done_testing();
}
