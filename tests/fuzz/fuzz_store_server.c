/* Fuzz harness: the store server (common/store_*.c) fed whole sessions, as
 * an mglaunch that hosts the rendezvous is: up to four clients whose bytes
 * arrive in chunks, interleaved, with the server's loop turned between
 * chunks and connections closed midway (their ephemeral keys and parked
 * requests must go with them). The server runs in poll-loop mode, as in
 * mglaunch, with small limits, and listens on a UNIX socket so that no port
 * is taken.
 *
 * Input: a header byte (bit 0: small limits as mglaunch's; bit 1: a local
 * set between chunks, as the hosting agent makes), then chunks: one byte
 * (bits 0-1: the client; bit 7: close it instead), a length byte, and that
 * many bytes. Clients connect on first use. */
#include "fuzz.h"
#include "store.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define NCLIENTS 4
#define TURNS    8 /* loop turns after each chunk */

static int lfd = -1;
static struct sockaddr_un addr;
static socklen_t addrlen;

/* One listening socket for the whole process (the server does not own it). */
static int listener(void)
{
    if (lfd >= 0)
        return 0;
    lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0)
        return -1;
    memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    /* An abstract name: nothing on disk to clean up. */
    int n = snprintf(addr.sun_path + 1, sizeof(addr.sun_path) - 1, "mgfuzz-store-%d", getpid());
    addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
    if (bind(lfd, (struct sockaddr *)&addr, addrlen) < 0 || listen(lfd, 64) < 0) {
        close(lfd);
        lfd = -1;
        return -1;
    }
    return 0;
}

struct session {
    struct mg_store_server *srv;
    struct pollfd fds[2 + 2 * NCLIENTS + 8];
    int cl[NCLIENTS];
};

/* Turns the server's loop, and reads (and drops) what it sent each client. */
static void turn(struct session *s, int times)
{
    char buf[65536];
    for (int t = 0; t < times; t++) {
        int n = mg_store_server_pollfds(s->srv, s->fds, (int)(sizeof(s->fds) / sizeof(s->fds[0])));
        if (n < 0)
            fuzz_fail("pollfds: %d", n);
        int r = poll(s->fds, (nfds_t)n, 0);
        mg_store_server_process(s->srv, s->fds, r > 0 ? n : 0);
        for (int i = 0; i < NCLIENTS; i++) {
            if (s->cl[i] < 0)
                continue;
            ssize_t got;
            while ((got = recv(s->cl[i], buf, sizeof(buf), MSG_DONTWAIT)) > 0)
                ;
            if (got == 0) { /* the server closed it */
                close(s->cl[i]);
                s->cl[i] = -1;
            }
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct session s;
    if (size < 1 || listener() < 0)
        return 0;
    struct mg_store_server_opts so = {.listen_fd = lfd, .read_bytes_per_turn = 4096};
    if (data[0] & 1) {
        so.max_value_bytes = 4096 + 2048;
        so.max_clients = NCLIENTS;
        so.max_store_bytes = 64 << 10;
        so.max_buffer_bytes = 64 << 10;
        so.max_waiters = 16;
    }
    if (mg_store_server_start(&s.srv, &so))
        return 0;
    for (int i = 0; i < NCLIENTS; i++)
        s.cl[i] = -1;

    size_t off = 1;
    while (off + 2 <= size) {
        int who = data[off] & (NCLIENTS - 1), close_it = data[off] & 0x80;
        size_t len = data[off + 1];
        off += 2;
        if (len > size - off)
            len = size - off;
        if (close_it) {
            if (s.cl[who] >= 0)
                close(s.cl[who]);
            s.cl[who] = -1;
        } else {
            if (s.cl[who] < 0) {
                s.cl[who] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
                if (s.cl[who] >= 0 && connect(s.cl[who], (struct sockaddr *)&addr, addrlen) < 0 &&
                    errno != EINPROGRESS) {
                    close(s.cl[who]);
                    s.cl[who] = -1;
                }
            }
            if (s.cl[who] >= 0 && len)
                (void)!send(s.cl[who], data + off, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        off += len;
        if (data[0] & 2) {
            char key[16];
            snprintf(key, sizeof(key), "k%u", (unsigned)(off % 7));
            mg_store_server_local_set(s.srv, key, "v", 1, off & 1 ? MG_STORE_EPHEMERAL : 0);
        }
        turn(&s, TURNS);
    }
    /* Everyone leaves; the server must end with nothing of theirs. */
    for (int i = 0; i < NCLIENTS; i++)
        if (s.cl[i] >= 0)
            close(s.cl[i]);
    for (int i = 0; i < NCLIENTS; i++)
        s.cl[i] = -1;
    struct mg_store_server_stats st;
    for (int t = 0; t < 64; t++) {
        turn(&s, 1);
        mg_store_server_stats(s.srv, &st);
        if (st.clients == 0)
            break;
    }
    mg_store_server_local_drop(s.srv);
    mg_store_server_stats(s.srv, &st);
    if (st.clients != 0 || st.waiters != 0)
        fuzz_fail("after every client left: %d clients, %d parked requests", st.clients,
                  st.waiters);
    mg_store_server_release(s.srv);
    return 0;
}
