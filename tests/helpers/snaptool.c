/* Looks at and damages a snapshot region from outside (the tests of
 * in-memory snapshots, docs/checkpoint-format.md): PATH is the region, for
 * example the agent's memfd as /proc/<mglaunch pid>/fd/<n>.
 *
 *   snaptool list PATH            a line per slot: slot, generation, step,
 *                                 valid (1/0) and, when not, why
 *   snaptool corrupt PATH STEP    flips a byte in the payload of the slot
 *                                 that holds STEP (exit 1 when none does)
 *   snaptool corrupt-peer PATH    flips a byte in the payload of every peer
 *                                 slot that checks out (exit 1: none does)
 *
 * It reads the layout from the region's own header, so opening it never
 * starts the region afresh. */
#include "rtutil.h"
#include "snapshot/snapshot.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    char err[MG_ERRMSG_LEN];
    unsigned char hdr[64];
    struct mg_snap s;
    if (argc < 3 || (strcmp(argv[1], "corrupt") == 0 && argc < 4)) {
        fprintf(stderr, "usage: snaptool list PATH | corrupt PATH STEP | corrupt-peer PATH\n");
        return 2;
    }
    int fd = open(argv[2], O_RDWR | O_CLOEXEC);
    if (fd < 0 || pread(fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr) ||
        memcmp(hdr, mg_snap_magic, 8) != 0) {
        fprintf(stderr, "snaptool: '%s' is not a snapshot region\n", argv[2]);
        return 1;
    }
    if (mg_snap_open(&s, fd, mg_get_u64(hdr + 24), mg_get_u64(hdr + 40), 0, err) < 0 || s.reset) {
        fprintf(stderr, "snaptool: '%s': %s\n", argv[2], s.reset ? "unknown layout" : err);
        return 1;
    }
    int rc = 1;
    int peer_cmd = strcmp(argv[1], "corrupt-peer") == 0;
    for (int i = 0; i < MG_SNAP_ALL_SLOTS; i++) {
        struct mg_snap_slot sl;
        int peer = i >= MG_SNAP_PEER;
        if (peer && !s.peer_slot_bytes)
            break;
        uint64_t at =
            MG_SNAP_HEADER_BYTES +
            (peer ? MG_SNAP_SLOTS * s.slot_bytes + (uint64_t)(i - MG_SNAP_PEER) * s.peer_slot_bytes
                  : (uint64_t)i * s.slot_bytes);
        mg_snap_inspect(&s, i, &sl);
        if (peer_cmd) {
            if (peer && sl.valid) {
                s.base[at + MG_SNAP_SLOT_HDR + 100] ^= 1;
                rc = 0;
            }
        } else if (strcmp(argv[1], "list") == 0) {
            printf("slot %d generation %" PRIu64 " step %" PRIu64 " valid %d%s%s\n", i,
                   sl.generation, sl.step, sl.valid, sl.valid ? "" : " why ",
                   sl.valid ? "" : sl.why);
            rc = 0;
        } else if (!peer && sl.valid && sl.step == strtoull(argv[3], NULL, 10)) {
            s.base[at + MG_SNAP_SLOT_HDR + 100] ^= 1;
            rc = 0;
        }
    }
    mg_snap_close(&s);
    close(fd);
    return rc;
}
