/* Run and attempt directories and the event log (see logdir.h). */
#include "logdir.h"
#include "fs.h"
#include "mg_err.h"
#include "net.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int mg_logdir_default(char *buf, size_t cap)
{
    const char *tmp = getenv("TMPDIR");
    struct stat st;
    if (!tmp || tmp[0] != '/')
        tmp = "/tmp";
    int n = snprintf(buf, cap, "%s/mglaunch-%u", tmp, (unsigned)getuid());
    if (n < 0 || (size_t)n >= cap)
        return -ENAMETOOLONG;
    if (mkdir(buf, 0700) < 0 && errno != EEXIST)
        return -errno;
    if (lstat(buf, &st) < 0)
        return -errno;
    if (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 0022))
        return -EPERM; /* someone else's, a symlink, or writable by others */
    return 0;
}

int mg_run_id_generate(char *buf, size_t cap)
{
    unsigned char rnd[3] = {0, 0, 0};
    time_t now = time(NULL);
    struct tm tm;
    if (getrandom(rnd, sizeof(rnd), GRND_NONBLOCK) != (ssize_t)sizeof(rnd)) {
        unsigned v = (unsigned)getpid() ^ (unsigned)clock();
        memcpy(rnd, &v, sizeof(rnd));
    }
    localtime_r(&now, &tm);
    int n = snprintf(buf, cap, "%04d%02d%02d-%02d%02d%02d-%02x%02x%02x", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, rnd[0], rnd[1],
                     rnd[2]);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

int mg_rundir_open(struct mg_rundir *rd, const char *log_dir, const char *run_id)
{
    char path[PATH_MAX];
    int rc;

    memset(rd, 0, sizeof(*rd));
    rd->events_fd = -1;
    if ((size_t)snprintf(rd->dir, sizeof(rd->dir), "%s/%s", log_dir, run_id) >= sizeof(rd->dir))
        return -ENAMETOOLONG;
    if ((rc = mg_mkdir_p(log_dir, 0755)))
        return rc;
    if (mkdir(rd->dir, 0750) < 0 && errno != EEXIST)
        return -errno;
    if ((size_t)snprintf(path, sizeof(path), "%s/%s", rd->dir, MG_EVENTS_FILE) >= sizeof(path))
        return -ENAMETOOLONG;
    rd->events_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (rd->events_fd < 0)
        return -errno;
    rd->ev = malloc(MG_EVENT_BUF);
    if (!rd->ev) {
        close(rd->events_fd);
        rd->events_fd = -1;
        return -ENOMEM;
    }
    return 0;
}

int mg_attempt_number(const char *name)
{
    char *end;
    if (strncmp(name, "attempt_", 8) || !name[8])
        return -1;
    long v = strtol(name + 8, &end, 10);
    return *end || v < 0 || v > MG_ATTEMPT_MAX ? -1 : (int)v;
}

int mg_rundir_last_attempt(const char *rundir)
{
    DIR *d = opendir(rundir);
    struct dirent *de;
    int max = -1;
    if (!d)
        return -1;
    while ((de = readdir(d))) {
        int v = mg_attempt_number(de->d_name);
        if (v > max)
            max = v;
    }
    closedir(d);
    return max;
}

int mg_rundir_new_attempt(struct mg_rundir *rd, int nproc, int *attempt, char *path, size_t cap)
{
    int n = mg_rundir_last_attempt(rd->dir) + 1;
    /* Claim with mkdir: another launcher with the same run id may race us. */
    for (int tries = 0;; tries++, n++) {
        if ((size_t)snprintf(path, cap, "%s/attempt_%d", rd->dir, n) >= cap)
            return -ENAMETOOLONG;
        if (mkdir(path, 0750) == 0)
            break;
        if (errno != EEXIST || tries > 1000)
            return -errno;
    }
    size_t base = strlen(path);
    for (int r = 0; r < nproc; r++) {
        if ((size_t)snprintf(path + base, cap - base, "/%d", r) >= cap - base)
            return -ENAMETOOLONG;
        if (mkdir(path, 0750) < 0)
            return -errno;
    }
    path[base] = '\0';
    *attempt = n;
    return 0;
}

static void hold_ahead(struct mg_rundir *rd)
{
    struct stat st;
    if (rd->ev_reserve <= 0 || rd->events_fd < 0 || fstat(rd->events_fd, &st) < 0)
        return;
    if ((long long)st.st_size + rd->ev_reserve / 2 <= rd->ev_held_to)
        return; /* half of it still ahead */
    if (fallocate(rd->events_fd, FALLOC_FL_KEEP_SIZE, st.st_size, (off_t)rd->ev_reserve) == 0)
        rd->ev_held_to = (long long)st.st_size + rd->ev_reserve;
}

void mg_rundir_reserve(struct mg_rundir *rd, long long bytes)
{
    rd->ev_reserve = bytes;
    hold_ahead(rd);
}

int mg_rundir_flush(struct mg_rundir *rd)
{
    if (!rd->evlen || rd->events_fd < 0)
        return 0;
    /* Only whole lines are queued, so a reader never sees half an event
     * unless the disk fills up. */
    int rc = mg_write_full(rd->events_fd, rd->ev, rd->evlen, -1);
    rd->evlen = 0;
    if (rc && !rd->ev_err)
        rd->ev_err = rc;
    hold_ahead(rd);
    return rc;
}

void mg_rundir_event(struct mg_rundir *rd, const char *json, size_t len)
{
    if (rd->events_fd < 0 || !rd->ev || len + 1 > MG_EVENT_BUF)
        return;
    if (rd->evlen + len + 1 > MG_EVENT_BUF)
        mg_rundir_flush(rd);
    memcpy(rd->ev + rd->evlen, json, len);
    rd->ev[rd->evlen + len] = '\n';
    rd->evlen += len + 1;
}

void mg_rundir_close(struct mg_rundir *rd)
{
    mg_rundir_flush(rd);
    if (rd->events_fd >= 0)
        close(rd->events_fd);
    rd->events_fd = -1;
    free(rd->ev);
    rd->ev = NULL;
}
