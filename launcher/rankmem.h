/* Memory the agent owns for one local rank and lends to every attempt's
 * worker of that rank: a memfd created once per run, sized and mapped by
 * the agent, inherited by the worker (its descriptor's number in an MG_*
 * variable, so it needs no name in any file system), and kept across
 * attempts, so a restarted worker finds what its predecessor left there and
 * the agent reads a frozen or dead worker's record without asking it.
 * Plain libc: mglaunch stays free of libmg; what a region holds is the
 * business of the header its two sides share. */
#ifndef MG_RANKMEM_H
#define MG_RANKMEM_H

#include <stddef.h>

struct mg_rankmem {
    int fd;      /* the memfd (close-on-exec in the agent), -1: none */
    size_t size; /* its size, and the length of map */
    void *map;   /* the agent's shared mapping, NULL while size is 0 */
};

/* Creates a memfd named name (shown in /proc/PID/fd) of size bytes, zeroed,
 * and maps it. Returns 0 or a negative errno; m->fd is -1 on failure. */
int mg_rankmem_create(struct mg_rankmem *m, const char *name, size_t size);

/* Sets its size (new bytes read as zero) and maps it again. 0 or -errno;
 * the region is unchanged on failure. Shrink only between attempts: a
 * worker that maps more than the new size faults (SIGBUS) past it. */
int mg_rankmem_resize(struct mg_rankmem *m, size_t size);

/* Follows a size the worker set itself (ftruncate on its descriptor): maps
 * the current size. -EFBIG when it is above max (the old mapping stays),
 * else 0 or -errno. */
int mg_rankmem_refresh(struct mg_rankmem *m, size_t max);

/* Unmaps and closes; m is "none" after. Safe on "none". */
void mg_rankmem_release(struct mg_rankmem *m);

/* "var=<fd>" into buf, the worker's environment entry. 0, or -ENOSPC when
 * cap is too small, -EBADF when m has no memfd. */
int mg_rankmem_env(const struct mg_rankmem *m, const char *var, char *buf, size_t cap);

#endif
