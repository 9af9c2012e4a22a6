/* Picks the rendezvous backend for the options (see rdzv.h). */
#include "rdzv.h"
#include "rdzv_multi.h"
#include "rdzv_single.h"
#include "rdzv_conf.h"

#include <stdio.h>
#include <string.h>

extern char **environ;

int mg_rdzv_create(const struct mg_launch_opts *o, FILE *status, const struct mg_rdzv_ops **ops,
                   void **impl, char *err, size_t errcap)
{
    if (mg_rdzv_multi_wanted(o, environ))
        return mg_rdzv_multi_create(o, environ, status, ops, impl, err, errcap);
    /* One node (opts.c bounds --nnodes to 1 <= MIN <= MAX, and MAX > 1 is
     * multi-node): --rdzv_conf is not used, but a mistake in it is still one. */
    char notes[MG_RDZV_NOTES_MAX], notice[MG_RDZV_NOTES_MAX + 256];
    int rc = mg_rdzv_multi_check_conf(o, environ, notes, sizeof(notes), err, errcap);
    if (rc)
        return rc;
    /* One "mglaunch: " line per note, as the multi-node notices. */
    size_t n = 0;
    notice[0] = 0;
    for (const char *p = notes; *p && n < sizeof(notice);) {
        size_t len = strcspn(p, "\n");
        n += (size_t)snprintf(notice + n, sizeof(notice) - n, "%s%.*s", n ? "\nmglaunch: " : "",
                              (int)len, p);
        p += len + (p[len] == '\n');
    }
    return mg_rdzv_single_create(o, notice, ops, impl);
}

const char *mg_rdzv_notice(const struct mg_rdzv_ops *ops, void *impl)
{
    return ops == &mg_rdzv_single_ops ? mg_rdzv_single_notice(impl) : mg_rdzv_multi_notice(impl);
}

const char *mg_rdzv_run_id(const struct mg_rdzv_ops *ops, void *impl)
{
    return ops == &mg_rdzv_single_ops ? NULL : mg_rdzv_multi_run_id(impl);
}
