/* Runs a command and writes its peak resident set size (KiB, the largest of
 * the command and the descendants it waited for) to a file:
 *
 *   maxrss OUTFILE COMMAND [ARGS...]
 *
 * Exits with the command's status (128+N when it died by signal N). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: maxrss OUTFILE COMMAND [ARGS...]\n");
        return 64;
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 71;
    }
    if (pid == 0) {
        execvp(argv[2], argv + 2);
        perror(argv[2]);
        _exit(127);
    }
    int st;
    struct rusage ru;
    if (wait4(pid, &st, 0, &ru) < 0) {
        perror("wait4");
        return 71;
    }
    FILE *f = fopen(argv[1], "w");
    if (f) {
        fprintf(f, "%ld\n", ru.ru_maxrss);
        fclose(f);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
