/* The dataset cache (see data.h): each decoded IDX pair kept in one file that
 * every process training on it maps read-only.
 *
 * Why: decoding Fashion-MNIST's gzip'd files takes a quarter of a second, and
 * every rank paid it again at every start and restart. Mapping a checked file
 * costs a few milliseconds (its hash), and the ranks of a host share its pages.
 *
 * A file, <dir>/<images file>-<hash of both source paths>.mgd, is a 4096-byte
 * header then the pixels then the labels (layout in docs/train.md). It is used
 * only when all of this holds, else it is rebuilt:
 * - the header is intact (magic, version, CRC) and says what the length is;
 * - each source file has the device, inode, size, modification and change
 *   times the header recorded (stale otherwise), and a source whose change
 *   time is within RACY_NS of the build also hashes to what it did then: a
 *   change in the same clock tick as the build would leave its times as they
 *   were (git's "racily clean" index entries);
 * - the pixels and labels hash to what the header says (corrupt otherwise),
 *   and every label is below the class count.
 *
 * Builders take flock(<file>.lock) and look again once they hold it, so ranks
 * that start together decode once. The file is written to <file>.tmp and
 * renamed over the old one: a reader maps the old file or the new, never a
 * part, and a builder killed midway leaves a .tmp the next one truncates
 * (the lock goes with the process). A builder that holds the lock past
 * LOCK_WAIT_MS (stopped, say) is not waited for: the caller decodes alone.
 * The directory must be this user's and not writable by others, and so must
 * the file: anyone who could write it could choose the training data. */
#include "data.h"
#include "fs.h"
#include "mg_err.h"
#include "rtutil.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define HDR_BYTES    4096
#define HDR_VERSION  1
#define SRC_BYTES    48
#define RACY_NS      (2LL * 1000000000LL)
#define LOCK_WAIT_MS 60000
#define MAX_SIDE     65536

static const unsigned char magic[8] = {0x89, 'M', 'G', 'D', 'A', 'T', 'A', '\n'};

/* What a source file was when the cache was built. */
struct src_id {
    uint64_t dev, ino, size;
    int64_t mtime_ns, ctime_ns;
    uint64_t hash; /* mg_hash64 of its bytes */
};

struct header {
    uint32_t n, c, h, w, classes;
    uint64_t pixels_bytes, labels_bytes;
    uint64_t pixels_hash, labels_hash;
    int64_t built_ns;
    uint64_t paths_hash;
    struct src_id src[2];
};

/* The paths and names one pair's cache uses. */
struct cache {
    const char *src_path[2]; /* images, labels (as the caller found them) */
    char dir[PATH_MAX];
    char path[PATH_MAX], tmp[PATH_MAX + 8], lock[PATH_MAX + 8];
    uint64_t paths_hash;
};

static int64_t realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int mg_data_cache_dir(char *buf, size_t len)
{
    const char *v = getenv("MG_DATA_CACHE");
    int n;
    if (v && (!strcmp(v, "off") || !strcmp(v, "0"))) {
        n = snprintf(buf, len, "%s", "");
    } else if (v && *v) {
        n = snprintf(buf, len, "%s", v);
    } else if ((v = getenv("XDG_CACHE_HOME")) && *v == '/') {
        n = snprintf(buf, len, "%s/mg/data", v);
    } else if ((v = getenv("HOME")) && *v == '/') {
        n = snprintf(buf, len, "%s/.cache/mg/data", v);
    } else {
        v = getenv("TMPDIR");
        n = snprintf(buf, len, "%s/mg-data-%u", v && *v == '/' ? v : "/tmp", (unsigned)geteuid());
    }
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static int stat_src(const char *path, struct src_id *id)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return -errno;
    *id = (struct src_id){
        .dev = (uint64_t)st.st_dev,
        .ino = (uint64_t)st.st_ino,
        .size = (uint64_t)st.st_size,
        .mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec,
        .ctime_ns = (int64_t)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec,
    };
    return 0;
}

static int same_src(const struct src_id *a, const struct src_id *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime_ns == b->mtime_ns && a->ctime_ns == b->ctime_ns;
}

/* mg_hash64 of a file's bytes, through a read-only mapping. */
static int hash_file(const char *path, uint64_t *out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) < 0) {
        rc = -errno;
    } else if (st.st_size == 0) {
        *out = mg_hash64("", 0);
    } else {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            rc = -errno;
        } else {
            *out = mg_hash64(p, (size_t)st.st_size);
            munmap(p, (size_t)st.st_size);
        }
    }
    close(fd);
    return rc;
}

static void pack_header(const struct header *h, unsigned char *p)
{
    memset(p, 0, HDR_BYTES);
    memcpy(p, magic, sizeof(magic));
    mg_put_u32(p + 8, HDR_VERSION);
    mg_put_u32(p + 12, HDR_BYTES);
    mg_put_u32(p + 16, h->n);
    mg_put_u32(p + 20, h->c);
    mg_put_u32(p + 24, h->h);
    mg_put_u32(p + 28, h->w);
    mg_put_u32(p + 32, h->classes);
    mg_put_u64(p + 40, HDR_BYTES);
    mg_put_u64(p + 48, h->pixels_bytes);
    mg_put_u64(p + 56, h->labels_bytes);
    mg_put_u64(p + 64, h->pixels_hash);
    mg_put_u64(p + 72, h->labels_hash);
    mg_put_u64(p + 80, (uint64_t)h->built_ns);
    mg_put_u64(p + 88, h->paths_hash);
    for (int i = 0; i < 2; i++) {
        unsigned char *q = p + 96 + SRC_BYTES * i;
        const struct src_id *s = &h->src[i];
        mg_put_u64(q, s->dev);
        mg_put_u64(q + 8, s->ino);
        mg_put_u64(q + 16, s->size);
        mg_put_u64(q + 24, (uint64_t)s->mtime_ns);
        mg_put_u64(q + 32, (uint64_t)s->ctime_ns);
        mg_put_u64(q + 40, s->hash);
    }
    mg_put_u32(p + HDR_BYTES - 4, (uint32_t)crc32(0L, p, HDR_BYTES - 4));
}

/* 0, or -MG_EFORMAT with what is wrong in why. */
static int unpack_header(const unsigned char *p, struct header *h, char *why, size_t whylen)
{
    if (memcmp(p, magic, sizeof(magic)) != 0) {
        mg_seterr(why, whylen, 0, "not a dataset cache file (bad magic)");
        return -MG_EFORMAT;
    }
    if (mg_get_u32(p + 8) != HDR_VERSION || mg_get_u32(p + 12) != HDR_BYTES ||
        mg_get_u64(p + 40) != HDR_BYTES) {
        mg_seterr(why, whylen, 0, "version %u, which this mg does not write", mg_get_u32(p + 8));
        return -MG_EFORMAT;
    }
    if (mg_get_u32(p + HDR_BYTES - 4) != (uint32_t)crc32(0L, p, HDR_BYTES - 4)) {
        mg_seterr(why, whylen, 0, "its header fails its CRC");
        return -MG_EFORMAT;
    }
    h->n = mg_get_u32(p + 16);
    h->c = mg_get_u32(p + 20);
    h->h = mg_get_u32(p + 24);
    h->w = mg_get_u32(p + 28);
    h->classes = mg_get_u32(p + 32);
    h->pixels_bytes = mg_get_u64(p + 48);
    h->labels_bytes = mg_get_u64(p + 56);
    h->pixels_hash = mg_get_u64(p + 64);
    h->labels_hash = mg_get_u64(p + 72);
    h->built_ns = (int64_t)mg_get_u64(p + 80);
    h->paths_hash = mg_get_u64(p + 88);
    for (int i = 0; i < 2; i++) {
        const unsigned char *q = p + 96 + SRC_BYTES * i;
        struct src_id *s = &h->src[i];
        s->dev = mg_get_u64(q);
        s->ino = mg_get_u64(q + 8);
        s->size = mg_get_u64(q + 16);
        s->mtime_ns = (int64_t)mg_get_u64(q + 24);
        s->ctime_ns = (int64_t)mg_get_u64(q + 32);
        s->hash = mg_get_u64(q + 40);
    }
    if (h->n == 0 || h->n > INT32_MAX || h->c != 1 || h->h == 0 || h->h > MAX_SIDE || h->w == 0 ||
        h->w > MAX_SIDE || h->classes == 0 || h->classes > 256 ||
        h->pixels_bytes != (uint64_t)h->n * h->c * h->h * h->w || h->labels_bytes != h->n ||
        h->pixels_bytes > MG_IDX_MAX_BYTES) {
        mg_seterr(why, whylen, 0, "its header describes an impossible dataset");
        return -MG_EFORMAT;
    }
    return 0;
}

/* Maps the cache file when it can be trusted (see the top of the file): 1 and
 * ds filled in; 0 with why set (missing, stale or corrupt) when it cannot. */
static int cache_map(struct mg_dataset *ds, const struct cache *k, const struct src_id cur[2],
                     char *why, size_t whylen)
{
    unsigned char hdr[HDR_BYTES];
    struct header h;
    struct stat st;
    void *map = MAP_FAILED;
    size_t len = 0;
    int fd = open(k->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        mg_seterr(why, whylen, 0, errno == ENOENT ? "missing" : "cannot be opened: %s",
                  strerror(errno));
        return 0;
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
        mg_seterr(why, whylen, 0, "not a regular file of this user");
        goto no;
    }
    ssize_t got = pread(fd, hdr, sizeof(hdr), 0);
    if (got != (ssize_t)sizeof(hdr)) {
        mg_seterr(why, whylen, 0, "corrupt: shorter than its header");
        goto no;
    }
    if (unpack_header(hdr, &h, why, whylen) < 0)
        goto no;
    len = HDR_BYTES + h.pixels_bytes + h.labels_bytes;
    if ((uint64_t)st.st_size != len) {
        mg_seterr(why, whylen, 0, "corrupt: %lld bytes long, its header says %zu",
                  (long long)st.st_size, len);
        goto no;
    }
    if (h.paths_hash != k->paths_hash) {
        mg_seterr(why, whylen, 0, "stale: built from other files");
        goto no;
    }
    for (int i = 0; i < 2; i++) {
        if (!same_src(&h.src[i], &cur[i])) {
            mg_seterr(why, whylen, 0, "stale: '%s' changed since it was built", k->src_path[i]);
            goto no;
        }
    }
    for (int i = 0; i < 2; i++) {
        uint64_t now;
        if (h.src[i].ctime_ns + RACY_NS > h.built_ns &&
            (hash_file(k->src_path[i], &now) < 0 || now != h.src[i].hash)) {
            mg_seterr(why, whylen, 0, "stale: '%s' changed while it was built", k->src_path[i]);
            goto no;
        }
    }
    map = mmap(NULL, len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (map == MAP_FAILED) {
        mg_seterr(why, whylen, 0, "cannot be mapped: %s", strerror(errno));
        goto no;
    }
    const uint8_t *pixels = (const uint8_t *)map + HDR_BYTES;
    const uint8_t *labels = pixels + h.pixels_bytes;
    if (mg_hash64(pixels, h.pixels_bytes) != h.pixels_hash ||
        mg_hash64(labels, h.labels_bytes) != h.labels_hash) {
        mg_seterr(why, whylen, 0, "corrupt: its data does not match its hash");
        goto no;
    }
    for (uint32_t i = 0; i < h.n; i++)
        if (labels[i] >= h.classes) {
            mg_seterr(why, whylen, 0, "corrupt: label %u of sample %u", labels[i], i);
            goto no;
        }
    close(fd);
    ds->n = (int)h.n;
    ds->c = (int)h.c;
    ds->h = (int)h.h;
    ds->w = (int)h.w;
    ds->classes = (int)h.classes;
    ds->map = map;
    ds->map_len = len;
    ds->pixels = (uint8_t *)pixels;
    ds->labels = (uint8_t *)labels;
    return 1;
no:
    if (map != MAP_FAILED)
        munmap(map, len);
    close(fd);
    return 0;
}

/* The cache's directory, made when missing: it must be this user's alone to
 * write. 0, or a negative code with the reason in why. */
static int check_dir(const char *dir, char *why, size_t whylen)
{
    struct stat st;
    int rc = mg_mkdir_p(dir, 0700);
    if (rc < 0) {
        mg_seterr(why, whylen, 0, "cannot create '%s': %s", dir, mg_strerror(rc));
        return rc;
    }
    if (lstat(dir, &st) < 0) {
        rc = -errno;
        mg_seterr(why, whylen, 0, "cannot use '%s': %s", dir, mg_strerror(rc));
        return rc;
    }
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022)) {
        mg_seterr(why, whylen, 0,
                  "'%s' is not a directory of this user's that only it can write (a symlink, "
                  "another user's, or group or world writable)",
                  dir);
        return -EPERM;
    }
    return 0;
}

/* Waits for the builders' lock: its fd, or a negative code (-ETIMEDOUT past
 * LOCK_WAIT_MS). */
static int take_lock(const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -errno;
    for (int waited_ms = 0;; waited_ms += 2) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            return fd;
        if (errno != EWOULDBLOCK && errno != EINTR) {
            int rc = -errno;
            close(fd);
            return rc;
        }
        if (waited_ms >= LOCK_WAIT_MS) {
            close(fd);
            return -ETIMEDOUT;
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
}

static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t k = write(fd, p, len > (1u << 30) ? (1u << 30) : len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? -errno : -EIO;
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

/* Writes the decoded pair as k->path (through k->tmp and a rename). */
static int write_cache(const struct cache *k, const struct mg_idx *img, const struct mg_idx *lab,
                       const struct src_id src[2], int64_t built_ns)
{
    unsigned char hdr[HDR_BYTES];
    struct header h = {
        .n = (uint32_t)img->dims[0],
        .c = 1,
        .h = (uint32_t)img->dims[1],
        .w = (uint32_t)img->dims[2],
        .classes = 10,
        .pixels_bytes = img->size,
        .labels_bytes = lab->size,
        .pixels_hash = mg_hash64(img->data, img->size),
        .labels_hash = mg_hash64(lab->data, lab->size),
        .built_ns = built_ns,
        .paths_hash = k->paths_hash,
        .src = {src[0], src[1]},
    };
    pack_header(&h, hdr);
    int fd = open(k->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -errno;
    int rc = write_all(fd, hdr, sizeof(hdr));
    if (!rc)
        rc = write_all(fd, img->data, img->size);
    if (!rc)
        rc = write_all(fd, lab->data, lab->size);
    if (close(fd) < 0 && !rc)
        rc = -errno;
    if (!rc && rename(k->tmp, k->path) < 0)
        rc = -errno;
    if (rc)
        unlink(k->tmp);
    return rc;
}

static void use_decoded(struct mg_dataset *ds, struct mg_idx *img, struct mg_idx *lab)
{
    ds->n = img->dims[0];
    ds->c = 1;
    ds->h = img->dims[1];
    ds->w = img->dims[2];
    ds->classes = 10;
    ds->pixels = img->data;
    ds->labels = lab->data;
    img->data = lab->data = NULL;
}

__attribute__((format(printf, 3, 4))) static void note(struct mg_dataset *ds, int status,
                                                       const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ds->cache_note, sizeof(ds->cache_note), fmt, ap);
    va_end(ap);
    ds->cache = status;
}

/* Decodes the pair without the cache (it could not be used: why). */
static int bypass(struct mg_dataset *ds, const struct cache *k, const char *why, char *err)
{
    struct mg_idx img, lab;
    int rc = mg_idx_pair_read(k->src_path[0], k->src_path[1], &img, &lab, err);
    if (rc < 0)
        return rc;
    use_decoded(ds, &img, &lab);
    note(ds, MG_DATA_CACHE_BYPASSED, "dataset cache not used: %s", why);
    return 0;
}

static int name_cache(struct cache *k, const char *dir, const char *ipath, const char *lpath)
{
    char real[2][PATH_MAX], base[256];
    const char *src[2] = {ipath, lpath};
    for (int i = 0; i < 2; i++)
        if (!realpath(src[i], real[i]))
            snprintf(real[i], sizeof(real[i]), "%s", src[i]);
    size_t a = strlen(real[0]);
    char *both = malloc(a + strlen(real[1]) + 2);
    if (!both)
        return -ENOMEM;
    memcpy(both, real[0], a + 1);
    memcpy(both + a + 1, real[1], strlen(real[1]) + 1);
    k->paths_hash = mg_hash64(both, a + 1 + strlen(real[1]));
    free(both);
    const char *slash = strrchr(real[0], '/');
    snprintf(base, sizeof(base), "%.200s", slash ? slash + 1 : real[0]);
    size_t bl = strlen(base);
    if (bl > 3 && !strcmp(base + bl - 3, ".gz"))
        base[bl - 3] = '\0';
    k->src_path[0] = ipath;
    k->src_path[1] = lpath;
    int n = snprintf(k->dir, sizeof(k->dir), "%s", dir);
    int m = snprintf(k->path, sizeof(k->path), "%s/%s-%016llx.mgd", dir, base,
                     (unsigned long long)k->paths_hash);
    if (n < 0 || (size_t)n >= sizeof(k->dir) || m < 0 || (size_t)m + 8 >= sizeof(k->path))
        return -ENAMETOOLONG;
    snprintf(k->tmp, sizeof(k->tmp), "%s.tmp", k->path);
    snprintf(k->lock, sizeof(k->lock), "%s.lock", k->path);
    return 0;
}

int mg_data_cache_load(struct mg_dataset *ds, const char *cache_dir, const char *ipath,
                       const char *lpath, char *err)
{
    struct cache k;
    struct src_id cur[2], after[2];
    struct mg_idx img = {0}, lab = {0};
    char why[MG_DATA_CACHE_NOTE_MAX], miss[MG_DATA_CACHE_NOTE_MAX], buf[MG_DATA_CACHE_NOTE_MAX];
    int rc, lock = -1;

    rc = name_cache(&k, cache_dir, ipath, lpath);
    if (rc < 0) {
        k.src_path[0] = ipath;
        k.src_path[1] = lpath;
        return bypass(ds, &k, rc == -ENOMEM ? "out of memory" : "its path is too long", err);
    }
    /* a source that cannot be read: the decoder says so, in its words */
    if (stat_src(ipath, &cur[0]) < 0 || stat_src(lpath, &cur[1]) < 0)
        return bypass(ds, &k, "a source file is unreadable", err);
    if (check_dir(k.dir, why, sizeof(why)) < 0)
        return bypass(ds, &k, why, err);
    if (cache_map(ds, &k, cur, miss, sizeof(miss))) {
        ds->cache = MG_DATA_CACHE_HIT;
        return 0;
    }
    lock = take_lock(k.lock);
    if (lock < 0) {
        mg_seterr(why, sizeof(why), 0, "cannot lock '%s': %s", k.lock,
                  lock == -ETIMEDOUT ? "another process has held it for over 60 s"
                                     : mg_strerror(lock));
        return bypass(ds, &k, why, err);
    }
    /* another process may have built it while this one waited */
    if (cache_map(ds, &k, cur, why, sizeof(why))) {
        ds->cache = MG_DATA_CACHE_HIT;
        goto unlock;
    }
    int64_t built_ns = realtime_ns();
    rc = mg_idx_pair_read(ipath, lpath, &img, &lab, err);
    if (rc < 0)
        goto unlock;
    for (int i = 0; i < 2; i++)
        if (hash_file(k.src_path[i], &cur[i].hash) < 0 || stat_src(k.src_path[i], &after[i]) < 0 ||
            !same_src(&after[i], &cur[i])) {
            use_decoded(ds, &img, &lab);
            note(ds, MG_DATA_CACHE_BYPASSED,
                 "dataset cache not written: '%s' changed while it was decoded", k.src_path[i]);
            goto unlock;
        }
    rc = write_cache(&k, &img, &lab, cur, built_ns);
    if (rc < 0) {
        use_decoded(ds, &img, &lab);
        note(ds, MG_DATA_CACHE_BYPASSED, "dataset cache not written: '%s': %s", k.tmp,
             mg_strerror(rc));
        rc = 0;
        goto unlock;
    }
    if (!cache_map(ds, &k, cur, buf, sizeof(buf))) {
        use_decoded(ds, &img, &lab);
        note(ds, MG_DATA_CACHE_BYPASSED, "dataset cache '%s' unreadable once written: %s", k.path,
             buf);
        goto unlock;
    }
    if (!strcmp(miss, "missing"))
        note(ds, MG_DATA_CACHE_BUILT, "dataset cache '%s' built", k.path);
    else
        note(ds, MG_DATA_CACHE_REBUILT, "dataset cache '%s' rebuilt: it was %s", k.path, miss);
unlock:
    mg_idx_release(&img);
    mg_idx_release(&lab);
    close(lock); /* releases the flock */
    return rc;
}
