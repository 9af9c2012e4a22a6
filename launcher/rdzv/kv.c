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

int mg_kv_entries_from_keys(struct mg_kv *kv, char **keys, int n, int want_values,
                            struct mg_kv_entry **out, int *count)
{
    struct mg_kv_entry *e = n > 0 ? calloc((size_t)n, sizeof(*e)) : NULL;
    int m = 0, rc = n > 0 && !e ? -ENOMEM : 0;
    for (int i = 0; i < n && !rc; i++) {
        e[m].key = keys[i];
        keys[i] = NULL;
        if (want_values) {
            rc = kv->ops->get(kv, e[m].key, &e[m].val, &e[m].len, &e[m].rev);
            if (rc == -MG_ENOKEY) {
                free(e[m].key); /* deleted since the list */
                e[m].key = NULL;
                rc = 0;
                continue;
            }
        }
        m++;
    }
    for (int i = 0; i < n; i++)
        free(keys[i]);
    free(keys);
    if (rc < 0 || m == 0) {
        mg_kv_free_list(e, rc < 0 ? m + 1 : 0);
        e = NULL;
        m = 0;
    }
    *out = e;
    *count = m;
    return rc;
}
