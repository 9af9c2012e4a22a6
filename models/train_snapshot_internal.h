/* What the snapshot files of train share (docs/train.md, "Snapshots in
 * memory"): train_snapshot.c takes them, train_snapshot_resume.c agrees on
 * one at a restart and resumes from it, train_snapshot_zero.c keeps the
 * ZeRO-1 shards' copies on the next node and puts the shards together after
 * a node loss. */
#ifndef MG_TRAIN_SNAPSHOT_INTERNAL_H
#define MG_TRAIN_SNAPSHOT_INTERNAL_H

#include "train_internal.h"

#include <stdint.h>

#define NO_STEP UINT64_MAX

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

/* s is a step, newer than than (NO_STEP: none yet). */
static inline int snap_newer(uint64_t s, uint64_t than)
{
    return s != NO_STEP && (than == NO_STEP || s > than);
}

/* ---- train_snapshot_resume.c ---- */

/* Every rank's offer into all (one allgather; failed: said). */
int snap_exchange(struct run *r, struct offer *me, struct offer *all);
/* Where a run without a snapshot goes on from, for messages. */
const char *snap_fallback(const struct run *r);
/* Every rank resumes from rank src's own snapshot of step (its slot k),
 * sent to the others and checked by each; with ZeRO-1 after a node loss,
 * full is the whole optimizer state put together from the shards, and the
 * copy gives the rest. 0 with *resumed 1 (said with from), 1 with the
 * fallback said once, or a failed exchange. all is overwritten. */
int snap_resume_from_peer(struct run *r, struct offer *all, int src, int k, uint64_t step,
                          const float *full, const char *from, int *resumed);

/* ---- train_snapshot_zero.c ---- */

/* Whether the ZeRO-1 copies go by a shift (each rank sends and receives one
 * shard), else by an allgather (NCCL: every rank receives every shard). */
int snap_zero_by_shift(const struct run *r);
/* After this rank's own snapshot: its ZeRO-1 shard to the rank that keeps
 * it, and the shard of r->snap_peer_src into this rank's peer slots. */
int snap_zero_copy(struct run *r);
/* The newest step of which every old rank's shard is in some survivor's
 * memory, with a survivor's own snapshot of it in *src, *src_slot and the
 * old world size in *was; NO_STEP when there is none, *lost (else
 * UINT32_MAX) then naming the rank whose shard of *lost_step is nowhere. */
uint64_t snap_zero_step(const struct offer *all, int world, int *src, int *src_slot, uint32_t *was,
                        uint32_t *lost, uint64_t *lost_step);
/* Resumes from the shards of step at world size was, put together, and rank
 * src's own snapshot (slot k) for the rest; as snap_resume_from_peer. */
int snap_zero_resume(struct run *r, struct offer *all, int src, int k, uint64_t step, uint32_t was,
                     int *resumed);

#endif
