/* `mglaunch logs`: its options, and the printing of runs, attempts and ranks
 * with the root cause (see logs_cmd.h, docs/logs.md). Reading a run is
 * logs_read.c's, finding and filtering the runs logs_runs.c's, printing the
 * log files themselves logs_follow.c's. */
#include "logs_cmd.h"
#include "fs.h"
#include "logs_internal.h"
#include "events.h"
#include "logdir.h"
#include "mg_err.h"
#include "proc.h"
#include "output.h"
#include "summary.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- options ------------------------------------------------------------------------ */

static const char logs_usage[] =
    "usage: mglaunch logs [LOG_DIR] [PROGRAM] [--cmd TEXT] [--run ID] [--attempt N|last|all]\n"
    "                     [--rank R[,R...]] [--stream stdout|stderr|both] [--tail N] [--follow]\n"
    "                     [--grep REGEX]\n"
    "       mglaunch logs [LOG_DIR] [PROGRAM] [--cmd TEXT] [--run ID] [--attempt N|last|all]\n"
    "                     --plot FILE.svg\n"
    "       mglaunch logs [LOG_DIR] [PROGRAM] [--cmd TEXT] [--run ID] --schedule\n"
    "Without selectors: lists the runs in LOG_DIR with their commands, the attempts and ranks\n"
    "of the latest run (or --run), and its root cause. PROGRAM (ddp.py, ddp, train, a -m\n"
    "module) and --cmd TEXT (text in the command) keep only the runs that match, and the\n"
    "latest of those is the one shown. With --rank/--stream/--tail/--follow/--grep: prints the\n"
    "log lines of the last attempt (or --attempt). --plot draws the run's loss and accuracy\n"
    "(train's metrics of every attempt, or --attempt's) into FILE.svg (- for stdout).\n"
    "--schedule prints which steps ran at which world size and where each attempt went on\n"
    "from (scripts/replay.sh replays it).\n"
    "LOG_DIR defaults to mglaunch's private directory ${TMPDIR:-/tmp}/mglaunch-<uid>.\n";

static int parse_long(const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < min || v > max)
        return -EINVAL;
    *out = v;
    return 0;
}

static int parse_logs_opts(struct logs_opts *lo, int argc, char **argv, char *err, size_t cap)
{
    memset(lo, 0, sizeof(*lo));
    lo->attempt = -1;
    lo->streams = 3;
    lo->tail = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        char name[32];
        if (a[0] != '-') { /* [LOG_DIR] [PROGRAM] */
            if (lo->program)
                return mg_seterr(err, cap, -EINVAL, "unexpected argument '%s'", a);
            if (lo->dir)
                lo->program = a;
            else
                lo->dir = a;
            continue;
        }
        const char *body = a + (a[1] == '-' ? 2 : 1), *eq = strchr(body, '=');
        size_t n = eq ? (size_t)(eq - body) : strlen(body);
        if (n >= sizeof(name))
            return mg_seterr(err, cap, -EINVAL, "unknown option '%s'", a);
        for (size_t k = 0; k < n; k++)
            name[k] = body[k] == '-' ? '_' : body[k];
        name[n] = '\0';
        if (eq)
            val = eq + 1;
        int flag = !strcmp(name, "follow") || !strcmp(name, "f") || !strcmp(name, "help") ||
                   !strcmp(name, "h") || !strcmp(name, "schedule");
        if (flag) {
            if (val)
                return mg_seterr(err, cap, -EINVAL, "option %s takes no value", a);
            if (name[0] == 'f')
                lo->follow = lo->content = 1;
            else if (name[0] == 's')
                lo->schedule = 1;
            else
                lo->help = 1;
            continue;
        }
        static const char *const valued[] = {"run", "attempt", "rank", "stream", "tail",
                                             "n",   "grep",    "plot", "cmd"};
        int known = 0;
        for (size_t k = 0; k < sizeof(valued) / sizeof(valued[0]); k++)
            known |= !strcmp(name, valued[k]);
        if (!known)
            return mg_seterr(err, cap, -EINVAL, "unknown option '%s' (see mglaunch logs --help)",
                             a);
        if (!val) {
            if (i + 1 >= argc)
                return mg_seterr(err, cap, -EINVAL, "option %s needs a value", a);
            val = argv[++i];
        }
        long v;
        if (!strcmp(name, "run")) {
            lo->run = val;
        } else if (!strcmp(name, "attempt")) {
            lo->attempt_given = 1;
            if (!strcmp(val, "all"))
                lo->attempt = -2;
            else if (!strcmp(val, "last"))
                lo->attempt = -1;
            else if (parse_long(val, 0, MG_ATTEMPT_MAX, &v) == 0)
                lo->attempt = (int)v;
            else
                return mg_seterr(err, cap, -EINVAL,
                                 "invalid value '%s' for --attempt: expected a number, last or all",
                                 val);
        } else if (!strcmp(name, "rank")) {
            lo->content = 1;
            const char *p = val;
            while (*p) {
                char num[16];
                size_t k = strcspn(p, ",");
                if (k == 0 || k >= sizeof(num) || lo->nranks >= 256)
                    return mg_seterr(err, cap, -EINVAL,
                                     "invalid value '%s' for --rank: expected ranks "
                                     "like 0 or 0,3",
                                     val);
                memcpy(num, p, k);
                num[k] = '\0';
                if (parse_long(num, 0, 1000000000, &v))
                    return mg_seterr(err, cap, -EINVAL,
                                     "invalid value '%s' for --rank: expected ranks "
                                     "like 0 or 0,3",
                                     val);
                lo->ranks[lo->nranks++] = (int)v;
                p += k + (p[k] == ',');
            }
        } else if (!strcmp(name, "stream")) {
            lo->content = 1;
            if (!strcmp(val, "stdout") || !strcmp(val, "out") || !strcmp(val, "1"))
                lo->streams = 1;
            else if (!strcmp(val, "stderr") || !strcmp(val, "err") || !strcmp(val, "2"))
                lo->streams = 2;
            else if (!strcmp(val, "both") || !strcmp(val, "all") || !strcmp(val, "3"))
                lo->streams = 3;
            else
                return mg_seterr(err, cap, -EINVAL,
                                 "invalid value '%s' for --stream: expected stdout, stderr or both",
                                 val);
        } else if (!strcmp(name, "tail") || !strcmp(name, "n")) {
            lo->content = 1;
            if (parse_long(val, 0, 1000000000, &lo->tail))
                return mg_seterr(err, cap, -EINVAL,
                                 "invalid value '%s' for --tail: expected a number of lines", val);
        } else if (!strcmp(name, "grep")) {
            lo->content = 1;
            lo->grep = val;
        } else if (!strcmp(name, "cmd")) {
            lo->cmd = val;
        } else if (!strcmp(name, "plot")) {
            if (!*val)
                return mg_seterr(err, cap, -EINVAL, "--plot needs a file name");
            lo->plot = val;
        }
    }
    /* One argument that is no directory and no path: a program name, in
     * the default directory (`mglaunch logs ddp.py`, also where ddp.py is). */
    struct stat st;
    if (lo->dir && !lo->program && !strchr(lo->dir, '/') &&
        (stat(lo->dir, &st) < 0 || !S_ISDIR(st.st_mode))) {
        lo->program = lo->dir;
        lo->dir = NULL;
        lo->program_only = 1;
    }
    if (lo->schedule && (lo->plot || lo->content || lo->attempt_given))
        return mg_seterr(err, cap, -EINVAL,
                         "--schedule prints a whole run's schedule; it does not go with --plot, "
                         "--attempt, --rank, --stream, --tail, --grep or --follow");
    if (lo->plot && lo->content)
        return mg_seterr(err, cap, -EINVAL,
                         "--plot draws metrics; it does not go with --rank, --stream, --tail, "
                         "--grep or --follow");
    return 0;
}

/* ---- printing ------------------------------------------------------------------------ */

void mg_logs_worker_state(const struct lrun *r, const struct lworker *w, char *buf, size_t cap)
{
    char dur[32];
    if (!w->exited) {
        if (r->alive)
            mg_fmt(buf, cap, "running");
        else if (!r->has_events)
            mg_fmt(buf, cap, "no error file");
        else if (w->pid)
            mg_fmt(buf, cap, "no exit recorded (launcher died)");
        else
            mg_fmt(buf, cap, "unknown");
        return;
    }
    mg_format_duration_ms(w->duration_ms, dur, sizeof(dur));
    if (w->from_errfile)
        mg_fmt(buf, cap, "failed (error.json)%s", w->exit_code > 0 ? "" : ", exit code unknown");
    else if (w->exec_error[0])
        mg_fmt(buf, cap, "failed: could not be executed (%s), exit %d", w->exec_error,
               w->exit_code);
    else if (w->oom[0])
        mg_fmt(buf, cap, "%s: killed by the kernel's OOM killer, out of memory (exit %d) after %s",
               w->outcome, w->exit_code, dur);
    else if (w->signal[0])
        mg_fmt(buf, cap, "%s: killed by %s (exit %d) after %s", w->outcome, w->signal, w->exit_code,
               dur);
    else
        mg_fmt(buf, cap, "%s: exit %d after %s", w->outcome, w->exit_code, dur);
}

/* The last lines of a worker's stderr.log, as the agent keeps them in memory. */
static void stderr_tail(const char *path, char *out, size_t cap)
{
    char buf[MG_STDERR_TAIL_BYTES];
    int fd = mg_open_regular(path);
    out[0] = '\0';
    if (fd < 0)
        return;
    off_t end = lseek(fd, 0, SEEK_END);
    off_t from = end > (off_t)sizeof(buf) ? end - (off_t)sizeof(buf) : 0;
    ssize_t n = end > 0 ? pread(fd, buf, sizeof(buf), from) : 0;
    close(fd);
    if (n > 0)
        mg_tail_lines(buf, (size_t)n, from > 0, MG_STDERR_TAIL_LINES, out, cap);
}

static int exists(const char *dir, const char *name)
{
    char p[PATH_MAX + 96];
    struct stat st;
    mg_fmt(p, sizeof(p), "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

/* The root cause as the end-of-run summary had it, from what the run left
 * on disk: the event log's record (or, when the launcher died, its first
 * failed worker), the error file and the stderr.log of that worker. */
static void root_cause_of(const struct lrun *r, const struct lroot *x, struct mg_root_cause *rc)
{
    const struct lattempt *a = NULL;
    memset(rc, 0, sizeof(*rc));
    for (int i = 0; i < r->na; i++)
        if (r->a[i].attempt == x->attempt)
            a = &r->a[i];
    rc->f.attempt = x->attempt;
    rc->f.restart_count = a ? a->restart_count : 0;
    rc->f.rank = x->rank;
    rc->f.local_rank = x->local_rank;
    rc->f.pid = x->pid;
    rc->f.exit_code = x->exit_code;
    rc->f.signo = x->signal[0] && mg_signum(x->signal) > 0 ? mg_signum(x->signal) : 0;
    rc->f.wall_ms = x->time_ms;
    rc->exit_unknown = x->exit_unknown;
    const struct lworker *lw = NULL;
    for (int k = 0; a && k < a->nw; k++)
        if (a->w[k].local_rank == x->local_rank) {
            lw = &a->w[k];
            mg_fmt(rc->exec_error, sizeof(rc->exec_error), "%s", lw->exec_error);
            mg_fmt(rc->f.oom, sizeof(rc->f.oom), "%s", lw->oom);
        }
    mg_fmt(rc->host, sizeof(rc->host), "%s", x->host);
    mg_fmt(rc->log_path, sizeof(rc->log_path), "%s/attempt_%d/%d", r->dir, x->attempt,
           x->local_rank);
    mg_fmt(rc->error_file, sizeof(rc->error_file), "%s/error.json", rc->log_path);
    if (mg_root_cause_errfile(rc) < 0)
        mg_fmt(rc->message, sizeof(rc->message), "%s", x->message);
    char sp[PATH_MAX + 96];
    mg_fmt(sp, sizeof(sp), "%s/stderr.log", rc->log_path);
    stderr_tail(sp, rc->stderr_tail, sizeof(rc->stderr_tail));
    rc->logs_saved = exists(rc->log_path, "stdout.log") || exists(rc->log_path, "stderr.log");
    if (lw && lw->logs_known) { /* what the launcher recorded of its output */
        rc->stderr_kept = 1;
        mg_event_logs_note(lw->out_log, lw->err_log, rc->logs_note, sizeof(rc->logs_note));
        /* Not saved, or cut short: the file lacks the end the launcher kept. */
        if (lw->stderr_tail && strcmp(lw->err_log, "saved") != 0)
            mg_fmt(rc->stderr_tail, sizeof(rc->stderr_tail), "%s", lw->stderr_tail);
    }
}

int mg_logs_print_root(FILE *out, const struct lrun *r)
{
    /* A run that ended said whether it had a root cause (a failure that was
     * a stop's has none); without run_end, the first failed worker. */
    const struct lroot *x = r->has_root                      ? &r->root
                            : !r->ended && r->has_first_fail ? &r->first_fail
                                                             : NULL;
    struct mg_root_cause *rc;
    if (r->remote.set) /* the job's root cause, on another node */
        mg_remote_cause_print(out, &r->remote);
    if (!x || !(rc = malloc(sizeof(*rc))))
        return r->remote.set;
    root_cause_of(r, x, rc);
    mg_root_cause_print(out,
                        r->remote.set ? MG_FOLLOWED_HEADING
                        : r->ended && strcmp(r->result, "succeeded") == 0
                            ? "First failure (the run recovered from it):"
                            : "Root cause (first failure):",
                        rc);
    free(rc);
    return 1;
}

/* The stacks the watchdog took of a hung job (stacks.txt) and those of
 * `mglaunch dump` (dump-<time>.txt) in a worker's directory. */
static void print_stacks(FILE *out, const struct lrun *r, const struct lattempt *a,
                         const struct lworker *w)
{
    char d[PATH_MAX + 64];
    mg_fmt(d, sizeof(d), "%s/attempt_%d/%d", r->dir, a->attempt, w->local_rank);
    DIR *dp = opendir(d);
    struct dirent *e;
    while (dp && (e = readdir(dp))) {
        if (strcmp(e->d_name, "stacks.txt") == 0)
            fprintf(out, "      stacks (the watchdog's): %s/%s\n", d, e->d_name);
        else if (strncmp(e->d_name, "dump-", 5) == 0)
            fprintf(out, "      mglaunch dump: %s/%s\n", d, e->d_name);
    }
    if (dp)
        closedir(dp);
}

static void print_run_detail(FILE *out, const struct lrun *r, int only_attempt)
{
    char st[128], t[64], dur[32];
    mg_logs_run_status(r, st, sizeof(st));
    fprintf(out, "run %s (%s)\n", r->id, r->dir);
    if (r->torchrun)
        fprintf(out,
                "  a torchrun log directory: run id %s; torchrun keeps no event log, so its error "
                "files alone say which workers failed\n",
                r->torchrun_id);
    else if (!r->has_events)
        fprintf(out, "  no event log: the error files alone say which workers failed\n");
    if (r->has_events) {
        mg_format_time_ms(r->start_ms, t, sizeof(t));
        fprintf(out, "  launcher pid %d on %s, started %s, %s\n", r->pid, r->host, t, st);
        if (r->error[0])
            fprintf(out, "  launcher error: %s\n", r->error);
    }
    for (int i = 0; i < r->na; i++) {
        const struct lattempt *a = &r->a[i];
        if (only_attempt >= 0 && a->attempt != only_attempt)
            continue;
        if (a->start_ms)
            mg_format_time_ms(a->start_ms, t, sizeof(t));
        else
            mg_fmt(t, sizeof(t), "?");
        mg_format_duration_ms(a->duration_ms, dur, sizeof(dur));
        if (!r->has_events)
            fprintf(out, "  attempt %d (restart %d), directory from %s: %s\n", a->attempt,
                    a->restart_count, t, a->ended ? a->result : "no error file");
        else
            fprintf(out, "  attempt %d (restart %d), started %s: %s%s%s\n", a->attempt,
                    a->restart_count, t,
                    a->ended   ? a->result
                    : r->alive ? "running"
                               : "not finished",
                    a->ended ? " after " : "", a->ended ? dur : "");
        for (int k = 0; k < a->nw; k++) {
            const struct lworker *w = &a->w[k];
            char ws[200];
            mg_logs_worker_state(r, w, ws, sizeof(ws));
            char pid[16];
            mg_fmt(pid, sizeof(pid), w->pid ? "%d" : "?", w->pid);
            fprintf(out, "    local rank %-3d rank %-4d pid %-7s %s%s%s%s\n", w->local_rank,
                    w->rank, pid, ws, w->message[0] ? " \"" : "", w->message,
                    w->message[0] ? "\"" : "");
            print_stacks(out, r, a, w);
            char note[256];
            mg_event_logs_note(w->out_log, w->err_log, note, sizeof(note));
            if (note[0])
                fprintf(out, "      %s\n", note);
        }
    }
}

static int do_list(FILE *out, const struct logs_opts *lo, const char *dir, char *err, size_t cap)
{
    struct run_ent *runs = NULL;
    struct lrun r;
    int n = 0, rc = mg_logs_runs_matching(dir, lo, &runs, &n, err, cap);
    if (rc)
        return rc;
    memset(&r, 0, sizeof(r));
    char given[256];
    const char *sel =
        lo->run ? mg_logs_resolve_run(dir, lo->run, given, sizeof(given)) : runs[n - 1].id;
    fprintf(out, "  %-34s %-23s %-28s %-8s %s\n", "RUN", "STARTED", "STATUS", "ATTEMPTS",
            "COMMAND");
    int found = 0;
    for (int i = 0; i < n; i++) {
        char st[128], t[64];
        if (mg_logs_load_run(&r, dir, runs[i].id))
            continue;
        mg_logs_run_status(&r, st, sizeof(st));
        mg_format_time_ms(r.start_ms, t, sizeof(t));
        t[19] = '\0';
        int is_sel = strcmp(runs[i].id, sel) == 0;
        found |= is_sel;
        char cmd[128];
        mg_logs_command_column(r.cmd, 60, cmd, sizeof(cmd));
        fprintf(out, "%c %-34s %-23s %-28s %-8d %s\n", is_sel ? '*' : ' ', runs[i].id, t, st, r.na,
                cmd);
    }
    fprintf(out, "\n");
    if (!found) {
        mg_logs_run_free(&r);
        free(runs);
        mg_fmt(err, cap, "no run '%s' in '%s'", sel, dir);
        return -ENOENT;
    }
    rc = mg_logs_load_run(&r, dir, sel);
    if (rc == 0) {
        if (lo->attempt_given && lo->attempt >= 0 && !mg_logs_find_attempt(&r, lo->attempt, 0)) {
            mg_fmt(err, cap, "no attempt %d in run '%s'", lo->attempt, sel);
            rc = -ENOENT;
        } else {
            int only = lo->attempt_given && lo->attempt >= 0            ? lo->attempt
                       : lo->attempt_given && lo->attempt == -1 && r.na ? r.a[r.na - 1].attempt
                                                                        : -1;
            print_run_detail(out, &r, only);
            mg_logs_print_root(out, &r);
        }
    }
    mg_logs_run_free(&r);
    free(runs);
    return rc;
}

int mg_logs_main(int argc, char **argv, FILE *out, char *err, size_t errcap)
{
    struct logs_opts lo;
    char defdir[PATH_MAX];
    int rc = parse_logs_opts(&lo, argc, argv, err, errcap);
    if (rc)
        return rc;
    if (lo.help) {
        fputs(logs_usage, out);
        return 0;
    }
    const char *dir = lo.dir;
    if (!dir) {
        if ((rc = mg_logdir_default(defdir, sizeof(defdir)))) {
            mg_fmt(err, errcap, "cannot use the default log directory '%s': %s", defdir,
                   mg_strerror(rc));
            return rc;
        }
        dir = defdir;
    }
    rc = lo.schedule  ? mg_logs_schedule(out, &lo, dir, err, errcap)
         : lo.plot    ? mg_logs_plot(out, &lo, dir, err, errcap)
         : lo.content ? mg_logs_content(out, &lo, dir, err, errcap)
                      : do_list(out, &lo, dir, err, errcap);
    /* No run of that program: the argument may have been meant as LOG_DIR. */
    if (rc == -ENOENT && lo.program_only && strncmp(err, "no run of program", 17) == 0)
        mg_fmt(err, errcap, "no directory '%s', and no run of program '%s' in '%s'", lo.program,
               lo.program, dir);
    fflush(out);
    return rc == -ENOENT ? (err[0] ? -ENOENT : 1) : rc;
}
