/* The rendezvous key-value interface (launcher/rdzv/kv.h) as one table of
 * conformance cases, run against every backend by the same code: the mg
 * store client and the in-process backend of the agent hosting the store
 * (test_rdzv_kv.c), and etcd (test_etcd.c). What the rendezvous protocol
 * relies on is here; what differs by design is asked of the fixture:
 *
 *   wait_blocks  1: wait(timeout) blocks until a later change (the remote
 *                backends); 0: it answers at once whatever the timeout (the
 *                in-process backend, stepped from the agent's loop).
 *
 * A fixture opens the client under test (open) and, for what other nodes do,
 * a client of the same data on its own connection (open_other). Keys go
 * under a prefix of the caller's, so several fixtures may share a server. */
#ifndef MG_TEST_KV_CASES_H
#define MG_TEST_KV_CASES_H

#include "mg_err.h"
#include "kv.h"
#include "tap.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

struct kv_fixture {
    const char *name;
    struct mg_kv *(*open)(void *ctx);
    struct mg_kv *(*open_other)(void *ctx);
    void *ctx;
    int wait_blocks;
};

static const char *kvc_key(const char *prefix, const char *k)
{
    static char buf[4][MG_KV_MAX_KEY];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof(buf[i]), "%s/%s", prefix, k);
    return buf[i];
}

/* The value at key as a string ("(none)" when missing), for messages. */
static int kvc_is_val(struct mg_kv *kv, const char *key, const char *want)
{
    char *v = NULL;
    size_t len;
    int rc = kv->ops->get(kv, key, &v, &len, NULL);
    int pass = want ? rc == 0 && len == strlen(want) && strcmp(v, want) == 0 : rc == -MG_ENOKEY;
    free(rc == 0 ? v : NULL);
    return pass;
}

static void kv_cases(const struct kv_fixture *f, const char *prefix)
{
    const char *N = f->name;
    struct mg_kv *kv = f->open(f->ctx), *other = f->open_other(f->ctx);
    char *val = NULL, *cur = NULL;
    size_t len = 0;
    int64_t rev = 0, rev2 = 0, sum = 0;
    int rc;

    /* get, set, revisions */
    is_int(kv->ops->get(kv, kvc_key(prefix, "a"), &val, &len, NULL), -MG_ENOKEY,
           "%s: a missing key is -MG_ENOKEY", N);
    ok(mg_kv_error(kv)[0] != 0, "%s: and the error says something: %s", N, mg_kv_error(kv));
    is_int(kv->ops->set(kv, kvc_key(prefix, "a"), "hello", 5, 0), 0, "%s: set", N);
    rc = kv->ops->get(kv, kvc_key(prefix, "a"), &val, &len, &rev);
    ok(rc == 0 && len == 5 && strcmp(val, "hello") == 0, "%s: get returns the value", N);
    ok(rev > 0, "%s: and a revision (%lld)", N, (long long)rev);
    free(rc == 0 ? val : NULL);
    ok(kvc_is_val(other, kvc_key(prefix, "a"), "hello"), "%s: another client reads it", N);
    kv->ops->set(kv, kvc_key(prefix, "a"), "hello2", 6, 0);
    kv->ops->get(kv, kvc_key(prefix, "a"), NULL, NULL, &rev2);
    ok(rev2 > rev, "%s: a set raises the revision (%lld > %lld)", N, (long long)rev2,
       (long long)rev);
    {
        char bin[4] = {0, 1, (char)0xff, 'x'};
        kv->ops->set(kv, kvc_key(prefix, "bin"), bin, 4, 0);
        rc = kv->ops->get(kv, kvc_key(prefix, "bin"), &val, &len, NULL);
        ok(rc == 0 && len == 4 && memcmp(val, bin, 4) == 0, "%s: binary values round-trip", N);
        free(rc == 0 ? val : NULL);
        kv->ops->set(kv, kvc_key(prefix, "empty"), "", 0, 0);
        rc = kv->ops->get(kv, kvc_key(prefix, "empty"), &val, &len, NULL);
        ok(rc == 0 && len == 0 && val && val[0] == 0, "%s: an empty value is not a missing key", N);
        free(rc == 0 ? val : NULL);
    }

    /* compare-and-swap */
    rc = kv->ops->cas(kv, kvc_key(prefix, "c"), NULL, 0, "v1", 2, 0, &cur, &len);
    ok(rc == 1 && cur && strcmp(cur, "v1") == 0, "%s: cas on a missing key creates it", N);
    free(cur);
    rc = other->ops->cas(other, kvc_key(prefix, "c"), NULL, 0, "v2", 2, 0, &cur, &len);
    ok(rc == 0 && cur && strcmp(cur, "v1") == 0,
       "%s: cas expecting no key fails (another client), shows 'v1'", N);
    free(cur);
    rc = kv->ops->cas(kv, kvc_key(prefix, "c"), "v1", 2, "v3", 2, 0, &cur, &len);
    ok(rc == 1 && cur && strcmp(cur, "v3") == 0, "%s: cas v1 -> v3", N);
    free(cur);
    rc = kv->ops->cas(kv, kvc_key(prefix, "c"), "zz", 2, "v4", 2, 0, &cur, &len);
    ok(rc == 0 && cur && strcmp(cur, "v3") == 0, "%s: cas with a wrong expectation fails", N);
    free(cur);
    cur = (char *)"x";
    rc = kv->ops->cas(kv, kvc_key(prefix, "none"), "zz", 2, "v4", 2, 0, &cur, &len);
    ok(rc == 0 && cur == NULL, "%s: cas expecting a value of a missing key fails, cur NULL", N);
    ok(kvc_is_val(other, kvc_key(prefix, "none"), NULL), "%s: and creates nothing", N);
    rc = kv->ops->cas(kv, kvc_key(prefix, "empty"), "", 0, "full", 4, 0, NULL, NULL);
    ok(rc == 1 && kvc_is_val(other, kvc_key(prefix, "empty"), "full"),
       "%s: cas expecting the empty value swaps it", N);

    /* add */
    ok(kv->ops->add(kv, kvc_key(prefix, "n"), 5, &sum) == 0 && sum == 5, "%s: add on a missing key",
       N);
    ok(kv->ops->add(kv, kvc_key(prefix, "n"), -2, &sum) == 0 && sum == 3, "%s: add -2", N);
    ok(other->ops->add(other, kvc_key(prefix, "n"), 10, &sum) == 0 && sum == 13,
       "%s: another client adds to the same count", N);
    is_int(kv->ops->add(kv, kvc_key(prefix, "a"), 1, &sum), -EINVAL,
           "%s: add to a non-integer is refused", N);

    /* add is atomic across clients */
    {
        const int procs = 3, each = 25;
        pid_t kids[3];
        for (int p = 0; p < procs; p++) {
            kids[p] = fork();
            if (kids[p] == 0) {
                struct mg_kv *k = f->open_other(f->ctx);
                for (int i = 0; i < each; i++)
                    if (k->ops->add(k, kvc_key(prefix, "race"), 1, NULL) < 0)
                        _exit(1);
                k->ops->release(k);
                _exit(0);
            }
        }
        int bad = 0;
        for (int i = 0; i < each; i++)
            bad += kv->ops->add(kv, kvc_key(prefix, "race"), 1, NULL) < 0;
        for (int p = 0; p < procs; p++) {
            int st;
            waitpid(kids[p], &st, 0);
            bad += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
        }
        is_int(bad, 0, "%s: concurrent adders all succeeded", N);
        ok(kvc_is_val(kv, kvc_key(prefix, "race"), "100"),
           "%s: 3 other clients and this one x 25 adds = 100", N);
    }

    /* list */
    {
        struct mg_kv_entry *e = NULL;
        int n = 0;
        kv->ops->set(kv, kvc_key(prefix, "l/b"), "2", 1, 0);
        other->ops->set(other, kvc_key(prefix, "l/a"), "1", 1, 0);
        kv->ops->set(kv, kvc_key(prefix, "l/c"), "3", 1, 0);
        kv->ops->set(kv, kvc_key(prefix, "lx"), "no", 2, 0);
        rc = kv->ops->list(kv, kvc_key(prefix, "l/"), 100, 1, &e, &n);
        ok(rc == 0 && n == 3, "%s: list by prefix: 3 keys (%d)", N, n);
        ok(n == 3 && strcmp(e[0].key, kvc_key(prefix, "l/a")) == 0 &&
               strcmp(e[2].key, kvc_key(prefix, "l/c")) == 0,
           "%s: sorted, full keys", N);
        ok(n == 3 && e[1].val && strcmp(e[1].val, "2") == 0 && e[1].len == 1 && e[1].rev > 0,
           "%s: with values and revisions", N);
        mg_kv_free_list(e, n);
        rc = kv->ops->list(kv, kvc_key(prefix, "l/"), 2, 0, &e, &n);
        ok(rc == 0 && n == 2 && e[0].val == NULL, "%s: list honours max, keys only", N);
        mg_kv_free_list(e, n);
        e = (struct mg_kv_entry *)1;
        rc = kv->ops->list(kv, kvc_key(prefix, "nothing/"), 10, 1, &e, &n);
        ok(rc == 0 && n == 0 && e == NULL, "%s: an empty list", N);
        if (kv->ops->count) {
            int c = -1;
            rc = kv->ops->count(kv, kvc_key(prefix, "l/"), &c);
            ok(rc == 0 && c == 3, "%s: count by prefix: 3 keys (%d)", N, c);
            rc = kv->ops->count(kv, kvc_key(prefix, "nothing/"), &c);
            ok(rc == 0 && c == 0, "%s: count of an empty prefix: 0 (%d)", N, c);
        }
    }

    /* delete */
    is_int(kv->ops->del(kv, kvc_key(prefix, "l/b")), 1, "%s: delete an existing key", N);
    is_int(kv->ops->del(kv, kvc_key(prefix, "l/b")), 0, "%s: delete a missing key", N);
    ok(kvc_is_val(other, kvc_key(prefix, "l/b"), NULL), "%s: gone for the others too", N);

    /* many at once: more than one batch of a backend that batches (etcd: 64) */
    {
        enum {
            NM = 70
        };
        char *keys[NM], *vals[NM];
        size_t lens[NM];
        int bad = 0, cnt = -1;
        for (int i = 0; i < NM; i++) {
            char k[32];
            snprintf(k, sizeof(k), "m/%03d", i);
            keys[i] = strdup(kvc_key(prefix, k));
            vals[i] = malloc(16);
            lens[i] = (size_t)snprintf(vals[i], 16, "v%d", i);
        }
        is_int(mg_kv_set_many(kv, (const char *const *)keys, (const char *const *)vals, lens, NM),
               0, "%s: set_many of %d keys", N, NM);
        for (int i = 0; i < NM; i++)
            bad += !kvc_is_val(other, keys[i], vals[i]);
        is_int(bad, 0, "%s: each of them reads back", N);
        is_int(mg_kv_del_many(kv, (const char *const *)keys, NM), 0, "%s: del_many of them", N);
        struct mg_kv_entry *e = NULL;
        rc = other->ops->list(other, kvc_key(prefix, "m/"), 100, 0, &e, &cnt);
        ok(rc == 0 && cnt == 0, "%s: and none is left (%d)", N, cnt);
        mg_kv_free_list(e, cnt);
        for (int i = 0; i < NM; i++) {
            free(keys[i]);
            free(vals[i]);
        }
    }

    /* wait */
    kv->ops->set(kv, kvc_key(prefix, "w"), "1", 1, 0);
    kv->ops->get(kv, kvc_key(prefix, "w"), NULL, NULL, &rev);
    is_int(kv->ops->wait(kv, kvc_key(prefix, "w"), rev, 100), 0,
           "%s: wait without a change: 0 (timed out)", N);
    other->ops->set(other, kvc_key(prefix, "w"), "2", 1, 0);
    is_int(kv->ops->wait(kv, kvc_key(prefix, "w"), rev, 5000), 1,
           "%s: a change made by another client counts", N);
    kv->ops->get(kv, kvc_key(prefix, "w"), NULL, NULL, &rev2);
    other->ops->del(other, kvc_key(prefix, "w"));
    is_int(kv->ops->wait(kv, kvc_key(prefix, "w"), rev2, 5000), 1, "%s: a deletion is a change", N);
    is_int(kv->ops->wait(kv, kvc_key(prefix, "c"), 0, 5000), 1,
           "%s: waiting for a key that exists: at once", N);
    is_int(kv->ops->wait(kv, kvc_key(prefix, "nokey"), 0, 100), 0,
           "%s: waiting for a key that does not appear: 0", N);
    if (f->wait_blocks) {
        pid_t kid = fork();
        if (kid == 0) {
            usleep(200000);
            struct mg_kv *k = f->open_other(f->ctx);
            k->ops->set(k, kvc_key(prefix, "later"), "x", 1, 0);
            k->ops->release(k);
            _exit(0);
        }
        is_int(kv->ops->wait(kv, kvc_key(prefix, "later"), 0, 10000), 1,
               "%s: wait blocks until another client creates the key", N);
        waitpid(kid, NULL, 0);
    } else {
        /* A wait that blocked would hang the test (and the agent's loop). */
        is_int(kv->ops->wait(kv, kvc_key(prefix, "later"), 0, INT_MAX), 0,
               "%s: wait never blocks: an absent key with an endless timeout answers 0 at once", N);
        other->ops->set(other, kvc_key(prefix, "later"), "x", 1, 0);
        is_int(kv->ops->wait(kv, kvc_key(prefix, "later"), 0, INT_MAX), 1,
               "%s: and 1 once another client created it", N);
    }

    /* watch: a wait left open between calls (park_ms), with the value */
    if (kv->ops->watch && f->wait_blocks) {
        char *v = NULL;
        size_t vl = 0;
        const char *wk = kvc_key(prefix, "pw");
        char wkey[MG_KV_MAX_KEY];
        snprintf(wkey, sizeof(wkey), "%s", wk);
        is_int(kv->ops->watch(kv, wkey, 0, 50, 5000, &v, &vl), 0,
               "%s: watch for a missing key: 0 after the slice, left open", N);
        is_int(kv->ops->watch(kv, wkey, 0, 50, 5000, &v, &vl), 0,
               "%s: taken up again, still nothing", N);
        other->ops->set(other, wkey, "hello", 5, 0);
        rc = kv->ops->watch(kv, wkey, 0, 5000, 5000, &v, &vl);
        ok(rc == 1 && v && vl == 5 && strcmp(v, "hello") == 0,
           "%s: the key another client created: 1 with its value (%d)", N, rc);
        free(v);
        v = NULL;
        kv->ops->get(kv, wkey, NULL, NULL, &rev);
        is_int(kv->ops->watch(kv, wkey, rev, 50, 5000, &v, &vl), 0,
               "%s: watch since the key's revision: 0, left open", N);
        other->ops->set(other, wkey, "again", 5, 0);
        kv->ops->get(kv, kvc_key(prefix, "c"), NULL, NULL, NULL); /* drops it */
        rc = kv->ops->watch(kv, wkey, rev, 5000, 5000, &v, &vl);
        ok(rc == 1 && v && strcmp(v, "again") == 0,
           "%s: a change made while another call dropped the watch is still seen (%d)", N, rc);
        free(v);
        v = NULL;
        kv->ops->get(kv, wkey, NULL, NULL, &rev);
        is_int(kv->ops->watch(kv, wkey, rev, 50, 5000, &v, &vl), 0, "%s: parked again", N);
        other->ops->del(other, wkey);
        rc = kv->ops->watch(kv, wkey, rev, 5000, 5000, &v, &vl);
        ok(rc == 1 && v == NULL, "%s: a deletion: 1, no value (%d)", N, rc);
        free(v);
    }

    /* ephemeral keys: the others see them while the owner lives */
    is_int(kv->ops->keepalive(kv), 0, "%s: keepalive before any ephemeral key", N);
    is_int(kv->ops->set(kv, kvc_key(prefix, "eph"), "me", 2, MG_KV_EPHEMERAL), 0,
           "%s: ephemeral set", N);
    is_int(kv->ops->keepalive(kv), 0, "%s: keepalive", N);
    ok(kvc_is_val(other, kvc_key(prefix, "eph"), "me"), "%s: another client sees it", N);
    kv->ops->set(kv, kvc_key(prefix, "keep"), "p", 1, 0);
    other->ops->set(other, kvc_key(prefix, "theirs"), "o", 1, MG_KV_EPHEMERAL);
    ok(kvc_is_val(kv, kvc_key(prefix, "theirs"), "o"), "%s: and this one sees theirs", N);
    kv->ops->get(kv, kvc_key(prefix, "eph"), NULL, NULL, &rev);
    kv->ops->release(kv);
    is_int(other->ops->wait(other, kvc_key(prefix, "eph"), rev, 10000), 1,
           "%s: released: its ephemeral key goes (a change the others see)", N);
    ok(kvc_is_val(other, kvc_key(prefix, "eph"), NULL), "%s: it is gone", N);
    ok(kvc_is_val(other, kvc_key(prefix, "keep"), "p"), "%s: its persistent keys stay", N);
    kv = f->open(f->ctx);
    ok(kvc_is_val(kv, kvc_key(prefix, "theirs"), "o"), "%s: another client's ephemeral key stays",
       N);
    kv->ops->get(kv, kvc_key(prefix, "theirs"), NULL, NULL, &rev);
    other->ops->release(other);
    if (f->wait_blocks)
        rc = kv->ops->wait(kv, kvc_key(prefix, "theirs"), rev, 10000);
    else
        for (int i = 0;
             i < 1000 && (rc = kv->ops->wait(kv, kvc_key(prefix, "theirs"), rev, 0)) == 0; i++)
            usleep(10000); /* the store notices the closed connection on its own time */
    is_int(rc, 1, "%s: until that client goes", N);
    ok(kvc_is_val(kv, kvc_key(prefix, "theirs"), NULL), "%s: then it is gone", N);
    kv->ops->release(kv);
}

#endif
