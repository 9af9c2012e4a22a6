/* `mglaunch logs` with a content selector: the lines of the selected log
 * files, printed, tailed, grepped, or followed as the run goes on (see
 * logs_internal.h, docs/cli.md "mglaunch logs"). */
#include "logs_internal.h"
#include "fs.h"
#include "mg_err.h"

#include <errno.h>
#include <fcntl.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define LINE_CAP       (64 * 1024) /* longest log line handled in one piece */
#define FOLLOW_POLL_MS 100

struct lreader {
    int fd;
    char *buf;
    size_t start, end;
    int eof;
};

/* Next line (without its '\n'); a line longer than LINE_CAP comes in pieces. */
static int lr_next(struct lreader *lr, const char **line, size_t *len)
{
    for (;;) {
        char *nl = memchr(lr->buf + lr->start, '\n', lr->end - lr->start);
        if (nl) {
            *line = lr->buf + lr->start;
            *len = (size_t)(nl - *line);
            lr->start += *len + 1;
            return 1;
        }
        if (lr->end - lr->start == LINE_CAP || (lr->eof && lr->end > lr->start)) {
            *line = lr->buf + lr->start;
            *len = lr->end - lr->start;
            lr->start = lr->end;
            return 1;
        }
        if (lr->eof)
            return 0;
        memmove(lr->buf, lr->buf + lr->start, lr->end - lr->start);
        lr->end -= lr->start;
        lr->start = 0;
        ssize_t r = read(lr->fd, lr->buf + lr->end, LINE_CAP - lr->end);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            lr->eof = 1;
        else
            lr->end += (size_t)r;
    }
}

static int matches(const regex_t *re, const char *line, size_t len)
{
    if (!re)
        return 1;
    char stackbuf[1024];
    char *s = len < sizeof(stackbuf) ? stackbuf : malloc(len + 1);
    if (!s)
        return 0;
    memcpy(s, line, len);
    s[len] = '\0';
    int m = regexec(re, s, 0, NULL, 0) == 0;
    if (s != stackbuf)
        free(s);
    return m;
}

/* Byte offset where the last n lines of fd begin (scanning back from its end). */
static off_t tail_offset(int fd, long n)
{
    char buf[8192];
    off_t end = lseek(fd, 0, SEEK_END), pos = end;
    long seen = 0;
    if (end <= 0 || n <= 0)
        return end < 0 ? 0 : end;
    /* A final line end does not start a line. */
    if (pread(fd, buf, 1, end - 1) == 1 && buf[0] == '\n')
        pos = end - 1;
    while (pos > 0) {
        size_t k = pos > (off_t)sizeof(buf) ? sizeof(buf) : (size_t)pos;
        if (pread(fd, buf, k, pos - (off_t)k) != (ssize_t)k)
            return 0;
        for (size_t i = k; i > 0; i--)
            if (buf[i - 1] == '\n' && ++seen == n)
                return pos - (off_t)k + (off_t)i;
        pos -= (off_t)k;
    }
    return 0;
}

/* Prints the selected lines of one file; returns the offset read up to. */
static off_t print_file(FILE *out, const char *path, const char *prefix, long tail,
                        const regex_t *re)
{
    struct lreader lr = {.fd = mg_open_regular(path)};
    const char *line;
    size_t len;
    long skip = 0;
    if (lr.fd < 0)
        return -1;
    lr.buf = malloc(LINE_CAP);
    if (!lr.buf) {
        close(lr.fd);
        return -1;
    }
    if (tail >= 0 && !re) {
        lseek(lr.fd, tail_offset(lr.fd, tail), SEEK_SET);
        if (tail == 0)
            lseek(lr.fd, 0, SEEK_END);
    } else if (tail >= 0) {
        long total = 0; /* two passes: count the matches, then print the last ones */
        while (lr_next(&lr, &line, &len))
            total += matches(re, line, len);
        skip = total > tail ? total - tail : 0;
        lseek(lr.fd, 0, SEEK_SET);
        lr.start = lr.end = 0;
        lr.eof = 0;
    }
    while (lr_next(&lr, &line, &len)) {
        if (!matches(re, line, len))
            continue;
        if (skip > 0) {
            skip--;
            continue;
        }
        fprintf(out, "%s%.*s\n", prefix, (int)len, line);
    }
    off_t at = lseek(lr.fd, 0, SEEK_CUR) - (off_t)(lr.end - lr.start);
    free(lr.buf);
    close(lr.fd);
    return at;
}

struct sel_file {
    char path[PATH_MAX + 64];
    char prefix[96];
    int attempt;
    off_t pos;
    char *partial; /* follow: a line without its end yet */
    size_t plen;
};

/* The files selected, of one attempt or of all. */
struct selection {
    struct sel_file *f;
    int n, cap;
};

/* The local ranks of attempt a that --rank selects (global ranks). */
static int rank_selected(const struct logs_opts *lo, const struct lworker *w)
{
    if (!lo->nranks)
        return 1;
    for (int i = 0; i < lo->nranks; i++)
        if (lo->ranks[i] == w->rank)
            return 1;
    return 0;
}

static int collect_files(const struct logs_opts *lo, const struct lrun *r, int attempt,
                         struct selection *sel, int many_attempts)
{
    const struct lattempt *a = NULL;
    for (int i = 0; i < r->na; i++)
        if (r->a[i].attempt == attempt)
            a = &r->a[i];
    if (!a)
        return -ENOENT;
    for (int k = 0; k < a->nw; k++) {
        const struct lworker *w = &a->w[k];
        if (!rank_selected(lo, w))
            continue;
        for (int s = 1; s <= 2; s++) {
            if (!(lo->streams & s))
                continue;
            if (sel->n == sel->cap) {
                int ncap = sel->cap ? sel->cap * 2 : 16;
                struct sel_file *v = realloc(sel->f, (size_t)ncap * sizeof(*v));
                if (!v)
                    return -ENOMEM;
                sel->f = v;
                sel->cap = ncap;
            }
            struct sel_file *f = &sel->f[sel->n++];
            memset(f, 0, sizeof(*f));
            f->attempt = attempt;
            mg_fmt(f->path, sizeof(f->path), "%s/attempt_%d/%d/%s", r->dir, attempt, w->local_rank,
                   s == 1 ? "stdout.log" : "stderr.log");
            if (many_attempts)
                mg_fmt(f->prefix, sizeof(f->prefix), "[attempt_%d %d:%s] ", attempt, w->local_rank,
                       s == 1 ? "out" : "err");
            else
                mg_fmt(f->prefix, sizeof(f->prefix), "[%d:%s] ", w->local_rank,
                       s == 1 ? "out" : "err");
        }
    }
    return 0;
}

/* Logs not saved: the stderr tails the launcher kept of the selected failed
 * ranks (the event log's worker_logs), each line marked as such. Returns
 * how many ranks had one. */
static int print_kept_tails(FILE *out, const struct logs_opts *lo, const struct lrun *r,
                            int attempt, const regex_t *re)
{
    int shown = 0;
    if (!(lo->streams & 2))
        return 0;
    for (int i = 0; i < r->na; i++) {
        const struct lattempt *a = &r->a[i];
        if (attempt != -2 && a->attempt != attempt)
            continue;
        for (int k = 0; k < a->nw; k++) {
            const struct lworker *w = &a->w[k];
            if (!rank_selected(lo, w) || !w->stderr_tail)
                continue;
            shown++;
            for (const char *p = w->stderr_tail; *p;) {
                size_t n = strcspn(p, "\n");
                if (matches(re, p, n))
                    fprintf(out, "[attempt_%d %d:err, kept] %.*s\n", a->attempt, w->local_rank,
                            (int)n, p);
                p += n + (p[n] == '\n');
            }
        }
    }
    return shown;
}

/* New complete lines of a followed file. */
static void follow_read(FILE *out, struct sel_file *f, const regex_t *re, int final)
{
    char buf[16384];
    int fd = mg_open_regular(f->path);
    if (fd < 0)
        return;
    if (!f->partial && !(f->partial = malloc(LINE_CAP))) {
        close(fd);
        return;
    }
    for (;;) {
        ssize_t n = pread(fd, buf, sizeof(buf), f->pos);
        if (n <= 0)
            break;
        f->pos += n;
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] == '\n' || f->plen == LINE_CAP) {
                if (matches(re, f->partial, f->plen))
                    fprintf(out, "%s%.*s\n", f->prefix, (int)f->plen, f->partial);
                f->plen = 0;
                if (buf[i] == '\n')
                    continue;
            }
            f->partial[f->plen++] = buf[i];
        }
    }
    close(fd);
    if (final && f->plen) {
        if (matches(re, f->partial, f->plen))
            fprintf(out, "%s%.*s\n", f->prefix, (int)f->plen, f->partial);
        f->plen = 0;
    }
}

/* New lines as they come; a new attempt is followed too, unless --attempt
 * pinned one; until the run ends or its launcher is gone. */
static void follow(FILE *out, const struct logs_opts *lo, const char *dir, const char *id,
                   int attempt, struct selection *sel, const regex_t *re)
{
    for (;;) {
        struct timespec ts = {0, FOLLOW_POLL_MS * 1000000L};
        nanosleep(&ts, NULL);
        struct lrun now;
        memset(&now, 0, sizeof(now));
        int ended = mg_logs_load_run(&now, dir, id) != 0 || now.ended || !now.alive;
        for (int i = 0; i < sel->n; i++)
            follow_read(out, &sel->f[i], re, 0);
        if (!lo->attempt_given && now.na && now.a[now.na - 1].attempt != attempt) {
            for (int i = 0; i < sel->n; i++) {
                follow_read(out, &sel->f[i], re, 1);
                free(sel->f[i].partial);
            }
            sel->n = 0;
            attempt = now.a[now.na - 1].attempt;
            fprintf(out, "==> attempt_%d <==\n", attempt);
            collect_files(lo, &now, attempt, sel, 0);
            for (int i = 0; i < sel->n; i++) {
                if (sel->n == 1)
                    sel->f[i].prefix[0] = '\0';
                follow_read(out, &sel->f[i], re, 0);
            }
        }
        fflush(out);
        mg_logs_run_free(&now);
        if (ended) {
            for (int i = 0; i < sel->n; i++)
                follow_read(out, &sel->f[i], re, 1);
            break;
        }
    }
}

int mg_logs_content(FILE *out, const struct logs_opts *lo, const char *dir, char *err, size_t cap)
{
    struct lrun r;
    struct run_ent *runs = NULL;
    struct selection sel = {0};
    int rc, n = 0;
    regex_t re;
    const regex_t *rep = NULL;
    const char *id = lo->run;

    memset(&r, 0, sizeof(r));
    if (lo->grep) {
        int e = regcomp(&re, lo->grep, REG_EXTENDED | REG_NOSUB);
        if (e) {
            char msg[128];
            regerror(e, &re, msg, sizeof(msg));
            mg_fmt(err, cap, "invalid value '%s' for --grep: %s", lo->grep, msg);
            return -EINVAL;
        }
        rep = &re;
    }
    char given[256];
    if (!id) { /* the latest run */
        if ((rc = mg_logs_runs_matching(dir, lo, &runs, &n, err, cap)))
            goto out;
        id = runs[n - 1].id;
    } else {
        id = mg_logs_resolve_run(dir, id, given, sizeof(given));
    }
    if ((rc = mg_logs_load_run(&r, dir, id))) {
        mg_fmt(err, cap, "no run '%s' in '%s'", id, dir);
        goto out;
    }
    if (r.na == 0) {
        mg_fmt(err, cap, "run '%s' has no attempts yet", id);
        rc = -ENOENT;
        goto out;
    }
    int attempt = lo->attempt >= 0 ? lo->attempt : r.a[r.na - 1].attempt;
    if (lo->attempt == -2) {
        for (int i = 0; i < r.na && !rc; i++)
            rc = collect_files(lo, &r, r.a[i].attempt, &sel, 1);
    } else {
        rc = collect_files(lo, &r, attempt, &sel, 0);
        if (rc == -ENOENT)
            mg_fmt(err, cap, "no attempt %d in run '%s'", attempt, id);
    }
    if (rc)
        goto out;
    int present = 0;
    for (int i = 0; i < sel.n; i++)
        present += access(sel.f[i].path, R_OK) == 0;
    if (sel.n && present == 0 && !lo->follow &&
        print_kept_tails(out, lo, &r, lo->attempt == -2 ? -2 : attempt, rep) > 0)
        goto out; /* what there is of them */
    if (sel.n == 0 || (present == 0 && !lo->follow)) {
        mg_fmt(err, cap,
               sel.n ? "no log files saved for this selection in '%s' (the run used neither "
                       "--log_dir nor -r/-t)"
                     : "no rank matches the selection in '%s'",
               r.dir);
        rc = -ENOENT;
        goto out;
    }
    if (sel.n == 1)
        sel.f[0].prefix[0] = '\0'; /* one file: its lines as they are */
    for (int i = 0; i < sel.n; i++) {
        off_t at = print_file(out, sel.f[i].path, sel.f[i].prefix, lo->tail, rep);
        sel.f[i].pos = at < 0 ? 0 : at;
    }
    fflush(out);
    if (lo->follow) {
        follow(out, lo, dir, id, attempt, &sel, rep);
        fflush(out);
    }
out:
    for (int i = 0; i < sel.n; i++)
        free(sel.f[i].partial);
    free(sel.f);
    free(runs);
    mg_logs_run_free(&r);
    if (rep)
        regfree(&re);
    return rc;
}
