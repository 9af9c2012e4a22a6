/* Fuzz harness: the event log as `mglaunch logs` reads it
 * (launcher/events.c's reader, launcher/logs_read.c and logs_cmd.c, the
 * root-cause renderer in launcher/summary.c): the input is a run's events.jsonl, and the command
 * lists the run, every attempt and the error summary. A launcher killed
 * mid-write, a disk that filled up or a hand edit can leave anything there. */
#include "fuzz.h"
#include "logs_cmd.h"
#include "mg_err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64], runs[96], log_path[160];
static FILE *sink;

static void remove_dir(void)
{
    unlink(log_path);
    rmdir(runs);
    rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[MG_ERRMSG_LEN];
    if (!dir[0]) {
        snprintf(dir, sizeof(dir), "%s/mgfuzz.XXXXXX",
                 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        if (!mkdtemp(dir))
            return 0;
        snprintf(runs, sizeof(runs), "%s/run1", dir);
        snprintf(log_path, sizeof(log_path), "%s/events.jsonl", runs);
        mkdir(runs, 0700);
        sink = fopen("/dev/null", "w");
        atexit(remove_dir);
    }
    FILE *f = fopen(log_path, "w");
    if (!f)
        return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    char *listing[] = {"logs", dir, NULL};
    char *attempts[] = {"logs", dir, "--run", "run1", "--attempt", "all", NULL};
    char *last[] = {"logs", dir, "--run", "run1", "--attempt", "last", "--rank", "0,1", NULL};
    mg_logs_main(2, listing, sink, err, sizeof(err));
    mg_logs_main(6, attempts, sink, err, sizeof(err));
    mg_logs_main(8, last, sink, err, sizeof(err));
    return 0;
}
