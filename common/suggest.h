/* "Did you mean --nproc_per_node?": the known name nearest to a mistyped
 * one, for the one-line usage errors of mglaunch and train. */
#ifndef MG_SUGGEST_H
#define MG_SUGGEST_H

#include <stddef.h>

/* The index of the name in names[0..n) nearest to given (edit distance,
 * a swap of two neighbours counting as one edit; '-' and '_' the same),
 * when it is near enough to be a typo: at most 1 edit for names of up to 4
 * characters, 2 for longer ones, and no other name as near. Else -1. */
int mg_suggest(const char *given, const char *const *names, size_t n);

#endif
