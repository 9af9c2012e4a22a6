/* Run directories and the event log (launcher/logdir.h), torch error files
 * (launcher/errfile.h), and the restart backoff (agent.h). */
#include "agent.h"
#include "errfile.h"
#include "logdir.h"
#include "mg_err.h"
#include "tap.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmp[] = "/tmp/mgtest-files.XXXXXX";

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void test_rundir(void)
{
    struct mg_rundir rd;
    char base[256], path[PATH_MAX], p[PATH_MAX + 64];
    int attempt = -1;

    snprintf(base, sizeof(base), "%s/logs/deeper", tmp);
    is_int(mg_rundir_open(&rd, base, "job"), 0, "run dir created with parents");
    is_int(mg_rundir_new_attempt(&rd, 3, &attempt, path, sizeof(path)), 0, "attempt claimed");
    is_int(attempt, 0, "first attempt is 0");
    snprintf(p, sizeof(p), "%s/2", path);
    ok(is_dir(p), "rank directories created");
    mg_rundir_new_attempt(&rd, 1, &attempt, path, sizeof(path));
    is_int(attempt, 1, "then 1");
    mg_rundir_event(&rd, "{\"event\":\"a\"}", 13);
    mg_rundir_event(&rd, "{\"event\":\"b\"}", 13);
    is_int(mg_rundir_flush(&rd), 0, "events flushed");
    mg_rundir_close(&rd);

    /* A second invocation with the same run id continues the numbering,
     * also past a directory someone else created meanwhile. */
    snprintf(p, sizeof(p), "%s/job/attempt_7", base);
    mkdir(p, 0755);
    is_int(mg_rundir_open(&rd, base, "job"), 0, "reopened");
    mg_rundir_new_attempt(&rd, 1, &attempt, path, sizeof(path));
    is_int(attempt, 8, "numbering continues after the highest attempt");
    is_int(mg_rundir_last_attempt(rd.dir), 8, "last attempt");
    mg_rundir_event(&rd, "{\"event\":\"c\"}", 13);
    mg_rundir_close(&rd);

    char buf[256] = "";
    snprintf(p, sizeof(p), "%s/job/events.jsonl", base);
    int fd = open(p, O_RDONLY);
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
    is_str(buf, "{\"event\":\"a\"}\n{\"event\":\"b\"}\n{\"event\":\"c\"}\n",
           "events appended across invocations, one per line");

    char id[64];
    is_int(mg_run_id_generate(id, sizeof(id)), 0, "run id generated");
    is_int((int)strlen(id), 22, "run id shape YYYYmmdd-HHMMSS-xxxxxx: %s", id);
    ok(id[8] == '-' && id[15] == '-', "dashes in place");

    snprintf(p, sizeof(p), "%s/file", tmp);
    close(open(p, O_CREAT | O_WRONLY, 0644));
    ok(mg_rundir_open(&rd, p, "job") < 0, "a file where the log dir should be is an error");
    mg_rundir_close(&rd);
}

static void test_errfile(void)
{
    struct mg_errfile ef;
    const char *torch = "{\"message\": {\"message\": \"RuntimeError: CUDA out of memory\", "
                        "\"extraInfo\": {\"py_callstack\": \"Traceback (most recent call "
                        "last):\\n  File \\\"t.py\\\", line 3\\nRuntimeError: CUDA out of "
                        "memory\\n\", \"timestamp\": \"1700000123\"}, \"errorCode\": 9}}";
    is_int(mg_errfile_parse(torch, strlen(torch), &ef), 0, "torch's format");
    is_str(ef.message, "RuntimeError: CUDA out of memory", "message");
    ok(strstr(ef.traceback, "File \"t.py\", line 3\n") != NULL, "traceback");
    is_int(ef.timestamp, 1700000123, "timestamp");
    is_int(ef.error_code, 9, "errorCode");
    is_int(ef.rank, -1, "no rank");

    const char *mg = "{\"message\": {\"message\": \"peer 3 gone\", \"extraInfo\": "
                     "{\"py_callstack\": \"\", \"timestamp\": \"5\", \"rank\": 2, \"hostname\": "
                     "\"node4\"}}}";
    is_int(mg_errfile_parse(mg, strlen(mg), &ef), 0, "libmg's variant");
    is_int(ef.rank, 2, "rank from extraInfo");
    is_str(ef.hostname, "node4", "hostname from extraInfo");
    const char *top = "{\"message\": {\"message\": \"x\"}, \"rank\": 7, \"hostname\": \"h\"}";
    mg_errfile_parse(top, strlen(top), &ef);
    ok(ef.rank == 7 && strcmp(ef.hostname, "h") == 0, "rank and hostname at the top level");

    const char *str = "{\"message\": \"plain text\", \"timestamp\": 42}";
    is_int(mg_errfile_parse(str, strlen(str), &ef), 0, "string message variant");
    is_str(ef.message, "plain text", "message");
    is_int(ef.timestamp, 42, "numeric timestamp");

    const char *secret =
        "{\"message\": {\"message\": \"HTTPError: https://bob:hunter2@h/x "
        "token=abc123\", \"extraInfo\": {\"py_callstack\": \"  File \\\"t.py\\\"\\n    "
        "get(AWS_SECRET_ACCESS_KEY=s3cr3t)\\n\"}}}";
    is_int(mg_errfile_parse(secret, strlen(secret), &ef), 0, "a Python worker's own file");
    is_str(ef.message, "HTTPError: https://bob:***@h/x token=***", "its message is redacted");
    ok(strstr(ef.traceback, "s3cr3t") == NULL && strstr(ef.traceback, "AWS_SECRET_ACCESS_KEY=***"),
       "and its traceback");

    is_int(mg_errfile_parse("{}", 2, &ef), -MG_EFORMAT, "no message: not torch's format");
    is_int(mg_errfile_parse("[1]", 3, &ef), -MG_EFORMAT, "not an object");
    is_int(mg_errfile_parse("{\"message\"", 10, &ef), -MG_EFORMAT, "truncated");
    char p[300];
    snprintf(p, sizeof(p), "%s/none.json", tmp);
    is_int(mg_errfile_read(p, &ef), -ENOENT, "missing file");

    /* A long traceback keeps its end, where the error is. */
    static char big[40000];
    size_t n = (size_t)snprintf(big, sizeof(big),
                                "{\"message\":{\"message\":\"m\",\"extraInfo\":"
                                "{\"py_callstack\":\"");
    for (int i = 0; i < 2000; i++)
        n += (size_t)snprintf(big + n, sizeof(big) - n, "frame %04d\\n", i);
    n += (size_t)snprintf(big + n, sizeof(big) - n, "TheError\"}}}");
    is_int(mg_errfile_parse(big, n, &ef), 0, "long traceback parses");
    ok(strstr(ef.traceback, "TheError") != NULL, "its end is kept");
    ok(strncmp(ef.traceback, "...\n", 4) == 0, "marked as cut");
}

static void test_backoff(void)
{
    struct mg_backoff b = {0};
    is_int(mg_backoff_next(&b, 50), 0, "first restart: no delay");
    is_int(mg_backoff_next(&b, 50), 100, "quick again: 100 ms");
    is_int(mg_backoff_next(&b, 50), 200, "doubling");
    is_int(mg_backoff_next(&b, 50), 400, "doubling");
    for (int i = 0; i < 20; i++)
        mg_backoff_next(&b, 50);
    is_int(mg_backoff_next(&b, 50), MG_BACKOFF_MAX_MS, "capped");
    is_int(mg_backoff_next(&b, MG_BACKOFF_WINDOW_MS), 0, "a long attempt resets it");
    is_int(mg_backoff_next(&b, 10), 100, "then quick failures back off again");
}

int main(void)
{
    if (!mkdtemp(tmp))
        BAIL_OUT("mkdtemp");
    test_rundir();
    test_errfile();
    test_backoff();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        diag("could not remove %s", tmp);
    return done_testing();
}
