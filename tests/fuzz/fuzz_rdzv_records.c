/* Fuzz harness: what the rendezvous reads that other nodes or the scheduler
 * wrote: an agent's record and a failure record from the store
 * (launcher/rdzv/rdzv_proto.c), and Slurm's host lists and environment
 * (launcher/rdzv/slurm.c). The first byte picks which; the rest is the text.
 * An agent record that parses must format back to a record that parses the
 * same. */
#include "fuzz.h"
#include "mg_err.h"
#include "rdzv_internal.h"
#include "rdzv_proto.h"
#include "slurm.h"

#include <stdlib.h>
#include <string.h>

static void desc(const char *text)
{
    struct mg_rdzv_desc d, e;
    char buf[2048];
    if (mg_rdzv_desc_parse(text, &d))
        return;
    int n = mg_rdzv_desc_format(&d, buf, sizeof(buf));
    if (n < 0)
        fuzz_fail("a parsed agent record does not format: %d", n);
    if (mg_rdzv_desc_parse(buf, &e))
        fuzz_fail("a formatted agent record does not parse: %s", buf);
    if (strcmp(d.id, e.id) || strcmp(d.host, e.host) || strcmp(d.addr, e.addr) ||
        d.port != e.port || d.nproc != e.nproc || d.prev != e.prev || d.fixed != e.fixed)
        fuzz_fail("an agent record changes in a round trip: %s", buf);
}

static void slurm(char *text)
{
    char *env[65];
    int n = 0;
    for (char *line = strtok(text, "\n"); line && n < 64; line = strtok(NULL, "\n"))
        env[n++] = line;
    env[n] = NULL;
    struct mg_slurm sl;
    char err[MG_ERRMSG_LEN];
    mg_slurm_detect(env, &sl, err, sizeof(err));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char *text = malloc(size);
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    switch (data[0] & 3) {
    case 0:
        desc(text);
        break;
    case 1: {
        struct mg_rdzv_failure f;
        rdzv_fail_parse(text, &f);
        break;
    }
    case 2: {
        char **hosts;
        int n;
        if (mg_hostlist_expand(text, 4096, &hosts, &n) == 0)
            mg_hostlist_free(hosts, n);
        break;
    }
    case 3:
        slurm(text);
        break;
    }
    free(text);
    return 0;
}
