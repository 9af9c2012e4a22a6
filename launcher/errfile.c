/* Reading worker error files in torchrun's JSON format (see errfile.h). */
#include "errfile.h"
#include "redact.h"
#include "json.h"
#include "mg_err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ERRFILE_TOKENS 4096

/* Copies the end of a long string value (tracebacks end with the error). */
static void str_tail(const struct mg_json *doc, int tok, char *out, size_t cap)
{
    int n = mg_json_str(doc, tok, out, cap);
    if (n < 0 || (size_t)n < cap)
        return;
    char *all = malloc((size_t)n + 1);
    if (!all)
        return; /* keep the truncated head */
    mg_json_str(doc, tok, all, (size_t)n + 1);
    size_t from = (size_t)n - (cap - 5);
    while (from < (size_t)n && ((unsigned char)all[from] & 0xc0) == 0x80)
        from++; /* start on a character boundary */
    memcpy(out, "...\n", 4);
    memcpy(out + 4, all + from, (size_t)n - from + 1);
    free(all);
}

static void get_int(const struct mg_json *doc, int tok, int *out)
{
    long long v;
    if (tok >= 0 && mg_json_int(doc, tok, &v) == 0 && v >= -2147483647 && v <= 2147483647)
        *out = (int)v;
}

int mg_errfile_parse(const char *text, size_t len, struct mg_errfile *ef)
{
    struct mg_json doc;
    int rc;

    memset(ef, 0, sizeof(*ef));
    ef->rank = -1;
    struct mg_json_tok *toks = malloc(ERRFILE_TOKENS * sizeof(*toks));
    if (!toks)
        return -ENOMEM;
    rc = mg_json_parse(&doc, text, len, toks, ERRFILE_TOKENS);
    if (rc < 0)
        goto out;
    rc = -MG_EFORMAT;
    int msg = mg_json_get(&doc, 0, "message");
    if (msg < 0)
        goto out;
    int extra = -1;
    if (doc.toks[msg].type == MG_JSON_STRING) {
        mg_json_str(&doc, msg, ef->message, sizeof(ef->message));
        mg_json_int(&doc, mg_json_get(&doc, 0, "timestamp"), &ef->timestamp);
    } else if (doc.toks[msg].type == MG_JSON_OBJECT) {
        int m = mg_json_get(&doc, msg, "message");
        if (m >= 0)
            mg_json_str(&doc, m, ef->message, sizeof(ef->message));
        extra = mg_json_get(&doc, msg, "extraInfo");
        int cs = mg_json_get(&doc, extra, "py_callstack");
        if (cs >= 0)
            str_tail(&doc, cs, ef->traceback, sizeof(ef->traceback));
        mg_json_int(&doc, mg_json_get(&doc, extra, "timestamp"), &ef->timestamp);
        get_int(&doc, mg_json_get(&doc, msg, "errorCode"), &ef->error_code);
    } else {
        goto out;
    }
    get_int(&doc, mg_json_get(&doc, 0, "rank"), &ef->rank);
    if (ef->rank < 0)
        get_int(&doc, mg_json_get(&doc, extra, "rank"), &ef->rank);
    int h = mg_json_get(&doc, 0, "hostname");
    if (h < 0)
        h = mg_json_get(&doc, extra, "hostname");
    if (h >= 0)
        mg_json_str(&doc, h, ef->hostname, sizeof(ef->hostname));
    /* A Python worker writes its own file (torch's @record), unredacted: what
     * mglaunch shows and records from it (summary, event log, `mglaunch
     * logs`) keeps secrets out by the same rule as libmg's (docs/logs.md). */
    mg_redact_inplace(ef->message, sizeof(ef->message));
    mg_redact_inplace(ef->traceback, sizeof(ef->traceback));
    rc = 0;
out:
    free(toks);
    return rc;
}

int mg_errfile_read(const char *path, struct mg_errfile *ef)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    char *buf = malloc(MG_ERRFILE_MAX_BYTES + 1);
    if (!buf) {
        close(fd);
        return -ENOMEM;
    }
    size_t len = 0;
    ssize_t r;
    while (len <= MG_ERRFILE_MAX_BYTES &&
           (r = read(fd, buf + len, MG_ERRFILE_MAX_BYTES + 1 - len)) != 0) {
        if (r < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        len += (size_t)r;
    }
    close(fd);
    int rc = len > MG_ERRFILE_MAX_BYTES ? -MG_ETOOBIG : mg_errfile_parse(buf, len, ef);
    free(buf);
    return rc;
}
