/* Fuzz harness: --rdzv_conf (launcher/rdzv/rdzv_conf.c), parsed and then
 * checked against each backend, as mglaunch does before anything starts. */
#include "fuzz.h"
#include "mg_err.h"
#include "rdzv_conf.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const enum mg_rdzv_backend backends[] = {MG_RDZV_C10D, MG_RDZV_ETCD, MG_RDZV_STATIC};
    char err[MG_ERRMSG_LEN];
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    for (size_t b = 0; b < sizeof(backends) / sizeof(backends[0]); b++) {
        struct mg_rdzv_conf c;
        mg_rdzv_conf_init(&c);
        if (mg_rdzv_conf_parse(&c, text, err, sizeof(err)) < 0)
            break;
        /* docs/rendezvous.md: one late heartbeat must not declare a node dead. */
        if (mg_rdzv_conf_finish(&c, backends[b], NULL, err, sizeof(err)) == 0 &&
            c.heartbeat_timeout_ms < 2 * c.heartbeat_interval_ms)
            fuzz_fail("accepted heartbeat_interval %d ms with heartbeat_timeout %d ms",
                      c.heartbeat_interval_ms, c.heartbeat_timeout_ms);
    }
    int ms;
    mg_rdzv_parse_duration_ms(text, &ms);
    enum mg_rdzv_backend be;
    mg_rdzv_backend_parse(text, &be);
    free(text);
    return 0;
}
