/* The wrappers of the communicator ops that not every backend has
 * (reduce_scatter, wait_event; see comm.h), with the same argument checks
 * and broken-state rule as comm.c's wrappers. Kept apart from comm.c only
 * while that file is being split; they belong beside the others. */
#include "comm.h"

#include <errno.h>
#include <stdint.h>

int mg_comm_reduce_scatter(struct mg_comm *c, const float *send, float *recv, size_t recv_count,
                           enum mg_reduce_op op, int timeout_ms)
{
    if (!c)
        return -EINVAL;
    if (c->failed)
        return c->failed_code ? c->failed_code : -MG_EPEER;
    if (!c->ops->reduce_scatter)
        return -MG_EUNSUPPORTED;
    if ((recv_count && (!send || !recv)) ||
        recv_count > SIZE_MAX / sizeof(float) / 2 / (size_t)c->world ||
        (op != MG_REDUCE_SUM && op != MG_REDUCE_AVG))
        return -EINVAL;
    if (timeout_ms == MG_COMM_DEFAULT_TIMEOUT || timeout_ms == 0)
        timeout_ms = c->timeout_ms > 0 ? c->timeout_ms : MG_COMM_TIMEOUT_DEFAULT_MS;
    return c->ops->reduce_scatter(c, send, recv, recv_count, op, timeout_ms);
}

int mg_comm_wait_event(struct mg_comm *c, void *event)
{
    if (!c)
        return -EINVAL;
    if (c->failed)
        return c->failed_code ? c->failed_code : -MG_EPEER;
    if (!event || !c->ops->wait_event)
        return 0;
    return c->ops->wait_event(c, event);
}
