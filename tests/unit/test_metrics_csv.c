/* metrics_csv.c: Lightning's CSVLogger layout. version_N directories (the
 * next free number, each writer its own), metrics.csv's header as the sorted
 * union of keys with a step column, the file rewritten when a key arrives,
 * RFC 4180 quoting, non-finite numbers, the replay column, hparams.yaml, rank
 * 0 only, and a failed rewrite that leaves the old file whole.
 * tests/integration/metrics_csv.t reads the files with Python's csv and yaml. */
#include "metrics/metrics.h"
#include "tap.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* timeout: 60 */

static char tmp[256];

static char *slurp(const char *path)
{
    static char buf[1 << 16];
    FILE *f = fopen(path, "rb");
    buf[0] = '\0';
    if (!f)
        return buf;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Whether tmp/rel exists. */
static int exists(const char *rel)
{
    char p[600];
    struct stat st;
    snprintf(p, sizeof(p), "%s/%s", tmp, rel);
    return stat(p, &st) == 0;
}

static struct mg_metrics *open_csv(const char *dir, int rank, long prior)
{
    char err[MG_ERRMSG_LEN] = "";
    struct mg_metrics_config cfg = {
        .csv_dir = dir, .rank = rank, .prior_step_set = 1, .prior_step = prior, .host = "h"};
    struct mg_metrics *m = NULL;
    if (mg_metrics_open(&m, &cfg, err, sizeof(err)) < 0)
        diag("open: %s", err);
    return m;
}

static void layout(void)
{
    char dir[300], path[400];
    snprintf(dir, sizeof(dir), "%s/logs", tmp);
    struct mg_metrics *m = open_csv(dir, 0, -1);
    ok(m != NULL, "open a CSV sink");
    ok(exists("logs/version_0"), "version_0 created");
    ok(!exists("logs/version_0/metrics.csv"), "metrics.csv waits for the first record");

    struct mg_metric t1[] = {mg_metric_int("epoch", 1), mg_metric_real("loss", 0.5, 7),
                             mg_metric_real("accuracy", 0.25, 6)};
    is_int(mg_metrics_record(m, "train", 10, t1, 3), 0, "train at 10");
    snprintf(path, sizeof(path), "%s/version_0/metrics.csv", dir);
    is_str(slurp(path), "epoch,step,train/accuracy,train/loss\n1,10,0.25,0.5\n",
           "header: sorted keys with step; one row");
    struct mg_metric t2[] = {mg_metric_int("epoch", 1), mg_metric_real("loss", 0.2500001, 4),
                             mg_metric_real("accuracy", 0.5, 6)};
    is_int(mg_metrics_record(m, "train", 20, t2, 3), 0, "train at 20");
    struct mg_metric ev[] = {mg_metric_int("epoch", 1), mg_metric_real("test_loss", 0.3, 7),
                             mg_metric_real("test_accuracy", 0.9, 6)};
    is_int(mg_metrics_record(m, "eval", 20, ev, 3), 0, "eval at 20: new keys");
    is_str(slurp(path),
           "epoch,eval/test_accuracy,eval/test_loss,step,train/accuracy,train/loss\n"
           "1,,,10,0.25,0.5\n"
           "1,,,20,0.5,0.25\n"
           "1,0.9,0.3,20,,\n",
           "rewritten under the new header; old rows keep their values in their columns");
    struct mg_metric su[] = {mg_metric_text("param_hash", "a,b"),
                             mg_metric_text("note", "say \"hi\"\nbye")};
    is_int(mg_metrics_record(m, "summary", 20, su, 2), 0, "summary with texts");
    is_int(mg_metrics_scalar(m, 30, "straggler/max_s", 1e-7), 0, "a scalar");
    struct mg_metric odd[] = {mg_metric_real("loss", NAN, 0),
                              mg_metric_real("accuracy", -INFINITY, 0)};
    is_int(mg_metrics_record(m, "train", 40, odd, 2), 0, "NaN and -inf");
    is_str(slurp(path),
           "epoch,eval/test_accuracy,eval/test_loss,step,straggler/max_s,summary/note,"
           "summary/param_hash,train/accuracy,train/loss\n"
           "1,,,10,,,,0.25,0.5\n"
           "1,,,20,,,,0.5,0.25\n"
           "1,0.9,0.3,20,,,,,\n"
           ",,,20,,\"say \"\"hi\"\" bye\",\"a,b\",,\n"
           ",,,30,1e-07,,,,\n"
           ",,,40,,,,-inf,nan\n",
           "texts quoted (RFC 4180), quoted cells carried through a rewrite, nan and -inf");
    ok(!exists("logs/version_0/metrics.csv.tmp"), "no temporary file left");

    struct mg_metric hp[] = {mg_metric_real("lr", 0.1, 0),      mg_metric_int("batch_size", 64),
                             mg_metric_text("model", "mlp"),    mg_metric_text("hidden", "256,128"),
                             mg_metric_real("dropout", NAN, 0), mg_metric_text("yes", "true")};
    is_int(mg_metrics_hparams(m, hp, 6), 0, "hparams");
    snprintf(path, sizeof(path), "%s/version_0/hparams.yaml", dir);
    is_str(slurp(path),
           "batch_size: 64\ndropout: .nan\nhidden: \"256,128\"\nlr: 0.1\nmodel: \"mlp\"\n"
           "yes: \"true\"\n",
           "hparams.yaml: sorted keys, texts quoted so none reads as a number or a boolean");
    is_int(mg_metrics_close(m, NULL, 0), 0, "close");

    /* The next writer (a restart) gets the next version; odd names are ignored. */
    char odd_dirs[400];
    snprintf(odd_dirs, sizeof(odd_dirs), "%s/version_7", dir);
    mkdir(odd_dirs, 0755);
    snprintf(odd_dirs, sizeof(odd_dirs), "%s/version_x9", dir);
    mkdir(odd_dirs, 0755);
    snprintf(odd_dirs, sizeof(odd_dirs), "%s/version_-20", dir);
    mkdir(odd_dirs, 0755);
    m = open_csv(dir, 0, 10);
    ok(exists("logs/version_8"), "after version_7 comes version_8");
    struct mg_metric r[] = {mg_metric_real("loss", 0.75, 0), mg_metric_real("samples", 1280, 0)};
    mg_metrics_record(m, "train", 10, r, 2);
    mg_metrics_record(m, "train", 20, r, 2);
    struct mg_metric empty[1];
    is_int(mg_metrics_hparams(m, empty, 0), 0, "no hparams");
    mg_metrics_close(m, NULL, 0);
    snprintf(path, sizeof(path), "%s/version_8/metrics.csv", dir);
    is_str(slurp(path), "replay,step,train/loss,train/samples\n1,10,0.75,1280\n,20,0.75,1280\n",
           "a replayed row has replay=1; a new one leaves it empty; whole numbers plain");
    snprintf(path, sizeof(path), "%s/version_8/hparams.yaml", dir);
    is_str(slurp(path), "{}\n", "empty hparams.yaml is {} (as yaml.dump writes it)");

    m = open_csv(dir, 2, -1);
    mg_metrics_record(m, "train", 10, r, 2);
    mg_metrics_close(m, NULL, 0);
    ok(!exists("logs/version_9"), "rank 2 writes no CSV");
}

/* A rewrite that cannot finish leaves metrics.csv as it was. Nothing is
 * printed while the file size limit holds. */
static void failed_rewrite(void)
{
    char dir[300], path[400], err[MG_ERRMSG_LEN] = "", before[4096], msg[MG_ERRMSG_LEN];
    struct rlimit old, lim;
    snprintf(dir, sizeof(dir), "%s/fail", tmp);
    struct mg_metrics *m = open_csv(dir, 0, -1);
    struct mg_metric t[] = {mg_metric_real("loss", 0.5, 0)};
    for (int s = 1; s <= 20; s++)
        mg_metrics_record(m, "train", s, t, 1);
    snprintf(path, sizeof(path), "%s/version_0/metrics.csv", dir);
    snprintf(before, sizeof(before), "%s", slurp(path));
    struct stat st;
    stat(path, &st);

    signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = (rlim_t)st.st_size + 8;
    setrlimit(RLIMIT_FSIZE, &lim);
    struct mg_metric e[] = {mg_metric_real("test_loss", 0.25, 0)};
    int rc = mg_metrics_record(m, "eval", 20, e, 1);
    int again = mg_metrics_record(m, "train", 21, t, 1);
    snprintf(msg, sizeof(msg), "%s", mg_metrics_errmsg(m));
    int closed = mg_metrics_close(m, err, sizeof(err));
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, SIG_DFL);

    is_int(rc, -EFBIG, "the rewrite fails (EFBIG)");
    ok(strstr(msg, "cannot rewrite CSV file") && strstr(msg, path) && strstr(msg, strerror(EFBIG)),
       "message: %s", msg);
    is_int(again, -EFBIG, "the sink stays off");
    is_int(closed, -EFBIG, "close reports it");
    is_str(slurp(path), before, "metrics.csv is as it was before the failed rewrite");
    ok(!exists("fail/version_0/metrics.csv.tmp"), "the temporary file is removed");
}

int main(void)
{
    snprintf(tmp, sizeof(tmp), "%s/mgcsv.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmp))
        BAIL_OUT("mkdtemp");
    layout();
    failed_rewrite();
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        diag("could not remove %s", tmp);
    return done_testing();
}
