/* Error codes shared by libmg, the launcher and the common code.
 *
 * Library functions return 0 on success or a negative code: either -errno or
 * one of the project codes below (which start above every errno value). Only
 * the programs' main files turn a code into a message, with mg_strerror(). */
#ifndef MG_ERR_H
#define MG_ERR_H

#include <stdarg.h>
#include <stddef.h>

/* The one size of the message buffers (char err[MG_ERRMSG_LEN]) that library
 * functions fill with "what is wrong" for the program to print. */
#define MG_ERRMSG_LEN 512

enum mg_err {
    MG_ERR_BASE = 10000,
    MG_EPROTO,       /* peer broke the wire protocol (bad magic, bad frame) */
    MG_EVERSION,     /* protocol or file version not supported */
    MG_EAUTH,        /* authentication failed */
    MG_ETOOBIG,      /* a length is over its documented bound */
    MG_EFORMAT,      /* a file is not in the expected format */
    MG_ETRUNC,       /* a file or message ends early */
    MG_ECRC,         /* checksum mismatch */
    MG_ESHAPE,       /* model / tensor shapes do not match */
    MG_EPEER,        /* a peer rank failed or disappeared */
    MG_EDIVERGED,    /* replicas no longer hold identical parameters */
    MG_ECONFIG,      /* inconsistent configuration (environment, flags) */
    MG_ECLOSED,      /* the rendezvous or store was closed */
    MG_ENOKEY,       /* key does not exist */
    MG_EUNSUPPORTED, /* feature not available in this build or setting */
    MG_ENONAME,      /* a host name does not resolve (the resolver says it does not exist) */
    MG_ERESOLVE,     /* the resolver failed for now (no answer from the name server) */
    MG_ENOANSWER,    /* connected, but nothing answered the store's hello in time */
    MG_ERR_MAX
};

/* Message for a code returned by any mg function (negative or positive). */
const char *mg_strerror(int err);

/* Writes a formatted message into err (errlen bytes) when err is not NULL and
 * errlen > 0, and returns code: `return mg_seterr(err, len, -EINVAL, ...)`. */
__attribute__((format(printf, 4, 5))) int mg_seterr(char *err, size_t errlen, int code,
                                                    const char *fmt, ...);
__attribute__((format(printf, 4, 0))) int mg_vseterr(char *err, size_t errlen, int code,
                                                     const char *fmt, va_list ap);

/* snprintf that says when it cut: the length written, or -ENAMETOOLONG when the
 * text did not fit in cap bytes (it is then cut, still terminated). */
__attribute__((format(printf, 3, 4))) int mg_fmt(char *buf, size_t cap, const char *fmt, ...);

#endif
