/* The launcher environment as the runtime reads it (mg_dist_env_read) and the
 * error file it writes for the launcher (torchrun's JSON format).
 * timeout: 30 */
#include "tap.h"
#include "dist.h"
#include "json.h"
#include "mg_err.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

static const char *vars[] = {"RANK",
                             "WORLD_SIZE",
                             "LOCAL_RANK",
                             "LOCAL_WORLD_SIZE",
                             "GROUP_RANK",
                             "MASTER_ADDR",
                             "MASTER_PORT",
                             "TORCHELASTIC_RUN_ID",
                             "TORCHELASTIC_RESTART_COUNT",
                             "TORCHELASTIC_MAX_RESTARTS",
                             "TORCHELASTIC_USE_AGENT_STORE",
                             "TORCHELASTIC_ERROR_FILE",
                             "MG_STORE_TOKEN"};

static void clear_env(void)
{
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        unsetenv(vars[i]);
}

static void launched(int rank, int world)
{
    char b[16];
    clear_env();
    snprintf(b, sizeof(b), "%d", rank);
    setenv("RANK", b, 1);
    snprintf(b, sizeof(b), "%d", world);
    setenv("WORLD_SIZE", b, 1);
    setenv("MASTER_ADDR", "10.0.0.1", 1);
    setenv("MASTER_PORT", "29500", 1);
}

static char *slurp(const char *path)
{
    FILE *fp = fopen(path, "r");
    static char buf[8192];
    size_t n = fp ? fread(buf, 1, sizeof(buf) - 1, fp) : 0;
    buf[n] = '\0';
    if (fp)
        fclose(fp);
    return buf;
}

static char *slurp_big(const char *path)
{
    static char buf[1 << 16];
    FILE *fp = fopen(path, "r");
    size_t n = fp ? fread(buf, 1, sizeof(buf) - 1, fp) : 0;
    buf[n] = '\0';
    if (fp)
        fclose(fp);
    return buf;
}

int main(void)
{
    struct mg_dist_env e;
    char err[512];

    clear_env();
    is_int(mg_dist_env_read(&e, err, sizeof(err)), 0, "no launcher variables: fine");
    ok(!e.launched && e.world == 1 && e.rank == 0, "no launcher variables: world size 1, rank 0");
    is_str(e.run_id, "none", "run id defaults to torchrun's 'none'");

    launched(1, 4);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    setenv("GROUP_RANK", "0", 1);
    setenv("TORCHELASTIC_RUN_ID", "job-7", 1);
    setenv("TORCHELASTIC_RESTART_COUNT", "3", 1);
    setenv("TORCHELASTIC_MAX_RESTARTS", "5", 1);
    setenv("TORCHELASTIC_USE_AGENT_STORE", "False", 1);
    setenv("TORCHELASTIC_ERROR_FILE", "/tmp/x/error.json", 1);
    is_int(mg_dist_env_read(&e, err, sizeof(err)), 0, "mglaunch's full environment");
    ok(e.launched && e.rank == 1 && e.world == 4 && e.local_rank == 1 && e.local_world == 2,
       "ranks and sizes");
    ok(e.restart_count == 3 && e.max_restarts == 5 && e.use_agent_store == 0,
       "restart count, max restarts, agent store");
    is_str(e.master_addr, "10.0.0.1", "MASTER_ADDR");
    is_int(e.master_port, 29500, "MASTER_PORT");
    is_str(e.run_id, "job-7", "TORCHELASTIC_RUN_ID");
    is_str(e.error_file, "/tmp/x/error.json", "TORCHELASTIC_ERROR_FILE");
    is_str(e.store_token, "", "no MG_STORE_TOKEN: no token");
    ok(!e.single_host, "LOCAL_WORLD_SIZE 2 of WORLD_SIZE 4: not a single host");
    setenv("MG_STORE_TOKEN", "0123abcd", 1);
    setenv("LOCAL_WORLD_SIZE", "4", 1);
    setenv("LOCAL_RANK", "1", 1);
    is_int(mg_dist_env_read(&e, err, sizeof(err)), 0, "with MG_STORE_TOKEN");
    is_str(e.store_token, "0123abcd", "MG_STORE_TOKEN is the store's token");
    ok(e.single_host, "LOCAL_WORLD_SIZE = WORLD_SIZE: every rank on this machine");
    char longtok[300];
    memset(longtok, 'k', sizeof(longtok) - 1);
    longtok[sizeof(longtok) - 1] = '\0';
    setenv("MG_STORE_TOKEN", longtok, 1);
    is_int(mg_dist_env_read(&e, err, sizeof(err)), -EINVAL, "a 299-byte MG_STORE_TOKEN");
    ok(strstr(err, "MG_STORE_TOKEN is 299 characters long: at most 256") != NULL, "%s", err);
    unsetenv("MG_STORE_TOKEN");

    launched(0, 2);
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    is_int(mg_dist_env_read(&e, err, sizeof(err)), -MG_ECONFIG, "agent store refused");
    ok(strstr(err, "--rdzv_backend=c10d") && strstr(err, "mglaunch"),
       "the message says what to use: %s", err);
    setenv("MG_AGENT_STORE", "mg", 1);
    is_int(mg_dist_env_read(&e, err, sizeof(err)), 0, "mglaunch's agent store (MG_AGENT_STORE=mg)");
    ok(e.use_agent_store == 1 && e.agent_store_mg, "  is joined, not refused");
    unsetenv("MG_AGENT_STORE");

    launched(0, 1);
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    is_int(mg_dist_env_read(&e, err, sizeof(err)), 0,
           "world size 1 needs no store (nor MASTER_ADDR, nor a rank-0 store)");

    struct {
        const char *var, *val, *want;
    } bad[] = {
        {"RANK", "-1", "RANK='-1'"},
        {"RANK", "1x", "RANK='1x'"},
        {"RANK", "", "WORLD_SIZE is set but RANK is not"},
        {"WORLD_SIZE", "99999999999", "WORLD_SIZE='99999999999'"},
        {"MASTER_PORT", "0", "MASTER_PORT='0'"},
        {"MASTER_PORT", "", "MASTER_PORT is not set"},
        {"GROUP_RANK", "g", "GROUP_RANK='g'"},
        {"LOCAL_WORLD_SIZE", "9", "LOCAL_WORLD_SIZE='9'"},
        {"TORCHELASTIC_MAX_RESTARTS", "many", "TORCHELASTIC_MAX_RESTARTS='many'"},
        {"TORCHELASTIC_USE_AGENT_STORE", "yes", "TORCHELASTIC_USE_AGENT_STORE='yes'"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        launched(1, 2);
        setenv(bad[i].var, bad[i].val, 1);
        err[0] = '\0';
        is_int(mg_dist_env_read(&e, err, sizeof(err)), -EINVAL, "%s='%s' rejected", bad[i].var,
               bad[i].val);
        ok(strstr(err, bad[i].want) != NULL, "message names it: %s", err);
    }

    /* The error file: torchrun's shape, escaped, written whole. */
    char dir[] = "/tmp/mgdist.XXXXXX", path[256];
    ok(mkdtemp(dir) != NULL, "temp dir");
    snprintf(path, sizeof(path), "%s/error.json", dir);
    is_int(mg_error_file_write(path, "train", "bad \"value\"\n\tat\\x\001", 3, 1, "node-a"), 0,
           "error file written");
    const char *j = slurp(path);
    ok(strstr(j, "{\"message\":{\"message\":\"bad \\\"value\\\"\\n\\tat\\\\x\\u0001\","
                 "\"extraInfo\":{\"py_callstack\":") == j,
       "message escaped, in torchrun's shape: %s", j);
    ok(strstr(j, "\"rank\":\"3\"") && strstr(j, "\"local_rank\":\"1\"") &&
           strstr(j, "\"hostname\":\"node-a\"") && strstr(j, "\"timestamp\":\"") &&
           strstr(j, "\"program\":\"train\""),
       "rank, local rank, host, timestamp, program");
    /* A huge message is capped; the file stays valid JSON that the launcher reads. */
    char *huge = malloc(20001);
    memset(huge, '"', 20000);
    huge[20000] = '\0';
    is_int(mg_error_file_write(path, "train", huge, 0, 0, "h"), 0, "20 KB message written");
    j = slurp_big(path);
    struct mg_json doc;
    static struct mg_json_tok toks[64];
    ok(mg_json_parse(&doc, j, strlen(j), toks, 64) > 0, "still valid JSON");
    int m = mg_json_path(&doc, 0, "message.message");
    static char back[20001];
    is_int(mg_json_str(&doc, m, back, sizeof(back)), 8192, "message capped at 8192 bytes");
    free(huge);
    snprintf(path, sizeof(path), "%s/missing/error.json", dir);
    is_int(mg_error_file_write(path, "train", "x", 0, 0, "h"), -ENOENT,
           "unwritable path: an error, not a crash");

    clear_env();
    snprintf(path, sizeof(path), "%s/env.json", dir);
    setenv("TORCHELASTIC_ERROR_FILE", path, 1);
    setenv("RANK", "7", 1);
    is_int(mg_error_file_record(NULL, "train", "boom"), 0, "record from the environment");
    ok(strstr(slurp(path), "\"rank\":\"7\""), "rank taken from RANK");
    unsetenv("TORCHELASTIC_ERROR_FILE");
    is_int(mg_error_file_record(NULL, "train", "boom"), 0, "no error file asked: nothing to do");
    snprintf(path, sizeof(path), "%s/error.json", dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/env.json", dir);
    unlink(path);
    rmdir(dir);
    return done_testing();
}
