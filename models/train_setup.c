/* Building the run (see train_internal.h): the compute backend, the
 * launcher's environment and the communicator, the data, the model, data
 * parallelism and the trainer, with the batch, learning rate and length
 * they work out to. */
#include "optim.h"
#include "train_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

/* What libmg has to say while the ranks find each other: a wait that lasts
 * (with its reason), or a warning about an open store. */
static void dist_progress(void *ctx, const char *msg)
{
    (void)ctx;
    fprintf(stderr, TRAIN_PROG ": %s\n", msg);
}

/* The launcher's environment (world size 1 without one): joins the other
 * ranks, then sets the per-process batch and learning rate from the world size. */
static int setup_dist(struct run *r)
{
    struct train_options *o = r->o;
    char err[1024];
    memset(&r->dist, 0, sizeof(r->dist));
    struct mg_dist_opts dopts = {.backend = r->be,
                                 .device_index = r->device_index,
                                 .device_auto = o->device_auto,
                                 .auto_why = r->auto_why,
                                 .progress = dist_progress};
    int rc = mg_dist_init(&r->dist.d, &dopts, err, sizeof(err));
    if (rc < 0) {
        fail("%s", err);
        return rc;
    }
    error_dist = r->dist.d;
    r->dist.rank = r->dist.d->rank;
    r->dist.world = r->dist.d->world;
    if (o->global_batch) {
        long per = (o->global_batch + r->dist.world - 1) / r->dist.world;
        if (per > TRAIN_MAX_BATCH) {
            fail("--global-batch-size %ld over %d processes is %ld per process: at most %d",
                 o->global_batch, r->dist.world, per, TRAIN_MAX_BATCH);
            return -EINVAL;
        }
        o->batch_size = (int)per;
    }
    r->dist.lr_scale = o->scale_lr ? (double)r->dist.world : 1.0;
    o->lr *= r->dist.lr_scale;
    return 0;
}

/* Gradient averaging, parameter broadcast and reduced figures over the ranks. */
void train_ddp_opts(const struct run *r, struct mg_ddp_opts *d)
{
    const struct train_options *o = r->o;
    *d = (struct mg_ddp_opts){
        .bucket_cap = o->bucket_cap_mb > 0 ? (size_t)(o->bucket_cap_mb * 1048576.0) : 0,
        .no_thread = o->no_comm_thread,
        .zero = o->zero,
        .force_thread = r->dist.d && r->dist.d->env.test_comm_thread,
    };
}

static int setup_ddp(struct run *r)
{
    char err[1024];
    struct mg_ddp_opts dopts;
    train_ddp_opts(r, &dopts);
    if (r->dist.world == 1 && !dopts.force_thread)
        return 0;
    int rc = mg_ddp_create(&r->dist.ddp, r->dist.d->comm, &r->model, &dopts, err, sizeof(err));
    if (rc < 0) {
        fail("cannot set up data parallelism: %s", err);
        return rc;
    }
    mg_ddp_hooks(r->dist.ddp, &r->dist.hooks);
    return 0;
}

/* Both sets' images must be what the models take: a wrong one is named. */
static int check_images(const struct run *r)
{
    const struct mg_dataset *sets[2] = {&r->train, &r->test};
    for (int i = 0; i < 2; i++) {
        const struct mg_dataset *d = sets[i];
        if (d->h == MG_MODEL_INPUT_H && d->w == MG_MODEL_INPUT_W)
            continue;
        fail("%s: '%s' holds %dx%d images; the models take %dx%d", mg_data_name(r->o->data),
             d->images[0] ? d->images : d->name, d->h, d->w, MG_MODEL_INPUT_H, MG_MODEL_INPUT_W);
        return -MG_ESHAPE;
    }
    return 0;
}

/* The compute device, before the communicator that follows it: CUDA device
 * LOCAL_RANK (within the CUDA_VISIBLE_DEVICES mglaunch sets from --gpu_ids),
 * for --device cuda, or for auto when the driver shows it usable. A GPU that
 * cannot be used (no plugin, library, driver or device) is a one-line error
 * with exit status 2, as a bad flag is. */
static int setup_backend(struct run *r)
{
    struct train_options *o = r->o;
    struct mg_dist_env env;
    char err[MG_ERRMSG_LEN];
    int rc = mg_dist_env_read(&env, err, sizeof(err));
    if (rc < 0) {
        fail("%s", err);
        return rc;
    }
    /* MG_CUDA_DEVICE: another device than LOCAL_RANK, e.g. two ranks on one GPU */
    r->device_index = env.cuda_device >= 0 ? env.cuda_device : env.local_rank;
    if (o->device_auto)
        o->device = mg_device_auto(r->device_index, r->auto_why, sizeof(r->auto_why));
    struct mg_backend_opts bo = {.threads = o->threads,
                                 .device_index = r->device_index,
                                 .precision = o->tf32 ? MG_PRECISION_TF32 : MG_PRECISION_FP32};
    rc = mg_backend_open(o->device, &bo, &r->be, err, sizeof(err));
    if (rc < 0) {
        fail("cannot start the %s backend: %s", o->device == MG_DEVICE_CUDA ? "cuda" : "cpu", err);
        if (rc == -MG_EUNSUPPORTED || rc == -ENOENT || rc == -MG_EFORMAT || rc == -MG_EVERSION ||
            rc == -ENXIO || rc == -ENODEV)
            r->exit_code = EXIT_USAGE;
    }
    return rc;
}

/* The training and test sets, through the dataset cache unless it is off.
 * What the cache could not do is said once per host (it is no error). */
static int load_data(struct run *r, char *err)
{
    const struct train_options *o = r->o;
    char dir[PATH_MAX] = "";
    if (o->data_cache)
        snprintf(dir, sizeof(dir), "%s", strcmp(o->data_cache, "off") ? o->data_cache : "");
    else if (mg_data_cache_dir(dir, sizeof(dir)) < 0)
        dir[0] = '\0';
    int rc = mg_dataset_load_cached(&r->train, o->data, o->data_dir, 1, o->train_samples, dir, err);
    if (rc == 0)
        rc = mg_dataset_load_cached(&r->test, o->data, o->data_dir, 0, o->test_samples, dir, err);
    if (rc < 0)
        return rc;
    const struct mg_dataset *sets[2] = {&r->train, &r->test};
    for (int i = 0; i < 2; i++) {
        int st = sets[i]->cache;
        if ((st == MG_DATA_CACHE_BYPASSED || st == MG_DATA_CACHE_REBUILT) &&
            r->dist.d->local_rank == 0)
            fprintf(stderr, TRAIN_PROG ": warning: %s\n", sets[i]->cache_note);
        else if (st == MG_DATA_CACHE_BUILT && prof.on)
            fprintf(stderr, TRAIN_PROG ": %s\n", sets[i]->cache_note);
    }
    return 0;
}

int setup(struct run *r)
{
    struct train_options *o = r->o;
    char err[MG_ERRMSG_LEN];
    int rc;

    rc = setup_backend(r);
    if (rc < 0)
        return rc;
    profile_mark(PH_BACKEND);
    rc = setup_dist(r);
    if (rc < 0)
        return rc;
    profile_mark(PH_DIST);
    rc = load_data(r, err);
    if (rc < 0) {
        fail("cannot load %s: %s", mg_data_name(o->data), err);
        return rc;
    }
    rc = check_images(r);
    if (rc < 0)
        return rc;
    profile_mark(PH_DATA);
    rc = mg_model_create(&r->model, r->be, o->model, &o->model_opts, o->batch_size, err);
    if (rc < 0) {
        fail("cannot build model %s: %s", o->model, err);
        return rc;
    }
    rc = mg_model_init_params(&r->model, o->seed);
    if (rc < 0) {
        fail("cannot initialize the parameters: %s", mg_strerror(rc));
        return rc;
    }
    rc = setup_ddp(r);
    if (rc < 0)
        return rc;

    struct mg_train_config cfg = {
        .batch_size = o->batch_size,
        .accum_steps = o->accum_steps,
        .seed = o->seed,
        .rank = r->dist.rank,
        .world = r->dist.world,
        .drop_last = o->drop_last,
        .global_batch = o->global_batch,
    };
    if (r->train.n < r->dist.world) {
        fail("%d training samples cannot be shared by %d processes", r->train.n, r->dist.world);
        return -EINVAL;
    }
    long per_epoch =
        mg_steps_for_epochs(1, r->train.n, r->dist.world, o->drop_last, o->batch_size, 1);
    r->total_steps = o->steps ? o->steps
                              : mg_steps_for_epochs(o->epochs, r->train.n, r->dist.world,
                                                    o->drop_last, o->batch_size, o->accum_steps);
    r->epochs_total = (r->total_steps * o->accum_steps + per_epoch - 1) / per_epoch;
    cfg.total_steps = r->total_steps;
    train_describe_run(o, r->train.n, r->dist.lr_scale, &r->dist.d->env, r->run_config,
                       sizeof(r->run_config), r->run_id, sizeof(r->run_id));
    cfg.run_id = r->run_id;
    cfg.run_id_hash = mg_run_id_hash(r->run_id);
    cfg.run_config = r->run_config;
    mg_optim_defaults(&cfg.optim, o->optimizer);
    cfg.optim.momentum = o->optimizer == MG_OPTIM_SGD ? o->momentum : 0.0;
    cfg.optim.nesterov = o->nesterov;
    cfg.optim.weight_decay = o->weight_decay;
    cfg.optim.beta1 = o->beta1;
    cfg.optim.beta2 = o->beta2;
    cfg.optim.eps = o->eps;
    cfg.sched = (struct mg_schedule){
        .kind = o->schedule,
        .base_lr = o->lr,
        .warmup = o->warmup,
        .total = r->total_steps,
        .step_size =
            o->step_size ? o->step_size : (per_epoch + o->accum_steps - 1) / o->accum_steps,
        .gamma = o->gamma,
        .min_lr = o->min_lr,
    };
    rc = mg_trainer_init(&r->trainer, &r->model, &r->train, &r->test, &cfg, &r->dist.hooks, err);
    if (rc < 0) {
        fail("cannot set up training: %s", err);
        return rc;
    }
    profile_mark(PH_MODEL);
    return 0;
}
