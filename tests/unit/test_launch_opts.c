/* mglaunch option parsing (launcher/opts.h): torchrun's flags in every
 * spelling, PET_ fallbacks, -r/-t maps, bad values, unimplemented features,
 * and the second step that resolves nproc against the host. */
#include "opts.h"
#include "mg_err.h"
#include "tap.h"

#include <errno.h>
#include <signal.h>

static struct mg_launch_opts o;
static char err[MG_ERRMSG_LEN];

/* Parses a NULL-terminated argument list (after "mglaunch") with an environment. */
static int parse_env(char **env, ...)
{
    static char *argv[64];
    va_list ap;
    int argc = 0;
    argv[argc++] = "mglaunch";
    va_start(ap, env);
    for (char *a; (a = va_arg(ap, char *));)
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    mg_opts_release(&o);
    return mg_opts_parse(&o, argc, argv, env, err, sizeof(err));
}

#define parse(...) parse_env(NULL, __VA_ARGS__, (char *)NULL)

static void test_spellings(void)
{
    is_int(parse("prog"), 0, "just a program");
    is_int(o.nproc, 1, "default nproc 1");
    is_int(o.max_restarts, 0, "default max_restarts 0");
    is_str(o.role, "default", "default role");
    is_int(o.master_port, -1, "no master port by default");
    ok(o.shutdown_timeout == 30, "default shutdown timeout 30 s");
    ok(o.stop_group_delay == 2, "default stop group delay 2 s");
    is_str(o.prog_argv[0], "prog", "program");

    is_int(parse("--nproc_per_node", "4", "prog"), 0, "--flag value");
    is_int(o.nproc, 4, "nproc 4");
    is_int(parse("--nproc-per-node=5", "prog"), 0, "--flag-with-dashes=value");
    is_int(o.nproc, 5, "nproc 5");
    is_int(parse("--nproc_per_node=6", "prog"), 0, "--flag=value");
    is_int(o.nproc, 6, "nproc 6");
    is_int(parse("--nproc", "7", "prog"), 0, "unique prefix, as argparse allows");
    is_int(o.nproc, 7, "nproc 7 via prefix");
    is_int(parse("--max-restarts", "3", "--role", "trainer", "prog"), 0, "several flags");
    ok(o.max_restarts == 3 && strcmp(o.role, "trainer") == 0, "values kept");
    is_int(parse("--role", "", "prog"), 0, "--role '' (TorchX's dist.ddp, as torchrun accepts it)");
    is_str(o.role, "", "  an empty role");

    is_int(parse("--nproc_per_node", "2", "prog", "--nproc_per_node", "9", "-x"), 0,
           "flags after the program belong to it");
    is_int(o.nproc, 2, "program flags not parsed");
    is_int(o.prog_argc, 4, "program argc");
    is_str(o.prog_argv[2], "9", "program args kept in order");
    is_int(parse("--", "--weird-prog"), 0, "-- ends the options");
    is_str(o.prog_argv[0], "--weird-prog", "program after --");

    is_int(parse("--standalone", "--no_python", "prog"), 0, "boolean flags");
    ok(o.standalone && o.no_python, "booleans set");
    is_int(parse("-m", "pkg.mod"), 0, "-m");
    ok(o.module, "module set");
    is_int(parse("--help"), 0, "--help without a program");
    ok(o.help, "help set");
    is_int(parse("-V"), 0, "-V");
    ok(o.version, "version set");
}

static void test_bad_values(void)
{
    static const struct {
        const char *flag, *val, *want;
    } cases[] = {
        {"--nproc_per_node", "0",
         "invalid value '0' for --nproc_per_node: expected an integer "
         "from 1 to 4096, cpu, gpu, xpu or auto"},
        {"--nproc_per_node", "abc", "invalid value 'abc' for --nproc_per_node"},
        {"--nproc-per-node", "-3", "invalid value '-3' for --nproc-per-node"},
        {"--nproc_per_node", "99999", "invalid value '99999'"},
        {"--max_restarts", "-1", "invalid value '-1' for --max_restarts"},
        {"--max_restarts", "x", "invalid value 'x' for --max_restarts"},
        {"--monitor_interval", "0", "invalid value '0' for --monitor_interval"},
        {"--master_port", "70000", "invalid value '70000' for --master_port"},
        {"--nnodes", "0", "invalid value '0' for --nnodes"},
        {"--nnodes", "3:2", "invalid value '3:2' for --nnodes"},
        {"--rdzv_backend", "zk", "invalid value 'zk' for --rdzv_backend"},
        {"-r", "4", "invalid value '4' for -r"},
        {"--tee", "0:3,1", "invalid value '0:3,1' for --tee"},
        {"--redirects", "a:1", "invalid value 'a:1' for --redirects"},
        {"--start_method", "thread", "invalid value 'thread' for --start_method"},
        {"--shutdown_timeout", "-2", "invalid value '-2' for --shutdown_timeout"},
        {"--gpu_ids", "0,,1", "invalid value '0,,1' for --gpu_ids"},
        {"--gpu_ids", "x", "invalid value 'x' for --gpu_ids"},
        {"--gpu_ids", "1,1", "GPU id 1 is listed twice"},
        {"--rdzv_id", "a/b", "invalid value 'a/b' for --rdzv_id"},
        {"--local_ranks_filter", "0,x", "invalid value '0,x' for --local_ranks_filter"},
        {"--log_line_prefix_template", "${foo}",
         "invalid value '${foo}' for "
         "--log_line_prefix_template"},
        {"--node_rank", "1", "invalid value '1' for --node_rank: must be less than --nnodes"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int rc = parse((char *)cases[i].flag, (char *)cases[i].val, "prog");
        is_int(rc, -EINVAL, "%s %s rejected", cases[i].flag, cases[i].val);
        ok(strstr(err, cases[i].want) != NULL, "message for %s %s: %s", cases[i].flag, cases[i].val,
           err);
    }

    is_int(parse("--bogus", "prog"), -EINVAL, "unknown flag");
    ok(strstr(err, "unknown option '--bogus'") != NULL, "unknown flag named: %s", err);
    is_int(parse("-x", "prog"), -EINVAL, "unknown short flag");
    is_int(parse("--n", "2", "prog"), -EINVAL, "ambiguous prefix");
    ok(strstr(err, "ambiguous option '--n'") && strstr(err, "--nnodes"), "ambiguity listed: %s",
       err);
    is_int(parse("--nproc_per_node"), -EINVAL, "missing value");
    ok(strstr(err, "--nproc_per_node needs a value") != NULL, "missing value named: %s", err);
    is_int(parse("--nproc_per_node", "--standalone", "prog"), -EINVAL,
           "an option is not taken as a value");
    is_int(parse("--standalone=1", "prog"), -EINVAL, "flag given a value");
    is_int(parse("--nproc_per_node", "2"), -EINVAL, "no program");
    ok(strstr(err, "missing the program") != NULL, "missing program named: %s", err);
    is_int(parse("--module", "--no_python", "prog"), -EINVAL, "-m with --no_python");

    /* A single-node run cannot wait for a second node (torchrun waits forever). */
    is_int(parse("--standalone", "--nnodes", "2", "prog"), -EINVAL, "--standalone --nnodes 2");
    ok(strstr(err, "--standalone is a single-node run") && strstr(err, "--nnodes 2"),
       "the conflict is named: %s", err);
    is_int(parse("--nnodes=1:2", "--standalone", "prog"), -EINVAL, "--standalone --nnodes 1:2");
    char *pet[] = {"PET_NNODES=3", NULL};
    is_int(parse_env(pet, "--standalone", "prog", (char *)NULL), -EINVAL,
           "--standalone with PET_NNODES=3");
    ok(strstr(err, "PET_NNODES (--nnodes) 3") != NULL, "the variable is named: %s", err);
    is_int(parse("--standalone", "--nnodes", "1:1", "prog"), 0,
           "--standalone --nnodes 1:1 is fine");
}

static void test_not_implemented(void)
{
    /* Multi-node flags (issue 5): parsed here, checked by launcher/rdzv/rdzv_multi.c. */
    is_int(parse("--nnodes", "2", "prog"), 0, "--nnodes 2");
    ok(o.nnodes_min == 2 && o.nnodes_max == 2 && o.nnodes_given, "--nnodes 2 is 2:2, given");
    is_int(parse("--nnodes=1:4", "prog"), 0, "elastic --nnodes 1:4");
    ok(o.nnodes_min == 1 && o.nnodes_max == 4, "--nnodes 1:4 is MIN 1, MAX 4");
    is_int(parse("--rdzv_backend", "etcd", "prog"), 0, "etcd");
    is_int(parse("--rdzv-backend=etcd-v2", "prog"), -EINVAL, "etcd-v2");
    ok(strstr(err, "etcd's v2 API is gone") != NULL, "%s", err);
    is_int(parse("--rdzv_conf", "timeout=5", "prog"), 0, "--rdzv_conf");
    is_str(o.rdzv_conf, "timeout=5", "--rdzv_conf kept for the rendezvous to check");
    is_int(parse("--run_path", "prog"), 0, "--run_path");
    ok(o.run_path, "  kept");
    is_int(parse("--run_path", "-m", "prog"), -EINVAL, "--run_path with -m");
    is_int(parse("--local_addr", "x", "prog"), 0, "--local_addr");
    is_str(o.local_addr, "x", "--local_addr kept");
    is_int(parse("--nnodes", "1", "--nnodes", "1:1", "prog"), 0, "--nnodes 1 and 1:1 work");
    is_int(parse("--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0", "prog"), 0,
           "single-node c10d accepted");
    is_int(parse("--rdzv_endpoint", "[::1", "prog"), -EINVAL, "bad endpoint");
}

/* torchrun 2.x's flags and variables */
static void test_torchrun2(void)
{
    is_int(parse("prog"), 0, "defaults");
    is_int(o.nsignals, 4, "default --signals-to-handle: 4 signals");
    ok(o.signals[0] == SIGTERM && o.signals[1] == SIGINT && o.signals[2] == SIGHUP &&
           o.signals[3] == SIGQUIT && !o.signals_given,
       "  SIGTERM,SIGINT,SIGHUP,SIGQUIT, not given");
    is_str(o.event_log_handler, "null", "  --event-log-handler null");
    ok(!o.virtual_local_rank && o.numa_binding == MG_NUMA_NONE, "  no virtual rank, no binding");

    is_int(parse("--signals-to-handle", "SIGTERM, SIGUSR1,USR2,15", "prog"), 0,
           "--signals-to-handle SIGTERM, SIGUSR1,USR2,15");
    ok(o.nsignals == 3 && o.signals[0] == SIGTERM && o.signals[1] == SIGUSR1 &&
           o.signals[2] == SIGUSR2 && o.signals_given,
       "  three signals, the repeated one once");
    is_int(parse("--signals_to_handle=SIGBOGUS", "prog"), -EINVAL, "an unknown signal");
    ok(strstr(err, "'SIGBOGUS' is not a signal name") != NULL, "  %s", err);
    is_int(parse("--signals-to-handle", "SIGKILL", "prog"), -EINVAL, "SIGKILL");
    ok(strstr(err, "SIGKILL cannot be handled") != NULL, "  %s", err);
    is_int(parse("--signals-to-handle", "SIGCHLD", "prog"), -EINVAL, "SIGCHLD");
    ok(strstr(err, "mglaunch handles SIGCHLD itself") != NULL, "  %s", err);

    is_int(parse("--virtual-local-rank", "prog"), 0, "--virtual-local-rank");
    ok(o.virtual_local_rank, "  set");
    for (int m = 0; m < 4; m++) {
        static const char *const names[] = {"node", "socket", "exclusive", "core-complex"};
        is_int(parse("--numa-binding", names[m], "prog"), 0, "--numa-binding %s", names[m]);
        is_int(o.numa_binding, MG_NUMA_NODE + m, "  mode %d", MG_NUMA_NODE + m);
    }
    is_int(parse("--numa_binding", "rack", "prog"), -EINVAL, "--numa_binding rack");
    ok(strstr(err, "expected node, socket, exclusive or core-complex") != NULL, "  %s", err);
    is_int(parse("--event-log-handler", "console", "prog"), 0, "--event-log-handler console");
    is_str(o.event_log_handler, "console", "  kept");
    is_int(parse("--nproc-per-node", "xpu", "prog"), 0, "--nproc-per-node xpu");
    is_int(o.nproc_kind, MG_NPROC_XPU, "  xpu");
    is_int(parse("--logs_specs", "my_specs", "prog"), -MG_EUNSUPPORTED, "--logs_specs");
    ok(strstr(err, "names a Python class") && strstr(err, "mglaunch logs"), "  %s", err);

    is_int(parse("--duplicate-stdout-filters", "apple,x,,y,", "--duplicate_stderr_filters", "err",
                 "prog"),
           0, "--duplicate-std*-filters");
    is_int(o.ndup_filters[0], 3, "  three stdout filters (,, is a comma)");
    is_str(mg_opts_dup_filter(&o, 0, 0), "apple", "  apple");
    is_str(mg_opts_dup_filter(&o, 0, 1), "x,y", "  x,y");
    is_str(mg_opts_dup_filter(&o, 0, 2), "", "  and the empty one after the last comma");
    ok(mg_opts_dup_filter(&o, 0, 3) == NULL, "  no fourth");
    is_str(mg_opts_dup_filter(&o, 1, 0), "err", "  one stderr filter");

    char *env[] = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=[${rank}]",
                   "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=7", NULL};
    is_int(parse_env(env, "prog", (char *)NULL), 0, "torchrun 2.x's variables");
    is_str(o.prefix_template, "[${rank}]", "  TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
    ok(o.shutdown_timeout == 7, "  TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
    is_int(parse_env(env, "--shutdown_timeout", "2", "prog", (char *)NULL), 0, "the flag wins");
    ok(o.shutdown_timeout == 2, "  --shutdown_timeout 2");
    char *sg_env[] = {"MG_STOP_GROUP_DELAY=0.5", NULL};
    is_int(parse_env(sg_env, "prog", (char *)NULL), 0, "MG_STOP_GROUP_DELAY");
    ok(o.stop_group_delay == 0.5, "  0.5 s");
    is_int(parse_env(sg_env, "--stop_group_delay", "0", "prog", (char *)NULL), 0, "the flag wins");
    ok(o.stop_group_delay == 0, "  0: torchrun's whole group at once");
    char *eb_env[] = {"TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT=45", NULL};
    is_int(parse_env(eb_env, "prog", (char *)NULL), 0, "TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT");
    ok(o.exit_barrier_timeout == 45, "  45 s");
    is_int(parse_env(eb_env, "--exit-barrier-timeout", "9", "prog", (char *)NULL), 0,
           "--exit-barrier-timeout (torchrun's, pytorch#195543) wins");
    ok(o.exit_barrier_timeout == 9, "  9 s");
    is_int(parse_env(NULL, "--exit-barrier-timeout", "0", "prog", (char *)NULL), -EINVAL,
           "--exit-barrier-timeout 0: refused");
    char *bad_env[] = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT=soon", NULL};
    is_int(parse_env(bad_env, "prog", (char *)NULL), -EINVAL, "a bad variable");
    ok(strstr(err, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT (--shutdown_timeout)") != NULL, "  named: %s",
       err);
}

static void test_pet(void)
{
    char *env[] = {"PET_NPROC_PER_NODE=3",
                   "PET_MAX_RESTARTS=2",
                   "PET_STANDALONE=1",
                   "PET_TEE=3",
                   "PET_GPU_IDS=4,5",
                   "PET_ROLE=",
                   NULL};
    is_int(parse_env(env, "prog", (char *)NULL), 0, "PET_ fallbacks");
    is_int(o.nproc, 3, "PET_NPROC_PER_NODE");
    is_int(o.max_restarts, 2, "PET_MAX_RESTARTS");
    ok(o.standalone, "PET_STANDALONE=1");
    is_int(mg_stdmap_get(&o.tee, 0), 3, "PET_TEE");
    is_str(o.gpu_ids, "4,5", "PET_GPU_IDS");
    is_str(o.role, "default", "an empty PET_ value counts as unset");

    is_int(parse_env(env, "--nproc_per_node", "5", "--gpu_ids", "1", "--gpu-ids", "2", "prog",
                     (char *)NULL),
           0, "command line over PET_");
    is_int(o.nproc, 5, "command line wins");
    is_str(o.gpu_ids, "1,2", "repeated --gpu_ids replace PET_GPU_IDS and accumulate");

    /* What the operators really inject (docs/kubernetes.md). */
    char *kubeflow[] = {"PET_STANDALONE=", "PET_NNODES=1", "PET_NPROC_PER_NODE=auto", NULL};
    is_int(parse_env(kubeflow, "prog", (char *)NULL), 0, "PyTorchJob's standalone: true");
    ok(o.standalone, "PET_STANDALONE=\"\" is --standalone, as the operator means it");

    char *bad[] = {"PET_NPROC_PER_NODE=abc", NULL};
    is_int(parse_env(bad, "prog", (char *)NULL), -EINVAL, "bad PET_ value");
    ok(strstr(err, "invalid value 'abc' for PET_NPROC_PER_NODE (--nproc_per_node)") != NULL,
       "message names the variable and the flag: %s", err);
    is_int(parse_env(bad, "--nproc_per_node", "2", "prog", (char *)NULL), 0,
           "a bad PET_ value the command line overrides is not checked");
    char *badflag[] = {"PET_STANDALONE=yes", NULL};
    is_int(parse_env(badflag, "prog", (char *)NULL), -EINVAL, "bad PET_ boolean");
    char *st0[] = {"PET_STANDALONE=0", NULL};
    is_int(parse_env(st0, "prog", (char *)NULL), 0, "PET_STANDALONE=0");
    ok(!o.standalone, "PET_STANDALONE=0 is false");
    char *etcd[] = {"PET_RDZV_BACKEND=etcd", NULL};
    is_int(parse_env(etcd, "prog", (char *)NULL), 0, "PET_RDZV_BACKEND=etcd");
    is_str(o.rdzv_backend, "etcd", "PET_RDZV_BACKEND=etcd is used");
}

static void test_stdmap(void)
{
    struct mg_stdmap m;
    is_int(mg_stdmap_parse("3", &m), 0, "single value");
    is_int(mg_stdmap_get(&m, 7), 3, "applies to every rank");
    is_int(mg_stdmap_parse("0:3,1:1,12:2", &m), 0, "map with a two-digit rank");
    is_int(mg_stdmap_get(&m, 0), 3, "rank 0");
    is_int(mg_stdmap_get(&m, 1), 1, "rank 1");
    is_int(mg_stdmap_get(&m, 12), 2, "rank 12");
    is_int(mg_stdmap_get(&m, 2), 0, "rank missing from the map: none");
    is_int(mg_stdmap_parse("1:1,1:2", &m), 0, "repeated rank");
    is_int(mg_stdmap_get(&m, 1), 2, "the last one wins");
    const char *bad[] = {"", "4", "01x", "0:4", "0:", ":1", "0:1,", "0:1;1:2", "99999:1", "-1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        is_int(mg_stdmap_parse(bad[i], &m), -EINVAL, "'%s' rejected", bad[i]);
    is_int(parse("-r3", "prog"), 0, "-r3");
    is_int(mg_stdmap_get(&o.redirects, 0), 3, "-r3 value");
    is_int(parse("-t=0:1", "prog"), 0, "-t=map");
    is_int(mg_stdmap_get(&o.tee, 0), 1, "-t=map value");
}

static void test_resolve(void)
{
    struct mg_host_info nogpu = {.ncpu = 6, .ngpu = 0, .no_gpu_why = "no NVIDIA GPU"};
    struct mg_host_info twogpu = {.ncpu = 6, .ngpu = 2};

    parse("--nproc_per_node", "cpu", "prog");
    is_int(mg_opts_resolve(&o, &nogpu, err, sizeof(err)), 0, "cpu");
    is_int(o.nproc, 6, "cpu count");
    parse("--nproc_per_node", "auto", "prog");
    mg_opts_resolve(&o, &nogpu, err, sizeof(err));
    is_int(o.nproc, 6, "auto without GPUs: CPU count");
    parse("--nproc_per_node", "auto", "prog");
    mg_opts_resolve(&o, &twogpu, err, sizeof(err));
    is_int(o.nproc, 2, "auto with GPUs: GPU count");
    parse("--nproc_per_node", "gpu", "prog");
    is_int(mg_opts_resolve(&o, &nogpu, err, sizeof(err)), -EINVAL, "gpu without GPUs");
    ok(strstr(err, "invalid value 'gpu' for --nproc_per_node: no GPU found (no NVIDIA GPU)") !=
           NULL,
       "clear message: %s", err);
    parse("--nproc_per_node", "gpu", "--gpu_ids", "3,1,0", "prog");
    is_int(mg_opts_resolve(&o, &nogpu, err, sizeof(err)), 0, "gpu with --gpu_ids");
    is_int(o.nproc, 3, "one worker per listed GPU");

    parse("--nproc_per_node", "3", "--gpu_ids", "0,1", "prog");
    is_int(mg_opts_resolve(&o, &twogpu, err, sizeof(err)), -EINVAL, "gpu id list too short");
    ok(strstr(err, "invalid value '0,1' for --gpu_ids: 2 GPU ids for 3 workers") != NULL, "%s",
       err);
    parse("--nproc_per_node", "2", "--gpu_ids", "GPU-3f1c2a9e-aaaa,1", "prog");
    is_int(mg_opts_resolve(&o, &twogpu, err, sizeof(err)), 0, "UUIDs accepted");
    char id[MG_GPU_ID_LEN];
    mg_opts_gpu_id(&o, 0, id, sizeof(id));
    is_str(id, "GPU-3f1c2a9e-aaaa", "first id");
    mg_opts_gpu_id(&o, 1, id, sizeof(id));
    is_str(id, "1", "second id");
    is_int(mg_opts_gpu_id(&o, 2, id, sizeof(id)), -ENOENT, "no third id");

    parse("--nproc_per_node", "2", "--local_ranks_filter", "1,3", "prog");
    is_int(mg_opts_resolve(&o, &twogpu, err, sizeof(err)), -EINVAL, "filter rank out of range");
    parse("--nproc_per_node", "4", "--local-ranks-filter=1,3", "prog");
    is_int(mg_opts_resolve(&o, &twogpu, err, sizeof(err)), 0, "filter in range");
    ok(!mg_opts_rank_shown(&o, 0) && mg_opts_rank_shown(&o, 1) && mg_opts_rank_shown(&o, 3),
       "filter selects ranks 1 and 3");
    parse("prog");
    ok(mg_opts_rank_shown(&o, 0), "no filter: every rank shown");
}

int main(void)
{
    test_spellings();
    test_bad_values();
    test_not_implemented();
    test_torchrun2();
    test_pet();
    test_stdmap();
    test_resolve();
    mg_opts_release(&o);
    return done_testing();
}
