/* Helpers shared by the key-value backends of the rendezvous (rdzv_kv.h). */
#include "rdzv_kv.h"

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
