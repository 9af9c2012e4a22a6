/* The workers' output on its way out, and the keyboard's way in (see
 * agent_internal.h): each pipe or pseudo-terminal read as it comes, into
 * the worker's log file, its stderr tail (for the root cause) and, for the
 * ranks shown, the console: whole lines with their prefix from a pipe, bytes
 * as they come from a pseudo-terminal (a prompt has no newline), the two kept
 * apart on the screen; tee'd lines that match --duplicate-std*-filters into
 * the attempt's filtered_std*.log. And the loop's poller over all of it. */
#include "agent_internal.h"
#include "net.h"
#include "summary.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

/* ---- the console ---------------------------------------------------------------------- */

static void console_flush(struct console *c)
{
    size_t off = 0;
    while (off < c->len && !c->broken) {
        ssize_t n = write(c->fd, c->buf + off, c->len - off);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) { /* someone made our stdout non-blocking */
            struct pollfd p = {.fd = c->fd, .events = POLLOUT};
            poll(&p, 1, 1000);
            continue;
        }
        c->broken = 1; /* EPIPE and friends: stop writing to the console */
    }
    c->len = 0;
}

static void console_put(struct console *c, const char *a, size_t n)
{
    if (c->broken || !c->buf)
        return;
    while (n) {
        if (c->len == CONSOLE_BUF)
            console_flush(c);
        size_t k = CONSOLE_BUF - c->len;
        if (k > n)
            k = n;
        memcpy(c->buf + c->len, a, k);
        c->len += k;
        a += k;
        n -= k;
    }
}

void mg_workers_flush(struct mg_agent *ag)
{
    console_flush(&ag->con[0]);
    console_flush(&ag->con[1]);
}

void mg_agent_note(struct mg_agent *ag, const char *fmt, ...)
{
    va_list ap;
    if (!ag->cfg.status)
        return;
    mg_workers_flush(ag);
    fputs("mglaunch: ", ag->cfg.status);
    va_start(ap, fmt);
    vfprintf(ag->cfg.status, fmt, ap);
    va_end(ap);
    fputc('\n', ag->cfg.status);
    fflush(ag->cfg.status);
}

/* ---- output ------------------------------------------------------------------------- */

struct line_ctx {
    struct mg_agent *ag;
    struct worker *w;
    struct stream *s;
};

/* Another worker's line is about to reach the console while a worker on a
 * pseudo-terminal shows a line in progress (a debugger's prompt): take it
 * off the screen first, so the line does not land behind the prompt... */
static void pending_hide(struct mg_agent *ag)
{
    struct console *pc = &ag->con[ag->pend.s->console];
    console_put(pc, ag->pend.erase ? "\r\033[K" : "\n", ag->pend.erase ? 4 : 1);
    console_flush(pc);
}

/* ...and put it back after. */
static void pending_show(struct mg_agent *ag, struct console *con)
{
    struct console *pc = &ag->con[ag->pend.s->console];
    console_flush(con);
    if (ag->pend.s->prefixed)
        console_put(pc, ag->pend.w->prefix, ag->pend.w->prefix_len);
    console_put(pc, ag->pend.buf, ag->pend.len);
    console_flush(pc);
}

/* --duplicate-std*-filters (torchrun 2.x): a tee'd line that contains one of
 * the filters also goes, prefixed, to the attempt's filtered_std*.log. */
static void duplicate_line(struct mg_agent *ag, int k, const struct worker *w, const char *text,
                           size_t len)
{
    const char *f;
    int hit = 0;
    for (int i = 0; !hit && (f = mg_opts_dup_filter(ag->o, k, i)); i++)
        hit = *f == '\0' || memmem(text, len, f, strlen(f)) != NULL;
    if (!hit)
        return;
    struct iovec v[3] = {{(void *)w->prefix, w->prefix_len}, {(void *)text, len}, {"\n", 1}};
    if (writev(ag->filt_fd[k], v, 3) < 0) {
        mg_agent_note(ag, "warning: cannot write %s: %s; it stops here",
                      k ? "filtered_stderr.log" : "filtered_stdout.log", strerror(errno));
        close(ag->filt_fd[k]);
        ag->filt_fd[k] = -1;
    }
}

static void on_line(void *vctx, const char *text, size_t len, enum mg_line_end end)
{
    struct line_ctx *c = vctx;
    struct console *con = &c->ag->con[c->s->console];
    if (end == MG_LINE_CRLF) {
        /* Ends this stream's '\r' line, unless another stream wrote since: then
         * its line already moved on, and an empty line would only add noise. */
        if (con->last == c->s)
            console_put(con, "\n", 1);
        con->last = NULL;
        return;
    }
    int pending = c->ag->pend.s && c->ag->pend.s != c->s;
    if (pending)
        pending_hide(c->ag);
    con->last = c->s;
    if (c->s->prefixed)
        console_put(con, c->w->prefix, c->w->prefix_len);
    console_put(con, text, len);
    console_put(con, end == MG_LINE_CR ? "\r" : "\n", 1);
    if (pending)
        pending_show(c->ag, con);
    int k = c->s == &c->w->out ? 0 : 1;
    if (c->s->tee && c->ag->filt_fd[k] >= 0)
        duplicate_line(c->ag, k, c->w, text, len);
}

static void tail_add(struct worker *w, const char *p, size_t n)
{
    if (!w->tail && !(w->tail = malloc(MG_STDERR_TAIL_BYTES)))
        return;
    if (n >= MG_STDERR_TAIL_BYTES) {
        memcpy(w->tail, p + n - MG_STDERR_TAIL_BYTES, MG_STDERR_TAIL_BYTES);
        w->tail_len = MG_STDERR_TAIL_BYTES;
        w->tail_cut = 1;
        return;
    }
    if (w->tail_len + n > MG_STDERR_TAIL_BYTES) {
        size_t drop = w->tail_len + n - MG_STDERR_TAIL_BYTES;
        memmove(w->tail, w->tail + drop, w->tail_len - drop);
        w->tail_len -= drop;
        w->tail_cut = 1;
    }
    memcpy(w->tail + w->tail_len, p, n);
    w->tail_len += n;
}

static void close_stream(struct mg_agent *ag, struct worker *w, struct stream *s)
{
    if (s->fd < 0)
        return;
    if (ag->pend.s == s)
        ag->pend.s = NULL;
    if (s->console != CON_NONE) {
        struct line_ctx c = {ag, w, s};
        mg_linebuf_flush(&s->lb, on_line, &c);
    }
    mg_linebuf_release(&s->lb);
    close(s->fd);
    s->fd = -1;
    ag->open_pipes--;
}

/* A pseudo-terminal's output goes to the console as it comes, partial lines
 * included (a debugger's prompt has no newline), with the prefix at the
 * start of each line when the stream is prefixed. */
static void pty_to_console(struct mg_agent *ag, struct worker *w, struct stream *s, const char *p,
                           size_t n)
{
    struct console *con = &ag->con[s->console];
    con->last = s;
    while (n) {
        const char *nl = memchr(p, '\n', n);
        size_t k = nl ? (size_t)(nl - p) + 1 : n;
        if (s->at_line_start && s->prefixed)
            console_put(con, w->prefix, w->prefix_len);
        console_put(con, p, k);
        s->at_line_start = p[k - 1] == '\n';
        /* the line in progress, for pending_show (its last bytes when long) */
        if (ag->pend.s != s || s->at_line_start)
            ag->pend.len = 0;
        if (!s->at_line_start) {
            size_t add = k, cap = sizeof(ag->pend.buf);
            const char *from = p;
            if (add > cap) {
                from += add - cap;
                add = cap;
            }
            if (ag->pend.len + add > cap) {
                size_t drop = ag->pend.len + add - cap;
                memmove(ag->pend.buf, ag->pend.buf + drop, ag->pend.len - drop);
                ag->pend.len -= drop;
            }
            memcpy(ag->pend.buf + ag->pend.len, from, add);
            ag->pend.len += add;
        }
        p += k;
        n -= k;
    }
    ag->pend.s = s->at_line_start ? NULL : s;
    ag->pend.w = w;
    ag->pend.erase = isatty(con->fd);
}

/* Reads one chunk; returns bytes read, 0 at EOF (stream closed), -1 when none ready. */
static ssize_t read_stream(struct mg_agent *ag, struct worker *w, struct stream *s, int is_err)
{
    ssize_t n = read(s->fd, ag->rbuf, READ_CHUNK);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return -1;
    if (n < 0 && errno == EIO && s->pty)
        n = 0; /* a pseudo-terminal whose every slave is closed: the end */
    if (n <= 0) {
        close_stream(ag, w, s);
        return 0;
    }
    int wrc = s->file_fd >= 0 ? mg_write_full(s->file_fd, ag->rbuf, (size_t)n, -1) : 0;
    if (wrc < 0) {
        mg_agent_note(ag, "warning: cannot write the log of local rank %d (%s): %s; it stops here",
                      w->local_rank, is_err ? "stderr" : "stdout", strerror(-wrc));
        s->file_errno = -wrc;
        close(s->file_fd);
        s->file_fd = -1;
    }
    if (is_err)
        tail_add(w, ag->rbuf, (size_t)n);
    if (s->console != CON_NONE && s->pty) {
        pty_to_console(ag, w, s, ag->rbuf, (size_t)n);
    } else if (s->console != CON_NONE) {
        struct line_ctx c = {ag, w, s};
        mg_linebuf_feed(&s->lb, ag->rbuf, (size_t)n, on_line, &c);
    }
    return n;
}

/* Whatever is still in the pipes (their writers are dead or escaped). */
void mg_workers_drain(struct mg_agent *ag)
{
    for (int i = 0; i < ag->nproc; i++) {
        struct worker *w = &ag->w[i];
        for (int k = 0; k < 64 && w->out.fd >= 0 && read_stream(ag, w, &w->out, 0) > 0; k++)
            ;
        for (int k = 0; k < 64 && w->err.fd >= 0 && read_stream(ag, w, &w->err, 1) > 0; k++)
            ;
        close_stream(ag, w, &w->out);
        close_stream(ag, w, &w->err);
    }
    mg_workers_flush(ag);
}

/* ---- the pipes in the loop -------------------------------------------------------------- */

/* The worker the keyboard goes to: the lowest local rank on a
 * pseudo-terminal that still runs; NULL when none (or mglaunch is not in
 * the foreground of its terminal: reading it would stop mglaunch). */
static struct worker *input_target(struct mg_agent *ag)
{
    if (ag->tty.fd < 0 || !ag->tty.raw)
        return NULL;
    for (int i = 0; i < ag->nproc; i++) {
        struct worker *w = &ag->w[i];
        if (w->has_pty && w->outcome == W_RUNNING && w->out.fd >= 0)
            return mg_tty_is_foreground(ag->tty.fd) ? w : NULL;
    }
    return NULL;
}

/* Keyboard input to the worker's terminal, as it comes (its own line
 * discipline edits and echoes it). What does not fit is dropped: a terminal
 * can lose typed-ahead bytes the same way. */
static void forward_input(struct mg_agent *ag)
{
    char buf[4096];
    struct worker *w = input_target(ag);
    ssize_t n = read(ag->tty.fd, buf, sizeof(buf));
    if (n <= 0 || !w)
        return;
    ssize_t k = write(w->out.fd, buf, (size_t)n);
    (void)k;
}

int mg_workers_on_pty(const struct mg_agent *ag)
{
    for (int i = 0; i < ag->nproc; i++)
        if (ag->w[i].has_pty && ag->w[i].outcome == W_RUNNING)
            return 1;
    return 0;
}

void mg_workers_resize(struct mg_agent *ag)
{
    for (int i = 0; i < ag->nproc; i++) {
        struct worker *w = &ag->w[i];
        if (!w->has_pty)
            continue;
        if (w->out.fd >= 0)
            mg_pty_copy_size(ag->tty.fd, w->out.fd);
        if (w->err.fd >= 0)
            mg_pty_copy_size(ag->tty.fd, w->err.fd);
    }
}

int mg_workers_fill(void *ctx, struct pollfd *fds, int max)
{
    struct mg_agent *ag = ctx;
    int n = 0;
    if (ag->state != ST_RUNNING)
        return 0;
    if (ag->open_pipes + 1 > max)
        return -ENOSPC;
    if (input_target(ag)) {
        fds[n].fd = ag->tty.fd;
        fds[n].events = POLLIN;
        ag->pipe_owner[n++] = -1;
    }
    for (int i = 0; i < ag->nproc; i++) {
        struct worker *w = &ag->w[i];
        if (w->out.fd >= 0) {
            fds[n].fd = w->out.fd;
            fds[n].events = POLLIN;
            ag->pipe_owner[n++] = i * 2;
        }
        if (w->err.fd >= 0) {
            fds[n].fd = w->err.fd;
            fds[n].events = POLLIN;
            ag->pipe_owner[n++] = i * 2 + 1;
        }
    }
    return n;
}

int mg_workers_process(void *ctx, const struct pollfd *fds, int n)
{
    struct mg_agent *ag = ctx;
    for (int i = 0; i < n; i++) {
        int own = ag->pipe_owner[i];
        if (!fds[i].revents)
            continue;
        if (own < 0) {
            forward_input(ag);
            continue;
        }
        struct worker *w = &ag->w[own / 2];
        struct stream *s = own % 2 ? &w->err : &w->out;
        if (s->fd == fds[i].fd)
            read_stream(ag, w, s, own % 2);
    }
    mg_workers_flush(ag);
    return 0;
}
