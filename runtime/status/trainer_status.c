/* Progress reports to Kubeflow Trainer's status server, from a thread (see
 * trainer_status.h). The training thread only takes the lock to leave its
 * report; the sender never holds it while it sends. */
#include "status/trainer_status.h"
#include "http.h"
#include "json.h"
#include "mg_err.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TOKEN_MAX 16384 /* a projected service account token is about 1 KB */

struct mg_tstatus {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    struct mg_tstatus_report next;
    int pending, busy, stop;
    int urgent;      /* flush: the waiting report goes whatever the interval */
    int64_t last_ms; /* when the last request went out; 0: none yet */
    int interval_ms;
    int abort_pipe[2]; /* readable: the request running is given up */
    struct mg_http *http;
    char url[2048];
    char token_file[PATH_MAX];
    int accepted;
    int failing;  /* the last request failed */
    int has_news; /* news holds something not yet taken */
    char news[512];
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *env2(const char *a, const char *b)
{
    const char *v = getenv(a);
    if (v && *v)
        return v;
    v = getenv(b);
    return v && *v ? v : NULL;
}

int mg_tstatus_config_from_env(struct mg_tstatus_config *c)
{
    memset(c, 0, sizeof(*c));
    /* Trainer v2.2's names first, then those of the plugin's first version
     * (kubeflow/trainer #3227). */
    c->url = env2("KUBEFLOW_TRAINER_SERVER_URL", "KUBEFLOW_TRAINER_STATUS_URL");
    c->token_file = env2("KUBEFLOW_TRAINER_SERVER_TOKEN", "KUBEFLOW_TRAINER_STATUS_TOKEN");
    c->ca_file = env2("KUBEFLOW_TRAINER_SERVER_CA_CERT", "KUBEFLOW_TRAINER_STATUS_CA_CERT");
    return c->url != NULL;
}

/* The token, read again for each request: the kubelet rotates it. */
static int read_token(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, buf, cap - 1);
    int e = errno;
    close(fd);
    if (n < 0)
        return -e;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
        n--;
    buf[n] = 0;
    if (n == 0)
        return -ENODATA;
    for (ssize_t i = 0; i < n; i++)
        if ((unsigned char)buf[i] < 0x21 || buf[i] == 0x7f)
            return -EINVAL; /* it would break the header */
    return 0;
}

static void payload(const struct mg_tstatus_report *r, char *buf, size_t cap)
{
    struct mg_jsonw w;
    char when[32], val[64];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
    mg_jsonw_init(&w, buf, cap);
    mg_jsonw_obj_begin(&w);
    mg_jsonw_key(&w, "trainerStatus");
    mg_jsonw_obj_begin(&w);
    mg_jsonw_kint(&w, "progressPercentage",
                  r->percent < 0     ? 0
                  : r->percent > 100 ? 100
                                     : r->percent);
    if (r->eta_s >= 0)
        mg_jsonw_kint(&w, "estimatedRemainingSeconds", r->eta_s);
    mg_jsonw_key(&w, "metrics");
    mg_jsonw_arr_begin(&w);
    for (int i = 0; i < r->nmetrics && i < MG_TSTATUS_METRICS_MAX; i++) {
        /* values are strings in TrainerStatus (resource.Quantity-like) */
        snprintf(val, sizeof(val), "%.6g", r->metrics[i].value);
        mg_jsonw_obj_begin(&w);
        mg_jsonw_kstr(&w, "name", r->metrics[i].name);
        mg_jsonw_kstr(&w, "value", val);
        mg_jsonw_obj_end(&w);
    }
    mg_jsonw_arr_end(&w);
    mg_jsonw_kstr(&w, "lastUpdatedTime", when);
    mg_jsonw_obj_end(&w);
    mg_jsonw_obj_end(&w);
    mg_jsonw_finish(&w);
}

/* One request; 0 when the server accepted it, else a message in why. */
static int post(struct mg_tstatus *s, const struct mg_tstatus_report *r, char *why, size_t cap)
{
    char body[4096], token[TOKEN_MAX], auth[TOKEN_MAX + 32];
    const char *headers[3] = {"Content-Type: application/json", NULL, NULL};
    payload(r, body, sizeof(body));
    if (s->token_file[0]) {
        int rc = read_token(s->token_file, token, sizeof(token));
        if (rc < 0) {
            mg_fmt(why, cap, "cannot read the token file %s: %s", s->token_file,
                   rc == -ENODATA  ? "it is empty"
                   : rc == -EINVAL ? "not a token"
                                   : strerror(-rc));
            return rc;
        }
        mg_fmt(auth, sizeof(auth), "Authorization: Bearer %s", token);
        headers[1] = auth;
    }
    struct mg_http_request rq = {
        .method = "POST",
        .url = s->url,
        .headers = headers,
        .body = body,
        .body_len = strlen(body),
        .timeout_ms = MG_TSTATUS_TIMEOUT_MS,
        .abort_fd = s->abort_pipe[0],
    };
    struct mg_http_response res;
    int rc = mg_http_request(s->http, &rq, &res);
    memset(auth, 0, sizeof(auth));
    memset(token, 0, sizeof(token));
    if (rc < 0) {
        mg_fmt(why, cap, "%s", res.error && *res.error ? res.error : mg_strerror(rc));
        return rc;
    }
    if (res.status < 200 || res.status > 299) {
        mg_fmt(why, cap, "HTTP %ld: %.160s", res.status, res.body ? res.body : "");
        for (char *p = why; *p; p++)
            if (*p == '\n' || *p == '\r')
                *p = ' ';
        return -EPROTO;
    }
    return 0;
}

static void *sender(void *arg)
{
    struct mg_tstatus *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stop &&
               !(s->pending && (s->urgent || now_ms() >= s->last_ms + s->interval_ms))) {
            if (!s->pending) {
                pthread_cond_wait(&s->cv, &s->mu);
                continue;
            }
            int64_t at = s->last_ms + s->interval_ms;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            int64_t left = at - now_ms();
            ts.tv_sec += left / 1000;
            ts.tv_nsec += (left % 1000) * 1000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        }
        if (!s->pending)
            break; /* stopping */
        struct mg_tstatus_report r = s->next;
        s->pending = 0;
        s->busy = 1;
        s->last_ms = now_ms();
        pthread_mutex_unlock(&s->mu);

        char why[400];
        int rc = post(s, &r, why, sizeof(why));

        pthread_mutex_lock(&s->mu);
        s->busy = 0;
        if (rc == 0) {
            s->accepted++;
            if (s->failing) {
                mg_fmt(s->news, sizeof(s->news), "progress reports reach %s again", s->url);
                s->has_news = 1;
            }
            s->failing = 0;
        } else {
            /* the first failure of a run of them is news, not each one */
            if (!s->failing) {
                mg_fmt(s->news, sizeof(s->news),
                       "cannot report progress to %s: %s (training is not affected; the next "
                       "report tries again)",
                       s->url, why);
                s->has_news = 1;
            }
            s->failing = 1;
        }
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int mg_tstatus_open(struct mg_tstatus **out, const struct mg_tstatus_config *c, char *err,
                    size_t errlen)
{
    *out = NULL;
    if (!c->url || (strncmp(c->url, "https://", 8) && strncmp(c->url, "http://", 7)))
        return mg_seterr(err, errlen, -EINVAL, "the status URL '%.200s' is not http(s)://",
                         c->url ? c->url : "");
    struct mg_tstatus *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    if (mg_fmt(s->url, sizeof(s->url), "%s", c->url) < 0 ||
        mg_fmt(s->token_file, sizeof(s->token_file), "%s", c->token_file ? c->token_file : "") <
            0) {
        free(s);
        return mg_seterr(err, errlen, -ENAMETOOLONG, "the status URL or token path is too long");
    }
    s->interval_ms = c->interval_ms > 0 ? c->interval_ms : MG_TSTATUS_INTERVAL_MS;
    struct mg_http_opts ho = {
        .libcurl = c->libcurl,
        .cacert = c->ca_file,
        .connect_timeout_ms = MG_TSTATUS_TIMEOUT_MS,
        .body_max = 64 << 10,
    };
    int rc = mg_http_open(&s->http, &ho, err, errlen);
    if (rc < 0)
        goto free_s;
    if (pipe2(s->abort_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
        rc = mg_seterr(err, errlen, -errno, "pipe: %s", strerror(errno));
        goto close_http;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    rc = -pthread_create(&s->thread, NULL, sender, s);
    if (rc < 0) {
        mg_seterr(err, errlen, rc, "cannot start the status sender: %s", strerror(-rc));
        goto close_pipe;
    }
    *out = s;
    return 0;
close_pipe:
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    close(s->abort_pipe[0]);
    close(s->abort_pipe[1]);
close_http:
    mg_http_close(s->http);
free_s:
    free(s);
    return rc;
}

void mg_tstatus_update(struct mg_tstatus *s, const struct mg_tstatus_report *r)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->next = *r;
    s->pending = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

int mg_tstatus_news(struct mg_tstatus *s, char *msg, size_t cap)
{
    int n = 0;
    if (!s)
        return 0;
    pthread_mutex_lock(&s->mu);
    if (s->has_news) {
        mg_fmt(msg, cap, "%s", s->news);
        s->has_news = 0;
        n = 1;
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

void mg_tstatus_flush(struct mg_tstatus *s, int wait_ms)
{
    if (!s)
        return;
    int64_t deadline = now_ms() + (wait_ms > 0 ? wait_ms : 0);
    pthread_mutex_lock(&s->mu);
    s->urgent = 1;
    pthread_cond_broadcast(&s->cv);
    while ((s->pending || s->busy) && now_ms() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    s->urgent = 0;
    pthread_mutex_unlock(&s->mu);
}

int mg_tstatus_close(struct mg_tstatus *s)
{
    if (!s)
        return 0;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    s->pending = 0; /* what has not gone does not */
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (write(s->abort_pipe[1], "x", 1) < 0) {
        /* an empty pipe of ours takes a byte; the request's timeout bounds it anyway */
    }
    pthread_join(s->thread, NULL);
    int accepted = s->accepted;
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    close(s->abort_pipe[0]);
    close(s->abort_pipe[1]);
    mg_http_close(s->http);
    free(s);
    return accepted;
}
