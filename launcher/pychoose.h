/* Which Python runs a .py worker when PYTHON_EXEC is unset (docs/cli.md,
 * "The program"). torchrun runs its workers under its own interpreter, which
 * has torch by construction; mglaunch has none of its own, so for a script
 * that imports torch it takes, between the python3 first on PATH and the
 * system's, the one that has torch. */
#ifndef MG_PYCHOOSE_H
#define MG_PYCHOOSE_H

#include <stddef.h>

#define MG_PY_SYSTEM "/usr/bin/python3"

/* Whether a Python script imports torch or a package built on it (torchvision,
 * lightning, ...): a look at its import lines (its first 256 KiB), no Python run.
 * Sets *name to the module it saw. 1 yes, 0 no, or a negative errno. */
int mg_py_imports_torch(const char *script, char *name, size_t cap);

/* Whether python can find module (importlib's find_spec, without importing
 * it), within timeout_ms: 1 yes, 0 no (or it did not answer in time). */
int mg_py_has_module(const char *python, const char *module, int timeout_ms);

struct mg_py_choice {
    char python[4096]; /* the interpreter to run; "" keeps python3 from PATH */
    char why[1024];    /* one line saying so, when python is not "" */
};

/* For script (a .py worker) with PYTHON_EXEC unset: when it imports torch
 * and the python3 first on path_env lacks torch while the system's
 * (system, normally MG_PY_SYSTEM) has it, the system's. Returns 0. */
int mg_py_choose(const char *script, const char *path_env, const char *system,
                 struct mg_py_choice *out);

#endif
