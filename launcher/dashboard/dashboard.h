/* mglaunch-dashboard: the program behind `mglaunch dashboard LOG_DIR`, a web
 * page over what runs leave in a log directory (docs/cli.md, "mglaunch
 * dashboard"). It is a program of its own, linked with libmicrohttpd, so that
 * mglaunch needs no HTTP library, starts no thread and opens no server socket:
 * mglaunch execs it. It reads the log directory with the code `mglaunch logs`
 * uses (the event log reader, the run listing, the root-cause renderer, the
 * plot).
 *
 * Threads: libmicrohttpd's one internal thread calls every handler, so the
 * run cache below needs no lock; the main thread only waits for a signal.
 *
 * What the page asks (all GET, JSON unless said):
 *   /                          the page (page.html, built in)
 *   /api/runs                  the runs, newest first, with their state
 *   /api/run?run=ID            its attempts and ranks, root cause, latest record
 *   /api/log?run&attempt&rank&stream&offset
 *                              at most DASH_LOG_CHUNK bytes of a rank's log from
 *                              offset (-1: the tail), text/plain; X-Log-Start,
 *                              X-Log-End and X-Log-Size say where they are
 *   /api/plot.svg?run=ID       the run's loss and accuracy (plot.c), with an ETag
 * Every read is bounded: a log request reads one chunk at an offset, the plot
 * reads only what the metrics files gained since the last request (at most
 * DASH_METRICS_STEP bytes a file a request), an event log is read again only
 * when it changed. */
#ifndef MG_DASHBOARD_H
#define MG_DASHBOARD_H

#include <limits.h>
#include <stddef.h>

#define DASH_LOG_CHUNK    (64 * 1024)
#define DASH_METRICS_STEP (4u << 20)
#define DASH_MAX_RUNS     256 /* runs kept in the cache (the oldest used go first) */
#define DASH_MAX_PLOTS    16  /* of them, with a plot */
#define DASH_TOKEN_MAX    128
#define DASH_DEFAULT_PORT 29600

struct dash {
    char dir[PATH_MAX];             /* the log directory */
    char token[DASH_TOKEN_MAX + 1]; /* "" when none is needed */
    int loopback;                   /* bound to a loopback address only */
    int port;
    struct dash_cache *cache;
};

enum dash_body {
    DASH_BODY_FREE,   /* malloc'd: the response frees it */
    DASH_BODY_STATIC, /* lives as long as the program */
    DASH_BODY_COPY,   /* the cache's: copied now, the next request may replace it */
};

/* A response: status, content type, body, and up to four extra headers. */
struct dash_resp {
    int status;
    const char *type;
    char *body;
    size_t len;
    enum dash_body body_static;
    const char *hdr_name[4];
    char hdr_value[4][64];
    int nhdr;
};

/* What a request carries that the handlers look at; NULL when absent. */
struct dash_req {
    const char *path;
    const char *(*arg)(void *ctx, const char *name);    /* a query argument */
    const char *(*header)(void *ctx, const char *name); /* a request header */
    void *ctx;
};

int dash_cache_new(struct dash_cache **out);
void dash_cache_free(struct dash_cache *c);

/* Answers one GET request (the token and the Host are checked first). */
void dash_handle(struct dash *d, const struct dash_req *rq, struct dash_resp *rs);

/* The page, built from page.html by the Makefile. */
extern const unsigned char mg_dash_page[];
extern const size_t mg_dash_page_len;

#endif
