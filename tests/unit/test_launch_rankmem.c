/* The memory the agent lends each local rank (launcher/rankmem.h): a memfd
 * created, grown, followed and released; a worker inherits its own
 * descriptor across exec (mg_spawn_req.keep_fds) and no other; the variable
 * naming it replaces an inherited one (mg_env_build); and an agent's run
 * keeps one per rank across attempts, each worker finding what its
 * predecessor of the same rank left (mg_agent_rankmem_add). Real workers
 * (/bin/sh) throughout.
 * timeout: 60 */
#include "agent.h"
#include "opts.h"
#include "rankmem.h"
#include "spawn.h"
#include "workerenv.h"
#include "tap.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static char tmp[] = "/tmp/mgtest-rankmem.XXXXXX";

static int run_sh(const char *script, const char *envvar, const int *keep, int nkeep)
{
    struct mg_spawned sp;
    char *argv[] = {"sh", "-c", (char *)script, NULL};
    char *envp[] = {"PATH=/usr/bin:/bin", (char *)envvar, NULL};
    struct mg_spawn_req rq = {.path = "/bin/sh",
                              .argv = argv,
                              .envp = envp,
                              .stdin_fd = -1,
                              .stdout_fd = -1,
                              .stderr_fd = -1,
                              .sentinel_fd = -1,
                              .keep_fds = keep,
                              .nkeep = nkeep};
    int st;
    if (mg_spawn(&rq, &sp) || sp.exec_errno)
        return -1;
    if (waitpid(sp.pid, &st, 0) != sp.pid || !WIFEXITED(st))
        return -1;
    return WEXITSTATUS(st);
}

static void test_region(void)
{
    struct mg_rankmem m, none = {.fd = -1};
    char env[64];
    is_int(mg_rankmem_create(&m, "mg-test-0", 4096), 0, "created");
    ok(m.fd > 2 && m.map && m.size == 4096, "a descriptor and a mapping of 4096 bytes");
    ok((fcntl(m.fd, F_GETFD) & FD_CLOEXEC) != 0, "close-on-exec in the agent");
    const char *p = m.map;
    ok(p[0] == 0 && p[4095] == 0, "zeroed");
    memcpy(m.map, "kept", 5);
    is_int(mg_rankmem_resize(&m, 3 * 4096), 0, "grown");
    p = m.map;
    is_str(p, "kept", "what it held is still there");
    ok(p[3 * 4096 - 1] == 0, "the new bytes read as zero");

    is_int(mg_rankmem_env(&m, "MGT_MEM", env, sizeof(env)), 0, "its variable");
    char want[64];
    snprintf(want, sizeof(want), "MGT_MEM=%d", m.fd);
    is_str(env, want, "names the descriptor");
    is_int(mg_rankmem_env(&m, "MGT_MEM", env, 5), -ENOSPC, "a short buffer is refused");
    is_int(mg_rankmem_env(&none, "MGT_MEM", env, sizeof(env)), -EBADF, "none has no variable");

    /* Kept across exec: the worker writes through its inherited descriptor
     * (opened again through /proc, which must not truncate: 1<>). */
    snprintf(want, sizeof(want), "MGT_MEM=%d", m.fd);
    is_int(run_sh("printf worker 1<>/proc/self/fd/$MGT_MEM", want, &m.fd, 1), 0,
           "the worker opened its descriptor");
    is_str((const char *)m.map, "worker", "and the agent reads what it wrote");
    is_int(run_sh("[ ! -e /proc/self/fd/$MGT_MEM ]", want, NULL, 0), 0,
           "a worker not lent it does not hold it");
    ok((fcntl(m.fd, F_GETFD) & FD_CLOEXEC) != 0, "still close-on-exec in the agent");

    /* The worker grows it; the agent follows, within a cap. */
    is_int(run_sh("truncate -s 65536 /proc/self/fd/$MGT_MEM", want, &m.fd, 1), 0,
           "the worker grew it");
    is_int(mg_rankmem_refresh(&m, 8192), -EFBIG, "above the cap: refused");
    ok(m.size == 3 * 4096, "and the old mapping stays");
    is_int(mg_rankmem_refresh(&m, 1 << 20), 0, "followed");
    ok(m.size == 65536 && ((const char *)m.map)[65535] == 0, "mapped at its new size");
    is_str((const char *)m.map, "worker", "contents kept");

    mg_rankmem_release(&m);
    ok(m.fd == -1 && m.map == NULL && m.size == 0, "released");
    mg_rankmem_release(&m);
    ok(m.fd == -1, "released twice");
    is_int(mg_rankmem_resize(&m, 10), -EBADF, "none cannot be resized");

    struct mg_rankmem z;
    is_int(mg_rankmem_create(&z, "mg-test-empty", 0), 0, "an empty one");
    ok(z.map == NULL && z.fd >= 0, "has a descriptor and no mapping");
    mg_rankmem_release(&z);
}

static void test_env(void)
{
    char *base[] = {"PATH=/usr/bin", "MGT_MEM=99", "MGT_MEMX=1", NULL};
    char *extra[] = {"MGT_MEM=7", NULL};
    char **env = NULL;
    struct mg_worker_env we = {.role_name = "default",
                               .master_addr = "127.0.0.1",
                               .run_id = "r",
                               .error_file = "/e",
                               .attempt = -1,
                               .extra = extra};
    is_int(mg_env_build(base, &we, &env), 0, "built");
    int n = 0, seven = 0, other = 0;
    for (char **e = env; e && *e; e++) {
        n += strncmp(*e, "MGT_MEM=", 8) == 0;
        seven += strcmp(*e, "MGT_MEM=7") == 0;
        other += strcmp(*e, "MGT_MEMX=1") == 0;
    }
    ok(n == 1 && seven == 1, "the agent's MGT_MEM replaces the inherited one");
    is_int(other, 1, "a longer name that starts the same is kept");
    free(env);
}

/* An agent on one node: the group is formed at once. */
static int next_round(void *impl, struct mg_agent *ag, const struct mg_round_info *info)
{
    (void)impl;
    (void)info;
    struct mg_group g = {.group_world_size = 1,
                         .world_size = 2,
                         .role_world_size = 2,
                         .master_addr = "127.0.0.1",
                         .master_port = 29999,
                         .master_fd = -1};
    return mg_agent_group_formed(ag, &g);
}

static const struct mg_rdzv_ops ops = {.name = "test", .next_round = next_round};

static void test_agent(void)
{
    struct mg_launch_opts o;
    char err[512];
    /* Attempt 0: each rank leaves "r<rank>" in its memory and fails.
     * Attempt 1: each prints what its predecessor left and how many mg
     * memories it holds (its own only), then succeeds. */
    /* (rank 1 fails only once rank 0 has written: a failure stops the other) */
    static char script[1024];
    snprintf(script, sizeof(script),
             "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then printf r$RANK "
             "1<>/proc/self/fd/$MGT_MEM; if [ $RANK = 0 ]; then touch %s/r0; exec sleep 30; fi; "
             "while [ ! -e %s/r0 ]; do sleep 0.01; done; exit 3; fi; head -c2 "
             "/proc/self/fd/$MGT_MEM; echo \" $(ls -l /proc/self/fd/ | grep -c memfd:mg-test-)\"",
             tmp, tmp);
    char *argv[] = {"mglaunch", "--nproc_per_node", "2", "--max_restarts", "1", "sh", "-c", script,
                    NULL};
    struct mg_host_info host = {.ncpu = 2};
    if (mg_opts_parse(&o, 8, argv, NULL, err, sizeof(err)) ||
        mg_opts_resolve(&o, &host, err, sizeof(err)))
        BAIL_OUT("options: %s", err);
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    char *wargv[] = {"sh", "-c", script, NULL};
    struct mg_agent_config cfg = {
        .opts = &o,
        .run_id = "lent",
        .hostname = "testhost",
        .exec_path = "/bin/sh",
        .argv = wargv,
        .argc = 3,
        .environ = environ,
        .log_dir = tmp,
        .log_dir_given = 1,
        .stdin_fd = -1,
        .out_fd = null,
        .err_fd = null,
        .rdzv = &ops,
    };
    struct mg_agent *ag;
    if (mg_agent_create(&ag, &cfg, err, sizeof(err)))
        BAIL_OUT("agent: %s", err);
    is_int(mg_agent_rankmem_add(ag, "MGT_MEM=", "test", 4096), -EINVAL, "a bad variable name");
    int k = mg_agent_rankmem_add(ag, "MGT_MEM", "test", 4096);
    /* (after the watchdog's progress records, on by default) */
    ok(k >= 0, "a memory registered");
    ok(mg_agent_rankmem(ag, k, 2) == NULL && mg_agent_rankmem(ag, k + 1, 0) == NULL,
       "no region past the ranks or the kinds");
    int code = mg_agent_run(ag);
    is_int(code, 0, "the run succeeds on its second attempt");
    for (int r = 0; r < 2; r++) {
        char path[600], line[64] = "", want[16];
        snprintf(path, sizeof(path), "%s/lent/attempt_1/%d/stdout.log", tmp, r);
        FILE *f = fopen(path, "r");
        if (f) {
            if (!fgets(line, sizeof(line), f))
                line[0] = '\0';
            fclose(f);
        }
        snprintf(want, sizeof(want), "r%d 1\n", r);
        is_str(line, want, "rank's second worker found its predecessor's record, and holds one");
        const struct mg_rankmem *m = mg_agent_rankmem(ag, k, r);
        ok(m && m->map && memcmp(m->map, want, 2) == 0, "the agent reads it too");
    }
    mg_agent_release(ag);
    mg_opts_release(&o);
    close(null);
}

int main(void)
{
    if (!mkdtemp(tmp))
        BAIL_OUT("mkdtemp");
    test_region();
    test_env();
    test_agent();
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        diag("could not remove %s", tmp);
    return done_testing();
}
