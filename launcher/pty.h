/* Terminals for the workers whose console output is shown, when mglaunch
 * itself runs on one (docs/cli.md, "On a terminal"): under torchrun those
 * workers write to the terminal and read from it, so breakpoint() and pdb
 * work, and so do the colours and progress bars of libraries that check
 * isatty(). mglaunch gives each of them pseudo-terminals instead (one for
 * stdin and stdout, its controlling terminal, one for stderr), relays their
 * output to its console and to the log files, and the keyboard to one of
 * them. Its own terminal then stops editing and echoing lines (the worker's
 * pseudo-terminal does both) but keeps its signal keys: Ctrl-C, Ctrl-Z and
 * Ctrl-\ still reach mglaunch, which acts on them for every worker. */
#ifndef MG_PTY_H
#define MG_PTY_H

#include <termios.h>

struct mg_pty {
    int master; /* mglaunch's side, non-blocking; -1 when closed */
    int slave;  /* the worker's side, until it is started; -1 then */
};

/* Opens a pseudo-terminal whose slave passes output through as written (no
 * "\n" to "\r\n", so the log files get the program's bytes) and has the
 * window size of the terminal size_from (-1: none). 0 or a negative errno. */
int mg_pty_open(struct mg_pty *p, int size_from);
void mg_pty_close_slave(struct mg_pty *p);
void mg_pty_close(struct mg_pty *p);

/* Gives the pseudo-terminal the window size of the terminal from (after a
 * SIGWINCH: the kernel passes it on to the worker as SIGWINCH). */
void mg_pty_copy_size(int from, int master);

/* mglaunch's own terminal while workers have pseudo-terminals. */
struct mg_tty {
    int fd;    /* the terminal (stdin), or -1 */
    int saved; /* its settings were read */
    int raw;   /* they are changed now */
    struct termios orig;
};

/* Whether fd is a terminal whose foreground process group is ours (a
 * launcher in the background must not take the keyboard, nor change the
 * terminal: the kernel would stop it). */
int mg_tty_is_foreground(int fd);
/* No line editing and no echo (signal keys kept); idempotent. 0 or -errno. */
int mg_tty_raw(struct mg_tty *t);
/* The settings as they were. */
void mg_tty_restore(struct mg_tty *t);

#endif
