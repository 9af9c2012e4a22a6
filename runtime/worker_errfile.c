/* The error file a failing worker leaves for its launcher: torchrun's JSON
 * format (torch/distributed/elastic/multiprocessing/errors/error_handler.py),
 * with mg's additions in extraInfo, written atomically. mglaunch and torchrun
 * both read message.message and extraInfo.timestamp; mglaunch also shows rank
 * and hostname. See docs/distributed.md. */
#include "dist.h"
#include "json.h"
#include "redact.h"
#include "net.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MESSAGE_MAX 8192
#define JSON_MAX    (4 * MESSAGE_MAX) /* room for the escapes of a capped message */

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
    char tmp[PATH_MAX + 32], rs[16], ls[16], ts[32], ps[16], callstack[1024];
    /* The file outlives the run and others read it (the launcher's summary,
     * `mglaunch logs`): no secret goes into it (common/redact.h). */
    size_t cap = 2 * (message ? strlen(message) : 0) + 16;
    char *json = malloc(JSON_MAX), *clean = malloc(cap);
    int n = snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    if (!json || !clean) {
        free(json);
        free(clean);
        return -ENOMEM;
    }
    if (n < 0 || (size_t)n >= sizeof(tmp)) {
        free(json);
        free(clean);
        return -ENAMETOOLONG;
    }
    mg_redact(message, clean, cap);
    message = clean;
    int_or_unknown(rs, sizeof(rs), rank);
    int_or_unknown(ls, sizeof(ls), local_rank);
    snprintf(ts, sizeof(ts), "%lld", (long long)time(NULL));
    snprintf(ps, sizeof(ps), "%d", (int)getpid());
    snprintf(callstack, sizeof(callstack), "%s (rank %s on %s, pid %s): %.900s",
             prog ? prog : "worker", rs, hostname ? hostname : "unknown", ps,
             message ? message : "");

    /* torchrun's shape: {"message": {"message": ..., "extraInfo": {...}}} */
    struct mg_jsonw w;
    mg_jsonw_init(&w, json, JSON_MAX);
    mg_jsonw_obj_begin(&w);
    mg_jsonw_key(&w, "message");
    mg_jsonw_obj_begin(&w);
    size_t mlen = message ? strlen(message) : 0;
    mg_jsonw_key(&w, "message");
    mg_jsonw_strn(&w, message ? message : "", mlen < MESSAGE_MAX ? mlen : MESSAGE_MAX);
    mg_jsonw_key(&w, "extraInfo");
    mg_jsonw_obj_begin(&w);
    mg_jsonw_kstr(&w, "py_callstack", callstack);
    mg_jsonw_kstr(&w, "timestamp", ts);
    mg_jsonw_kstr(&w, "rank", rs);
    mg_jsonw_kstr(&w, "local_rank", ls);
    mg_jsonw_kstr(&w, "hostname", hostname ? hostname : "unknown");
    mg_jsonw_kstr(&w, "pid", ps);
    mg_jsonw_kstr(&w, "program", prog ? prog : "worker");
    mg_jsonw_obj_end(&w);
    mg_jsonw_obj_end(&w);
    mg_jsonw_obj_end(&w);
    int len = mg_jsonw_finish(&w);
    if (len < 0) {
        free(json);
        free(clean);
        return len;
    }

    int err = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (fd < 0) {
        err = -errno;
        goto out;
    }
    json[len++] = '\n';
    err = mg_write_full(fd, json, (size_t)len, -1);
    if (!err && fsync(fd) < 0)
        err = -errno;
    if (close(fd) < 0 && !err)
        err = -errno;
    if (!err && rename(tmp, path) < 0)
        err = -errno;
    if (err)
        unlink(tmp);
out:
    free(json);
    free(clean);
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
