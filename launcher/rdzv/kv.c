/* Helpers shared by the key-value backends of the rendezvous (kv.h). */
#include "kv.h"
#include "mg_err.h"

#include <errno.h>
#include <stdlib.h>

void mg_kv_free_list(struct mg_kv_entry *e, int n)
{
    if (!e)
        return;
    for (int i = 0; i < n; i++) {
        free(e[i].key);
        free(e[i].val);
    }
    free(e);
}

int mg_kv_get_many(struct mg_kv *kv, const char *const *keys, int n, char **vals, size_t *lens,
                   int64_t *revs)
{
    if (kv->ops->get_many)
        return kv->ops->get_many(kv, keys, n, vals, lens, revs);
    for (int i = 0; i < n; i++)
        vals[i] = NULL;
    for (int i = 0; i < n; i++) {
        size_t len;
        int rc = kv->ops->get(kv, keys[i], &vals[i], &len, revs ? &revs[i] : NULL);
        if (rc == -MG_ENOKEY) {
            vals[i] = NULL;
            continue;
        }
        if (rc < 0) {
            for (int j = 0; j < i; j++) {
                free(vals[j]);
                vals[j] = NULL;
            }
            return rc;
        }
        if (lens)
            lens[i] = len;
    }
    return 0;
}

int mg_kv_set_many(struct mg_kv *kv, const char *const *keys, const char *const *vals,
                   const size_t *lens, int n)
{
    if (kv->ops->set_many)
        return kv->ops->set_many(kv, keys, vals, lens, n);
    for (int i = 0; i < n; i++) {
        int rc = kv->ops->set(kv, keys[i], vals[i], lens[i], 0);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int mg_kv_del_many(struct mg_kv *kv, const char *const *keys, int n)
{
    if (kv->ops->del_many)
        return kv->ops->del_many(kv, keys, n);
    for (int i = 0; i < n; i++) {
        int rc = kv->ops->del(kv, keys[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int mg_kv_entries_from_keys(struct mg_kv *kv, char **keys, int n, int want_values,
                            struct mg_kv_entry **out, int *count)
{
    struct mg_kv_entry *e = n > 0 ? calloc((size_t)n, sizeof(*e)) : NULL;
    char **vals = want_values && n > 0 ? calloc((size_t)n, sizeof(*vals)) : NULL;
    size_t *lens = want_values && n > 0 ? calloc((size_t)n, sizeof(*lens)) : NULL;
    int64_t *revs = want_values && n > 0 ? calloc((size_t)n, sizeof(*revs)) : NULL;
    int m = 0, rc = n > 0 && (!e || (want_values && (!vals || !lens || !revs))) ? -ENOMEM : 0;

    /* the values in a few round trips: a round's closer reads thousands */
    if (!rc && want_values && n > 0)
        rc = mg_kv_get_many(kv, (const char *const *)keys, n, vals, lens, revs);
    for (int i = 0; i < n && !rc; i++) {
        if (want_values && !vals[i]) {
            free(keys[i]); /* deleted since the list */
            keys[i] = NULL;
            continue;
        }
        e[m].key = keys[i];
        keys[i] = NULL;
        if (want_values) {
            e[m].val = vals[i];
            e[m].len = lens[i];
            e[m].rev = revs[i];
            vals[i] = NULL;
        }
        m++;
    }
    for (int i = 0; i < n; i++) {
        free(keys[i]);
        if (vals)
            free(vals[i]);
    }
    free(keys);
    free(vals);
    free(lens);
    free(revs);
    if (rc < 0 || m == 0) {
        mg_kv_free_list(e, m);
        e = NULL;
        m = 0;
    }
    *out = e;
    *count = m;
    return rc;
}
