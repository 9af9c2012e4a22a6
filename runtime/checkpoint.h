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

extern const unsigned char mg_ckpt_magic[8]; /* "\x89MGCKPT\n" */

enum mg_ckpt_tag {
    MG_CKPT_TAG_END = 0,
    MG_CKPT_TAG_META = 1,    /* run metadata (trainer.h) */
    MG_CKPT_TAG_TENSORS = 2, /* names and shapes of the parameter tensors */
    MG_CKPT_TAG_PARAMS = 3,  /* the flat parameter buffer, float32 */
    MG_CKPT_TAG_OPTIM = 4,   /* optimizer kind, step count, flat state */
    MG_CKPT_TAG_RANK = 5,    /* per-rank state; index = rank */
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

struct mg_ckpt_file {
    struct mg_ckpt_info info;
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
/* Writes the completion marker for step (after mg_ckpt_write succeeded). */
int mg_ckpt_mark_complete(const char *dir, uint64_t step, char *err);

/* Reads and verifies a checkpoint file: magic (-MG_EFORMAT), version
 * (-MG_EVERSION), header and payload CRCs (-MG_ECRC), sizes (-MG_ETRUNC,
 * -MG_ETOOBIG), the zlib stream and the section framing (-MG_EFORMAT). */
int mg_ckpt_read(const char *path, struct mg_ckpt_file *out, char *err);
void mg_ckpt_file_release(struct mg_ckpt_file *f);
const struct mg_ckpt_section *mg_ckpt_find(const struct mg_ckpt_file *f, uint32_t tag,
                                           uint32_t index);

/* Steps of the complete checkpoints in dir (marker and file present), the newest
 * max of them, newest first. Returns the count (0 when dir does not exist) or -errno. */
int mg_ckpt_list(const char *dir, uint64_t *steps, int max);

/* Keeps the `keep` newest complete checkpoints and removes older ones (marker
 * first), incomplete files older than the newest complete one, and temporary
 * files left by interrupted writes. keep <= 0 removes nothing. */
int mg_ckpt_prune(const char *dir, int keep);

#endif
