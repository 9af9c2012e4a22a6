/* What upload.c (the queue and the sender thread) and upload_dest.c (the
 * destinations: S3, HTTP PUT, a command) share: one destination, opened
 * once, sending one file at a time. */
#ifndef MG_UPLOAD_INTERNAL_H
#define MG_UPLOAD_INTERNAL_H

#include "upload.h"

#include <limits.h>

enum upload_kind {
    UPLOAD_S3,
    UPLOAD_HTTP,
    UPLOAD_CMD,
};

struct mg_http;

struct upload_dest {
    enum upload_kind kind;
    char base[2048]; /* URL of the destination's root, without a trailing '/' */
    char shown[512]; /* the destination for messages: no password */
    char sigv4[128]; /* "aws:amz:REGION:s3" */
    char key[256], secret[256];
    char token_hdr[4096]; /* "x-amz-security-token: ..." or "" */
    const char *cmd;
    char stage[PATH_MAX]; /* a command's files are linked or copied here */
    int timeout_ms;
    struct mg_http *http;
};

/* Parses cfg's destination and gets ready to send (libcurl loaded, the
 * command's stage directory made). 0, or a negative code with err set. */
int upload_dest_open(struct upload_dest *d, const struct mg_upload_config *cfg, char *err,
                     size_t errlen);
void upload_dest_close(struct upload_dest *d);

/* Sends len bytes of fd (or text, fd < 0) as name. 0, or a negative code
 * with err set; *permanent when trying again cannot help. abort_fd: a
 * descriptor whose readability gives the transfer up. */
int upload_dest_put(struct upload_dest *d, const char *name, int fd, long long len,
                    const char *text, int abort_fd, int *permanent, char *err, size_t errlen);

/* Fetches name into the open file fd (from its start). 0, -ENOENT, or a
 * negative code with err set. */
int upload_dest_get(struct upload_dest *d, const char *name, int fd, char *err, size_t errlen);

#endif
