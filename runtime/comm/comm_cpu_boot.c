/* Bootstrap of the CPU communicator through the store (mg_comm_cpu_create).
 *
 * Each rank publishes under mg/comm/rank/<r> its host identity (the kernel's
 * boot id plus the mount and pid namespaces: two containers that share a kernel
 * but not /dev/shm are two hosts), hostname, pid and a listening TCP address;
 * every rank reads all of them and derives the same layout. A host's leader
 * creates the shared memory segment, named from the run id, the restart count
 * and a per-job nonce chosen by rank 0 (restarts and concurrent jobs never
 * collide), publishes the name; the name is unlinked once every local rank
 * has attached (or by whichever local rank gives up before that): nothing is
 * left in /dev/shm even when the job is SIGKILLed. Ring
 * members connect to the next member and accept from the previous one; a
 * hello carrying the nonce and the rank keeps stray connections out. A final
 * barrier over the new communicator proves every path works. */
#include "comm.h"
#include "comm_internal.h"
#include "mg_err.h"
#include "net.h"
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#define KEY_PREFIX  "mg/comm/"
#define HELLO_MAGIC 0x6f6c6c65686d6dULL /* "mmhello" */
#define INFO_MAX    1024
#define HOST_ID_MAX 200
#define MAX_WORLD   (1 << 20)

struct rank_info {
    char host_id[HOST_ID_MAX + 1];
    char hostname[MG_HOST_MAX];
    int pid;
    char addr[MG_HOST_MAX];
    int port;
};

struct hello {
    uint64_t magic;
    uint64_t nonce;
    int32_t rank;
    int32_t pad;
};

static const char *why(int rc)
{
    return rc == -ETIMEDOUT ? "timed out" : mg_strerror(rc);
}

static int read_line_file(const char *path, char *buf, size_t len)
{
    FILE *fp = fopen(path, "re");
    if (!fp)
        return -errno;
    int rc = fgets(buf, (int)len, fp) ? 0 : -EIO;
    fclose(fp);
    buf[strcspn(buf, "\n")] = '\0';
    return rc;
}

/* Ranks share memory when they share a kernel (boot id), a /dev/shm (mount
 * namespace) and can see each other's pids (pid namespace). */
static void default_host_id(char *buf, size_t len)
{
    char boot[64] = "", mnt[64] = "", pid[64] = "";
    ssize_t n;
    if (read_line_file("/proc/sys/kernel/random/boot_id", boot, sizeof(boot)))
        gethostname(boot, sizeof(boot) - 1);
    if ((n = readlink("/proc/self/ns/mnt", mnt, sizeof(mnt) - 1)) > 0)
        mnt[n] = '\0';
    if ((n = readlink("/proc/self/ns/pid", pid, sizeof(pid) - 1)) > 0)
        pid[n] = '\0';
    snprintf(buf, len, "%s/%s/%s", boot, mnt, pid);
}

static int parse_info(const char *text, struct rank_info *ri)
{
    char fields[6][MG_HOST_MAX];
    const char *p = text;
    for (int i = 0; i < 6; i++) {
        size_t l = strcspn(p, "\n");
        if (p[l] != '\n' || l >= MG_HOST_MAX)
            return -MG_EPROTO;
        memcpy(fields[i], p, l);
        fields[i][l] = '\0';
        p += l + 1;
    }
    if (strcmp(fields[0], "1") != 0 || strlen(fields[1]) > HOST_ID_MAX)
        return -MG_EPROTO;
    snprintf(ri->host_id, sizeof(ri->host_id), "%s", fields[1]);
    snprintf(ri->hostname, sizeof(ri->hostname), "%s", fields[2]);
    ri->pid = atoi(fields[3]);
    snprintf(ri->addr, sizeof(ri->addr), "%s", fields[4]);
    ri->port = atoi(fields[5]);
    return ri->port > 0 && ri->port < 65536 ? 0 : -MG_EPROTO;
}

static void sanitize(const char *in, char *out, size_t len)
{
    size_t j = 0;
    for (; in && *in && j + 1 < len; in++) {
        char ch = *in;
        int keep = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                   (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == '-';
        out[j++] = keep ? ch : '_';
    }
    out[j] = '\0';
}

/* Accepts connections until one says hello from want_rank with our nonce. */
static int accept_prev(int lfd, int want_rank, uint64_t nonce, int64_t deadline_ms, int *fd_out)
{
    for (;;) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        int rc = poll(&p, 1, mg_ms_until(deadline_ms));
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0)
            return -errno;
        if (rc == 0)
            return -ETIMEDOUT;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED)
                continue;
            return -errno;
        }
        struct hello h;
        int64_t hd = mg_now_ms() + 5000;
        if (deadline_ms >= 0 && hd > deadline_ms)
            hd = deadline_ms;
        rc = mg_read_full(fd, &h, sizeof(h), hd);
        if (rc == 0 && h.magic == HELLO_MAGIC && h.nonce == nonce && h.rank == want_rank) {
            *fd_out = fd;
            return 0;
        }
        close(fd); /* a stray connection: not our job, or not our neighbour */
    }
}

static int get_key(struct mg_store *st, const char *key, void **val, size_t *len,
                   int64_t deadline_ms)
{
    int left = mg_ms_until(deadline_ms);
    return mg_store_get(st, key, val, len, left < 1 ? 1 : left);
}

/* Connects to the next ring member and says hello. */
static int connect_next(const struct rank_info *ri, int rank, uint64_t nonce, int64_t deadline)
{
    int fd;
    for (;;) {
        fd = mg_connect_tcp(ri->addr, ri->port, deadline);
        if (fd >= 0 || fd == -ETIMEDOUT || mg_now_ms() >= deadline)
            break;
        usleep(20000);
    }
    if (fd < 0)
        return fd;
    struct hello h = {.magic = HELLO_MAGIC, .nonce = nonce, .rank = rank};
    int rc = mg_write_full(fd, &h, sizeof(h), deadline);
    if (rc) {
        close(fd);
        return rc;
    }
    return fd;
}

int mg_comm_cpu_create(struct mg_comm **out, struct mg_store *store,
                       const struct mg_comm_opts *opts, char *err, size_t errlen)
{
    int world = opts->world, rank = opts->rank, rc = 0, lfd = -1, next_fd = -1, prev_fd = -1;
    int timeout_ms = opts->timeout_ms > 0 ? opts->timeout_ms : MG_COMM_TIMEOUT_DEFAULT_MS;
    int64_t deadline =
        mg_now_ms() + (opts->init_timeout_ms > 0 ? opts->init_timeout_ms : timeout_ms);
    struct rank_info *info = NULL;
    int *host_of = NULL, *first = NULL, *ring_ranks = NULL, *local_ranks = NULL;
    struct mg_shm *shm = NULL;
    struct mg_ring *ring = NULL;
    struct mg_comm *c = NULL;
    char key[128], text[INFO_MAX], shm_name[160] = "";
    void *val = NULL;
    size_t vlen;
    uint64_t nonce = 0;
    int shm_named = 0, port = 0;

    if (world < 2 || world > MAX_WORLD || rank < 0 || rank >= world || !store) {
        mg_seterr(err, errlen, 0, "invalid rank %d / world size %d for the cpu communicator", rank,
                  world);
        return -EINVAL;
    }
    info = calloc((size_t)world, sizeof(*info));
    host_of = calloc((size_t)world, sizeof(int));
    first = calloc((size_t)world, sizeof(int));
    ring_ranks = calloc((size_t)world, sizeof(int));
    local_ranks = calloc((size_t)world, sizeof(int));
    if (!info || !host_of || !first || !ring_ranks || !local_ranks) {
        rc = -ENOMEM;
        mg_seterr(err, errlen, 0, "out of memory");
        goto out;
    }

    /* The job's nonce, chosen by rank 0. */
    if (rank == 0) {
        if (getrandom(&nonce, sizeof(nonce), 0) != sizeof(nonce))
            nonce = (uint64_t)mg_now_us() ^ ((uint64_t)getpid() << 32);
        snprintf(text, sizeof(text), "%016" PRIx64, nonce);
        rc = mg_store_set(store, KEY_PREFIX "nonce", text, strlen(text), 0);
        if (rc) {
            mg_seterr(err, errlen, 0, "publishing the communicator's nonce in the store: %s",
                      mg_strerror(rc));
            goto out;
        }
    } else {
        rc = get_key(store, KEY_PREFIX "nonce", &val, &vlen, deadline);
        if (rc) {
            mg_seterr(err, errlen, 0, "waiting for rank 0 to set up the communicator: %s", why(rc));
            goto out;
        }
        nonce = strtoull(val, NULL, 16);
        free(val);
        val = NULL;
    }

    /* What this rank is, and where its ring connection can reach it. */
    lfd = mg_listen_tcp(NULL, 0, 64, &port);
    if (lfd < 0) {
        rc = lfd;
        mg_seterr(err, errlen, 0, "cannot listen for ring connections: %s", mg_strerror(rc));
        goto out;
    }
    mg_set_nonblock(lfd, 1);
    struct rank_info *me = &info[rank];
    if (opts->host_id) {
        if (strlen(opts->host_id) > HOST_ID_MAX || strchr(opts->host_id, '\n')) {
            rc = -EINVAL;
            mg_seterr(err, errlen, 0, "host id '%.40s...' is too long or has a newline",
                      opts->host_id);
            goto out;
        }
        snprintf(me->host_id, sizeof(me->host_id), "%s", opts->host_id);
    } else {
        default_host_id(me->host_id, sizeof(me->host_id));
    }
    if (gethostname(me->hostname, sizeof(me->hostname) - 1) < 0)
        snprintf(me->hostname, sizeof(me->hostname), "unknown");
    me->hostname[strcspn(me->hostname, "\n")] = '\0';
    me->pid = (int)getpid();
    if (opts->advertise) {
        if (strlen(opts->advertise) >= sizeof(me->addr) || strchr(opts->advertise, '\n')) {
            rc = -EINVAL;
            mg_seterr(err, errlen, 0, "MG_COMM_ADDR '%.40s...' is too long", opts->advertise);
            goto out;
        }
        snprintf(me->addr, sizeof(me->addr), "%s", opts->advertise);
    } else {
        rc = mg_sock_local_addr(mg_store_fd(store), me->addr, sizeof(me->addr));
        if (rc) {
            mg_seterr(err, errlen, 0, "cannot find this host's address: %s", mg_strerror(rc));
            goto out;
        }
    }
    me->port = port;
    snprintf(text, sizeof(text), "1\n%s\n%s\n%d\n%s\n%d\n", me->host_id, me->hostname, me->pid,
             me->addr, me->port);
    snprintf(key, sizeof(key), KEY_PREFIX "rank/%d", rank);
    rc = mg_store_set(store, key, text, strlen(text), 0);
    if (rc) {
        mg_seterr(err, errlen, 0, "publishing rank %d's address in the store: %s", rank,
                  mg_strerror(rc));
        goto out;
    }
    for (int r = 0; r < world; r++) {
        if (r == rank)
            continue;
        snprintf(key, sizeof(key), KEY_PREFIX "rank/%d", r);
        rc = get_key(store, key, &val, &vlen, deadline);
        if (rc) {
            mg_seterr(err, errlen, 0, "waiting for rank %d to join the communicator: %s", r,
                      why(rc));
            goto out;
        }
        rc = parse_info(val, &info[r]);
        free(val);
        val = NULL;
        if (rc) {
            mg_seterr(err, errlen, 0, "rank %d published a malformed address in the store", r);
            goto out;
        }
    }

    /* Hosts numbered in order of their lowest rank. */
    int nh = 0, nl = 0, my_host;
    for (int r = 0; r < world; r++) {
        int h = 0;
        while (h < nh && strcmp(info[first[h]].host_id, info[r].host_id))
            h++;
        if (h == nh)
            first[nh++] = r;
        host_of[r] = h;
    }
    my_host = host_of[rank];
    for (int r = 0; r < world; r++)
        if (host_of[r] == my_host)
            local_ranks[nl++] = r;
    int local_rank = 0;
    while (local_ranks[local_rank] != rank)
        local_rank++;

    int all_ring = opts->mode == MG_COMM_TCP;
    if (opts->mode == MG_COMM_SHM && nh > 1) {
        rc = -MG_ECONFIG;
        mg_seterr(err, errlen, 0,
                  "MG_COMM=shm needs every rank on one host, but the ranks are on %d hosts "
                  "(rank 0 on %s, rank %d on %s); use MG_COMM=auto or tcp",
                  nh, info[0].hostname, first[1], info[first[1]].hostname);
        goto out;
    }

    /* Shared memory within the host. */
    if (!all_ring && nl > 1) {
        if (nl > MG_SHM_MAX_LOCAL) {
            rc = -MG_ECONFIG;
            mg_seterr(err, errlen, 0, "%d ranks on host %s: at most %d can share memory", nl,
                      me->hostname, MG_SHM_MAX_LOCAL);
            goto out;
        }
        char run[48];
        sanitize(opts->run_id && *opts->run_id ? opts->run_id : "none", run, sizeof(run));
        snprintf(shm_name, sizeof(shm_name), "/mg-%s-r%d-%016" PRIx64 "-h%d", run,
                 opts->restart_count, nonce, my_host);
        struct mg_shm_cfg cfg = {.nlocal = nl,
                                 .local_rank = local_rank,
                                 .ranks = local_ranks,
                                 .spin_us = opts->spin_us > 0   ? opts->spin_us
                                            : opts->spin_us < 0 ? 0
                                                                : -1};
        snprintf(key, sizeof(key), KEY_PREFIX "shm/%d", my_host);
        if (local_rank == 0) {
            rc = mg_shm_create(&shm, shm_name, nonce, &cfg);
            if (rc) {
                mg_seterr(err, errlen, 0, "cannot create shared memory segment /dev/shm%s: %s",
                          shm_name, mg_strerror(rc));
                goto out;
            }
            shm_named = 1;
            rc = mg_store_set(store, key, shm_name, strlen(shm_name), 0);
            if (rc) {
                mg_seterr(err, errlen, 0, "publishing the shared memory name: %s", mg_strerror(rc));
                goto out;
            }
        } else {
            rc = get_key(store, key, &val, &vlen, deadline);
            if (rc) {
                mg_seterr(err, errlen, 0, "waiting for rank %d to create shared memory: %s",
                          local_ranks[0], why(rc));
                goto out;
            }
            snprintf(shm_name, sizeof(shm_name), "%s", (char *)val);
            free(val);
            val = NULL;
            rc = mg_shm_attach(&shm, shm_name, nonce, &cfg);
            if (rc) {
                mg_seterr(err, errlen, 0, "cannot attach shared memory segment /dev/shm%s: %s",
                          shm_name, mg_strerror(rc));
                goto out;
            }
            shm_named = 1;
        }
        struct mg_fault f = {0};
        rc = mg_shm_wait_attached(shm, deadline, &f);
        if (rc) {
            mg_seterr(err, errlen, 0, "waiting for rank %d to attach shared memory: %s", f.peer,
                      why(rc));
            goto out;
        }
        /* Everyone is in: the name can go (any local rank may remove it, and
         * one that fails before this point does, so nothing leaks). */
        mg_shm_unlink(shm_name);
        shm_named = 0;
    }

    /* The ring: every rank (tcp, or one rank per host) or the host leaders. */
    int nring = 0, ring_idx = -1;
    if (all_ring || nh == world) {
        for (int r = 0; r < world; r++)
            ring_ranks[nring++] = r;
        ring_idx = rank;
    } else if (nh > 1) {
        for (int h = 0; h < nh; h++)
            ring_ranks[nring++] = first[h];
        if (local_rank == 0)
            ring_idx = my_host;
    }
    if (ring_idx >= 0) {
        int nxt = ring_ranks[(ring_idx + 1) % nring];
        int prv = ring_ranks[(ring_idx + nring - 1) % nring];
        next_fd = connect_next(&info[nxt], rank, nonce, deadline);
        if (next_fd < 0) {
            rc = next_fd;
            mg_seterr(err, errlen, 0, "cannot connect to rank %d at %s:%d (host %s): %s", nxt,
                      info[nxt].addr, info[nxt].port, info[nxt].hostname, why(rc));
            goto out;
        }
        rc = accept_prev(lfd, prv, nonce, deadline, &prev_fd);
        if (rc) {
            mg_seterr(err, errlen, 0, "waiting for rank %d (host %s) to connect: %s", prv,
                      info[prv].hostname, why(rc));
            goto out;
        }
        rc =
            mg_ring_create(&ring, nring, ring_idx, ring_ranks, next_fd, prev_fd, opts->tcp_segment);
        if (rc) {
            mg_seterr(err, errlen, 0, "cannot set up the ring: %s", mg_strerror(rc));
            goto out;
        }
        next_fd = prev_fd = -1;
    }
    close(lfd);
    lfd = -1;

    struct mg_cpu_parts parts = {.rank = rank,
                                 .world = world,
                                 .host_of = host_of,
                                 .all_ring = all_ring,
                                 .shm = shm,
                                 .ring = ring,
                                 .timeout_ms = timeout_ms,
                                 .no_zerocopy = opts->no_zerocopy};
    rc = mg_comm_cpu_assemble(&c, &parts);
    if (rc) {
        mg_seterr(err, errlen, 0, "cannot assemble the communicator: %s", mg_strerror(rc));
        goto out;
    }
    shm = NULL;
    ring = NULL;
    /* Prove that every path works, within the setup deadline. */
    int left = mg_ms_until(deadline);
    rc = mg_comm_cpu_check(c, left > 0 ? left : 1);
    if (rc) {
        mg_seterr(err, errlen, 0, "%s", mg_comm_errmsg(c));
        goto out;
    }
    *out = c;
    c = NULL;

out:
    if (shm_named)
        mg_shm_unlink(shm_name);
    mg_comm_release(c);
    mg_shm_release(shm);
    mg_ring_release(ring);
    free(val);
    if (lfd >= 0)
        close(lfd);
    if (next_fd >= 0)
        close(next_fd);
    if (prev_fd >= 0)
        close(prev_fd);
    free(info);
    free(host_of);
    free(first);
    free(ring_ranks);
    free(local_ranks);
    return rc;
}
