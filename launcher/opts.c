/* mglaunch's option parsing and checks (see opts.h, docs/cli.md). */
#include "opts.h"
#include "redact.h"
#include "suggest.h"
#include "output.h"
#include "proc.h"
#include "mg_err.h"
#include "net.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STR_(x) #x
#define STR(x)  STR_(x) /* a numeric macro as a string literal */

enum opt_kind {
    OPT_FLAG,
    OPT_VALUE,
    OPT_LIST, /* may be repeated; values accumulate */
};

enum opt_id {
    O_NNODES,
    O_NPROC,
    O_RDZV_BACKEND,
    O_RDZV_ENDPOINT,
    O_RDZV_ID,
    O_RDZV_CONF,
    O_STANDALONE,
    O_MAX_RESTARTS,
    O_MONITOR_INTERVAL,
    O_START_METHOD,
    O_ROLE,
    O_MODULE,
    O_NO_PYTHON,
    O_RUN_PATH,
    O_LOG_DIR,
    O_REDIRECTS,
    O_TEE,
    O_NODE_RANK,
    O_MASTER_ADDR,
    O_MASTER_PORT,
    O_LOCAL_ADDR,
    O_LOGS_SPECS,
    O_RANKS_FILTER,
    O_PREFIX_TMPL,
    O_GPU_IDS,
    O_SHUTDOWN_TIMEOUT,
    O_STOP_GROUP_DELAY,
    O_EXIT_BARRIER_TIMEOUT,
    O_HANG_TIMEOUT,
    O_SIGNALS_TO_HANDLE,
    O_VIRTUAL_LOCAL_RANK,
    O_NUMA_BINDING,
    O_EVENT_LOG_HANDLER,
    O_DUP_STDOUT,
    O_DUP_STDERR,
    O_HELP,
    O_VERSION,
    O_COUNT
};

static const struct opt_def {
    const char *name; /* canonical spelling, underscores */
    char shortc;
    enum opt_kind kind;
    int pet; /* has a PET_<NAME> fallback */
} defs[O_COUNT] = {
    [O_NNODES] = {"nnodes", 0, OPT_VALUE, 1},
    [O_NPROC] = {"nproc_per_node", 0, OPT_VALUE, 1},
    [O_RDZV_BACKEND] = {"rdzv_backend", 0, OPT_VALUE, 1},
    [O_RDZV_ENDPOINT] = {"rdzv_endpoint", 0, OPT_VALUE, 1},
    [O_RDZV_ID] = {"rdzv_id", 0, OPT_VALUE, 1},
    [O_RDZV_CONF] = {"rdzv_conf", 0, OPT_VALUE, 1},
    [O_STANDALONE] = {"standalone", 0, OPT_FLAG, 1},
    [O_MAX_RESTARTS] = {"max_restarts", 0, OPT_VALUE, 1},
    [O_MONITOR_INTERVAL] = {"monitor_interval", 0, OPT_VALUE, 1},
    [O_START_METHOD] = {"start_method", 0, OPT_VALUE, 1},
    [O_ROLE] = {"role", 0, OPT_VALUE, 1},
    [O_MODULE] = {"module", 'm', OPT_FLAG, 1},
    [O_NO_PYTHON] = {"no_python", 0, OPT_FLAG, 1},
    [O_RUN_PATH] = {"run_path", 0, OPT_FLAG, 1},
    [O_LOG_DIR] = {"log_dir", 0, OPT_VALUE, 1},
    [O_REDIRECTS] = {"redirects", 'r', OPT_VALUE, 1},
    [O_TEE] = {"tee", 't', OPT_VALUE, 1},
    [O_NODE_RANK] = {"node_rank", 0, OPT_VALUE, 1},
    [O_MASTER_ADDR] = {"master_addr", 0, OPT_VALUE, 1},
    [O_MASTER_PORT] = {"master_port", 0, OPT_VALUE, 1},
    [O_LOCAL_ADDR] = {"local_addr", 0, OPT_VALUE, 1},
    [O_LOGS_SPECS] = {"logs_specs", 0, OPT_VALUE, 1},
    [O_RANKS_FILTER] = {"local_ranks_filter", 0, OPT_VALUE, 1},
    [O_PREFIX_TMPL] = {"log_line_prefix_template", 0, OPT_VALUE, 1},
    [O_GPU_IDS] = {"gpu_ids", 0, OPT_LIST, 1},
    [O_SHUTDOWN_TIMEOUT] = {"shutdown_timeout", 0, OPT_VALUE, 1},
    [O_STOP_GROUP_DELAY] = {"stop_group_delay", 0, OPT_VALUE, 1},
    [O_EXIT_BARRIER_TIMEOUT] = {"exit_barrier_timeout", 0, OPT_VALUE, 1},
    [O_HANG_TIMEOUT] = {"hang_timeout", 0, OPT_VALUE, 1},
    [O_SIGNALS_TO_HANDLE] = {"signals_to_handle", 0, OPT_VALUE, 1},
    [O_VIRTUAL_LOCAL_RANK] = {"virtual_local_rank", 0, OPT_FLAG, 1},
    [O_NUMA_BINDING] = {"numa_binding", 0, OPT_VALUE, 1},
    [O_EVENT_LOG_HANDLER] = {"event_log_handler", 0, OPT_VALUE, 1},
    [O_DUP_STDOUT] = {"duplicate_stdout_filters", 0, OPT_VALUE, 1},
    [O_DUP_STDERR] = {"duplicate_stderr_filters", 0, OPT_VALUE, 1},
    [O_HELP] = {"help", 'h', OPT_FLAG, 0},
    [O_VERSION] = {"version", 'V', OPT_FLAG, 0},
};

struct seen {
    int set;
    int from_env;
    const char *val;
    char src[64]; /* the spelling used: "--nproc-per-node", "-r", "PET_TEE" */
};

struct parse {
    struct mg_launch_opts *o;
    struct seen s[O_COUNT];
    char *err;
    size_t errcap;
};

__attribute__((format(printf, 2, 3))) static int fail(struct parse *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = mg_vseterr(p->err, p->errcap, -EINVAL, fmt, ap);
    va_end(ap);
    return rc;
}

/* "--nproc_per_node" or "PET_NPROC_PER_NODE (--nproc_per_node)" */
static const char *label(struct parse *p, int id, char *buf, size_t cap)
{
    if (p->s[id].from_env)
        snprintf(buf, cap, "%s (--%s)", p->s[id].src, defs[id].name);
    else
        snprintf(buf, cap, "%s", p->s[id].src);
    return buf;
}

static int bad_value(struct parse *p, int id, const char *val, const char *why)
{
    char l[160];
    return fail(p, "invalid value '%s' for %s: %s", val, label(p, id, l, sizeof(l)), why);
}

/* Strict decimal integer in [min, max]. */
static int parse_int(const char *s, long min, long max, int *out)
{
    char *end;
    if (!s || !*s)
        return -EINVAL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < min || v > max || *s == ' ')
        return -EINVAL;
    *out = (int)v;
    return 0;
}

static int parse_double(const char *s, double min, double max, double *out)
{
    char *end;
    if (!s || !*s || *s == ' ')
        return -EINVAL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < min || v > max)
        return -EINVAL;
    *out = v;
    return 0;
}

int mg_stdmap_parse(const char *s, struct mg_stdmap *m)
{
    memset(m, 0, sizeof(*m));
    if (!s || !*s)
        return -EINVAL;
    if (s[0] >= '0' && s[0] <= '3' && s[1] == '\0') {
        m->all = s[0] - '0';
        return 0;
    }
    m->is_map = 1;
    const char *p = s;
    for (;;) {
        /* <digits>:<0-3> */
        if (*p < '0' || *p > '9')
            return -EINVAL;
        long rank = 0;
        while (*p >= '0' && *p <= '9') {
            rank = rank * 10 + (*p - '0');
            if (rank >= MG_MAX_NPROC)
                return -EINVAL;
            p++;
        }
        if (*p++ != ':' || *p < '0' || *p > '3')
            return -EINVAL;
        int val = *p++ - '0';
        if (m->n >= MG_STDMAP_MAX)
            return -EINVAL;
        int k;
        for (k = 0; k < m->n; k++) /* a repeated rank: the last one wins, like a dict */
            if (m->e[k].rank == (int)rank)
                break;
        m->e[k].rank = (int)rank;
        m->e[k].val = val;
        if (k == m->n)
            m->n++;
        if (*p == '\0')
            return 0;
        if (*p++ != ',')
            return -EINVAL;
    }
}

int mg_stdmap_get(const struct mg_stdmap *m, int local_rank)
{
    if (!m->is_map)
        return m->all;
    for (int i = 0; i < m->n; i++)
        if (m->e[i].rank == local_rank)
            return m->e[i].val;
    return MG_STD_NONE;
}

/* Finds a long option by name (dashes already turned into underscores):
 * exact, else a unique prefix, as argparse allows. */
static int find_long(struct parse *p, const char *name, const char *typed)
{
    int match = -1, nmatch = 0;
    size_t n = strlen(name);
    for (int i = 0; i < O_COUNT; i++) {
        if (strcmp(defs[i].name, name) == 0)
            return i;
        if (n && strncmp(defs[i].name, name, n) == 0) {
            match = i;
            nmatch++;
        }
    }
    if (nmatch == 1)
        return match;
    if (nmatch > 1) {
        char list[256] = "";
        size_t len = 0;
        for (int i = 0; i < O_COUNT; i++)
            if (strncmp(defs[i].name, name, n) == 0 && len < sizeof(list) - 40)
                len += (size_t)snprintf(list + len, sizeof(list) - len, "%s--%s", len ? ", " : "",
                                        defs[i].name);
        return fail(p, "ambiguous option '%s': could be %s", typed, list);
    }
    const char *names[O_COUNT];
    for (int i = 0; i < O_COUNT; i++)
        names[i] = defs[i].name;
    int near = mg_suggest(name, names, O_COUNT);
    if (near >= 0)
        return fail(p, "unknown option '%s': did you mean --%s?", typed, defs[near].name);
    return fail(p, "unknown option '%s' (see mglaunch --help)", typed);
}

static int looks_like_option(const char *s)
{
    if (s[0] != '-' || s[1] == '\0')
        return 0;
    if ((s[1] >= '0' && s[1] <= '9') || s[1] == '.') /* a negative number */
        return 0;
    return 1;
}

static int record(struct parse *p, int id, const char *val, const char *src)
{
    struct seen *s = &p->s[id];
    struct mg_launch_opts *o = p->o;
    snprintf(s->src, sizeof(s->src), "%s", src);
    if (defs[id].kind == OPT_LIST) {
        size_t have = strlen(o->gpu_ids), add = strlen(val);
        if (have + add + 2 > sizeof(o->gpu_ids))
            return fail(p, "too many GPU ids for %s (at most %d bytes)", src, MG_GPU_IDS_MAX);
        if (have)
            o->gpu_ids[have++] = ',';
        memcpy(o->gpu_ids + have, val, add + 1);
    }
    s->set = 1;
    s->val = val;
    return 0;
}

static int parse_argv(struct parse *p, int argc, char **argv, int *prog_index)
{
    int i;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        char typed[64], name[64];
        int id;

        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0')
            break; /* the program; everything after it is its own */
        if (a[1] == '-') {
            const char *body = a + 2, *eq = strchr(body, '=');
            size_t n = eq ? (size_t)(eq - body) : strlen(body);
            if (n + 3 > sizeof(typed))
                return fail(p, "unknown option '%.60s...' (see mglaunch --help)", a);
            snprintf(typed, sizeof(typed), "--%.*s", (int)n, body);
            for (size_t k = 0; k < n; k++)
                name[k] = body[k] == '-' ? '_' : body[k];
            name[n] = '\0';
            id = find_long(p, name, typed);
            if (id < 0)
                return id;
            if (eq)
                val = eq + 1;
        } else {
            id = -1;
            for (int k = 0; k < O_COUNT; k++)
                if (defs[k].shortc && defs[k].shortc == a[1])
                    id = k;
            snprintf(typed, sizeof(typed), "-%c", a[1]);
            if (id < 0 || (defs[id].kind == OPT_FLAG && a[2]))
                return fail(p, "unknown option '%s' (see mglaunch --help)", a);
            if (a[2])
                val = a[2] == '=' ? a + 3 : a + 2;
        }
        if (defs[id].kind == OPT_FLAG) {
            if (val)
                return fail(p, "option %s takes no value (got '%s')", typed, val);
            record(p, id, "1", typed);
            if (id == O_HELP || id == O_VERSION) {
                *prog_index = -1;
                return 0;
            }
            continue;
        }
        if (!val) {
            if (i + 1 >= argc || looks_like_option(argv[i + 1]))
                return fail(p, "option %s needs a value", typed);
            val = argv[++i];
        }
        int rc = record(p, id, val, typed);
        if (rc)
            return rc;
    }
    *prog_index = i;
    return 0;
}

static int apply_env(struct parse *p, char **env)
{
    for (int id = 0; id < O_COUNT; id++) {
        char var[64];
        if (!defs[id].pet || p->s[id].set)
            continue;
        size_t k = (size_t)snprintf(var, sizeof(var), "PET_");
        for (const char *c = defs[id].name; *c && k < sizeof(var) - 1; c++)
            var[k++] = (char)(*c >= 'a' && *c <= 'z' ? *c - 'a' + 'A' : *c);
        var[k] = '\0';
        const char *v = mg_env_get(env, var);
        /* Empty counts as unset, except for a switch: Kubeflow's PyTorchJob
         * sets PET_STANDALONE="" for "standalone: true". */
        if (!v || (!*v && defs[id].kind != OPT_FLAG))
            continue;
        p->s[id].from_env = 1;
        if (defs[id].kind == OPT_FLAG) {
            int b = 1;
            snprintf(p->s[id].src, sizeof(p->s[id].src), "%s", var);
            if (*v && parse_int(v, INT_MIN, INT_MAX, &b))
                return bad_value(p, id, v, "expected 0 or 1");
            p->s[id].set = b != 0;
            p->s[id].val = v;
            continue;
        }
        int rc = record(p, id, v, var);
        if (rc)
            return rc;
    }
    /* torchrun 2.x reads these two from the environment, after the flags
     * (run.py, agent/server/api.py); so does mglaunch, after PET_ too. */
    static const struct {
        int id;
        const char *var;
    } torch_env[] = {
        {O_PREFIX_TMPL, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"},
        {O_SHUTDOWN_TIMEOUT, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"},
        {O_STOP_GROUP_DELAY, "MG_STOP_GROUP_DELAY"},
        {O_EXIT_BARRIER_TIMEOUT, "TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT"},
        {O_HANG_TIMEOUT, "MG_HANG_TIMEOUT"}, /* mg's own, for job specs that set variables */
    };
    for (size_t i = 0; i < sizeof(torch_env) / sizeof(torch_env[0]); i++) {
        int id = torch_env[i].id;
        const char *v = mg_env_get(env, torch_env[i].var);
        if (p->s[id].set || !v || !*v)
            continue;
        p->s[id].from_env = 1;
        int rc = record(p, id, v, torch_env[i].var);
        if (rc)
            return rc;
    }
    return 0;
}

/* --signals-to-handle: torchrun's comma-separated names (SIGTERM,SIGUSR1);
 * TERM and numbers work too. Signals mglaunch needs for itself, or that
 * cannot be caught, are refused. */
static int check_signals(struct parse *p, const char *v)
{
    struct mg_launch_opts *o = p->o;
    char buf[512], why[160];
    if (strlen(v) >= sizeof(buf))
        return bad_value(p, O_SIGNALS_TO_HANDLE, "...", "too long");
    snprintf(buf, sizeof(buf), "%s", v);
    o->nsignals = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ')
            t++;
        for (size_t n = strlen(t); n && t[n - 1] == ' '; n--)
            t[n - 1] = '\0';
        if (!*t)
            continue;
        int sig = mg_signum(t);
        if (sig < 0) {
            snprintf(why, sizeof(why), "'%s' is not a signal name (like SIGTERM,SIGUSR1)", t);
            return bad_value(p, O_SIGNALS_TO_HANDLE, v, why);
        }
        switch (sig) {
        case SIGKILL:
        case SIGSTOP:
        case SIGSEGV:
        case SIGBUS:
        case SIGFPE:
        case SIGILL:
            snprintf(why, sizeof(why), "%s cannot be handled", t);
            return bad_value(p, O_SIGNALS_TO_HANDLE, v, why);
        case SIGCHLD:
        case SIGCONT:
        case SIGTSTP:
        case SIGTTIN:
        case SIGTTOU:
        case SIGWINCH:
        case SIGPIPE:
            snprintf(why, sizeof(why), "mglaunch handles %s itself", t);
            return bad_value(p, O_SIGNALS_TO_HANDLE, v, why);
        }
        int dup = 0;
        for (int i = 0; i < o->nsignals; i++)
            dup |= o->signals[i] == sig;
        if (dup)
            continue;
        if (o->nsignals == MG_MAX_SIGNALS)
            return bad_value(p, O_SIGNALS_TO_HANDLE, v, "too many signals");
        o->signals[o->nsignals++] = sig;
    }
    o->signals_given = 1;
    return 0;
}

/* --duplicate-std*-filters: comma-separated substrings, ",," for a comma
 * (torchrun's comma_separated_list), kept '\0'-separated. */
static int check_filters(struct parse *p, int id, int stream)
{
    struct mg_launch_opts *o = p->o;
    const char *v = p->s[id].val;
    size_t n = strlen(v);
    char *out = malloc(n + 2);
    if (!out)
        return fail(p, "out of memory");
    size_t k = 0;
    int count = 0;
    for (const char *c = v;; c++) {
        if (*c == ',' && c[1] == ',') {
            out[k++] = ',';
            c++;
            continue;
        }
        if (*c == ',' || !*c) {
            out[k++] = '\0';
            count++;
            if (!*c)
                break;
            continue;
        }
        out[k++] = *c;
    }
    out[k] = '\0';
    if (count > MG_MAX_FILTERS) {
        free(out);
        return bad_value(p, id, v, "more than 64 filters");
    }
    o->dup_filters[stream] = out;
    o->ndup_filters[stream] = count;
    return 0;
}

static const char *const numa_names[] = {
    [MG_NUMA_NODE] = "node",
    [MG_NUMA_SOCKET] = "socket",
    [MG_NUMA_EXCLUSIVE] = "exclusive",
    [MG_NUMA_CORE_COMPLEX] = "core-complex",
};

static int check_gpu_ids(struct parse *p)
{
    struct mg_launch_opts *o = p->o;
    const char *s = o->gpu_ids;
    o->ngpu_ids = 0;
    if (!*s)
        return bad_value(p, O_GPU_IDS, s, "expected GPU ids like 0,1");
    while (*s) {
        const char *c = strchr(s, ',');
        size_t n = c ? (size_t)(c - s) : strlen(s);
        char id[MG_GPU_ID_LEN];
        int digits = 1, uuid = 1;
        if (n == 0 || n >= sizeof(id))
            return bad_value(p, O_GPU_IDS, o->gpu_ids, "expected GPU ids like 0,1");
        memcpy(id, s, n);
        id[n] = '\0';
        for (size_t k = 0; k < n; k++) {
            char ch = id[k];
            if (ch < '0' || ch > '9')
                digits = 0;
            if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') ||
                  (ch >= 'A' && ch <= 'Z') || ch == '-' || ch == '/'))
                uuid = 0;
        }
        if (strncmp(id, "GPU-", 4) && strncmp(id, "MIG-", 4))
            uuid = 0;
        if ((!digits || n > 5) && !uuid) {
            char why[160];
            snprintf(why, sizeof(why),
                     "'%s' is not a GPU index or GPU-/MIG- UUID (expected ids like 0,1)", id);
            return bad_value(p, O_GPU_IDS, o->gpu_ids, why);
        }
        /* a repeated id would put two workers on one GPU by accident */
        for (int k = 0; k < o->ngpu_ids; k++) {
            char other[MG_GPU_ID_LEN];
            mg_opts_gpu_id(o, k, other, sizeof(other));
            if (strcmp(other, id) == 0) {
                char why[160];
                snprintf(why, sizeof(why), "GPU id %s is listed twice", id);
                return bad_value(p, O_GPU_IDS, o->gpu_ids, why);
            }
        }
        if (++o->ngpu_ids > MG_MAX_NPROC)
            return bad_value(p, O_GPU_IDS, o->gpu_ids, "too many GPU ids");
        s += n + (c ? 1 : 0);
        if (c && !*s)
            return bad_value(p, O_GPU_IDS, o->gpu_ids, "expected GPU ids like 0,1");
    }
    return 0;
}

static int check_filter(struct parse *p, const char *v)
{
    struct mg_launch_opts *o = p->o;
    int cap = 1;
    for (const char *c = v; *c; c++)
        cap += *c == ',';
    if (cap > MG_MAX_NPROC)
        return bad_value(p, O_RANKS_FILTER, v, "too many ranks");
    o->ranks_filter = calloc((size_t)cap, sizeof(int));
    if (!o->ranks_filter)
        return fail(p, "out of memory");
    const char *s = v;
    for (;;) {
        char num[16];
        const char *c = strchr(s, ',');
        size_t n = c ? (size_t)(c - s) : strlen(s);
        int r;
        if (n == 0 || n >= sizeof(num))
            return bad_value(p, O_RANKS_FILTER, v, "expected local ranks like 0,1,2");
        memcpy(num, s, n);
        num[n] = '\0';
        if (parse_int(num, 0, MG_MAX_NPROC - 1, &r))
            return bad_value(p, O_RANKS_FILTER, v, "expected local ranks like 0,1,2");
        o->ranks_filter[o->nranks_filter++] = r;
        if (!c)
            break;
        s = c + 1;
    }
    return 0;
}

/* A host for MASTER_ADDR as torchrun takes it: a name, an IPv4 address, an
 * IPv6 address bare or in brackets ("[::1]", as torchrun's help asks). The
 * brackets are dropped, as torchrun does (rendezvous/utils.py), since torch's
 * TCPStore cannot resolve "[::1]" and its workers would wait for nothing. */
static int check_addr(struct parse *p, int id, const char *v, char *buf, size_t cap,
                      const char **out)
{
    size_t n = strlen(v);
    if (!*v || n >= cap || strpbrk(v, " \t\n/"))
        return bad_value(p, id, v, "expected a host name or address");
    if (v[0] == '[') {
        const char *close = strchr(v, ']');
        if (!close || close == v + 1)
            return bad_value(p, id, v, "expected an IPv6 address in brackets, like [::1]");
        if (close[1] == ':')
            return bad_value(p, id, v,
                             id == O_MASTER_ADDR
                                 ? "expected a host without a port; the port goes in --master_port"
                                 : "expected a host without a port");
        if (close[1])
            return bad_value(p, id, v, "expected an IPv6 address in brackets, like [::1]");
        memcpy(buf, v + 1, (size_t)(close - v - 1));
        buf[close - v - 1] = '\0';
        *out = buf;
        return 0;
    }
    if (strchr(v, '[') || strchr(v, ']'))
        return bad_value(p, id, v, "expected a host name or address");
    *out = v;
    return 0;
}

static int check_run_id(struct parse *p, const char *v)
{
    size_t n = strlen(v);
    if (n == 0 || n > MG_RUN_ID_MAX)
        return bad_value(p, O_RDZV_ID, v, "expected 1 to 128 characters");
    if (strcmp(v, ".") == 0 || strcmp(v, "..") == 0 || strchr(v, '/'))
        return bad_value(p, O_RDZV_ID, v, "it names the log directory: no '/', '.' or '..'");
    for (const char *c = v; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            return bad_value(p, O_RDZV_ID, v, "control characters are not allowed");
    return 0;
}

/* Turns the recorded strings into values, in the order of the table. */
static int check_values(struct parse *p)
{
    struct mg_launch_opts *o = p->o;
    struct seen *s = p->s;
    int rc;

    if (s[O_NNODES].set) {
        const char *v = s[O_NNODES].val, *colon = strchr(v, ':');
        char a[16];
        int lo, hi;
        if (colon) {
            size_t n = (size_t)(colon - v);
            if (n >= sizeof(a))
                return bad_value(p, O_NNODES, v, "expected N or MIN:MAX");
            memcpy(a, v, n);
            a[n] = '\0';
            if (parse_int(a, 1, MG_MAX_NNODES, &lo) ||
                parse_int(colon + 1, 1, MG_MAX_NNODES, &hi) || lo > hi)
                return bad_value(
                    p, O_NNODES, v,
                    "expected N or MIN:MAX with 1 <= MIN <= MAX <= " STR(MG_MAX_NNODES));
        } else {
            if (parse_int(v, 1, MG_MAX_NNODES, &lo))
                return bad_value(
                    p, O_NNODES, v,
                    "expected N or MIN:MAX with 1 <= MIN <= MAX <= " STR(MG_MAX_NNODES));
            hi = lo;
        }
        o->nnodes_min = lo;
        o->nnodes_max = hi;
        o->nnodes_given = 1;
    }
    if (s[O_NPROC].set) {
        const char *v = s[O_NPROC].val;
        label(p, O_NPROC, o->nproc_src, sizeof(o->nproc_src));
        if (strcmp(v, "cpu") == 0)
            o->nproc_kind = MG_NPROC_CPU;
        else if (strcmp(v, "gpu") == 0)
            o->nproc_kind = MG_NPROC_GPU;
        else if (strcmp(v, "xpu") == 0)
            o->nproc_kind = MG_NPROC_XPU;
        else if (strcmp(v, "auto") == 0)
            o->nproc_kind = MG_NPROC_AUTO;
        else if (parse_int(v, 1, MG_MAX_NPROC, &o->nproc))
            return bad_value(p, O_NPROC, v,
                             "expected an integer from 1 to 4096, cpu, gpu, xpu or auto");
    }
    if (s[O_RDZV_BACKEND].set) {
        const char *v = s[O_RDZV_BACKEND].val;
        if (strcmp(v, "etcd-v2") == 0)
            return bad_value(p, O_RDZV_BACKEND, v,
                             "etcd's v2 API is gone from etcd 3.6; use etcd (the v3 API)");
        if (strcmp(v, "static") && strcmp(v, "c10d") && strcmp(v, "etcd") && strcmp(v, "etcd-v3"))
            return bad_value(p, O_RDZV_BACKEND, v, "expected static, c10d, etcd or etcd-v2");
        o->rdzv_backend = v;
    }
    if (s[O_RDZV_ENDPOINT].set && *s[O_RDZV_ENDPOINT].val) {
        struct mg_hostport hp;
        const char *v = s[O_RDZV_ENDPOINT].val;
        /* etcd takes a list of URLs, checked where it is opened (kv_etcd.c) */
        int etcd = o->rdzv_backend && strncmp(o->rdzv_backend, "etcd", 4) == 0;
        if (!etcd && strstr(v, "://"))
            return bad_value(p, O_RDZV_ENDPOINT, v,
                             "expected HOST[:PORT] without a scheme (URLs are for "
                             "--rdzv_backend etcd)");
        const char *at = strrchr(v, '@');
        char l[160];
        if (!etcd && at &&
            !strstr(v, "://")) /* user:password@host: the part before @ is not shown */
            return fail(p,
                        "invalid value '" MG_REDACTED "%s' for %s: expected HOST[:PORT], without a "
                        "user or password (the store's secret goes in MG_RDZV_TOKEN)",
                        at, label(p, O_RDZV_ENDPOINT, l, sizeof(l)));
        if (!etcd && mg_parse_hostport(v, 29400, &hp))
            return bad_value(p, O_RDZV_ENDPOINT, v, "expected HOST[:PORT]");
        o->rdzv_endpoint = s[O_RDZV_ENDPOINT].val;
    }
    if (s[O_RDZV_ID].set) {
        if ((rc = check_run_id(p, s[O_RDZV_ID].val)))
            return rc;
        o->rdzv_id = s[O_RDZV_ID].val;
    }
    if (s[O_RDZV_CONF].set && *s[O_RDZV_CONF].val)
        o->rdzv_conf = s[O_RDZV_CONF].val;
    o->standalone = s[O_STANDALONE].set;
    /* torchrun takes --standalone --nnodes 2 and then waits for a second node
     * that can never join a fresh run id on a local endpoint. */
    if (o->standalone && o->nnodes_max > 1) {
        char l1[160], l2[160];
        return fail(p,
                    "%s is a single-node run: it cannot be combined with %s %s (for several "
                    "nodes, give every node --rdzv_backend c10d --rdzv_endpoint HOST:PORT "
                    "--rdzv_id ID instead)",
                    label(p, O_STANDALONE, l1, sizeof(l1)), label(p, O_NNODES, l2, sizeof(l2)),
                    s[O_NNODES].val);
    }
    if (s[O_MAX_RESTARTS].set && parse_int(s[O_MAX_RESTARTS].val, 0, 1000000, &o->max_restarts))
        return bad_value(p, O_MAX_RESTARTS, s[O_MAX_RESTARTS].val,
                         "expected a non-negative integer");
    if (s[O_MONITOR_INTERVAL].set &&
        (parse_double(s[O_MONITOR_INTERVAL].val, 0, 1e6, &o->monitor_interval) ||
         o->monitor_interval <= 0))
        return bad_value(p, O_MONITOR_INTERVAL, s[O_MONITOR_INTERVAL].val,
                         "expected a positive number of seconds");
    if (s[O_START_METHOD].set) {
        const char *v = s[O_START_METHOD].val;
        if (strcmp(v, "spawn") && strcmp(v, "fork") && strcmp(v, "forkserver"))
            return bad_value(p, O_START_METHOD, v, "expected spawn, fork or forkserver");
        o->start_method = v;
    }
    if (s[O_ROLE].set) {
        const char *v = s[O_ROLE].val;
        /* Empty is torchrun's too: TorchX's dist.ddp passes --role '', and the
         * workers get ROLE_NAME="" and the prefix "[0]:". */
        if (strlen(v) > 64)
            return bad_value(p, O_ROLE, v, "expected a name of at most 64 characters");
        o->role = v;
    }
    o->module = s[O_MODULE].set;
    o->no_python = s[O_NO_PYTHON].set;
    if (o->module && o->no_python)
        return fail(p, "--no_python and --module cannot be used together");
    /* torchrun: runpy.run_path in the worker's interpreter, taking precedence
     * over --no_python; here, python3 -u PROGRAM whatever its name. */
    o->run_path = s[O_RUN_PATH].set;
    if (o->run_path && o->module)
        return fail(p, "--run_path and --module cannot be used together");
    if (s[O_LOG_DIR].set) {
        if (!*s[O_LOG_DIR].val)
            return bad_value(p, O_LOG_DIR, "", "expected a directory");
        if (strlen(s[O_LOG_DIR].val) > 3000)
            return bad_value(p, O_LOG_DIR, "...", "path too long");
        o->log_dir = s[O_LOG_DIR].val;
    }
    if (s[O_REDIRECTS].set && mg_stdmap_parse(s[O_REDIRECTS].val, &o->redirects))
        return bad_value(p, O_REDIRECTS, s[O_REDIRECTS].val,
                         "expected 0-3 or a per-rank map like 0:3,1:1");
    if (s[O_TEE].set && mg_stdmap_parse(s[O_TEE].val, &o->tee))
        return bad_value(p, O_TEE, s[O_TEE].val, "expected 0-3 or a per-rank map like 0:3,1:1");
    if (s[O_NODE_RANK].set) {
        if (parse_int(s[O_NODE_RANK].val, 0, INT_MAX, &o->node_rank))
            return bad_value(p, O_NODE_RANK, s[O_NODE_RANK].val, "expected a non-negative integer");
        if (o->node_rank >= o->nnodes_max)
            return bad_value(p, O_NODE_RANK, s[O_NODE_RANK].val, "must be less than --nnodes");
        o->node_rank_given = 1;
    }
    if (s[O_MASTER_ADDR].set &&
        (rc = check_addr(p, O_MASTER_ADDR, s[O_MASTER_ADDR].val, o->master_addr_buf,
                         sizeof(o->master_addr_buf), &o->master_addr)))
        return rc;
    if (s[O_MASTER_PORT].set && parse_int(s[O_MASTER_PORT].val, 0, 65535, &o->master_port))
        return bad_value(p, O_MASTER_PORT, s[O_MASTER_PORT].val,
                         "expected a port number from 0 to 65535");
    if (s[O_LOCAL_ADDR].set &&
        (rc = check_addr(p, O_LOCAL_ADDR, s[O_LOCAL_ADDR].val, o->local_addr_buf,
                         sizeof(o->local_addr_buf), &o->local_addr)))
        return rc;
    if (s[O_LOGS_SPECS].set) {
        char l[160];
        snprintf(p->err, p->errcap,
                 "%s %s: names a Python class (a torchrun.logs_specs entry point) that "
                 "mglaunch cannot load; its log layout is fixed (docs/logs.md): use --log_dir, "
                 "-r/-t, --local_ranks_filter and --log_line_prefix_template to shape it, and "
                 "`mglaunch logs` to read it",
                 label(p, O_LOGS_SPECS, l, sizeof(l)), s[O_LOGS_SPECS].val);
        return -MG_EUNSUPPORTED;
    }
    if (s[O_RANKS_FILTER].set) {
        label(p, O_RANKS_FILTER, o->filter_src, sizeof(o->filter_src));
        if ((rc = check_filter(p, s[O_RANKS_FILTER].val)))
            return rc;
    }
    if (s[O_PREFIX_TMPL].set) {
        const char *v = s[O_PREFIX_TMPL].val, *bad = NULL;
        char out[1024];
        struct mg_prefix_vars vars = {"default", 0, 0, "host"};
        if (strlen(v) > MG_PREFIX_TMPL_MAX)
            return bad_value(p, O_PREFIX_TMPL, v, "longer than 256 characters");
        if (mg_prefix_expand(v, &vars, out, sizeof(out), &bad) == -EINVAL) {
            char why[200];
            snprintf(why, sizeof(why),
                     "unknown placeholder at '%.20s' (known: ${role_name}, ${local_rank}, "
                     "${rank}, ${hostname}; $$ for $)",
                     bad ? bad : "");
            return bad_value(p, O_PREFIX_TMPL, v, why);
        }
        o->prefix_template = v;
    }
    if (s[O_GPU_IDS].set) {
        label(p, O_GPU_IDS, o->gpu_ids_src, sizeof(o->gpu_ids_src));
        if ((rc = check_gpu_ids(p)))
            return rc;
    }
    if (s[O_SHUTDOWN_TIMEOUT].set &&
        parse_double(s[O_SHUTDOWN_TIMEOUT].val, 0, 1e6, &o->shutdown_timeout))
        return bad_value(p, O_SHUTDOWN_TIMEOUT, s[O_SHUTDOWN_TIMEOUT].val,
                         "expected a number of seconds (0 or more)");
    if (s[O_STOP_GROUP_DELAY].set &&
        parse_double(s[O_STOP_GROUP_DELAY].val, 0, 1e6, &o->stop_group_delay))
        return bad_value(p, O_STOP_GROUP_DELAY, s[O_STOP_GROUP_DELAY].val,
                         "expected a number of seconds (0 or more; 0: the whole process group at "
                         "once, as torchrun)");
    if (s[O_EXIT_BARRIER_TIMEOUT].set &&
        (parse_double(s[O_EXIT_BARRIER_TIMEOUT].val, 0, 1e6, &o->exit_barrier_timeout) ||
         o->exit_barrier_timeout <= 0))
        return bad_value(p, O_EXIT_BARRIER_TIMEOUT, s[O_EXIT_BARRIER_TIMEOUT].val,
                         "expected a positive number of seconds");
    if (s[O_HANG_TIMEOUT].set && parse_double(s[O_HANG_TIMEOUT].val, 0, 1e6, &o->hang_timeout))
        return bad_value(p, O_HANG_TIMEOUT, s[O_HANG_TIMEOUT].val,
                         "expected a number of seconds (0 turns the watchdog off)");
    if (s[O_SIGNALS_TO_HANDLE].set && (rc = check_signals(p, s[O_SIGNALS_TO_HANDLE].val)))
        return rc;
    o->virtual_local_rank = s[O_VIRTUAL_LOCAL_RANK].set;
    if (s[O_NUMA_BINDING].set) {
        const char *v = s[O_NUMA_BINDING].val;
        for (int m = MG_NUMA_NODE; m <= MG_NUMA_CORE_COMPLEX; m++)
            if (strcmp(v, numa_names[m]) == 0)
                o->numa_binding = (enum mg_numa_mode)m;
        if (o->numa_binding == MG_NUMA_NONE)
            return bad_value(p, O_NUMA_BINDING, v,
                             "expected node, socket, exclusive or core-complex");
    }
    if (s[O_EVENT_LOG_HANDLER].set) {
        const char *v = s[O_EVENT_LOG_HANDLER].val;
        if (!*v || strlen(v) > 128)
            return bad_value(p, O_EVENT_LOG_HANDLER, v, "expected a handler name");
        o->event_log_handler = v;
    }
    if (s[O_DUP_STDOUT].set && (rc = check_filters(p, O_DUP_STDOUT, 0)))
        return rc;
    if (s[O_DUP_STDERR].set && (rc = check_filters(p, O_DUP_STDERR, 1)))
        return rc;
    return 0;
}

int mg_opts_parse(struct mg_launch_opts *o, int argc, char **argv, char **env, char *err,
                  size_t errcap)
{
    struct parse p = {.o = o, .err = err, .errcap = errcap};
    int prog = 0, rc;

    memset(o, 0, sizeof(*o));
    o->nproc_kind = MG_NPROC_NUM;
    o->nproc = 1;
    o->nnodes_min = o->nnodes_max = 1;
    o->rdzv_backend = "static";
    o->monitor_interval = 5;
    o->start_method = "spawn";
    o->role = "default";
    o->master_port = -1;
    o->shutdown_timeout = 30;
    o->stop_group_delay = 2;
    o->exit_barrier_timeout = -1;
    o->hang_timeout = MG_HANG_TIMEOUT_DEFAULT;
    o->event_log_handler = "null";
    /* torchrun 2.x's default --signals-to-handle */
    o->signals[0] = SIGTERM;
    o->signals[1] = SIGINT;
    o->signals[2] = SIGHUP;
    o->signals[3] = SIGQUIT;
    o->nsignals = 4;
    snprintf(o->nproc_src, sizeof(o->nproc_src), "--nproc_per_node");
    snprintf(o->gpu_ids_src, sizeof(o->gpu_ids_src), "--gpu_ids");
    snprintf(o->filter_src, sizeof(o->filter_src), "--local_ranks_filter");
    if (err && errcap)
        err[0] = '\0';

    if ((rc = parse_argv(&p, argc, argv, &prog)))
        return rc;
    if (prog < 0) {
        o->help = p.s[O_HELP].set;
        o->version = p.s[O_VERSION].set;
        return 0;
    }
    if ((rc = apply_env(&p, env)))
        return rc;
    if ((rc = check_values(&p)))
        return rc;
    if (prog >= argc)
        return fail(&p, "missing the program to run (usage: mglaunch [options] PROGRAM "
                        "[ARGS...]; see mglaunch --help)");
    if (!*argv[prog])
        return fail(&p, "the program name is empty (usage: mglaunch [options] PROGRAM [ARGS...])");
    o->prog_argv = argv + prog;
    o->prog_argc = argc - prog;
    return 0;
}

int mg_opts_resolve(struct mg_launch_opts *o, const struct mg_host_info *host, char *err,
                    size_t errcap)
{
    int n = o->nproc;
    switch (o->nproc_kind) {
    case MG_NPROC_NUM:
        break;
    case MG_NPROC_CPU:
        n = host->ncpu;
        break;
    case MG_NPROC_GPU:
    case MG_NPROC_AUTO:
        n = o->ngpu_ids ? o->ngpu_ids : host->ngpu;
        if (n < 0) {
            snprintf(err, errcap, "invalid value '%s' for %s: cannot count the GPUs: %s",
                     o->nproc_kind == MG_NPROC_GPU ? "gpu" : "auto", o->nproc_src,
                     host->no_gpu_why ? host->no_gpu_why : "unknown");
            return -EINVAL;
        }
        if (n == 0 && o->nproc_kind == MG_NPROC_GPU) {
            snprintf(err, errcap, "invalid value 'gpu' for %s: no GPU found (%s)", o->nproc_src,
                     host->no_gpu_why ? host->no_gpu_why : "none visible");
            return -EINVAL;
        }
        if (n == 0)
            n = host->ncpu; /* auto without a GPU: one worker per CPU, as torchrun */
        break;
    case MG_NPROC_XPU:
        n = host->nxpu;
        if (n <= 0) {
            snprintf(err, errcap, "invalid value 'xpu' for %s: no Intel GPU found (%s)",
                     o->nproc_src, host->no_xpu_why ? host->no_xpu_why : "none visible");
            return -EINVAL;
        }
        break;
    }
    if (n < 1)
        n = 1;
    if (n > MG_MAX_NPROC)
        n = MG_MAX_NPROC;
    o->nproc = n;
    if (o->ngpu_ids && o->ngpu_ids < n) {
        snprintf(err, errcap,
                 "invalid value '%s' for %s: %d GPU id%s for %d workers; give one id per worker",
                 o->gpu_ids, o->gpu_ids_src, o->ngpu_ids, o->ngpu_ids == 1 ? "" : "s", n);
        return -EINVAL;
    }
    for (int i = 0; i < o->nranks_filter; i++)
        if (o->ranks_filter[i] >= n) {
            snprintf(err, errcap, "invalid value '%d' for %s: no local rank %d (%d workers)",
                     o->ranks_filter[i], o->filter_src, o->ranks_filter[i], n);
            return -EINVAL;
        }
    return 0;
}

int mg_opts_rank_shown(const struct mg_launch_opts *o, int local_rank)
{
    if (!o->ranks_filter)
        return 1;
    for (int i = 0; i < o->nranks_filter; i++)
        if (o->ranks_filter[i] == local_rank)
            return 1;
    return 0;
}

int mg_opts_gpu_id(const struct mg_launch_opts *o, int i, char *buf, size_t cap)
{
    const char *s = o->gpu_ids;
    while (i > 0 && s) {
        s = strchr(s, ',');
        if (s)
            s++;
        i--;
    }
    if (!s || !*s || i < 0)
        return -ENOENT;
    size_t n = strcspn(s, ",");
    if (n >= cap)
        return -ENAMETOOLONG;
    memcpy(buf, s, n);
    buf[n] = '\0';
    return 0;
}

const char *mg_opts_dup_filter(const struct mg_launch_opts *o, int stream, int i)
{
    const char *f = o->dup_filters[stream];
    if (!f || i < 0 || i >= o->ndup_filters[stream])
        return NULL;
    while (i-- > 0)
        f += strlen(f) + 1;
    return f;
}

void mg_opts_release(struct mg_launch_opts *o)
{
    free(o->dup_filters[0]);
    free(o->dup_filters[1]);
    o->dup_filters[0] = o->dup_filters[1] = NULL;
    free(o->ranks_filter);
    o->ranks_filter = NULL;
    o->nranks_filter = 0;
}
