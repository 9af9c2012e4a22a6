/* Checkpoint files: the container format (docs/checkpoint-format.md).
 *
 * A checkpoint is one file, dir/ckpt-<step, 12 digits>.mgc: a 64-byte header
 * (magic, version, sizes, step, parameter count, world size, CRC-32 of the
 * payload, CRC-32 of the header) followed by one zlib stream holding tagged
 * sections. It is written to a temporary name, fsynced, renamed and the
 * directory fsynced. A separate completion marker, dir/ckpt-<step>.done, is
 * written the same way by mg_ckpt_mark_complete() after every part of the
 * checkpoint is durable (in a distributed run: after a barrier). Only marked
 * checkpoints count; readers try the newest first and fall back to older ones.
 *
 * A checkpoint directory belongs to one run: an owner record, dir/ckpt-owner,
 * names it (and the runs whose checkpoints it took over), and each completion
 * marker records the run that wrote the checkpoint, so listing, resuming and
 * pruning can keep to the run's own checkpoints without opening them.
 *
 * This module knows nothing of models: the trainer decides what goes in the
 * sections (trainer.h).
 *
 * A function with a `char *err` argument writes what went wrong there: a
 * buffer of MG_ERRMSG_LEN bytes (mg_err.h). */
#ifndef MG_CHECKPOINT_H
#define MG_CHECKPOINT_H

#include "mg_err.h"

#include <stddef.h>
#include <stdint.h>

/* Versions this build reads; it writes the lowest one that can hold what a
 * checkpoint says (the caller's info.version), so older readers keep reading
 * most files. The container is the same in both: version 2 only changes the
 * meaning of the trainer's META (docs/checkpoint-format.md). */
#define MG_CKPT_VERSION      2
#define MG_CKPT_VERSION_MIN  1
#define MG_CKPT_HEADER_SIZE  64
#define MG_CKPT_MAX_RAW      ((uint64_t)64 << 30) /* uncompressed payload cap */
#define MG_CKPT_MAX_SECTIONS 65536
#define MG_CKPT_MAX_LIST     4096 /* checkpoints considered in one directory */
#define MG_CKPT_PATH_MAX     4096
#define MG_CKPT_RUN_ID_MAX   128 /* as TORCHELASTIC_RUN_ID (dist.h) */
#define MG_CKPT_MAX_ADOPTED  32  /* earlier owners an owner record remembers */
#define MG_CKPT_OWNER_FILE   "ckpt-owner"

extern const unsigned char mg_ckpt_magic[8]; /* "\x89MGCKPT\n" */

enum mg_ckpt_tag {
    MG_CKPT_TAG_END = 0,
    MG_CKPT_TAG_META = 1,    /* run metadata (trainer.h) */
    MG_CKPT_TAG_TENSORS = 2, /* names and shapes of the parameter tensors */
    MG_CKPT_TAG_PARAMS = 3,  /* the flat parameter buffer, float32 */
    MG_CKPT_TAG_OPTIM = 4,   /* optimizer kind, step count, flat state */
    MG_CKPT_TAG_RANK = 5,    /* per-rank state; index = rank */
    MG_CKPT_TAG_CONFIG = 6,  /* the run's id and configuration, text (trainer.h) */
};

struct mg_ckpt_section {
    uint32_t tag;
    uint32_t index;
    uint64_t len;
    const void *data;
};

/* Header fields that can be read without decompressing. */
struct mg_ckpt_info {
    uint32_t version; /* mg_ckpt_write: MG_CKPT_VERSION_MIN..MG_CKPT_VERSION; 0 = the newest */
    uint64_t step;
    uint64_t nparams;
    uint32_t world_size;
    uint64_t payload_bytes; /* compressed */
    uint64_t raw_bytes;     /* uncompressed */
};

/* What a reader allocates at most: fixed + per_rank x (the header's world
 * size) bytes of inflated payload, for a world size of at most max_world. A
 * reader that knows its model knows what a checkpoint of it can hold; without
 * a bound the cap is MG_CKPT_MAX_RAW. */
struct mg_ckpt_bound {
    uint64_t fixed;
    uint64_t per_rank;
    uint32_t max_world;
};

struct mg_ckpt_file {
    struct mg_ckpt_info info;
    /* A bounded read of a file whose header promises more than the bound: only
     * the sections within the first bound bytes are listed (every byte was
     * still checksummed). The reader decides what that means. */
    int partial;
    unsigned char *raw; /* the inflated payload; sections point into it */
    int nsections;
    struct mg_ckpt_section *sections;
};

/* dir/ckpt-<step>.mgc (and .done for the marker). */
void mg_ckpt_path(const char *dir, uint64_t step, char *buf, size_t len);
void mg_ckpt_marker_path(const char *dir, uint64_t step, char *buf, size_t len);

/* Writes the checkpoint file for info->step atomically. Does not write the
 * completion marker. Creates dir (and its parents) when missing. */
int mg_ckpt_write(const char *dir, const struct mg_ckpt_info *info,
                  const struct mg_ckpt_section *sections, int nsections, char *err);
/* Writes the completion marker for step (after mg_ckpt_write succeeded),
 * recording the run (its hash, mg_run_id_hash) that wrote the checkpoint. */
int mg_ckpt_mark_complete(const char *dir, uint64_t step, uint64_t run, char *err);

/* Reads and verifies a checkpoint file: magic (-MG_EFORMAT), version
 * (-MG_EVERSION), header and payload CRCs (-MG_ECRC), sizes (-MG_ETRUNC,
 * -MG_ETOOBIG), the zlib stream and the section framing (-MG_EFORMAT).
 * mg_ckpt_read_bounded allocates and inflates at most what bound allows
 * (NULL: the general cap): a file whose header promises more is read as
 * partial (above), so a crafted size costs nothing. */
int mg_ckpt_read(const char *path, struct mg_ckpt_file *out, char *err);
int mg_ckpt_read_bounded(const char *path, const struct mg_ckpt_bound *bound,
                         struct mg_ckpt_file *out, char *err);
void mg_ckpt_file_release(struct mg_ckpt_file *f);
const struct mg_ckpt_section *mg_ckpt_find(const struct mg_ckpt_file *f, uint32_t tag,
                                           uint32_t index);

/* A payload in memory (an in-memory snapshot holds one, docs/checkpoint-format.md):
 * the inflated form of a checkpoint's, sections then the end section, with no
 * header and no compression. mg_ckpt_sections_bytes is its size;
 * mg_ckpt_sections_pack lays the sections out in buf (-MG_ETOOBIG when over
 * cap), copying the data of those that have any and leaving the room of those
 * whose data is NULL for the caller to fill at offsets[i] (NULL: not wanted).
 * mg_ckpt_parse_payload splits one into out's sections, checking the framing
 * as a file's read does; it takes raw (malloc'ed) over in every case: out owns
 * it, to release with mg_ckpt_file_release. what names it in messages. */
uint64_t mg_ckpt_sections_bytes(const struct mg_ckpt_section *sections, int nsections);
int mg_ckpt_sections_pack(unsigned char *buf, uint64_t cap, const struct mg_ckpt_section *sections,
                          int nsections, uint64_t *offsets, uint64_t *len);
int mg_ckpt_parse_payload(unsigned char *raw, uint64_t len, const char *what,
                          struct mg_ckpt_file *out, char *err);

/* Who a checkpoint directory belongs to (docs/checkpoint-format.md, "Owner
 * record"): a run, and the earlier runs whose checkpoints it took over. Run
 * hash 0 stands for checkpoints whose marker records no run (written before
 * markers did). */
struct mg_ckpt_owner {
    uint64_t run;
    char run_id[MG_CKPT_RUN_ID_MAX + 1]; /* for messages; the hash decides */
    int nadopted;
    uint64_t adopted[MG_CKPT_MAX_ADOPTED];
};

/* 1 when the owner is run or took its checkpoints over. */
int mg_ckpt_owner_has(const struct mg_ckpt_owner *o, uint64_t run);
/* Adds run to the adopted ones (not twice, not the owner; the oldest go when full). */
void mg_ckpt_owner_adopt(struct mg_ckpt_owner *o, uint64_t run);
/* Reads dir's owner record: 1 when there is one, 0 when there is none (or no
 * dir), -MG_EFORMAT (with a message) when it is not one. */
int mg_ckpt_owner_read(const char *dir, struct mg_ckpt_owner *o, char *err);
/* Writes dir's owner record atomically, creating dir when missing. */
int mg_ckpt_owner_write(const char *dir, const struct mg_ckpt_owner *o, char *err);

/* A complete checkpoint: its step, and the run its marker records (0: none). */
struct mg_ckpt_entry {
    uint64_t step;
    uint64_t run;
};

/* Steps of the complete checkpoints in dir (marker and file present), the newest
 * max of them, newest first. Returns the count (0 when dir does not exist) or -errno. */
int mg_ckpt_list(const char *dir, uint64_t *steps, int max);
/* The same with the run of each, only the checkpoints of own's runs (own NULL: all). */
int mg_ckpt_list_runs(const char *dir, const struct mg_ckpt_owner *own, struct mg_ckpt_entry *out,
                      int max);

/* Keeps the `keep` newest complete checkpoints of own's runs (own NULL: of
 * any run) and removes their older ones (marker first), incomplete files
 * older than the newest kept one, and temporary files left by interrupted
 * writes. Other runs' checkpoints are never touched. keep <= 0 removes nothing. */
int mg_ckpt_prune(const char *dir, int keep, const struct mg_ckpt_owner *own);

#endif
