/* Which node comes first among new nodes: the scheduler's index, then a
 * natural sort of host names (see node_order.h). */
#include "node_order.h"
#include "mg_err.h"
#include "proc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

int mg_rdzv_natcmp(const char *a, const char *b)
{
    const char *x = a, *y = b;
    while (*x && *y) {
        if (is_digit(*x) && is_digit(*y)) {
            while (*x == '0' && is_digit(x[1]))
                x++;
            while (*y == '0' && is_digit(y[1]))
                y++;
            size_t nx = 0, ny = 0;
            while (is_digit(x[nx]))
                nx++;
            while (is_digit(y[ny]))
                ny++;
            if (nx != ny) /* more significant digits: larger, whatever they are */
                return nx < ny ? -1 : 1;
            int c = memcmp(x, y, nx);
            if (c)
                return c < 0 ? -1 : 1;
            x += nx;
            y += ny;
            continue;
        }
        if (*x != *y)
            return (unsigned char)*x < (unsigned char)*y ? -1 : 1;
        x++;
        y++;
    }
    if (*x || *y)
        return *x ? 1 : -1;
    int c = strcmp(a, b);
    return c < 0 ? -1 : c > 0;
}

static int parse_index(const char *s)
{
    char *end;
    if (!is_digit(*s))
        return -1;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v > MG_NODE_INDEX_MAX)
        return -1;
    return (int)v;
}

int mg_rdzv_sched_index(char *const *env, const char *hostname, const char **src, char *err,
                        size_t errlen)
{
    /* An Indexed Job's (JobSet, Kubeflow Trainer v2, Kueue), Slurm's,
     * SkyPilot's, Volcano's; a job sees one of them. */
    static const char *const vars[] = {"JOB_COMPLETION_INDEX", "SLURM_NODEID", "SKYPILOT_NODE_RANK",
                                       "VC_TASK_INDEX"};
    if (src)
        *src = NULL;
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = mg_env_lookup(env, vars[i]);
        if (!v || !*v)
            continue;
        int idx = parse_index(v);
        if (idx < 0)
            return mg_seterr(err, errlen, -EINVAL,
                             "%s='%.40s': expected the node's index, an integer from 0 to %d "
                             "(mglaunch orders nodes by it); unset it or fix the job",
                             vars[i], v, MG_NODE_INDEX_MAX);
        if (src)
            *src = vars[i];
        return idx;
    }
    /* A StatefulSet's pod is NAME-ORDINAL and its host name is the pod's. */
    const char *k8s = mg_env_lookup(env, "KUBERNETES_SERVICE_HOST");
    if (!k8s || !*k8s || !hostname)
        return -1;
    const char *dash = strrchr(hostname, '-');
    if (!dash || dash == hostname)
        return -1;
    int idx = parse_index(dash + 1);
    if (idx >= 0 && src)
        *src = "the pod name";
    return idx;
}
