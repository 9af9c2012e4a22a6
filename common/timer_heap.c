/* The deadline heap (timer_heap.h): a binary heap of pointers to entries
 * embedded in their owners, each entry holding its index, so that removal
 * and moves need no search. Ties keep no order. */
#include "timer_heap.h"

#include <errno.h>
#include <stdlib.h>

static void set(struct mg_theap *h, size_t i, struct mg_theap_node *x)
{
    h->v[i] = x;
    x->idx = i;
}

static void up(struct mg_theap *h, size_t i)
{
    struct mg_theap_node *x = h->v[i];
    while (i > 0 && x->deadline < h->v[(i - 1) / 2]->deadline) {
        set(h, i, h->v[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    set(h, i, x);
}

static void down(struct mg_theap *h, size_t i)
{
    struct mg_theap_node *x = h->v[i];
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        struct mg_theap_node *mx = x;
        if (l < h->n && h->v[l]->deadline < mx->deadline)
            m = l, mx = h->v[l];
        if (l + 1 < h->n && h->v[l + 1]->deadline < mx->deadline)
            m = l + 1, mx = h->v[l + 1];
        if (m == i)
            break;
        set(h, i, mx);
        i = m;
    }
    set(h, i, x);
}

void mg_theap_node_init(struct mg_theap_node *x)
{
    x->deadline = 0;
    x->idx = MG_THEAP_NONE;
}

int mg_theap_reserve(struct mg_theap *h, size_t n)
{
    if (n <= h->cap)
        return 0;
    size_t cap = h->cap ? h->cap : 64;
    while (cap < n)
        cap *= 2;
    struct mg_theap_node **v = realloc(h->v, cap * sizeof(*v));
    if (!v)
        return -ENOMEM;
    h->v = v;
    h->cap = cap;
    return 0;
}

int mg_theap_push(struct mg_theap *h, struct mg_theap_node *x, int64_t deadline)
{
    if (mg_theap_reserve(h, h->n + 1))
        return -ENOMEM;
    x->deadline = deadline;
    set(h, h->n++, x);
    up(h, x->idx);
    return 0;
}

void mg_theap_move(struct mg_theap *h, struct mg_theap_node *x, int64_t deadline)
{
    int64_t old = x->deadline;
    x->deadline = deadline;
    if (deadline < old)
        up(h, x->idx);
    else
        down(h, x->idx);
}

void mg_theap_remove(struct mg_theap *h, struct mg_theap_node *x)
{
    size_t i = x->idx;
    if (i == MG_THEAP_NONE || i >= h->n || h->v[i] != x)
        return;
    struct mg_theap_node *last = h->v[--h->n];
    x->idx = MG_THEAP_NONE;
    if (last != x) {
        set(h, i, last);
        up(h, i);
        down(h, last->idx);
    }
}

void mg_theap_release(struct mg_theap *h)
{
    free(h->v);
    h->v = NULL;
    h->n = h->cap = 0;
}
