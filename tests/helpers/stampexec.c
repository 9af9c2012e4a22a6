/* Writes the wall-clock time (CLOCK_REALTIME, seconds since the epoch, to
 * the microsecond) to FILE, then execs COMMAND: a benchmark's "t = 0" taken
 * at the last moment before the command starts, on the clock train's
 * --profile-startup line uses.
 *
 *   stampexec FILE COMMAND [ARGS...]
 *
 * Exits 127 (with a message) when COMMAND cannot be executed, 2 on misuse. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: stampexec FILE COMMAND [ARGS...]\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "w");
    if (!f) {
        fprintf(stderr, "stampexec: cannot write '%s': %s\n", argv[1], strerror(errno));
        return 2;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    fprintf(f, "%lld.%06ld\n", (long long)ts.tv_sec, ts.tv_nsec / 1000);
    if (fclose(f) != 0) {
        fprintf(stderr, "stampexec: cannot write '%s': %s\n", argv[1], strerror(errno));
        return 2;
    }
    execvp(argv[2], argv + 2);
    fprintf(stderr, "stampexec: cannot run '%s': %s\n", argv[2], strerror(errno));
    return 127;
}
