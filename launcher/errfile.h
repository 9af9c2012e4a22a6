/* Reading torchrun's worker error files (TORCHELASTIC_ERROR_FILE).
 *
 * torch's ErrorHandler writes
 *   {"message": {"message": "ValueError: ...",
 *                "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1700000000"},
 *                "errorCode": 1}}                      (errorCode optional)
 * and torch also accepts {"message": "text", "timestamp": 1700000000}.
 * libmg writes the first shape and adds "rank" and "hostname" (read here at
 * the top level or inside extraInfo). */
#ifndef MG_ERRFILE_H
#define MG_ERRFILE_H

#include <stddef.h>

#define MG_ERRFILE_MAX_BYTES (1u << 20)

struct mg_errfile {
    char message[2048];
    char traceback[8192]; /* the end of py_callstack when longer */
    long long timestamp;  /* seconds since the epoch, 0 when absent */
    int rank;             /* -1 when absent */
    char hostname[256];
    int error_code; /* 0 when absent */
};

int mg_errfile_parse(const char *text, size_t len, struct mg_errfile *ef);
/* 0, -ENOENT (no file), -MG_EFORMAT (not torch's format), -MG_ETOOBIG. */
int mg_errfile_read(const char *path, struct mg_errfile *ef);

#endif
