/* Pseudo-terminals for the workers and mglaunch's own terminal (see pty.h). */
#include "pty.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <unistd.h>

int mg_pty_open(struct mg_pty *p, int size_from)
{
    struct termios t;
    int rc;
    p->master = p->slave = -1;
    p->master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (p->master < 0)
        return -errno;
    if (grantpt(p->master) < 0 || unlockpt(p->master) < 0)
        goto fail;
    char name[128];
    if (ptsname_r(p->master, name, sizeof(name)) != 0)
        goto fail;
    p->slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (p->slave < 0)
        goto fail;
    if (tcgetattr(p->slave, &t) == 0) {
        t.c_oflag &= ~(tcflag_t)ONLCR;
        tcsetattr(p->slave, TCSANOW, &t);
    }
    if (size_from >= 0)
        mg_pty_copy_size(size_from, p->master);
    fcntl(p->master, F_SETFL, O_NONBLOCK);
    return 0;
fail:
    rc = -errno;
    mg_pty_close(p);
    return rc;
}

void mg_pty_close_slave(struct mg_pty *p)
{
    if (p->slave >= 0)
        close(p->slave);
    p->slave = -1;
}

void mg_pty_close(struct mg_pty *p)
{
    mg_pty_close_slave(p);
    if (p->master >= 0)
        close(p->master);
    p->master = -1;
}

void mg_pty_copy_size(int from, int master)
{
    struct winsize ws;
    if (from >= 0 && master >= 0 && ioctl(from, TIOCGWINSZ, &ws) == 0)
        ioctl(master, TIOCSWINSZ, &ws);
}

int mg_tty_is_foreground(int fd)
{
    pid_t fg = tcgetpgrp(fd);
    return isatty(fd) && fg > 0 && fg == getpgrp();
}

int mg_tty_raw(struct mg_tty *t)
{
    struct termios r;
    if (t->fd < 0 || t->raw)
        return 0;
    if (!t->saved) {
        if (tcgetattr(t->fd, &t->orig) < 0)
            return -errno;
        t->saved = 1;
    }
    r = t->orig;
    r.c_lflag &= ~(tcflag_t)(ICANON | ECHO | ECHONL | IEXTEN);
    r.c_cc[VMIN] = 1;
    r.c_cc[VTIME] = 0;
    if (tcsetattr(t->fd, TCSADRAIN, &r) < 0)
        return -errno;
    t->raw = 1;
    return 0;
}

void mg_tty_restore(struct mg_tty *t)
{
    if (t->fd >= 0 && t->raw && t->saved)
        tcsetattr(t->fd, TCSADRAIN, &t->orig);
    t->raw = 0;
}
