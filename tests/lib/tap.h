/* A small TAP assertion header for the C unit tests (run under prove).
 *
 *   ok(cond, "fmt", ...)         is_int(got, want, "fmt", ...)
 *   is_str(got, want, ...)        is_double(got, want, tol, ...)
 *   diag("fmt", ...)              skip_all("reason")
 *   return done_testing();
 *
 * Each assertion prints one TAP line; failures also print file:line and the
 * values compared. The plan is printed at the end. */
#ifndef MG_TAP_H
#define MG_TAP_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tap_count, tap_failed;

__attribute__((format(printf, 4, 5), unused)) static int tap_ok(int pass, const char *file,
                                                                int line, const char *fmt, ...)
{
    va_list ap;
    tap_count++;
    printf("%sok %d - ", pass ? "" : "not ", tap_count);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    if (!pass) {
        tap_failed++;
        printf("#   failed at %s:%d\n", file, line);
    }
    fflush(stdout);
    return pass;
}

#define ok(cond, ...) tap_ok(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

#define is_int(got, want, ...)                                                                     \
    do {                                                                                           \
        long long tap_g_ = (long long)(got), tap_w_ = (long long)(want);                           \
        if (!tap_ok(tap_g_ == tap_w_, __FILE__, __LINE__, __VA_ARGS__))                            \
            printf("#   got %lld, want %lld\n", tap_g_, tap_w_);                                   \
    } while (0)

#define is_str(got, want, ...)                                                                     \
    do {                                                                                           \
        const char *tap_g_ = (got), *tap_w_ = (want);                                              \
        int tap_p_ = (tap_g_ && tap_w_) ? strcmp(tap_g_, tap_w_) == 0 : tap_g_ == tap_w_;          \
        if (!tap_ok(tap_p_, __FILE__, __LINE__, __VA_ARGS__))                                      \
            printf("#   got '%s', want '%s'\n", tap_g_ ? tap_g_ : "(null)",                        \
                   tap_w_ ? tap_w_ : "(null)");                                                    \
    } while (0)

#define is_double(got, want, tol, ...)                                                             \
    do {                                                                                           \
        double tap_g_ = (got), tap_w_ = (want), tap_t_ = (tol);                                    \
        if (!tap_ok(fabs(tap_g_ - tap_w_) <= tap_t_, __FILE__, __LINE__, __VA_ARGS__))             \
            printf("#   got %.9g, want %.9g (tolerance %g)\n", tap_g_, tap_w_, tap_t_);            \
    } while (0)

#define diag(...)                                                                                  \
    do {                                                                                           \
        printf("# ");                                                                              \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
        fflush(stdout);                                                                            \
    } while (0)

#define skip_all(...)                                                                              \
    do {                                                                                           \
        printf("1..0 # SKIP ");                                                                    \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
        exit(0);                                                                                   \
    } while (0)

#define BAIL_OUT(...)                                                                              \
    do {                                                                                           \
        printf("Bail out! ");                                                                      \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
        exit(255);                                                                                 \
    } while (0)

static inline int done_testing(void)
{
    printf("1..%d\n", tap_count);
    return tap_failed ? 1 : 0;
}

#endif
