/* Python tracebacks of a worker's threads, as faulthandler writes them.
 * mglaunch starts Python workers with a sitecustomize of its own first on
 * PYTHONPATH (sitecustomize.py, built in): it registers faulthandler on
 * MG_PYTB_SIGNAL, writing into a memfd the agent lends the rank
 * (MG_PY_TRACEBACK_FD), then puts PYTHONPATH and sys.path back and runs
 * the sitecustomize Python would have run. On a hang, and for `mglaunch
 * dump`, the signal is sent (only to a process that caught it, so it never
 * kills one) and what faulthandler appends to the memfd is the traceback.
 * No ptrace, so it works where eu-stack and gdb are refused. */
#ifndef MG_PYTB_H
#define MG_PYTB_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* A real-time signal, whose default action would end the process: sent
 * only after /proc says faulthandler's handler catches it. */
#define MG_PYTB_SIGNAL     (SIGRTMAX - 3)
#define MG_PYTB_FD_ENV     "MG_PY_TRACEBACK_FD"
#define MG_PYTB_ENV        "MG_PY_TRACEBACK"
#define MG_PYTB_TIMEOUT_MS 2000       /* a traceback not written by then is given up */
#define MG_PYTB_TEXT_MAX   (1u << 20) /* what one traceback may take of a file */

/* The hook's directory (mkdtemp under tmpdir, "" or NULL: /tmp) with
 * sitecustomize.py in it, into dir. 0 or a negative errno. */
int mg_pytb_hook_create(const char *tmpdir, char *dir, size_t cap);
/* Removes it. */
void mg_pytb_hook_remove(const char *dir);

/* The worker's entries, malloc'd: "PYTHONPATH=<dir>[:<user's>]" and
 * "MG_PY_TRACEBACK=<signal>:<1 when the user had a PYTHONPATH>". 0 or
 * -ENOMEM. */
int mg_pytb_env(const char *dir, const char *user_pythonpath, char **pythonpath, char **spec);

/* Whether a program (argv[0] or the resolved path) is a Python interpreter
 * by its name: python, python3, python3.11, pypy3, ... */
int mg_pytb_is_python(const char *path);

/* One traceback being taken. */
struct mg_pytb_take {
    int fd;           /* the descriptor faulthandler writes to, as this process sees it */
    int pid;          /* the Python process */
    off_t start;      /* the file's size before the signal */
    off_t size;       /* its size at the last poll */
    int64_t since_ms; /* when size last changed */
    int64_t deadline_ms;
    int done;      /* 1 once poll said so */
    int rc;        /* 0: a traceback from start to size; else negative, why says why */
    char why[320]; /* why there is none */
};

/* Checks that pid will answer (its handler is installed, the signal is not
 * ignored nor blocked by every thread, it is not stopped nor in
 * uninterruptible sleep), then signals it. 0, or a negative code with why
 * in t->why (nothing sent). */
int mg_pytb_start(struct mg_pytb_take *t, int pid, int fd, int sig, int64_t now_ms);

/* 1 when the traceback is complete (nothing appended for 40 ms after a
 * whole line) or given up (t->rc, t->why), else 0. */
int mg_pytb_poll(struct mg_pytb_take *t, int64_t now_ms);

/* The traceback, a malloc'd string (NULL when none or out of memory). */
char *mg_pytb_text(const struct mg_pytb_take *t);

/* For `mglaunch dump`: a running worker's signal and descriptor from its
 * environment, the descriptor opened through /proc into *fd. 0, -ENOENT
 * when it has none (not a Python worker, or MG_PYTHON_TRACEBACKS=0), or a
 * negative errno. */
int mg_pytb_open(int pid, int *sig, int *fd);

#endif
