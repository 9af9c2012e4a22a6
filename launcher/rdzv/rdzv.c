/* Rendezvous backends; for now the single-node one (see rdzv.h). */
#include "rdzv.h"
#include "mg_err.h"
#include "net.h"
#include "rdzv_multi.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct rdzv_local {
    char master_addr[MG_HOST_MAX];
    int master_port; /* > 0: fixed */
    int nproc;
};

static int local_next_round(void *impl, struct mg_agent *ag, const struct mg_round_info *info)
{
    struct rdzv_local *l = impl;
    struct mg_group g;

    memset(&g, 0, sizeof(g));
    g.group_rank = 0;
    g.group_world_size = 1;
    g.world_size = info->local_world_size;
    g.rank_offset = 0;
    g.role_rank_offset = 0;
    g.role_world_size = info->local_world_size;
    snprintf(g.master_addr, sizeof(g.master_addr), "%s", l->master_addr);
    g.master_fd = -1;
    if (l->master_port > 0) {
        g.master_port = l->master_port;
    } else {
        /* A fresh free port each round, held until the workers start. */
        int fd = mg_listen_tcp(NULL, 0, 1, &g.master_port);
        if (fd < 0)
            return fd;
        g.master_fd = fd;
    }
    int rc = mg_agent_group_formed(ag, &g);
    if (rc && g.master_fd >= 0)
        close(g.master_fd);
    return rc;
}

static void local_release(void *impl)
{
    free(impl);
}

static const struct mg_rdzv_ops local_ops = {
    .name = "local",
    .next_round = local_next_round,
    .release = local_release,
};

extern char **environ;

int mg_rdzv_create(const struct mg_launch_opts *o, const struct mg_rdzv_ops **ops, void **impl,
                   char *err, size_t errcap)
{
    /* Several nodes, etcd, or a Slurm allocation: launcher/rdzv/rdzv_multi.c. */
    if (mg_rdzv_multi_wanted(o, environ))
        return mg_rdzv_multi_create(o, environ, ops, impl, err, errcap);
    int crc = mg_rdzv_multi_check_conf(o, environ, err, errcap);
    if (crc)
        return crc;
    if (o->nnodes_min != 1 || o->nnodes_max != 1) {
        snprintf(err, errcap, "multi-node rendezvous is not implemented yet");
        return -MG_EUNSUPPORTED;
    }
    struct rdzv_local *l = calloc(1, sizeof(*l));
    if (!l)
        return -ENOMEM;
    snprintf(l->master_addr, sizeof(l->master_addr), "%s",
             o->master_addr ? o->master_addr : "127.0.0.1");
    l->master_port = o->master_port;
    l->nproc = o->nproc;
    *ops = &local_ops;
    *impl = l;
    return 0;
}

const char *mg_rdzv_notice(const struct mg_rdzv_ops *ops, void *impl)
{
    return ops == &local_ops ? NULL : mg_rdzv_multi_notice(impl);
}

const char *mg_rdzv_run_id(const struct mg_rdzv_ops *ops, void *impl)
{
    return ops == &local_ops ? NULL : mg_rdzv_multi_run_id(impl);
}
