/* Copies of a run's files kept elsewhere (train --upload, --upload-cmd; see
 * docs/train.md, "Remote copies"): a thread of libmg sends them from a bounded
 * queue, so the training loop only queues (an open() and a malloc) and never
 * waits for the network.
 *
 * Destinations:
 *   s3://BUCKET/PREFIX   PUT of PREFIX/NAME, signed with AWS Signature V4 by
 *                        libcurl; AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
 *                        AWS_SESSION_TOKEN, AWS_REGION (or AWS_DEFAULT_REGION,
 *                        else us-east-1); AWS_ENDPOINT_URL_S3 (or
 *                        AWS_ENDPOINT_URL) for an S3-compatible store, which is
 *                        then addressed path-style (ENDPOINT/BUCKET/KEY)
 *   http(s)://HOST/PATH  PUT of PATH/NAME (WebDAV; user:password@ in the URL)
 *   a command            'CMD {}' run by /bin/sh with {} the file's path
 *                        (quoted), MG_UPLOAD_NAME=NAME in its environment;
 *                        exit status 0 is success
 *
 * A queued item is one or more files sent in order (a checkpoint, then its
 * completion marker, then the pointer to the newest); the item is copied when
 * all of them are. A failed try is tried again after a backoff that doubles
 * (up to a limit); an HTTP answer that says trying again will not help (4xx
 * other than 408 and 429) gives the item up at once. Items wait their turn
 * behind one being retried, so the order of the copies is the order of the
 * queue. Thread-safe: the training thread queues, the sender thread sends.
 *
 * libcurl is loaded at run time (common/http.h) only for s3 and http(s). */
#ifndef MG_UPLOAD_H
#define MG_UPLOAD_H

#include <stddef.h>

#define MG_UPLOAD_QUEUE_MAX 64
#define MG_UPLOAD_PARTS_MAX 4
#define MG_UPLOAD_NAME_MAX  1024
#define MG_UPLOAD_LIST_MAX  32 /* names kept of what was not copied */
#define MG_UPLOAD_NICE      10 /* added to the sender thread's (and its commands') nice value */

struct mg_upload_config {
    const char *dest;      /* s3://... or http(s)://...; NULL with cmd */
    const char *cmd;       /* the command; NULL with dest */
    int queue_max;         /* items waiting at most; 0: MG_UPLOAD_QUEUE_MAX */
    int tries;             /* tries of an item before it is given up; 0: 10 */
    int backoff_ms;        /* the first wait after a failed try; 0: 500 */
    int backoff_max_ms;    /* 0: 30000 */
    int timeout_ms;        /* one transfer or command; 0: 10 minutes */
    const char *libcurl;   /* NULL: common/http.h's default */
    const char *stage_dir; /* where a command's files are linked or copied
                              (NULL: $TMPDIR or /tmp) */
};

/* One file of an item: path's bytes (taken when queued), or text. */
struct mg_upload_part {
    const char *name; /* relative to the destination: "checkpoints/ckpt-....mgc" */
    const char *path; /* a file, opened when queued and sent up to the size it had
                         then: removing it, renaming a new file over it or appending
                         to it later changes nothing (a command is given a link to
                         it, which shows what was appended) */
    const char *text; /* or this text (path NULL) */
};

struct mg_upload_stats {
    int queued;      /* items accepted */
    int copied;      /* items whose every file arrived */
    int failed;      /* items given up */
    int dropped;     /* items refused: the queue was full */
    int replaced;    /* items replaced in the queue by a newer copy of the same file */
    int pending;     /* items not sent when the sender stopped */
    int retries;     /* tries that failed and were tried again */
    long long bytes; /* of the files that arrived */
    char last_error[512];
    int nlist; /* not copied (failed, dropped, pending), up to MG_UPLOAD_LIST_MAX */
    char list[MG_UPLOAD_LIST_MAX][MG_UPLOAD_NAME_MAX];
};

struct mg_upload;

/* Checks the destination (an s3 destination without credentials, an unknown
 * scheme or libcurl missing are errors here, before any training) and
 * starts the sender thread. 0, or a negative code with the reason in err. */
int mg_upload_open(struct mg_upload **out, const struct mg_upload_config *cfg, char *err,
                   size_t errlen);

/* Queues an item of n parts and returns at once: 0; -ENOSPC when the queue
 * is full (counted as dropped); -errno when a file cannot be opened (nothing
 * queued). With replace, a waiting item whose first file has the same name
 * is replaced by this one (a newer snapshot of a growing metrics file). */
int mg_upload_queue(struct mg_upload *u, const struct mg_upload_part *parts, int n, int replace);

/* The counts so far. */
void mg_upload_stats(struct mg_upload *u, struct mg_upload_stats *st);

/* Waits up to wait_ms for the queue to empty (retries go on meanwhile), then
 * stops the sender (a transfer still running is given up), fills st and
 * frees u. Returns 0 when every item was copied, else -EIO. */
int mg_upload_close(struct mg_upload *u, int wait_ms, struct mg_upload_stats *st);

/* The destination without secrets, for messages (user:password@ removed). */
void mg_upload_describe(const char *dest, char *buf, size_t cap);
/* Whether dest is a destination mg_upload_open can take: s3://BUCKET[/PREFIX],
 * or http(s)://[USER[:PASSWORD]@]HOST[:PORT][/PATH] with a host (an IPv6
 * address in brackets, closed) and a port of 1 to 65535. 0, or -EINVAL with
 * err saying what is wrong (never the password). */
int mg_upload_check_dest(const char *dest, char *err, size_t errlen);

/* Fetches name from the destination (s3 or http(s); a command cannot fetch)
 * into path: written to a temporary name, synced, renamed. 0, -ENOENT when
 * the destination has no such file, -MG_EUNSUPPORTED for a command, or
 * another negative code; err says what. */
int mg_upload_fetch(const struct mg_upload_config *cfg, const char *name, const char *path,
                    char *err, size_t errlen);

#endif
