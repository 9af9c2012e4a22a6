/* Slurm hostlist expansion and SLURM_* detection (see slurm.h). */
#include "slurm.h"
#include "mg_err.h"
#include "proc.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DIGITS 18 /* a range bound fits in a long long */

struct expand {
    char **hosts;
    int n, cap, max;
};

static int push(struct expand *e, const char *name, size_t len)
{
    if (len >= MG_HOST_MAX || e->n >= e->max)
        return -E2BIG;
    if (e->n == e->cap) {
        int cap = e->cap ? e->cap * 2 : 16;
        char **h = realloc(e->hosts, (size_t)cap * sizeof(*h));
        if (!h)
            return -ENOMEM;
        e->hosts = h;
        e->cap = cap;
    }
    char *s = malloc(len + 1);
    if (!s)
        return -ENOMEM;
    memcpy(s, name, len);
    s[len] = 0;
    e->hosts[e->n++] = s;
    return 0;
}

static int parse_num(const char *s, size_t len, long long *v)
{
    long long x = 0;
    if (len == 0 || len > MAX_DIGITS)
        return -EINVAL;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -EINVAL;
        x = x * 10 + (s[i] - '0');
    }
    *v = x;
    return 0;
}

/* Expands item[0..len) after the already-built name out[0..olen). */
static int expand_item(struct expand *e, const char *item, size_t len, char *out, size_t olen)
{
    const char *open = memchr(item, '[', len);
    const char *close;
    int rc;

    if (!open) {
        if (memchr(item, ']', len))
            return -EINVAL;
        if (olen + len >= MG_HOST_MAX)
            return -E2BIG;
        memcpy(out + olen, item, len);
        return push(e, out, olen + len);
    }
    size_t pre = (size_t)(open - item);
    if (memchr(item, ']', pre))
        return -EINVAL;
    close = memchr(open, ']', len - pre);
    if (!close || close == open + 1)
        return -EINVAL;
    if (olen + pre >= MG_HOST_MAX)
        return -E2BIG;
    memcpy(out + olen, item, pre);
    olen += pre;

    const char *rest = close + 1;
    size_t rest_len = len - (size_t)(rest - item);
    const char *p = open + 1;
    while (p < close) {
        const char *comma = memchr(p, ',', (size_t)(close - p));
        const char *end = comma ? comma : close;
        const char *dash = memchr(p, '-', (size_t)(end - p));
        long long lo, hi;
        size_t width;

        if (dash) {
            if (parse_num(p, (size_t)(dash - p), &lo) < 0 ||
                parse_num(dash + 1, (size_t)(end - dash - 1), &hi) < 0 || hi < lo)
                return -EINVAL;
        } else {
            if (parse_num(p, (size_t)(end - p), &lo) < 0)
                return -EINVAL;
            hi = lo;
        }
        /* Zero padding follows the written lower bound: [01-10], [008-010]. */
        width = (size_t)((dash ? dash : end) - p);
        if (hi - lo >= e->max)
            return -E2BIG;
        for (long long v = lo; v <= hi; v++) {
            int w = snprintf(out + olen, MG_HOST_MAX - olen, "%0*lld", (int)width, v);
            if (w < 0 || olen + (size_t)w >= MG_HOST_MAX)
                return -E2BIG;
            rc = expand_item(e, rest, rest_len, out, olen + (size_t)w);
            if (rc < 0)
                return rc;
        }
        p = end + 1;
    }
    if (close[-1] == ',')
        return -EINVAL;
    return 0;
}

void mg_hostlist_free(char **hosts, int n)
{
    for (int i = 0; i < n; i++)
        free(hosts[i]);
    free(hosts);
}

int mg_hostlist_expand(const char *list, int max, char ***hosts, int *n)
{
    struct expand e = {.max = max};
    char out[MG_HOST_MAX];
    size_t len;
    int rc = 0, depth = 0;
    const char *item;

    *hosts = NULL;
    *n = 0;
    if (!list || max <= 0)
        return -EINVAL;
    len = strlen(list);
    if (len == 0 || len > MG_HOSTLIST_MAX_TEXT)
        return len ? -E2BIG : -EINVAL;

    item = list;
    for (const char *p = list;; p++) {
        if (*p == '[')
            depth++;
        else if (*p == ']')
            depth--;
        if (depth < 0 || depth > 1) {
            rc = -EINVAL;
            goto fail;
        }
        if ((*p == ',' && depth == 0) || *p == 0) {
            if (*p == 0 && depth != 0) {
                rc = -EINVAL;
                goto fail;
            }
            size_t ilen = (size_t)(p - item);
            /* Slurm separates with commas; tolerate spaces around them. */
            while (ilen && *item == ' ')
                item++, ilen--;
            while (ilen && item[ilen - 1] == ' ')
                ilen--;
            if (ilen == 0) {
                rc = -EINVAL;
                goto fail;
            }
            rc = expand_item(&e, item, ilen, out, 0);
            if (rc < 0)
                goto fail;
            item = p + 1;
        }
        if (*p == 0)
            break;
    }
    *hosts = e.hosts;
    *n = e.n;
    return 0;
fail:
    mg_hostlist_free(e.hosts, e.n);
    return rc;
}

static const char *first_env(char *const *env, const char *const *names, const char **which)
{
    for (; *names; names++) {
        const char *v = mg_env_lookup(env, *names);
        if (v && *v) {
            *which = *names;
            return v;
        }
    }
    return NULL;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -EINVAL;
    *out = (int)v;
    return 0;
}

/* SkyPilot's variables, as mg_slurm_detect reads Slurm's. */
static int skypilot_detect(char *const *env, struct mg_slurm *out, char *err, size_t errlen)
{
    const char *rank = mg_env_lookup(env, "SKYPILOT_NODE_RANK");
    const char *count = mg_env_lookup(env, "SKYPILOT_NUM_NODES");
    const char *ips = mg_env_lookup(env, "SKYPILOT_NODE_IPS");
    const char *task = mg_env_lookup(env, "SKYPILOT_TASK_ID");

    if (!rank || !*rank || !count || !*count)
        return 0;
    snprintf(out->scheduler, sizeof(out->scheduler), "skypilot");
    out->vars = "SKYPILOT_*";
    out->in_step = 1; /* one command per node, as srun's tasks */
    if (parse_int(count, 1, MG_HOSTLIST_MAX_HOSTS, &out->nnodes) < 0)
        return mg_seterr(err, errlen, -EINVAL,
                         "SKYPILOT_NUM_NODES=%.40s: expected a node count from 1 to %d", count,
                         MG_HOSTLIST_MAX_HOSTS);
    if (parse_int(rank, 0, out->nnodes - 1, &out->node_rank) < 0)
        return mg_seterr(err, errlen, -EINVAL,
                         "SKYPILOT_NODE_RANK=%.40s: expected a node index from 0 to %d "
                         "(SKYPILOT_NUM_NODES=%d)",
                         rank, out->nnodes - 1, out->nnodes);
    if (!ips || !*ips)
        return mg_seterr(err, errlen, -EINVAL,
                         "SkyPilot detected (SKYPILOT_NODE_RANK=%s) but SKYPILOT_NODE_IPS is not "
                         "set; pass --master_addr",
                         rank);
    /* One address a line; node 0's is the first. */
    int n = 0;
    for (const char *p = ips; *p;) {
        size_t len = strcspn(p, "\n"), lead = strspn(p, " \t\r");
        if (lead < len) {
            size_t end = len;
            while (end > lead && strchr(" \t\r", p[end - 1]))
                end--;
            if (n == 0) {
                if (end - lead >= sizeof(out->master_addr))
                    return mg_seterr(err, errlen, -EINVAL,
                                     "SKYPILOT_NODE_IPS: the first address is too long");
                memcpy(out->master_addr, p + lead, end - lead);
                out->master_addr[end - lead] = 0;
            }
            n++;
        }
        p += len + (p[len] == '\n');
    }
    if (n != out->nnodes)
        return mg_seterr(err, errlen, -EINVAL,
                         "SKYPILOT_NODE_IPS lists %d address%s but SKYPILOT_NUM_NODES=%d", n,
                         n == 1 ? "" : "es", out->nnodes);
    if (task && *task) {
        size_t i = 0;
        for (; task[i] && i < sizeof(out->job_id) - 1; i++) {
            char c = task[i];
            int okc = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-';
            out->job_id[i] = okc ? c : '_';
        }
        out->job_id[i] = 0;
    }
    return 1;
}

int mg_slurm_detect(char *const *env, struct mg_slurm *out, char *err, size_t errlen)
{
    /* srun exports the step's own node count and list; a batch script only the job's. */
    static const char *const count_vars[] = {"SLURM_STEP_NUM_NODES", "SLURM_NNODES",
                                             "SLURM_JOB_NUM_NODES", NULL};
    static const char *const list_vars[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                            "SLURM_NODELIST", NULL};
    const char *count_var = NULL, *list_var = NULL;
    const char *nodeid = mg_env_lookup(env, "SLURM_NODEID");
    const char *count = first_env(env, count_vars, &count_var);
    const char *list = first_env(env, list_vars, &list_var);
    const char *job = mg_env_lookup(env, "SLURM_JOB_ID");
    char **hosts = NULL;
    int nhosts = 0, rc;

    memset(out, 0, sizeof(*out));
    if (!nodeid || !count)
        return skypilot_detect(env, out, err, errlen);
    snprintf(out->scheduler, sizeof(out->scheduler), "slurm");
    out->vars = "SLURM_*";
    /* srun exports the step id to its tasks; the batch script has none. */
    out->in_step = mg_env_lookup(env, "SLURM_STEP_ID") || mg_env_lookup(env, "SLURM_STEPID");
    const char *tasks = mg_env_lookup(env, "SLURM_STEP_NUM_TASKS");
    if (!tasks || parse_int(tasks, 1, INT_MAX, &out->step_tasks) < 0)
        out->step_tasks = 0;
    if (parse_int(count, 1, MG_HOSTLIST_MAX_HOSTS, &out->nnodes) < 0)
        return mg_seterr(err, errlen, -EINVAL, "%s=%s: expected a node count from 1 to %d",
                         count_var, count, MG_HOSTLIST_MAX_HOSTS);
    if (parse_int(nodeid, 0, out->nnodes - 1, &out->node_rank) < 0)
        return mg_seterr(err, errlen, -EINVAL,
                         "SLURM_NODEID=%s: expected a node index from 0 to %d (%s=%d)", nodeid,
                         out->nnodes - 1, count_var, out->nnodes);
    if (!list)
        return mg_seterr(err, errlen, -EINVAL,
                         "Slurm detected (SLURM_NODEID=%s) but SLURM_JOB_NODELIST is not set; pass "
                         "--master_addr",
                         nodeid);
    rc = mg_hostlist_expand(list, MG_HOSTLIST_MAX_HOSTS, &hosts, &nhosts);
    if (rc < 0)
        return mg_seterr(err, errlen, -EINVAL, "%s=%s: %s", list_var, list,
                         rc == -E2BIG ? "too many hosts or a host name too long"
                                      : "not a valid Slurm hostlist");
    if (nhosts != out->nnodes) {
        mg_hostlist_free(hosts, nhosts);
        return mg_seterr(err, errlen, -EINVAL, "%s lists %d hosts but %s=%d", list_var, nhosts,
                         count_var, out->nnodes);
    }
    snprintf(out->master_addr, sizeof(out->master_addr), "%s", hosts[0]);
    mg_hostlist_free(hosts, nhosts);
    if (job)
        snprintf(out->job_id, sizeof(out->job_id), "%s", job);
    return 1;
}

int mg_slurm_check(const struct mg_slurm *s, int layout_given, char *err, size_t errlen)
{
    if (s->in_step && s->step_tasks > s->nnodes)
        return mg_seterr(err, errlen, -EINVAL,
                         "one mglaunch per node: this Slurm step runs %d tasks on %d node%s "
                         "(SLURM_STEP_NUM_TASKS, SLURM_STEP_NUM_NODES), and each would start "
                         "workers of its own. mglaunch starts a node's workers itself "
                         "(--nproc_per_node); start it with: srun --nodes=%d --ntasks=%d "
                         "--ntasks-per-node=1 mglaunch ...",
                         s->step_tasks, s->nnodes, s->nnodes == 1 ? "" : "s", s->nnodes, s->nnodes);
    if (!s->in_step && !layout_given && s->job_id[0] && s->nnodes > 1)
        return mg_seterr(err, errlen, -EINVAL,
                         "this is the batch script of Slurm job %s, which has %d nodes "
                         "(SLURM_NNODES; no SLURM_STEP_ID): mglaunch would run on the first "
                         "node only and wait for the others, which never come. Start one "
                         "mglaunch per node with srun: srun --nodes=%d --ntasks=%d "
                         "--ntasks-per-node=1 mglaunch ...",
                         s->job_id, s->nnodes, s->nnodes, s->nnodes);
    return 0;
}

int mg_slurm_default_port(const struct mg_slurm *s)
{
    size_t n = strlen(s->job_id);
    int v = 0;
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s->job_id[i] < '0' || s->job_id[i] > '9')
            return 0;
    /* The last four digits, as Lightning takes them. */
    for (size_t i = n > 4 ? n - 4 : 0; i < n; i++)
        v = v * 10 + (s->job_id[i] - '0');
    return MG_SLURM_PORT_BASE + v % MG_SLURM_PORT_RANGE;
}
