/* In-memory snapshots: the region a rank keeps its newest training state in,
 * between optimizer steps, so that a restarted worker resumes from memory
 * instead of the last checkpoint on disk (docs/checkpoint-format.md,
 * "Snapshots in memory").
 *
 * The region is shared memory that outlives the worker: a memfd (or a file in
 * /dev/shm) the launcher owns per local rank and hands to every attempt's
 * worker. It holds a header and two slots of this rank's own state, then, when
 * asked for, two peer slots: the copy this rank keeps of another rank's
 * (ZeRO-1: the optimizer shard of the same local rank on the node before this
 * one), written and checked the same way. A writer fills the slot with the
 * older generation and stamps its header last (generation, step, run, world
 * size, rank, payload hash, header CRC), so a worker killed in the middle of a
 * copy leaves the other slot whole, and a half-written slot never checks out.
 * What a payload holds is the trainer's business (trainer.h): the sections of
 * a checkpoint, uncompressed. This module knows nothing of models.
 *
 * A function with a `char *err` argument writes what went wrong there: a
 * buffer of MG_ERRMSG_LEN bytes (mg_err.h). */
#ifndef MG_SNAPSHOT_H
#define MG_SNAPSHOT_H

#include "mg_err.h"

#include <stddef.h>
#include <stdint.h>

#define MG_SNAP_VERSION      1
#define MG_SNAP_HEADER_BYTES 4096 /* the region's header: one page */
#define MG_SNAP_SLOT_HDR     64   /* each slot's header, before its payload */
#define MG_SNAP_SLOTS        2
#define MG_SNAP_PEER         2 /* the peer slots' indexes: MG_SNAP_PEER + 0, + 1 */
#define MG_SNAP_ALL_SLOTS    4

extern const unsigned char mg_snap_magic[8];      /* "\x89MGSNAP\n" */
extern const unsigned char mg_snap_slot_magic[8]; /* "MGSNSLOT" */

struct mg_snap {
    int fd;              /* the caller's; never closed here */
    unsigned char *base; /* the mapping */
    uint64_t map_bytes;
    uint64_t slot_bytes; /* a slot with its header, whole pages */
    uint64_t payload_cap;
    uint64_t peer_slot_bytes; /* the same for the peer slots (0: none) */
    uint64_t peer_cap;
    uint64_t generation;      /* the newest stamped so far */
    int writing;              /* the slot between begin and commit, or -1 */
    int newest;               /* the slot with the newest whole copy, or -1 */
    uint64_t peer_generation; /* the same for the peer slots */
    int peer_writing, peer_newest;
    int reset;   /* mg_snap_open found no region of this layout (and made one) */
    int dropped; /* and the one it found was a region, of another layout: its
                    slots (another model's, or a ZeRO-1 shard of another world
                    size) are gone */
    int stale;   /* mg_snap_open found a region of another layout and mapped it as
                    it is, to be read (a shard of another world size, after a node
                    loss); mg_snap_relayout makes it the one asked for */
    uint64_t want_cap, want_peer_cap;
};

/* What one slot's header says, and whether it checks out. */
struct mg_snap_slot {
    int valid;           /* header and payload check out */
    uint64_t generation; /* 0: never stamped, or a copy was interrupted */
    uint64_t step;
    uint64_t run; /* mg_run_id_hash of the run that wrote it */
    uint32_t world, rank;
    uint64_t payload_bytes;
    char why[160]; /* when not valid: what is wrong, for messages */
};

/* The checksum a slot's header records for its payload. */
uint64_t mg_snap_checksum(const void *data, size_t len);

/* Bytes a region takes for payloads of at most payload_cap bytes in its own
 * slots and peer_cap in its peer slots (0: none). */
uint64_t mg_snap_region_bytes(uint64_t payload_cap, uint64_t peer_cap);

/* Maps the region in fd for payloads of at most payload_cap bytes (and
 * peer_cap in the peer slots; 0: none), growing the file to
 * mg_snap_region_bytes() when it is smaller. A region of another layout that
 * checks out is mapped as it is, to be read (s->stale, until
 * mg_snap_relayout); anything else is started afresh (s->reset). -MG_ETOOBIG
 * with a message when the region asked for would be larger than limit bytes
 * (0: no limit). */
int mg_snap_open(struct mg_snap *s, int fd, uint64_t payload_cap, uint64_t peer_cap, uint64_t limit,
                 char *err);
/* A stale region made the one mg_snap_open was asked for: its slots are
 * dropped (s->reset, s->dropped). Nothing to do for a region that is not. */
int mg_snap_relayout(struct mg_snap *s, char *err);
/* Unmaps the region; what it holds stays with the file. */
void mg_snap_close(struct mg_snap *s);

/* Reads slot i's header (0, 1: own; MG_SNAP_PEER + 0, + 1: the peer's; a
 * slot the region lacks is "empty") and checks it and its payload (the hash). */
void mg_snap_inspect(const struct mg_snap *s, int i, struct mg_snap_slot *out);
/* Copies slot i's payload out (malloc'ed, *len bytes) and checks the copy's
 * hash against the header: what is used is what was checked. */
int mg_snap_copy_out(const struct mg_snap *s, int i, unsigned char **payload, uint64_t *len,
                     char *err);
/* Marks slot i empty (a state no longer on this run's path). */
void mg_snap_invalidate(struct mg_snap *s, int i);

/* Writing: begin marks the older slot as being written and returns where its
 * payload goes (payload_cap bytes); commit hashes len bytes of it and stamps
 * the header with the next generation. Until commit, the other slot is the
 * newest whole one. */
unsigned char *mg_snap_begin(struct mg_snap *s);
int mg_snap_commit(struct mg_snap *s, uint64_t step, uint64_t run, uint32_t world, uint32_t rank,
                   uint64_t len);
/* The same for the peer slots (peer_cap bytes; NULL when the region has none):
 * rank is the rank whose state the copy is. */
unsigned char *mg_snap_peer_begin(struct mg_snap *s);
int mg_snap_peer_commit(struct mg_snap *s, uint64_t step, uint64_t run, uint32_t world,
                        uint32_t rank, uint64_t len);

#endif
