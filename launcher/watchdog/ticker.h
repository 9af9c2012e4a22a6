/* Progress lines of a node's own ranks, for the nodes other than node rank
 * 0 (whose console shows rank 0's own progress): without them a healthy
 * job's other nodes print nothing at all. Made from the watchdog's
 * progress records (progress_rec.h), so a libmg program needs nothing of
 * its own; MG_NODE_PROGRESS_EVERY (seconds, 0: off) sets how often. */
#ifndef MG_TICKER_H
#define MG_TICKER_H

#include <stddef.h>
#include <stdint.h>

#define MG_TICKER_EVERY_S 30

struct mg_ticker {
    int64_t every_ms; /* 0: off */
    int64_t next_ms;  /* the next line's time; 0: before the first step */
    int64_t last_step, last_ms;
};

/* Reads MG_NODE_PROGRESS_EVERY from env (unset: 30 s). 0, or -EINVAL for
 * a value that is not a number of seconds >= 0 (the default is kept). */
int mg_ticker_init(struct mg_ticker *t, char *const *env);

/* A new attempt: the next line is its first step's. */
void mg_ticker_reset(struct mg_ticker *t);

/* step: the lowest step of this node's ranks (-1: none has a record yet);
 * who: "ranks 2-3 here (node rank 1 of 2)". 1 with the line in buf when
 * one is due, else 0. */
int mg_ticker_due(struct mg_ticker *t, int64_t step, int64_t now_ms, const char *who, char *buf,
                  size_t cap);

#endif
