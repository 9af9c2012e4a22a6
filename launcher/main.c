/* mglaunch: a torchrun-compatible launcher (docs/cli.md, docs/man/mglaunch.1).
 *
 *   mglaunch [options] PROGRAM [ARGS...]     run nproc_per_node workers
 *   mglaunch logs [LOG_DIR] [selectors]      inspect per-rank logs
 *   mglaunch dashboard [LOG_DIR] [options]   a web page of the runs (mglaunch-dashboard)
 *   mglaunch dump [LOG_DIR] [--run ID]       stacks and flight records of a running job
 *
 * The only file that prints errors and decides exit codes: 0 success, the
 * root cause's code after a worker failure, 2 for bad usage, 128+N after
 * signal N, 1 for the launcher's own failures. */
#include "agent.h"
#include "logdir.h"
#include "logs_cmd.h"
#include "dump_cmd.h"
#include "mg_config.h"
#include "mg_err.h"
#include "opts.h"
#include "output.h"
#include "gpus.h"
#include "workerenv.h"
#include "pychoose.h"
#include "cpus.h"
#include "rdzv.h"
#include "pty.h"
#include "summary.h"
#include "redact.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

extern char **environ;

static const char usage[] =
    "usage: mglaunch [options] PROGRAM [ARGS...]\n"
    "       mglaunch logs [LOG_DIR] [PROGRAM] [--cmd TEXT] [--run ID] [--attempt N|last|all]\n"
    "                     [--rank R[,R...]] [--stream stdout|stderr|both] [--tail N] [--follow]\n"
    "                     [--grep REGEX]\n"
    "       mglaunch logs [LOG_DIR] [PROGRAM] [--cmd TEXT] [--run ID] --plot FILE.svg\n"
    "       mglaunch dashboard [LOG_DIR] [--host ADDR] [--port N] [--token TOKEN]\n"
    "       mglaunch dump [LOG_DIR] [--run ID]\n"
    "\n"
    "Starts nproc_per_node workers running PROGRAM with torchrun's environment (RANK,\n"
    "LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), supervises them, restarts the\n"
    "group when a worker fails, and exits with the first failure's exit code.\n"
    "A PROGRAM ending in .py runs as `python3 -u PROGRAM` (PYTHON_EXEC overrides python3).\n"
    "On a terminal, the ranks shown on the console run on a pseudo-terminal (pdb works).\n"
    "\n"
    "torchrun options (also --flag=value, dashes or underscores, PET_<FLAG> in the environment):\n"
    "  --nproc_per_node N|cpu|gpu|xpu|auto  workers on this node (default 1)\n"
    "  --nnodes N|MIN:MAX               nodes (default 1; Slurm: SLURM_NNODES)\n"
    "  --standalone                     single-node run with a fresh run id\n"
    "  --rdzv_id ID                     run id: TORCHELASTIC_RUN_ID and the log directory name\n"
    "  --rdzv_backend static|c10d|etcd  how the nodes meet (docs/rendezvous.md)\n"
    "  --rdzv_endpoint HOST[:PORT]      c10d: the agent store (29400); etcd: host:2379,...\n"
    "  --rdzv_conf K=V,...              join_timeout (timeout), last_call_timeout, read_timeout,\n"
    "                                   heartbeat_interval, heartbeat_timeout, token, is_host,\n"
    "                                   ... every torchrun key (docs/rendezvous.md)\n"
    "  --local_addr ADDR                with several nodes: this node's address for MASTER_ADDR\n"
    "                                   when it is node rank 0\n"
    "  --max_restarts N                 restarts of the worker group after a failure (0)\n"
    "  --monitor_interval S             accepted; supervision is event-driven\n"
    "  --role NAME                      ROLE_NAME and the log prefix (default)\n"
    "  --log_dir DIR                    save every rank's stdout/stderr under DIR\n"
    "  -r, --redirects 0-3|MAP          streams that go only to the log files (1 out, 2 err)\n"
    "  -t, --tee 0-3|MAP                streams that go to log files and the console, prefixed\n"
    "  --local_ranks_filter 0,1         only these local ranks reach the console\n"
    "  --log_line_prefix_template T     console prefix: ${role_name} ${local_rank} ${rank}\n"
    "                                   ${hostname} (default [${role_name}${local_rank}]:;\n"
    "                                   TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)\n"
    "  --master_addr ADDR               MASTER_ADDR (default 127.0.0.1)\n"
    "  --master_port PORT               MASTER_PORT (default: a free port)\n"
    "  --node_rank R                    static backend: this node's rank (Slurm: SLURM_NODEID)\n"
    "  --start_method M                 accepted (spawn, fork, forkserver); no effect\n"
    "  -m, --module                     run PROGRAM as a python module (python3 -u -m)\n"
    "  --no_python                      run PROGRAM directly, even a .py file\n"
    "  --run_path                       run PROGRAM under python3 -u, whatever its name\n"
    "  --signals-to-handle LIST         signals that stop the workers and the run\n"
    "                                   (default SIGTERM,SIGINT,SIGHUP,SIGQUIT)\n"
    "  --shutdown_timeout S             grace period before SIGKILL when stopping (30;\n"
    "                                   TORCH_ELASTIC_SHUTDOWN_TIMEOUT)\n"
    "  --stop_group_delay S             a stop signal reaches each worker first, the rest\n"
    "                                   of its process group S later (2; 0: all at once,\n"
    "                                   as torchrun; MG_STOP_GROUP_DELAY)\n"
    "  --exit_barrier_timeout S         how long a finished node waits for the others\n"
    "                                   (300; TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT)\n"
    "  --virtual-local-rank             LOCAL_RANK=0 and one visible GPU per worker\n"
    "  --numa-binding node|socket|exclusive|core-complex\n"
    "                                   bind each worker to the CPUs near its GPU\n"
    "  --duplicate-stdout-filters F,..  tee'd lines containing one also go to\n"
    "  --duplicate-stderr-filters F,..  attempt_N/filtered_stdout.log (stderr.log)\n"
    "  --event-log-handler NAME         accepted; mglaunch writes its own event log\n"
    "mg options:\n"
    "  --gpu_ids 0,1                    GPU of each local rank (repeatable): workers see\n"
    "                                   CUDA_VISIBLE_DEVICES=<ids>, device LOCAL_RANK\n"
    "  --hang-timeout S                 a libmg rank without progress for max(S, 10 x its\n"
    "                                   slowest recent step) is hung: named, killed, restarted\n"
    "                                   (default 10; 0: off; MG_HANG_TIMEOUT)\n"
    "  -h, --help                       this help\n"
    "  -V, --version                    the version\n"
    "\n"
    "Documentation: docs/cli.md, docs/environment.md, docs/logs.md, man mglaunch.\n";

static void host_info(struct mg_host_info *h, char *why, size_t cap, char *xwhy, size_t xcap)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    h->ncpu = n > 0 ? (int)n : 1;
    h->ngpu = mg_gpu_count_usable(why, cap);
    h->no_gpu_why = h->ngpu > 0 ? NULL : why;
    h->nxpu = mg_xpu_count(NULL, xwhy, xcap);
    h->no_xpu_why = h->nxpu ? NULL : xwhy;
}

/* More workers than cores, when they train on the CPU (no GPU here): once,
 * before they start. With GPUs the cores mostly wait on them. */
static void warn_cpus(const struct mg_launch_opts *o, const struct mg_host_info *h)
{
    char why[200], how[PATH_MAX + 128], msg[PATH_MAX + 1024];
    if (o->nproc <= 1)
        return;
    int ngpu = o->nproc_kind != MG_NPROC_NUM ? h->ngpu : mg_gpu_count_usable(why, sizeof(why));
    if (ngpu > 0)
        return;
    mg_cpus_oversubscribed(o->nproc, mg_cpus_usable("/sys/fs/cgroup", how, sizeof(how)), how, msg,
                           sizeof(msg));
    if (msg[0])
        fprintf(stderr, "mglaunch: %s\n", msg);
}

static void self_dir(char *buf, size_t cap)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    buf[0] = '\0';
    if (n <= 0)
        return;
    exe[n] = '\0';
    snprintf(buf, cap, "%s", dirname(exe));
}

/* Each worker needs three descriptors; raise the soft limit when needed. */
static void raise_fd_limit(int nproc)
{
    mg_nofile_raise((unsigned long)nproc * 4 + 64, NULL, NULL);
}

/* What one `mglaunch PROGRAM` invocation holds until it exits. */
struct launch {
    struct mg_launch_opts o;
    struct mg_prog prog;
    char **wargv; /* the lead arguments (python3 -u) and the program's */
    int wargc;
    char hostname[MG_HOST_MAX];
    char run_id[MG_RUN_ID_MAX + 1];
    char log_dir[PATH_MAX];
    const struct mg_rdzv_ops *rops;
    void *rimpl;
    int stdin_fd;
    int on_tty;                 /* mglaunch runs in the foreground of a terminal (its stdin) */
    struct mg_numa_place *numa; /* --numa-binding, one per local rank */
    const char *py_source;      /* what chose the Python of a .py program (NULL: PATH) */
    struct mg_py_choice py;
};

/* The program and the full worker argv. Returns 0 or mglaunch's exit code. */
static int resolve_program(struct launch *l)
{
    const struct mg_launch_opts *o = &l->o;
    char sdir[PATH_MAX];
    self_dir(sdir, sizeof(sdir));
    struct mg_prog_req preq = {
        .program = o->prog_argv[0],
        .module = o->module,
        .no_python = o->no_python,
        .run_path = o->run_path,
        .python = getenv("PYTHON_EXEC"),
        .path_env = getenv("PATH"),
        .self_dir = sdir[0] ? sdir : NULL,
    };
    int rc = mg_prog_resolve(&preq, &l->prog);
    if (l->prog.nlead && preq.python && *preq.python) {
        l->py_source = "from PYTHON_EXEC"; /* always wins */
    } else if (l->prog.nlead && !o->module) {
        /* torchrun's workers run under torchrun's own Python, which has
         * torch; mglaunch's under python3 from PATH, unless it lacks the
         * torch the script imports and the system's has it (pychoose.h). */
        mg_py_choose(o->prog_argv[0], preq.path_env, MG_PY_SYSTEM, &l->py);
        if (l->py.python[0]) {
            preq.python = l->py.python;
            rc = mg_prog_resolve(&preq, &l->prog);
            l->py_source = "the system's, chosen for the torch the script imports";
            fprintf(stderr, "mglaunch: %s\n", l->py.why);
        }
    }
    if (rc == -ENOENT) {
        if (l->prog.nlead)
            fprintf(stderr, "mglaunch: python interpreter '%s' not found (set PYTHON_EXEC)\n",
                    l->prog.path);
        else if (strchr(o->prog_argv[0], '/'))
            fprintf(stderr, "mglaunch: program '%s' does not exist\n", o->prog_argv[0]);
        else
            fprintf(stderr, "mglaunch: program '%s' not found in PATH or in %s\n", o->prog_argv[0],
                    sdir[0] ? sdir : "mglaunch's directory");
        return 2;
    }
    /* python3 would fail on it in every worker (exit 2): say so once, first */
    struct stat st;
    if (l->prog.nlead && !o->module && stat(o->prog_argv[0], &st) < 0 && errno == ENOENT) {
        fprintf(stderr, "mglaunch: script '%s' does not exist\n", o->prog_argv[0]);
        return 2;
    }
    l->wargc = l->prog.nlead + o->prog_argc;
    l->wargv = calloc((size_t)l->wargc + 1, sizeof(char *));
    if (!l->wargv) {
        fprintf(stderr, "mglaunch: out of memory\n");
        return 1;
    }
    for (int i = 0; i < l->prog.nlead; i++)
        l->wargv[i] = (char *)l->prog.lead[i];
    for (int i = 0; i < o->prog_argc; i++)
        l->wargv[l->prog.nlead + i] = o->prog_argv[i];
    return 0;
}

/* An error from the parts below, on stderr: a usage error echoes the
 * argument, and no secret in it is shown (common/redact.h). */
static void say_error(char *err)
{
    mg_redact_inplace(err, MG_ERRMSG_LEN);
    fprintf(stderr, "mglaunch: %s\n", err);
}

/* --numa-binding: where each worker runs, decided before any starts.
 * Returns 0 or mglaunch's exit code. */
static int plan_numa(struct launch *l)
{
    const struct mg_launch_opts *o = &l->o;
    char err[MG_ERRMSG_LEN];
    char(*pci)[32];
    int rc;
    if (o->numa_binding == MG_NUMA_NONE)
        return 0;
    pci = calloc((size_t)o->nproc, sizeof(*pci));
    l->numa = calloc((size_t)o->nproc, sizeof(*l->numa));
    if (!pci || !l->numa) {
        free(pci);
        fprintf(stderr, "mglaunch: out of memory\n");
        return 1;
    }
    rc = mg_numa_gpus(NULL, o, o->nproc, getenv("CUDA_VISIBLE_DEVICES"), pci, err, sizeof(err));
    if (rc == 0)
        rc = mg_numa_plan(NULL, o->numa_binding, o->nproc, pci, l->numa, err, sizeof(err));
    free(pci);
    if (rc) {
        say_error(err);
        return 2;
    }
    return 0;
}

/* --log_dir made absolute, or the private default. Returns 0 or mglaunch's exit code. */
static int resolve_log_dir(struct launch *l)
{
    const char *given = l->o.log_dir;
    char cwd[PATH_MAX];
    int rc;
    if (!given) {
        if ((rc = mg_logdir_default(l->log_dir, sizeof(l->log_dir)))) {
            fprintf(stderr, "mglaunch: cannot use the default log directory '%s': %s\n", l->log_dir,
                    mg_strerror(rc));
            return 1;
        }
        return 0;
    }
    /* Absolute, so TORCHELASTIC_ERROR_FILE works for a worker that changes directory. */
    if (given[0] != '/' && getcwd(cwd, sizeof(cwd)))
        rc = mg_fmt(l->log_dir, sizeof(l->log_dir), "%s/%s", cwd, given);
    else
        rc = mg_fmt(l->log_dir, sizeof(l->log_dir), "%s", given);
    if (rc < 0) {
        fprintf(stderr, "mglaunch: invalid value for --log_dir: path too long\n");
        return 2;
    }
    return 0;
}

static struct mg_agent_config build_config(const struct launch *l)
{
    return (struct mg_agent_config){
        .opts = &l->o,
        .run_id = l->run_id,
        .hostname = l->hostname,
        .exec_path = l->prog.path,
        .argv = l->wargv,
        .argc = l->wargc,
        .environ = environ,
        .log_dir = l->log_dir,
        .log_dir_given = l->o.log_dir != NULL,
        .stdin_fd = l->stdin_fd,
        .on_tty = l->on_tty,
        .out_fd = 1,
        .err_fd = 2,
        .status = stderr,
        .sentinel = 1,
        .rdzv = l->rops,
        .rdzv_impl = l->rimpl,
        .numa = l->numa,
        .python = l->prog.nlead ? l->prog.path : NULL,
        .python_source = l->py_source,
    };
}

/* Runs the agent and prints the summary of a run that did not succeed. */
static int supervise(const struct launch *l)
{
    struct mg_agent_config cfg = build_config(l);
    struct mg_agent *ag;
    char err[MG_ERRMSG_LEN];
    int rc = mg_agent_create(&ag, &cfg, err, sizeof(err));
    if (rc) {
        say_error(err);
        return 1;
    }
    /* memory that outlives a worker, for train's in-memory snapshots
     * (docs/train.md): empty until a worker sizes it */
    rc = mg_agent_rankmem_add(ag, "MG_SNAPSHOT_FD", "snapshot", 0);
    if (rc < 0)
        fprintf(stderr,
                "mglaunch: warning: cannot create the memory workers keep snapshots in: %s; a "
                "restarted worker resumes from its checkpoints only\n",
                mg_strerror(rc));
    int code = mg_agent_run(ag);
    const struct mg_agent_result *res = mg_agent_result(ag);
    if (!res->ok)
        mg_summary_print(stderr, res);
    mg_agent_release(ag);
    return code;
}

static int run(int argc, char **argv)
{
    struct launch launch = {.stdin_fd = -1}, *l = &launch;
    struct mg_host_info host = {0};
    char err[MG_ERRMSG_LEN], why[200], xwhy[200];
    int rc, code;

    if (mg_opts_parse(&l->o, argc, argv, environ, err, sizeof(err))) {
        say_error(err);
        code = 2;
        goto out;
    }
    if (l->o.help || l->o.version) {
        if (l->o.help)
            fputs(usage, stdout);
        else
            printf("mglaunch %s\n", MG_VERSION);
        code = 0;
        goto out;
    }
    if (l->o.nproc_kind != MG_NPROC_NUM)
        host_info(&host, why, sizeof(why), xwhy, sizeof(xwhy));
    if (mg_opts_resolve(&l->o, &host, err, sizeof(err))) {
        say_error(err);
        code = 2;
        goto out;
    }
    if ((code = resolve_program(l)) || (code = plan_numa(l)))
        goto out;
    warn_cpus(&l->o, &host);
    if (l->o.virtual_local_rank) {
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
        char dev[MG_GPU_ID_LEN];
        if (mg_virtual_device(&l->o, cvd, l->o.nproc - 1, dev, sizeof(dev))) {
            fprintf(stderr,
                    "mglaunch: --virtual-local-rank: local rank %d has no GPU: "
                    "CUDA_VISIBLE_DEVICES='%s' lists fewer than %d\n",
                    l->o.nproc - 1, cvd ? cvd : "", l->o.nproc);
            code = 2;
            goto out;
        }
    }

    mg_fmt(l->hostname, sizeof(l->hostname), "localhost");
    gethostname(l->hostname, sizeof(l->hostname) - 1);
    if (l->o.rdzv_id)
        snprintf(l->run_id, sizeof(l->run_id), "%s", l->o.rdzv_id);
    else
        mg_run_id_generate(l->run_id, sizeof(l->run_id));
    if ((code = resolve_log_dir(l)))
        goto out;

    if ((rc = mg_rdzv_create(&l->o, stderr, &l->rops, &l->rimpl, err, sizeof(err)))) {
        say_error(err);
        l->rops = NULL;
        code = rc == -MG_EUNSUPPORTED || rc == -EINVAL ? 2 : 1;
        goto out;
    }
    const char *notice = mg_rdzv_notice(l->rops, l->rimpl);
    if (notice)
        fprintf(stderr, "mglaunch: %s\n", notice);
    const char *agreed = mg_rdzv_run_id(l->rops, l->rimpl);
    if (agreed)
        snprintf(l->run_id, sizeof(l->run_id), "%s", agreed);
    if (strcmp(l->o.event_log_handler, "null") != 0)
        fprintf(stderr,
                "mglaunch: --event-log-handler %s: no effect; mglaunch writes its own event log "
                "(%s/%s/events.jsonl, docs/logs.md)\n",
                l->o.event_log_handler, l->log_dir, l->run_id);
    raise_fd_limit(l->o.nproc);
    /* A worker group in the background cannot read the terminal; give it
     * nothing. The ranks shown on the console get pseudo-terminals instead,
     * when mglaunch is in the terminal's foreground. */
    if (isatty(0))
        l->stdin_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    l->on_tty = mg_tty_is_foreground(0);
    code = supervise(l);
out:
    if (l->rops && l->rops->release)
        l->rops->release(l->rimpl);
    if (l->stdin_fd >= 0)
        close(l->stdin_fd);
    free(l->wargv);
    free(l->numa);
    mg_opts_release(&l->o);
    return code;
}

/* `mglaunch dashboard` is mglaunch-dashboard's, a program of its own (an HTTP
 * server with a thread, linked with libmicrohttpd), found next to mglaunch or
 * in PATH: mglaunch itself links no HTTP library and starts no thread. */
static int dashboard(char **argv)
{
    char sdir[PATH_MAX], path[PATH_MAX + 32];
    const char *name = "mglaunch-dashboard";
    self_dir(sdir, sizeof(sdir));
    int found =
        sdir[0] && mg_fmt(path, sizeof(path), "%s/%s", sdir, name) >= 0 && access(path, X_OK) == 0;
    if (!found && mg_path_search(name, getenv("PATH"), path, sizeof(path)) < 0) {
        fprintf(stderr,
                "mglaunch dashboard: %s is neither next to mglaunch (%s) nor in PATH; it is "
                "built when libmicrohttpd's header is there (Debian: apt-get install "
                "libmicrohttpd-dev, then make)\n",
                name, sdir[0] ? sdir : "?");
        return 1;
    }
    argv[0] = (char *)name;
    execv(path, argv);
    fprintf(stderr, "mglaunch dashboard: cannot run '%s': %s\n", path, strerror(errno));
    return errno == ENOENT ? 127 : 126;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "dashboard") == 0)
        return dashboard(argv + 1);
    if (argc > 1 && strcmp(argv[1], "dump") == 0) {
        char err[MG_ERRMSG_LEN];
        int rc = mg_dump_main(argc - 1, argv + 1, stdout, err, sizeof(err));
        if (rc < 0) {
            fprintf(stderr, "mglaunch dump: %s\n", err);
            return rc == -EINVAL ? 2 : 1;
        }
        return rc;
    }
    if (argc > 1 && strcmp(argv[1], "logs") == 0) {
        char err[MG_ERRMSG_LEN];
        int rc = mg_logs_main(argc - 1, argv + 1, stdout, err, sizeof(err));
        if (rc < 0) {
            fprintf(stderr, "mglaunch logs: %s\n", err);
            return rc == -EINVAL ? 2 : 1;
        }
        return rc;
    }
    return run(argc, argv);
}
