/* The snapshot region (runtime/snapshot/snapshot.h) in a real memfd: slots
 * written in turn with rising generations; a writer SIGKILLed in the middle
 * of a copy (a real child process) leaves the other slot whole and its own
 * marked as interrupted; a flipped payload byte or header byte is caught; a
 * region of another layout starts afresh; a region over the limit is
 * refused before anything is mapped; a reopened region (the next attempt)
 * continues the generations; and a trainer's snapshot payload parses back
 * into a checkpoint's sections (mg_ckpt_parse_payload).
 * timeout: 60 */
#include "checkpoint.h"
#include "snapshot/snapshot.h"
#include "tap.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define CAP 100000

static void fill(unsigned char *p, size_t n, int seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 31 + (size_t)seed);
}

static int write_one(struct mg_snap *s, uint64_t step, int seed, size_t n)
{
    unsigned char *p = mg_snap_begin(s);
    fill(p, n, seed);
    return mg_snap_commit(s, step, 77, 2, 1, n);
}

static int newest_valid(const struct mg_snap *s, uint64_t *step)
{
    int best = -1;
    uint64_t gen = 0;
    for (int i = 0; i < MG_SNAP_SLOTS; i++) {
        struct mg_snap_slot sl;
        mg_snap_inspect(s, i, &sl);
        if (sl.valid && sl.generation > gen) {
            gen = sl.generation;
            best = i;
            *step = sl.step;
        }
    }
    return best;
}

int main(void)
{
    char err[MG_ERRMSG_LEN];
    struct mg_snap s;
    struct mg_snap_slot a, b;
    uint64_t step = 0;
    int fd = memfd_create("test-snapshot", MFD_CLOEXEC);
    if (fd < 0)
        BAIL_OUT("memfd_create: %s", strerror(errno));

    /* ---- refused over the limit, before anything changes ---- */
    int rc = mg_snap_open(&s, fd, CAP, 0, 4096, err);
    is_int(rc, -MG_ETOOBIG, "a region over the limit is refused");
    ok(strstr(err, "more than the 4096 allowed") != NULL, "the refusal says the limit: %s", err);
    struct stat st;
    fstat(fd, &st);
    is_int((int)st.st_size, 0, "nothing was allocated for it");

    /* ---- a fresh region: both slots empty ---- */
    rc = mg_snap_open(&s, fd, CAP, 0, 0, err);
    is_int(rc, 0, "open a fresh region");
    ok(s.reset, "a fresh region is a reset one");
    ok(!s.dropped, "with nothing dropped: the memfd held none");
    fstat(fd, &st);
    is_int((int)st.st_size, (int)mg_snap_region_bytes(CAP, 0), "the region grew the memfd");
    mg_snap_inspect(&s, 0, &a);
    ok(!a.valid && strcmp(a.why, "empty") == 0, "slot 0 is empty (%s)", a.why);

    /* ---- slots in turn, generations rising ---- */
    is_int(write_one(&s, 10, 1, 5000), 0, "snapshot of step 10");
    is_int(write_one(&s, 11, 2, 5000), 0, "snapshot of step 11");
    is_int(write_one(&s, 12, 3, 6000), 0, "snapshot of step 12");
    mg_snap_inspect(&s, 0, &a);
    mg_snap_inspect(&s, 1, &b);
    ok(a.valid && b.valid, "both slots check out");
    ok(a.step == 12 && b.step == 11, "the older slot was overwritten (steps %llu, %llu)",
       (unsigned long long)a.step, (unsigned long long)b.step);
    ok(a.generation == b.generation + 1, "generations rise by one");
    ok(a.run == 77 && a.world == 2 && a.rank == 1 && a.payload_bytes == 6000,
       "the header records run, world size, rank and length");
    unsigned char *copy;
    uint64_t len;
    rc = mg_snap_copy_out(&s, 0, &copy, &len, err);
    unsigned char want[6000];
    fill(want, sizeof(want), 3);
    ok(rc == 0 && len == 6000 && memcmp(copy, want, 6000) == 0, "copied out whole");
    free(copy);

    /* ---- a writer killed in the middle of a copy ---- */
    pid_t pid = fork();
    if (pid == 0) {
        unsigned char *p = mg_snap_begin(&s);
        for (;;) /* overwrite until killed */
            fill(p, CAP, 9);
    }
    usleep(100000);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    mg_snap_close(&s);
    rc = mg_snap_open(&s, fd, CAP, 0, 0, err);
    ok(rc == 0 && !s.reset, "the next attempt reopens the same region");
    mg_snap_inspect(&s, 1, &b);
    ok(!b.valid && strstr(b.why, "interrupted"), "the slot being written says so: %s", b.why);
    is_int(newest_valid(&s, &step), 0, "the other slot is the newest whole one");
    ok(step == 12, "it holds step 12");
    is_int(write_one(&s, 13, 4, 5000), 0, "the next snapshot");
    mg_snap_inspect(&s, 1, &b);
    ok(b.valid && b.step == 13 && b.generation == a.generation + 1,
       "goes to the interrupted slot, with the next generation");

    /* ---- damage is caught ---- */
    unsigned char *slot1 = s.base + MG_SNAP_HEADER_BYTES + s.slot_bytes;
    slot1[MG_SNAP_SLOT_HDR + 4321] ^= 0x10;
    mg_snap_inspect(&s, 1, &b);
    ok(!b.valid && strstr(b.why, "payload checksum mismatch"), "a flipped payload bit: %s", b.why);
    rc = mg_snap_copy_out(&s, 1, &copy, &len, err);
    is_int(rc, -MG_ECRC, "and its copy is refused");
    slot1[MG_SNAP_SLOT_HDR + 4321] ^= 0x10;
    slot1[20] ^= 1; /* the step */
    mg_snap_inspect(&s, 1, &b);
    ok(!b.valid && strstr(b.why, "header checksum mismatch"), "a flipped header bit: %s", b.why);
    slot1[20] ^= 1;
    mg_snap_inspect(&s, 1, &b);
    ok(b.valid, "restored, it checks out again");
    mg_snap_invalidate(&s, 1);
    mg_snap_inspect(&s, 1, &b);
    ok(!b.valid && strcmp(b.why, "empty") == 0, "an invalidated slot is empty");
    ok(mg_snap_checksum("abc", 3) != mg_snap_checksum("acb", 3) &&
           mg_snap_checksum(want, 128) != mg_snap_checksum(want + 64, 128),
       "the checksum tells moved bytes apart");
    mg_snap_close(&s);

    /* ---- another layout: kept to be read, then started afresh ---- */
    rc = mg_snap_open(&s, fd, CAP * 3, 0, 0, err);
    ok(rc == 0 && s.stale && !s.reset, "a region for a larger payload maps the old one as it is");
    mg_snap_inspect(&s, 0, &a);
    ok(a.valid && a.step == 12, "whose slots can still be read (step %llu)",
       (unsigned long long)a.step);
    ok(mg_snap_peer_begin(&s) == NULL, "and never written");
    rc = mg_snap_relayout(&s, err);
    ok(rc == 0 && s.reset && !s.stale, "made the layout asked for");
    ok(s.dropped, "and says that it dropped the old one's slots (a restart tells why)");
    mg_snap_inspect(&s, 0, &a);
    ok(!a.valid, "with nothing of the old one");
    fstat(fd, &st);
    is_int((int)st.st_size, (int)mg_snap_region_bytes(CAP * 3, 0), "the memfd has its size");
    mg_snap_close(&s);

    /* ---- peer slots: a copy of another rank's state, checked the same way ---- */
    rc = mg_snap_open(&s, fd, CAP, CAP, mg_snap_region_bytes(CAP, CAP) - 1, err);
    is_int(rc, -MG_ETOOBIG, "own and peer slots over the limit are refused");
    ok(strstr(err, "two of its peer's shard") != NULL, "saying what takes the room: %s", err);
    rc = mg_snap_open(&s, fd, CAP, CAP / 2, 0, err);
    ok(rc == 0 && s.stale, "a region with peer slots is another layout");
    ok(mg_snap_relayout(&s, err) == 0 && s.peer_slot_bytes > 0, "laid out with peer slots");
    mg_snap_inspect(&s, MG_SNAP_PEER, &a);
    ok(!a.valid && strcmp(a.why, "empty") == 0, "the peer slots start empty");
    is_int(write_one(&s, 20, 5, 5000), 0, "an own snapshot");
    for (int k = 0; k < 3; k++) {
        unsigned char *p = mg_snap_peer_begin(&s);
        fill(p, 3000, 40 + k);
        is_int(mg_snap_peer_commit(&s, 20 + (uint64_t)k, 77, 4, 2, 3000), 0, "peer copy %d", k);
    }
    is_int(mg_snap_peer_commit(&s, 30, 77, 4, 2, CAP), -EINVAL, "a commit without a begin fails");
    mg_snap_inspect(&s, MG_SNAP_PEER, &a);
    mg_snap_inspect(&s, MG_SNAP_PEER + 1, &b);
    ok(a.valid && b.valid && a.step == 22 && b.step == 21 && a.rank == 2 && a.world == 4,
       "the peer slots in turn, with their source rank and world size");
    ok(a.generation == b.generation + 1, "with their own generations");
    mg_snap_inspect(&s, 0, &a);
    ok(a.valid && a.step == 20, "the own slots untouched");
    mg_snap_close(&s);
    rc = mg_snap_open(&s, fd, CAP, CAP / 2, 0, err);
    ok(rc == 0 && !s.stale && !s.reset && s.peer_newest == MG_SNAP_PEER,
       "reopened: the newest peer copy found");
    unsigned char *ps = s.base + MG_SNAP_HEADER_BYTES + 2 * s.slot_bytes;
    ps[MG_SNAP_SLOT_HDR + 7] ^= 0x40;
    mg_snap_inspect(&s, MG_SNAP_PEER, &a);
    ok(!a.valid && strstr(a.why, "payload checksum mismatch"), "a damaged peer copy: %s", a.why);
    mg_snap_close(&s);
    /* Another layout of the same size (the slots round up to whole pages,
     * as a ZeRO-1 shard at another world size may): its header tells. */
    is_int((int)mg_snap_region_bytes(CAP - 8, CAP / 2 + 8), (int)mg_snap_region_bytes(CAP, CAP / 2),
           "(two layouts of one size)");
    rc = mg_snap_open(&s, fd, CAP - 8, CAP / 2 + 8, 0, err);
    ok(rc == 0 && s.stale && !s.reset, "another layout of the same size is kept to be read");
    mg_snap_inspect(&s, 0, &a);
    ok(a.valid && a.step == 20 && s.peer_newest == MG_SNAP_PEER + 1,
       "its own and peer slots as they were (step %llu)", (unsigned long long)a.step);
    mg_snap_close(&s);

    /* ---- payloads: sections in memory, framing checked ---- */
    struct mg_ckpt_section secs[2] = {{1, 0, 5, "hello"}, {3, 0, 8, NULL}};
    uint64_t off[2], plen;
    unsigned char buf[128];
    is_int(mg_ckpt_sections_pack(buf, 16, secs, 2, off, &plen), -MG_ETOOBIG,
           "packing over the capacity is refused");
    rc = mg_ckpt_sections_pack(buf, sizeof(buf), secs, 2, off, &plen);
    ok(rc == 0 && plen == mg_ckpt_sections_bytes(secs, 2) && plen == 16 + 5 + 16 + 8 + 16,
       "packed: %llu bytes", (unsigned long long)plen);
    memcpy(buf + off[1], "12345678", 8); /* the room left for the caller */
    struct mg_ckpt_file f;
    unsigned char *raw = malloc(plen);
    memcpy(raw, buf, plen);
    rc = mg_ckpt_parse_payload(raw, plen, "test", &f, err);
    const struct mg_ckpt_section *got = rc == 0 ? mg_ckpt_find(&f, 3, 0) : NULL;
    ok(got && got->len == 8 && memcmp(got->data, "12345678", 8) == 0, "parsed back");
    mg_ckpt_file_release(&f);
    raw = malloc(plen - 3);
    memcpy(raw, buf, plen - 3);
    rc = mg_ckpt_parse_payload(raw, plen - 3, "test", &f, err);
    is_int(rc, -MG_EFORMAT, "a cut payload is refused: %s", err);
    close(fd);
    return done_testing();
}
