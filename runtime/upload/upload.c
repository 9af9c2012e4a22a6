/* The queue of remote copies and the thread that sends them (see upload.h).
 * The training thread only takes the lock to add an item; the sender holds
 * it only to look at the queue, never while sending or waiting. */
#include "upload_internal.h"
#include "mg_err.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct part {
    char *name;
    int fd; /* -1 for text */
    long long len;
    char *text;
};

struct item {
    struct part p[MG_UPLOAD_PARTS_MAX];
    int n, done; /* parts, parts sent */
    int tries;
    struct item *next;
};

struct mg_upload {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    struct item *head, *tail;
    int nq;
    int sending;         /* the head is being sent: it cannot be replaced */
    int stop;            /* close() was called */
    int64_t deadline_ms; /* with stop: when the sender gives up */
    int abort_pipe[2];   /* readable: the transfer running is given up */
    struct upload_dest dest;
    int queue_max, tries, backoff_ms, backoff_max_ms;
    struct mg_upload_stats st;
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void free_item(struct item *it)
{
    for (int i = 0; i < it->n; i++) {
        free(it->p[i].name);
        free(it->p[i].text);
        if (it->p[i].fd >= 0)
            close(it->p[i].fd);
    }
    free(it);
}

/* Under the lock: a name for the list of what was not copied. */
static void not_copied(struct mg_upload *u, const struct item *it, const char *why)
{
    struct mg_upload_stats *st = &u->st;
    if (st->nlist < MG_UPLOAD_LIST_MAX)
        mg_fmt(st->list[st->nlist++], sizeof(st->list[0]), "%s%s%s", it->p[0].name, why ? ": " : "",
               why ? why : "");
}

static void pop_head(struct mg_upload *u)
{
    struct item *it = u->head;
    u->head = it->next;
    if (!u->head)
        u->tail = NULL;
    u->nq--;
    free_item(it);
}

/* Sends the parts of it not yet sent. Without the lock. */
static int send_item(struct mg_upload *u, struct item *it, int *permanent, char *err, size_t cap)
{
    while (it->done < it->n) {
        const struct part *p = &it->p[it->done];
        int rc = upload_dest_put(&u->dest, p->name, p->fd, p->len, p->text, u->abort_pipe[0],
                                 permanent, err, cap);
        if (rc < 0)
            return rc;
        pthread_mutex_lock(&u->mu);
        u->st.bytes += p->fd >= 0 ? p->len : (long long)strlen(p->text);
        pthread_mutex_unlock(&u->mu);
        it->done++;
    }
    return 0;
}

static void timespec_at(struct timespec *ts, int64_t ms_from_now)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms_from_now / 1000;
    ts->tv_nsec += (ms_from_now % 1000) * 1000000;
    if (ts->tv_nsec >= 1000000000) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000;
    }
}

static void *sender(void *arg)
{
    struct mg_upload *u = arg;
    char err[512];
    /* Copies are background work: at a lower priority than the training,
     * they take the cores' idle time first when the ranks keep every core
     * busy. Linux's nice is per thread; the commands it starts inherit it. */
    id_t self = (id_t)gettid();
    errno = 0;
    int nice_now = getpriority(PRIO_PROCESS, self);
    if (errno == 0)
        setpriority(PRIO_PROCESS, self, nice_now + MG_UPLOAD_NICE); /* the kernel caps it at 19 */
    pthread_mutex_lock(&u->mu);
    for (;;) {
        while (!u->head && !u->stop)
            pthread_cond_wait(&u->cv, &u->mu);
        if (!u->head || (u->stop && now_ms() >= u->deadline_ms))
            break;
        struct item *it = u->head;
        u->sending = 1;
        pthread_mutex_unlock(&u->mu);
        int permanent = 0;
        err[0] = '\0';
        int rc = send_item(u, it, &permanent, err, sizeof(err));
        pthread_mutex_lock(&u->mu);
        u->sending = 0;
        if (rc == 0) {
            u->st.copied++;
            pop_head(u);
            continue;
        }
        it->tries++;
        mg_fmt(u->st.last_error, sizeof(u->st.last_error), "%s: %s", it->p[it->done].name, err);
        if (permanent || it->tries >= u->tries || rc == -EINTR) {
            if (rc == -EINTR) /* given up at close: counted as not sent */
                break;
            u->st.failed++;
            not_copied(u, it, err);
            pop_head(u);
            continue;
        }
        u->st.retries++;
        /* back off; close() wakes us, and its deadline bounds the wait */
        int64_t wait = (int64_t)u->backoff_ms << (it->tries - 1 < 20 ? it->tries - 1 : 20);
        if (wait > u->backoff_max_ms)
            wait = u->backoff_max_ms;
        int64_t until = now_ms() + wait;
        while (now_ms() < until && !(u->stop && now_ms() >= u->deadline_ms)) {
            struct timespec ts;
            int64_t left = until - now_ms();
            if (u->stop && u->deadline_ms - now_ms() < left)
                left = u->deadline_ms - now_ms();
            timespec_at(&ts, left > 0 ? left : 0);
            pthread_cond_timedwait(&u->cv, &u->mu, &ts);
        }
    }
    /* what is left was not sent */
    while (u->head) {
        u->st.pending++;
        not_copied(u, u->head, "not sent before the end");
        pop_head(u);
    }
    pthread_mutex_unlock(&u->mu);
    return NULL;
}

int mg_upload_open(struct mg_upload **out, const struct mg_upload_config *cfg, char *err,
                   size_t errlen)
{
    *out = NULL;
    struct mg_upload *u = calloc(1, sizeof(*u));
    if (!u)
        return mg_seterr(err, errlen, -ENOMEM, "out of memory");
    u->queue_max = cfg->queue_max > 0 ? cfg->queue_max : MG_UPLOAD_QUEUE_MAX;
    u->tries = cfg->tries > 0 ? cfg->tries : 10;
    u->backoff_ms = cfg->backoff_ms > 0 ? cfg->backoff_ms : 500;
    u->backoff_max_ms = cfg->backoff_max_ms > 0 ? cfg->backoff_max_ms : 30000;
    int rc = upload_dest_open(&u->dest, cfg, err, errlen);
    if (rc < 0)
        goto out_dest;
    if (pipe2(u->abort_pipe, O_CLOEXEC) < 0) {
        rc = mg_seterr(err, errlen, -errno, "pipe: %s", strerror(errno));
        goto out_dest;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&u->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&u->mu, NULL);
    rc = pthread_create(&u->thread, NULL, sender, u);
    if (rc != 0) {
        rc = mg_seterr(err, errlen, -rc, "cannot start the upload thread: %s", strerror(rc));
        goto out_sync;
    }
    *out = u;
    return 0;
out_sync:
    pthread_cond_destroy(&u->cv);
    pthread_mutex_destroy(&u->mu);
    close(u->abort_pipe[0]);
    close(u->abort_pipe[1]);
out_dest:
    upload_dest_close(&u->dest);
    free(u);
    return rc;
}

/* Opens the parts' files: what they hold now is what is sent. */
static int make_item(struct item **out, const struct mg_upload_part *parts, int n)
{
    struct item *it = calloc(1, sizeof(*it));
    int rc = 0;
    if (!it)
        return -ENOMEM;
    for (int i = 0; i < n && rc == 0; i++) {
        struct part *p = &it->p[it->n++];
        struct stat st;
        p->fd = -1;
        if (!parts[i].name || !*parts[i].name || strlen(parts[i].name) >= MG_UPLOAD_NAME_MAX ||
            (!parts[i].path && !parts[i].text)) {
            rc = -EINVAL;
            break;
        }
        if (!(p->name = strdup(parts[i].name))) {
            rc = -ENOMEM;
        } else if (!parts[i].path) {
            rc = (p->text = strdup(parts[i].text)) ? 0 : -ENOMEM;
        } else if ((p->fd = open(parts[i].path, O_RDONLY | O_CLOEXEC)) < 0) {
            rc = -errno;
        } else if (fstat(p->fd, &st) < 0) {
            rc = -errno;
        } else {
            p->len = st.st_size;
        }
    }
    if (rc < 0) {
        free_item(it);
        return rc;
    }
    *out = it;
    return 0;
}

int mg_upload_queue(struct mg_upload *u, const struct mg_upload_part *parts, int n, int replace)
{
    struct item *it;
    if (!u || !parts || n < 1 || n > MG_UPLOAD_PARTS_MAX)
        return -EINVAL;
    int rc = make_item(&it, parts, n);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&u->mu);
    if (replace) {
        for (struct item **pp = &u->head; *pp; pp = &(*pp)->next) {
            struct item *old = *pp;
            if ((old == u->head && u->sending) || strcmp(old->p[0].name, it->p[0].name) != 0)
                continue;
            it->next = old->next;
            *pp = it;
            if (u->tail == old)
                u->tail = it;
            free_item(old);
            u->st.replaced++;
            pthread_mutex_unlock(&u->mu);
            return 0;
        }
    }
    if (u->nq >= u->queue_max || u->stop) {
        u->st.dropped++;
        not_copied(u, it, "the queue was full");
        pthread_mutex_unlock(&u->mu);
        free_item(it);
        return -ENOSPC;
    }
    if (u->tail)
        u->tail->next = it;
    else
        u->head = it;
    u->tail = it;
    u->nq++;
    u->st.queued++;
    pthread_cond_signal(&u->cv);
    pthread_mutex_unlock(&u->mu);
    return 0;
}

void mg_upload_stats(struct mg_upload *u, struct mg_upload_stats *st)
{
    pthread_mutex_lock(&u->mu);
    *st = u->st;
    pthread_mutex_unlock(&u->mu);
}

int mg_upload_close(struct mg_upload *u, int wait_ms, struct mg_upload_stats *st)
{
    if (!u)
        return 0;
    pthread_mutex_lock(&u->mu);
    u->stop = 1;
    u->deadline_ms = now_ms() + (wait_ms > 0 ? wait_ms : 0);
    pthread_cond_broadcast(&u->cv);
    pthread_mutex_unlock(&u->mu);
    /* at the deadline, a transfer still running is given up */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (wait_ms > 0 ? wait_ms : 0) / 1000 + 1;
    if (pthread_timedjoin_np(u->thread, NULL, &ts) != 0) {
        if (write(u->abort_pipe[1], "x", 1) < 0) {
            /* the pipe is ours and empty: cannot fail */
        }
        pthread_join(u->thread, NULL);
    }
    if (st)
        *st = u->st;
    int rc = u->st.copied == u->st.queued && !u->st.dropped ? 0 : -EIO;
    pthread_cond_destroy(&u->cv);
    pthread_mutex_destroy(&u->mu);
    close(u->abort_pipe[0]);
    close(u->abort_pipe[1]);
    upload_dest_close(&u->dest);
    free(u);
    return rc;
}

int mg_upload_fetch(const struct mg_upload_config *cfg, const char *name, const char *path,
                    char *err, size_t errlen)
{
    struct upload_dest d;
    char tmp[PATH_MAX + 32];
    int rc = upload_dest_open(&d, cfg, err, errlen);
    if (rc < 0) {
        upload_dest_close(&d);
        return rc;
    }
    if (d.kind == UPLOAD_CMD) {
        upload_dest_close(&d);
        return mg_seterr(err, errlen, -MG_EUNSUPPORTED,
                         "an upload command cannot fetch files back (use s3:// or http(s)://)");
    }
    if (mg_fmt(tmp, sizeof(tmp), "%s.fetch.%d", path, (int)getpid()) < 0) {
        upload_dest_close(&d);
        return mg_seterr(err, errlen, -ENAMETOOLONG, "'%s': name too long", path);
    }
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = -errno;
        upload_dest_close(&d);
        return mg_seterr(err, errlen, rc, "cannot create '%s': %s", tmp, strerror(-rc));
    }
    rc = upload_dest_get(&d, name, fd, err, errlen);
    if (rc == 0 && fsync(fd) < 0)
        rc = mg_seterr(err, errlen, -errno, "cannot write '%s': %s", tmp, strerror(errno));
    if (close(fd) < 0 && rc == 0)
        rc = mg_seterr(err, errlen, -errno, "cannot write '%s': %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) < 0)
        rc = mg_seterr(err, errlen, -errno, "cannot rename '%s': %s", tmp, strerror(errno));
    if (rc < 0)
        unlink(tmp);
    upload_dest_close(&d);
    return rc;
}
