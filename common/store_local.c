/* The hosting process's direct calls on its store server (store.h): the
 * client's operations as local calls, which run the same mg_ss_op_* as the
 * protocol's requests under the same lock, answer at once and never park;
 * the process's own ephemeral keys (owned by s->local, a connection that is
 * never polled); and whether an endpoint leads back to this server. A local
 * change settles at once, so the clients it woke get their answers. */
#include "store_server_internal.h"
#include "mg_err.h"
#include "net.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Checks a key from a local caller; its length in *klen. */
static int local_key(const char *key, size_t *klen, int is_prefix)
{
    if (!key)
        return -EINVAL;
    *klen = strlen(key);
    return mg_sp_key_check((const uint8_t *)key, *klen, is_prefix);
}

static int local_value(const void *val, size_t len)
{
    if (len > MG_STORE_MAX_VALUE)
        return -MG_ETOOBIG;
    return len && !val ? -EINVAL : 0;
}

/* After a local change: send what it queued for the clients it woke, a
 * turn's worth (mg_ss_settle). The rest is sent by the loop's next turns:
 * wake it, in case it sleeps with a timeout reckoned before the change (a
 * socket that would not take all of its replies is in the epoll set for
 * output already, which wakes it by itself). */
static void local_done(struct mg_store_server *s)
{
    mg_ss_settle(s);
    if (!TAILQ_EMPTY(&s->dirty))
        mg_ss_wake_loop(s);
}

static int copy_out(const struct blob *b, void **val, size_t *len)
{
    if (!val)
        return 0;
    size_t n = b ? b->len : 0;
    char *p = malloc(n + 1);
    if (!p)
        return -ENOMEM;
    if (n)
        memcpy(p, b->data, n);
    p[n] = '\0';
    *val = p;
    if (len)
        *len = n;
    return 0;
}

int mg_store_server_local_set(struct mg_store_server *s, const char *key, const void *val,
                              size_t len, int flags)
{
    size_t klen;
    struct entry *e;
    int rc = local_key(key, &klen, 0);
    if (!rc)
        rc = local_value(val, len);
    if (!rc && (flags & ~MG_STORE_EPHEMERAL))
        rc = -EINVAL;
    if (rc)
        return rc;
    mg_ss_lock(s);
    uint16_t st = mg_ss_op_set(s, (const uint8_t *)key, klen, val, len,
                               (flags & MG_STORE_EPHEMERAL) ? s->local : NULL, &e);
    local_done(s);
    mg_ss_unlock(s);
    return mg_sp_status_err(st);
}

int mg_store_server_local_get(struct mg_store_server *s, const char *key, void **val, size_t *len,
                              int64_t *rev)
{
    size_t klen;
    int rc = local_key(key, &klen, 0);
    if (rc)
        return rc;
    mg_ss_lock(s);
    struct entry *e = mg_ss_lookup(s, (const uint8_t *)key, klen);
    if (rev)
        *rev = mg_ss_entry_rev(s, e);
    if (e && e->val)
        rc = copy_out(e->val, val, len);
    else
        rc = -MG_ENOKEY;
    mg_ss_unlock(s);
    return rc;
}

int mg_store_server_local_add(struct mg_store_server *s, const char *key, int64_t delta,
                              int64_t *result)
{
    size_t klen;
    struct entry *e;
    int64_t sum = 0;
    int rc = local_key(key, &klen, 0);
    if (rc)
        return rc;
    mg_ss_lock(s);
    uint16_t st = mg_ss_op_add(s, (const uint8_t *)key, klen, delta, &sum, &e);
    local_done(s);
    mg_ss_unlock(s);
    if (!st && result)
        *result = sum;
    return mg_sp_status_err(st);
}

int mg_store_server_local_compare_set(struct mg_store_server *s, const char *key,
                                      const void *expected, size_t expected_len,
                                      const void *desired, size_t desired_len, void **current,
                                      size_t *current_len)
{
    size_t klen;
    struct entry *e;
    int swapped = 0;
    int rc = local_key(key, &klen, 0);
    if (!rc)
        rc = local_value(desired, desired_len);
    if (!rc && expected)
        rc = local_value(expected, expected_len);
    if (rc)
        return rc;
    if (current)
        *current = NULL;
    if (current_len)
        *current_len = 0;
    mg_ss_lock(s);
    uint16_t st = mg_ss_op_cas(s, (const uint8_t *)key, klen, !expected, expected, expected_len,
                               desired, desired_len, &e, &swapped);
    if (!st && current && e && e->val)
        rc = copy_out(e->val, current, current_len);
    local_done(s);
    mg_ss_unlock(s);
    if (st)
        return mg_sp_status_err(st);
    return rc ? rc : swapped;
}

int mg_store_server_local_delete(struct mg_store_server *s, const char *key)
{
    size_t klen;
    int rc = local_key(key, &klen, 0);
    if (rc)
        return rc;
    mg_ss_lock(s);
    rc = mg_ss_op_delete(s, (const uint8_t *)key, klen);
    local_done(s);
    mg_ss_unlock(s);
    return rc;
}

int mg_store_server_local_list(struct mg_store_server *s, const char *prefix, int max, char ***keys,
                               int *nkeys)
{
    struct entry **all = NULL;
    size_t plen, n = 0;
    char **out = NULL;
    int rc = local_key(prefix ? prefix : "", &plen, 1), take = 0;
    *keys = NULL;
    *nkeys = 0;
    if (rc)
        return rc;
    if (max < 0 || max > MG_STORE_MAX_LIST)
        max = MG_STORE_MAX_LIST;
    mg_ss_lock(s);
    uint16_t st = mg_ss_op_list(s, (const uint8_t *)(prefix ? prefix : ""), plen, &all, &n);
    if (st) {
        rc = mg_sp_status_err(st);
        goto out;
    }
    take = n < (size_t)max ? (int)n : max;
    out = calloc(take ? (size_t)take : 1, sizeof(*out));
    if (!out) {
        rc = -ENOMEM;
        goto out;
    }
    for (int i = 0; i < take; i++) {
        out[i] = strndup((const char *)all[i]->key, all[i]->klen);
        if (!out[i]) {
            mg_store_free_list(out, i);
            out = NULL;
            rc = -ENOMEM;
            goto out;
        }
    }
    *keys = out;
    *nkeys = take;
    rc = n > INT32_MAX ? INT32_MAX : (int)n;
out:
    mg_ss_unlock(s);
    free(all);
    return rc;
}

/* An address and port, with IPv4-mapped IPv6 addresses (a dual-stack
 * listener's view of an IPv4 peer) as IPv4, for comparisons. */
static int endpoint_of(const struct sockaddr_storage *ss, uint8_t addr[16], int *port)
{
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    memset(addr, 0, 16);
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        memcpy(addr + 12, &a->sin_addr, 4);
        *port = ntohs(a->sin_port);
        return 4;
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        memcpy(addr, &a->sin6_addr, 16);
        *port = ntohs(a->sin6_port);
        if (memcmp(addr, mapped, 12) == 0) {
            memset(addr, 0, 12);
            return 4;
        }
        return 6;
    }
    return -1;
}

int mg_store_server_is_own_peer(struct mg_store_server *s, int fd, int timeout_ms)
{
    struct sockaddr_storage me, peer;
    socklen_t len = sizeof(me);
    uint8_t a[16], b[16];
    int pa, pb, fa, found = 0;
    int64_t deadline = mg_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);

    if (getsockname(fd, (struct sockaddr *)&me, &len) < 0)
        return -errno;
    fa = endpoint_of(&me, a, &pa);
    for (;;) {
        mg_ss_lock(s);
        mg_ss_accept_some(s);
        struct conn *c;
        LIST_FOREACH(c, &s->conns, link) {
            len = sizeof(peer);
            if (c->closing == CL_DEAD || getpeername(c->fd, (struct sockaddr *)&peer, &len) < 0)
                continue;
            found = endpoint_of(&peer, b, &pb) == fa && pa == pb && memcmp(a, b, 16) == 0;
            if (found)
                break;
        }
        mg_ss_unlock(s);
        if (found || mg_now_ms() >= deadline)
            return found;
        struct pollfd p = {.fd = s->lfd, .events = POLLIN};
        poll(&p, 1, mg_ms_until(deadline));
    }
}

void mg_store_server_local_drop(struct mg_store_server *s)
{
    mg_ss_lock(s);
    while (!LIST_EMPTY(&s->local->eph))
        mg_ss_entry_delete(s, LIST_FIRST(&s->local->eph));
    local_done(s);
    mg_ss_unlock(s);
}
