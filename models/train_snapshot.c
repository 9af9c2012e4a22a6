/* In-memory snapshots for the train program (docs/train.md, "Snapshots in
 * memory"): the region mglaunch lends each local rank (MG_SNAPSHOT_FD), its
 * size against the memory that may be used, and a copy of this rank's state
 * after every --snapshot-every steps (auto: the interval timed and agreed
 * on). A restart's choice is train_snapshot_resume.c's; the ZeRO-1 shards'
 * copies on the next node are train_snapshot_zero.c's. */
#include "snapshot/snapshot.h"
#include "rtutil.h"
#include "train_snapshot_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SNAP_FD_ENV   "MG_SNAPSHOT_FD"
#define SNAP_MAX_ENV  "MG_SNAPSHOT_MAX_BYTES"
#define SNAP_STOP_ENV "MG_TEST_SNAPSHOT_STOP"

static int env_u64(const char *name, uint64_t *out)
{
    const char *v = getenv(name);
    char *end;
    if (!v || !*v)
        return 0;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end || v[0] == '-')
        return -EINVAL;
    *out = x;
    return 1;
}

/* What the cgroup (v2) this process runs in, and each cgroup above it, still
 * lets it take: memory.max - memory.current, the smallest along the path.
 * UINT64_MAX when no cgroup sets a limit. A pod's memfd pages count against
 * its cgroup, whatever the host has free. */
static uint64_t cgroup_room(void)
{
    char path[4096], file[4200], line[4096];
    uint64_t room = UINT64_MAX;
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f)
        return room;
    path[0] = '\0';
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, "0::", 3) == 0) {
            snprintf(path, sizeof(path), "%s", line + 3);
            path[strcspn(path, "\n")] = '\0';
        }
    fclose(f);
    if (path[0] != '/')
        return room;
    for (;;) {
        uint64_t max = 0, cur = 0;
        snprintf(file, sizeof(file), "/sys/fs/cgroup%s/memory.max", path);
        FILE *m = fopen(file, "re");
        if (m && fscanf(m, "%" SCNu64, &max) == 1) {
            snprintf(file, sizeof(file), "/sys/fs/cgroup%s/memory.current", path);
            FILE *c = fopen(file, "re");
            if (c && fscanf(c, "%" SCNu64, &cur) == 1 && max - (cur < max ? cur : max) < room)
                room = max - (cur < max ? cur : max);
            if (c)
                fclose(c);
        }
        if (m)
            fclose(m);
        char *slash = strrchr(path, '/');
        if (!slash || slash == path)
            break;
        *slash = '\0';
    }
    return room;
}

/* Half of the memory available (the kernel's MemAvailable, or what the
 * cgroup leaves when that is less), shared by this host's ranks: what two
 * copies of a rank's state may take unless told. 1 (nothing fits) when
 * neither figure can be read: no figure is no licence. */
static uint64_t default_limit(int local_world)
{
    FILE *f = fopen("/proc/meminfo", "re");
    char line[256];
    uint64_t kb = 0;
    if (f) {
        while (fgets(line, sizeof(line), f))
            if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &kb) == 1)
                break;
        fclose(f);
    }
    uint64_t avail = kb ? kb * 1024 : UINT64_MAX, room = cgroup_room();
    if (room < avail)
        avail = room;
    if (avail == UINT64_MAX || avail == 0)
        return 1;
    uint64_t per = avail / 2 / (uint64_t)(local_world > 0 ? local_world : 1);
    return per ? per : 1;
}

int snapshot_open(struct run *r)
{
    struct train_options *o = r->o;
    char err[MG_ERRMSG_LEN];
    uint64_t fd, limit = 0, bytes;
    r->snap_on = 0;
    r->snap_test_stop = -1;
    if (o->snapshot_every == 0)
        return 0;
    int have = env_u64(SNAP_FD_ENV, &fd);
    if (have < 0 || (have && fd > INT_MAX)) {
        fail("%s='%s' is not a file descriptor number; it is mglaunch's to set", SNAP_FD_ENV,
             getenv(SNAP_FD_ENV));
        return -EINVAL;
    }
    if (!have) {
        snprintf(r->snap_off, sizeof(r->snap_off), "%s unset: not started by mglaunch?",
                 SNAP_FD_ENV);
        if (o->snapshot_set && r->dist.rank == 0)
            say(&r->prog,
                TRAIN_PROG ": --snapshot-every: no memory to keep snapshots in (%s is set by "
                           "mglaunch): restarts resume from --checkpoint-dir only",
                SNAP_FD_ENV);
        return 0;
    }
    uint64_t stop;
    int hook = env_u64(SNAP_STOP_ENV, &stop);
    if (hook < 0 || (hook && stop > LONG_MAX)) {
        fail("%s='%s': expected a step number (a test hook)", SNAP_STOP_ENV, getenv(SNAP_STOP_ENV));
        return -EINVAL;
    }
    r->snap_test_stop = hook ? (long)stop : -1;
    int lim = env_u64(SNAP_MAX_ENV, &limit);
    if (lim < 0) {
        fail("%s='%s': expected a number of bytes", SNAP_MAX_ENV, getenv(SNAP_MAX_ENV));
        return -EINVAL;
    }
    if (lim && limit == 0) {
        /* not "no limit", and not "no snapshots" either: said, not guessed */
        fail("%s=0: expected a number of bytes above 0; to keep no snapshots, use "
             "--snapshot-every 0",
             SNAP_MAX_ENV);
        return -EINVAL;
    }
    if (!lim)
        limit = default_limit(r->dist.d ? r->dist.d->local_world : 1);
    int rc = mg_trainer_snapshot_bytes(&r->trainer, &bytes);
    if (rc < 0) {
        fail("cannot size this rank's snapshot: %s", mg_strerror(rc));
        return rc;
    }
    /* ZeRO-1 over nodes (RANK = node * LOCAL_WORLD_SIZE + LOCAL_RANK): the shard of
     * the same local rank on the node before this one is kept here too */
    int local = r->dist.d ? r->dist.d->local_world : 1, world = r->dist.world;
    int sharded = r->trainer.hooks.shard_state != NULL;
    r->snap_peer_src = -1;
    r->snap_shard = r->trainer.opt.state_count * sizeof(float);
    if (sharded && local > 0 && world > local && world % local == 0 && r->snap_shard)
        r->snap_peer_src = (r->dist.rank - local + world) % world;
    uint64_t peer_cap = r->snap_peer_src >= 0 ? r->snap_shard : 0;
    /* the exchange's room (this rank's shard to send; with an allgather, every
     * rank's) is host memory too: counted, and touched now, so that a limit is
     * met at the start and not by an OOM later */
    int shift = snap_zero_by_shift(r);
    uint64_t exch = peer_cap * (uint64_t)(shift ? 1 : world);
    uint64_t need = mg_snap_region_bytes(bytes, peer_cap) + exch;
    if (exch && limit && need > limit)
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_ETOOBIG,
                       "two copies of this rank's state, two of its peer's shard and room to "
                       "%s take %" PRIu64 " bytes of memory, more than the %" PRIu64 " allowed",
                       shift ? "send its own" : "exchange every rank's shard", need, limit);
    else
        rc = mg_snap_open(&r->snap, (int)fd, bytes, peer_cap, limit, err);
    if (rc == 0 && exch && !(r->snap_all = malloc((size_t)exch)))
        rc = mg_seterr(err, MG_ERRMSG_LEN, -ENOMEM,
                       "out of memory for the exchange of the shards' copies (%" PRIu64 " bytes)",
                       exch);
    if (rc == 0 && exch)
        memset(r->snap_all, 0, (size_t)exch);
    if (rc == -MG_ETOOBIG && !o->snapshot_set && !lim) {
        /* not asked for: a large model trains as it did before snapshots, told why */
        snprintf(r->snap_off, sizeof(r->snap_off), "%.300s, half the available memory", err);
        if (r->dist.rank == 0)
            fprintf(stderr,
                    TRAIN_PROG ": warning: not keeping snapshots in memory: %s (half the "
                               "available memory shared by this host's ranks); set %s to allow "
                               "more\n",
                    err, SNAP_MAX_ENV);
        return 0;
    }
    if (rc == -MG_ETOOBIG) {
        fail("cannot keep snapshots in memory: %s (%s); set %s higher, --snapshot-every 0 to "
             "train without them",
             err, lim ? SNAP_MAX_ENV : "half the available memory shared by this host's ranks",
             SNAP_MAX_ENV);
        return rc;
    }
    if (rc < 0) {
        fail("cannot keep snapshots in memory: %s", err);
        return rc;
    }
    r->snap_on = 1;
    r->snap_bytes = bytes;
    r->snap_every = o->snapshot_every > 0 ? o->snapshot_every : 1;
    return 0;
}

void snapshot_close(struct run *r)
{
    if (r->snap_on)
        mg_snap_close(&r->snap);
    r->snap_on = 0;
    free(r->snap_all);
    r->snap_all = NULL;
    r->snap_peer_src = -1;
}

/* --snapshot-every auto: a snapshot after each of the first AUTO_SKIP steps
 * (warm-up), then AUTO_PROBE steps without one and AUTO_PROBE copies, timed in
 * turn; then the ranks agree on the shortest interval that keeps the copies
 * under AUTO_SHARE of the time: the slowest rank's figure, of the medians. */
#if AUTO_PROBE > SNAP_PROBES
#error "struct run's probe arrays are too short"
#endif
#define AUTO_SKIP  10 /* warm-up: the copies fault their pages in, the steps their caches */
#define AUTO_PROBE 11
#define AUTO_SHARE                                                                                 \
    0.02 /* aimed below the 3% the docs promise: a copy after a longer interval finds colder caches than the timed ones */
#define AUTO_MAX 10000

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return v[n / 2];
}

static int auto_decide(struct run *r)
{
    /* medians: a step another process on the machine delayed says nothing of the run */
    double cost = median_of(r->snap_probe, AUTO_PROBE), step = median_of(r->step_probe, AUTO_PROBE);
    double mine = step > 0 ? cost / (AUTO_SHARE * step) : 1.0, one = mine;
    int world = r->dist.world;
    double *all = world > 1 ? calloc((size_t)world, sizeof(double)) : &one;
    if (!all) {
        fail("out of memory");
        return -ENOMEM;
    }
    if (world > 1) {
        int rc = mg_ddp_allgather(r->dist.ddp, &mine, all, sizeof(mine));
        if (rc < 0) {
            fail("cannot agree on how often to keep snapshots: %s", mg_ddp_errmsg(r->dist.ddp));
            free(all);
            return rc;
        }
    }
    double worst = 0;
    for (int q = 0; q < world; q++)
        worst = all[q] > worst ? all[q] : worst;
    if (world > 1)
        free(all);
    long every = worst <= 1.0 ? 1 : worst >= AUTO_MAX ? AUTO_MAX : (long)ceil(worst);
    r->snap_every = every;
    if (r->dist.rank == 0)
        say(&r->prog,
            TRAIN_PROG ": snapshots in memory every %ld step%s (one takes %.3f ms, a step %.3f "
                       "ms; --snapshot-every auto keeps them under %.0f%% of the time)",
            every, every == 1 ? "" : "s", 1e3 * cost, 1e3 * step, 100 * AUTO_SHARE);
    return 0;
}

int snapshot_take(struct run *r, double step_seconds)
{
    struct mg_trainer *t = &r->trainer;
    if (!r->snap_on)
        return 0;
    long done = t->step - r->snap_start; /* steps since this attempt began */
    int probing = r->o->snapshot_every < 0 && done <= AUTO_SKIP + 2 * AUTO_PROBE;
    /* timed: a step without a copy, then a copy after a step (its memory as cold as
     * a step leaves it, as at any interval), in turn */
    long k = done - AUTO_SKIP - 1;
    if (probing && k >= 0 && k % 2 == 0) {
        r->step_probe[k / 2] = step_seconds;
        return 0;
    }
    if (!probing && t->step % r->snap_every != 0)
        return 0;
    struct mg_train_sums sums;
    int rc = train_read_sums(r, &sums, 0); /* never a snapshot of a diverged run */
    if (rc < 0)
        return rc;
    double t0 = mg_seconds();
    uint64_t len;
    unsigned char *buf = mg_snap_begin(&r->snap);
    rc = mg_trainer_snapshot_pack(t, buf, r->snap.payload_cap, &len);
    if (rc == 0)
        rc = mg_snap_commit(&r->snap, (uint64_t)t->step, t->cfg.run_id_hash,
                            (uint32_t)r->dist.world, (uint32_t)r->dist.rank, len);
    if (rc == 0 && r->snap_peer_src >= 0 && (rc = snap_zero_copy(r)) < 0 && rc != -EINVAL)
        return rc; /* said */
    if (rc < 0) {
        fail("cannot keep the snapshot of step %ld in memory: %s", t->step, mg_strerror(rc));
        return rc;
    }
    double took = mg_seconds() - t0;
    r->snap_time += took;
    r->snap_count++;
    if (probing && k >= 0) {
        r->snap_probe[k / 2] = took;
        if (done == AUTO_SKIP + 2 * AUTO_PROBE)
            return auto_decide(r);
    }
    return 0;
}
