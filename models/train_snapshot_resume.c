/* A restart's snapshot (docs/train.md, "Snapshots in memory"): each rank
 * offers what its slots hold, the ranks agree on the newest step every rank
 * can get (its own copy, else one sent from a survivor, else the ZeRO-1
 * shards put together: train_snapshot_zero.c), each checks it before any
 * takes it, and a fallback to the checkpoint directory is said once. */
#include "snapshot/snapshot.h"
#include "rtutil.h"
#include "train_snapshot_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static int has_step(const struct offer *o, uint64_t step)
{
    for (int i = 0; i < MG_SNAP_SLOTS; i++)
        if (o->step[i] == step)
            return 1;
    return 0;
}

int snap_exchange(struct run *r, struct offer *me, struct offer *all)
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
const char *snap_fallback(const struct run *r)
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
int snap_resume_from_peer(struct run *r, struct offer *all, int src, int k, uint64_t step,
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
    rc = snap_exchange(r, &me, all);
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
    rc = snap_exchange(r, &me, all);
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
                    q, all[q].why, snap_fallback(r));
        break;
    }
    rc = 1; /* the caller drops the slots and leaves the resume to the disk */
out:
    if (parsed)
        mg_ckpt_file_release(&f);
    free(raw);
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
    rc = snap_exchange(r, &me, all);
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
        if (snap_newer(all[q].disk, disk))
            disk = all[q].disk;
        if (said < 0 && all[q].why[0])
            said = q;
        for (int k = 0; k < MG_SNAP_SLOTS; k++) {
            uint64_t s = all[q].any[k];
            int everyone = q == 0 && snap_newer(all[0].step[k], best);
            for (int o = 1; o < world && everyone; o++)
                everyone = has_step(&all[o], all[0].step[k]);
            if (everyone)
                best = all[0].step[k];
            any |= s != NO_STEP;
            if (!sharded && snap_newer(s, peer)) {
                peer = s;
                src = q;
                src_slot = k;
            }
        }
    }
    if (sharded)
        peer = snap_zero_step(all, world, &src, &src_slot, &was, &lost, &lost_step);
    int use_peer = snap_newer(peer, best);
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
                    gone, why, snap_fallback(r));
        }
        goto drop;
    }
    if (use_peer) {
        char from[160];
        snprintf(from, sizeof(from), "memory: rank %u's snapshot at world size %u",
                 all[src].rank[src_slot], all[src].world[src_slot]);
        rc = sharded ? snap_zero_resume(r, all, src, src_slot, peer, was, resumed)
                     : snap_resume_from_peer(r, all, src, src_slot, peer, NULL, from, resumed);
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
    rc = snap_exchange(r, &me, all);
    if (rc < 0)
        goto out;
    for (int q = 0; q < world; q++) {
        if (all[q].ok)
            continue;
        if (r->dist.rank == 0)
            fprintf(stderr,
                    TRAIN_PROG ": warning: not resuming from memory: rank %d: %s; resuming from "
                               "%s\n",
                    q, all[q].why, snap_fallback(r));
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
