/* The end-of-run failure summary and the root-cause block that `mglaunch logs`
 * prints too (see summary.h). */
#include "summary.h"
#include "errfile.h"
#include "mg_err.h"
#include "proc.h"

#include <errno.h>
#include <string.h>
#include <time.h>

void mg_format_time_ms(int64_t wall_ms, char *buf, size_t cap)
{
    time_t t = (time_t)(wall_ms / 1000);
    struct tm tm;
    char s[32];
    localtime_r(&t, &tm);
    strftime(s, sizeof(s), "%Y-%m-%d %H:%M:%S", &tm);
    mg_fmt(buf, cap, "%s.%03d", s, (int)(wall_ms % 1000));
}

void mg_format_duration_ms(int64_t ms, char *buf, size_t cap)
{
    if (ms < 0)
        ms = 0;
    if (ms < 1000)
        mg_fmt(buf, cap, "%lld ms", (long long)ms);
    else if (ms < 60000)
        mg_fmt(buf, cap, "%.1f s", (double)ms / 1000.0);
    else if (ms < 3600000)
        mg_fmt(buf, cap, "%lldm%02llds", (long long)(ms / 60000), (long long)(ms / 1000 % 60));
    else
        mg_fmt(buf, cap, "%lldh%02lldm", (long long)(ms / 3600000), (long long)(ms / 60000 % 60));
}

static void describe(int exit_code, int signo, const char *exec_error, char *buf, size_t cap)
{
    char sig[32];
    if (exec_error && exec_error[0])
        mg_fmt(buf, cap, "could not be executed: %s (exit code %d)", exec_error, exit_code);
    else if (signo)
        mg_fmt(buf, cap, "was killed by %s (exit code %d)", mg_signame(signo, sig, sizeof(sig)),
               exit_code);
    else
        mg_fmt(buf, cap, "exited with code %d", exit_code);
}

void mg_failure_describe(const struct mg_failure *fl, char *buf, size_t cap)
{
    if (fl->oom[0]) {
        mg_fmt(buf, cap,
               "was killed by the kernel's OOM killer: out of memory (SIGKILL, exit code %d)",
               fl->exit_code);
        return;
    }
    if (fl->verdict[0]) {
        char sig[32];
        mg_fmt(buf, cap, "%s: killed by mglaunch's watchdog (%s, exit code %d)", fl->verdict,
               fl->signo ? mg_signame(fl->signo, sig, sizeof(sig)) : "exited", fl->exit_code);
        return;
    }
    describe(fl->exit_code, fl->signo, fl->exec_errno ? strerror(fl->exec_errno) : NULL, buf, cap);
}

/* Prints text with every line indented. */
static void indented(FILE *f, const char *text, const char *indent)
{
    const char *p = text;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        fprintf(f, "%s%.*s\n", indent, (int)n, p);
        p += n + (nl ? 1 : 0);
    }
}

void mg_remote_cause_print(FILE *f, const struct mg_remote_cause *rc)
{
    char d[256], t[64];
    mg_format_time_ms(rc->wall_ms, t, sizeof(t));
    if (rc->rank < 0) {
        fprintf(f, "Root cause (first failure): node %s was lost\n", rc->host);
        fprintf(f, "  node      : %s (agent %s)\n", rc->host, rc->node);
        if (rc->nranks == 1)
            fprintf(f, "  ranks     : %d\n", rc->first_rank);
        else if (rc->nranks > 1)
            fprintf(f, "  ranks     : %d-%d\n", rc->first_rank, rc->first_rank + rc->nranks - 1);
    } else {
        struct mg_failure fl = {.exit_code = rc->exit_code, .signo = rc->signo};
        mg_failure_describe(&fl, d, sizeof(d));
        fprintf(f, "Root cause (first failure, on node %s):\n", rc->host);
        fprintf(f, "  rank      : %d (local rank %d)\n", rc->rank, rc->local_rank);
        fprintf(f, "  host      : %s\n", rc->host);
        if (rc->pid > 0)
            fprintf(f, "  pid       : %ld\n", rc->pid);
        fprintf(f, "  exit      : %s\n", d);
    }
    if (rc->wall_ms > 0) /* a lost node: when its loss was noticed */
        fprintf(f, "  %s: %s\n", rc->rank < 0 ? "noticed   " : "time      ", t);
    if (rc->message[0])
        fprintf(f, "  message   : %s\n", rc->message);
    fprintf(f, "  logs      : on %s, in its own log directory (mglaunch logs there)\n", rc->host);
}

void mg_summary_print(FILE *f, const struct mg_agent_result *r)
{
    char d[256], t[64], sig[32];

    if (r->signo) {
        fprintf(f, "mglaunch: stopped by %s after %d attempt%s; exit code %d\n",
                mg_signame(r->signo, sig, sizeof(sig)), r->rounds, r->rounds == 1 ? "" : "s",
                r->exit_code);
        if (!r->nfailures)
            return;
    }
    if (r->error && !r->nfailures && !r->remote.set) {
        fprintf(f, "mglaunch: %s\n", r->error_msg);
        return;
    }
    if (!r->nfailures && !r->remote.set)
        return;
    if (r->error) /* what ended the run, when it was not the workers' failure alone */
        fprintf(f, "mglaunch: %s\n", r->error_msg);
    fprintf(f, "mglaunch: FAILED: run %s, %d attempt%s (%d restart%s); exit code %d\n", r->run_id,
            r->rounds, r->rounds == 1 ? "" : "s", r->restarts, r->restarts == 1 ? "" : "s",
            r->exit_code);
    for (int i = 0; i < r->rounds && r->attempts; i++) {
        const struct mg_attempt_summary *a = &r->attempts[i];
        mg_format_duration_ms(a->duration_ms, t, sizeof(t));
        fprintf(f, "  attempt %d (restart %d, %s): ", a->attempt, a->restart_count, t);
        if (a->first_failure >= 0) {
            const struct mg_failure *fl = &r->failures[a->first_failure];
            mg_failure_describe(fl, d, sizeof(d));
            fprintf(f, "rank %d (local rank %d, pid %d) %s", fl->rank, fl->local_rank, (int)fl->pid,
                    d);
            if (a->nfailed > 1)
                fprintf(f, "; %d more failed", a->nfailed - 1);
            if (a->nstopped)
                fprintf(f, "; %d stopped", a->nstopped);
            fputc('\n', f);
        } else if (a->nfailed) {
            fprintf(f, "%d failed\n", a->nfailed);
        } else {
            fprintf(f, "%s\n", a->nstopped ? "stopped" : "succeeded");
        }
    }
    if (r->failures_dropped)
        fprintf(f, "  (%d more failures not listed)\n", r->failures_dropped);

    if (r->remote.set) {
        mg_remote_cause_print(f, &r->remote);
        if (r->nfailures)
            mg_root_cause_print(f, MG_FOLLOWED_HEADING, &r->root);
    } else {
        mg_root_cause_print(f, "Root cause (first failure):", &r->root);
    }
    if (r->hint[0])
        fprintf(f, "hint: %s\n", r->hint);
}

/* A program without a stack (mg's train, a C worker) puts "prog (rank r on
 * host, pid p): " and its message (cut at 900 bytes) in py_callstack, for
 * torchrun's summary to show; under the message itself it only repeats it. */
static int traceback_is_message(const char *tb, const char *msg)
{
    const char *rest = strstr(tb, "): ");
    if (!rest || !msg[0] || strchr(tb, '\n') || !strstr(tb, " (rank "))
        return 0;
    rest += 3;
    return rest[0] && !strncmp(msg, rest, strlen(rest));
}

int mg_root_cause_errfile(struct mg_root_cause *rc)
{
    struct mg_errfile ef;
    if (mg_errfile_read(rc->error_file, &ef) < 0) {
        rc->error_file[0] = '\0';
        return -ENOENT;
    }
    mg_fmt(rc->message, sizeof(rc->message), "%s", ef.message);
    mg_fmt(rc->traceback, sizeof(rc->traceback), "%s", ef.traceback);
    if (traceback_is_message(ef.traceback, ef.message))
        rc->traceback[0] = '\0';
    if (ef.hostname[0])
        mg_fmt(rc->host, sizeof(rc->host), "%s", ef.hostname);
    return 0;
}

void mg_root_cause_print(FILE *f, const char *heading, const struct mg_root_cause *rc)
{
    char d[256], t[64];
    mg_failure_describe(&rc->f, d, sizeof(d));
    if (rc->exec_error[0])
        describe(rc->f.exit_code, rc->f.signo, rc->exec_error, d, sizeof(d));
    mg_format_time_ms(rc->f.wall_ms, t, sizeof(t));
    fprintf(f, "%s\n", heading);
    fprintf(f, "  rank      : %d (local rank %d)\n", rc->f.rank, rc->f.local_rank);
    fprintf(f, "  host      : %s\n", rc->host[0] ? rc->host : "?");
    if (rc->f.pid > 0)
        fprintf(f, "  pid       : %d\n", (int)rc->f.pid);
    else
        fprintf(f, "  pid       : ? (not recorded)\n");
    fprintf(f, "  attempt   : %d (restart %d)\n", rc->f.attempt, rc->f.restart_count);
    fprintf(f, "  time      : %s\n", t);
    if (rc->exit_unknown)
        fprintf(f, "  exit      : %s\n",
                rc->f.exit_code > 0 ? d
                                    : "failed, exit code unknown (no event log: its error file "
                                      "says it failed)");
    else
        fprintf(f, "  exit      : %s\n", d);
    if (rc->f.oom[0])
        fprintf(f, "  memory    : %s\n", rc->f.oom);
    if (rc->error_file[0])
        fprintf(f, "  error file: %s\n", rc->error_file);
    if (rc->message[0])
        fprintf(f, "  message   : %s\n", rc->message);
    if (rc->traceback[0]) {
        fprintf(f, "  traceback :\n");
        indented(f, rc->traceback, "    ");
    }
    if (!rc->message[0] && !rc->traceback[0]) {
        if (rc->stderr_tail[0]) {
            fprintf(f, "  stderr (last lines):\n");
            indented(f, rc->stderr_tail, "    ");
        } else if (rc->logs_saved || rc->stderr_kept) {
            fprintf(f, "  stderr    : (empty)\n");
        } else { /* neither a file nor the launcher's record of it */
            fprintf(f, "  stderr    : not saved\n");
        }
    }
    if (rc->logs_note[0])
        fprintf(f, "  logs      : %s (%s)\n", rc->log_path, rc->logs_note);
    else
        fprintf(f, "  logs      : %s%s\n", rc->log_path,
                rc->logs_saved ? "" : " (stdout/stderr not saved: use --log_dir)");
}
