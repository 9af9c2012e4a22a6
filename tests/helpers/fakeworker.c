/* A fake worker for the launcher tests: runs the actions given on its command
 * line, in order, then exits 0.
 *
 *   print-env               all environment variables, sorted, to stdout
 *   out TEXT | err TEXT     a line on stdout / stderr   (outn/errn: no newline)
 *   out-bytes N             N bytes without a newline on stdout (err-bytes: stderr)
 *   out-lines N             N bytes as 100-byte lines on stdout
 *   progress N              N "\r" progress updates on stdout, then a newline
 *   exit CODE               exit now
 *   signal NAME             die by signal NAME (SEGV, KILL, ABRT...)
 *   ignore-term             ignore SIGTERM from now on
 *   on-term CODE            on SIGTERM print "got SIGTERM" to stderr and exit CODE
 *   trap NAME FILE          on signal NAME append "NAME" to FILE and go on
 *   sleep SECS              sleep (fractions allowed; restarts after trapped signals)
 *   pause                   wait until a signal ends the process
 *   alloc MB                allocate MB megabytes and touch every page (to meet a
 *                           memory limit)
 *   grandchild FILE         fork a child (same process group) that writes its pid to
 *                           FILE and sleeps forever
 *   pidfile FILE            write our pid to FILE
 *   touch FILE              create FILE (to tell a test we got here)
 *   wait-file FILE          wait (up to 30 s) until FILE exists
 *   wait-exiting FILE       wait (up to 30 s) until the process whose pid FILE holds
 *                           begins to exit (PF_EXITING in /proc/PID/stat): what a
 *                           worker whose peer died sees first
 *   stamp FILE              append CLOCK_MONOTONIC nanoseconds to FILE
 *   error-json MSG          write torch's error file ({"message": {...}}) to
 *                           $TORCHELASTIC_ERROR_FILE
 *   error-json-str MSG      the other shape torch accepts ({"message": "MSG"})
 *   if COND[,COND] ACTION   do ACTION only if every COND holds: rank=N,
 *                           local_rank=N, restart=N (TORCHELASTIC_RESTART_COUNT)
 */
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static int term_code = -1;
static const char *trap_file[NSIG];

static void on_term(int sig)
{
    static const char msg[] = "got SIGTERM\n";
    (void)sig;
    ssize_t rc = write(2, msg, sizeof(msg) - 1);
    (void)rc;
    _exit(term_code);
}

/* The process whose pid is in file has begun to exit (PF_EXITING). */
static int exiting(const char *file)
{
    int pid = 0;
    FILE *f = fopen(file, "r");
    if (f) {
        if (fscanf(f, "%d", &pid) != 1)
            pid = 0;
        fclose(f);
    }
    return pid > 0 && mg_proc_exiting(pid) == 1;
}

static void on_trap(int sig)
{
    if (!trap_file[sig])
        return;
    int fd = open(trap_file[sig], O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        const char *name = sigabbrev_np(sig);
        ssize_t rc = write(fd, name, strlen(name));
        rc = write(fd, "\n", 1);
        (void)rc;
        close(fd);
    }
}

static int signum(const char *name)
{
    if (strncmp(name, "SIG", 3) == 0)
        name += 3;
    for (int s = 1; s < NSIG; s++) {
        const char *a = sigabbrev_np(s);
        if (a && strcmp(a, name) == 0)
            return s;
    }
    return atoi(name);
}

static int cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void print_env(void)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **v = malloc((n + 1) * sizeof(*v));
    memcpy(v, environ, n * sizeof(*v));
    qsort(v, n, sizeof(*v), cmp);
    for (size_t i = 0; i < n; i++)
        printf("%s\n", v[i]);
    fflush(stdout);
    free(v);
}

static void put_bytes(int fd, long n, int lines)
{
    char buf[65500]; /* a multiple of the 100-byte line */
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = lines && i % 100 == 99 ? '\n' : (char)('a' + i % 26);
    while (n > 0) {
        size_t k = n < (long)sizeof(buf) ? (size_t)n : sizeof(buf);
        ssize_t w = write(fd, buf, k);
        if (w <= 0)
            exit(3);
        n -= w;
    }
}

static void write_file(const char *path, const char *text, int append)
{
    FILE *f = fopen(path, append ? "a" : "w");
    if (!f) {
        perror(path);
        exit(4);
    }
    fputs(text, f);
    fclose(f);
}

static void json_escape(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if (*s == '\n')
            fputs("\\n", f);
        else
            fputc(*s, f);
    }
}

static void error_json(const char *msg, int string_form)
{
    const char *path = getenv("TORCHELASTIC_ERROR_FILE");
    if (!path) {
        fprintf(stderr, "fakeworker: TORCHELASTIC_ERROR_FILE is not set\n");
        exit(5);
    }
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(5);
    }
    if (string_form) {
        fputs("{\"message\": \"", f);
        json_escape(f, msg);
        fprintf(f, "\", \"timestamp\": %ld}", (long)time(NULL));
    } else {
        fputs("{\"message\": {\"message\": \"", f);
        json_escape(f, msg);
        fputs("\", \"extraInfo\": {\"py_callstack\": \"Traceback (most recent call last):\\n"
              "  File \\\"fake.py\\\", line 1, in <module>\\n",
              f);
        json_escape(f, msg);
        fprintf(f, "\\n\", \"timestamp\": \"%ld\"}}}", (long)time(NULL));
    }
    fclose(f);
}

static int env_int(const char *name)
{
    const char *v = getenv(name);
    return v ? atoi(v) : -1;
}

static int cond_holds(const char *conds)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", conds);
    for (char *c = strtok(buf, ","); c; c = strtok(NULL, ",")) {
        char *eq = strchr(c, '=');
        if (!eq)
            return 0;
        *eq = '\0';
        int want = atoi(eq + 1), have = -1;
        if (!strcmp(c, "rank"))
            have = env_int("RANK");
        else if (!strcmp(c, "local_rank"))
            have = env_int("LOCAL_RANK");
        else if (!strcmp(c, "restart"))
            have = env_int("TORCHELASTIC_RESTART_COUNT");
        if (have != want)
            return 0;
    }
    return 1;
}

static void do_sleep(double secs)
{
    struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Arguments each action takes. */
static int nargs(const char *a)
{
    static const char *one[] = {
        "out",        "err",      "outn",        "errn",   "out-bytes",  "err-bytes",
        "out-lines",  "progress", "exit",        "signal", "on-term",    "sleep",
        "grandchild", "pidfile",  "touch",       "stamp",  "error-json", "error-json-str",
        "wait-file",  "alloc",    "wait-exiting"};
    if (!strcmp(a, "trap"))
        return 2;
    for (size_t i = 0; i < sizeof(one) / sizeof(one[0]); i++)
        if (!strcmp(a, one[i]))
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "if")) {
            if (i + 2 >= argc)
                return 64;
            if (!cond_holds(argv[i + 1])) {
                i += 2 + nargs(argv[i + 2]); /* skip the guarded action */
                continue;
            }
            i++;
            continue;
        }
        if (i + nargs(a) >= argc) {
            fprintf(stderr, "fakeworker: %s needs %d argument(s)\n", a, nargs(a));
            return 64;
        }
        const char *x = argv[i + 1];
        if (!strcmp(a, "print-env")) {
            print_env();
        } else if (!strcmp(a, "out")) {
            printf("%s\n", x);
        } else if (!strcmp(a, "outn")) {
            fputs(x, stdout);
            fflush(stdout);
        } else if (!strcmp(a, "err")) {
            fprintf(stderr, "%s\n", x);
        } else if (!strcmp(a, "errn")) {
            fputs(x, stderr);
        } else if (!strcmp(a, "out-bytes")) {
            fflush(stdout);
            put_bytes(1, atol(x), 0);
        } else if (!strcmp(a, "err-bytes")) {
            put_bytes(2, atol(x), 0);
        } else if (!strcmp(a, "out-lines")) {
            fflush(stdout);
            put_bytes(1, atol(x), 1);
        } else if (!strcmp(a, "progress")) {
            int n = atoi(x);
            for (int k = 1; k <= n; k++) {
                printf("progress %d/%d\r", k, n);
                fflush(stdout);
            }
            printf("\n");
        } else if (!strcmp(a, "exit")) {
            fflush(stdout);
            exit(atoi(x));
        } else if (!strcmp(a, "signal")) {
            int s = signum(x);
            fflush(stdout);
            signal(s, SIG_DFL);
            sigset_t set;
            sigemptyset(&set);
            sigaddset(&set, s);
            sigprocmask(SIG_UNBLOCK, &set, NULL);
            raise(s);
            return 99;
        } else if (!strcmp(a, "ignore-term")) {
            signal(SIGTERM, SIG_IGN);
        } else if (!strcmp(a, "on-term")) {
            term_code = atoi(x);
            signal(SIGTERM, on_term);
        } else if (!strcmp(a, "trap")) {
            int s = signum(x);
            trap_file[s] = argv[i + 2];
            struct sigaction sa = {.sa_handler = on_trap};
            sigaction(s, &sa, NULL);
        } else if (!strcmp(a, "sleep")) {
            do_sleep(atof(x));
        } else if (!strcmp(a, "pause")) {
            for (;;)
                pause();
        } else if (!strcmp(a, "alloc")) {
            size_t n = (size_t)atol(x) << 20;
            char *p = malloc(n);
            for (size_t k = 0; p && k < n; k += 4096)
                p[k] = 1;
            if (!p)
                return 12;
        } else if (!strcmp(a, "grandchild")) {
            pid_t p = fork();
            if (p == 0) {
                char pid[32];
                snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
                write_file(x, pid, 0);
                for (;;)
                    pause();
            }
        } else if (!strcmp(a, "pidfile")) {
            char pid[32];
            snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
            write_file(x, pid, 0);
        } else if (!strcmp(a, "touch")) {
            write_file(x, "", 1);
        } else if (!strcmp(a, "wait-file")) {
            for (int k = 0; k < 3000 && access(x, F_OK) != 0; k++)
                do_sleep(0.01);
        } else if (!strcmp(a, "wait-exiting")) {
            for (int k = 0; k < 30000 && !exiting(x); k++)
                do_sleep(0.001);
        } else if (!strcmp(a, "stamp")) {
            struct timespec ts;
            char line[64];
            clock_gettime(CLOCK_MONOTONIC, &ts);
            snprintf(line, sizeof(line), "%lld\n",
                     (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
            write_file(x, line, 1);
        } else if (!strcmp(a, "error-json")) {
            error_json(x, 0);
        } else if (!strcmp(a, "error-json-str")) {
            error_json(x, 1);
        } else {
            fprintf(stderr, "fakeworker: unknown action '%s'\n", a);
            return 64;
        }
        i += nargs(a);
    }
    fflush(stdout);
    return 0;
}
