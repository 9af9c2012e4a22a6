/* Per-local-rank memory the agent lends its workers (see rankmem.h). */
#include "rankmem.h"

#include <errno.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Maps the first size bytes of fd shared, or NULL for 0 bytes. */
static int map_fd(int fd, size_t size, void **out)
{
    *out = NULL;
    if (size == 0)
        return 0;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return -errno;
    *out = p;
    return 0;
}

/* The new mapping p of size bytes replaces the old one (resize, refresh). */
static void take_map(struct mg_rankmem *m, void *p, size_t size)
{
    if (m->map)
        munmap(m->map, m->size);
    m->map = p;
    m->size = size;
}

int mg_rankmem_create(struct mg_rankmem *m, const char *name, size_t size)
{
    int rc;
    m->fd = -1;
    m->size = 0;
    m->map = NULL;
    /* Close-on-exec here: the spawn of its own worker alone lets it through
     * (mg_spawn_req.keep_fds), so no other rank's worker, no sentinel and
     * no helper holds it. */
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (ftruncate(fd, (off_t)size) < 0) {
        rc = -errno;
        goto close_fd;
    }
    if ((rc = map_fd(fd, size, &m->map)))
        goto close_fd;
    m->fd = fd;
    m->size = size;
    return 0;
close_fd:
    close(fd);
    return rc;
}

int mg_rankmem_resize(struct mg_rankmem *m, size_t size)
{
    void *p;
    int rc;
    if (m->fd < 0)
        return -EBADF;
    if (ftruncate(m->fd, (off_t)size) < 0)
        return -errno;
    if ((rc = map_fd(m->fd, size, &p))) {
        /* Back to the size the old mapping covers (a second failure leaves
         * the file larger than the mapping, which is harmless). */
        if (ftruncate(m->fd, (off_t)m->size) < 0)
            errno = 0;
        return rc;
    }
    take_map(m, p, size);
    return 0;
}

int mg_rankmem_refresh(struct mg_rankmem *m, size_t max)
{
    struct stat st;
    void *p;
    int rc;
    if (m->fd < 0)
        return -EBADF;
    if (fstat(m->fd, &st) < 0)
        return -errno;
    if (st.st_size < 0 || (unsigned long long)st.st_size > max)
        return -EFBIG;
    size_t size = (size_t)st.st_size;
    if (size == m->size)
        return 0;
    if ((rc = map_fd(m->fd, size, &p)))
        return rc;
    take_map(m, p, size);
    return 0;
}

void mg_rankmem_release(struct mg_rankmem *m)
{
    if (m->map)
        munmap(m->map, m->size);
    if (m->fd >= 0)
        close(m->fd);
    m->fd = -1;
    m->size = 0;
    m->map = NULL;
}

int mg_rankmem_env(const struct mg_rankmem *m, const char *var, char *buf, size_t cap)
{
    if (m->fd < 0)
        return -EBADF;
    int n = snprintf(buf, cap, "%s=%d", var, m->fd);
    return n < 0 || (size_t)n >= cap ? -ENOSPC : 0;
}
