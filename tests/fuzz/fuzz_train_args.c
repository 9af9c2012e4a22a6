/* Fuzz harness: train's command line (models/train_args.c): the input, split
 * at NUL bytes, is argv. */
#include "fuzz.h"
#include "mg_err.h"
#include "train_args.h"

#include <stdlib.h>

#define MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1), *argv[MAX_ARGS + 2];
    char err[MG_ERRMSG_LEN];
    argv[0] = "train";
    int argc = 1 + fuzz_split(data, size, buf, argv + 1, MAX_ARGS);
    argv[argc] = NULL;
    struct train_options o;
    train_args_parse(&o, argc, argv, err, sizeof(err));
    free(buf);
    return 0;
}
