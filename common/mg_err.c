/* Messages for the project's error codes (see mg_err.h). */
#include "mg_err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const mg_err_msg[] = {
    [MG_EPROTO - MG_ERR_BASE] = "protocol error",
    [MG_EVERSION - MG_ERR_BASE] = "unsupported version",
    [MG_EAUTH - MG_ERR_BASE] = "authentication failed",
    [MG_ETOOBIG - MG_ERR_BASE] = "length over limit",
    [MG_EFORMAT - MG_ERR_BASE] = "bad format",
    [MG_ETRUNC - MG_ERR_BASE] = "truncated",
    [MG_ECRC - MG_ERR_BASE] = "checksum mismatch",
    [MG_ESHAPE - MG_ERR_BASE] = "shape mismatch",
    [MG_EPEER - MG_ERR_BASE] = "peer failed",
    [MG_EDIVERGED - MG_ERR_BASE] = "replicas diverged",
    [MG_ECONFIG - MG_ERR_BASE] = "invalid configuration",
    [MG_ECLOSED - MG_ERR_BASE] = "closed",
    [MG_ENOKEY - MG_ERR_BASE] = "no such key",
    [MG_EUNSUPPORTED - MG_ERR_BASE] = "not supported",
    /* The resolver's own words (getaddrinfo's EAI_NONAME and EAI_AGAIN). */
    [MG_ENONAME - MG_ERR_BASE] = "the name does not resolve (Name or service not known)",
    [MG_ERESOLVE - MG_ERR_BASE] = "the name does not resolve for now (Temporary failure in name "
                                  "resolution)",
    [MG_ENOANSWER - MG_ERR_BASE] = "no store answers there (the connection opened, but nothing "
                                   "answered the store's hello: a store too busy, or another "
                                   "program listening on that port)",
};

const char *mg_strerror(int err)
{
    if (err < 0)
        err = -err;
    if (err > MG_ERR_BASE && err < MG_ERR_MAX)
        return mg_err_msg[err - MG_ERR_BASE];
    return strerror(err);
}

int mg_vseterr(char *err, size_t errlen, int code, const char *fmt, va_list ap)
{
    if (err && errlen)
        vsnprintf(err, errlen, fmt, ap);
    return code;
}

int mg_seterr(char *err, size_t errlen, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mg_vseterr(err, errlen, code, fmt, ap);
    va_end(ap);
    return code;
}

int mg_fmt(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    if (!cap)
        return -ENAMETOOLONG;
    va_start(ap, fmt);
    int n = vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    if (n < 0) {
        buf[0] = '\0';
        return -EINVAL;
    }
    return (size_t)n >= cap ? -ENAMETOOLONG : n;
}
