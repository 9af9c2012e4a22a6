/* metrics_tb.c: the TensorBoard event file, byte for byte against
 * tests/golden/metrics.tfevents (written by protoc and crcmod, see
 * tests/golden/tfevents_gen.py) for the same calls with a pinned clock; its
 * name; rank 0 only; no two files share a name; a full disk reported once.
 * tests/integration/metrics_tb.t reads the files with independent readers. */
#include "metrics/metrics.h"
#include "crc32c.h"
#include "tap.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* timeout: 60 */

#define GOLDEN_CRC32C 0xD4BBC8F5u /* printed by tests/golden/tfevents_gen.py */

static char tmp[256];
static int ticks;

static double pinned_clock(void)
{
    return 1700000000.0 + 0.25 * ticks++;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = malloc(1 << 20);
    *len = fread(buf, 1, 1 << 20, f);
    fclose(f);
    return buf;
}

/* The one events file in dir (its name in name); the count of them. */
static int events_files(const char *dir, char *name, size_t cap)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strncmp(e->d_name, "events.out.tfevents.", 20) == 0 && n++ == 0)
            snprintf(name, cap, "%s", e->d_name);
    if (d)
        closedir(d);
    return n;
}

static void golden(void)
{
    char dir[300], name[256], path[600], err[MG_ERRMSG_LEN] = "";
    snprintf(dir, sizeof(dir), "%s/tb", tmp);
    struct mg_metrics_config cfg = {
        .tb_dir = dir, .run_id = "golden", .host = "node/7", .now = pinned_clock};
    struct mg_metrics *m;
    ticks = 0;
    is_int(mg_metrics_open(&m, &cfg, err, sizeof(err)), 0, "open a TensorBoard sink (%s)", err);
    is_int(mg_metrics_start(m, 0), 0, "start at step 0");
    struct mg_metric hp[] = {mg_metric_real("lr", 0.1, 0), mg_metric_int("batch_size", 64),
                             mg_metric_text("model", "mlp|cnn")};
    is_int(mg_metrics_hparams(m, hp, 3), 0, "hparams");
    struct mg_metric tr[] = {mg_metric_int("epoch", 1), mg_metric_real("loss", 2.302585, 7),
                             mg_metric_real("accuracy", 0.125, 6), mg_metric_real("lr", 0.1, 9)};
    is_int(mg_metrics_record(m, "train", 10, tr, 4), 0, "a train record");
    struct mg_metric ev[] = {mg_metric_real("test_loss", 2.25, 7),
                             mg_metric_real("test_accuracy", 0.2, 6)};
    is_int(mg_metrics_record(m, "eval", 10, ev, 2), 0, "an eval record");
    is_int(mg_metrics_scalar(m, 20, "straggler/step_time_spread_s", 0.0), 0, "a scalar of 0");
    struct mg_metric su[] = {mg_metric_int("samples", 1280), mg_metric_text("param_hash", "00ff")};
    is_int(mg_metrics_record(m, "summary", 20, su, 2), 0, "a summary with a text field");
    struct mg_metric note[] = {mg_metric_text("what", "text only")};
    is_int(mg_metrics_record(m, "note", 30, note, 1), 0, "a record of text only");
    is_int(mg_metrics_start(m, 20), 0, "a restart's start at step 20");
    struct mg_metric odd[] = {mg_metric_real("loss", INFINITY, 0),
                              mg_metric_real("accuracy", NAN, 0), mg_metric_real("lr", -0.0, 0)};
    is_int(mg_metrics_record(m, "train", 1L << 40, odd, 3), 0, "inf, nan and -0 at step 2^40");
    is_int(mg_metrics_close(m, err, sizeof(err)), 0, "close");

    is_int(events_files(dir, name, sizeof(name)), 1, "one events file");
    ok(strncmp(name, "events.out.tfevents.1700000000.node_7.", 38) == 0,
       "named events.out.tfevents.<time>.<host>.<pid>.<n>, '/' in the host replaced: %s", name);
    char want_tail[64];
    snprintf(want_tail, sizeof(want_tail), ".%d.0", (int)getpid());
    ok(strlen(name) > strlen(want_tail) &&
           strcmp(name + strlen(name) - strlen(want_tail), want_tail) == 0,
       "the name ends in .<pid>.0");

    size_t glen, len;
    char gpath[512];
    snprintf(gpath, sizeof(gpath), "%s/metrics.tfevents",
             getenv("MG_GOLDEN_DIR") ? getenv("MG_GOLDEN_DIR") : "tests/golden");
    char *want = slurp(gpath, &glen);
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    char *got = slurp(path, &len);
    if (!want)
        BAIL_OUT("cannot read %s (run from the repository root)", gpath);
    is_int(mg_crc32c(0, want, glen), GOLDEN_CRC32C, "the golden file's CRC32C is the known value");
    is_int(len, glen, "the file has the golden file's length");
    size_t first = 0;
    while (got && first < len && first < glen && got[first] == want[first])
        first++;
    ok(got && len == glen && first == len, "the file equals the golden file byte for byte");
    if (first < len || first < glen)
        diag("first difference at byte %zu", first);
    free(want);
    free(got);
}

static void ranks_and_names(void)
{
    char dir[300], name[256], err[MG_ERRMSG_LEN] = "";
    snprintf(dir, sizeof(dir), "%s/ranks", tmp);
    struct mg_metrics_config cfg = {.tb_dir = dir, .rank = 1, .host = "h"};
    struct mg_metrics *m;
    is_int(mg_metrics_open(&m, &cfg, err, sizeof(err)), 0, "rank 1: open succeeds");
    is_int(mg_metrics_scalar(m, 1, "x", 1.0), 0, "rank 1: a scalar is accepted");
    mg_metrics_close(m, NULL, 0);
    struct stat st;
    ok(stat(dir, &st) < 0 && errno == ENOENT, "rank 1 writes no TensorBoard directory or file");

    /* Two writers in the same second and process: two files. */
    cfg.rank = 0;
    cfg.now = pinned_clock;
    struct mg_metrics *a, *b;
    ticks = 0;
    is_int(mg_metrics_open(&a, &cfg, err, sizeof(err)), 0, "first writer");
    ticks = 0;
    is_int(mg_metrics_open(&b, &cfg, err, sizeof(err)), 0, "second writer, same second");
    mg_metrics_close(a, NULL, 0);
    mg_metrics_close(b, NULL, 0);
    is_int(events_files(dir, name, sizeof(name)), 2, "two files: the name's counter moved on");

    snprintf(dir, sizeof(dir), "%s/afile", tmp);
    FILE *f = fopen(dir, "w");
    if (f)
        fclose(f);
    cfg.tb_dir = dir;
    is_int(mg_metrics_open(&m, &cfg, err, sizeof(err)), -ENOTDIR, "a file in the way: -ENOTDIR");
    ok(strstr(err, "cannot create TensorBoard directory") && strstr(err, "afile"), "message: %s",
       err);
    ok(m == NULL, "nothing returned");
}

/* A file size limit makes the disk "full" under the writer (EFBIG). Nothing
 * is printed while the limit holds: stdout may be a file too. */
static void full_disk(void)
{
    char dir[300], err[MG_ERRMSG_LEN] = "", first[MG_ERRMSG_LEN], later[MG_ERRMSG_LEN];
    struct rlimit old, lim;
    snprintf(dir, sizeof(dir), "%s/full", tmp);
    struct mg_metrics_config cfg = {.tb_dir = dir, .host = "h"};
    struct mg_metrics *m;
    is_int(mg_metrics_open(&m, &cfg, err, sizeof(err)), 0, "open");
    signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 200;
    setrlimit(RLIMIT_FSIZE, &lim);
    int rc = 0, i, again;
    for (i = 0; i < 20 && rc == 0; i++)
        rc = mg_metrics_scalar(m, i, "train/loss", 1.0);
    snprintf(first, sizeof(first), "%s", mg_metrics_errmsg(m));
    again = mg_metrics_scalar(m, 99, "train/loss", 1.0);
    snprintf(later, sizeof(later), "%s", mg_metrics_errmsg(m));
    int closed = mg_metrics_close(m, err, sizeof(err));
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, SIG_DFL);

    is_int(rc, -EFBIG, "a write past the limit fails with EFBIG (record %d)", i);
    ok(strstr(first, "cannot write TensorBoard file") && strstr(first, dir) &&
           strstr(first, strerror(EFBIG)),
       "message names the file and the reason: %s", first);
    is_int(again, -EFBIG, "later calls return the same error");
    is_str(later, first, "the first message is kept");
    is_int(closed, -EFBIG, "close returns it");
    is_str(err, first, "close copies the message");
}

int main(void)
{
    snprintf(tmp, sizeof(tmp), "%s/mgtb.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmp))
        BAIL_OUT("mkdtemp");
    golden();
    ranks_and_names();
    full_disk();
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        diag("could not remove %s", tmp);
    return done_testing();
}
