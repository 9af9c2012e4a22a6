/* The world-size-1 communicator: a job of one process has no one to talk to,
 * so every collective is a no-op (after comm.c's argument checks) and
 * mem_alloc gives ordinary memory. */
#include "comm.h"
#include "comm_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int single_allreduce(struct mg_comm *c, float *buf, size_t count, enum mg_reduce_op op,
                            int timeout_ms)
{
    return 0; /* the average of one value is itself */
}

static int single_broadcast(struct mg_comm *c, void *buf, size_t len, int root, int timeout_ms)
{
    return 0;
}

static int single_allgather(struct mg_comm *c, const void *send, void *recv, size_t len,
                            int timeout_ms)
{
    if (len && send != recv)
        memmove(recv, send, len);
    return 0;
}

static int single_reduce_scatter(struct mg_comm *c, const float *send, float *recv, size_t count,
                                 enum mg_reduce_op op, int timeout_ms)
{
    if (count && send != recv)
        memmove(recv, send, count * sizeof(float));
    return 0;
}

static int single_barrier(struct mg_comm *c, int timeout_ms)
{
    return 0;
}

static void single_release(struct mg_comm *c)
{
    free(c);
}

static int single_mem_alloc(struct mg_comm *c, size_t bytes, void **out, int timeout_ms)
{
    *out = mg_comm_plain_alloc(bytes);
    return *out ? 0 : -ENOMEM;
}

static void single_mem_free(struct mg_comm *c, void *p)
{
    free(p);
}

static const struct mg_comm_ops single_ops = {
    .name = "single",
    .allreduce = single_allreduce,
    .broadcast = single_broadcast,
    .allgather = single_allgather,
    .reduce_scatter = single_reduce_scatter,
    .barrier = single_barrier,
    .release = single_release,
    .mem_alloc = single_mem_alloc,
    .mem_free = single_mem_free,
};

int mg_comm_single_create(struct mg_comm **out)
{
    struct mg_comm *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->ops = &single_ops;
    c->rank = c->local_rank = 0;
    c->world = c->local_world = c->nhosts = 1;
    c->rank_ordered = 1;
    c->timeout_ms = MG_COMM_TIMEOUT_DEFAULT_MS;
    snprintf(c->desc, sizeof(c->desc), "single process");
    *out = c;
    return 0;
}
