/* A well-behaved store client for the integration tests: runs commands in
 * order over one connection and prints one line per result.
 *
 *   storectl [--token T] [--lease MS] [--timeout MS] [--connect-timeout MS]
 *            HOST:PORT [CMD ARGS...]...
 *
 *   set K V | seteph K V    get K TIMEOUT       add K N       del K
 *   cas K EXPECTED|- NEW    wait TIMEOUT K,K..  check K,K..   ping
 *   watch K SINCE TIMEOUT   list PREFIX MAX     sleep MS
 *   hold MS                 (sleep, pinging in time to keep the lease)
 *   stress SECS             (set/get/add with checks for SECS seconds; prints the count)
 *
 * With no command it only connects. Exits 1 at the first failed command, with
 * "storectl: CMD: reason" on stderr. */
#include "mg_err.h"
#include "net.h"
#include "store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct mg_store *st;
static int lease_ms;

static int split_keys(char *list, const char **keys, int max)
{
    int n = 0;
    for (char *k = strtok(list, ","); k && n < max; k = strtok(NULL, ","))
        keys[n++] = k;
    return n;
}

static int hold(int ms)
{
    int64_t end = mg_now_ms() + ms;
    int step = lease_ms > 0 ? lease_ms / 3 : 100;
    while (mg_now_ms() < end) {
        int left = mg_ms_until(end);
        poll(NULL, 0, left < step ? left : step);
        if (lease_ms > 0) {
            int rc = mg_store_ping(st);
            if (rc)
                return rc;
        }
    }
    return 0;
}

static int stress(int secs)
{
    int64_t end = mg_now_ms() + secs * 1000LL;
    long n = 0;
    char key[32], val[64];
    snprintf(key, sizeof(key), "stress/%d", (int)getpid());
    while (mg_now_ms() < end) {
        void *v = NULL;
        size_t len;
        int64_t r;
        int vl = snprintf(val, sizeof(val), "value-%ld", n);
        int rc = mg_store_set(st, key, val, (size_t)vl, 0);
        if (!rc)
            rc = mg_store_get(st, key, &v, &len, 0);
        if (!rc && (len != (size_t)vl || memcmp(v, val, len)))
            rc = -MG_EPROTO;
        free(v);
        if (!rc)
            rc = mg_store_add(st, "stress-count", 1, &r);
        if (rc)
            return rc;
        n++;
    }
    printf("stress ok %ld\n", n);
    return 0;
}

static int need(int argc, int i, int n, const char *cmd)
{
    if (i + n >= argc) {
        fprintf(stderr, "storectl: %s needs %d argument(s)\n", cmd, n);
        exit(2);
    }
    return i + n;
}

int main(int argc, char **argv)
{
    struct mg_store_opts o = {.connect_timeout_ms = 5000, .timeout_ms = 10000};
    struct mg_hostport hp;
    int i = 1, rc;

    for (; i < argc && !strncmp(argv[i], "--", 2); i += 2) {
        if (i + 1 >= argc) {
            fprintf(stderr, "storectl: %s needs a value\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--token"))
            o.token = argv[i + 1];
        else if (!strcmp(argv[i], "--lease"))
            o.lease_ms = lease_ms = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--timeout"))
            o.timeout_ms = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--connect-timeout"))
            o.connect_timeout_ms = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "storectl: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (i >= argc || mg_parse_hostport(argv[i], 0, &hp) || !hp.port) {
        fprintf(stderr, "usage: storectl [options] HOST:PORT [CMD ARGS...]...\n");
        return 2;
    }
    o.host = hp.host;
    o.port = hp.port;
    if ((rc = mg_store_connect(&st, &o))) {
        fprintf(stderr, "storectl: cannot connect to '%s': %s\n", argv[i], mg_strerror(rc));
        return 1;
    }
    for (i++; i < argc; i++) {
        const char *cmd = argv[i];
        const char *keys[MG_STORE_MAX_WAIT_KEYS + 1];
        void *v = NULL;
        size_t len = 0;
        int64_t num = 0, rev = 0;
        rc = 0;
        if (!strcmp(cmd, "set") || !strcmp(cmd, "seteph")) {
            i = need(argc, i, 2, cmd);
            rc = mg_store_set(st, argv[i - 1], argv[i], strlen(argv[i]),
                              cmd[3] ? MG_STORE_EPHEMERAL : 0);
            if (!rc)
                printf("%s %s ok\n", cmd, argv[i - 1]);
        } else if (!strcmp(cmd, "get")) {
            i = need(argc, i, 2, cmd);
            rc = mg_store_get(st, argv[i - 1], &v, &len, atoi(argv[i]));
            if (!rc)
                printf("get %s = %s\n", argv[i - 1], (char *)v);
        } else if (!strcmp(cmd, "add")) {
            i = need(argc, i, 2, cmd);
            rc = mg_store_add(st, argv[i - 1], strtoll(argv[i], NULL, 10), &num);
            if (!rc)
                printf("add %s = %lld\n", argv[i - 1], (long long)num);
        } else if (!strcmp(cmd, "del")) {
            i = need(argc, i, 1, cmd);
            rc = mg_store_delete(st, argv[i]);
            if (rc >= 0)
                printf("del %s %s\n", argv[i], rc ? "existed" : "absent");
        } else if (!strcmp(cmd, "cas")) {
            i = need(argc, i, 3, cmd);
            const char *exp = strcmp(argv[i - 1], "-") ? argv[i - 1] : NULL;
            rc = mg_store_compare_set(st, argv[i - 2], exp, exp ? strlen(exp) : 0, argv[i],
                                      strlen(argv[i]), &v, &len);
            if (rc >= 0)
                printf("cas %s %s, now %s\n", argv[i - 2], rc ? "swapped" : "kept",
                       v ? (char *)v : "(absent)");
        } else if (!strcmp(cmd, "wait")) {
            i = need(argc, i, 2, cmd);
            int n = split_keys(argv[i], keys, MG_STORE_MAX_WAIT_KEYS + 1);
            rc = mg_store_wait(st, keys, n, atoi(argv[i - 1]));
            if (!rc)
                printf("wait ok %d\n", n);
        } else if (!strcmp(cmd, "check")) {
            i = need(argc, i, 1, cmd);
            int n = split_keys(argv[i], keys, MG_STORE_MAX_WAIT_KEYS + 1);
            rc = mg_store_check(st, keys, n);
            if (rc >= 0)
                printf("check %s\n", rc ? "all" : "missing");
        } else if (!strcmp(cmd, "watch")) {
            i = need(argc, i, 3, cmd);
            rc = mg_store_watch(st, argv[i - 2], strtoll(argv[i - 1], NULL, 10), atoi(argv[i]),
                                &rev, &v, &len);
            if (!rc)
                printf("watch %s rev=%lld %s%s\n", argv[i - 2], (long long)rev,
                       v ? "value=" : "absent", v ? (char *)v : "");
        } else if (!strcmp(cmd, "list")) {
            i = need(argc, i, 2, cmd);
            char **ks;
            int nk;
            rc = mg_store_list(st, argv[i - 1], atoi(argv[i]), &ks, &nk);
            if (rc >= 0) {
                printf("list %s total=%d\n", argv[i - 1], rc);
                for (int k = 0; k < nk; k++)
                    printf("%s\n", ks[k]);
                mg_store_free_list(ks, nk);
            }
        } else if (!strcmp(cmd, "ping")) {
            rc = mg_store_ping(st);
            if (!rc)
                printf("ping ok\n");
        } else if (!strcmp(cmd, "sleep")) {
            i = need(argc, i, 1, cmd);
            poll(NULL, 0, atoi(argv[i]));
        } else if (!strcmp(cmd, "hold")) {
            i = need(argc, i, 1, cmd);
            rc = hold(atoi(argv[i]));
        } else if (!strcmp(cmd, "stress")) {
            i = need(argc, i, 1, cmd);
            rc = stress(atoi(argv[i]));
        } else {
            fprintf(stderr, "storectl: unknown command '%s'\n", cmd);
            return 2;
        }
        free(v);
        fflush(stdout);
        if (rc < 0) {
            fprintf(stderr, "storectl: %s: %s\n", cmd, mg_strerror(rc));
            mg_store_release(st);
            return 1;
        }
    }
    mg_store_release(st);
    return 0;
}
