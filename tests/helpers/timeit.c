/* Runs a command several times and reports its wall time and peak RSS, for
 * the benchmarks (no shell or `date` overhead in the figures):
 *
 *   timeit REPS COMMAND [ARGS...]
 *
 * Prints one line: "median_us min_us max_us maxrss_kib". The command's output
 * goes to /dev/null. Exits 1 (naming the exit status) when a run fails, so a
 * benchmark never reports the time of a wrong answer. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int cmp(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: timeit REPS COMMAND [ARGS...]\n");
        return 64;
    }
    int reps = atoi(argv[1]);
    if (reps < 1 || reps > 100000)
        reps = 1;
    long long *t = calloc((size_t)reps, sizeof(*t));
    long maxrss = 0;
    for (int i = 0; i < reps; i++) {
        long long t0 = now_us();
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 71;
        }
        if (pid == 0) {
            int null = open("/dev/null", O_WRONLY);
            dup2(null, 1);
            dup2(null, 2);
            execvp(argv[2], argv + 2);
            _exit(127);
        }
        int st;
        struct rusage ru;
        wait4(pid, &st, 0, &ru);
        t[i] = now_us() - t0;
        if (ru.ru_maxrss > maxrss)
            maxrss = ru.ru_maxrss;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "timeit: %s failed (status 0x%x) on run %d\n", argv[2], st, i + 1);
            return 1;
        }
    }
    qsort(t, (size_t)reps, sizeof(*t), cmp);
    printf("%lld %lld %lld %ld\n", t[reps / 2], t[0], t[reps - 1], maxrss);
    free(t);
    return 0;
}
