/* The single-node rendezvous (see rdzv_single.h). */
#include "rdzv_single.h"
#include "net.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

struct rdzv_single {
    char master_addr[MG_HOST_MAX];
    int master_port;                /* > 0: fixed */
    char run_id[MG_RUN_ID_MAX + 1]; /* "" = mglaunch's own */
    char notice[1024];
};

static int single_next_round(void *impl, struct mg_agent *ag, const struct mg_round_info *info)
{
    struct rdzv_single *s = impl;
    struct mg_group g;

    memset(&g, 0, sizeof(g));
    g.group_rank = 0;
    g.group_world_size = 1;
    g.world_size = info->local_world_size;
    g.rank_offset = 0;
    g.role_rank_offset = 0;
    g.role_world_size = info->local_world_size;
    snprintf(g.master_addr, sizeof(g.master_addr), "%s", s->master_addr);
    g.master_fd = -1;
    /* A fresh secret each round: only this round's workers get into rank 0's store. */
    uint8_t key[MG_GROUP_TOKEN_LEN / 2];
    if (getrandom(key, sizeof(key), 0) != (ssize_t)sizeof(key))
        return -EIO;
    for (size_t i = 0; i < sizeof(key); i++)
        snprintf(g.store_token + 2 * i, 3, "%02x", key[i]);
    if (s->master_port > 0) {
        g.master_port = s->master_port;
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

static void single_release(void *impl)
{
    free(impl);
}

const struct mg_rdzv_ops mg_rdzv_single_ops = {
    .name = "local",
    .next_round = single_next_round,
    .release = single_release,
};

void mg_rdzv_single_set_run_id(void *impl, const char *id)
{
    struct rdzv_single *s = impl;
    snprintf(s->run_id, sizeof(s->run_id), "%s", id);
}

const char *mg_rdzv_single_run_id(void *impl)
{
    struct rdzv_single *s = impl;
    return s && s->run_id[0] ? s->run_id : NULL;
}

const char *mg_rdzv_single_notice(void *impl)
{
    struct rdzv_single *s = impl;
    return s && s->notice[0] ? s->notice : NULL;
}

int mg_rdzv_single_create(const struct mg_launch_opts *o, const char *notice,
                          const struct mg_rdzv_ops **ops, void **impl)
{
    struct rdzv_single *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    snprintf(s->master_addr, sizeof(s->master_addr), "%s",
             o->master_addr ? o->master_addr : "127.0.0.1");
    s->master_port = o->master_port;
    if (notice)
        snprintf(s->notice, sizeof(s->notice), "%s", notice);
    *ops = &mg_rdzv_single_ops;
    *impl = s;
    return 0;
}
