/* The nearest known name to a mistyped one (see suggest.h). */
#include "suggest.h"

#include <string.h>

#define NAME_MAX_LEN 64

static char fold(char c)
{
    return c == '-' ? '_' : c;
}

/* Optimal string alignment distance, stopping at names too long to be ours. */
static int distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    int d[NAME_MAX_LEN + 1][NAME_MAX_LEN + 1];
    if (la > NAME_MAX_LEN || lb > NAME_MAX_LEN)
        return 1000;
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int cost = fold(a[i - 1]) != fold(b[j - 1]);
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v)
                v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v)
                v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && fold(a[i - 1]) == fold(b[j - 2]) &&
                fold(a[i - 2]) == fold(b[j - 1]) && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1; /* two neighbours swapped */
            d[i][j] = v;
        }
    return d[la][lb];
}

int mg_suggest(const char *given, const char *const *names, size_t n)
{
    int best = -1, best_d = 1000, tie = 0;
    for (size_t i = 0; i < n; i++) {
        if (!names[i])
            continue;
        int dd = distance(given, names[i]);
        if (dd < best_d) {
            best_d = dd;
            best = (int)i;
            tie = 0;
        } else if (dd == best_d) {
            tie = 1;
        }
    }
    if (best < 0 || tie)
        return -1;
    int limit = strlen(names[best]) <= 4 ? 1 : 2;
    return best_d <= limit ? best : -1;
}
