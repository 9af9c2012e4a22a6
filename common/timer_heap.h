/* A min-heap of deadlines whose entries live inside their owners (a parked
 * request, a connection): each knows its place, so it leaves or moves in
 * O(log n) without a search, and the earliest is at hand. The store server
 * keeps one for its parked requests' timeouts and one for its connections'
 * own timers (handshake, lease, frame, lingering close), so that a turn of
 * its loop costs the timers that fall due, never a walk of every
 * connection. */
#ifndef MG_TIMER_HEAP_H
#define MG_TIMER_HEAP_H

#include <stddef.h>
#include <stdint.h>

#define MG_THEAP_NONE ((size_t)-1) /* idx of an entry not in the heap */

struct mg_theap_node {
    int64_t deadline;
    size_t idx; /* MG_THEAP_NONE when not in the heap */
};

struct mg_theap {
    struct mg_theap_node **v;
    size_t n, cap;
};

/* Marks x as not in any heap (before its first push). */
void mg_theap_node_init(struct mg_theap_node *x);
/* Room for n entries, so that pushes up to there cannot fail; 0 or -ENOMEM. */
int mg_theap_reserve(struct mg_theap *h, size_t n);
/* Inserts x (not in the heap) with deadline; 0 or -ENOMEM. */
int mg_theap_push(struct mg_theap *h, struct mg_theap_node *x, int64_t deadline);
/* Moves x, which is in the heap, to a new deadline, earlier or later. */
void mg_theap_move(struct mg_theap *h, struct mg_theap_node *x, int64_t deadline);
/* Takes x out, when it is in the heap (else nothing). */
void mg_theap_remove(struct mg_theap *h, struct mg_theap_node *x);
/* The entry with the earliest deadline, or NULL when empty. */
static inline struct mg_theap_node *mg_theap_top(const struct mg_theap *h)
{
    return h->n ? h->v[0] : NULL;
}
/* Frees the array (the entries are their owners'). */
void mg_theap_release(struct mg_theap *h);

#endif
