/* launcher/pychoose.c's look at a script's imports (which interpreter a
 * .py worker gets) and common/suggest.c's "did you mean" (the near misses
 * of mglaunch's options).
 * timeout: 10 */
#include "pychoose.h"
#include "suggest.h"
#include "tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char dir[] = "/tmp/test_pychoose.XXXXXX";

static void imports(const char *src, int want, const char *want_name)
{
    char path[64], name[64] = "";
    snprintf(path, sizeof(path), "%s/s.py", dir);
    FILE *f = fopen(path, "w");
    fputs(src, f);
    fclose(f);
    int got = mg_py_imports_torch(path, name, sizeof(name));
    char shown[256], *o = shown; /* the source on one line */
    for (const char *c = src; *c && o < shown + sizeof(shown) - 3; c++)
        if (*c == '\n' || *c == '\t') {
            *o++ = '\\';
            *o++ = *c == '\n' ? 'n' : 't';
        } else {
            *o++ = *c;
        }
    *o = '\0';
    is_int(got, want, "imports torch: %s", shown);
    if (want == 1 && want_name)
        is_str(name, want_name, "  names %s", want_name);
}

int main(void)
{
    if (!mkdtemp(dir))
        return 1;
    imports("import torch\n", 1, "torch");
    imports("import os\nimport torch.distributed as dist\n", 1, "torch");
    imports("from torch import nn\n", 1, "torch");
    imports("from torch.nn.parallel import DistributedDataParallel as DDP\n", 1, "torch");
    imports("import numpy as np, torch\n", 1, "torch");
    imports("import numpy, torchvision.models\n", 1, "torchvision");
    imports("def main():\n    import lightning as L\n", 1, "lightning");
    imports("try:\n\timport pytorch_lightning\nexcept ImportError:\n\tpass\n", 1,
            "pytorch_lightning");
    imports("import os, sys\nprint('torch')\n", 0, NULL);
    imports("# import torch\n", 0, NULL);
    imports("import torchmetrics\n", 0, NULL); /* another name that starts the same */
    imports("from os import torch\n", 0, NULL);
    imports("import jax\nx = 'import torch'\n", 0, NULL);
    imports("import torch", 1, "torch"); /* no newline at the end */
    char name[8];
    is_int(mg_py_imports_torch("/nonexistent/x.py", name, sizeof(name)), -2,
           "a missing script: -ENOENT");
    char path[64];
    snprintf(path, sizeof(path), "%s/s.py", dir);
    unlink(path);
    rmdir(dir);

    const char *const opts[] = {
        "nnodes",      "nproc_per_node", "rdzv_id",      "rdzv_backend", "log_dir",
        "master_port", "master_addr",    "max_restarts", "tee",          "role"};
    size_t n = sizeof(opts) / sizeof(opts[0]);
    is_int(mg_suggest("nprocs_per_node", opts, n), 1, "nprocs_per_node: nproc_per_node");
    is_int(mg_suggest("nproc-per-nodes", opts, n), 1, "dashes count as underscores");
    is_int(mg_suggest("rdvz_id", opts, n), 2, "two letters swapped: one edit");
    is_int(mg_suggest("logdir", opts, n), 4, "a letter dropped");
    is_int(mg_suggest("max_restart", opts, n), 7, "max_restart: max_restarts");
    is_int(mg_suggest("master_por", opts, n), 5, "master_por: master_port");
    is_int(mg_suggest("bogus", opts, n), -1, "nothing near: no suggestion");
    is_int(mg_suggest("tea", opts, n), 8, "a short name: one edit");
    is_int(mg_suggest("taa", opts, n), -1, "  but not two");
    is_int(mg_suggest("master_ad", opts, n), 6, "master_ad: master_addr, the nearer");
    const char *const twins[] = {"abcd_x", "abcd_y"};
    is_int(mg_suggest("abcd_z", twins, 2), -1, "two names as near: no suggestion");
    return done_testing();
}
