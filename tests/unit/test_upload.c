/* runtime/upload's queue and sender thread, through the command destination
 * (real /bin/sh commands, no server): items sent in order with every part,
 * a file taken when queued (removing it or renaming another over it later
 * changes nothing), retries counted, a full queue refusing, a newer snapshot replacing
 * a waiting one, close() giving up at its deadline, the commands running at
 * the sender's lower priority, and the errors of open and fetch. The HTTP and
 * S3 destinations are tested against real servers in
 * tests/integration/train_upload.t. */
#include "mg_err.h"
#include "tap.h"
#include "upload/upload.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* timeout: 60 */

static char tmp[256];

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0)
        BAIL_OUT("cannot write %s", path);
}

static const char *read_file(const char *path)
{
    static char buf[4096];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    return buf;
}

static void in_order(void)
{
    char cmd[1024], a[300], b[300], log[300], err[MG_ERRMSG_LEN];
    snprintf(a, sizeof(a), "%s/a.bin", tmp);
    snprintf(b, sizeof(b), "%s/b.bin", tmp);
    snprintf(log, sizeof(log), "%s/log", tmp);
    write_file(a, "AAAA");
    write_file(b, "BB");
    /* each file's name and content, one line per call */
    snprintf(cmd, sizeof(cmd), "printf '%%s=%%s\\n' \"$MG_UPLOAD_NAME\" \"$(cat {})\" >>'%s'", log);
    struct mg_upload_config cfg = {.cmd = cmd, .stage_dir = tmp};
    struct mg_upload *u;
    is_int(mg_upload_open(&u, &cfg, err, sizeof(err)), 0, "open a command destination (%s)", err);
    struct mg_upload_part item[3] = {{.name = "ck/a", .path = a},
                                     {.name = "ck/b", .path = b},
                                     {.name = "ck/LATEST", .text = "a"}};
    is_int(mg_upload_queue(u, item, 3, 0), 0, "an item of three parts");
    unlink(a);    /* opened when queued: its removal does not matter, */
    char b2[310]; /* nor a new file renamed over it, as checkpoints and CSV are written */
    snprintf(b2, sizeof(b2), "%s.new", b);
    write_file(b2, "BBBBBBBB");
    rename(b2, b);
    struct mg_upload_part one = {.name = "m/x", .text = "x1"};
    is_int(mg_upload_queue(u, &one, 1, 0), 0, "a second item");
    struct mg_upload_part gone = {.name = "m/y", .path = a};
    is_int(mg_upload_queue(u, &gone, 1, 0), -ENOENT, "a file that is not there: -ENOENT");
    struct mg_upload_stats st;
    is_int(mg_upload_close(u, 10000, &st), 0, "close: everything copied");
    is_str(read_file(log), "ck/a=AAAA\nck/b=BB\nck/LATEST=a\nm/x=x1\n",
           "in order, each with its name, the content it had when queued (%d bytes)",
           (int)st.bytes);
    ok(st.queued == 2 && st.copied == 2 && st.failed == 0 && st.retries == 0 && st.bytes == 9,
       "stats: 2 queued, 2 copied, 9 bytes");
}

static void failures(void)
{
    char cmd[600], flag[300], err[MG_ERRMSG_LEN];
    snprintf(flag, sizeof(flag), "%s/ok-now", tmp);
    /* fails until the flag file exists */
    snprintf(cmd, sizeof(cmd), "test -e '%s' || exit 9", flag);
    struct mg_upload_config cfg = {
        .cmd = cmd, .stage_dir = tmp, .backoff_ms = 20, .backoff_max_ms = 50, .tries = 1000};
    struct mg_upload *u;
    struct mg_upload_stats st;
    is_int(mg_upload_open(&u, &cfg, err, sizeof(err)), 0, "open");
    struct mg_upload_part p = {.name = "f", .text = "t"};
    mg_upload_queue(u, &p, 1, 0);
    usleep(300000);
    mg_upload_stats(u, &st);
    ok(st.retries >= 2 && st.copied == 0, "a failing command is tried again (%d retries)",
       st.retries);
    ok(strstr(st.last_error, "exited with status 9") != NULL, "the last error says why: %s",
       st.last_error);
    write_file(flag, "");
    is_int(mg_upload_close(u, 10000, &st), 0, "once it works, the item is copied");
    is_int(st.copied, 1, "one copy");

    /* a bounded queue, a replaced snapshot, and the deadline of close */
    struct mg_upload_config slow = {.cmd = "sleep 2; : {}", .stage_dir = tmp, .queue_max = 2};
    is_int(mg_upload_open(&u, &slow, err, sizeof(err)), 0, "open a slow destination");
    struct mg_upload_part p1 = {.name = "one", .text = "1"}, p2 = {.name = "two", .text = "2"},
                          p3 = {.name = "three", .text = "3"};
    mg_upload_queue(u, &p1, 1, 0);
    usleep(100000); /* "one" is being sent */
    is_int(mg_upload_queue(u, &p2, 1, 1), 0, "a second item waits");
    is_int(mg_upload_queue(u, &p3, 1, 0), -ENOSPC, "a third: the queue of 2 is full");
    struct mg_upload_part p2b = {.name = "two", .text = "2b"};
    is_int(mg_upload_queue(u, &p2b, 1, 1), 0, "a newer 'two' replaces the waiting one");
    is_int(mg_upload_close(u, 200, &st), -EIO, "close after 0.2 s: not everything was copied");
    ok(st.dropped == 1 && st.replaced == 1 && st.pending == 2 && st.copied == 0,
       "1 dropped, 1 replaced, 2 not sent (dropped %d replaced %d pending %d)", st.dropped,
       st.replaced, st.pending);
    ok(st.nlist == 3 && strstr(st.list[0], "three: the queue was full") &&
           strstr(st.list[1], "one: not sent before the end"),
       "the list of what was not copied says why");
}

static void errors(void)
{
    char err[MG_ERRMSG_LEN], path[300];
    struct mg_upload *u = NULL;
    struct mg_upload_config bad = {.dest = "ftp://x/y"};
    is_int(mg_upload_open(&u, &bad, err, sizeof(err)), -EINVAL, "an unknown scheme");
    ok(strstr(err, "s3://BUCKET/PREFIX") != NULL, "says what is wanted: %s", err);
    unsetenv("AWS_ACCESS_KEY_ID");
    struct mg_upload_config s3 = {.dest = "s3://bucket/p"};
    is_int(mg_upload_open(&u, &s3, err, sizeof(err)), -EINVAL, "s3 without credentials");
    ok(strstr(err, "AWS_ACCESS_KEY_ID") != NULL, "names the variables: %s", err);
    struct mg_upload_config both = {.dest = "http://h/p", .cmd = "true"};
    is_int(mg_upload_open(&u, &both, err, sizeof(err)), -EINVAL, "a destination and a command");
    struct mg_upload_config cmd = {.cmd = "true", .stage_dir = tmp};
    snprintf(path, sizeof(path), "%s/fetched", tmp);
    is_int(mg_upload_fetch(&cmd, "x", path, err, sizeof(err)), -MG_EUNSUPPORTED,
           "a command cannot fetch");
    char shown[200];
    mg_upload_describe("https://user:secret@host:8443/dav/x", shown, sizeof(shown));
    is_str(shown, "https://host:8443/dav/x", "the password is left out of messages");
}

/* Copies are background work: the sender thread, and the commands it
 * starts, run at nice MG_UPLOAD_NICE, while the training thread keeps its own. */
static void lower_priority(void)
{
    char cmd[400], out[300], err[MG_ERRMSG_LEN], want[16];
    snprintf(out, sizeof(out), "%s/nice", tmp);
    snprintf(cmd, sizeof(cmd), "nice >'%s'; : {}", out);
    struct mg_upload_config cfg = {.cmd = cmd, .stage_dir = tmp};
    struct mg_upload *u;
    int before = getpriority(PRIO_PROCESS, 0);
    is_int(mg_upload_open(&u, &cfg, err, sizeof(err)), 0, "open (%s)", err);
    struct mg_upload_part one = {.name = "n", .text = "x"};
    mg_upload_queue(u, &one, 1, 0);
    struct mg_upload_stats st;
    is_int(mg_upload_close(u, 10000, &st), 0, "close: copied");
    snprintf(want, sizeof(want), "%d\n",
             before + MG_UPLOAD_NICE > 19 ? 19 : before + MG_UPLOAD_NICE);
    is_str(read_file(out), want, "the command runs at nice %d more than the training",
           MG_UPLOAD_NICE);
    is_int(getpriority(PRIO_PROCESS, 0), before, "the calling thread keeps its priority");
}

int main(void)
{
    snprintf(tmp, sizeof(tmp), "%s/mgupload.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmp))
        BAIL_OUT("mkdtemp");
    in_order();
    failures();
    errors();
    lower_priority();
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        diag("could not remove %s", tmp);
    return done_testing();
}
