/* timer_heap.c: the deadline heap the store server keeps for its parked
 * requests and its connections' timers. Random pushes, moves (earlier and
 * later) and removals checked against a plain array after every operation:
 * the top is always the earliest deadline, every entry knows its place, an
 * entry taken out says so, and popping everything gives the deadlines in
 * order. */
#include "tap.h"
#include "timer_heap.h"

#include <stdint.h>

/* timeout: 60 */

#define N 512

static struct mg_theap_node nodes[N];
static int in[N];

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* The heap agrees with the reference: size, places, and the earliest on top. */
static int consistent(const struct mg_theap *h)
{
    size_t count = 0;
    int64_t min = INT64_MAX;
    for (int i = 0; i < N; i++) {
        if (!in[i]) {
            if (nodes[i].idx != MG_THEAP_NONE)
                return 0;
            continue;
        }
        count++;
        if (nodes[i].idx >= h->n || h->v[nodes[i].idx] != &nodes[i])
            return 0;
        if (nodes[i].deadline < min)
            min = nodes[i].deadline;
    }
    if (count != h->n)
        return 0;
    for (size_t i = 1; i < h->n; i++) /* the heap property, parent before child */
        if (h->v[(i - 1) / 2]->deadline > h->v[i]->deadline)
            return 0;
    return h->n == 0 ? mg_theap_top(h) == NULL : mg_theap_top(h)->deadline == min;
}

int main(void)
{
    struct mg_theap h = {0};
    for (int i = 0; i < N; i++)
        mg_theap_node_init(&nodes[i]);
    ok(mg_theap_top(&h) == NULL, "an empty heap has no top");
    mg_theap_remove(&h, &nodes[0]); /* not in it: nothing happens */
    ok(h.n == 0 && nodes[0].idx == MG_THEAP_NONE, "removing an entry not in the heap is a no-op");

    int bad = -1;
    for (int step = 0; step < 20000 && bad < 0; step++) {
        int i = (int)(next() % N);
        int64_t d = (int64_t)(next() % 1000); /* ties are frequent */
        switch (next() % 4) {
        case 0:
        case 1:
            if (!in[i]) {
                if (mg_theap_push(&h, &nodes[i], d))
                    bad = step;
                in[i] = 1;
            } else {
                mg_theap_move(&h, &nodes[i], d);
            }
            break;
        case 2:
            if (in[i])
                mg_theap_move(&h, &nodes[i], nodes[i].deadline - (int64_t)(next() % 50));
            break;
        default:
            mg_theap_remove(&h, &nodes[i]);
            in[i] = 0;
        }
        if (!consistent(&h))
            bad = step;
    }
    ok(bad < 0,
       "20000 random pushes, moves and removals keep the heap consistent (first bad step: %d)",
       bad);

    size_t n = h.n;
    int64_t prev = INT64_MIN;
    int sorted = 1;
    while (mg_theap_top(&h)) {
        struct mg_theap_node *x = mg_theap_top(&h);
        if (x->deadline < prev)
            sorted = 0;
        prev = x->deadline;
        mg_theap_remove(&h, x);
        in[x - nodes] = 0;
        if (x->idx != MG_THEAP_NONE)
            sorted = 0;
    }
    ok(sorted && n > 0, "taking the top %zu times gives the deadlines in order", n);
    ok(consistent(&h), "and leaves it empty");

    is_int(mg_theap_reserve(&h, 1000), 0, "reserve room for 1000");
    ok(h.cap >= 1000, "capacity %zu", h.cap);
    mg_theap_release(&h);
    ok(h.v == NULL && h.n == 0, "release");
    return done_testing();
}
