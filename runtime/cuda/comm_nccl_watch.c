/* Watching the NCCL communicator's work: what the store knows about the
 * other ranks (who never started, who reported a failure, whose process is
 * gone), the waits for NCCL to take a call and for the device to finish it
 * against the deadline, and the broken state with its one message, which
 * goes to the store for the others (comm_nccl.c has the whole story). */
#include "comm_nccl_internal.h"
#include "cuda_kernels.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STORE_LOOK_MS 1000 /* how often a long wait asks the store about the others */
#define SPINS         2000 /* polls before the waits start sleeping */

void mgcu_nccl_key(const struct nccl_comm *n, char *buf, size_t len, const char *what, int rank)
{
    if (rank >= 0)
        snprintf(buf, len, "%s%s/%d", n->prefix, what, rank);
    else
        snprintf(buf, len, "%s%s", n->prefix, what);
}

/* "NCCL error 'unhandled cuda error ...' (ncclUnhandledCudaError): <last error>" */
void mgcu_nccl_text(ncclResult_t r, ncclComm_t nc, char *buf, size_t len)
{
    static const char *const names[] = {
        "ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
        "ncclInvalidArgument", "ncclInvalidUsage",       "ncclRemoteError", "ncclInProgress",
    };
    const char *last = ncclGetLastError(nc);
    snprintf(buf, len, "%s (%s)%s%s", ncclGetErrorString(r),
             (unsigned)r < sizeof(names) / sizeof(names[0]) ? names[r] : "?",
             last && *last ? ": " : "", last ? last : "");
}

/* ---- what the store knows about the other ranks --------------------------------------- */

/* The ranks that have a key under prefix+what/, as flags. -errno when the
 * store does not answer, -MG_ETOOBIG when it has more than one list holds. */
static int ranks_with(struct nccl_comm *n, const char *what, unsigned char *has)
{
    char pre[256], **keys = NULL;
    int nkeys = 0;
    snprintf(pre, sizeof(pre), "%s%s/", n->prefix, what);
    memset(has, 0, (size_t)n->c.world);
    int rc = mgcu_host->store_list(n->store, pre, -1, &keys, &nkeys);
    if (rc < 0)
        return rc;
    for (int i = 0; i < nkeys; i++) {
        int r = atoi(keys[i] + strlen(pre));
        if (r >= 0 && r < n->c.world)
            has[r] = 1;
    }
    mgcu_host->store_free_list(keys, nkeys);
    return rc > nkeys ? -MG_ETOOBIG : 0;
}

/* "rank 1", "ranks 2 and 5", "ranks 1, 2 and 7" for the flagged ranks (at most 8 named). */
static int name_ranks(const unsigned char *flag, int world, int self, char *buf, size_t len)
{
    int count = 0, shown = 0;
    size_t at = 0;
    for (int r = 0; r < world; r++)
        count += flag[r] && r != self;
    buf[0] = '\0';
    for (int r = 0; r < world && count; r++) {
        if (!flag[r] || r == self)
            continue;
        const char *sep = shown == 0                         ? (count == 1 ? "rank " : "ranks ")
                          : shown == count - 1 || shown == 7 ? " and "
                                                             : ", ";
        at += (size_t)snprintf(buf + at, at < len ? len - at : 0, "%s%d", sep, r);
        if (++shown == 8 && count > 8) {
            snprintf(buf + at, at < len ? len - at : 0, " (and %d more)", count - 8);
            break;
        }
    }
    return count;
}

/* "rank r failed: <what it put in the store>" into buf; 0 when it has no report. */
static int reported(struct nccl_comm *n, int r, char *buf, size_t len)
{
    char k[256];
    void *val = NULL;
    size_t vlen = 0;
    mgcu_nccl_key(n, k, sizeof(k), "fail", r);
    if (mgcu_host->store_get(n->store, k, &val, &vlen, 0) != 0)
        return 0;
    snprintf(buf, len, "rank %d failed: %.*s", r, (int)(vlen < 300 ? vlen : 300),
             (const char *)val);
    free(val);
    return 1;
}

/* What the store says about the other ranks. */
enum news {
    NEWS_NONE,        /* nothing useful */
    NEWS_ALIVE,       /* every rank is up and connected: one is hung or slow */
    NEWS_NOT_STARTED, /* some ranks never started the communicator */
    NEWS_DEAD,        /* some ranks' store connections closed: their processes are gone */
    NEWS_FAILED,      /* a rank reported a failure */
    NEWS_NO_STORE,    /* the store does not answer */
};

/* The news, and a clause for messages in buf. A rank whose process is gone
 * is the root cause, so it comes first ("waiting for rank 2 (the process is
 * gone: ...)", or what it reported before it went: "rank 2 failed: ..."),
 * then a rank that reported a failure, then ranks that never started. */
static enum news ask_store(struct nccl_comm *n, char *buf, size_t len)
{
    int world = n->c.world, self = n->c.rank, rc;
    enum news news = NEWS_NONE;
    unsigned char *fail = calloc((size_t)world, 4), *up = fail + world, *alive = up + world;
    unsigned char *flag = alive + world;
    char names[200];
    buf[0] = '\0';
    if (!fail)
        return NEWS_NONE;
    rc = ranks_with(n, "fail", fail);
    if (rc == -MG_ETOOBIG)
        goto out; /* more ranks than a list holds: nothing certain to say */
    if (rc < 0) {
        snprintf(buf, len, "the store does not answer (%s)%s", mgcu_nccl_why(rc),
                 self ? ": rank 0, which hosts it, may have died" : "");
        news = NEWS_NO_STORE;
        goto out;
    }
    if (ranks_with(n, "up", up) < 0 || ranks_with(n, "alive", alive) < 0)
        goto out;
    for (int r = 0; r < world; r++)
        flag[r] = up[r] && !alive[r];
    for (int r = 0; r < world; r++)
        if (flag[r] && fail[r] && r != self && reported(n, r, buf, len)) {
            news = NEWS_FAILED;
            goto out;
        }
    if (name_ranks(flag, world, self, names, sizeof(names))) {
        snprintf(buf, len, "waiting for %s (the process is gone: its store connection closed)",
                 names);
        news = NEWS_DEAD;
        goto out;
    }
    for (int r = 0; r < world; r++)
        if (fail[r] && r != self && reported(n, r, buf, len)) {
            news = NEWS_FAILED;
            goto out;
        }
    for (int r = 0; r < world; r++)
        flag[r] = !up[r];
    if (name_ranks(flag, world, self, names, sizeof(names))) {
        snprintf(buf, len, "waiting for %s, which %s not started the communicator", names,
                 strchr(names, ',') || strstr(names, " and ") ? "have" : "has");
        news = NEWS_NOT_STARTED;
    } else {
        snprintf(buf, len, "every rank is alive: one is hung or slow; see its log");
        news = NEWS_ALIVE;
    }
out:
    free(fail);
    return news;
}

/* The news as the end of a message after "timed out after 30 s" or an error. */
static void news_suffix(enum news news, const char *clause, char *buf, size_t len)
{
    switch (news) {
    case NEWS_DEAD:
    case NEWS_NOT_STARTED:
        snprintf(buf, len, " %s", clause);
        break;
    case NEWS_FAILED:
    case NEWS_NO_STORE:
        snprintf(buf, len, "; %s", clause);
        break;
    case NEWS_ALIVE:
        snprintf(buf, len, " (%s)", clause);
        break;
    default:
        buf[0] = '\0';
    }
}

/* Whether waiting longer is pointless. */
static int news_final(enum news news)
{
    return news == NEWS_DEAD || news == NEWS_FAILED || news == NEWS_NO_STORE;
}

/* The communicator is broken from now on: abort NCCL, keep the message, tell
 * the others through the store. Returns code. */
int mgcu_nccl_broken(struct nccl_comm *n, int code, const char *fmt, ...)
{
    struct mg_comm *c = &n->c;
    char k[256];
    va_list ap;
    if (n->nc) {
        ncclCommAbort(n->nc);
        n->nc = NULL;
    }
    if (c->failed)
        return c->failed_code;
    va_start(ap, fmt);
    vsnprintf(c->errmsg, sizeof(c->errmsg), fmt, ap);
    va_end(ap);
    c->failed = 1;
    c->failed_code = code;
    mgcu_nccl_key(n, k, sizeof(k), "fail", c->rank);
    mgcu_host->store_set(n->store, k, c->errmsg, strlen(c->errmsg), 0);
    return code;
}

/* ---- waiting ------------------------------------------------------------------------------ */

void mgcu_nccl_wait_begin(struct waiter *w, int timeout_ms)
{
    w->start = mgcu_now_ms();
    w->deadline = w->start + timeout_ms;
    w->next_look = w->start + STORE_LOOK_MS;
    w->spins = 0;
    w->timeout_ms = timeout_ms;
}

/* Between two polls: spin for the first couple of milliseconds (most
 * collectives are done by then, and a sleep costs 50 us of timer slack at
 * least), then sleep longer and longer, up to a millisecond. Past the
 * deadline returns -ETIMEDOUT, and when the store says a rank failed or died
 * -MG_EPEER, with the end of the message in out ("timed out after 30 s
 * waiting for rank 2 (...)"); else 0. */
int mgcu_nccl_wait_tick(struct nccl_comm *n, struct waiter *w, char *out, size_t len)
{
    char clause[400], suffix[420];
    int64_t t = mgcu_now_ms();
    if (t >= w->deadline) {
        enum news news = ask_store(n, clause, sizeof(clause));
        news_suffix(news, clause, suffix, sizeof(suffix));
        snprintf(out, len, "timed out after %g s%s", w->timeout_ms / 1000.0, suffix);
        return -ETIMEDOUT;
    }
    if (t >= w->next_look) {
        w->next_look = t + STORE_LOOK_MS;
        enum news news = ask_store(n, clause, sizeof(clause));
        if (news_final(news)) {
            snprintf(out, len, "%s%s", news == NEWS_DEAD ? "stopped " : "", clause);
            return -MG_EPEER;
        }
    }
    if (++w->spins > SPINS)
        mgcu_nap_us(w->spins - SPINS > 1000 ? 1000 : w->spins - SPINS);
    return 0;
}

/* The end of a message after NCCL's own error: what the store knows. NCCL
 * may see a peer's socket close before the store has dropped that peer's
 * connection: the store is asked again for a second or two before settling
 * for less. */
static void error_news(struct nccl_comm *n, char *buf, size_t len)
{
    char clause[400];
    enum news news = ask_store(n, clause, sizeof(clause));
    for (int i = 0; i < 20 && !news_final(news); i++) {
        mgcu_nap_us(100000);
        news = ask_store(n, clause, sizeof(clause));
    }
    news_suffix(news == NEWS_ALIVE ? NEWS_NONE : news, clause, buf, len);
}

/* Waits until the non-blocking communicator has taken the call (NCCL may
 * still be queueing it: its own thread, which the host waits for, not the
 * device), then queues the AVG divide behind it. */
int mgcu_nccl_taken(struct nccl_comm *n, const char *what, struct waiter *wt, ncclResult_t issued,
                    float *avg, size_t avg_count)
{
    char text[MG_ERRMSG_LEN], news[440];
    ncclResult_t a = issued;
    int rc;
    if (issued != ncclSuccess && issued != ncclInProgress) {
        mgcu_nccl_text(issued, n->nc, text, sizeof(text));
        return mgcu_nccl_broken(n, -EIO, "%s: %s", what, text);
    }
    for (;;) {
        if (ncclCommGetAsyncError(n->nc, &a) != ncclSuccess)
            a = ncclInternalError;
        if (a == ncclSuccess)
            break;
        if (a != ncclInProgress) {
            mgcu_nccl_text(a, n->nc, text, sizeof(text));
            error_news(n, news, sizeof(news));
            return mgcu_nccl_broken(n, a == ncclRemoteError ? -MG_EPEER : -EIO, "%s: %s%s", what,
                                    text, news);
        }
        if ((rc = mgcu_nccl_wait_tick(n, wt, news, sizeof(news))) < 0)
            return mgcu_nccl_broken(n, rc, "%s: %s", what, news);
    }
    if (avg) {
        struct mgk_cfg cfg = {.stream = n->stream};
        int k = mgk_div(&cfg, avg, (float)n->c.world, avg_count);
        if (k)
            return mgcu_nccl_broken(n, -EIO, "%s: the average's divide kernel: %s", what,
                                    cudaGetErrorString((cudaError_t)k));
    }
    return 0;
}

/* Waits until the device has done the stream's work up to ev (everything
 * queued so far when ev is NULL), watching NCCL's errors and the deadline. */
int mgcu_nccl_drained(struct nccl_comm *n, const char *what, struct waiter *wt, cudaEvent_t ev)
{
    char text[MG_ERRMSG_LEN], news[440];
    ncclResult_t a;
    int rc;
    for (;;) {
        cudaError_t st = ev ? cudaEventQuery(ev) : cudaStreamQuery(n->stream);
        if (st == cudaSuccess) {
            if (!ev)
                n->nq = 0; /* the queued ones are done too */
            return 0;
        }
        if (st != cudaErrorNotReady)
            return mgcu_nccl_broken(n, mgcu_cuda_code(st), "%s: %s (%s)", what,
                                    cudaGetErrorString(st), cudaGetErrorName(st));
        if (ncclCommGetAsyncError(n->nc, &a) == ncclSuccess && a != ncclSuccess &&
            a != ncclInProgress) {
            mgcu_nccl_text(a, n->nc, text, sizeof(text));
            error_news(n, news, sizeof(news));
            return mgcu_nccl_broken(n, a == ncclRemoteError ? -MG_EPEER : -EIO, "%s: %s%s", what,
                                    text, news);
        }
        if ((rc = mgcu_nccl_wait_tick(n, wt, news, sizeof(news))) < 0)
            return mgcu_nccl_broken(n, rc, "%s: %s", what, news);
    }
}

/* A collective, waited for: taken, then done on the device. */
int mgcu_nccl_finish(struct nccl_comm *n, const char *what, int timeout_ms, ncclResult_t issued,
                     float *avg, size_t avg_count)
{
    struct waiter w;
    mgcu_nccl_wait_begin(&w, timeout_ms);
    int rc = mgcu_nccl_taken(n, what, &w, issued, avg, avg_count);
    return rc ? rc : mgcu_nccl_drained(n, what, &w, NULL);
}

/* Before a collective: this thread on the communicator's device, and the
 * stream behind the compute work it needs (comm.h). */
int mgcu_nccl_prepare(struct nccl_comm *n, const char *what)
{
    struct mgcu_err e = {0};
    if (CU_FAILED(&e, cudaSetDevice(n->device)))
        return mgcu_nccl_broken(n, e.code, "%s: %s", what, e.msg);
    if (n->pending) {
        cudaEvent_t ev = n->pending;
        n->pending = NULL;
        if (CU_FAILED(&e, cudaStreamWaitEvent(n->stream, ev, 0)))
            return mgcu_nccl_broken(n, e.code, "%s: %s", what, e.msg);
        return 0;
    }
    if (CU_FAILED(&e, cudaEventRecord(n->order, n->wait_on)) ||
        CU_FAILED(&e, cudaStreamWaitEvent(n->stream, n->order, 0)))
        return mgcu_nccl_broken(n, e.code, "%s: %s", what, e.msg);
    return 0;
}
