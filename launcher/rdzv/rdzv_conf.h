/* --rdzv_conf: the rendezvous settings (timeouts, liveness, store hosting,
 * authentication, etcd TLS), parsed from "key=value,key=value" and checked
 * against the backend. Every key torchrun 1.13 and 2.x read is accepted:
 * under its own name or as an alias of mg's (timeout, etcd_prefix, ca_cert,
 * ...), or, when mg has no use for it (use_libuv, rank), with a one-line
 * notice. A key neither knows is an error that lists the known ones.
 * docs/rendezvous.md lists every key, docs/torchrun-compat.md where each
 * torchrun key comes from. */
#ifndef MG_RDZV_CONF_H
#define MG_RDZV_CONF_H

#include <stddef.h>

#define MG_RDZV_CONF_MAX          4096 /* longest --rdzv_conf text accepted */
#define MG_RDZV_PATH_MAX          1024
#define MG_RDZV_TOKEN_MAX         256
#define MG_RDZV_PREFIX_MAX        256
#define MG_RDZV_NOTES_MAX         1024
#define MG_RDZV_EXCLUDE_AFTER_MAX 100

enum mg_rdzv_backend {
    MG_RDZV_STATIC,
    MG_RDZV_C10D,
    MG_RDZV_ETCD,
};

struct mg_rdzv_conf {
    int join_timeout_ms;         /* a round must form within this */
    int last_call_timeout_ms;    /* extra wait for more nodes once MIN have joined */
    int close_timeout_ms;        /* closing the rendezvous when the job ends */
    int heartbeat_interval_ms;   /* lease renewal and membership check period */
    int heartbeat_timeout_ms;    /* a node silent this long is dead */
    int exit_barrier_timeout_ms; /* a finished node waits this long for the others */
    int read_timeout_ms;         /* bound of one request to the store or etcd */
    /* Node exclusion (docs/rendezvous.md#node-exclusion): a node whose own
     * workers failed exclude_after times within exclude_window sits out
     * for exclude_cooldown, when the others stay at least --nnodes MIN.
     * exclude_after 0: never. */
    int exclude_after;
    int exclude_window_ms;
    int exclude_cooldown_ms;
    int is_host; /* -1: decide from the endpoint; 0/1: forced */
    /* torchrun reads join_timeout (c10d) or timeout (static, etcd), and TorchX
     * gives both; mg_rdzv_conf_finish() picks the backend's own (rendezvous.md). */
    int timeout_ms;         /* the value given as "timeout", 0 when not */
    int join_timeout_given; /* join_timeout was given under that name */
    char token[MG_RDZV_TOKEN_MAX + 1];
    char cacert[MG_RDZV_PATH_MAX];
    char cert[MG_RDZV_PATH_MAX];
    char key[MG_RDZV_PATH_MAX];
    char prefix[MG_RDZV_PREFIX_MAX];
    int https;    /* etcd: protocol=https, the scheme of endpoints that name none */
    unsigned set; /* bit per key given explicitly (enum mg_rdzv_conf_key) */
    /* What mglaunch should say about keys it accepts without acting on them,
     * one line per key ("" when nothing), without the "mglaunch: " prefix. */
    char notes[MG_RDZV_NOTES_MAX];
};

enum mg_rdzv_conf_key {
    MG_RDZV_K_JOIN_TIMEOUT,
    MG_RDZV_K_LAST_CALL_TIMEOUT,
    MG_RDZV_K_CLOSE_TIMEOUT,
    MG_RDZV_K_HEARTBEAT_INTERVAL,
    MG_RDZV_K_HEARTBEAT_TIMEOUT,
    MG_RDZV_K_EXIT_BARRIER_TIMEOUT,
    MG_RDZV_K_READ_TIMEOUT,
    MG_RDZV_K_IS_HOST,
    MG_RDZV_K_TOKEN,
    MG_RDZV_K_CACERT,
    MG_RDZV_K_CERT,
    MG_RDZV_K_KEY,
    MG_RDZV_K_PREFIX,
    MG_RDZV_K_PROTOCOL,
    MG_RDZV_K_STORE_TYPE,
    MG_RDZV_K_USE_LIBUV,
    MG_RDZV_K_RANK,
    MG_RDZV_K_KEEP_ALIVE_MAX_ATTEMPT,
    MG_RDZV_K_EXCLUDE_AFTER,
    MG_RDZV_K_EXCLUDE_WINDOW,
    MG_RDZV_K_EXCLUDE_COOLDOWN,
    MG_RDZV_K_COUNT
};

/* Defaults (documented in docs/rendezvous.md). */
void mg_rdzv_conf_init(struct mg_rdzv_conf *c);

/* Parses "k=v,k=v", mg's keys and torchrun's (see the top of this file).
 * Durations are seconds, with an optional "s" or "ms" suffix and decimals
 * ("0.5", "500ms"). A key given under two of its names (ca_cert and
 * cacert) is an error, except timeout and join_timeout, which torchrun's
 * backends read each on their own (mg_rdzv_conf_finish() picks one). On error returns -EINVAL and writes a message
 * naming the key and value into err. */
int mg_rdzv_conf_parse(struct mg_rdzv_conf *c, const char *text, char *err, size_t errlen);

/* Takes the token from MG_RDZV_TOKEN when the conf has none (env may be NULL
 * to use the process environment), then checks the settings together and
 * against the backend (heartbeat_timeout >= 2 intervals, TLS files
 * readable). With both join_timeout and timeout, the one the backend reads
 * in torchrun wins (c10d: join_timeout; static, etcd: timeout), with a note
 * when they differ. A key that applies to another backend only (the etcd TLS files
 * with c10d, is_host with etcd) is dropped with a note, as torchrun ignores
 * it. -EINVAL with a message in err. */
int mg_rdzv_conf_finish(struct mg_rdzv_conf *c, enum mg_rdzv_backend backend, char *const *env,
                        char *err, size_t errlen);

/* Parses a backend name ("static", "c10d", "etcd", "etcd-v2" is refused). */
int mg_rdzv_backend_parse(const char *name, enum mg_rdzv_backend *out);
const char *mg_rdzv_backend_name(enum mg_rdzv_backend b);

/* Parses a duration as above into milliseconds. */
int mg_rdzv_parse_duration_ms(const char *s, int *ms);

#endif
