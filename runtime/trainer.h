/* The training loop's building blocks, shaped for data parallelism: the
 * steps and evaluation (trainer.c), and what a checkpoint holds and how a run
 * resumes from one (trainer_ckpt.c).
 *
 * One optimizer step (mg_trainer_step) is:
 *   for each of accum_steps micro-batches: gather the batch this rank's
 *     sampler gives, forward, loss, backward with dlogits scaled by
 *     1 / (micro-batch size * accum_steps) (PyTorch's loss / accum); the first
 *     micro-batch overwrites grad_buf, later ones add to it (no zeroing pass);
 *     on the LAST micro-batch only, hooks.grad_ready is called as each layer's
 *     gradients become final (reverse layer order, see model.h);
 *   hooks.reduce_grads (e.g. wait for DDP's bucket allreduces; must leave the
 *     averaged gradients in grad_buf);
 *   optimizer update at the schedule's learning rate.
 * With world 1, no hooks and no accumulation, each layer is updated as soon as
 * its gradients are final (same bits, better cache use). On a device, while a
 * micro-batch computes, the next one is gathered and uploaded (struct
 * mg_batch_slot).
 *
 * Data position: micro-batches flow through epochs in order; epoch e uses the
 * sampler's permutation for seed + e, batch b of it covers indices
 * [b * batch, (b + 1) * batch) of this rank's shard (the last one may be
 * short). (epoch, epoch_start, batch_in_epoch) is saved in checkpoints, so a
 * resumed run continues with exactly the next batch.
 *
 * Resharding: a checkpoint written with another world size is resumed from
 * the same parameters, optimizer state, step and epoch, and from the same
 * position in the epoch's order (sampler.h): the checkpoint's ranks had taken
 * positions [0, p) of the epoch, p = epoch_start + taken * old world, so the
 * new ranks share the positions from p on in a pass that begins at p (none
 * left: the next epoch). Each rank's dropout stream is then its own seed's
 * (seed, rank), continued from the furthest offset any old rank had reached,
 * so no number is used twice. Bit-identity holds only for the same world
 * size; a resharded run is a different (valid) run.
 *
 * Checkpoint content (sections of checkpoint.h, layouts in
 * docs/checkpoint-format.md): META, TENSORS, PARAMS, OPTIM, one RANK
 * section per rank (its dropout generator) and CONFIG (the run's id and
 * configuration, which a resume compares with its own). Restoring all of it makes a
 * resumed run bit-identical to one that never stopped. A sharded optimizer
 * (ZeRO-1) saves its whole state, gathered, in the same layout, and takes its
 * shard of one on load: the files are the same with and without it.
 *
 * A function with a `char *err` argument writes what went wrong there: a
 * buffer of MG_ERRMSG_LEN bytes (mg_err.h). */
#ifndef MG_TRAINER_H
#define MG_TRAINER_H

#include "checkpoint.h"
#include "data.h"
#include "mg_err.h"
#include "model.h"
#include "optim.h"
#include "sampler.h"

#include <stdint.h>

struct mg_train_hooks {
    void *ctx;
    /* gradients [offset, offset + count) of grad_buf are final (last micro-batch) */
    int (*grad_ready)(void *ctx, float *grad_buf, size_t offset, size_t count);
    /* after the last backward, before the update: average grad_buf across ranks */
    int (*reduce_grads)(void *ctx, float *grad_buf, size_t count);
    /* at mg_trainer_start(): make every rank hold rank 0's parameters */
    int (*broadcast_params)(void *ctx, float *param_buf, size_t count);
    /* sum n doubles across ranks in place (evaluation and loss reporting) */
    int (*reduce_sums)(void *ctx, double *sums, int n);
    /* ZeRO-1, a sharded optimizer (ddp.h), when begin_update is set:
     * shard_len  parameters of this rank's shard: the optimizer keeps state
     *            for these only;
     * begin_update  at the start of every step, with the optimizer and the
     *            step's learning rate; reduce_grads then returns with the
     *            update applied to every rank's parameters (each rank updates
     *            its shard, the shards are gathered), and the trainer only
     *            counts the step;
     * gather_state  the whole optimizer state (nvec vectors of the model's
     *            nparams floats, the checkpoint's layout) from every rank's
     *            shard, on every rank: a collective; full has room for nvec x
     *            shard_len x world floats (the padded length);
     * shard_state  this rank's shard of a whole state (local). */
    size_t shard_len;
    int (*begin_update)(void *ctx, struct mg_optim *opt, double lr);
    int (*gather_state)(void *ctx, const float *shard, float *full, int nvec);
    void (*shard_state)(void *ctx, const float *full, float *shard, int nvec);
};

struct mg_train_config {
    int batch_size;  /* per rank, per micro-batch; <= the model's max_batch */
    int accum_steps; /* micro-batches per optimizer step, >= 1 */
    long total_steps;
    uint64_t seed; /* sampler shuffle (seed + epoch) and dropout */
    int rank, world;
    int drop_last;        /* training sampler: DistributedSampler's drop_last */
    long global_batch;    /* --global-batch-size (batch_size = ceil(G / world)), 0: none */
    uint64_t run_id_hash; /* mg_run_id_hash(run_id) */
    const char *run_id;   /* the run's identity (docs/train.md, "Checkpoints belong to a run") */
    /* "key value" lines that describe the run (model, data, optimizer, lr
     * schedule, batch), stored in checkpoints' CONFIG section; at most
     * MG_RUN_CONFIG_MAX bytes. NULL: none. */
    const char *run_config;
    struct mg_optim_config optim;
    struct mg_schedule sched;
};

/* One rank's state that is not shared by all ranks. */
struct mg_rank_state {
    uint32_t rank;
    struct mg_rng_state dropout;
};
#define MG_RANK_STATE_BYTES 32
#define MG_RUN_CONFIG_MAX   4096

/* What a step knows on the host at once. Its loss and accuracy stay on the
 * device until mg_trainer_sums reads them. */
struct mg_step_stats {
    long samples; /* this rank's, in the step */
    double lr;
};

/* The loss figures since the last mg_trainer_sums(reset): the same bits the
 * host got when it downloaded each micro-batch's losses and added them
 * (sample by sample, then micro-batches, then steps, each in order). */
struct mg_train_sums {
    double loss_sum; /* over this rank's samples */
    long correct;
    long samples;
    long steps;
    long bad_step; /* the first step (1-based, of the run) whose loss is NaN or infinite; 0: none */
    double bad_loss; /* that step's loss sum */
};

/* What a checkpoint held and what mg_trainer_load made of it: for the
 * program's messages (a resharded resume warns about what changed). */
struct mg_resume_info {
    int loaded;
    int resharded;   /* written with another world size */
    int world;       /* the checkpoint's run: world size, batch per rank, */
    int batch_size;  /* accumulation, --global-batch-size (0: none), */
    int accum_steps; /* base learning rate (after --scale-lr) */
    long global_batch;
    double lr;
    uint64_t run_id_hash;
    /* What the checkpoint's CONFIG (or, for a file without one, META's
     * informational fields) says differently from cfg.run_config, as
     * "key A (this run: B), ..."; "" when nothing. */
    char config_diff[MG_ERRMSG_LEN];
    int has_config; /* the file has CONFIG: config_diff compared the whole job */
    char run_id[MG_CKPT_RUN_ID_MAX + 1]; /* its CONFIG's run_id: the run that wrote it ("") */
    long epoch;                          /* 0-based epoch the run goes on with */
    long position;                       /* positions of that epoch's order already taken */
    long left;           /* samples of that epoch not taken yet (n - position, or 0) */
    long per_rank;       /* samples each rank takes in the rest of the pass */
    uint64_t state_hash; /* mg_hash64 of the whole optimizer state it held */
};

struct mg_eval_sums {
    double loss_sum;
    long correct;
    long count;
};

/* Training batches are double-buffered: on a backend with a copy stream,
 * while micro-batch k computes, k + 1 is gathered into the other slot's
 * page-locked host buffer and uploaded on that stream (upload_async); the
 * device waits for it (upload_wait) only when k + 1 starts. The copy into a
 * slot waits on the device for the event recorded after the last compute
 * that read it (upload_after), so no step needs to wait for the GPU before
 * the next one overwrites a batch. (The CPU gathers
 * each batch when it starts.) Slot 0's device buffers are the
 * model's input and labels, slot 1's its own; the model reads whichever
 * m->input and m->labels point to. A slot knows which micro-batch it holds
 * (epoch, start of the pass, batch), so anything that moves the position (a
 * resume) simply finds no match and uploads then. */
struct mg_batch_slot {
    float *x_pin; /* page-locked: [max_batch * sample] floats, then the labels */
    int32_t *y_pin;
    float *x_dev; /* device */
    int32_t *y_dev;
    uint64_t ticket;          /* of its last upload: the pinned buffer is free once done */
    void *free_ev;            /* recorded after the last compute that read its device
                                 buffers: the next upload into them waits for it */
    long epoch, start, batch; /* the micro-batch it holds; batch < 0: none */
    int n;
};

struct mg_trainer {
    struct mg_train_config cfg;
    struct mg_model *model;
    struct mg_optim opt;
    const struct mg_dataset *train;
    const struct mg_dataset *test;
    struct mg_sampler sampler;
    struct mg_sampler eval_sampler;
    struct mg_train_hooks hooks;
    long step;              /* optimizer steps done */
    long epoch;             /* epoch of the last micro-batch taken */
    long epoch_start;       /* position in its order where this pass over `epoch` began */
    long batch_in_epoch;    /* micro-batches of this pass taken */
    long pass_batches;      /* micro-batches in this pass (batches_per_epoch from position 0) */
    long batches_per_epoch; /* micro-batches in a whole epoch */
    uint64_t samples_seen;  /* by this rank (informational after a reshard) */
    struct mg_resume_info resumed; /* what the last mg_trainer_load found */
    struct mg_batch_slot slot[2];  /* the micro-batch computing (cur) and the next */
    int cur;
    double *acc; /* device: the loss accumulators (backend.h), training's then evaluation's */
    long sum_samples, sum_steps; /* since the last mg_trainer_sums(reset) */
    long readbacks;              /* mg_trainer_sums calls: the step loop's only waits */
    float *x_host;               /* [max_batch * sample], evaluation's batches */
    int32_t *y_host;
    float *host_state; /* [nparams + the whole optimizer state] for checkpoints; a
                          sharded optimizer's: [nparams] */
    float *gathered;   /* ZeRO: the whole optimizer state gathered for this step's
                          checkpoint (freed by the save, or the next step) */
};

/* ---- steps and evaluation (trainer.c) ------------------------------------------- */

/* Optimizer steps that E epochs take for this configuration. */
long mg_steps_for_epochs(long epochs, int dataset_n, int world, int drop_last, int batch,
                         int accum);
/* The same from the trainer's current position (after a resume): the step at
 * which `epochs` epochs are complete. Equals mg_steps_for_epochs for a run
 * that never changed world size; never less than the current step. */
long mg_trainer_steps_for_epochs(const struct mg_trainer *t, long epochs);

/* Sets up the optimizer and samplers for a model whose parameters are already
 * initialized (mg_model_init_params). test may be NULL. hooks may be NULL. */
int mg_trainer_init(struct mg_trainer *t, struct mg_model *m, const struct mg_dataset *train,
                    const struct mg_dataset *test, const struct mg_train_config *cfg,
                    const struct mg_train_hooks *hooks, char *err);
void mg_trainer_release(struct mg_trainer *t);

/* Call once before the first step (after any resume): broadcasts parameters. */
int mg_trainer_start(struct mg_trainer *t);

/* One optimizer step, queued: on a device nothing here waits for the GPU
 * (the loss stays on the device; a batch slot is reused after an event of the
 * compute that read it; errors already seen are returned, later ones at the
 * next read). */
int mg_trainer_step(struct mg_trainer *t, struct mg_step_stats *st);

/* The loss figures of the steps since the last reset (one download: on a
 * device, the wait for the queued steps); reset != 0 starts new sums. Reading
 * without a reset changes nothing, so a run that reads more often (every step
 * on the CPU, where it costs nothing) reports the same bits. */
int mg_trainer_sums(struct mg_trainer *t, struct mg_train_sums *out, int reset);

/* Whole test set, sharded across ranks without padding; sums reduced with
 * hooks.reduce_sums when set, so every rank gets the global figures. The
 * batches' losses add up on the device, read once at the end. */
int mg_trainer_evaluate(struct mg_trainer *t, struct mg_eval_sums *out);

/* ---- checkpoint content and resume (trainer_ckpt.c) ----------------------------- */

/* Floats of the whole optimizer state: what a checkpoint holds (with ZeRO,
 * more than this rank keeps). */
size_t mg_trainer_state_count(const struct mg_trainer *t);
/* Every rank, before rank 0's mg_trainer_save, when the optimizer is sharded
 * (ZeRO): gathers the whole optimizer state (a collective) into a buffer that
 * lives until the save (or the next step: a shard stays a shard between
 * checkpoints). Does nothing otherwise. */
int mg_trainer_gather_state(struct mg_trainer *t);

/* The hash checkpoints record for a launcher's run id (TORCHELASTIC_RUN_ID):
 * 0 for NULL, "" and "none" (no job identity). */
uint64_t mg_run_id_hash(const char *run_id);

/* Pure function of the trainer state: what this rank puts in its RANK section. */
void mg_trainer_rank_state(const struct mg_trainer *t, struct mg_rank_state *out);
void mg_rank_state_pack(const struct mg_rank_state *s, unsigned char out[MG_RANK_STATE_BYTES]);
int mg_rank_state_unpack(const unsigned char *in, size_t len, struct mg_rank_state *out);

/* Writes the checkpoint for the current step into dir (no completion marker:
 * call mg_ckpt_mark_complete() once every rank's part is durable). ranks /
 * nranks are the RANK sections to store; NULL stores this rank's own. */
int mg_trainer_save(struct mg_trainer *t, const char *dir, const struct mg_rank_state *ranks,
                    int nranks, char *err);
/* Restores everything from one checkpoint file, resharding it when it was
 * written with another world size (above; t->resumed says what changed).
 * -MG_ESHAPE when the model's tensors differ; -MG_ECONFIG when accumulation,
 * drop_last, seed, dataset size or optimizer differ, or the batch per rank
 * differs where that is not a reshard's doing (same world size, or neither
 * run's --global-batch-size explains it); or the file's errors
 * (checkpoint.h). A file whose sizes are more than a checkpoint of this model
 * can hold is -MG_ETOOBIG, found before anything big is allocated. Other
 * differences of configuration do not stop the load: they are in
 * t->resumed.config_diff for the caller to judge. */
int mg_trainer_load(struct mg_trainer *t, const char *path, char *err);

/* What mg_trainer_load reads at most from a checkpoint (checkpoint.h): what a
 * checkpoint of this model can hold with any optimizer and any world size. */
void mg_trainer_ckpt_bound(const struct mg_trainer *t, struct mg_ckpt_bound *b);

/* ---- snapshots in memory (trainer_ckpt.c; the region is snapshot/snapshot.h) ---- */

/* A snapshot is this rank's state in a checkpoint's sections, uncompressed
 * (docs/checkpoint-format.md, "Snapshots in memory"): META, TENSORS, PARAMS,
 * OPTIM with this rank's own optimizer state (its shard with ZeRO: no
 * collective), its RANK section and CONFIG. Its size is fixed for a run. */
int mg_trainer_snapshot_bytes(const struct mg_trainer *t, uint64_t *bytes);
/* Writes the snapshot of the current step into buf (cap bytes), the floats
 * straight from the model and optimizer; *len is its size. */
int mg_trainer_snapshot_pack(struct mg_trainer *t, unsigned char *buf, uint64_t cap, uint64_t *len);
/* Checks a snapshot (f: mg_ckpt_parse_payload's) against this run as
 * mg_trainer_load checks a file, and more: it must be this run's (its id
 * hash), at this world size, with this configuration, holding this rank's
 * own state; -MG_ECONFIG (or the load's codes) with a message naming what
 * when not. apply 0 changes nothing (every rank checks before any applies);
 * apply 1 restores it. */
int mg_trainer_snapshot_load(struct mg_trainer *t, const struct mg_ckpt_file *f, const char *what,
                             int apply, char *err);
/* The same for another rank's snapshot, of this run, maybe of another world
 * size (a node was lost): with a replicated optimizer every rank holds the
 * whole state, so any rank's copy resumes any rank, resharded as a file is
 * (t->resumed.resharded), this rank's dropout stream taken from the copy's
 * offset. -MG_ECONFIG when the optimizer is sharded (ZeRO-1: a shard is its
 * own rank's only). */
int mg_trainer_snapshot_load_peer(struct mg_trainer *t, const struct mg_ckpt_file *f,
                                  const char *what, int apply, char *err);
/* ZeRO-1: the same, with the whole optimizer state (mg_trainer_state_count
 * floats, the layout of a file's) gathered beside it from every old rank's
 * shard (own copies and peer copies): the snapshot gives the parameters,
 * position and dropout stream, full the state, sharded for this world size
 * as a file's is. */
int mg_trainer_snapshot_load_gathered(struct mg_trainer *t, const struct mg_ckpt_file *f,
                                      const float *full, const char *what, int apply, char *err);

#define MG_RESUME_MAX_SKIPPED 8
struct mg_resume_report {
    int found;
    uint64_t step;
    char path[MG_CKPT_PATH_MAX];
    int nskipped; /* corrupt newer checkpoints passed over */
    char skipped[MG_RESUME_MAX_SKIPPED][MG_ERRMSG_LEN];
};

/* Loads the newest complete checkpoint in dir that reads back intact, among
 * the checkpoints of own's runs (own NULL: of any run); a corrupt one
 * (format, truncation, CRC, version, sizes) is recorded in rep and the next
 * older is tried. No checkpoint at all: returns 0 with rep->found = 0. Only
 * corrupt ones: -MG_ECRC (or the last error). A configuration or shape
 * mismatch stops at once (it would not be better in an older file). */
int mg_trainer_resume_latest(struct mg_trainer *t, const char *dir, const struct mg_ckpt_owner *own,
                             struct mg_resume_report *rep, char *err);

#endif
