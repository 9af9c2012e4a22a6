/* mglaunch's options: the table of flags, reading argv (a typo gets the
 * nearest name) and the PET_ and torch variables, and what the agent asks of
 * the result (see opts.h, docs/cli.md). What each value must be, and the
 * checks between flags, are opts_check.c's. */
#include "opts_internal.h"
#include "suggest.h"
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

enum opt_kind {
    OPT_FLAG,
    OPT_VALUE,
    OPT_LIST, /* may be repeated; values accumulate */
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

int mg_opts_fail(struct parse *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = mg_vseterr(p->err, p->errcap, -EINVAL, fmt, ap);
    va_end(ap);
    return rc;
}

/* "--nproc_per_node" or "PET_NPROC_PER_NODE (--nproc_per_node)" */
const char *mg_opts_label(struct parse *p, int id, char *buf, size_t cap)
{
    if (p->s[id].from_env)
        snprintf(buf, cap, "%s (--%s)", p->s[id].src, defs[id].name);
    else
        snprintf(buf, cap, "%s", p->s[id].src);
    return buf;
}

int mg_opts_bad_value(struct parse *p, int id, const char *val, const char *why)
{
    char l[160];
    return mg_opts_fail(p, "invalid value '%s' for %s: %s", val, mg_opts_label(p, id, l, sizeof(l)),
                        why);
}

/* Strict decimal integer in [min, max]. */
int mg_opts_parse_int(const char *s, long min, long max, int *out)
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

int mg_opts_parse_double(const char *s, double min, double max, double *out)
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
        return mg_opts_fail(p, "ambiguous option '%s': could be %s", typed, list);
    }
    const char *names[O_COUNT];
    for (int i = 0; i < O_COUNT; i++)
        names[i] = defs[i].name;
    int near = mg_suggest(name, names, O_COUNT);
    if (near >= 0)
        return mg_opts_fail(p, "unknown option '%s': did you mean --%s?", typed, defs[near].name);
    return mg_opts_fail(p, "unknown option '%s' (see mglaunch --help)", typed);
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
            return mg_opts_fail(p, "too many GPU ids for %s (at most %d bytes)", src,
                                MG_GPU_IDS_MAX);
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
                return mg_opts_fail(p, "unknown option '%.60s...' (see mglaunch --help)", a);
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
                return mg_opts_fail(p, "unknown option '%s' (see mglaunch --help)", a);
            if (a[2])
                val = a[2] == '=' ? a + 3 : a + 2;
        }
        if (defs[id].kind == OPT_FLAG) {
            if (val)
                return mg_opts_fail(p, "option %s takes no value (got '%s')", typed, val);
            record(p, id, "1", typed);
            if (id == O_HELP || id == O_VERSION) {
                *prog_index = -1;
                return 0;
            }
            continue;
        }
        if (!val) {
            if (i + 1 >= argc || looks_like_option(argv[i + 1]))
                return mg_opts_fail(p, "option %s needs a value", typed);
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
            if (*v && mg_opts_parse_int(v, INT_MIN, INT_MAX, &b))
                return mg_opts_bad_value(p, id, v, "expected 0 or 1");
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
    if ((rc = mg_opts_check_values(&p)))
        return rc;
    if (prog >= argc)
        return mg_opts_fail(&p, "missing the program to run (usage: mglaunch [options] PROGRAM "
                                "[ARGS...]; see mglaunch --help)");
    if (!*argv[prog])
        return mg_opts_fail(
            &p, "the program name is empty (usage: mglaunch [options] PROGRAM [ARGS...])");
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
