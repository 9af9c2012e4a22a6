/* The snapshot region: its header, two slots stamped last, checks on the way
 * back (see snapshot.h; layout in docs/checkpoint-format.md). */
#include "snapshot.h"
#include "mg_err.h"
#include "rtutil.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

const unsigned char mg_snap_magic[8] = {0x89, 'M', 'G', 'S', 'N', 'A', 'P', '\n'};
const unsigned char mg_snap_slot_magic[8] = {'M', 'G', 'S', 'N', 'S', 'L', 'O', 'T'};

#define PAGE         4096u
#define FLAG_WRITING 1u /* stamped at begin: a copy is under way */

/* Slot header (little-endian): 0 magic[8]  8 generation u64  16 step u64  24 run u64
 * 32 payload bytes u64  40 world u32  44 rank u32  48 payload hash u64
 * 56 flags u32  60 CRC-32 of bytes 0..59. */

/* The payload's checksum (docs/checkpoint-format.md): eight 64-bit lanes of
 * Fletcher's two sums over 64-byte blocks, folded with the length and the
 * tail. Any changed word changes a, a moved one b. Four times as fast as
 * mg_hash64, which was most of the cost of a snapshot: additions vectorize,
 * the multiplications of a hash do not. */
uint64_t mg_snap_checksum(const void *data, size_t len)
{
    const unsigned char *p = data;
    uint64_t a[8] = {0}, b[8] = {0}, h = len;
    size_t i = 0;
    for (; i + 64 <= len; i += 64) {
        uint64_t w[8];
        memcpy(w, p + i, 64);
        for (int k = 0; k < 8; k++) {
            a[k] += w[k];
            b[k] += a[k];
        }
    }
    for (int k = 0; k < 8; k++) {
        h = (h ^ a[k]) * 0x100000001b3ULL;
        h = (h ^ b[k]) * 0x100000001b3ULL;
    }
    for (; i < len; i++)
        h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

static uint64_t slot_bytes_for(uint64_t payload_cap)
{
    return (MG_SNAP_SLOT_HDR + payload_cap + PAGE - 1) / PAGE * PAGE;
}

static uint64_t peer_slot_bytes_for(uint64_t peer_cap)
{
    return peer_cap ? slot_bytes_for(peer_cap) : 0;
}

uint64_t mg_snap_region_bytes(uint64_t payload_cap, uint64_t peer_cap)
{
    return MG_SNAP_HEADER_BYTES + MG_SNAP_SLOTS * slot_bytes_for(payload_cap) +
           MG_SNAP_SLOTS * peer_slot_bytes_for(peer_cap);
}

/* The own slots, then the peer slots. */
static unsigned char *slot_at(const struct mg_snap *s, int i)
{
    if (i < MG_SNAP_PEER)
        return s->base + MG_SNAP_HEADER_BYTES + (uint64_t)i * s->slot_bytes;
    return s->base + MG_SNAP_HEADER_BYTES + MG_SNAP_SLOTS * s->slot_bytes +
           (uint64_t)(i - MG_SNAP_PEER) * s->peer_slot_bytes;
}

static uint64_t slot_size(const struct mg_snap *s, int i)
{
    return i < MG_SNAP_PEER ? s->slot_bytes : s->peer_slot_bytes;
}

static int has_slot(const struct mg_snap *s, int i)
{
    return i >= 0 && i < MG_SNAP_ALL_SLOTS && slot_size(s, i) > 0;
}

/* Region header: 0 magic[8]  8 version u32  12 header bytes u32  16 slot bytes u64
 * 24 payload cap u64  32 peer slot bytes u64  40 peer cap u64  60 CRC-32 of 0..59
 * (a region without peer slots has zeros at 32..47: version 1's header). */
static void pack_region_header(unsigned char *h, uint64_t payload_cap, uint64_t peer_cap)
{
    memset(h, 0, 64);
    memcpy(h, mg_snap_magic, 8);
    mg_put_u32(h + 8, MG_SNAP_VERSION);
    mg_put_u32(h + 12, MG_SNAP_HEADER_BYTES);
    mg_put_u64(h + 16, slot_bytes_for(payload_cap));
    mg_put_u64(h + 24, payload_cap);
    mg_put_u64(h + 32, peer_slot_bytes_for(peer_cap));
    mg_put_u64(h + 40, peer_cap);
    mg_put_u32(h + 60, (uint32_t)crc32(0, h, 60));
}

/* The caps of a region header that checks out and describes a file of size
 * bytes; 0 when it does not. */
static int region_header_caps(const unsigned char *h, uint64_t size, uint64_t *cap,
                              uint64_t *peer_cap)
{
    unsigned char want[64];
    if (memcmp(h, mg_snap_magic, 8) != 0 || mg_get_u32(h + 60) != (uint32_t)crc32(0, h, 60))
        return 0;
    *cap = mg_get_u64(h + 24);
    *peer_cap = mg_get_u64(h + 40);
    if (*cap > size || *peer_cap > size)
        return 0;
    pack_region_header(want, *cap, *peer_cap);
    return memcmp(h, want, 64) == 0 && mg_snap_region_bytes(*cap, *peer_cap) == size;
}

static void set_layout(struct mg_snap *s, uint64_t cap, uint64_t peer_cap)
{
    s->payload_cap = cap;
    s->slot_bytes = slot_bytes_for(cap);
    s->peer_cap = peer_cap;
    s->peer_slot_bytes = peer_slot_bytes_for(peer_cap);
}

static int map_region(struct mg_snap *s, uint64_t bytes, char *err)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (p == MAP_FAILED) {
        int rc = -errno;
        return mg_seterr(err, MG_ERRMSG_LEN, rc,
                         "cannot map the snapshot memory (%" PRIu64 " bytes): %s", bytes,
                         mg_strerror(rc));
    }
    s->base = p;
    s->map_bytes = bytes;
    return 0;
}

/* The newest whole copy of each set of slots, and the generations to go on from. */
static void scan_slots(struct mg_snap *s)
{
    uint64_t newest_gen[2] = {0, 0};
    s->newest = s->peer_newest = -1;
    s->generation = s->peer_generation = 0;
    for (int i = 0; i < MG_SNAP_ALL_SLOTS; i++) {
        struct mg_snap_slot sl;
        int peer = i >= MG_SNAP_PEER;
        uint64_t *gen = peer ? &s->peer_generation : &s->generation;
        int *newest = peer ? &s->peer_newest : &s->newest;
        mg_snap_inspect(s, i, &sl);
        if (sl.generation > *gen)
            *gen = sl.generation; /* a new writer continues the count */
        if (sl.valid && (*newest < 0 || sl.generation > newest_gen[peer])) {
            *newest = i;
            newest_gen[peer] = sl.generation;
        }
    }
}

/* The layout asked for, in a file of that size, its slots emptied. */
static int make_fresh(struct mg_snap *s, char *err)
{
    uint64_t need = mg_snap_region_bytes(s->want_cap, s->want_peer_cap);
    unsigned char want[64];
    struct stat st;
    if (fstat(s->fd, &st) < 0) {
        int rc = -errno;
        return mg_seterr(err, MG_ERRMSG_LEN, rc, "cannot use the snapshot memory (fd %d): %s",
                         s->fd, mg_strerror(rc));
    }
    if ((uint64_t)st.st_size != need && ftruncate(s->fd, (off_t)need) < 0) {
        int rc = -errno;
        return mg_seterr(err, MG_ERRMSG_LEN, rc,
                         "cannot size the snapshot memory to %" PRIu64 " bytes: %s", need,
                         mg_strerror(rc));
    }
    set_layout(s, s->want_cap, s->want_peer_cap);
    int rc = map_region(s, need, err);
    if (rc < 0)
        return rc;
    pack_region_header(want, s->want_cap, s->want_peer_cap);
    if (memcmp(s->base, want, 64) != 0) {
        /* another layout's slots say nothing about this one's: start afresh */
        s->dropped |= memcmp(s->base, mg_snap_magic, sizeof(mg_snap_magic)) == 0;
        for (int i = 0; i < MG_SNAP_ALL_SLOTS; i++)
            if (has_slot(s, i))
                memset(slot_at(s, i), 0, MG_SNAP_SLOT_HDR);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        memcpy(s->base, want, 64);
        s->reset = 1;
    }
    s->stale = 0;
    scan_slots(s);
    return 0;
}

int mg_snap_open(struct mg_snap *s, int fd, uint64_t payload_cap, uint64_t peer_cap, uint64_t limit,
                 char *err)
{
    struct stat st;
    memset(s, 0, sizeof(*s));
    s->fd = fd;
    s->writing = s->peer_writing = -1;
    s->newest = s->peer_newest = -1;
    s->want_cap = payload_cap;
    s->want_peer_cap = peer_cap;
    set_layout(s, payload_cap, peer_cap);
    uint64_t need = mg_snap_region_bytes(payload_cap, peer_cap);
    if (limit && need > limit)
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_ETOOBIG,
                         "%s take %" PRIu64 " bytes of memory, more than the %" PRIu64 " allowed",
                         peer_cap ? "two copies of this rank's state and two of its peer's shard"
                                  : "two copies of this rank's state",
                         need, limit);
    if (fstat(fd, &st) < 0) {
        int rc = -errno;
        return mg_seterr(err, MG_ERRMSG_LEN, rc, "cannot use the snapshot memory (fd %d): %s", fd,
                         mg_strerror(rc));
    }
    /* lent to this worker alone: its children must not keep the memory alive */
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    uint64_t size = (uint64_t)st.st_size, cap = 0, pcap = 0;
    if (size >= MG_SNAP_HEADER_BYTES) {
        /* another layout: kept as it is when it is one, for the restart to
         * read. Its header says so, not the file's size: two layouts can
         * round up to the same number of pages. */
        unsigned char h[64];
        if (pread(fd, h, sizeof(h), 0) == (ssize_t)sizeof(h) &&
            region_header_caps(h, size, &cap, &pcap) && (cap != payload_cap || pcap != peer_cap)) {
            set_layout(s, cap, pcap);
            int rc = map_region(s, size, err);
            if (rc < 0)
                return rc;
            s->stale = 1;
            scan_slots(s);
            return 0;
        }
    }
    return make_fresh(s, err);
}

int mg_snap_relayout(struct mg_snap *s, char *err)
{
    if (!s->stale)
        return 0;
    mg_snap_close(s);
    s->writing = s->peer_writing = -1;
    s->dropped = 1;
    return make_fresh(s, err);
}

void mg_snap_close(struct mg_snap *s)
{
    if (s->base)
        munmap(s->base, s->map_bytes);
    s->base = NULL;
}

/* The header's fields, checked; the payload is not looked at. */
static int read_header(const struct mg_snap *s, int i, struct mg_snap_slot *out)
{
    unsigned char copy[MG_SNAP_SLOT_HDR];
    memset(out, 0, sizeof(*out));
    if (!has_slot(s, i)) {
        snprintf(out->why, sizeof(out->why), "empty");
        return -MG_EFORMAT;
    }
    memcpy(copy, slot_at(s, i), sizeof(copy));
    if (memcmp(copy, mg_snap_slot_magic, 8) != 0) {
        int blank = 1;
        for (size_t k = 0; k < sizeof(copy) && blank; k++)
            blank = copy[k] == 0;
        snprintf(out->why, sizeof(out->why), blank ? "empty" : "not a snapshot slot (bad magic)");
        return -MG_EFORMAT;
    }
    if (mg_get_u32(copy + 60) != (uint32_t)crc32(0, copy, 60)) {
        snprintf(out->why, sizeof(out->why), "header checksum mismatch");
        return -MG_ECRC;
    }
    out->generation = mg_get_u64(copy + 8);
    out->step = mg_get_u64(copy + 16);
    out->run = mg_get_u64(copy + 24);
    out->payload_bytes = mg_get_u64(copy + 32);
    out->world = mg_get_u32(copy + 40);
    out->rank = mg_get_u32(copy + 44);
    if (mg_get_u32(copy + 56) & FLAG_WRITING) {
        out->generation = 0;
        snprintf(out->why, sizeof(out->why),
                 "a copy was interrupted (the process stopped while "
                 "writing it)");
        return -MG_ETRUNC;
    }
    if (out->payload_bytes > slot_size(s, i) - MG_SNAP_SLOT_HDR) {
        snprintf(out->why, sizeof(out->why), "payload of %" PRIu64 " bytes is larger than its slot",
                 out->payload_bytes);
        return -MG_EFORMAT;
    }
    return 0;
}

static uint64_t payload_hash_of(const unsigned char *h)
{
    return mg_get_u64(h + 48);
}

void mg_snap_inspect(const struct mg_snap *s, int i, struct mg_snap_slot *out)
{
    if (read_header(s, i, out) < 0)
        return;
    const unsigned char *h = slot_at(s, i);
    if (mg_snap_checksum(h + MG_SNAP_SLOT_HDR, out->payload_bytes) != payload_hash_of(h)) {
        snprintf(out->why, sizeof(out->why), "payload checksum mismatch (step %" PRIu64 ")",
                 out->step);
        return;
    }
    out->valid = 1;
}

int mg_snap_copy_out(const struct mg_snap *s, int i, unsigned char **payload, uint64_t *len,
                     char *err)
{
    struct mg_snap_slot sl;
    *payload = NULL;
    int rc = read_header(s, i, &sl);
    if (rc < 0)
        return mg_seterr(err, MG_ERRMSG_LEN, rc, "slot %d: %s", i, sl.why);
    const unsigned char *h = slot_at(s, i);
    unsigned char *p = malloc(sl.payload_bytes ? sl.payload_bytes : 1);
    if (!p)
        return mg_seterr(err, MG_ERRMSG_LEN, -ENOMEM,
                         "out of memory for a snapshot of %" PRIu64 " bytes", sl.payload_bytes);
    memcpy(p, h + MG_SNAP_SLOT_HDR, sl.payload_bytes);
    if (mg_snap_checksum(p, sl.payload_bytes) != payload_hash_of(h)) {
        free(p);
        return mg_seterr(err, MG_ERRMSG_LEN, -MG_ECRC,
                         "slot %d: payload checksum mismatch (step %" PRIu64 ")", i, sl.step);
    }
    *payload = p;
    *len = sl.payload_bytes;
    return 0;
}

void mg_snap_invalidate(struct mg_snap *s, int i)
{
    if (!has_slot(s, i))
        return;
    if (s->newest == i)
        s->newest = -1;
    if (s->peer_newest == i)
        s->peer_newest = -1;
    memset(slot_at(s, i), 0, MG_SNAP_SLOT_HDR);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

/* Writing one set of slots (own: first 0, peer: first MG_SNAP_PEER). */
static unsigned char *begin_set(struct mg_snap *s, int first, int newest, int *writing)
{
    /* never the newest whole copy */
    int i = newest == first ? first + 1 : first;
    unsigned char *h = slot_at(s, i);
    unsigned char hdr[MG_SNAP_SLOT_HDR] = {0};
    memcpy(hdr, mg_snap_slot_magic, 8);
    mg_put_u32(hdr + 56, FLAG_WRITING);
    mg_put_u32(hdr + 60, (uint32_t)crc32(0, hdr, 60));
    memcpy(h, hdr, sizeof(hdr));
    /* the mark is in place before the payload changes */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    *writing = i;
    return h + MG_SNAP_SLOT_HDR;
}

static int commit_set(struct mg_snap *s, uint64_t *generation, int *writing, int *newest,
                      uint64_t step, uint64_t run, uint32_t world, uint32_t rank, uint64_t len)
{
    if (*writing < 0 || len > slot_size(s, *writing) - MG_SNAP_SLOT_HDR)
        return -EINVAL;
    unsigned char *h = slot_at(s, *writing);
    unsigned char hdr[MG_SNAP_SLOT_HDR] = {0};
    memcpy(hdr, mg_snap_slot_magic, 8);
    mg_put_u64(hdr + 8, *generation + 1);
    mg_put_u64(hdr + 16, step);
    mg_put_u64(hdr + 24, run);
    mg_put_u64(hdr + 32, len);
    mg_put_u32(hdr + 40, world);
    mg_put_u32(hdr + 44, rank);
    mg_put_u64(hdr + 48, mg_snap_checksum(h + MG_SNAP_SLOT_HDR, len));
    mg_put_u32(hdr + 60, (uint32_t)crc32(0, hdr, 60));
    /* the payload is whole before the header says so */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    memcpy(h, hdr, sizeof(hdr));
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    (*generation)++;
    *newest = *writing;
    *writing = -1;
    return 0;
}

unsigned char *mg_snap_begin(struct mg_snap *s)
{
    return begin_set(s, 0, s->newest, &s->writing);
}

int mg_snap_commit(struct mg_snap *s, uint64_t step, uint64_t run, uint32_t world, uint32_t rank,
                   uint64_t len)
{
    return commit_set(s, &s->generation, &s->writing, &s->newest, step, run, world, rank, len);
}

unsigned char *mg_snap_peer_begin(struct mg_snap *s)
{
    if (!s->peer_slot_bytes || s->stale)
        return NULL;
    return begin_set(s, MG_SNAP_PEER, s->peer_newest, &s->peer_writing);
}

int mg_snap_peer_commit(struct mg_snap *s, uint64_t step, uint64_t run, uint32_t world,
                        uint32_t rank, uint64_t len)
{
    return commit_set(s, &s->peer_generation, &s->peer_writing, &s->peer_newest, step, run, world,
                      rank, len);
}
