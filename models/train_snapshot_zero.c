/* ZeRO-1 snapshots over nodes (docs/train.md, "Snapshots in memory"): each
 * rank keeps a copy of the optimizer shard of the same local rank on the
 * node before its own (a ring over nodes), so that a node's loss loses no
 * shard; after one, the survivors find the newest step of which every old
 * rank's shard survives, send each from where it lies, and put the whole
 * state together to reshard it as a checkpoint's. */
#include "snapshot/snapshot.h"
#include "rtutil.h"
#include "train_snapshot_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int snap_zero_by_shift(const struct run *r)
{
    const struct mg_comm *c = r->dist.d ? r->dist.d->comm : NULL;
    return c && !c->device_memory && mg_comm_has_shift(c);
}

/* ZeRO-1 over nodes: this rank's shard to the rank that keeps it, LOCAL_WORLD_SIZE
 * ranks on (the same local rank on the next node), in one shift over the
 * communicator, and snap_peer_src's shard straight into a peer slot, checked as
 * the own slots are. NCCL has no shift in mg: there every rank's shard goes to
 * every rank in one allgather, of which this rank keeps snap_peer_src's. */
int snap_zero_copy(struct run *r)
{
    struct mg_trainer *t = &r->trainer;
    struct mg_backend *be = r->model.be;
    struct mg_comm *c = r->dist.d->comm;
    uint64_t n = r->snap_shard;
    int shift = snap_zero_by_shift(r);
    unsigned char *mine = r->snap_all + (shift ? 0 : (size_t)n * (size_t)r->dist.rank);
    be->ops->download(be, mine, t->opt.state, (size_t)n);
    int rc = be->ops->sync(be);
    if (rc < 0) {
        fail("cannot copy the optimizer shard from the device: %s", mg_backend_errmsg(be));
        return rc;
    }
    /* a worker killed in the middle leaves the slot marked so, the other whole;
     * without a slot (a region not yet laid out anew) the exchange still takes
     * place, the others wait for it */
    unsigned char *slot = mg_snap_peer_begin(&r->snap), *into = slot;
    if (!into && !(into = malloc(n ? n : 1)))
        return -ENOMEM;
    if (t->step == r->snap_test_stop) {
        /* the test hook: stopped with the peer slot's copy under way and the
         * others inside the exchange, for a test to SIGKILL it (or its node) */
        fprintf(stderr,
                TRAIN_PROG ": test hook (MG_TEST_SNAPSHOT_STOP): stopped in the ZeRO-1 copy of "
                           "step %ld\n",
                t->step);
        raise(SIGSTOP);
    }
    int k = (r->dist.rank - r->snap_peer_src + r->dist.world) % r->dist.world;
    rc = shift ? mg_comm_shift(c, mine, into, (size_t)n, k, MG_COMM_DEFAULT_TIMEOUT)
               : mg_ddp_allgather(r->dist.ddp, mine, r->snap_all, (size_t)n);
    if (into != slot)
        free(into);
    if (rc < 0) {
        fail("cannot send the optimizer shard of step %ld to the next node: %s", t->step,
             shift ? mg_comm_errmsg(c) : mg_ddp_errmsg(r->dist.ddp));
        return rc;
    }
    if (!slot)
        return -EINVAL;
    if (!shift)
        memcpy(slot, r->snap_all + (size_t)n * (size_t)r->snap_peer_src, (size_t)n);
    return mg_snap_peer_commit(&r->snap, (uint64_t)t->step, t->cfg.run_id_hash,
                               (uint32_t)r->dist.world, (uint32_t)r->snap_peer_src, n);
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
uint64_t snap_zero_step(const struct offer *all, int world, int *src, int *src_slot, uint32_t *was,
                        uint32_t *lost, uint64_t *lost_step)
{
    uint64_t chosen = NO_STEP;
    int slot;
    *lost = UINT32_MAX;
    *lost_step = NO_STEP;
    for (int h = 0; h < world; h++)
        for (int k = 0; k < MG_SNAP_SLOTS; k++) {
            uint64_t s = all[h].any[k];
            uint32_t w = all[h].world[k], q = 0;
            if (!snap_newer(s, chosen) || w == 0 || w > (1u << 20) || seen_before(all, h, k))
                continue;
            while (q < w && holder_of(all, world, s, w, q, &slot) >= 0)
                q++;
            if (q == w) {
                chosen = s;
                *src = h;
                *src_slot = k;
                *was = w;
            } else if (snap_newer(s, *lost_step)) {
                *lost = q;
                *lost_step = s;
            }
        }
    return chosen;
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
int snap_zero_resume(struct run *r, struct offer *all, int src, int k, uint64_t step, uint32_t was,
                     int *resumed)
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
    rc = snap_exchange(r, &me, said ? said : all);
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
                    q, said[q].why, snap_fallback(r));
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
    rc = snap_resume_from_peer(r, all, src, k, step, full, from, resumed);
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
