/* Worker process helpers: the worker environment and program lookup
 * (workerenv.h), GPU counting with CUDA_VISIBLE_DEVICES rules (gpus.h),
 * spawning with exec-failure reporting (spawn.h), and signal names (proc.h). */
#include "gpus.h"
#include "proc.h"
#include "spawn.h"
#include "workerenv.h"
#include "tap.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmp[] = "/tmp/mgtest-proc.XXXXXX";

static void touch(const char *path, int mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    if (fd >= 0) {
        ssize_t rc = write(fd, "#!/bin/sh\nexit 0\n", 17);
        (void)rc;
        close(fd);
    }
    chmod(path, (mode_t)mode);
}

static void test_env(void)
{
    char *base[] = {"PATH=/usr/bin",
                    "RANK=99",
                    "MG_ATTEMPT=9",
                    "HOME=/root",
                    "CUDA_VISIBLE_DEVICES=7",
                    "WORLD_SIZE=1",
                    "NCCL_ASYNC_ERROR_HANDLING=0",
                    NULL};
    struct mg_worker_env we = {
        .local_rank = 1,
        .rank = 5,
        .group_rank = 2,
        .role_rank = 5,
        .role_name = "default",
        .local_world_size = 4,
        .world_size = 8,
        .group_world_size = 2,
        .role_world_size = 8,
        .master_addr = "10.0.0.1",
        .master_port = 29501,
        .restart_count = 1,
        .max_restarts = 3,
        .run_id = "job7",
        .error_file = "/logs/job7/attempt_1/1/error.json",
        .cuda_visible_devices = NULL,
        .run_log_dir = "/logs/job7",
        .attempt = 1,
    };
    char **env;
    is_int(mg_env_build(base, &we, &env), 0, "environment built");
    static const char *want[][2] = {
        {"LOCAL_RANK", "1"},
        {"RANK", "5"},
        {"GROUP_RANK", "2"},
        {"ROLE_RANK", "5"},
        {"ROLE_NAME", "default"},
        {"LOCAL_WORLD_SIZE", "4"},
        {"WORLD_SIZE", "8"},
        {"GROUP_WORLD_SIZE", "2"},
        {"ROLE_WORLD_SIZE", "8"},
        {"MASTER_ADDR", "10.0.0.1"},
        {"MASTER_PORT", "29501"},
        {"TORCHELASTIC_RESTART_COUNT", "1"},
        {"TORCHELASTIC_MAX_RESTARTS", "3"},
        {"TORCHELASTIC_RUN_ID", "job7"},
        {"TORCHELASTIC_USE_AGENT_STORE", "False"},
        {"TORCHELASTIC_ERROR_FILE", "/logs/job7/attempt_1/1/error.json"},
        {"NCCL_ASYNC_ERROR_HANDLING", "0"},
        {"OMP_NUM_THREADS", "1"},
        {"CUDA_VISIBLE_DEVICES", "7"},
        {"MG_RUN_LOG_DIR", "/logs/job7"},
        {"MG_ATTEMPT", "1"},
        {"PATH", "/usr/bin"},
        {"HOME", "/root"},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        is_str(mg_env_get(env, want[i][0]), want[i][1], "%s", want[i][0]);
    int ranks = 0;
    for (char **e = env; *e; e++)
        ranks += strncmp(*e, "RANK=", 5) == 0;
    is_int(ranks, 1, "inherited RANK replaced, not duplicated");
    free(env);

    char *omp[] = {"OMP_NUM_THREADS=4", NULL};
    we.cuda_visible_devices = "3,1";
    mg_env_build(omp, &we, &env);
    is_str(mg_env_get(env, "OMP_NUM_THREADS"), "4", "OMP_NUM_THREADS kept when set");
    is_str(mg_env_get(env, "CUDA_VISIBLE_DEVICES"), "3,1", "GPU mapping sets the device list");
    is_str(mg_env_get(env, "NCCL_ASYNC_ERROR_HANDLING"), "1", "NCCL_ASYNC_ERROR_HANDLING default");
    is_str(mg_env_get(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1",
           "TORCH_NCCL_ASYNC_ERROR_HANDLING default (torchrun 2.x)");
    free(env);
    we.local_world_size = 1;
    mg_env_build(NULL, &we, &env);
    ok(mg_env_get(env, "OMP_NUM_THREADS") == NULL, "one worker: OMP_NUM_THREADS not set");
    ok(mg_env_get(env, "MG_STORE_TOKEN") == NULL, "no store token given: MG_STORE_TOKEN not set");
    free(env);
    we.store_token = "feed";
    mg_env_build(NULL, &we, &env);
    is_str(mg_env_get(env, "MG_STORE_TOKEN"), "feed", "the group's store token");
    free(env);
    char *mine[] = {"MG_STORE_TOKEN=mine", NULL};
    mg_env_build(mine, &we, &env);
    is_str(mg_env_get(env, "MG_STORE_TOKEN"), "mine", "an inherited MG_STORE_TOKEN wins");
    int n = 0;
    for (char **e = env; *e; e++)
        n += strncmp(*e, "MG_STORE_TOKEN=", 15) == 0;
    is_int(n, 1, "once");
    free(env);
    char *inherited[] = {"MG_RUN_LOG_DIR=/elsewhere", "MG_ATTEMPT=3", NULL};
    we.run_log_dir = NULL;
    we.attempt = -1;
    mg_env_build(inherited, &we, &env);
    ok(mg_env_get(env, "MG_RUN_LOG_DIR") == NULL && mg_env_get(env, "MG_ATTEMPT") == NULL,
       "no run directory: inherited MG_RUN_LOG_DIR and MG_ATTEMPT are dropped");
    free(env);
}

static void test_gpus(void)
{
    char proc[256], dev[256], p[300];
    snprintf(proc, sizeof(proc), "%s/gpus", tmp);
    snprintf(dev, sizeof(dev), "%s/dev", tmp);
    mkdir(proc, 0755);
    mkdir(dev, 0755);
    is_int(mg_gpu_count_system(proc, dev), 0, "no GPU");
    const char *devs[] = {"nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm", "nvidia"};
    for (size_t i = 0; i < sizeof(devs) / sizeof(devs[0]); i++) {
        snprintf(p, sizeof(p), "%s/%s", dev, devs[i]);
        touch(p, 0644);
    }
    is_int(mg_gpu_count_system(proc, dev), 3, "/dev/nvidiaN counted, control nodes not");
    snprintf(p, sizeof(p), "%s/0000:17:00.0", proc);
    mkdir(p, 0755);
    snprintf(p, sizeof(p), "%s/0000:65:00.0", proc);
    mkdir(p, 0755);
    is_int(mg_gpu_count_system(proc, dev), 2, "/proc/driver/nvidia/gpus preferred");

    is_int(mg_gpu_count_visible(NULL, 4), 4, "unset: all");
    is_int(mg_gpu_count_visible("", 4), 0, "empty: none");
    is_int(mg_gpu_count_visible("2,0", 4), 2, "two listed");
    is_int(mg_gpu_count_visible("0,7,1", 4), 1, "stops at an index out of range");
    is_int(mg_gpu_count_visible("-1", 4), 0, "-1 hides everything");
    is_int(mg_gpu_count_visible("GPU-abc,MIG-def", 1), 2, "UUIDs count");
    is_int(mg_gpu_count_visible("1, 0", 2), 2, "spaces tolerated");
    is_int(mg_gpu_count_visible("0,x", 2), 1, "stops at garbage");

    struct mg_launch_opts o;
    char err[256], cvd[MG_GPU_IDS_MAX];
    char *with[] = {"mglaunch", "--nproc_per_node", "2", "--gpu_ids", "3,1", "prog", NULL};
    if (mg_opts_parse(&o, 6, with, NULL, err, sizeof(err)))
        BAIL_OUT("options: %s", err);
    mg_gpu_visible_devices(&o, 2, cvd, sizeof(cvd));
    is_str(cvd, "3,1", "--gpu_ids: CUDA_VISIBLE_DEVICES in local-rank order");
    mg_gpu_visible_devices(&o, 1, cvd, sizeof(cvd));
    is_str(cvd, "3", "only the local ranks that run");
    mg_opts_release(&o);
    char *without[] = {"mglaunch", "prog", NULL};
    if (mg_opts_parse(&o, 2, without, NULL, err, sizeof(err)))
        BAIL_OUT("options: %s", err);
    mg_gpu_visible_devices(&o, 1, cvd, sizeof(cvd));
    is_str(cvd, "", "no --gpu_ids: the inherited value is left alone");
    mg_opts_release(&o);
}

static void test_prog(void)
{
    struct mg_prog pr;
    char bin[256], self[256], p[300];
    snprintf(bin, sizeof(bin), "%s/bin", tmp);
    snprintf(self, sizeof(self), "%s/self", tmp);
    mkdir(bin, 0755);
    mkdir(self, 0755);
    snprintf(p, sizeof(p), "%s/tool", bin);
    touch(p, 0755);
    snprintf(p, sizeof(p), "%s/train", self);
    touch(p, 0755);
    snprintf(p, sizeof(p), "%s/noexec", bin);
    touch(p, 0644);

    struct mg_prog_req rq = {.program = "tool", .path_env = bin, .self_dir = self};
    mg_prog_resolve(&rq, &pr);
    snprintf(p, sizeof(p), "%s/tool", bin);
    is_str(pr.path, p, "found in PATH");
    is_int(pr.nlead, 0, "run directly");
    rq.program = "train";
    mg_prog_resolve(&rq, &pr);
    snprintf(p, sizeof(p), "%s/train", self);
    is_str(pr.path, p, "found next to mglaunch");
    rq.program = "noexec";
    mg_prog_resolve(&rq, &pr);
    is_str(pr.path, "noexec", "not executable: left for exec to report");
    rq.program = "./rel/prog";
    is_int(mg_prog_resolve(&rq, &pr), -ENOENT, "a missing path is reported");
    is_str(pr.path, "./rel/prog", "a path is used as is");
    rq.program = "no-such-tool";
    is_int(mg_prog_resolve(&rq, &pr), -ENOENT, "a name found nowhere is reported");

    rq.program = "train.py";
    rq.path_env = "/usr/bin:/bin";
    mg_prog_resolve(&rq, &pr);
    is_int(pr.nlead, 2, ".py runs under python");
    is_str(pr.lead[0], "python3", "python3");
    is_str(pr.lead[1], "-u", "unbuffered");
    ok(strstr(pr.path, "python3") != NULL, "python3 located: %s", pr.path);
    rq.python = "/opt/py/bin/python3.11";
    mg_prog_resolve(&rq, &pr);
    is_str(pr.path, "/opt/py/bin/python3.11", "PYTHON_EXEC honoured");
    rq.python = NULL;
    rq.no_python = 1;
    mg_prog_resolve(&rq, &pr);
    is_int(pr.nlead, 0, "--no_python runs a .py directly");
    rq.no_python = 0;
    rq.module = 1;
    rq.program = "pkg.train";
    mg_prog_resolve(&rq, &pr);
    ok(pr.nlead == 3 && strcmp(pr.lead[2], "-m") == 0, "-m: python3 -u -m");
}

static int wait_code(pid_t pid)
{
    int st;
    waitpid(pid, &st, 0);
    return mg_status_code(st);
}

static void test_spawn(void)
{
    struct mg_spawned sp;
    char *argv[] = {"sh", "-c", "exit 3", NULL};
    char *envp[] = {"PATH=/usr/bin:/bin", NULL};
    struct mg_spawn_req rq = {.path = "/bin/sh",
                              .argv = argv,
                              .envp = envp,
                              .stdin_fd = -1,
                              .stdout_fd = -1,
                              .stderr_fd = -1,
                              .sentinel_fd = -1};
    is_int(mg_spawn(&rq, &sp), 0, "spawned");
    is_int(sp.exec_errno, 0, "exec succeeded");
    is_int(getpgid(sp.pid), sp.pid, "own process group");
    is_int(wait_code(sp.pid), 3, "exit code");

    rq.path = "/nonexistent/prog";
    mg_spawn(&rq, &sp);
    is_int(sp.exec_errno, ENOENT, "missing program reported");
    is_int(wait_code(sp.pid), 127, "exits 127");
    char p[300];
    snprintf(p, sizeof(p), "%s/bin/noexec", tmp);
    rq.path = p;
    mg_spawn(&rq, &sp);
    is_int(sp.exec_errno, EACCES, "not executable reported");
    is_int(wait_code(sp.pid), 126, "exits 126");

    /* The child gets the pipe as stdout and announces its group. */
    int out[2], sent[2];
    char buf[64] = "";
    int pg = 0;
    pipe(out);
    pipe(sent);
    char *echo[] = {"sh", "-c", "echo hi $$", NULL};
    rq.path = "/bin/sh";
    rq.argv = echo;
    rq.stdout_fd = out[1];
    rq.sentinel_fd = sent[1];
    mg_spawn(&rq, &sp);
    close(out[1]);
    wait_code(sp.pid);
    ssize_t n = read(out[0], buf, sizeof(buf) - 1);
    buf[n > 0 ? n : 0] = '\0';
    char want[64];
    snprintf(want, sizeof(want), "hi %d\n", (int)sp.pid);
    is_str(buf, want, "stdout goes to the pipe");
    ok(read(sent[0], &pg, sizeof(pg)) == sizeof(pg) && pg == sp.pid, "group announced");
    close(out[0]);
    close(sent[0]);
    close(sent[1]);
}

static void test_signals(void)
{
    char b[32];
    is_str(mg_signame(SIGSEGV, b, sizeof(b)), "SIGSEGV", "SIGSEGV");
    is_str(mg_signame(SIGTERM, b, sizeof(b)), "SIGTERM", "SIGTERM");
    is_int(mg_signum("SIGKILL"), SIGKILL, "SIGKILL by name");
    is_int(mg_signum("USR1"), SIGUSR1, "USR1 without SIG");
    is_int(mg_signum("15"), 15, "by number");
    is_int(mg_signum("NOPE"), -EINVAL, "unknown");
    is_int(mg_status_code(3 << 8), 3, "exit status");
    is_int(mg_status_code(SIGKILL), 137, "signal status");
}

int main(void)
{
    if (!mkdtemp(tmp))
        BAIL_OUT("mkdtemp");
    test_env();
    test_gpus();
    test_prog();
    test_spawn();
    test_signals();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        diag("could not remove %s", tmp);
    return done_testing();
}
