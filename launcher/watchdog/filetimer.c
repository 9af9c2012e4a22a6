/* torch's file timer: the FIFO, the requests, the table (see filetimer.h). */
#include "filetimer.h"
#include "json.h"
#include "mg_err.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int mg_filetimer_open(struct mg_filetimer *ft, const char *path, const char *tmpdir, char *err,
                      size_t cap)
{
    struct stat st;
    int rc;
    memset(ft, 0, sizeof(*ft));
    ft->fd = -1;
    if (!path || !*path) {
        mg_fmt(ft->dir, sizeof(ft->dir), "%s/mglaunch-timer-XXXXXX",
               tmpdir && *tmpdir ? tmpdir : "/tmp");
        if (!mkdtemp(ft->dir)) {
            rc = -errno;
            mg_fmt(err, cap, "cannot create a directory for the timer FIFO in '%s': %s",
                   tmpdir && *tmpdir ? tmpdir : "/tmp", strerror(errno));
            ft->dir[0] = '\0';
            return rc;
        }
        mg_fmt(ft->path, sizeof(ft->path), "%s/watchdog_timer", ft->dir);
    } else if (strlen(path) >= sizeof(ft->path)) {
        mg_fmt(err, cap, "TORCHELASTIC_TIMER_FILE is longer than %zu bytes", sizeof(ft->path) - 1);
        return -ENAMETOOLONG;
    } else {
        mg_fmt(ft->path, sizeof(ft->path), "%s", path);
    }
    if (stat(ft->path, &st) == 0) {
        if (!S_ISFIFO(st.st_mode)) {
            mg_fmt(err, cap, "TORCHELASTIC_TIMER_FILE='%s' exists and is not a FIFO", ft->path);
            rc = -EEXIST;
            goto fail;
        }
    } else if (mkfifo(ft->path, 0600) < 0) {
        rc = -errno;
        mg_fmt(err, cap, "cannot create the timer FIFO '%s': %s", ft->path, strerror(errno));
        goto fail;
    } else {
        ft->created = 1;
    }
    /* Read-write: a reader of a FIFO with no writer left reads end-of-file
     * over and over; holding a write end ourselves, it waits for the next
     * request instead. Non-blocking: the loop polls it. */
    ft->fd = open(ft->path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (ft->fd < 0) {
        rc = -errno;
        mg_fmt(err, cap, "cannot open the timer FIFO '%s': %s", ft->path, strerror(errno));
        goto fail;
    }
    return 0;
fail:
    mg_filetimer_release(ft);
    return rc;
}

void mg_filetimer_release(struct mg_filetimer *ft)
{
    if (ft->fd >= 0)
        close(ft->fd);
    ft->fd = -1;
    if (ft->created)
        unlink(ft->path);
    ft->created = 0;
    if (ft->dir[0])
        rmdir(ft->dir);
    ft->dir[0] = '\0';
    free(ft->t);
    ft->t = NULL;
    ft->n = ft->cap = 0;
}

static int find(const struct mg_filetimer *ft, int pid, const char *scope)
{
    for (int i = 0; i < ft->n; i++)
        if (ft->t[i].pid == pid && strcmp(ft->t[i].scope, scope) == 0)
            return i;
    return -1;
}

int mg_filetimer_apply(struct mg_filetimer *ft, const char *line, size_t len, double now, char *why,
                       size_t cap)
{
    struct mg_json_tok toks[32];
    struct mg_json doc;
    long long pid, sig, version;
    double exp;
    char scope[MG_FILETIMER_SCOPE];
    int k;

    ft->requests++;
    if (mg_json_parse(&doc, line, len, toks, 32) < 0 || toks[0].type != MG_JSON_OBJECT) {
        mg_fmt(why, cap, "not a JSON object");
        goto bad;
    }
    if ((k = mg_json_get(&doc, 0, "version")) >= 0 &&
        (mg_json_int(&doc, k, &version) || version != 1)) {
        mg_fmt(why, cap, "\"version\" is not 1");
        goto bad;
    }
    if ((k = mg_json_get(&doc, 0, "pid")) < 0 || mg_json_int(&doc, k, &pid) || pid <= 0 ||
        pid > INT_MAX) {
        mg_fmt(why, cap, "no \"pid\" (a positive integer)");
        goto bad;
    }
    if ((k = mg_json_get(&doc, 0, "scope_id")) < 0 || toks[k].type != MG_JSON_STRING) {
        mg_fmt(why, cap, "no \"scope_id\" (a string)");
        goto bad;
    }
    if (mg_json_str(&doc, k, scope, sizeof(scope)) >= (int)sizeof(scope)) {
        mg_fmt(why, cap, "\"scope_id\" is longer than %d bytes", MG_FILETIMER_SCOPE - 1);
        goto bad;
    }
    if ((k = mg_json_get(&doc, 0, "expiration_time")) < 0 || mg_json_double(&doc, k, &exp) ||
        !isfinite(exp)) {
        mg_fmt(why, cap, "no \"expiration_time\" (seconds since the epoch, negative to release)");
        goto bad;
    }
    if ((k = mg_json_get(&doc, 0, "signal")) < 0 || mg_json_int(&doc, k, &sig) || sig >= 65) {
        mg_fmt(why, cap, "no \"signal\" (a signal number, 0 or less for none)");
        goto bad;
    }
    int i = find(ft, (int)pid, scope);
    if (exp < 0) { /* release */
        if (i >= 0)
            ft->t[i] = ft->t[--ft->n];
        return 0;
    }
    if (i < 0) {
        if (ft->n >= MG_FILETIMER_MAX) {
            mg_fmt(why, cap, "%d timers are set already", MG_FILETIMER_MAX);
            ft->malformed++;
            return -ENOSPC;
        }
        if (ft->n == ft->cap) {
            int nc = ft->cap ? ft->cap * 2 : 16;
            struct mg_filetimer_entry *t = realloc(ft->t, (size_t)nc * sizeof(*t));
            if (!t) {
                mg_fmt(why, cap, "out of memory");
                return -ENOMEM;
            }
            ft->t = t;
            ft->cap = nc;
        }
        i = ft->n++;
    }
    struct mg_filetimer_entry *e = &ft->t[i];
    e->pid = (int)pid;
    mg_fmt(e->scope, sizeof(e->scope), "%s", scope);
    e->expires = exp;
    e->set_at = now;
    e->sig = sig > 0 ? (int)sig : 0;
    return 0;
bad:
    ft->malformed++;
    return -EINVAL;
}

int mg_filetimer_read(struct mg_filetimer *ft, double now,
                      void (*bad)(void *ctx, const char *why, const char *line), void *ctx)
{
    char buf[8192], why[160];
    int applied = 0;
    for (;;) {
        ssize_t n = read(ft->fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return applied;
        if (n < 0)
            return -errno;
        if (n == 0)
            return applied;
        for (ssize_t i = 0; i < n; i++) {
            char c = buf[i];
            if (c != '\n') {
                if (ft->len < sizeof(ft->line) - 1)
                    ft->line[ft->len++] = c;
                else
                    ft->skipping = 1;
                continue;
            }
            ft->line[ft->len] = '\0';
            if (ft->skipping) {
                ft->malformed++;
                if (bad)
                    bad(ctx, "longer than 4096 bytes", ft->line);
            } else if (ft->len > 0) {
                int rc = mg_filetimer_apply(ft, ft->line, ft->len, now, why, sizeof(why));
                if (rc == 0)
                    applied++;
                else if (bad)
                    bad(ctx, why, ft->line);
            }
            ft->len = 0;
            ft->skipping = 0;
        }
    }
}

int mg_filetimer_take_expired(struct mg_filetimer *ft, double now, struct mg_filetimer_entry *out)
{
    int best = -1;
    for (int i = 0; i < ft->n; i++)
        if (ft->t[i].expires <= now && (best < 0 || ft->t[i].expires < ft->t[best].expires))
            best = i;
    if (best < 0)
        return 0;
    *out = ft->t[best];
    ft->t[best] = ft->t[--ft->n];
    return 1;
}

void mg_filetimer_clear(struct mg_filetimer *ft)
{
    ft->n = 0;
    /* a dead worker's half-written line must not prefix the next attempt's first */
    ft->len = 0;
    ft->skipping = 0;
}
