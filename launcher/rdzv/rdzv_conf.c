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
#include <strings.h>
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
    c->exclude_window_ms = 600 * 1000;
    c->exclude_cooldown_ms = 600 * 1000;
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

/* torch's RendezvousParameters.get_as_bool: 1/true/t/yes/y and 0/false/f/no/n,
 * in any case; "on"/"off" too. */
static int parse_bool(const char *s, int *out)
{
    static const char *const yes[] = {"1", "true", "t", "yes", "y", "on"};
    static const char *const no[] = {"0", "false", "f", "no", "n", "off"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = 1;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = 0;
            return 0;
        }
    }
    return -EINVAL;
}

/* Every spelling accepted, mg's own and torchrun's (docs/torchrun-compat.md
 * names the torch file that reads each): several spellings of one setting
 * share its key. The order is the one the "known:" list shows. */
static const struct {
    const char *name;
    enum mg_rdzv_conf_key key;
} keys[] = {
    {"join_timeout", MG_RDZV_K_JOIN_TIMEOUT},
    {"timeout", MG_RDZV_K_JOIN_TIMEOUT}, /* torchrun's static and etcd backends */
    {"last_call_timeout", MG_RDZV_K_LAST_CALL_TIMEOUT},
    {"close_timeout", MG_RDZV_K_CLOSE_TIMEOUT},
    {"heartbeat_interval", MG_RDZV_K_HEARTBEAT_INTERVAL},
    {"keep_alive_interval", MG_RDZV_K_HEARTBEAT_INTERVAL}, /* torchrun 2.x */
    {"heartbeat_timeout", MG_RDZV_K_HEARTBEAT_TIMEOUT},
    {"keep_alive_max_attempt", MG_RDZV_K_KEEP_ALIVE_MAX_ATTEMPT}, /* torchrun 2.x */
    {"exit_barrier_timeout", MG_RDZV_K_EXIT_BARRIER_TIMEOUT},
    {"read_timeout", MG_RDZV_K_READ_TIMEOUT},
    {"is_host", MG_RDZV_K_IS_HOST},
    {"token", MG_RDZV_K_TOKEN},
    {"cacert", MG_RDZV_K_CACERT},
    {"ca_cert", MG_RDZV_K_CACERT}, /* torchrun's etcd-v2 */
    {"cert", MG_RDZV_K_CERT},
    {"ssl_cert", MG_RDZV_K_CERT}, /* torchrun's etcd-v2 */
    {"key", MG_RDZV_K_KEY},
    {"ssl_cert_key", MG_RDZV_K_KEY}, /* torchrun's etcd-v2 */
    {"prefix", MG_RDZV_K_PREFIX},
    {"etcd_prefix", MG_RDZV_K_PREFIX}, /* torchrun's etcd */
    {"protocol", MG_RDZV_K_PROTOCOL},
    {"store_type", MG_RDZV_K_STORE_TYPE},
    {"use_libuv", MG_RDZV_K_USE_LIBUV},
    {"rank", MG_RDZV_K_RANK},
    {"exclude_after", MG_RDZV_K_EXCLUDE_AFTER},
    {"exclude_window", MG_RDZV_K_EXCLUDE_WINDOW},
    {"exclude_cooldown", MG_RDZV_K_EXCLUDE_COOLDOWN},
};

#define NKEYS (sizeof(keys) / sizeof(keys[0]))

static void add_note(struct mg_rdzv_conf *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void add_note(struct mg_rdzv_conf *c, const char *fmt, ...)
{
    size_t n = strlen(c->notes);
    va_list ap;
    if (n && n + 1 < sizeof(c->notes))
        c->notes[n++] = '\n';
    va_start(ap, fmt);
    vsnprintf(c->notes + n, sizeof(c->notes) - n, fmt, ap);
    va_end(ap);
}

static int unknown_key(const char *name, char *err, size_t errlen)
{
    char list[600];
    size_t n = 0;
    for (size_t i = 0; i < NKEYS && n < sizeof(list); i++)
        n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", i ? ", " : "", keys[i].name);
    return mg_seterr(err, errlen, -EINVAL, "--rdzv_conf: unknown key '%s' (known: %s)", name, list);
}

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

/* The keys that are durations, and where each goes. */
static int *duration_of(struct mg_rdzv_conf *c, enum mg_rdzv_conf_key k)
{
    switch (k) {
    case MG_RDZV_K_JOIN_TIMEOUT:
        return &c->join_timeout_ms;
    case MG_RDZV_K_LAST_CALL_TIMEOUT:
        return &c->last_call_timeout_ms;
    case MG_RDZV_K_CLOSE_TIMEOUT:
        return &c->close_timeout_ms;
    case MG_RDZV_K_HEARTBEAT_INTERVAL:
        return &c->heartbeat_interval_ms;
    case MG_RDZV_K_HEARTBEAT_TIMEOUT:
        return &c->heartbeat_timeout_ms;
    case MG_RDZV_K_EXIT_BARRIER_TIMEOUT:
        return &c->exit_barrier_timeout_ms;
    case MG_RDZV_K_READ_TIMEOUT:
        return &c->read_timeout_ms;
    case MG_RDZV_K_EXCLUDE_WINDOW:
        return &c->exclude_window_ms;
    case MG_RDZV_K_EXCLUDE_COOLDOWN:
        return &c->exclude_cooldown_ms;
    default:
        return NULL;
    }
}

/* One key=value. spelled[k] remembers which name set key k, so that one
 * setting given under two names (timeout and join_timeout) is caught. */
static int set_one(struct mg_rdzv_conf *c, const char *name, const char *val, int *keep_alive_n,
                   const char **spelled, char *err, size_t errlen)
{
    size_t i;
    int b;

    for (i = 0; i < NKEYS; i++)
        if (strcmp(keys[i].name, name) == 0)
            break;
    if (i == NKEYS)
        return unknown_key(name, err, errlen);
    enum mg_rdzv_conf_key k = keys[i].key;
    if (k == MG_RDZV_K_JOIN_TIMEOUT) {
        /* Not one setting under two names: torchrun's c10d reads only
         * join_timeout, its static and etcd backends only timeout, and TorchX
         * passes both (join_timeout=1800,close_timeout=600,timeout=1800). */
        int v;
        if (mg_rdzv_parse_duration_ms(val, &v) < 0)
            return mg_seterr(
                err, errlen, -EINVAL,
                "--rdzv_conf %s=%s: expected a duration in seconds (like 30, 0.5 or 500ms)", name,
                val);
        if (v <= 0)
            return mg_seterr(err, errlen, -EINVAL, "--rdzv_conf %s=%s: must be positive", name,
                             val);
        if (strcmp(name, "timeout") == 0)
            c->timeout_ms = v;
        else {
            c->join_timeout_ms = v;
            c->join_timeout_given = 1;
        }
        c->set |= 1u << k;
        return 0;
    }
    if (spelled[k] && strcmp(spelled[k], keys[i].name) != 0)
        return mg_seterr(err, errlen, -EINVAL,
                         "--rdzv_conf: %s and %s are one setting; give only one of them",
                         spelled[k], keys[i].name);
    spelled[k] = keys[i].name;

    int *ms = duration_of(c, k);
    if (ms) {
        int v, rc = mg_rdzv_parse_duration_ms(val, &v);
        if (rc < 0)
            return mg_seterr(
                err, errlen, -EINVAL,
                "--rdzv_conf %s=%s: expected a duration in seconds (like 30, 0.5 or 500ms)", name,
                val);
        if (v <= 0 && k != MG_RDZV_K_LAST_CALL_TIMEOUT)
            return mg_seterr(err, errlen, -EINVAL, "--rdzv_conf %s=%s: must be positive", name,
                             val);
        *ms = v;
        c->set |= 1u << k;
        return 0;
    }
    switch (k) {
    case MG_RDZV_K_EXCLUDE_AFTER: {
        char *end;
        errno = 0;
        long n = strtol(val, &end, 10);
        if (errno || *end || end == val || n < 0 || n > MG_RDZV_EXCLUDE_AFTER_MAX)
            return mg_seterr(
                err, errlen, -EINVAL,
                "--rdzv_conf %s=%s: expected a number of failures from 0 (never) to %d", name, val,
                MG_RDZV_EXCLUDE_AFTER_MAX);
        c->exclude_after = (int)n;
        break;
    }
    case MG_RDZV_K_KEEP_ALIVE_MAX_ATTEMPT: {
        char *end;
        errno = 0;
        long n = strtol(val, &end, 10);
        if (errno || *end || end == val || n < 1 || n > 1000)
            return mg_seterr(err, errlen, -EINVAL,
                             "--rdzv_conf %s=%s: expected an integer from 1 to 1000", name, val);
        *keep_alive_n = (int)n;
        return 0; /* becomes heartbeat_timeout once the interval is known */
    }
    case MG_RDZV_K_IS_HOST:
        if (parse_bool(val, &c->is_host) < 0)
            return mg_seterr(err, errlen, -EINVAL, "--rdzv_conf %s=%s: expected true or false",
                             name, val);
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
                             "--rdzv_conf %s=%s: expected an absolute key path like /mg/rdzv", name,
                             val);
        if (set_string(c->prefix, sizeof(c->prefix), name, val, err, errlen) < 0)
            return -EINVAL;
        /* Keys are built as prefix + "/" + run id: no trailing slash. */
        for (size_t n = strlen(c->prefix); n > 1 && c->prefix[n - 1] == '/'; n--)
            c->prefix[n - 1] = 0;
        break;
    case MG_RDZV_K_PROTOCOL:
        if (strcasecmp(val, "http") && strcasecmp(val, "https"))
            return mg_seterr(err, errlen, -EINVAL,
                             "--rdzv_conf protocol=%s: expected http or https", val);
        c->https = strcasecmp(val, "https") == 0;
        break;
    case MG_RDZV_K_STORE_TYPE:
        /* torchrun's c10d backend: a TCPStore ("tcp") or a FileStore on a
         * shared file system ("file"). mg's store is its TCP store. */
        if (strcasecmp(val, "file") == 0)
            return mg_seterr(err, errlen, -EINVAL,
                             "--rdzv_conf store_type=file: mglaunch's c10d backend has no file "
                             "store; use store_type=tcp (the default: mg's store at "
                             "--rdzv_endpoint) or --rdzv_backend etcd");
        if (strcasecmp(val, "tcp"))
            return mg_seterr(err, errlen, -EINVAL, "--rdzv_conf store_type=%s: expected tcp", val);
        break;
    case MG_RDZV_K_USE_LIBUV:
        if (parse_bool(val, &b) < 0)
            return mg_seterr(err, errlen, -EINVAL, "--rdzv_conf %s=%s: expected true or false",
                             name, val);
        add_note(c,
                 "--rdzv_conf use_libuv=%s: no effect (it picks the event loop of torch's "
                 "TCPStore; mg's store has its own)",
                 val);
        break;
    case MG_RDZV_K_RANK: {
        int r;
        char *end;
        errno = 0;
        long v = strtol(val, &end, 10);
        if (errno || *end || end == val || v < 0 || v > INT_MAX)
            return mg_seterr(err, errlen, -EINVAL,
                             "--rdzv_conf rank=%s: expected a non-negative integer", val);
        r = (int)v;
        add_note(c,
                 "--rdzv_conf rank=%d: ignored; --node_rank gives the static backend's node "
                 "rank (torchrun overwrites rank with it too)",
                 r);
        break;
    }
    default:
        break;
    }
    c->set |= 1u << k;
    return 0;
}

int mg_rdzv_conf_parse(struct mg_rdzv_conf *c, const char *text, char *err, size_t errlen)
{
    char buf[MG_RDZV_CONF_MAX + 1];
    const char *spelled[MG_RDZV_K_COUNT] = {0};
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
        /* torchrun strips spaces around keys and values */
        for (char *t = eq - 1; t > item && *t == ' '; t--)
            *t = 0;
        char *val = eq + 1;
        while (*val == ' ')
            val++;
        for (size_t k = strlen(val); k > 0 && val[k - 1] == ' '; k--)
            val[k - 1] = 0;
        rc = set_one(c, item, val, &keep_alive_n, spelled, err, errlen);
        if (rc < 0)
            return rc;
    }
    if (c->timeout_ms && !c->join_timeout_given)
        c->join_timeout_ms = c->timeout_ms; /* the only name given */
    /* torchrun 2.x's keep_alive_interval alone: its keep_alive_max_attempt
     * defaults to 3 (dynamic_rendezvous.py). */
    if (!keep_alive_n && spelled[MG_RDZV_K_HEARTBEAT_INTERVAL] &&
        strcmp(spelled[MG_RDZV_K_HEARTBEAT_INTERVAL], "keep_alive_interval") == 0 &&
        !(c->set & (1u << MG_RDZV_K_HEARTBEAT_TIMEOUT)))
        keep_alive_n = 3;
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
    if (c->timeout_ms && c->join_timeout_given) {
        /* Both given: the name this backend reads in torchrun wins; the other
         * is what torchrun would ignore. */
        int use_timeout = backend != MG_RDZV_C10D;
        if (c->timeout_ms != c->join_timeout_ms)
            add_note(c,
                     "--rdzv_conf: join_timeout=%gs and timeout=%gs differ; the %s backend uses "
                     "%s, as torchrun's does",
                     c->join_timeout_ms / 1000.0, c->timeout_ms / 1000.0,
                     mg_rdzv_backend_name(backend), use_timeout ? "timeout" : "join_timeout");
        if (use_timeout)
            c->join_timeout_ms = c->timeout_ms;
        c->timeout_ms = 0;
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
        /* torchrun ignores the keys of other backends; so does mglaunch, aloud. */
        char *tls_dst[] = {c->cacert, c->cert, c->key};
        for (int i = 0; i < 3; i++)
            if (*tls_val[i]) {
                add_note(c, "--rdzv_conf %s: applies to the etcd backend only; ignored with %s",
                         tls[i], mg_rdzv_backend_name(backend));
                tls_dst[i][0] = 0;
            }
        if (c->set & (1u << MG_RDZV_K_PREFIX)) {
            add_note(c, "--rdzv_conf prefix: applies to the etcd backend only; ignored with %s",
                     mg_rdzv_backend_name(backend));
            snprintf(c->prefix, sizeof(c->prefix), "/mg/rdzv");
            c->set &= ~(1u << MG_RDZV_K_PREFIX);
        }
        if (c->set & (1u << MG_RDZV_K_PROTOCOL)) {
            add_note(c, "--rdzv_conf protocol: applies to the etcd backend only; ignored with %s",
                     mg_rdzv_backend_name(backend));
            c->https = 0;
        }
    } else {
        if (c->set & (1u << MG_RDZV_K_IS_HOST)) {
            add_note(c, "--rdzv_conf is_host: the etcd backend has no store to host; ignored (it "
                        "applies to c10d and static)");
            c->is_host = -1;
        }
        if (c->set & (1u << MG_RDZV_K_STORE_TYPE))
            add_note(c, "--rdzv_conf store_type: applies to the c10d backend only; ignored with "
                        "etcd");
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
