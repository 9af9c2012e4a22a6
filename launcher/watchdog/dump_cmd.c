/* `mglaunch dump` (see dump_cmd.h). */
#include "dump_cmd.h"
#include "events.h"
#include "logdir.h"
#include "logs_internal.h"
#include "mg_err.h"
#include "net.h"
#include "proc.h"
#include "procstate.h"
#include "pytb.h"
#include "progress_rec.h"
#include "stacks.h"
#include "summary.h"
#include "watchdog.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

static const char usage[] =
    "usage: mglaunch dump [LOG_DIR] [--run ID]\n"
    "Prints, and saves in the attempt's directory (<local_rank>/dump-<time>.txt), what every\n"
    "local rank of a running job is doing: its step and phase, its last collectives, and the\n"
    "stack of every thread (eu-stack or gdb), without stopping the job. The newest run of\n"
    "LOG_DIR by default; LOG_DIR defaults to mglaunch's private directory\n"
    "${TMPDIR:-/tmp}/mglaunch-<uid>.\n";

/* The progress record of a running worker, read through /proc: the
 * descriptor MG_PROGRESS_FD names in its environment. 0, or a negative code. */
static int read_record(int pid, struct mg_progress *rec)
{
    char path[64], val[32];
    int rc = mg_procenv_get(pid, "MG_PROGRESS_FD", val, sizeof(val));
    if (rc == -ENAMETOOLONG)
        rc = -ENOENT;
    if (rc < 0)
        return rc;
    long num = strtol(val, NULL, 10);
    if (num < 3)
        return -ENOENT;
    mg_fmt(path, sizeof(path), "/proc/%d/fd/%ld", pid, num);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t r = pread(fd, rec, sizeof(*rec), 0);
    close(fd);
    /* a libmg program started by a wrapper that did not exec: the record is
     * its own, in the worker's process group (as the agent's watchdog takes it) */
    if (r != (ssize_t)sizeof(*rec) || rec->magic != MG_PROGRESS_MAGIC ||
        (rec->pid != pid && getpgid(rec->pid) != pid))
        return -ENODATA;
    return 0;
}

/* A Python worker's traceback of every thread (pytb.h): the section of its
 * dump file, malloc'd; NULL for a worker that is not Python. */
static char *python_traceback(int pid)
{
    struct mg_pytb_take t;
    int sig, fd, rc = mg_pytb_open(pid, &sig, &fd);
    char *text = NULL, *out = NULL;
    if (rc == -ENOENT)
        return NULL;
    if (rc < 0) {
        if (asprintf(&out, "# no Python traceback: cannot open its traceback memory: %s\n",
                     mg_strerror(rc)) < 0)
            return NULL;
        return out;
    }
    if (mg_pytb_start(&t, pid, fd, sig, mg_now_ms()) == 0) {
        while (!mg_pytb_poll(&t, mg_now_ms()))
            usleep(10000);
        text = mg_pytb_text(&t);
    }
    close(fd);
    if (text)
        rc = asprintf(&out, "# Python threads, by faulthandler:\n%s", text);
    else
        rc = asprintf(&out, "# no Python traceback: %s\n", t.why);
    free(text);
    return rc < 0 ? NULL : out;
}

static void describe(FILE *f, const struct lworker *w)
{
    struct mg_progress rec;
    struct mg_procstate ps;
    char st[160], ct[128], where[96];
    mg_procstate_read(NULL, w->pid, &ps);
    fprintf(f, "rank %d (local rank %d, pid %d): %s\n", w->rank, w->local_rank, w->pid,
            mg_procstate_text(&ps, st, sizeof(st)));
    int rc = read_record(w->pid, &rec);
    int64_t now_us = mg_now_us();
    if (rc < 0) {
        fprintf(f, "  no progress record (%s: not a libmg program, or --hang-timeout 0)\n",
                mg_strerror(rc));
        return;
    }
    fprintf(f, "  in %s for %.1f s; last progress %.1f s ago\n",
            mg_progress_where(&rec, where, sizeof(where)), (double)(now_us - rec.phase_us) / 1e6,
            (double)(now_us - rec.beat_us) / 1e6);
    const struct mg_progress_coll *in = mg_watch_waiting(&rec);
    uint64_t done = mg_progress_last_done(&rec);
    if (in)
        fprintf(f, "  inside %s since %.1f s\n", mg_watch_coll_text(in, ct, sizeof(ct)),
                (double)(now_us - in->start_us) / 1e6);
    fprintf(f, "  last finished collective: ");
    const struct mg_progress_coll *d = mg_progress_coll_find(&rec, done);
    if (d)
        fprintf(f, "%s, %.1f ms, %.1f s ago\n", mg_watch_coll_text(d, ct, sizeof(ct)),
                (double)(d->end_us - d->start_us) / 1e3, (double)(now_us - d->end_us) / 1e6);
    else
        fprintf(f, "none\n");
}

int mg_dump_main(int argc, char **argv, FILE *out, char *err, size_t errcap)
{
    const char *dir = NULL, *run = NULL;
    char defdir[PATH_MAX], buf[PATH_MAX], ts[64], stamp[32];
    struct lrun r;
    int rc;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage, out);
            return 0;
        } else if (!strcmp(argv[i], "--run") && i + 1 < argc) {
            run = argv[++i];
        } else if (!strncmp(argv[i], "--run=", 6)) {
            run = argv[i] + 6;
        } else if (argv[i][0] != '-' && !dir) {
            dir = argv[i];
        } else {
            return mg_seterr(err, errcap, -EINVAL,
                             "unknown argument '%s' (see mglaunch dump --help)", argv[i]);
        }
    }
    if (!dir) {
        if ((rc = mg_logdir_default(defdir, sizeof(defdir))))
            return mg_seterr(err, errcap, rc, "cannot use the default log directory '%s': %s",
                             defdir, mg_strerror(rc));
        dir = defdir;
    }
    if (!run) {
        struct run_ent *runs = NULL;
        int n = 0;
        if ((rc = mg_logs_runs(dir, &runs, &n, err, errcap)))
            return rc;
        mg_fmt(buf, sizeof(buf), "%s", runs[n - 1].id);
        free(runs);
        run = buf;
    } else {
        char rb[PATH_MAX];
        run = mg_logs_resolve_run(dir, run, rb, sizeof(rb));
        mg_fmt(buf, sizeof(buf), "%s", run);
        run = buf;
    }
    if ((rc = mg_logs_load_run(&r, dir, run)))
        return mg_seterr(err, errcap, rc, "cannot read the run '%s' in '%s': %s", run, dir,
                         mg_strerror(rc));
    if (!r.has_events || r.ended || !mg_logs_launcher_alive(&r) || r.na == 0) {
        fprintf(out, "mglaunch dump: run %s in %s is not running (its mglaunch %s)\n", r.id, dir,
                r.ended ? "has ended" : "is gone");
        mg_logs_run_free(&r);
        return 1;
    }
    const struct lattempt *a = &r.a[r.na - 1];
    struct mg_stack_tool tool;
    int have_tool = mg_stacks_find(getenv("PATH"), &tool) == 0;
    int64_t wall = mg_wall_ms();
    mg_format_time_ms(wall, ts, sizeof(ts));
    /* a second dump within the same second gets "-2", "-3": files are
     * never overwritten */
    for (int k = 1; k < 1000; k++) {
        char probe[PATH_MAX + 64];
        int taken = 0;
        if (k == 1)
            mg_fmt(stamp, sizeof(stamp), "%lld", (long long)(wall / 1000));
        else
            mg_fmt(stamp, sizeof(stamp), "%lld-%d", (long long)(wall / 1000), k);
        for (int i = 0; i < a->nw && !taken; i++) {
            mg_fmt(probe, sizeof(probe), "%s/attempt_%d/%d/dump-%s.txt", r.dir, a->attempt,
                   a->w[i].local_rank, stamp);
            taken = access(probe, F_OK) == 0;
        }
        if (!taken)
            break;
    }
    fprintf(out, "run %s, attempt %d, host %s, at %s\n", r.id, a->attempt, r.host, ts);
    if (!have_tool)
        fprintf(out, "(no stacks: neither eu-stack (Debian's elfutils) nor gdb is installed)\n");
    for (int i = 0; i < a->nw; i++) {
        const struct lworker *w = &a->w[i];
        if (w->exited || w->pid <= 0)
            continue;
        char path[PATH_MAX + 64];
        char *text = NULL;
        size_t tlen = 0;
        FILE *mem = open_memstream(&text, &tlen);
        if (!mem)
            continue;
        describe(mem, w);
        fclose(mem);
        fputs(text, out);
        mg_fmt(path, sizeof(path), "%s/attempt_%d/%d/dump-%s.txt", r.dir, a->attempt, w->local_rank,
               stamp);
        char *py = python_traceback(w->pid), *head = NULL;
        if (asprintf(&head, "# mglaunch dump at %s\n%s%s# stacks, %s\n", ts, text, py ? py : "",
                     have_tool ? (tool.gdb ? "by gdb -batch" : "by eu-stack") : "none: no tool") <
            0)
            head = NULL;
        free(text);
        free(py);
        if (!head)
            continue;
        pid_t child;
        if (!have_tool) {
            int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
            if (fd >= 0) {
                mg_write_full(fd, head, strlen(head), -1);
                close(fd);
            }
        } else if ((rc = mg_stacks_start(&tool, w->pid, path, head, environ, &child)) < 0) {
            fprintf(out, "  cannot take its stack into %s: %s\n", path, mg_strerror(rc));
            free(head);
            continue;
        } else {
            int64_t dl = mg_now_ms() + MG_STACKS_TIMEOUT_MS;
            while (!mg_stacks_done(child) && mg_now_ms() < dl)
                usleep(10000);
            if (!mg_stacks_done(child)) {
                kill(-child, SIGKILL);
                fprintf(out, "  its stack took over %d s: given up\n", MG_STACKS_TIMEOUT_MS / 1000);
            }
            char why[200];
            if (mg_stacks_check(path, why, sizeof(why)) < 0)
                fprintf(out, "  no stack: %s\n", why);
        }
        free(head);
        /* the stacks, as saved */
        FILE *f = fopen(path, "r");
        char line[1024];
        int in_stacks = 0, seen_py = 0;
        while (f && fgets(line, sizeof(line), f)) {
            int pyl = !strncmp(line, "# Python", 8) || !strncmp(line, "# no Python", 11);
            int nat = !strncmp(line, "# stacks", 8);
            seen_py |= pyl;
            in_stacks |= pyl || nat;
            if (in_stacks && (!nat || seen_py)) /* the native part named after a Python one */
                fprintf(out, "  %s", line);
        }
        if (f)
            fclose(f);
        fprintf(out, "  saved in %s\n", path);
    }
    mg_logs_run_free(&r);
    fflush(out);
    return 0;
}
