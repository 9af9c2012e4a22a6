/* A unit test's CPU communicator over shared memory, for ranks forked on one
 * host: rank 0 creates the segment, the others attach once it is there. Shared
 * by test_ddp.c and test_ddp_device.c. */
#ifndef MG_SHM_COMM_H
#define MG_SHM_COMM_H

#include "comm_internal.h"
#include "mg_err.h"
#include "net.h"

#include <errno.h>
#include <unistd.h>

/* This rank's communicator (world up to 4), or NULL. */
static inline struct mg_comm *shm_comm_join(int rank, int world, const char *shm_name, int zerocopy)
{
    int ranks[4] = {0, 1, 2, 3}, host_of[4] = {0, 0, 0, 0};
    struct mg_shm_cfg cfg = {.nlocal = world, .local_rank = rank, .ranks = ranks, .spin_us = -1};
    struct mg_shm *g = NULL;
    struct mg_fault f;
    int rc;
    if (rank == 0)
        rc = mg_shm_create(&g, shm_name, 7, &cfg);
    else
        while ((rc = mg_shm_attach(&g, shm_name, 7, &cfg)) == -ENOENT || rc == -MG_EFORMAT)
            usleep(1000);
    if (rc || mg_shm_wait_attached(g, mg_now_ms() + 10000, &f))
        return NULL;
    if (rank == 0)
        mg_shm_unlink(shm_name);
    struct mg_comm *c;
    struct mg_cpu_parts parts = {
        .rank = rank, .world = world, .host_of = host_of, .shm = g, .no_zerocopy = !zerocopy};
    return mg_comm_cpu_assemble(&c, &parts) ? NULL : c;
}

#endif
