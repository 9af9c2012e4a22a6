/* Slurm hostlist expansion, SLURM_* detection, the job shapes mglaunch
 * refuses and the job's port (launcher/rdzv/slurm.c).
 * timeout: 30 */
#include "slurm.h"
#include "tap.h"

#include <errno.h>

static void expands(const char *list, const char *want)
{
    char **h;
    int n, rc = mg_hostlist_expand(list, 1000, &h, &n);
    char got[4096] = "";
    size_t off = 0;

    for (int i = 0; rc == 0 && i < n; i++)
        off += (size_t)snprintf(got + off, sizeof(got) - off, "%s%s", i ? " " : "", h[i]);
    if (rc < 0)
        snprintf(got, sizeof(got), "error %d", rc);
    is_str(got, want, "expand '%s'", list);
    if (rc == 0)
        mg_hostlist_free(h, n);
}

static void rejects(const char *list, int max, int want)
{
    char **h;
    int n, rc = mg_hostlist_expand(list, max, &h, &n);
    is_int(rc, want, "reject '%.60s'", list);
    ok(h == NULL && n == 0, "nothing returned for '%.40s'", list);
}

int main(void)
{
    expands("node1", "node1");
    expands("node[01-04,07]", "node01 node02 node03 node04 node07");
    expands("node[8-10]", "node8 node9 node10");
    expands("n[008-010]", "n008 n009 n010");
    expands("a,b,c", "a b c");
    expands("gpu[1-2]-ib,login", "gpu1-ib gpu2-ib login");
    expands("rack[1-2]-node[01-02]", "rack1-node01 rack1-node02 rack2-node01 rack2-node02");
    expands("x[1-2],y[3,5-6],z", "x1 x2 y3 y5 y6 z");
    expands("node[7]", "node7");
    expands("10.0.0.[1-3]", "10.0.0.1 10.0.0.2 10.0.0.3");
    expands("a, b", "a b");
    expands("[1-2]", "1 2");

    rejects("", 10, -EINVAL);
    rejects("node[1-", 10, -EINVAL);
    rejects("node[]", 10, -EINVAL);
    rejects("node[3-1]", 10, -EINVAL);
    rejects("node[a-b]", 10, -EINVAL);
    rejects("node[1,]", 10, -EINVAL);
    rejects("node[,1]", 10, -EINVAL);
    rejects("node]1", 10, -EINVAL);
    rejects("node[[1]]", 10, -EINVAL);
    rejects("a,,b", 10, -EINVAL);
    rejects("a,", 10, -EINVAL);
    rejects("node[1-11]", 10, -E2BIG);
    rejects("node[0-99999999999]", 1000, -E2BIG);
    rejects("n[1-2]m[1-2]o[1-2]", 7, -E2BIG);
    {
        char big[400];
        memset(big, 'a', sizeof(big) - 1);
        big[sizeof(big) - 1] = 0;
        rejects(big, 10, -E2BIG);
    }

    /* SLURM_* detection. */
    {
        struct mg_slurm s;
        char err[256] = "";
        char *none[] = {"PATH=/bin", NULL};
        is_int(mg_slurm_detect(none, &s, err, sizeof(err)), 0, "no Slurm without SLURM_NODEID");

        char *job[] = {"SLURM_NNODES=4", "SLURM_NODEID=2", "SLURM_JOB_NODELIST=gpu[07-09,11]",
                       "SLURM_JOB_ID=4242", NULL};
        is_int(mg_slurm_detect(job, &s, err, sizeof(err)), 1, "Slurm job detected");
        is_int(s.nnodes, 4, "nnodes from SLURM_NNODES");
        is_int(s.node_rank, 2, "node_rank from SLURM_NODEID");
        is_str(s.master_addr, "gpu07", "master_addr is the first host");
        is_str(s.job_id, "4242", "job id");

        char *step[] = {"SLURM_NNODES=4",
                        "SLURM_STEP_NUM_NODES=2",
                        "SLURM_NODEID=1",
                        "SLURM_JOB_NODELIST=gpu[07-09,11]",
                        "SLURM_STEP_NODELIST=gpu[09,11]",
                        NULL};
        is_int(mg_slurm_detect(step, &s, err, sizeof(err)), 1, "Slurm step detected");
        is_int(s.nnodes, 2, "the step's node count wins");
        is_str(s.master_addr, "gpu09", "the step's first host");

        char *bad_id[] = {"SLURM_NNODES=2", "SLURM_NODEID=2", "SLURM_JOB_NODELIST=a,b", NULL};
        is_int(mg_slurm_detect(bad_id, &s, err, sizeof(err)), -EINVAL, "node id out of range");
        ok(strstr(err, "SLURM_NODEID=2") != NULL, "error names SLURM_NODEID: %s", err);

        char *mismatch[] = {"SLURM_NNODES=3", "SLURM_NODEID=0", "SLURM_JOB_NODELIST=a,b", NULL};
        is_int(mg_slurm_detect(mismatch, &s, err, sizeof(err)), -EINVAL, "count mismatch");
        ok(strstr(err, "lists 2 hosts") != NULL, "error explains the mismatch: %s", err);

        char *badlist[] = {"SLURM_NNODES=2", "SLURM_NODEID=0", "SLURM_JOB_NODELIST=a[1-", NULL};
        is_int(mg_slurm_detect(badlist, &s, err, sizeof(err)), -EINVAL, "bad hostlist");
        ok(strstr(err, "SLURM_JOB_NODELIST=a[1-") != NULL, "error names the variable: %s", err);

        char *nolist[] = {"SLURM_NNODES=2", "SLURM_NODEID=0", NULL};
        is_int(mg_slurm_detect(nolist, &s, err, sizeof(err)), -EINVAL, "no node list");

        /* SkyPilot's variables, read as Slurm's. */
        char *sky[] = {"SKYPILOT_NUM_NODES=3",
                       "SKYPILOT_NODE_RANK=2",
                       "SKYPILOT_NODE_IPS=10.0.0.7\n10.0.0.8\n10.0.0.9\n",
                       "SKYPILOT_NUM_GPUS_PER_NODE=8",
                       "SKYPILOT_TASK_ID=sky-2026-11-28-05-00-00-123456_my cluster_1",
                       NULL};
        is_int(mg_slurm_detect(sky, &s, err, sizeof(err)), 1, "SkyPilot cluster detected");
        is_str(s.scheduler, "skypilot", "  as SkyPilot");
        is_int(s.nnodes, 3, "  nnodes from SKYPILOT_NUM_NODES");
        is_int(s.node_rank, 2, "  node_rank from SKYPILOT_NODE_RANK");
        is_str(s.master_addr, "10.0.0.7", "  master_addr the first of SKYPILOT_NODE_IPS");
        is_str(s.job_id, "sky-2026-11-28-05-00-00-123456_my_cluster_1",
               "  job id from SKYPILOT_TASK_ID, a safe name");
        is_int(mg_slurm_check(&s, 0, err, sizeof(err)), 0, "  no Slurm shape check applies");
        char *both[] = {"SLURM_NNODES=2",       "SLURM_NODEID=1",       "SLURM_JOB_NODELIST=a,b",
                        "SKYPILOT_NUM_NODES=3", "SKYPILOT_NODE_RANK=2", NULL};
        is_int(mg_slurm_detect(both, &s, err, sizeof(err)), 1, "Slurm and SkyPilot");
        is_str(s.scheduler, "slurm", "  Slurm's variables win (SkyPilot on Slurm)");
        char *sky_ips[] = {"SKYPILOT_NUM_NODES=3", "SKYPILOT_NODE_RANK=0",
                           "SKYPILOT_NODE_IPS=10.0.0.7\n10.0.0.8", NULL};
        is_int(mg_slurm_detect(sky_ips, &s, err, sizeof(err)), -EINVAL, "SkyPilot: 2 IPs for 3");
        ok(strstr(err, "SKYPILOT_NODE_IPS lists 2 addresses but SKYPILOT_NUM_NODES=3") != NULL,
           "  explained: %s", err);
        char *sky_rank[] = {"SKYPILOT_NUM_NODES=2", "SKYPILOT_NODE_RANK=x",
                            "SKYPILOT_NODE_IPS=a\nb", NULL};
        is_int(mg_slurm_detect(sky_rank, &s, err, sizeof(err)), -EINVAL, "SkyPilot: a bad rank");
        ok(strstr(err, "SKYPILOT_NODE_RANK=x") != NULL, "  named: %s", err);
        char *sky_noips[] = {"SKYPILOT_NUM_NODES=2", "SKYPILOT_NODE_RANK=1", NULL};
        is_int(mg_slurm_detect(sky_noips, &s, err, sizeof(err)), -EINVAL, "SkyPilot: no IPs");
    }

    /* The shapes mglaunch refuses, from the variables a real Slurm sets. */
    {
        struct mg_slurm s;
        char err[512] = "";
        /* srun -N1 -n2 */
        char *two_on_one[] = {
            "SLURM_JOB_ID=7",         "SLURM_STEP_ID=0",        "SLURM_NNODES=1",
            "SLURM_NODEID=0",         "SLURM_STEP_NUM_NODES=1", "SLURM_STEP_NUM_TASKS=2",
            "SLURM_STEP_NODELIST=n1", "SLURM_JOB_NODELIST=n1",  NULL};
        is_int(mg_slurm_detect(two_on_one, &s, err, sizeof(err)), 1, "srun -N1 -n2: detected");
        is_int(s.in_step, 1, "in a step");
        is_int(s.step_tasks, 2, "2 tasks");
        is_int(mg_slurm_check(&s, 0, err, sizeof(err)), -EINVAL, "srun -N1 -n2: refused");
        ok(strstr(err, "2 tasks on 1 node") &&
               strstr(err, "srun --nodes=1 --ntasks=1 --ntasks-per-node=1"),
           "says why and which srun line: %s", err);
        is_int(mg_slurm_check(&s, 1, err, sizeof(err)), -EINVAL, "refused with --nnodes too");

        /* srun -N2 --ntasks-per-node=2 */
        char *four_on_two[] = {"SLURM_JOB_ID=8",
                               "SLURM_STEP_ID=0",
                               "SLURM_NNODES=2",
                               "SLURM_NODEID=1",
                               "SLURM_STEP_NUM_NODES=2",
                               "SLURM_STEP_NUM_TASKS=4",
                               "SLURM_STEP_NODELIST=n[1-2]",
                               NULL};
        mg_slurm_detect(four_on_two, &s, err, sizeof(err));
        is_int(mg_slurm_check(&s, 0, err, sizeof(err)), -EINVAL,
               "srun -N2 --ntasks-per-node=2: refused");
        ok(strstr(err, "--nodes=2 --ntasks=2 --ntasks-per-node=1") != NULL, "names the line: %s",
           err);

        /* srun -N2: one task per node */
        char *good[] = {"SLURM_JOB_ID=9",
                        "SLURM_STEP_ID=0",
                        "SLURM_NNODES=2",
                        "SLURM_NODEID=1",
                        "SLURM_STEP_NUM_NODES=2",
                        "SLURM_STEP_NUM_TASKS=2",
                        "SLURM_STEP_NODELIST=n[1-2]",
                        NULL};
        mg_slurm_detect(good, &s, err, sizeof(err));
        is_int(mg_slurm_check(&s, 0, err, sizeof(err)), 0, "srun -N2 -n2: fine");

        /* the batch script of a two-node job: no step id */
        char *batch[] = {"SLURM_JOB_ID=10", "SLURM_NNODES=2", "SLURM_NODEID=0",
                         "SLURM_JOB_NODELIST=n[1-2]", NULL};
        is_int(mg_slurm_detect(batch, &s, err, sizeof(err)), 1, "batch script: detected");
        is_int(s.in_step, 0, "not in a step");
        is_int(mg_slurm_check(&s, 0, err, sizeof(err)), -EINVAL,
               "batch script of 2 nodes: refused");
        ok(strstr(err, "batch script") && strstr(err, "srun --nodes=2"), "says to use srun: %s",
           err);
        is_int(mg_slurm_check(&s, 1, err, sizeof(err)), 0,
               "unless --nnodes says where the nodes are");
        char *batch1[] = {"SLURM_JOB_ID=11", "SLURM_NNODES=1", "SLURM_NODEID=0",
                          "SLURM_JOB_NODELIST=n1", NULL};
        mg_slurm_detect(batch1, &s, err, sizeof(err));
        is_int(mg_slurm_check(&s, 0, err, sizeof(err)), 0, "batch script of one node: fine");

        /* The job's port: 15000 + the last four digits (Lightning's). */
        is_int(mg_slurm_default_port(&s), 15011, "job 11: port 15011");
        snprintf(s.job_id, sizeof(s.job_id), "1234567");
        is_int(mg_slurm_default_port(&s), 19567, "job 1234567: port 19567");
        snprintf(s.job_id, sizeof(s.job_id), "30000");
        is_int(mg_slurm_default_port(&s), 15000, "job 30000: port 15000");
        s.job_id[0] = 0;
        is_int(mg_slurm_default_port(&s), 0, "no job id: none");
        snprintf(s.job_id, sizeof(s.job_id), "12a");
        is_int(mg_slurm_default_port(&s), 0, "not a number: none");
    }
    return done_testing();
}
