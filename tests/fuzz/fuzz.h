/* What the fuzz harnesses share (tests/fuzz/, docs/development.md): the
 * libFuzzer entry point each defines, and small helpers to hand an input to a
 * parser that reads a file or an argv. The same harness runs under libFuzzer
 * (make fuzz, clang) and under replay.c (make test, any compiler), so a
 * harness must give back everything it takes: one process runs millions of
 * inputs. A broken invariant is reported with fuzz_fail(), which aborts. */
#ifndef MG_FUZZ_H
#define MG_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input as a file: an anonymous memory file, named by *path
 * (/proc/self/fd/N). Returns its descriptor (close it), or -1. */
int fuzz_file(const uint8_t *data, size_t size, char *path, size_t cap);

/* Splits the input at NUL bytes into at most max strings, copied into buf
 * (size + 1 bytes). Returns how many. */
int fuzz_split(const uint8_t *data, size_t size, char *buf, char **out, int max);

/* Aborts with a message: an invariant the harness checks does not hold. */
__attribute__((noreturn, format(printf, 1, 2))) void fuzz_fail(const char *fmt, ...);

#endif
