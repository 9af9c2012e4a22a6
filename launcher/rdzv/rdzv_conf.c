/* Parsing and validation of --rdzv_conf (see rdzv_conf.h, docs/rendezvous.md). */
#include "rdzv_conf.h"
#include "mg_err.h"
#include "proc.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void mg_rdzv_conf_init(struct mg_rdzv_conf *c)
{
    memset(c, 0, sizeof(*c));
    c->join_timeout_ms = 600 * 1000;
    c->last_call_timeout_ms = 30 * 1000;
    c->close_timeout_ms = 30 * 1000;
    c->heartbeat_interval_ms = 1000;
    c->heartbeat_timeout_ms = 5000;
    c->exit_barrier_timeout_ms = 300 * 1000;
    c->read_timeout_ms = 60 * 1000;
    c->is_host = -1;
    snprintf(c->prefix, sizeof(c->prefix), "/mg/rdzv");
}

int mg_rdzv_parse_duration_ms(const char *s, int *ms)
{
    char *end;
    double scale = 1000.0;

    if (!s || !*s)
        return -EINVAL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0)
        return -EINVAL;
    if (strcmp(end, "ms") == 0)
        scale = 1.0;
    else if (strcmp(end, "s") != 0 && *end)
        return -EINVAL;
    v *= scale;
    if (v > INT_MAX)
        return -ERANGE;
    *ms = (int)(v + 0.5);
    return 0;
}

static int parse_bool(const char *s, int *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on", "True", "TRUE", "Yes"};
    static const char *const no[] = {"0", "false", "no", "off", "False", "FALSE", "No"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        if (strcmp(s, yes[i]) == 0) {
            *out = 1;
            return 0;
        }
        if (strcmp(s, no[i]) == 0) {
            *out = 0;
            return 0;
        }
    }
    return -EINVAL;
}

static const struct {
    const char *name;
    enum mg_rdzv_conf_key key;
} keys[] = {
    {"join_timeout", MG_RDZV_K_JOIN_TIMEOUT},
    {"last_call_timeout", MG_RDZV_K_LAST_CALL_TIMEOUT},
    {"close_timeout", MG_RDZV_K_CLOSE_TIMEOUT},
    {"heartbeat_interval", MG_RDZV_K_HEARTBEAT_INTERVAL},
    {"heartbeat_timeout", MG_RDZV_K_HEARTBEAT_TIMEOUT},
    {"exit_barrier_timeout", MG_RDZV_K_EXIT_BARRIER_TIMEOUT},
    {"read_timeout", MG_RDZV_K_READ_TIMEOUT},
    {"is_host", MG_RDZV_K_IS_HOST},
    {"token", MG_RDZV_K_TOKEN},
    {"cacert", MG_RDZV_K_CACERT},
    {"cert", MG_RDZV_K_CERT},
    {"key", MG_RDZV_K_KEY},
    {"prefix", MG_RDZV_K_PREFIX},
};

static int set_string(char *dst, size_t cap, const char *name, const char *val, char *err,
                      size_t errlen)
{
    size_t n = strlen(val);
    if (n >= cap)
        return mg_seterr(err, errlen, -EINVAL,
                         "--rdzv_conf %s: value is %zu bytes, the limit is %zu", name, n, cap - 1);
    memcpy(dst, val, n + 1);
    return 0;
}

static int set_one(struct mg_rdzv_conf *c, const char *name, const char *val, int *keep_alive_n,
                   char *err, size_t errlen)
{
    int *ms = NULL;
    size_t i;

    /* torchrun's spelling of the heartbeat settings (PyTorch 2.x). */
    if (strcmp(name, "keep_alive_interval") == 0)
        name = "heartbeat_interval";
    if (strcmp(name, "keep_alive_max_attempt") == 0) {
        char *end;
        errno = 0;
        long n = strtol(val, &end, 10);
        if (errno || *end || end == val || n < 1 || n > 1000)
            return mg_seterr(
                err, errlen, -EINVAL,
                "--rdzv_conf keep_alive_max_attempt=%s: expected an integer from 1 to 1000", val);
        *keep_alive_n = (int)n;
        return 0;
    }
    for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        if (strcmp(keys[i].name, name) == 0)
            break;
    if (i == sizeof(keys) / sizeof(keys[0]))
        return mg_seterr(
            err, errlen, -EINVAL,
            "--rdzv_conf: unknown key '%s' (known: join_timeout, last_call_timeout, "
            "close_timeout, heartbeat_interval, heartbeat_timeout, exit_barrier_timeout, "
            "read_timeout, is_host, token, cacert, cert, key, prefix)",
            name);

    switch (keys[i].key) {
    case MG_RDZV_K_JOIN_TIMEOUT:
        ms = &c->join_timeout_ms;
        break;
    case MG_RDZV_K_LAST_CALL_TIMEOUT:
        ms = &c->last_call_timeout_ms;
        break;
    case MG_RDZV_K_CLOSE_TIMEOUT:
        ms = &c->close_timeout_ms;
        break;
    case MG_RDZV_K_HEARTBEAT_INTERVAL:
        ms = &c->heartbeat_interval_ms;
        break;
    case MG_RDZV_K_HEARTBEAT_TIMEOUT:
        ms = &c->heartbeat_timeout_ms;
        break;
    case MG_RDZV_K_EXIT_BARRIER_TIMEOUT:
        ms = &c->exit_barrier_timeout_ms;
        break;
    case MG_RDZV_K_READ_TIMEOUT:
        ms = &c->read_timeout_ms;
        break;
    case MG_RDZV_K_IS_HOST:
        if (parse_bool(val, &c->is_host) < 0)
            return mg_seterr(err, errlen, -EINVAL, "--rdzv_conf is_host=%s: expected true or false",
                             val);
        break;
    case MG_RDZV_K_TOKEN:
        if (!*val)
            return mg_seterr(err, errlen, -EINVAL, "--rdzv_conf token: the token is empty");
        if (set_string(c->token, sizeof(c->token), name, val, err, errlen) < 0)
            return -EINVAL;
        break;
    case MG_RDZV_K_CACERT:
        if (set_string(c->cacert, sizeof(c->cacert), name, val, err, errlen) < 0)
            return -EINVAL;
        break;
    case MG_RDZV_K_CERT:
        if (set_string(c->cert, sizeof(c->cert), name, val, err, errlen) < 0)
            return -EINVAL;
        break;
    case MG_RDZV_K_KEY:
        if (set_string(c->key, sizeof(c->key), name, val, err, errlen) < 0)
            return -EINVAL;
        break;
    case MG_RDZV_K_PREFIX:
        if (val[0] != '/' || strstr(val, "//"))
            return mg_seterr(err, errlen, -EINVAL,
                             "--rdzv_conf prefix=%s: expected an absolute key path like /mg/rdzv",
                             val);
        if (set_string(c->prefix, sizeof(c->prefix), name, val, err, errlen) < 0)
            return -EINVAL;
        /* Keys are built as prefix + "/" + run id: no trailing slash. */
        for (size_t n = strlen(c->prefix); n > 1 && c->prefix[n - 1] == '/'; n--)
            c->prefix[n - 1] = 0;
        break;
    case MG_RDZV_K_COUNT:
        break;
    }
    if (ms) {
        int v, rc = mg_rdzv_parse_duration_ms(val, &v);
        if (rc < 0)
            return mg_seterr(
                err, errlen, -EINVAL,
                "--rdzv_conf %s=%s: expected a duration in seconds (like 30, 0.5 or 500ms)", name,
                val);
        if (v <= 0 && keys[i].key != MG_RDZV_K_LAST_CALL_TIMEOUT)
            return mg_seterr(err, errlen, -EINVAL, "--rdzv_conf %s=%s: must be positive", name,
                             val);
        *ms = v;
    }
    c->set |= 1u << keys[i].key;
    return 0;
}

int mg_rdzv_conf_parse(struct mg_rdzv_conf *c, const char *text, char *err, size_t errlen)
{
    char buf[MG_RDZV_CONF_MAX + 1];
    int keep_alive_n = 0, rc;
    size_t n;

    if (!text || !*text)
        return 0;
    n = strlen(text);
    if (n > MG_RDZV_CONF_MAX)
        return mg_seterr(err, errlen, -EINVAL, "--rdzv_conf: %zu bytes, the limit is %d", n,
                         MG_RDZV_CONF_MAX);
    memcpy(buf, text, n + 1);

    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item;
         item = strtok_r(NULL, ",", &save)) {
        while (*item == ' ')
            item++;
        if (!*item)
            continue;
        char *eq = strchr(item, '=');
        if (!eq || eq == item)
            return mg_seterr(err, errlen, -EINVAL, "--rdzv_conf: '%s' is not of the form key=value",
                             item);
        *eq = 0;
        rc = set_one(c, item, eq + 1, &keep_alive_n, err, errlen);
        if (rc < 0)
            return rc;
    }
    if (keep_alive_n) {
        /* torchrun declares a node dead after max_attempt missed intervals. */
        if (c->set & (1u << MG_RDZV_K_HEARTBEAT_TIMEOUT))
            return mg_seterr(
                err, errlen, -EINVAL,
                "--rdzv_conf: give heartbeat_timeout or keep_alive_max_attempt, not both");
        long long t = (long long)c->heartbeat_interval_ms * keep_alive_n;
        c->heartbeat_timeout_ms = t > INT_MAX ? INT_MAX : (int)t;
        c->set |= 1u << MG_RDZV_K_HEARTBEAT_TIMEOUT;
    }
    return 0;
}

int mg_rdzv_conf_finish(struct mg_rdzv_conf *c, enum mg_rdzv_backend backend, char *const *env,
                        char *err, size_t errlen)
{
    static const char *const tls[] = {"cacert", "cert", "key"};
    const char *tls_val[] = {c->cacert, c->cert, c->key};

    if (!c->token[0]) {
        const char *t = mg_env_lookup(env, "MG_RDZV_TOKEN");
        if (t && *t) {
            if (strlen(t) > MG_RDZV_TOKEN_MAX)
                return mg_seterr(err, errlen, -EINVAL, "MG_RDZV_TOKEN: %zu bytes, the limit is %d",
                                 strlen(t), MG_RDZV_TOKEN_MAX);
            snprintf(c->token, sizeof(c->token), "%s", t);
        }
    }
    if (c->heartbeat_interval_ms < 10)
        return mg_seterr(err, errlen, -EINVAL,
                         "--rdzv_conf heartbeat_interval=%dms: must be at least 10ms",
                         c->heartbeat_interval_ms);
    if (c->heartbeat_timeout_ms < 2 * c->heartbeat_interval_ms)
        return mg_seterr(
            err, errlen, -EINVAL,
            "--rdzv_conf heartbeat_timeout=%gs: must be at least twice "
            "heartbeat_interval (%gs), or one late heartbeat would declare a node dead",
            c->heartbeat_timeout_ms / 1000.0, c->heartbeat_interval_ms / 1000.0);
    if (backend == MG_RDZV_ETCD && c->heartbeat_timeout_ms < 2000)
        return mg_seterr(
            err, errlen, -EINVAL,
            "--rdzv_conf heartbeat_timeout=%gs: etcd leases last at least 2s; use 2 or more",
            c->heartbeat_timeout_ms / 1000.0);
    if (c->last_call_timeout_ms > c->join_timeout_ms &&
        !(c->set & (1u << MG_RDZV_K_LAST_CALL_TIMEOUT)))
        c->last_call_timeout_ms = c->join_timeout_ms; /* the default must not exceed a short join */
    if (c->last_call_timeout_ms > c->join_timeout_ms)
        return mg_seterr(err, errlen, -EINVAL,
                         "--rdzv_conf last_call_timeout=%gs: must not exceed join_timeout (%gs)",
                         c->last_call_timeout_ms / 1000.0, c->join_timeout_ms / 1000.0);
    if (backend != MG_RDZV_ETCD) {
        for (int i = 0; i < 3; i++)
            if (*tls_val[i])
                return mg_seterr(err, errlen, -EINVAL,
                                 "--rdzv_conf %s: TLS files apply to the etcd backend only, not %s",
                                 tls[i], mg_rdzv_backend_name(backend));
        if (c->set & (1u << MG_RDZV_K_PREFIX))
            return mg_seterr(err, errlen, -EINVAL,
                             "--rdzv_conf prefix: applies to the etcd backend only, not %s",
                             mg_rdzv_backend_name(backend));
    } else {
        if (c->set & (1u << MG_RDZV_K_IS_HOST))
            return mg_seterr(
                err, errlen, -EINVAL,
                "--rdzv_conf is_host: the etcd backend has no store to host; it applies "
                "to c10d and static");
        for (int i = 0; i < 3; i++)
            if (*tls_val[i] && access(tls_val[i], R_OK) < 0)
                return mg_seterr(err, errlen, -EINVAL,
                                 "--rdzv_conf %s=%s: cannot read the file: %s", tls[i], tls_val[i],
                                 strerror(errno));
        if (!*c->cert != !*c->key)
            return mg_seterr(err, errlen, -EINVAL,
                             "--rdzv_conf %s: a client certificate needs both cert and key",
                             *c->cert ? "cert" : "key");
    }
    return 0;
}

int mg_rdzv_backend_parse(const char *name, enum mg_rdzv_backend *out)
{
    if (strcmp(name, "static") == 0)
        *out = MG_RDZV_STATIC;
    else if (strcmp(name, "c10d") == 0)
        *out = MG_RDZV_C10D;
    else if (strcmp(name, "etcd") == 0 || strcmp(name, "etcd-v3") == 0)
        *out = MG_RDZV_ETCD;
    else
        return -EINVAL;
    return 0;
}

const char *mg_rdzv_backend_name(enum mg_rdzv_backend b)
{
    switch (b) {
    case MG_RDZV_STATIC:
        return "static";
    case MG_RDZV_C10D:
        return "c10d";
    case MG_RDZV_ETCD:
        return "etcd";
    }
    return "?";
}
