/* Fuzz harness: mglaunch's command line (launcher/opts.c): the input, split
 * at NUL bytes, is argv; the strings of the form PET_...=... are its
 * environment instead (torchrun's PET_ fallbacks). What parses is then
 * resolved against a host, as main does. */
#include "fuzz.h"
#include "opts.h"
#include "mg_err.h"

#include <stdlib.h>
#include <string.h>

#define MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1), *parts[MAX_ARGS], *argv[MAX_ARGS + 2], *env[MAX_ARGS + 1];
    char err[MG_ERRMSG_LEN];
    int n = fuzz_split(data, size, buf, parts, MAX_ARGS), argc = 0, nenv = 0;

    argv[argc++] = "mglaunch";
    for (int i = 0; i < n; i++) {
        if (!strncmp(parts[i], "PET_", 4) && strchr(parts[i], '='))
            env[nenv++] = parts[i];
        else
            argv[argc++] = parts[i];
    }
    argv[argc] = NULL;
    env[nenv] = NULL;

    struct mg_launch_opts o;
    if (mg_opts_parse(&o, argc, argv, env, err, sizeof(err)) == 0 && o.prog_argv) {
        struct mg_host_info host = {.ncpu = 4, .ngpu = 2};
        if (mg_opts_resolve(&o, &host, err, sizeof(err)) == 0) {
            char id[64];
            for (int i = 0; i < o.nproc && i < 8; i++) {
                mg_opts_rank_shown(&o, i);
                mg_opts_gpu_id(&o, i, id, sizeof(id));
            }
        }
    }
    mg_opts_release(&o);
    free(buf);
    return 0;
}
