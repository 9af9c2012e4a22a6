/* In-memory snapshots for the train program (docs/train.md, "Snapshots in
 * memory"): the region mglaunch lends each local rank (MG_SNAPSHOT_FD), a
 * copy of this rank's state after every --snapshot-every steps, and a
 * restart that resumes from the newest snapshot every rank holds, checked,
 * before it looks at the checkpoint directory. With ZeRO-1 on more than one
 * node each rank also keeps a copy of the optimizer shard of the same local
 * rank on the node before its own (a ring over nodes), so that a node's loss
 * loses no shard: the survivors gather the whole state from their own
 * shards and those copies and reshard it as a checkpoint's. */
#include "snapshot/snapshot.h"
#include "rtutil.h"
#include "train_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SNAP_FD_ENV  "MG_SNAPSHOT_FD"
#define SNAP_MAX_ENV "MG_SNAPSHOT_MAX_BYTES"
#define NO_STEP      UINT64_MAX

/* What each rank tells the others at a restart, in one allgather: the steps
 * its two slots hold for this run as this very rank (NO_STEP: none), and the
 * steps they hold for this run written by any rank of any world size, with
 * who wrote them and their size (a peer's copy after a node loss); the
 * newest of this run's checkpoints it sees on disk; and, when a slot did not
 * check out, why. */
struct offer {
    uint64_t step[MG_SNAP_SLOTS];
    uint64_t any[MG_SNAP_ALL_SLOTS]; /* the own slots, then the peer slots (ZeRO-1 shards) */
    uint64_t bytes[MG_SNAP_ALL_SLOTS];
    uint32_t world[MG_SNAP_ALL_SLOTS], rank[MG_SNAP_ALL_SLOTS];
    uint64_t disk;
    int32_t ok;  /* the later rounds: the chosen snapshot checked out */
    int32_t mem; /* the first: this rank has memory for snapshots */
    char why[216];
};

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
    /* the exchange's room (every rank's shard) is host memory too: counted, and
     * touched now, so that a limit is met at the start and not by an OOM later */
    uint64_t exch = peer_cap * (uint64_t)world, need = mg_snap_region_bytes(bytes, peer_cap) + exch;
    if (exch && limit && need > limit)
        rc = mg_seterr(err, MG_ERRMSG_LEN, -MG_ETOOBIG,
                       "two copies of this rank's state, two of its peer's shard and room to "
                       "exchange every rank's shard take %" PRIu64
                       " bytes of memory, more than the %" PRIu64 " allowed",
                       need, limit);
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

/* ZeRO-1 over nodes: every rank's shard to every rank in one allgather (the
 * communicator has no point-to-point), of which this rank keeps the one of
 * snap_peer_src, in its peer slots, checked as its own are. */
static int replicate(struct run *r)
{
    struct mg_trainer *t = &r->trainer;
    struct mg_backend *be = r->model.be;
    uint64_t n = r->snap_shard;
    unsigned char *mine = r->snap_all + (size_t)n * (size_t)r->dist.rank;
    be->ops->download(be, mine, t->opt.state, (size_t)n);
    int rc = be->ops->sync(be);
    if (rc < 0) {
        fail("cannot copy the optimizer shard from the device: %s", mg_backend_errmsg(be));
        return rc;
    }
    rc = mg_ddp_allgather(r->dist.ddp, mine, r->snap_all, (size_t)n);
    if (rc < 0) {
        fail("cannot send the optimizer shard of step %ld to the next node: %s", t->step,
             mg_ddp_errmsg(r->dist.ddp));
        return rc;
    }
    unsigned char *slot = mg_snap_peer_begin(&r->snap);
    if (!slot)
        return -EINVAL;
    memcpy(slot, r->snap_all + (size_t)n * (size_t)r->snap_peer_src, (size_t)n);
    return mg_snap_peer_commit(&r->snap, (uint64_t)t->step, t->cfg.run_id_hash,
                               (uint32_t)r->dist.world, (uint32_t)r->snap_peer_src, n);
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
    if (rc == 0 && r->snap_peer_src >= 0 && (rc = replicate(r)) < 0 && rc != -EINVAL)
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

/* This rank's offer: the steps of its slots that are this run's and whole,
 * and of those the ones written at this world size by this rank; every
 * slot's step with who wrote it, at which world size (the own slots: a
 * peer's copy after a node loss; the peer slots: a ZeRO-1 shard's copy). */
static void make_offer(struct run *r, struct offer *me)
{
    memset(me, 0, sizeof(*me));
    for (int i = 0; i < MG_SNAP_ALL_SLOTS; i++) {
        struct mg_snap_slot sl;
        if (i < MG_SNAP_SLOTS)
            me->step[i] = NO_STEP;
        me->any[i] = NO_STEP;
        mg_snap_inspect(&r->snap, i, &sl);
        const char *bad = NULL;
        if (!sl.valid && strcmp(sl.why, "empty") != 0)
            bad = sl.why;
        else if (sl.valid && sl.run != r->trainer.cfg.run_id_hash)
            bad = "written by another run";
        else if (sl.valid) {
            me->any[i] = sl.step;
            me->bytes[i] = sl.payload_bytes;
            me->world[i] = sl.world;
            me->rank[i] = sl.rank;
            if (i < MG_SNAP_SLOTS && sl.world == (uint32_t)r->dist.world &&
                sl.rank == (uint32_t)r->dist.rank)
                me->step[i] = sl.step;
        }
        if (bad && !me->why[0])
            snprintf(me->why, sizeof(me->why), "%s %d: %s", i < MG_SNAP_PEER ? "slot" : "peer slot",
                     i % MG_SNAP_PEER, bad);
    }
    if (r->snap.dropped && !me->why[0])
        snprintf(me->why, sizeof(me->why),
                 "its memory held snapshots of another size (another model's), dropped");
}

/* s is a step, newer than than (NO_STEP: none yet). */
static int newer(uint64_t s, uint64_t than)
{
    return s != NO_STEP && (than == NO_STEP || s > than);
}

static int has_step(const struct offer *o, uint64_t step)
{
    for (int i = 0; i < MG_SNAP_SLOTS; i++)
        if (o->step[i] == step)
            return 1;
    return 0;
}

/* The rank holding old rank q's state of step at world size was (an own
 * slot, or a peer slot's shard), and the slot; -1 when no survivor does. */
static int holder_of(const struct offer *all, int world, uint64_t step, uint32_t was, uint32_t q,
                     int *slot)
{
    for (int h = 0; h < world; h++)
        for (int i = 0; i < MG_SNAP_ALL_SLOTS; i++)
            if (all[h].any[i] == step && all[h].world[i] == was && all[h].rank[i] == q) {
                *slot = i;
                return h;
            }
    return -1;
}

/* Whether an earlier own slot (of an earlier rank, or of rank h before k)
 * holds the same step at the same world size: its shards were looked for
 * once already, and looking again for each of thousands of ranks would cost
 * world^2 x old world when one is lost. */
static int seen_before(const struct offer *all, int h, int k)
{
    for (int g = 0; g <= h; g++)
        for (int j = 0; j < (g < h ? MG_SNAP_SLOTS : k); j++)
            if (all[g].any[j] == all[h].any[k] && all[g].world[j] == all[h].world[k])
                return 1;
    return 0;
}

/* ZeRO-1: the newest step of which every old rank's shard is in some
 * survivor's memory (its own slot, or a peer slot), with the own snapshot
 * of a survivor (its parameters and position) in *src, *src_slot, the old
 * world size in *was. NO_STEP when there is none; *lost (else UINT32_MAX)
 * then names the rank whose shard of *lost_step, the newest step any rank
 * holds, is nowhere. */
static uint64_t shards_step(const struct offer *all, int world, int *src, int *src_slot,
                            uint32_t *was, uint32_t *lost, uint64_t *lost_step)
{
    uint64_t chosen = NO_STEP;
    int slot;
    *lost = UINT32_MAX;
    *lost_step = NO_STEP;
    for (int h = 0; h < world; h++)
        for (int k = 0; k < MG_SNAP_SLOTS; k++) {
            uint64_t s = all[h].any[k];
            uint32_t w = all[h].world[k], q = 0;
            if (!newer(s, chosen) || w == 0 || w > (1u << 20) || seen_before(all, h, k))
                continue;
            while (q < w && holder_of(all, world, s, w, q, &slot) >= 0)
                q++;
            if (q == w) {
                chosen = s;
                *src = h;
                *src_slot = k;
                *was = w;
            } else if (newer(s, *lost_step)) {
                *lost = q;
                *lost_step = s;
            }
        }
    return chosen;
}

static int exchange(struct run *r, struct offer *me, struct offer *all)
{
    if (r->dist.world == 1) {
        all[0] = *me;
        return 0;
    }
    int rc = mg_ddp_allgather(r->dist.ddp, me, all, sizeof(*me));
    if (rc < 0)
        fail("cannot agree on a snapshot to resume from: %s", mg_ddp_errmsg(r->dist.ddp));
    return rc;
}

/* Copies out, parses and checks this rank's slot holding step (apply 0), or
 * restores it (apply 1). */
static int load_slot(struct run *r, uint64_t step, int apply, char *err)
{
    struct mg_snap_slot sl;
    char what[64];
    for (int i = 0; i < MG_SNAP_SLOTS; i++) {
        mg_snap_inspect(&r->snap, i, &sl);
        if (!sl.valid || sl.step != step)
            continue;
        unsigned char *raw;
        uint64_t len;
        struct mg_ckpt_file f;
        snprintf(what, sizeof(what), "the snapshot of step %" PRIu64, step);
        int rc = mg_snap_copy_out(&r->snap, i, &raw, &len, err);
        if (rc == 0)
            rc = mg_ckpt_parse_payload(raw, len, what, &f, err);
        if (rc < 0)
            return rc;
        rc = mg_trainer_snapshot_load(&r->trainer, &f, what, apply, err);
        mg_ckpt_file_release(&f);
        return rc;
    }
    return mg_seterr(err, MG_ERRMSG_LEN, -ENOENT, "the snapshot of step %" PRIu64 " is gone", step);
}

/* The newest of this run's complete checkpoints on this rank's disk. */
static uint64_t disk_step(struct run *r)
{
    struct mg_ckpt_owner me = {.run = r->trainer.cfg.run_id_hash};
    struct mg_ckpt_entry e;
    if (!r->o->checkpoint_dir || mg_ckpt_list_runs(r->o->checkpoint_dir, &me, &e, 1) != 1)
        return NO_STEP;
    return e.step;
}

/* The state no longer on this run's path is dropped: every slot but the one
 * resumed from, so a later restart cannot pick a step of an abandoned one. */
static void keep_only(struct run *r, uint64_t step)
{
    for (int i = 0; i < MG_SNAP_ALL_SLOTS; i++) {
        struct mg_snap_slot sl;
        mg_snap_inspect(&r->snap, i, &sl);
        if (!sl.valid || sl.step != step)
            mg_snap_invalidate(&r->snap, i);
    }
}

/* Where a run without a snapshot goes on from, for messages. */
static const char *fallback(const struct run *r)
{
    return r->o->checkpoint_dir ? "--checkpoint-dir" : "step 0 (no --checkpoint-dir)";
}

/* A replicated optimizer after a node loss (or a copy interrupted on one
 * rank): every rank resumes from rank src's copy of step (its slot k),
 * broadcast to the others, checked by each, resharded when the world size
 * changed. With ZeRO-1, full is the whole optimizer state gathered from the
 * shards, and the copy gives the rest. 0 with *resumed 1 (said with from),
 * or 1 with the fallback said once, or a failed exchange. all is the first
 * round's offers (overwritten). */
static int resume_from_peer(struct run *r, struct offer *all, int src, int k, uint64_t step,
                            const float *full, const char *from, int *resumed)
{
    int world = r->dist.world, me_src = r->dist.rank == src, rc;
    uint64_t len = all[src].bytes[k];
    uint32_t was_world = all[src].world[k], was_rank = all[src].rank[k];
    unsigned char *raw = NULL;
    char err[MG_ERRMSG_LEN], what[96];
    struct offer me;
    struct mg_ckpt_file f;
    int parsed = 0;
    snprintf(what, sizeof(what), "rank %u's snapshot of step %" PRIu64 " at world size %u",
             was_rank, step, was_world);
    /* first the source's copy out (checked against its hash) and everyone's room
     * for it: nothing is sent that does not check out where it lies */
    memset(&me, 0, sizeof(me));
    me.ok = 1;
    /* a ZeRO-1 shard of another world size is at most the whole state */
    uint64_t room = r->snap_bytes + mg_trainer_state_count(&r->trainer) * sizeof(float);
    if (len > room) {
        me.ok = 0;
        snprintf(me.why, sizeof(me.why),
                 "%s is %" PRIu64 " bytes, more than a snapshot of this run holds (%" PRIu64 ")",
                 what, len, room);
    } else if (me_src) {
        struct mg_snap_slot sl;
        mg_snap_inspect(&r->snap, k, &sl);
        rc = sl.valid && sl.step == step
                 ? mg_snap_copy_out(&r->snap, k, &raw, &len, err)
                 : mg_seterr(err, MG_ERRMSG_LEN, -ENOENT, "%s is gone", what);
        if (rc < 0) {
            me.ok = 0;
            snprintf(me.why, sizeof(me.why), "%.200s", err);
        }
    } else if (!(raw = malloc(len ? len : 1))) {
        me.ok = 0;
        snprintf(me.why, sizeof(me.why), "out of memory for %s", what);
    }
    rc = exchange(r, &me, all);
    if (rc < 0)
        goto out;
    for (int q = 0; q < world; q++)
        if (!all[q].ok)
            goto refused;
    if (world > 1 && (rc = mg_ddp_broadcast_bytes(r->dist.ddp, raw, len, src)) < 0) {
        fail("cannot send %s to every rank: %s", what, mg_ddp_errmsg(r->dist.ddp));
        goto out;
    }
    /* every rank checks before any changes: one that refuses sends all to disk */
    memset(&me, 0, sizeof(me));
    rc = mg_ckpt_parse_payload(raw, len, what, &f, err);
    raw = NULL; /* the parse took it over, in every case */
    parsed = rc == 0;
    if (rc == 0)
        rc = full ? mg_trainer_snapshot_load_gathered(&r->trainer, &f, full, what, 0, err)
                  : mg_trainer_snapshot_load_peer(&r->trainer, &f, what, 0, err);
    me.ok = rc == 0;
    if (rc < 0)
        snprintf(me.why, sizeof(me.why), "%.200s", err);
    rc = exchange(r, &me, all);
    if (rc < 0)
        goto out;
    for (int q = 0; q < world; q++)
        if (!all[q].ok)
            goto refused;
    rc = full ? mg_trainer_snapshot_load_gathered(&r->trainer, &f, full, what, 1, err)
              : mg_trainer_snapshot_load_peer(&r->trainer, &f, what, 1, err);
    if (rc < 0) {
        fail("cannot resume from memory: %s", err);
        goto out;
    }
    *resumed = 1;
    r->res_from = MG_FROM_MEMORY;
    r->res_src_rank = full ? MG_RESUME_SHARDS : (int)was_rank;
    r->res_src_world = (int)was_world;
    resume_said(r, from, 0);
    rc = 0;
    goto out;
refused:
    for (int q = 0; q < world; q++) {
        if (all[q].ok)
            continue;
        if (r->dist.rank == 0)
            fprintf(stderr,
                    TRAIN_PROG ": warning: not resuming from memory: rank %d: %s; resuming from "
                               "%s\n",
                    q, all[q].why, fallback(r));
        break;
    }
    rc = 1; /* the caller drops the slots and leaves the resume to the disk */
out:
    if (parsed)
        mg_ckpt_file_release(&f);
    free(raw);
    return rc;
}

/* Old rank q's shard of step, out of this rank's slot i (its own
 * snapshot's optimizer state, or a peer slot's copy), checked against its
 * hash and its size (bytes: a shard at that world size): malloc'ed in *out. */
static int shard_copy(struct run *r, int i, uint64_t step, uint64_t bytes, unsigned char **out,
                      char *err)
{
    struct mg_snap_slot sl;
    struct mg_ckpt_file f;
    unsigned char *raw;
    uint64_t len;
    char what[96];
    *out = NULL;
    mg_snap_inspect(&r->snap, i, &sl);
    snprintf(what, sizeof(what), "rank %u's %s of step %" PRIu64, sl.rank,
             i < MG_SNAP_PEER ? "snapshot" : "shard (a peer's copy)", step);
    int rc = sl.valid && sl.step == step
                 ? mg_snap_copy_out(&r->snap, i, &raw, &len, err)
                 : mg_seterr(err, MG_ERRMSG_LEN, -ENOENT, "%s is gone", what);
    if (rc < 0)
        return rc;
    if (i >= MG_SNAP_PEER) {
        *out = raw;
    } else {
        /* an own snapshot: the shard is its OPTIM state */
        rc = mg_ckpt_parse_payload(raw, len, what, &f, err);
        if (rc < 0)
            return rc;
        const struct mg_ckpt_section *st = mg_ckpt_find(&f, MG_CKPT_TAG_OPTIM, 1);
        len = st ? st->len : 0;
        if (st && len == bytes && (*out = malloc(len ? len : 1)))
            memcpy(*out, st->data, len);
        mg_ckpt_file_release(&f);
        if (st && len == bytes && !*out)
            return mg_seterr(err, MG_ERRMSG_LEN, -ENOMEM, "out of memory for %s", what);
    }
    if (len != bytes) {
        free(*out);
        *out = NULL;
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_EFORMAT,
                         "%s holds %" PRIu64 " bytes of optimizer state, a shard at its world "
                         "size %" PRIu64,
                         what, len, bytes);
    }
    return 0;
}

/* ZeRO-1 after a node loss: old rank q's shard of step, for every q of the
 * old world size was, from the survivor that holds it (own slot or peer
 * slot), checked there, then sent to every rank, which puts it where it
 * belongs in the whole state; then resume_from_peer with rank src's own
 * snapshot (slot k) for the rest, the whole state resharded as a file's. */
static int resume_gathered(struct run *r, struct offer *all, int src, int k, uint64_t step,
                           uint32_t was, int *resumed)
{
    int world = r->dist.world, rc = -ENOMEM, copies = 0;
    int nvec = mg_optim_state_vectors(&r->trainer.opt.cfg);
    struct mg_ddp_opts dopts;
    train_ddp_opts(r, &dopts);
    size_t n = r->model.nparams, len = mg_ddp_shard_len_at(&r->model, &dopts, (int)was);
    size_t nfull = (size_t)nvec * n + 1;
    uint64_t bytes = (uint64_t)nvec * len * sizeof(float);
    int *hold = calloc(was, sizeof(int)), *slot = calloc(was, sizeof(int));
    unsigned char **mine = calloc(was, sizeof(*mine));
    float *full = malloc(nfull * sizeof(float));
    unsigned char *shard = malloc(bytes ? bytes : 1);
    struct offer me, *said = calloc((size_t)world, sizeof(*said)); /* all: resume_from_peer's */
    char err[MG_ERRMSG_LEN], from[160];
    memset(&me, 0, sizeof(me));
    me.ok = 1;
    if (!hold || !slot || !mine || !full || !shard || !said) {
        me.ok = 0;
        snprintf(me.why, sizeof(me.why), "out of memory to gather the optimizer shards");
    }
    /* each holder checks its copies first: nothing is sent that does not check out */
    for (uint32_t q = 0; q < was && me.ok; q++) {
        hold[q] = holder_of(all, world, step, was, q, &slot[q]);
        copies += slot[q] >= MG_SNAP_PEER;
        if (hold[q] == r->dist.rank && shard_copy(r, slot[q], step, bytes, &mine[q], err) < 0) {
            me.ok = 0;
            snprintf(me.why, sizeof(me.why), "%.200s", err);
        }
    }
    rc = exchange(r, &me, said ? said : all);
    if (rc < 0)
        goto out;
    if (!said) { /* out of memory (the others say so): the disk resumes */
        rc = 1;
        goto out;
    }
    for (int q = 0; q < world; q++) {
        if (said[q].ok)
            continue;
        if (r->dist.rank == 0)
            fprintf(stderr,
                    TRAIN_PROG ": warning: not resuming from memory: rank %d: %s; resuming from "
                               "%s\n",
                    q, said[q].why, fallback(r));
        rc = 1;
        goto out;
    }
    for (uint32_t q = 0; q < was; q++) {
        if (hold[q] == r->dist.rank)
            memcpy(shard, mine[q], bytes);
        if (world > 1 && (rc = mg_ddp_broadcast_bytes(r->dist.ddp, shard, bytes, hold[q])) < 0) {
            fail("cannot send rank %u's optimizer shard of step %" PRIu64 " to every rank: %s", q,
                 step, mg_ddp_errmsg(r->dist.ddp));
            goto out;
        }
        /* the layout is was's, as every rank computes it: this cannot refuse */
        mg_ddp_unshard(&r->model, &dopts, (int)was, (int)q, (const float *)(void *)shard, len, full,
                       nvec);
    }
    snprintf(from, sizeof(from),
             "memory: the ZeRO-1 shards of world size %u (%d from a peer's copy)", was, copies);
    rc = resume_from_peer(r, all, src, k, step, full, from, resumed);
out:
    for (uint32_t q = 0; mine && q < was; q++)
        free(mine[q]);
    free(mine);
    free(hold);
    free(slot);
    free(full);
    free(shard);
    free(said);
    return rc;
}

int snapshot_resume(struct run *r, int *resumed)
{
    int world = r->dist.world, rc;
    char err[MG_ERRMSG_LEN];
    struct offer me, *all = NULL;
    *resumed = 0;
    /* every rank takes part while snapshots are asked for, memory or not: which
     * ranks have some is the exchange's to find out, and snapshots (and auto's
     * agreement on their interval) are for all ranks or none */
    if (r->o->snapshot_every == 0 || (!r->snap_on && world == 1))
        return 0;
    all = calloc((size_t)world, sizeof(*all));
    if (!all) {
        fail("out of memory");
        return -ENOMEM;
    }
    memset(&me, 0, sizeof(me));
    me.step[0] = me.step[1] = me.any[0] = me.any[1] = NO_STEP;
    if (r->snap_on)
        make_offer(r, &me);
    else
        snprintf(me.why, sizeof(me.why), "%.200s", r->snap_off);
    me.mem = r->snap_on;
    me.disk = disk_step(r);
    rc = exchange(r, &me, all);
    if (rc < 0)
        goto out;
    int without = -1, with = 0;
    for (int q = 0; q < world; q++) {
        with += all[q].mem != 0;
        if (!all[q].mem && without < 0)
            without = q;
    }
    if (without >= 0) {
        /* rank 0 told its own size refusal already; nobody's memory: nothing to tell */
        if (with && r->dist.rank == 0)
            fprintf(stderr,
                    TRAIN_PROG ": warning: rank %d keeps no snapshots in memory (%s): this run "
                               "keeps none\n",
                    without, all[without].why);
        snapshot_close(r);
        rc = 0;
        goto out;
    }
    /* the newest step every rank holds as its own; with a replicated optimizer
     * (every rank's state the same), the newest any rank holds, sent to the
     * others: after a node loss the survivors' copies resume the new world;
     * with ZeRO-1, the newest of which every old rank's shard survives */
    uint64_t best = NO_STEP, peer = NO_STEP, disk = NO_STEP, lost_step = NO_STEP;
    int said = -1, any = 0, src = -1, src_slot = -1;
    uint32_t was = 0, lost = UINT32_MAX;
    int sharded = r->o->zero; /* the snapshots hold shards (one process: of another world) */
    for (int q = 0; q < world; q++) {
        if (newer(all[q].disk, disk))
            disk = all[q].disk;
        if (said < 0 && all[q].why[0])
            said = q;
        for (int k = 0; k < MG_SNAP_SLOTS; k++) {
            uint64_t s = all[q].any[k];
            int everyone = q == 0 && newer(all[0].step[k], best);
            for (int o = 1; o < world && everyone; o++)
                everyone = has_step(&all[o], all[0].step[k]);
            if (everyone)
                best = all[0].step[k];
            any |= s != NO_STEP;
            if (!sharded && newer(s, peer)) {
                peer = s;
                src = q;
                src_slot = k;
            }
        }
    }
    if (sharded)
        peer = shards_step(all, world, &src, &src_slot, &was, &lost, &lost_step);
    int use_peer = newer(peer, best);
    uint64_t chosen = use_peer ? peer : best;
    if (chosen != NO_STEP && disk != NO_STEP && disk > chosen) {
        if (r->dist.rank == 0)
            say(&r->prog,
                TRAIN_PROG ": the checkpoint of step %" PRIu64 " is newer than the snapshot in "
                           "memory (step %" PRIu64 "): resuming from --checkpoint-dir",
                disk, chosen);
        best = NO_STEP;
        goto drop;
    }
    if (chosen == NO_STEP) {
        if (r->dist.rank == 0 && (any || said >= 0)) {
            char gone[160] = "", why[300] = "";
            if (lost != UINT32_MAX)
                snprintf(gone, sizeof(gone),
                         ": rank %u's ZeRO-1 shard of step %" PRIu64 " is in no memory left", lost,
                         lost_step);
            if (said >= 0)
                snprintf(why, sizeof(why), " (rank %d: %s)", said, all[said].why);
            fprintf(stderr,
                    TRAIN_PROG ": warning: no snapshot in memory that every rank holds%s%s: "
                               "resuming from %s\n",
                    gone, why, fallback(r));
        }
        goto drop;
    }
    if (use_peer) {
        char from[160];
        snprintf(from, sizeof(from), "memory: rank %u's snapshot at world size %u",
                 all[src].rank[src_slot], all[src].world[src_slot]);
        rc = sharded ? resume_gathered(r, all, src, src_slot, peer, was, resumed)
                     : resume_from_peer(r, all, src, src_slot, peer, NULL, from, resumed);
        if (rc < 0)
            goto out;
        best = rc == 0 ? peer : NO_STEP;
        goto drop;
    }
    /* every rank checks before any changes: a bad copy on one rank sends all to disk */
    memset(&me, 0, sizeof(me));
    rc = load_slot(r, best, 0, err);
    me.ok = rc == 0;
    if (rc < 0)
        snprintf(me.why, sizeof(me.why), "%.200s", err);
    rc = exchange(r, &me, all);
    if (rc < 0)
        goto out;
    for (int q = 0; q < world; q++) {
        if (all[q].ok)
            continue;
        if (r->dist.rank == 0)
            fprintf(stderr,
                    TRAIN_PROG ": warning: not resuming from memory: rank %d: %s; resuming from "
                               "%s\n",
                    q, all[q].why, fallback(r));
        best = NO_STEP;
        goto drop;
    }
    rc = load_slot(r, best, 1, err);
    if (rc < 0) {
        fail("cannot resume from memory: %s", err);
        goto out;
    }
    *resumed = 1;
    r->res_from = MG_FROM_MEMORY;
    r->res_src_rank = MG_RESUME_OWN;
    r->res_src_world = world;
    if (r->dist.rank == 0)
        say(&r->prog,
            TRAIN_PROG ": resumed from memory (the snapshot of step %ld, epoch %ld), param hash "
                       "%016" PRIx64,
            r->trainer.step, r->trainer.resumed.epoch + 1, mg_model_param_hash(&r->model));
drop:
    keep_only(r, best);
    /* a region of the old world size's layout, read: now this one's */
    rc = mg_snap_relayout(&r->snap, err);
    if (rc < 0)
        fail("cannot keep snapshots in memory: %s", err);
out:
    free(all);
    return rc;
}
