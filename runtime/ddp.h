/* Data parallelism over a communicator: the trainer's hooks (trainer.h) for
 * DDP, as PyTorch's DistributedDataParallel does it.
 *
 * - At start, every rank checks that all ranks built the same model (tensor
 *   names and shapes), takes rank 0's parameters, and checks that the hashes
 *   of the parameters now agree.
 * - Gradients are averaged in buckets: slices of the flat gradient buffer, cut
 *   from its end (reverse layer order, the order backward finishes them) at
 *   layer boundaries, at most bucket_cap bytes each (PyTorch's bucket_cap_mb,
 *   default 25 MiB), the first one smaller (first_bucket, default 1 MiB). On
 *   the CPU every cut is moved up to a multiple of 16 x world floats and the
 *   first bucket runs on past the last parameter to one (into padding that
 *   stays zero), so that every bucket splits into world chunks of whole cache
 *   lines: an allreduce and a reduce-scatter of it then cut it alike and sum
 *   alike, in every layout. A
 *   communication thread averages each bucket as soon as backward has
 *   finished its layers, while backward goes on with the earlier layers; the
 *   optimizer waits for the last one. With gradient accumulation only the last
 *   micro-batch communicates (the trainer calls grad_ready only then).
 * - Evaluation and loss sums are reduced in double precision, in rank order,
 *   so every rank reports the same figures.
 * - mg_ddp_check_replicas compares a hash of the parameters across ranks.
 * - The model's gradient buffer becomes the communicator's registered memory
 *   (mg_comm_mem_alloc) at the start, once every rank is known to have built
 *   the same model, so allreduces on one host are zero-copy. The model's own
 *   buffer is freed meanwhile (it would only take room); mg_ddp_release gives
 *   the model a buffer of its backend's memory back, with the gradients (or,
 *   out of memory, none): release DDP before the model.
 * - ZeRO-1 (opts.zero; on a device, with a device communicator only): each
 *   bucket is reduce-scattered (averaged) instead of allreduced, each rank
 *   updates its chunk of the bucket (its shard) with the optimizer, whose
 *   state it keeps for its shard only, and the chunks are allgathered back
 *   into every rank's parameters: all of it on the communication thread,
 *   bucket by bucket, while backward goes on
 *   with the earlier layers (whose backward does not read these weights).
 *   The sums, the update and so the bits are those of plain DDP, so a run can
 *   switch between the two at a resume. The parameters move to registered
 *   memory too (the padding needs room).
 *   Checkpoints get the whole optimizer state through the gather_state hook.
 * - On a GPU with NCCL, a bucket's allreduce waits on the device for an
 *   event backward recorded after queuing the bucket's layers, not for the
 *   host (overlap as in PyTorch's DDP), each queued behind the one before
 *   without a host wait, all waited for once before the optimizer; the first
 *   step sends its buckets only after backward (CUDA's lazy module loading
 *   must not happen behind spinning NCCL kernels); a GPU model with a CPU communicator
 *   (MG_COMM=cpu) averages through host memory after backward. Same hooks,
 *   same checks (ddp.c says how).
 *
 * Errors are negative codes; the message (naming the failed collective and
 * rank, or the mismatch) is in mg_ddp_errmsg(). */
#ifndef MG_DDP_H
#define MG_DDP_H

#include "comm.h"
#include "model.h"
#include "trainer.h"

#include <stddef.h>
#include <stdint.h>

#define MG_DDP_DEFAULT_BUCKET_CAP   (25u << 20)
#define MG_DDP_DEFAULT_FIRST_BUCKET (1u << 20)
#define MG_DDP_MAX_BUCKETS          MG_MAX_LAYERS

struct mg_ddp_opts {
    size_t bucket_cap;   /* bytes; 0 = MG_DDP_DEFAULT_BUCKET_CAP */
    size_t first_bucket; /* bytes; 0 = min(MG_DDP_DEFAULT_FIRST_BUCKET, bucket_cap) */
    int no_thread;       /* average every bucket in reduce_grads, on the caller's thread */
    int timeout_ms;      /* per collective; 0 = the communicator's default */
    int zero;            /* 1: ZeRO stage 1 (a sharded optimizer); on a device, NCCL only */
    int force_thread;    /* tests: the communication thread at world size 1 too */
};

struct mg_ddp_bucket {
    size_t offset, count; /* elements of grad_buf */
};

struct mg_ddp;

int mg_ddp_create(struct mg_ddp **out, struct mg_comm *comm, struct mg_model *m,
                  const struct mg_ddp_opts *opts, char *err, size_t errlen);
void mg_ddp_release(struct mg_ddp *d);

/* The hooks to give mg_trainer_init. */
void mg_ddp_hooks(struct mg_ddp *d, struct mg_train_hooks *hooks);

/* The bucket layout, in the order buckets are sent. */
int mg_ddp_buckets(const struct mg_ddp *d, const struct mg_ddp_bucket **buckets);
/* Floats the buckets cover: nparams rounded up to the alignment (above). */
size_t mg_ddp_padded_len(const struct mg_ddp *d);

/* ZeRO-1: this rank's shard, as runs of parameters (offset, count in the flat
 * buffer; padding past nparams left out), in the order their state is kept.
 * Returns the number of runs (one per bucket, some maybe empty); *len gets
 * the shard's length with its padding (the optimizer state per vector). */
int mg_ddp_shard(const struct mg_ddp *d, const struct mg_ddp_bucket **runs, size_t *len);
/* ZeRO-1 at any world size (a snapshot's shards from before a node loss,
 * read by a group of another size, maybe of one process without DDP): the
 * padded length of a shard there for model m under options o (NULL: the
 * defaults; the bucket caps decide the layout), and rank's shard of nvec
 * vectors of shard_len floats written to where it belongs in full (nvec
 * vectors of the model's nparams floats), as a file's whole state is laid
 * out. -MG_EFORMAT when shard_len is not that world size's. */
size_t mg_ddp_shard_len_at(const struct mg_model *m, const struct mg_ddp_opts *o, int world);
int mg_ddp_unshard(const struct mg_model *m, const struct mg_ddp_opts *o, int world, int rank,
                   const float *shard, size_t shard_len, float *full, int nvec);

/* Every rank must hold bit-identical parameters: -MG_EDIVERGED otherwise,
 * naming the first rank that differs from rank 0. */
int mg_ddp_check_replicas(struct mg_ddp *d, long step);

/* Every rank's state for a checkpoint: all[r] receives rank r's. */
int mg_ddp_gather_rank_states(struct mg_ddp *d, const struct mg_rank_state *mine,
                              struct mg_rank_state *all);

/* After a resume: every rank must have loaded the same step, data position,
 * parameters and optimizer state (-MG_ECONFIG otherwise, naming the rank). */
int mg_ddp_check_resume(struct mg_ddp *d, const struct mg_trainer *t);

int mg_ddp_barrier(struct mg_ddp *d);

/* Every rank's len bytes of host memory land at recv + rank * len: the
 * program's own small exchanges (step times), through device memory when the
 * communicator takes only that (NCCL), as DDP's own are. */
int mg_ddp_allgather(struct mg_ddp *d, const void *send, void *recv, size_t len);

/* root's len bytes of host memory to every rank's buf (the program's own
 * transfers: a snapshot a restarted rank lacks), staged through device
 * memory for a communicator that takes only that. */
int mg_ddp_broadcast_bytes(struct mg_ddp *d, void *buf, size_t len, int root);

const char *mg_ddp_errmsg(const struct mg_ddp *d);

#endif
