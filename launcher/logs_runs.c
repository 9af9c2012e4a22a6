/* `mglaunch logs`' run list: what each run ran (its command, from the event
 * log's run_start) and the filters that pick runs by it: a program name and
 * --cmd TEXT (see logs_internal.h, docs/cli.md#mglaunch-logs). */
#include "logs_internal.h"
#include "mg_err.h"

#include <string.h>

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
