/* The error file a failing worker leaves for its launcher: torchrun's JSON
 * format (torch/distributed/elastic/multiprocessing/errors/error_handler.py),
 * with mg's additions in extraInfo, written atomically. mglaunch and torchrun
 * both read message.message and extraInfo.timestamp; mglaunch also shows rank
 * and hostname. See docs/distributed.md. */
#include "dist.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A tiny JSON string escaper (to be unified with the launcher's JSON code). */
static void json_str(FILE *fp, const char *s)
{
    fputc('"', fp);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        switch (*p) {
        case '"':
            fputs("\\\"", fp);
            break;
        case '\\':
            fputs("\\\\", fp);
            break;
        case '\n':
            fputs("\\n", fp);
            break;
        case '\r':
            fputs("\\r", fp);
            break;
        case '\t':
            fputs("\\t", fp);
            break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                fprintf(fp, "\\u%04x", *p);
            else
                fputc(*p, fp); /* UTF-8 passes through; invalid bytes too (JSON readers vary) */
        }
    }
    fputc('"', fp);
}

static void int_or_unknown(char *buf, size_t len, int v)
{
    if (v < 0)
        snprintf(buf, len, "unknown");
    else
        snprintf(buf, len, "%d", v);
}

int mg_error_file_write(const char *path, const char *prog, const char *message, int rank,
                        int local_rank, const char *hostname)
{
    char tmp[PATH_MAX + 32], rs[16], ls[16], ts[32], ps[16];
    int n = snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    if (n < 0 || (size_t)n >= sizeof(tmp))
        return -ENAMETOOLONG;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    FILE *fp = fdopen(fd, "w");
    if (!fp) {
        int err = -errno;
        close(fd);
        unlink(tmp);
        return err;
    }
    int_or_unknown(rs, sizeof(rs), rank);
    int_or_unknown(ls, sizeof(ls), local_rank);
    snprintf(ts, sizeof(ts), "%lld", (long long)time(NULL));
    snprintf(ps, sizeof(ps), "%d", (int)getpid());
    char callstack[1024];
    snprintf(callstack, sizeof(callstack), "%s (rank %s on %s, pid %s): %s", prog ? prog : "worker",
             rs, hostname ? hostname : "unknown", ps, message ? message : "");

    fputs("{\"message\": {\"message\": ", fp);
    json_str(fp, message);
    fputs(", \"extraInfo\": {\"py_callstack\": ", fp);
    json_str(fp, callstack);
    fputs(", \"timestamp\": ", fp);
    json_str(fp, ts);
    fputs(", \"rank\": ", fp);
    json_str(fp, rs);
    fputs(", \"local_rank\": ", fp);
    json_str(fp, ls);
    fputs(", \"hostname\": ", fp);
    json_str(fp, hostname);
    fputs(", \"pid\": ", fp);
    json_str(fp, ps);
    fputs(", \"program\": ", fp);
    json_str(fp, prog ? prog : "worker");
    fputs("}}}\n", fp);
    int err = 0;
    if (fflush(fp) != 0 || fsync(fileno(fp)) != 0)
        err = -errno;
    if (fclose(fp) != 0 && !err)
        err = -errno;
    if (!err && rename(tmp, path) < 0)
        err = -errno;
    if (err)
        unlink(tmp);
    return err;
}

static int env_nonneg(const char *name)
{
    const char *v = getenv(name);
    char *end;
    if (!v || !*v)
        return -1;
    long x = strtol(v, &end, 10);
    return *end || x < 0 || x > 1 << 30 ? -1 : (int)x;
}

int mg_error_file_record(const struct mg_dist *d, const char *prog, const char *message)
{
    const char *path = getenv("TORCHELASTIC_ERROR_FILE");
    if (!path || !*path)
        return 0;
    char host[MG_HOST_MAX];
    if (d) {
        snprintf(host, sizeof(host), "%s", d->hostname);
    } else if (gethostname(host, sizeof(host) - 1) < 0) {
        snprintf(host, sizeof(host), "unknown");
    }
    host[sizeof(host) - 1] = '\0';
    int rank = d ? d->rank : env_nonneg("RANK");
    int local = d ? d->local_rank : env_nonneg("LOCAL_RANK");
    return mg_error_file_write(path, prog, message, rank, local, host);
}
