/* torchrun's file-timer watchdog (TORCHELASTIC_ENABLE_FILE_TIMER=1), as
 * torch's FileTimerServer serves it: a FIFO whose path the workers get in
 * TORCHELASTIC_TIMER_FILE; torch's FileTimerClient writes one JSON request
 * per line, {"version": 1, "pid": P, "scope_id": S, "expiration_time": T,
 * "signal": N}: T in seconds since the epoch sets (pid, scope) to expire
 * then, a negative T releases it. A timer that expires gets its signal sent
 * to its pid (a signal of 0 or less: only reported). This is the timer
 * table and the request reader; watch.c serves it from the agent's loop.
 * Malformed requests are counted and described, never acted on. */
#ifndef MG_FILETIMER_H
#define MG_FILETIMER_H

#include <limits.h>
#include <stddef.h>

#define MG_FILETIMER_MAX   4096 /* timers held; more are refused */
#define MG_FILETIMER_LINE  4096 /* torch writes at most PIPE_BUF bytes */
#define MG_FILETIMER_SCOPE 256

struct mg_filetimer_entry {
    int pid;
    char scope[MG_FILETIMER_SCOPE];
    double expires; /* seconds since the epoch */
    double set_at;  /* when the request came (seconds since the epoch) */
    int sig;
};

struct mg_filetimer {
    int fd; /* the FIFO, read-write so it never reads end-of-file; -1: off */
    char path[PATH_MAX];
    char dir[PATH_MAX]; /* the directory made for it ("" when the path was given) */
    int created;        /* the FIFO was made here: removed at release */
    char line[MG_FILETIMER_LINE];
    size_t len;
    int skipping; /* the rest of an over-long line is dropped */
    struct mg_filetimer_entry *t;
    int n, cap;
    unsigned long requests, malformed;
};

/* Opens the FIFO at path (made when it does not exist; an existing FIFO is
 * used), or with path NULL, a new one in a private directory under tmpdir
 * (NULL: /tmp). 0, or a negative errno with a message in err. */
int mg_filetimer_open(struct mg_filetimer *ft, const char *path, const char *tmpdir, char *err,
                      size_t cap);
void mg_filetimer_release(struct mg_filetimer *ft);

/* Applies one request line at time now (seconds since the epoch). 0, or
 * -EINVAL with what is wrong in why (the line is ignored), -ENOSPC when the
 * table is full. */
int mg_filetimer_apply(struct mg_filetimer *ft, const char *line, size_t len, double now, char *why,
                       size_t cap);

/* Reads what the FIFO holds and applies each complete line; bad(ctx, why,
 * line) is told of each one that is malformed. Returns the number of lines
 * applied, or a negative errno when reading fails. */
int mg_filetimer_read(struct mg_filetimer *ft, double now,
                      void (*bad)(void *ctx, const char *why, const char *line), void *ctx);

/* Takes the first timer that expired by now out of the table into out:
 * 1, or 0 when none did. */
int mg_filetimer_take_expired(struct mg_filetimer *ft, double now, struct mg_filetimer_entry *out);

/* Forgets every timer (a new attempt: the workers that set them are gone). */
void mg_filetimer_clear(struct mg_filetimer *ft);

#endif
