/* Bootstrap of the CPU communicator through the store (mg_comm_cpu_create).
 *
 * Each rank but 0 publishes under mg/comm/rank/<r> its host identity (the
 * kernel's boot id plus the mount and pid namespaces: two containers that share
 * a kernel but not /dev/shm are two hosts), hostname, pid and a listening TCP
 * address. Rank 0 reads them all and publishes them, with its own and a
 * per-job nonce, as one value, mg/comm/peers, which every other rank reads:
 * one round trip for each of them instead of one per rank (and W reads for the
 * store instead of W x W), the same for one host or a thousand. A job whose
 * records would not fit one value (over MG_STORE_MAX_VALUE) falls back to
 * everyone reading every record. Every rank derives the same layout. A host's
 * leader creates the shared memory segment as a memfd, which has no name: it
 * goes with the last process that holds it, so nothing is ever left in
 * /dev/shm, whichever rank dies at whichever step. The leader publishes its pid
 * and the descriptor's number; the others open it through /proc/<pid>/fd/<n>
 * (the header's nonce, chosen by rank 0, proves it is this job's segment).
 * Ring members connect to the
 * next member and accept from the previous one; a hello carrying the nonce and
 * the rank keeps stray connections out. A final barrier over the new
 * communicator proves every path works.
 *
 * mg_comm_cpu_create takes these as named steps over one struct boot, which
 * a failed step leaves for boot_release() to undo. */
#include "comm.h"
#include "comm_internal.h"
#include "mg_err.h"
#include "net.h"
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
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

/* What the bootstrap has learned and holds so far, step by step; boot_release()
 * undoes whatever a failed step leaves. */
struct boot {
    const struct mg_comm_opts *opts;
    struct mg_store *store;
    int rank, world;
    int timeout_ms;   /* the communicator's default collective timeout */
    int64_t deadline; /* of the whole setup */
    char *err;
    size_t errlen;
    uint64_t nonce;
    int lfd; /* listening for the previous ring member */
    struct rank_info *info;
    int *host_of;     /* [world]: host of each rank, numbered by lowest rank */
    int *first;       /* [nhosts]: lowest rank of each host */
    int *local_ranks; /* [nlocal]: the ranks of this host */
    int *ring_ranks;  /* [world] */
    int nhosts, nlocal, my_host, local_rank;
    int all_ring; /* MG_COMM=tcp */
    struct mg_shm *shm;
    struct mg_ring *ring;
};

__attribute__((format(printf, 3, 4))) static int boot_err(struct boot *b, int rc, const char *fmt,
                                                          ...)
{
    va_list ap;
    va_start(ap, fmt);
    mg_vseterr(b->err, b->errlen, rc, fmt, ap);
    va_end(ap);
    return rc;
}

/* Waits for a peer's key until the setup's deadline; a wait that lasts is
 * told to opts->progress, saying for whom (what: "rank 3 to join") and how
 * long it may still last. */
static int get_key(struct boot *b, const char *key, const char *what, void **val)
{
    size_t len;
    int64_t start = mg_now_ms(), next = start + MG_COMM_PROGRESS_FIRST_MS;
    char msg[256];
    for (;;) {
        int slice = mg_ms_until(b->deadline);
        if (b->opts->progress && slice > mg_ms_until(next))
            slice = mg_ms_until(next);
        int rc = mg_store_get(b->store, key, val, &len, slice < 1 ? 1 : slice);
        int64_t now = mg_now_ms();
        if (rc != -ETIMEDOUT || !b->opts->progress || now >= b->deadline)
            return rc;
        if (now >= next) {
            next = now + MG_COMM_PROGRESS_EVERY_MS;
            snprintf(msg, sizeof(msg),
                     "rank %d: waiting for %s: %d s so far, giving up in %d s "
                     "(MG_COMM_INIT_TIMEOUT)",
                     b->rank, what, (int)((now - start) / 1000),
                     (mg_ms_until(b->deadline) + 999) / 1000);
            b->opts->progress(b->opts->progress_ctx, msg);
        }
    }
}

/* The job's nonce, chosen by rank 0 (the others learn it in exchange_peers). */
static void choose_nonce(struct boot *b)
{
    if (b->rank != 0)
        return;
    if (getrandom(&b->nonce, sizeof(b->nonce), 0) != sizeof(b->nonce))
        b->nonce = (uint64_t)mg_now_us() ^ ((uint64_t)getpid() << 32);
}

static void format_info(const struct rank_info *ri, char *text, size_t len)
{
    snprintf(text, len, "1\n%s\n%s\n%d\n%s\n%d\n", ri->host_id, ri->hostname, ri->pid, ri->addr,
             ri->port);
}

/* What this rank is, and where its ring connection can reach it. */
static int publish_self(struct boot *b)
{
    const struct mg_comm_opts *opts = b->opts;
    struct rank_info *me = &b->info[b->rank];
    char key[128], text[INFO_MAX];
    int port = 0, rc;

    int fd = mg_listen_tcp(NULL, 0, 64, &port);
    if (fd < 0)
        return boot_err(b, fd, "cannot listen for ring connections: %s", mg_strerror(fd));
    b->lfd = fd;
    mg_set_nonblock(b->lfd, 1);
    if (opts->host_id) {
        if (strlen(opts->host_id) > HOST_ID_MAX || strchr(opts->host_id, '\n'))
            return boot_err(b, -EINVAL, "host id '%.40s...' is too long or has a newline",
                            opts->host_id);
        snprintf(me->host_id, sizeof(me->host_id), "%s", opts->host_id);
    } else {
        default_host_id(me->host_id, sizeof(me->host_id));
    }
    if (gethostname(me->hostname, sizeof(me->hostname) - 1) < 0)
        snprintf(me->hostname, sizeof(me->hostname), "unknown");
    me->hostname[strcspn(me->hostname, "\n")] = '\0';
    me->pid = (int)getpid();
    if (opts->advertise) {
        if (strlen(opts->advertise) >= sizeof(me->addr) || strchr(opts->advertise, '\n'))
            return boot_err(b, -EINVAL, "MG_COMM_ADDR '%.40s...' is too long", opts->advertise);
        snprintf(me->addr, sizeof(me->addr), "%s", opts->advertise);
    } else {
        rc = mg_sock_local_addr(mg_store_fd(b->store), me->addr, sizeof(me->addr));
        if (rc)
            return boot_err(b, rc, "cannot find this host's address: %s", mg_strerror(rc));
    }
    me->port = port;
    if (b->rank == 0) /* its record goes out with everyone's */
        return 0;
    format_info(me, text, sizeof(text));
    snprintf(key, sizeof(key), KEY_PREFIX "rank/%d", b->rank);
    rc = mg_store_set(b->store, key, text, strlen(text), 0);
    if (rc)
        return boot_err(b, rc, "publishing rank %d's address in the store: %s", b->rank,
                        mg_strerror(rc));
    return 0;
}

/* The records of ranks [from, world) but this one's, one key each. */
static int read_records(struct boot *b, int from)
{
    char key[128];
    void *val;
    for (int r = from; r < b->world; r++) {
        if (r == b->rank)
            continue;
        char what[64];
        snprintf(key, sizeof(key), KEY_PREFIX "rank/%d", r);
        snprintf(what, sizeof(what), "rank %d to join the communicator", r);
        int rc = get_key(b, key, what, &val);
        if (rc)
            return boot_err(b, rc, "waiting for rank %d to join the communicator: %s", r, why(rc));
        rc = parse_info(val, &b->info[r]);
        free(val);
        if (rc)
            return boot_err(b, rc, "rank %d published a malformed address in the store", r);
    }
    return 0;
}

/* Rank 0 gathers every record and publishes them as mg/comm/peers: "<nonce
 * hex>\n<count>\n" then count records in rank order (count 1, rank 0's only,
 * when all of them would not fit one value: the others then read each rank's
 * own key). Every other rank reads that one key. */
static int exchange_peers(struct boot *b)
{
    void *val;
    int rc;
    if (b->rank == 0) {
        rc = read_records(b, 1);
        if (rc)
            return rc;
        size_t cap = (size_t)b->world * INFO_MAX + 64, at;
        if (cap > MG_STORE_MAX_VALUE)
            cap = INFO_MAX + 64; /* too many: rank 0's record only */
        char *text = malloc(cap);
        if (!text)
            return boot_err(b, -ENOMEM, "out of memory");
        int all = cap > INFO_MAX + 64 || b->world == 1;
        at = (size_t)snprintf(text, cap, "%016" PRIx64 "\n%d\n", b->nonce, all ? b->world : 1);
        for (int r = 0; r < (all ? b->world : 1); r++) {
            format_info(&b->info[r], text + at, cap - at);
            at += strlen(text + at);
        }
        rc = mg_store_set(b->store, KEY_PREFIX "peers", text, at, 0);
        free(text);
        if (rc)
            return boot_err(b, rc, "publishing the ranks' addresses in the store: %s",
                            mg_strerror(rc));
        return 0;
    }
    rc = get_key(b, KEY_PREFIX "peers", "rank 0 to gather the ranks' addresses", &val);
    if (rc)
        return boot_err(b, rc, "waiting for rank 0 to gather the ranks' addresses: %s", why(rc));
    const char *p = val;
    char *end;
    int count = 0;
    b->nonce = strtoull(p, &end, 16);
    if (*end == '\n')
        count = (int)strtol(end + 1, &end, 10);
    if (*end != '\n' || (count != b->world && count != 1)) {
        free(val);
        return boot_err(b, -MG_EPROTO, "rank 0 published malformed addresses in the store");
    }
    p = end + 1;
    for (int r = 0; r < count && !rc; r++) {
        struct rank_info ri;
        rc = parse_info(p, &ri);
        for (int k = 0; k < 6 && !rc; k++)
            p = strchr(p, '\n') + 1; /* parse_info checked the six lines */
        if (!rc && r != b->rank)
            b->info[r] = ri;
    }
    free(val);
    if (rc)
        return boot_err(b, rc, "rank 0 published a malformed address in the store");
    return count == 1 ? read_records(b, 1) : 0;
}

/* Hosts numbered in order of their lowest rank; this host's ranks. Every rank
 * derives the same layout from the same records. */
static int plan_hosts(struct boot *b)
{
    const struct rank_info *info = b->info;
    int nh = 0, nl = 0;
    for (int r = 0; r < b->world; r++) {
        int h = 0;
        while (h < nh && strcmp(info[b->first[h]].host_id, info[r].host_id))
            h++;
        if (h == nh)
            b->first[nh++] = r;
        b->host_of[r] = h;
    }
    b->nhosts = nh;
    b->my_host = b->host_of[b->rank];
    for (int r = 0; r < b->world; r++)
        if (b->host_of[r] == b->my_host)
            b->local_ranks[nl++] = r;
    b->nlocal = nl;
    b->local_rank = 0;
    while (b->local_ranks[b->local_rank] != b->rank)
        b->local_rank++;

    b->all_ring = b->opts->mode == MG_COMM_TCP;
    if (b->opts->mode == MG_COMM_SHM && nh > 1)
        return boot_err(b, -MG_ECONFIG,
                        "MG_COMM=shm needs every rank on one host, but the ranks are on %d hosts "
                        "(rank 0 on %s, rank %d on %s); use MG_COMM=auto or tcp",
                        nh, info[0].hostname, b->first[1], info[b->first[1]].hostname);
    return 0;
}

/* A debugging knob for the tests of what a dead rank leaves behind
 * (docs/distributed.md): MG_COMM_DEBUG_KILL=STEP[@RANK] makes the rank
 * (every rank without @RANK) SIGKILL itself when the bootstrap reaches STEP. */
static void debug_kill(const struct boot *b, const char *step)
{
    const char *v = getenv("MG_COMM_DEBUG_KILL");
    if (!v || !*v)
        return;
    size_t n = strcspn(v, "@");
    if (strlen(step) != n || strncmp(v, step, n) != 0)
        return;
    if (v[n] == '@' && atoi(v + n + 1) != b->rank)
        return;
    raise(SIGKILL);
}

/* Shared memory within the host: the leader creates the segment and
 * publishes where it is; the others open it from the leader's descriptor. */
static int attach_shm(struct boot *b)
{
    const struct mg_comm_opts *opts = b->opts;
    char key[128], text[64];
    void *val;
    int rc;
    if (b->all_ring || b->nlocal <= 1)
        return 0;
    if (b->nlocal > MG_SHM_MAX_LOCAL)
        return boot_err(b, -MG_ECONFIG, "%d ranks on host %s: at most %d can share memory",
                        b->nlocal, b->info[b->rank].hostname, MG_SHM_MAX_LOCAL);
    struct mg_shm_cfg cfg = {.nlocal = b->nlocal,
                             .local_rank = b->local_rank,
                             .ranks = b->local_ranks,
                             .spin_us = opts->spin_us > 0   ? opts->spin_us
                                        : opts->spin_us < 0 ? 0
                                                            : -1};
    snprintf(key, sizeof(key), KEY_PREFIX "shm/%d", b->my_host);
    if (b->local_rank == 0) {
        rc = mg_shm_create(&b->shm, NULL, b->nonce, &cfg);
        if (rc)
            return boot_err(b, rc, "cannot create the shared memory segment: %s", mg_strerror(rc));
        debug_kill(b, "shm-created");
        snprintf(text, sizeof(text), "%d %d", (int)getpid(), mg_shm_fd(b->shm));
        rc = mg_store_set(b->store, key, text, strlen(text), 0);
        if (rc)
            return boot_err(b, rc, "publishing the shared memory segment: %s", mg_strerror(rc));
        debug_kill(b, "shm-published");
    } else {
        int leader = b->local_ranks[0], pid = 0, fd = -1;
        char what[64];
        snprintf(what, sizeof(what), "rank %d to create shared memory", leader);
        rc = get_key(b, key, what, &val);
        if (rc)
            return boot_err(b, rc, "waiting for rank %d to create shared memory: %s", leader,
                            why(rc));
        int ok = sscanf(val, "%d %d", &pid, &fd) == 2 && pid > 0 && fd >= 0;
        free(val);
        if (!ok)
            return boot_err(b, -MG_EPROTO, "rank %d published a malformed shared memory address",
                            leader);
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
        int sfd = open(path, O_RDWR | O_CLOEXEC);
        if (sfd < 0) {
            rc = -errno;
            return boot_err(b, rc,
                            "cannot open rank %d's shared memory segment through %s: %s (the "
                            "ranks of a host must run as one user; MG_COMM=tcp does without "
                            "shared memory)",
                            leader, path, rc == -ENOENT ? "rank gone" : mg_strerror(rc));
        }
        rc = mg_shm_attach_fd(&b->shm, sfd, b->nonce, &cfg);
        if (rc)
            return boot_err(b, rc, "cannot attach rank %d's shared memory segment: %s", leader,
                            mg_strerror(rc));
        debug_kill(b, "shm-attached");
    }
    struct mg_fault f = {0};
    rc = mg_shm_wait_attached(b->shm, b->deadline, &f);
    if (rc)
        return boot_err(b, rc, "waiting for rank %d to attach shared memory: %s", f.peer, why(rc));
    return 0;
}

/* The ring: every rank (tcp, or one rank per host) or the host leaders. Each
 * member connects to the next and accepts the previous; the listening socket
 * is no longer needed after this step. */
static int connect_ring(struct boot *b)
{
    const struct rank_info *info = b->info;
    int nring = 0, ring_idx = -1, next_fd = -1, prev_fd = -1, rc = 0;
    if (b->all_ring || b->nhosts == b->world) {
        for (int r = 0; r < b->world; r++)
            b->ring_ranks[nring++] = r;
        ring_idx = b->rank;
    } else if (b->nhosts > 1) {
        for (int h = 0; h < b->nhosts; h++)
            b->ring_ranks[nring++] = b->first[h];
        if (b->local_rank == 0)
            ring_idx = b->my_host;
    }
    if (ring_idx >= 0) {
        int nxt = b->ring_ranks[(ring_idx + 1) % nring];
        int prv = b->ring_ranks[(ring_idx + nring - 1) % nring];
        next_fd = connect_next(&info[nxt], b->rank, b->nonce, b->deadline);
        if (next_fd < 0)
            return boot_err(b, next_fd, "cannot connect to rank %d at %s:%d (host %s): %s", nxt,
                            info[nxt].addr, info[nxt].port, info[nxt].hostname, why(next_fd));
        rc = accept_prev(b->lfd, prv, b->nonce, b->deadline, &prev_fd);
        if (rc) {
            boot_err(b, rc, "waiting for rank %d (host %s) to connect: %s", prv, info[prv].hostname,
                     why(rc));
            close(next_fd);
            return rc;
        }
        rc = mg_ring_create(&b->ring, nring, ring_idx, b->ring_ranks, next_fd, prev_fd,
                            b->opts->tcp_segment);
        if (rc) {
            boot_err(b, rc, "cannot set up the ring: %s", mg_strerror(rc));
            close(next_fd);
            close(prev_fd);
            return rc;
        }
    }
    close(b->lfd);
    b->lfd = -1;
    return 0;
}

/* The communicator from its pieces, and a barrier over it that proves every
 * path works, within the setup deadline. */
static int assemble_and_check(struct boot *b, struct mg_comm **out)
{
    struct mg_cpu_parts parts = {.rank = b->rank,
                                 .world = b->world,
                                 .host_of = b->host_of,
                                 .all_ring = b->all_ring,
                                 .shm = b->shm,
                                 .ring = b->ring,
                                 .timeout_ms = b->timeout_ms,
                                 .no_zerocopy = b->opts->no_zerocopy};
    struct mg_comm *c;
    int rc = mg_comm_cpu_assemble(&c, &parts);
    if (rc)
        return boot_err(b, rc, "cannot assemble the communicator: %s", mg_strerror(rc));
    b->shm = NULL;
    b->ring = NULL;
    int left = mg_ms_until(b->deadline);
    rc = mg_comm_cpu_check(c, left > 0 ? left : 1);
    if (rc) {
        boot_err(b, rc, "%s", mg_comm_errmsg(c));
        mg_comm_release(c);
        return rc;
    }
    *out = c;
    return 0;
}

static void boot_release(struct boot *b)
{
    mg_shm_release(b->shm);
    mg_ring_release(b->ring);
    if (b->lfd >= 0)
        close(b->lfd);
    free(b->info);
    free(b->host_of);
    free(b->first);
    free(b->ring_ranks);
    free(b->local_ranks);
}

int mg_comm_cpu_create(struct mg_comm **out, struct mg_store *store,
                       const struct mg_comm_opts *opts, char *err, size_t errlen)
{
    int world = opts->world, rank = opts->rank;
    if (world < 2 || world > MAX_WORLD || rank < 0 || rank >= world || !store)
        return mg_seterr(err, errlen, -EINVAL,
                         "invalid rank %d / world size %d for the cpu communicator", rank, world);
    int timeout_ms = opts->timeout_ms > 0 ? opts->timeout_ms : MG_COMM_TIMEOUT_DEFAULT_MS;
    struct boot b = {
        .opts = opts,
        .store = store,
        .rank = rank,
        .world = world,
        .timeout_ms = timeout_ms,
        .deadline = mg_now_ms() + (opts->init_timeout_ms > 0 ? opts->init_timeout_ms : timeout_ms),
        .err = err,
        .errlen = errlen,
        .lfd = -1,
        .info = calloc((size_t)world, sizeof(struct rank_info)),
        .host_of = calloc((size_t)world, sizeof(int)),
        .first = calloc((size_t)world, sizeof(int)),
        .local_ranks = calloc((size_t)world, sizeof(int)),
        .ring_ranks = calloc((size_t)world, sizeof(int)),
    };
    int rc = 0;
    if (!b.info || !b.host_of || !b.first || !b.local_ranks || !b.ring_ranks)
        rc = boot_err(&b, -ENOMEM, "out of memory");
    choose_nonce(&b);
    if (!rc) {
        debug_kill(&b, "nonce");
        rc = publish_self(&b);
    }
    if (!rc) {
        debug_kill(&b, "published");
        rc = exchange_peers(&b);
    }
    if (!rc)
        rc = plan_hosts(&b);
    if (!rc) {
        debug_kill(&b, "planned");
        rc = attach_shm(&b);
    }
    if (!rc) {
        debug_kill(&b, "shm-ready");
        rc = connect_ring(&b);
    }
    if (!rc) {
        debug_kill(&b, "ring");
        rc = assemble_and_check(&b, out);
    }
    if (!rc)
        debug_kill(&b, "checked");
    boot_release(&b);
    return rc;
}
