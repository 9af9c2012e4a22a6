/* mglaunch's option values: what each recorded flag or PET_ variable must
 * be, turned into struct mg_launch_opts' fields, and the checks between
 * flags (--standalone with --nnodes, --node_rank below --nnodes, --module
 * with --no_python). Reading argv and the environment is opts.c's. */
#include "opts_internal.h"
#include "output.h"
#include "redact.h"
#include "proc.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STR_(x) #x
#define STR(x)  STR_(x) /* a numeric macro as a string literal */

/* --signals-to-handle: torchrun's comma-separated names (SIGTERM,SIGUSR1);
 * TERM and numbers work too. Signals mglaunch needs for itself, or that
 * cannot be caught, are refused. */
static int check_signals(struct parse *p, const char *v)
{
    struct mg_launch_opts *o = p->o;
    char buf[512], why[160];
    if (strlen(v) >= sizeof(buf))
        return mg_opts_bad_value(p, O_SIGNALS_TO_HANDLE, "...", "too long");
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
            return mg_opts_bad_value(p, O_SIGNALS_TO_HANDLE, v, why);
        }
        switch (sig) {
        case SIGKILL:
        case SIGSTOP:
        case SIGSEGV:
        case SIGBUS:
        case SIGFPE:
        case SIGILL:
            snprintf(why, sizeof(why), "%s cannot be handled", t);
            return mg_opts_bad_value(p, O_SIGNALS_TO_HANDLE, v, why);
        case SIGCHLD:
        case SIGCONT:
        case SIGTSTP:
        case SIGTTIN:
        case SIGTTOU:
        case SIGWINCH:
        case SIGPIPE:
            snprintf(why, sizeof(why), "mglaunch handles %s itself", t);
            return mg_opts_bad_value(p, O_SIGNALS_TO_HANDLE, v, why);
        }
        int dup = 0;
        for (int i = 0; i < o->nsignals; i++)
            dup |= o->signals[i] == sig;
        if (dup)
            continue;
        if (o->nsignals == MG_MAX_SIGNALS)
            return mg_opts_bad_value(p, O_SIGNALS_TO_HANDLE, v, "too many signals");
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
        return mg_opts_fail(p, "out of memory");
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
        return mg_opts_bad_value(p, id, v, "more than 64 filters");
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
        return mg_opts_bad_value(p, O_GPU_IDS, s, "expected GPU ids like 0,1");
    while (*s) {
        const char *c = strchr(s, ',');
        size_t n = c ? (size_t)(c - s) : strlen(s);
        char id[MG_GPU_ID_LEN];
        int digits = 1, uuid = 1;
        if (n == 0 || n >= sizeof(id))
            return mg_opts_bad_value(p, O_GPU_IDS, o->gpu_ids, "expected GPU ids like 0,1");
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
            return mg_opts_bad_value(p, O_GPU_IDS, o->gpu_ids, why);
        }
        /* a repeated id would put two workers on one GPU by accident */
        for (int k = 0; k < o->ngpu_ids; k++) {
            char other[MG_GPU_ID_LEN];
            mg_opts_gpu_id(o, k, other, sizeof(other));
            if (strcmp(other, id) == 0) {
                char why[160];
                snprintf(why, sizeof(why), "GPU id %s is listed twice", id);
                return mg_opts_bad_value(p, O_GPU_IDS, o->gpu_ids, why);
            }
        }
        if (++o->ngpu_ids > MG_MAX_NPROC)
            return mg_opts_bad_value(p, O_GPU_IDS, o->gpu_ids, "too many GPU ids");
        s += n + (c ? 1 : 0);
        if (c && !*s)
            return mg_opts_bad_value(p, O_GPU_IDS, o->gpu_ids, "expected GPU ids like 0,1");
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
        return mg_opts_bad_value(p, O_RANKS_FILTER, v, "too many ranks");
    o->ranks_filter = calloc((size_t)cap, sizeof(int));
    if (!o->ranks_filter)
        return mg_opts_fail(p, "out of memory");
    const char *s = v;
    for (;;) {
        char num[16];
        const char *c = strchr(s, ',');
        size_t n = c ? (size_t)(c - s) : strlen(s);
        int r;
        if (n == 0 || n >= sizeof(num))
            return mg_opts_bad_value(p, O_RANKS_FILTER, v, "expected local ranks like 0,1,2");
        memcpy(num, s, n);
        num[n] = '\0';
        if (mg_opts_parse_int(num, 0, MG_MAX_NPROC - 1, &r))
            return mg_opts_bad_value(p, O_RANKS_FILTER, v, "expected local ranks like 0,1,2");
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
        return mg_opts_bad_value(p, id, v, "expected a host name or address");
    if (v[0] == '[') {
        const char *close = strchr(v, ']');
        if (!close || close == v + 1)
            return mg_opts_bad_value(p, id, v, "expected an IPv6 address in brackets, like [::1]");
        if (close[1] == ':')
            return mg_opts_bad_value(
                p, id, v,
                id == O_MASTER_ADDR
                    ? "expected a host without a port; the port goes in --master_port"
                    : "expected a host without a port");
        if (close[1])
            return mg_opts_bad_value(p, id, v, "expected an IPv6 address in brackets, like [::1]");
        memcpy(buf, v + 1, (size_t)(close - v - 1));
        buf[close - v - 1] = '\0';
        *out = buf;
        return 0;
    }
    if (strchr(v, '[') || strchr(v, ']'))
        return mg_opts_bad_value(p, id, v, "expected a host name or address");
    *out = v;
    return 0;
}

static int check_run_id(struct parse *p, const char *v)
{
    size_t n = strlen(v);
    if (n == 0 || n > MG_RUN_ID_MAX)
        return mg_opts_bad_value(p, O_RDZV_ID, v, "expected 1 to 128 characters");
    if (strcmp(v, ".") == 0 || strcmp(v, "..") == 0 || strchr(v, '/'))
        return mg_opts_bad_value(p, O_RDZV_ID, v,
                                 "it names the log directory: no '/', '.' or '..'");
    for (const char *c = v; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            return mg_opts_bad_value(p, O_RDZV_ID, v, "control characters are not allowed");
    return 0;
}

/* Turns the recorded strings into values, in the order of the table. */
int mg_opts_check_values(struct parse *p)
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
                return mg_opts_bad_value(p, O_NNODES, v, "expected N or MIN:MAX");
            memcpy(a, v, n);
            a[n] = '\0';
            if (mg_opts_parse_int(a, 1, MG_MAX_NNODES, &lo) ||
                mg_opts_parse_int(colon + 1, 1, MG_MAX_NNODES, &hi) || lo > hi)
                return mg_opts_bad_value(
                    p, O_NNODES, v,
                    "expected N or MIN:MAX with 1 <= MIN <= MAX <= " STR(MG_MAX_NNODES));
        } else {
            if (mg_opts_parse_int(v, 1, MG_MAX_NNODES, &lo))
                return mg_opts_bad_value(
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
        mg_opts_label(p, O_NPROC, o->nproc_src, sizeof(o->nproc_src));
        if (strcmp(v, "cpu") == 0)
            o->nproc_kind = MG_NPROC_CPU;
        else if (strcmp(v, "gpu") == 0)
            o->nproc_kind = MG_NPROC_GPU;
        else if (strcmp(v, "xpu") == 0)
            o->nproc_kind = MG_NPROC_XPU;
        else if (strcmp(v, "auto") == 0)
            o->nproc_kind = MG_NPROC_AUTO;
        else if (mg_opts_parse_int(v, 1, MG_MAX_NPROC, &o->nproc))
            return mg_opts_bad_value(p, O_NPROC, v,
                                     "expected an integer from 1 to 4096, cpu, gpu, xpu or auto");
    }
    if (s[O_RDZV_BACKEND].set) {
        const char *v = s[O_RDZV_BACKEND].val;
        if (strcmp(v, "etcd-v2") == 0)
            return mg_opts_bad_value(p, O_RDZV_BACKEND, v,
                                     "etcd's v2 API is gone from etcd 3.6; use etcd (the v3 API)");
        if (strcmp(v, "static") && strcmp(v, "c10d") && strcmp(v, "etcd") && strcmp(v, "etcd-v3"))
            return mg_opts_bad_value(p, O_RDZV_BACKEND, v,
                                     "expected static, c10d, etcd or etcd-v2");
        o->rdzv_backend = v;
    }
    if (s[O_RDZV_ENDPOINT].set && *s[O_RDZV_ENDPOINT].val) {
        struct mg_hostport hp;
        const char *v = s[O_RDZV_ENDPOINT].val;
        /* etcd takes a list of URLs, checked where it is opened (kv_etcd.c) */
        int etcd = o->rdzv_backend && strncmp(o->rdzv_backend, "etcd", 4) == 0;
        if (!etcd && strstr(v, "://"))
            return mg_opts_bad_value(p, O_RDZV_ENDPOINT, v,
                                     "expected HOST[:PORT] without a scheme (URLs are for "
                                     "--rdzv_backend etcd)");
        const char *at = strrchr(v, '@');
        char l[160];
        if (!etcd && at &&
            !strstr(v, "://")) /* user:password@host: the part before @ is not shown */
            return mg_opts_fail(p,
                                "invalid value '" MG_REDACTED
                                "%s' for %s: expected HOST[:PORT], without a "
                                "user or password (the store's secret goes in MG_RDZV_TOKEN)",
                                at, mg_opts_label(p, O_RDZV_ENDPOINT, l, sizeof(l)));
        if (!etcd && mg_parse_hostport(v, 29400, &hp)) {
            const char *c = strrchr(v, ':');
            int digits = c && c[1] && c[1 + strspn(c + 1, "0123456789")] == '\0';
            return mg_opts_bad_value(p, O_RDZV_ENDPOINT, v,
                                     digits ? "expected HOST[:PORT], PORT from 1 to 65535"
                                            : "expected HOST[:PORT]");
        }
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
        return mg_opts_fail(
            p,
            "%s is a single-node run: it cannot be combined with %s %s (for several "
            "nodes, give every node --rdzv_backend c10d --rdzv_endpoint HOST:PORT "
            "--rdzv_id ID instead)",
            mg_opts_label(p, O_STANDALONE, l1, sizeof(l1)),
            mg_opts_label(p, O_NNODES, l2, sizeof(l2)), s[O_NNODES].val);
    }
    if (s[O_MAX_RESTARTS].set &&
        mg_opts_parse_int(s[O_MAX_RESTARTS].val, 0, 1000000, &o->max_restarts))
        return mg_opts_bad_value(p, O_MAX_RESTARTS, s[O_MAX_RESTARTS].val,
                                 "expected a non-negative integer");
    if (s[O_MONITOR_INTERVAL].set &&
        (mg_opts_parse_double(s[O_MONITOR_INTERVAL].val, 0, 1e6, &o->monitor_interval) ||
         o->monitor_interval <= 0))
        return mg_opts_bad_value(p, O_MONITOR_INTERVAL, s[O_MONITOR_INTERVAL].val,
                                 "expected a positive number of seconds");
    if (s[O_START_METHOD].set) {
        const char *v = s[O_START_METHOD].val;
        if (strcmp(v, "spawn") && strcmp(v, "fork") && strcmp(v, "forkserver"))
            return mg_opts_bad_value(p, O_START_METHOD, v, "expected spawn, fork or forkserver");
        o->start_method = v;
    }
    if (s[O_ROLE].set) {
        const char *v = s[O_ROLE].val;
        /* Empty is torchrun's too: TorchX's dist.ddp passes --role '', and the
         * workers get ROLE_NAME="" and the prefix "[0]:". */
        if (strlen(v) > 64)
            return mg_opts_bad_value(p, O_ROLE, v, "expected a name of at most 64 characters");
        o->role = v;
    }
    o->module = s[O_MODULE].set;
    o->no_python = s[O_NO_PYTHON].set;
    if (o->module && o->no_python)
        return mg_opts_fail(p, "--no_python and --module cannot be used together");
    /* torchrun: runpy.run_path in the worker's interpreter, taking precedence
     * over --no_python; here, python3 -u PROGRAM whatever its name. */
    o->run_path = s[O_RUN_PATH].set;
    if (o->run_path && o->module)
        return mg_opts_fail(p, "--run_path and --module cannot be used together");
    if (s[O_LOG_DIR].set) {
        if (!*s[O_LOG_DIR].val)
            return mg_opts_bad_value(p, O_LOG_DIR, "", "expected a directory");
        if (strlen(s[O_LOG_DIR].val) > 3000)
            return mg_opts_bad_value(p, O_LOG_DIR, "...", "path too long");
        o->log_dir = s[O_LOG_DIR].val;
    }
    if (s[O_REDIRECTS].set && mg_stdmap_parse(s[O_REDIRECTS].val, &o->redirects))
        return mg_opts_bad_value(p, O_REDIRECTS, s[O_REDIRECTS].val,
                                 "expected 0-3 or a per-rank map like 0:3,1:1");
    if (s[O_TEE].set && mg_stdmap_parse(s[O_TEE].val, &o->tee))
        return mg_opts_bad_value(p, O_TEE, s[O_TEE].val,
                                 "expected 0-3 or a per-rank map like 0:3,1:1");
    if (s[O_NODE_RANK].set) {
        if (mg_opts_parse_int(s[O_NODE_RANK].val, 0, INT_MAX, &o->node_rank))
            return mg_opts_bad_value(p, O_NODE_RANK, s[O_NODE_RANK].val,
                                     "expected a non-negative integer");
        if (o->node_rank >= o->nnodes_max)
            return mg_opts_bad_value(p, O_NODE_RANK, s[O_NODE_RANK].val,
                                     "must be less than --nnodes");
        o->node_rank_given = 1;
    }
    if (s[O_MASTER_ADDR].set &&
        (rc = check_addr(p, O_MASTER_ADDR, s[O_MASTER_ADDR].val, o->master_addr_buf,
                         sizeof(o->master_addr_buf), &o->master_addr)))
        return rc;
    if (s[O_MASTER_PORT].set && mg_opts_parse_int(s[O_MASTER_PORT].val, 0, 65535, &o->master_port))
        return mg_opts_bad_value(p, O_MASTER_PORT, s[O_MASTER_PORT].val,
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
                 mg_opts_label(p, O_LOGS_SPECS, l, sizeof(l)), s[O_LOGS_SPECS].val);
        return -MG_EUNSUPPORTED;
    }
    if (s[O_RANKS_FILTER].set) {
        mg_opts_label(p, O_RANKS_FILTER, o->filter_src, sizeof(o->filter_src));
        if ((rc = check_filter(p, s[O_RANKS_FILTER].val)))
            return rc;
    }
    if (s[O_PREFIX_TMPL].set) {
        const char *v = s[O_PREFIX_TMPL].val, *bad = NULL;
        char out[1024];
        struct mg_prefix_vars vars = {"default", 0, 0, "host"};
        if (strlen(v) > MG_PREFIX_TMPL_MAX)
            return mg_opts_bad_value(p, O_PREFIX_TMPL, v, "longer than 256 characters");
        if (mg_prefix_expand(v, &vars, out, sizeof(out), &bad) == -EINVAL) {
            char why[200];
            snprintf(why, sizeof(why),
                     "unknown placeholder at '%.20s' (known: ${role_name}, ${local_rank}, "
                     "${rank}, ${hostname}; $$ for $)",
                     bad ? bad : "");
            return mg_opts_bad_value(p, O_PREFIX_TMPL, v, why);
        }
        o->prefix_template = v;
    }
    if (s[O_GPU_IDS].set) {
        mg_opts_label(p, O_GPU_IDS, o->gpu_ids_src, sizeof(o->gpu_ids_src));
        if ((rc = check_gpu_ids(p)))
            return rc;
    }
    if (s[O_SHUTDOWN_TIMEOUT].set &&
        mg_opts_parse_double(s[O_SHUTDOWN_TIMEOUT].val, 0, 1e6, &o->shutdown_timeout))
        return mg_opts_bad_value(p, O_SHUTDOWN_TIMEOUT, s[O_SHUTDOWN_TIMEOUT].val,
                                 "expected a number of seconds (0 or more)");
    if (s[O_STOP_GROUP_DELAY].set &&
        mg_opts_parse_double(s[O_STOP_GROUP_DELAY].val, 0, 1e6, &o->stop_group_delay))
        return mg_opts_bad_value(
            p, O_STOP_GROUP_DELAY, s[O_STOP_GROUP_DELAY].val,
            "expected a number of seconds (0 or more; 0: the whole process group at "
            "once, as torchrun)");
    if (s[O_EXIT_BARRIER_TIMEOUT].set &&
        (mg_opts_parse_double(s[O_EXIT_BARRIER_TIMEOUT].val, 0, 1e6, &o->exit_barrier_timeout) ||
         o->exit_barrier_timeout <= 0))
        return mg_opts_bad_value(p, O_EXIT_BARRIER_TIMEOUT, s[O_EXIT_BARRIER_TIMEOUT].val,
                                 "expected a positive number of seconds");
    if (s[O_HANG_TIMEOUT].set &&
        mg_opts_parse_double(s[O_HANG_TIMEOUT].val, 0, 1e6, &o->hang_timeout))
        return mg_opts_bad_value(p, O_HANG_TIMEOUT, s[O_HANG_TIMEOUT].val,
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
            return mg_opts_bad_value(p, O_NUMA_BINDING, v,
                                     "expected node, socket, exclusive or core-complex");
    }
    if (s[O_EVENT_LOG_HANDLER].set) {
        const char *v = s[O_EVENT_LOG_HANDLER].val;
        if (!*v || strlen(v) > 128)
            return mg_opts_bad_value(p, O_EVENT_LOG_HANDLER, v, "expected a handler name");
        o->event_log_handler = v;
    }
    if (s[O_DUP_STDOUT].set && (rc = check_filters(p, O_DUP_STDOUT, 0)))
        return rc;
    if (s[O_DUP_STDERR].set && (rc = check_filters(p, O_DUP_STDERR, 1)))
        return rc;
    return 0;
}
