/* Choosing the Python of .py workers when PYTHON_EXEC is unset (see
 * pychoose.h): the script's imports, and which interpreter has torch. */
#include "pychoose.h"
#include "mg_err.h"
#include "net.h"
#include "workerenv.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SCRIPT_SCAN_BYTES (256 * 1024)

static const char *const torch_pkgs[] = {"torch",     "torchvision",       "torchaudio",
                                         "torchtext", "pytorch_lightning", "lightning"};

static int is_torch_pkg(const char *s, size_t n)
{
    size_t k = 0; /* its first component: torch.distributed is torch */
    while (k < n && s[k] != '.')
        k++;
    for (size_t i = 0; i < sizeof(torch_pkgs) / sizeof(torch_pkgs[0]); i++)
        if (strlen(torch_pkgs[i]) == k && strncmp(s, torch_pkgs[i], k) == 0)
            return 1;
    return 0;
}

static int ident(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.';
}

/* One line: "import a.b as c, d" or "from a.b import c" (indented too:
 * an import inside main() or a try block counts). */
static int line_imports(const char *s, const char *end, char *name, size_t cap)
{
    while (s < end && (*s == ' ' || *s == '\t'))
        s++;
    int from = end - s > 5 && strncmp(s, "from ", 5) == 0;
    if (!from && !(end - s > 7 && strncmp(s, "import ", 7) == 0))
        return 0;
    s += from ? 5 : 7;
    for (;;) {
        while (s < end && (*s == ' ' || *s == '\t' || *s == '('))
            s++;
        const char *m = s;
        while (s < end && ident(*s))
            s++;
        if (s > m && is_torch_pkg(m, (size_t)(s - m))) {
            const char *dot = memchr(m, '.', (size_t)(s - m)); /* the package: torch of torch.nn */
            mg_fmt(name, cap, "%.*s", (int)((dot ? dot : s) - m), m);
            return 1;
        }
        if (from) /* from X import ...: only X is a module */
            return 0;
        while (s < end && *s != ',' && *s != '#' && *s != ';')
            s++; /* past " as alias" */
        if (s >= end || *s != ',')
            return 0;
        s++;
    }
}

int mg_py_imports_torch(const char *script, char *name, size_t cap)
{
    int fd = open(script, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    char *buf = malloc(SCRIPT_SCAN_BYTES);
    if (!buf) {
        close(fd);
        return -ENOMEM;
    }
    size_t len = 0;
    ssize_t n;
    while (len < SCRIPT_SCAN_BYTES &&
           ((n = read(fd, buf + len, SCRIPT_SCAN_BYTES - len)) > 0 || (n < 0 && errno == EINTR)))
        if (n > 0)
            len += (size_t)n;
    close(fd);
    int found = 0;
    for (const char *s = buf, *end = buf + len; s < end && !found;) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *le = nl ? nl : end;
        found = line_imports(s, le, name, cap);
        s = le + 1;
    }
    free(buf);
    return found;
}

int mg_py_has_module(const char *python, const char *module, int timeout_ms)
{
    char code[256];
    mg_fmt(code, sizeof(code),
           "import importlib.util,sys;sys.exit(0 if importlib.util.find_spec('%s') else 1)",
           module);
    char *argv[] = {(char *)python, "-c", code, NULL};
    int status;
    pid_t pid = fork();
    if (pid < 0)
        return 0;
    if (pid == 0) { /* its answer is its exit status; its output goes nowhere */
        int fd = open("/dev/null", O_RDWR);
        if (fd >= 0) {
            dup2(fd, 0);
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(python, argv);
        _exit(127);
    }
    int64_t deadline = mg_now_ms() + timeout_ms;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            return WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (w < 0 && errno != EINTR)
            return 0;
        if (mg_now_ms() >= deadline) { /* a hung interpreter is not one to choose */
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return 0;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

int mg_py_choose(const char *script, const char *path_env, const char *system,
                 struct mg_py_choice *out)
{
    char mod[64], first[PATH_MAX], a[PATH_MAX], b[PATH_MAX];
    out->python[0] = out->why[0] = '\0';
    if (!script || mg_py_imports_torch(script, mod, sizeof(mod)) != 1)
        return 0;
    if (access(system, X_OK) < 0)
        return 0;
    /* python3 on PATH, unless it is the system's own under another name */
    int found = mg_path_search("python3", path_env, first, sizeof(first)) == 0;
    if (found && realpath(first, a) && realpath(system, b) && strcmp(a, b) == 0)
        return 0;
    if (found && mg_py_has_module(first, "torch", 10000))
        return 0; /* PATH's python3 has it: what `python3 script.py` would run */
    if (!mg_py_has_module(system, "torch", 10000))
        return 0; /* neither has it: python3 from PATH, and the hint if it fails */
    mg_fmt(out->python, sizeof(out->python), "%s", system);
    if (found)
        mg_fmt(out->why, sizeof(out->why),
               "%s imports %s; the python3 first on PATH (%s) has no torch, %s has: running the "
               "workers under %s (PYTHON_EXEC=/path/to/python chooses another)",
               script, mod, first, system, system);
    else
        mg_fmt(out->why, sizeof(out->why),
               "%s imports %s and no python3 is on PATH; %s has torch: running the workers under "
               "it (PYTHON_EXEC=/path/to/python chooses another)",
               script, mod, system);
    return 0;
}
