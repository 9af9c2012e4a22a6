/* Picks the rendezvous backend for the options (see rdzv.h). */
#include "rdzv.h"
#include "rdzv_multi.h"
#include "rdzv_single.h"
#include "rdzv_conf.h"
#include "slurm.h"

#include "net.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

/* One node with --master_port: rank 0 (torch's TCPStore, or libmg's store)
 * will listen there, on every interface. A port another process holds fails
 * rank 0 the same way in every attempt, and only the worker would say so:
 * try it now (SO_REUSEADDR, as they do, so a closed connection's TIME_WAIT
 * is no obstacle) and say what to do. */
static int master_port_usable(const struct mg_launch_opts *o, char *err, size_t errcap)
{
    if (o->master_port <= 0)
        return 0;
    int fd = mg_listen_tcp(NULL, o->master_port, 1, NULL);
    if (fd >= 0) {
        close(fd);
        return 0;
    }
    if (fd != -EADDRINUSE && fd != -EACCES)
        return 0; /* anything else is rank 0's to meet and report */
    snprintf(err, errcap,
             "--master_port %d: %s on this host, so rank 0 could not listen there (%s%d%s); "
             "give another port, or leave --master_port out and mglaunch picks a free one for "
             "each attempt",
             o->master_port, fd == -EADDRINUSE ? "already in use" : "not allowed",
             fd == -EADDRINUSE ? "another job, or a rank 0 still running, holds it: `ss -ltnp "
                                 "'sport = :"
                               : "a port below 1024 needs privileges, and ",
             o->master_port, fd == -EADDRINUSE ? "'` names the process" : " is one");
    return fd;
}

int mg_rdzv_create(const struct mg_launch_opts *o, FILE *status, const struct mg_rdzv_ops **ops,
                   void **impl, char *err, size_t errcap)
{
    struct mg_slurm sl;
    char serr[256];
    /* Inconsistent SLURM_* are the multi-node backend's to report, when it uses them. */
    int slurm = mg_slurm_detect(environ, &sl, serr, sizeof(serr));
    int rc;

    if (slurm == 1 && (rc = mg_slurm_check(&sl, o->nnodes_given, err, errcap)) < 0)
        return rc;
    if (mg_rdzv_multi_wanted(o, environ))
        return mg_rdzv_multi_create(o, environ, status, ops, impl, err, errcap);
    /* One node (opts.c bounds --nnodes to 1 <= MIN <= MAX, and MAX > 1 is
     * multi-node): --rdzv_conf is not used, but a mistake in it is still one. */
    char notes[MG_RDZV_NOTES_MAX], notice[MG_RDZV_NOTES_MAX + 256];
    rc = mg_rdzv_multi_check_conf(o, environ, notes, sizeof(notes), err, errcap);
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
    if ((rc = master_port_usable(o, err, errcap)))
        return rc;
    rc = mg_rdzv_single_create(o, notice, ops, impl);
    /* A step of one node is named after its job, as a step of several is. */
    if (rc == 0 && slurm == 1 && !o->rdzv_id && sl.job_id[0]) {
        char id[sizeof(sl.job_id) + sizeof(sl.scheduler) + 2];
        snprintf(id, sizeof(id), "%s-%s", sl.scheduler, sl.job_id);
        mg_rdzv_single_set_run_id(*impl, id);
    }
    return rc;
}

const char *mg_rdzv_notice(const struct mg_rdzv_ops *ops, void *impl)
{
    return ops == &mg_rdzv_single_ops ? mg_rdzv_single_notice(impl) : mg_rdzv_multi_notice(impl);
}

const char *mg_rdzv_run_id(const struct mg_rdzv_ops *ops, void *impl)
{
    return ops == &mg_rdzv_single_ops ? mg_rdzv_single_run_id(impl) : mg_rdzv_multi_run_id(impl);
}
