/* `mglaunch logs`' run list: the run directories of a log directory, what
 * each run ran (its command, from the event log's run_start) and the filters
 * that pick runs by it: a program name and --cmd TEXT (see logs_internal.h,
 * docs/cli.md#mglaunch-logs). */
#include "events.h"
#include "logdir.h"
#include "logs_internal.h"
#include "mg_err.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_RUNS 100000

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* The workers' argv as the user typed it after mglaunch's options, the
 * program by its file name: the interpreter mglaunch put before a .py
 * program or -m (python3 -u) is left out. The program is the script's or
 * binary's file name, or the module. */
void mg_logs_set_command(struct lrun *r, char *const *argv, int argc)
{
    int i = 0;
    size_t len = 0;
    r->cmd[0] = r->prog[0] = '\0';
    if (argc >= 2 && strncmp(base_name(argv[0]), "python", 6) == 0 && strcmp(argv[1], "-u") == 0)
        i = 2;
    if (i < argc)
        mg_fmt(r->prog, sizeof(r->prog), "%s",
               strcmp(argv[i], "-m") == 0 && i + 1 < argc ? argv[i + 1] : base_name(argv[i]));
    for (int first = i; i < argc && len + 1 < sizeof(r->cmd); i++) {
        /* the program by its name: a column has no room for its directory */
        const char *a = i == first ? base_name(argv[i]) : argv[i];
        int n = mg_fmt(r->cmd + len, sizeof(r->cmd) - len, "%s%s", len ? " " : "", a);
        len = n < 0 || len + (size_t)n >= sizeof(r->cmd) ? sizeof(r->cmd) - 1 : len + (size_t)n;
    }
}

int mg_logs_run_matches(const struct lrun *r, const char *program, const char *cmd)
{
    if (cmd && !strstr(r->cmd, cmd))
        return 0;
    if (!program)
        return 1;
    /* ddp.py or ddp; a path names the same file name */
    const char *want = base_name(program), *dot = strrchr(r->prog, '.');
    size_t stem = dot && dot != r->prog ? (size_t)(dot - r->prog) : strlen(r->prog);
    return strcmp(r->prog, want) == 0 || (strlen(want) == stem && !strncmp(r->prog, want, stem));
}

/* "train --model cnn --data fashion-mnist", cut to width with "..." */
void mg_logs_command_column(const char *cmd, int width, char *buf, size_t cap)
{
    if ((int)strlen(cmd) <= width || width < 4)
        mg_fmt(buf, cap, "%s", cmd);
    else
        mg_fmt(buf, cap, "%.*s...", width - 3, cmd);
}

/* ---- the run list ---- */

static int cmp_run(const void *a, const void *b)
{
    const struct run_ent *x = a, *y = b;
    if (x->start_ms != y->start_ms)
        return x->start_ms < y->start_ms ? -1 : 1;
    return strcmp(x->id, y->id);
}

/* Run directories: those holding an event log or attempt directories. */
int mg_logs_list_runs(const char *dir, struct run_ent **out, int *n)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    struct run_ent *v = NULL;
    int cnt = 0, cap = 0;
    if (!d)
        return -errno;
    while ((de = readdir(d)) && cnt < MAX_RUNS) {
        char p[PATH_MAX + 300];
        struct stat st;
        if (de->d_name[0] == '.' || strlen(de->d_name) >= sizeof(v->id))
            continue;
        mg_fmt(p, sizeof(p), "%s/%s/%s", dir, de->d_name, MG_EVENTS_FILE);
        int has_ev = stat(p, &st) == 0;
        if (!has_ev) {
            mg_fmt(p, sizeof(p), "%s/%s", dir, de->d_name);
            if (mg_rundir_last_attempt(p) < 0)
                continue;
        }
        mg_fmt(p, sizeof(p), "%s/%s", dir, de->d_name);
        if (stat(p, &st) < 0 || !S_ISDIR(st.st_mode))
            continue;
        if (cnt == cap) {
            int ncap = cap ? cap * 2 : 16;
            struct run_ent *nv = realloc(v, (size_t)ncap * sizeof(*nv));
            if (!nv) {
                free(v);
                closedir(d);
                return -ENOMEM;
            }
            v = nv;
            cap = ncap;
        }
        mg_fmt(v[cnt].id, sizeof(v[cnt].id), "%s", de->d_name);
        v[cnt].start_ms = (int64_t)st.st_mtime * 1000;
        cnt++;
    }
    closedir(d);
    *out = v;
    *n = cnt;
    return 0;
}

const char *mg_logs_resolve_run(const char *dir, const char *id, char *buf, size_t cap)
{
    char p[PATH_MAX + 300], rid[256];
    struct stat st;
    int64_t newest = -1;
    mg_fmt(p, sizeof(p), "%s/%s", dir, id);
    if (stat(p, &st) == 0 && S_ISDIR(st.st_mode))
        return id;
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (!mg_logs_torchrun_dir_name(de->d_name, rid, sizeof(rid)) || strcmp(rid, id) != 0)
            continue;
        mg_fmt(p, sizeof(p), "%s/%s", dir, de->d_name);
        if (stat(p, &st) == 0 && S_ISDIR(st.st_mode) && (int64_t)st.st_mtime > newest &&
            mg_fmt(buf, cap, "%s", de->d_name) >= 0)
            newest = (int64_t)st.st_mtime;
    }
    if (d)
        closedir(d);
    return newest >= 0 ? buf : id;
}

static int runs_where(const char *dir, const char *program, const char *cmd, struct run_ent **runs,
                      int *n, char *err, size_t cap)
{
    struct lrun r;
    int rc = mg_logs_list_runs(dir, runs, n);
    if (rc || *n == 0) {
        mg_fmt(err, cap, rc ? "cannot read '%s': %s" : "no runs in '%s'%s", dir,
               rc ? mg_strerror(rc) : "");
        free(*runs);
        *runs = NULL;
        return rc ? rc : -ENOENT;
    }
    memset(&r, 0, sizeof(r));
    int kept = 0;
    for (int i = 0; i < *n; i++) {
        struct run_ent *e = &(*runs)[i];
        if (mg_logs_load_run(&r, dir, e->id) == 0) {
            if (!mg_logs_run_matches(&r, program, cmd))
                continue;
            e->start_ms = r.start_ms;
            mg_fmt(e->cmd, sizeof(e->cmd), "%s", r.cmd);
        } else if (program || cmd) {
            continue;
        }
        (*runs)[kept++] = *e;
    }
    mg_logs_run_free(&r);
    if (kept == 0) {
        char what[600];
        if (program && cmd)
            mg_fmt(what, sizeof(what), "of program '%s' with '%s' in its command", program, cmd);
        else if (program)
            mg_fmt(what, sizeof(what), "of program '%s'", program);
        else
            mg_fmt(what, sizeof(what), "with '%s' in its command", cmd);
        mg_fmt(err, cap, "no run %s in '%s' (%d other run%s there)", what, dir, *n,
               *n == 1 ? "" : "s");
        free(*runs);
        *runs = NULL;
        *n = 0;
        return -ENOENT;
    }
    *n = kept;
    qsort(*runs, (size_t)*n, sizeof(**runs), cmp_run);
    return 0;
}

int mg_logs_runs(const char *dir, struct run_ent **runs, int *n, char *err, size_t cap)
{
    return runs_where(dir, NULL, NULL, runs, n, err, cap);
}

int mg_logs_runs_matching(const char *dir, const struct logs_opts *lo, struct run_ent **runs,
                          int *n, char *err, size_t cap)
{
    return runs_where(dir, lo->program, lo->cmd, runs, n, err, cap);
}
