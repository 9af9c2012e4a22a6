/* Python tracebacks (launcher/watchdog/pytb.h) without Python: which
 * programs are Python, the workers' variables, the hook's directory, a
 * variable of another process's environment (procstate.h), and the signal
 * to real child processes: one whose handler writes as faulthandler would
 * (its text is taken whole, and only the new part), one that does not
 * catch it (never sent: its default action would kill it), one whose
 * Python said why it would not register, one that blocks it, one stopped.
 * timeout: 30 */
#include "procstate.h"
#include "pytb.h"
#include "tap.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void test_names(void)
{
    ok(mg_pytb_is_python("python3"), "python3 is Python");
    ok(mg_pytb_is_python("/usr/bin/python3.11"), "/usr/bin/python3.11 too");
    ok(mg_pytb_is_python("/opt/pypy3"), "and pypy3");
    ok(!mg_pytb_is_python("/usr/bin/python3-config"), "python3-config is not");
    ok(!mg_pytb_is_python("train"), "nor train");
}

static void test_env(void)
{
    char *pp, *spec, want[64];
    snprintf(want, sizeof(want), "MG_PY_TRACEBACK=%d:0", MG_PYTB_SIGNAL);
    is_int(mg_pytb_env("/h", NULL, &pp, &spec), 0, "no PYTHONPATH");
    is_str(pp, "PYTHONPATH=/h", "the hook's directory alone");
    is_str(spec, want, "the signal, and none to restore");
    free(pp);
    free(spec);
    snprintf(want, sizeof(want), "MG_PY_TRACEBACK=%d:1", MG_PYTB_SIGNAL);
    is_int(mg_pytb_env("/h", "", &pp, &spec), 0, "an empty PYTHONPATH");
    is_str(pp, "PYTHONPATH=/h", "no empty entry (Python would read it as the current directory)");
    is_str(spec, want, "but one to restore");
    free(pp);
    free(spec);
    is_int(mg_pytb_env("/h", "/a:/b", &pp, &spec), 0, "a user's PYTHONPATH");
    is_str(pp, "PYTHONPATH=/h:/a:/b", "comes after the hook");
    free(pp);
    free(spec);
}

static void test_hook(void)
{
    char dir[4096], path[4200], buf[8192];
    is_int(mg_pytb_hook_create(getenv("TMPDIR"), dir, sizeof(dir)), 0, "the hook's directory");
    snprintf(path, sizeof(path), "%s/sitecustomize.py", dir);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    ok(strstr(buf, "faulthandler.register(sig, file=fd, all_threads=True") != NULL,
       "holds the built-in sitecustomize.py");
    snprintf(path, sizeof(path), "%s/__pycache__", dir);
    ok(mkdir(path, 0700) == 0, "Python's bytecode cache in it");
    snprintf(path, sizeof(path), "%s/__pycache__/sitecustomize.cpython-311.pyc", dir);
    close(open(path, O_WRONLY | O_CREAT, 0644));
    mg_pytb_hook_remove(dir);
    ok(access(dir, F_OK) != 0, "removed, with the cache");
}

static volatile int handler_fd = -1;

/* What faulthandler does: the tracebacks written from the handler. */
static void fake_faulthandler(int sig)
{
    static const char a[] = "Thread 0x1 (most recent call first):\n", b[] = "  File x\n";
    (void)sig;
    if (write(handler_fd, a, sizeof(a) - 1) < 0 || write(handler_fd, b, sizeof(b) - 1) < 0)
        _exit(3);
}

/* A child that sleeps: how = 0 no handler, 1 the handler, 2 the handler
 * with the signal blocked. */
static pid_t child(int how, int fd)
{
    int p[2];
    char c;
    if (pipe(p) < 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        handler_fd = fd;
        if (how >= 1)
            signal(MG_PYTB_SIGNAL, fake_faulthandler);
        if (how == 2) {
            sigset_t s;
            sigemptyset(&s);
            sigaddset(&s, MG_PYTB_SIGNAL);
            sigprocmask(SIG_BLOCK, &s, NULL);
        }
        c = 'r';
        if (write(p[1], &c, 1) < 0)
            _exit(1);
        for (;;)
            pause();
    }
    close(p[1]);
    if (read(p[0], &c, 1) != 1)
        pid = -1;
    close(p[0]);
    return pid;
}

static void reap(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static void test_signal(void)
{
    char tmpl[] = "/tmp/pytb-XXXXXX";
    int fd = mkstemp(tmpl);
    struct mg_pytb_take t;
    unlink(tmpl);
    ok(write(fd, "earlier\n", 8) == 8, "an earlier traceback in the file");

    pid_t p = child(1, fd);
    is_int(mg_pytb_start(&t, p, fd, MG_PYTB_SIGNAL, now_ms()), 0, "a catching process: signalled");
    int64_t end = now_ms() + 5000;
    while (!mg_pytb_poll(&t, now_ms()) && now_ms() < end)
        usleep(5000);
    is_int(t.rc, 0, "its traceback came");
    char *text = mg_pytb_text(&t);
    is_str(text, "Thread 0x1 (most recent call first):\n  File x\n",
           "whole, and only the new part");
    free(text);
    kill(p, SIGSTOP);
    waitpid(p, NULL, WUNTRACED);
    is_int(mg_pytb_start(&t, p, fd, MG_PYTB_SIGNAL, now_ms()), -EAGAIN, "a stopped process: not");
    ok(strstr(t.why, "stopped") != NULL, "because it is stopped: %s", t.why);
    reap(p);

    p = child(0, fd);
    is_int(mg_pytb_start(&t, p, fd, MG_PYTB_SIGNAL, now_ms()), -ENOTSUP,
           "a process that does not catch it: not signalled");
    ok(strstr(t.why, "does not catch") != NULL, "says why: %s", t.why);
    usleep(50000);
    is_int(waitpid(p, NULL, WNOHANG), 0, "and it lives");
    reap(p);

    /* what the hook wrote at startup when faulthandler would not register
     * (a Python other than CPython): the line says that instead */
    char tmpl2[] = "/tmp/pytb-XXXXXX";
    int said = mkstemp(tmpl2);
    unlink(tmpl2);
    static const char line[] =
        "mglaunch: no Python tracebacks: pypy: AttributeError: no register\n";
    ok(write(said, line, sizeof(line) - 1) == (ssize_t)(sizeof(line) - 1), "a hook's refusal");
    p = child(0, said);
    is_int(mg_pytb_start(&t, p, said, MG_PYTB_SIGNAL, now_ms()), -ENOTSUP,
           "a Python whose faulthandler would not register: not signalled");
    is_str(t.why, "no Python tracebacks: pypy: AttributeError: no register",
           "the hook's own words say why");
    reap(p);
    close(said);

    p = child(2, fd);
    is_int(mg_pytb_start(&t, p, fd, MG_PYTB_SIGNAL, now_ms()), -EAGAIN, "one that blocks it: not");
    ok(strstr(t.why, "blocks") != NULL, "says why: %s", t.why);
    reap(p);
    close(fd);
}

static void test_procenv(void)
{
    char val[64];
    pid_t p = fork();
    if (p == 0) {
        char *argv[] = {"sleep", "30", NULL};
        char *envp[] = {"A=1", "MG_X=hello", "MG_XY=no", NULL};
        execve("/bin/sleep", argv, envp);
        _exit(127);
    }
    /* until the exec has replaced the environment */
    int rc = -1;
    for (int i = 0; i < 1000 && rc; i++) { /* up to 10 s on a loaded machine */
        rc = mg_procenv_get(p, "MG_X", val, sizeof(val));
        if (rc)
            usleep(10000);
    }
    is_int(rc, 0, "a variable of another process");
    is_str(val, "hello", "its value");
    is_int(mg_procenv_get(p, "MG_Z", val, sizeof(val)), -ENOENT, "a missing one: -ENOENT");
    is_int(mg_procenv_get(p, "MG_X", val, 3), -ENAMETOOLONG, "too long for the buffer: said");
    reap(p);
}

int main(void)
{
    test_names();
    test_env();
    test_hook();
    test_signal();
    test_procenv();
    return done_testing();
}
