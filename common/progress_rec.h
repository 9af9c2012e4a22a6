/* The progress record a worker keeps for mglaunch's watchdog: what a rank is
 * doing and when it last moved, and its flight recorder (the last
 * MG_PROGRESS_RING collectives). It lives in the memory the agent lends each
 * local rank (launcher/rankmem.h, MG_PROGRESS_FD), so the agent reads it
 * without asking the worker, even when the worker is stopped or spinning,
 * and a worker records with plain stores (no system call per step).
 *
 * One writer per field group: the training thread writes the step and the
 * phase, the thread that calls collectives writes the ring; both bump the
 * beat. Readers copy the record and accept torn values (a collective's entry
 * is checked against its sequence number); times are CLOCK_MONOTONIC
 * microseconds, one clock for every process of a host. */
#ifndef MG_PROGRESS_REC_H
#define MG_PROGRESS_REC_H

#include <stddef.h>
#include <stdint.h>

#define MG_PROGRESS_MAGIC   0x31474f5250474dULL /* "MGPROG1" */
#define MG_PROGRESS_VERSION 1
#define MG_PROGRESS_RING    32 /* collectives kept */
#define MG_PROGRESS_STEPS   16 /* recent step durations kept */
#define MG_PROGRESS_BYTES   4096

/* What the training thread is doing. */
enum mg_progress_phase {
    MG_PH_NONE,
    MG_PH_SETUP,      /* starting: data, model, communicator, resume */
    MG_PH_DATA,       /* taking the next batch */
    MG_PH_COMPUTE,    /* forward and backward */
    MG_PH_SYNC,       /* waiting for the gradients' collectives */
    MG_PH_OPTIMIZER,  /* the update */
    MG_PH_EVAL,       /* evaluation */
    MG_PH_CHECKPOINT, /* writing or reading a checkpoint */
    MG_PH_DONE,       /* training over: final reports, exit */
    MG_PH_COUNT,
};

enum mg_progress_op {
    MG_PROG_ALLREDUCE,
    MG_PROG_BROADCAST,
    MG_PROG_ALLGATHER,
    MG_PROG_REDUCE_SCATTER,
    MG_PROG_BARRIER,
    MG_PROG_SHIFT,
    MG_PROG_OP_COUNT,
};

enum mg_progress_state {
    MG_CS_EMPTY,
    MG_CS_STARTED, /* called, not returned */
    MG_CS_DONE,
    MG_CS_FAILED,
};

struct mg_progress_coll {
    uint64_t seq; /* 1, 2, ...: the same collective has the same number on every rank */
    uint32_t op;  /* enum mg_progress_op */
    uint32_t state;
    int32_t bucket; /* DDP's bucket, -1 for none */
    uint32_t reserved;
    uint64_t bytes;
    int64_t start_us, end_us;
};

/* Where the worker resumed from (mg_progress_resumed), for the agent's event
 * log ("resume", docs/logs.md): from is stored last, with release. */
enum mg_progress_from {
    MG_FROM_UNSAID, /* not said yet (setting up), or a program that does not say */
    MG_FROM_START,  /* step 0: nothing to resume from */
    MG_FROM_MEMORY, /* an in-memory snapshot (docs/train.md, "Snapshots in memory") */
    MG_FROM_DISK,   /* a checkpoint file */
};

#define MG_PROGRESS_PATH_MAX 512
#define MG_RESUME_OWN        (-1) /* each rank its own snapshot */
#define MG_RESUME_SHARDS     (-2) /* ZeRO-1: the shards gathered from the ranks' memory */

struct mg_progress_resume {
    uint32_t from;     /* enum mg_progress_from */
    int32_t src_rank;  /* memory: the rank whose snapshot every rank took, or MG_RESUME_OWN,
                          MG_RESUME_SHARDS */
    int32_t src_world; /* the world size the state was written at (0: not known) */
    uint32_t reserved;
    int64_t step;                    /* the step training goes on from */
    int64_t epoch;                   /* 1-based */
    char path[MG_PROGRESS_PATH_MAX]; /* disk: the checkpoint file, cut to fit */
};

struct mg_progress {
    uint64_t magic; /* written last at start: the record is live */
    uint32_t version;
    int32_t pid; /* the process that writes it */
    int32_t rank;
    uint32_t phase;          /* enum mg_progress_phase */
    uint64_t beat;           /* bumped at every sign of progress */
    int64_t beat_us;         /* when */
    int64_t phase_us;        /* when the phase began */
    int64_t step;            /* optimizer steps done */
    int64_t step_start_us;   /* when the step in progress began */
    int64_t coll_timeout_ms; /* the worker's collective timeout, the last resort */
    uint64_t steps_done;     /* entries written to step_us (mod MG_PROGRESS_STEPS) */
    int64_t step_us[MG_PROGRESS_STEPS];
    uint64_t coll_next;  /* sequence number of the next collective */
    int32_t coll_bucket; /* bucket of the next collective (set by DDP), -1 none */
    uint32_t reserved;
    struct mg_progress_coll ring[MG_PROGRESS_RING]; /* by seq % MG_PROGRESS_RING */
    struct mg_progress_resume resume; /* once, after the resume (or the start from step 0) */
};

_Static_assert(sizeof(struct mg_progress) <= MG_PROGRESS_BYTES, "progress record too large");

/* The name of a resume source in the event log: "start", "memory", "disk";
 * NULL for MG_FROM_UNSAID or a value no version wrote. */
const char *mg_progress_from_name(unsigned from);

/* Names for messages ("forward/backward", "allreduce"). */
const char *mg_progress_phase_name(unsigned phase);
/* Where the training thread is, in train's own count of steps (1-based, as
 * its "step N/M" lines and its resumes say): "forward/backward of step 101
 * (100 done)" inside a step, "a checkpoint after step 100" between steps,
 * "setup before its first step". Returns buf. */
const char *mg_progress_where(const struct mg_progress *p, char *buf, size_t cap);
const char *mg_progress_op_name(unsigned op);

/* The entry of collective seq in a copy of a record, or NULL when the ring
 * has moved past it (or it was never written). */
const struct mg_progress_coll *mg_progress_coll_find(const struct mg_progress *p, uint64_t seq);

/* The newest collective entry (started or finished), or NULL. */
const struct mg_progress_coll *mg_progress_coll_last(const struct mg_progress *p);

/* The newest finished (done) collective's seq, 0 when none. */
uint64_t mg_progress_last_done(const struct mg_progress *p);

/* The slowest recent step in microseconds (0 before the first step). */
int64_t mg_progress_slowest_step(const struct mg_progress *p);

#endif
