/* The dataset cache (runtime/data_cache.c): a pair is decoded once and then
 * mapped; a corrupt (flipped byte, cut, bad header) or stale (source
 * rewritten, even with its times put back and in the same clock tick) cache
 * is detected and rebuilt, never used, and every load gives the decoded
 * files' bytes; ranks that start at once build it once; a builder killed
 * with the lock held, or its half-written file, stops nobody; a directory
 * others can write is not used; MG_DATA_CACHE and its defaults.
 * timeout: 60 */
#include "data.h"
#include "mg_err.h"
#include "tap.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#define N 300
#define S 784

static char dir[256], src[300], cache[300];
static unsigned char want_pixels[N * S], want_labels[N];

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* The MNIST-style pair in src: gzip'd images and plain labels, from seed. */
static void write_pair(unsigned seed)
{
    char path[512];
    unsigned char hdr[16] = {0, 0, 8, 3};
    put_be32(hdr + 4, N);
    put_be32(hdr + 8, 28);
    put_be32(hdr + 12, 28);
    for (int i = 0; i < N * S; i++)
        want_pixels[i] = (unsigned char)((unsigned)i * 2654435761u >> 24 ^ seed);
    for (int i = 0; i < N; i++)
        want_labels[i] = (unsigned char)((i + seed) % 10);
    snprintf(path, sizeof(path), "%s/train-images-idx3-ubyte.gz", src);
    gzFile g = gzopen(path, "wb1");
    gzwrite(g, hdr, 16);
    gzwrite(g, want_pixels, sizeof(want_pixels));
    gzclose(g);
    unsigned char lh[8] = {0, 0, 8, 1};
    put_be32(lh + 4, N);
    snprintf(path, sizeof(path), "%s/train-labels-idx1-ubyte", src);
    FILE *f = fopen(path, "wb");
    fwrite(lh, 1, 8, f);
    fwrite(want_labels, 1, N, f);
    fclose(f);
}

static int load(struct mg_dataset *ds, char *err)
{
    return mg_dataset_load_cached(ds, MG_DATA_MNIST, src, 1, 0, cache, err);
}

/* The one cache file in the cache directory (not the lock). */
static int cache_file(char *path, size_t len)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "ls %s/*.mgd 2>/dev/null", cache);
    FILE *p = popen(cmd, "r");
    int got = p && fgets(path, (int)len, p) != NULL;
    if (p)
        pclose(p);
    path[strcspn(path, "\n")] = '\0';
    return got;
}

/* Loads through the cache: the status it reports and whether the data is the
 * decoded files' exactly. */
static int load_is(int want_status, const char *note_has, const char *what)
{
    char err[MG_ERRMSG_LEN];
    struct mg_dataset ds;
    int rc = load(&ds, err);
    if (rc < 0) {
        diag("%s", err);
        return ok(0, "%s: loads", what);
    }
    int good = ds.n == N && ds.h == 28 && ds.w == 28 && ds.classes == 10 &&
               !memcmp(ds.pixels, want_pixels, sizeof(want_pixels)) &&
               !memcmp(ds.labels, want_labels, sizeof(want_labels));
    ok(ds.cache == want_status, "%s: status %d (want %d): %s", what, ds.cache, want_status,
       ds.cache_note);
    if (note_has)
        ok(strstr(ds.cache_note, note_has) != NULL, "%s: says '%s': %s", what, note_has,
           ds.cache_note);
    ok(good, "%s: the data is the files' own", what);
    ok((ds.map != NULL) == (want_status != MG_DATA_CACHE_BYPASSED), "%s: %s", what,
       ds.map ? "mapped" : "decoded in memory");
    mg_dataset_release(&ds);
    return good;
}

static void poke(const char *path, long off, const void *bytes, size_t len)
{
    int fd = open(path, O_WRONLY);
    if (fd < 0 || pwrite(fd, bytes, len, off) != (ssize_t)len)
        BAIL_OUT("cannot write %s", path);
    close(fd);
}

static void test_build_and_hit(void)
{
    char path[600];
    write_pair(1);
    load_is(MG_DATA_CACHE_BUILT, "built", "first load");
    ok(cache_file(path, sizeof(path)), "one cache file: %s", path);
    struct stat st;
    ok(stat(path, &st) == 0 && (st.st_mode & 077) == 0, "private to this user (mode %o)",
       st.st_mode & 0777);
    load_is(MG_DATA_CACHE_HIT, NULL, "second load");
    char err[MG_ERRMSG_LEN];
    struct mg_dataset a, b;
    is_int(mg_dataset_load_cached(&a, MG_DATA_MNIST, src, 1, 17, cache, err), 0, "with a limit");
    is_int(a.n, 17, "the limit applies to a mapped set");
    is_int(mg_dataset_load(&b, MG_DATA_MNIST, src, 1, 17, err), 0, "without the cache");
    ok(!memcmp(a.pixels, b.pixels, 17 * S) && !memcmp(a.labels, b.labels, 17),
       "cached and uncached loads agree");
    ok(b.map == NULL && b.cache == MG_DATA_CACHE_OFF, "no cache asked for: none used");
    mg_dataset_release(&a);
    mg_dataset_release(&b);
}

static void test_corrupt(void)
{
    char path[600];
    cache_file(path, sizeof(path));
    poke(path, 4096 + 1234, "\x55", 1);
    load_is(MG_DATA_CACHE_REBUILT, "corrupt: its data does not match its hash", "a flipped pixel");
    load_is(MG_DATA_CACHE_HIT, NULL, "after the rebuild");
    poke(path, 4096 + N * S + 7, "\x03", 1);
    load_is(MG_DATA_CACHE_REBUILT, "corrupt", "a changed label");
    poke(path, 17, "\x07", 1);
    load_is(MG_DATA_CACHE_REBUILT, "CRC", "a damaged header");
    if (truncate(path, 4096 + N * S / 2) != 0)
        BAIL_OUT("truncate");
    load_is(MG_DATA_CACHE_REBUILT, "bytes long", "a file cut short");
    if (truncate(path, 100) != 0)
        BAIL_OUT("truncate");
    load_is(MG_DATA_CACHE_REBUILT, "shorter than its header", "a file cut inside its header");
    poke(path, 0, "JUNKJUNK", 8);
    load_is(MG_DATA_CACHE_REBUILT, "bad magic", "another file in its place");
    /* a file grown past its header's length */
    int fd = open(path, O_WRONLY | O_APPEND);
    if (fd < 0 || write(fd, "x", 1) != 1)
        BAIL_OUT("append");
    close(fd);
    load_is(MG_DATA_CACHE_REBUILT, "bytes long", "trailing bytes");
}

/* Rewrites the header's source record i with st's identity and fixes the
 * CRC: what a change in the same clock tick as the build would look like. */
static void forge_identity(const char *path, int i, const struct stat *st)
{
    unsigned char hdr[4096];
    int fd = open(path, O_RDWR);
    if (fd < 0 || pread(fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr))
        BAIL_OUT("read header");
    unsigned char *q = hdr + 96 + 48 * i;
    uint64_t v[5] = {(uint64_t)st->st_dev, (uint64_t)st->st_ino, (uint64_t)st->st_size,
                     (uint64_t)st->st_mtim.tv_sec * 1000000000ull + (uint64_t)st->st_mtim.tv_nsec,
                     (uint64_t)st->st_ctim.tv_sec * 1000000000ull + (uint64_t)st->st_ctim.tv_nsec};
    memcpy(q, v, sizeof(v));
    uint32_t crc = (uint32_t)crc32(0L, hdr, sizeof(hdr) - 4);
    memcpy(hdr + sizeof(hdr) - 4, &crc, 4);
    if (pwrite(fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr))
        BAIL_OUT("write header");
    close(fd);
}

static void test_stale(void)
{
    char path[600], lpath[600];
    snprintf(lpath, sizeof(lpath), "%s/train-labels-idx1-ubyte", src);
    load_is(MG_DATA_CACHE_HIT, NULL, "before the sources change");
    /* same sizes, other bytes, and the modification times put back */
    struct stat before;
    stat(lpath, &before);
    write_pair(2);
    struct timespec times[2] = {before.st_atim, before.st_mtim};
    utimensat(AT_FDCWD, lpath, times, 0);
    load_is(MG_DATA_CACHE_REBUILT, "stale", "sources rewritten with their old mtime");
    load_is(MG_DATA_CACHE_HIT, NULL, "after the rebuild");

    /* the labels change in the build's own clock tick: times and size as recorded */
    cache_file(path, sizeof(path));
    want_labels[5] = (unsigned char)((want_labels[5] + 1) % 10);
    FILE *f = fopen(lpath, "r+b");
    fseek(f, 8 + 5, SEEK_SET);
    fputc(want_labels[5], f);
    fclose(f);
    struct stat now;
    stat(lpath, &now);
    forge_identity(path, 1, &now);
    load_is(MG_DATA_CACHE_REBUILT, "changed while it was built",
            "a change the times cannot show (racy source, its bytes hashed)");
    load_is(MG_DATA_CACHE_HIT, NULL, "after the rebuild");

    /* the sources moved: another directory is another cache file */
    char other[400], cmd[1400];
    snprintf(other, sizeof(other), "%s/moved", dir);
    snprintf(cmd, sizeof(cmd), "mkdir -p %s && cp -p %s/* %s/", other, src, other);
    if (system(cmd) != 0)
        BAIL_OUT("copy");
    char err[MG_ERRMSG_LEN];
    struct mg_dataset ds;
    is_int(mg_dataset_load_cached(&ds, MG_DATA_MNIST, other, 1, 0, cache, err), 0,
           "a copy of the files elsewhere");
    is_int(ds.cache, MG_DATA_CACHE_BUILT, "gets a cache file of its own");
    ok(!memcmp(ds.pixels, want_pixels, sizeof(want_pixels)), "with the copy's data");
    mg_dataset_release(&ds);
}

/* Ranks starting at once: each child loads and exits with its status. */
static void test_concurrent(void)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -f %s/*", cache);
    if (system(cmd) != 0)
        BAIL_OUT("rm");
    enum {
        K = 6
    };
    pid_t pids[K];
    int built = 0, hit = 0, good = 1;
    for (int i = 0; i < K; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            char err[MG_ERRMSG_LEN];
            struct mg_dataset ds;
            if (load(&ds, err) < 0 || memcmp(ds.pixels, want_pixels, sizeof(want_pixels)) ||
                memcmp(ds.labels, want_labels, sizeof(want_labels)))
                _exit(100);
            _exit(ds.cache);
        }
    }
    for (int i = 0; i < K; i++) {
        int st;
        waitpid(pids[i], &st, 0);
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 200;
        built += code == MG_DATA_CACHE_BUILT;
        hit += code == MG_DATA_CACHE_HIT;
        good &= code == MG_DATA_CACHE_BUILT || code == MG_DATA_CACHE_HIT;
    }
    ok(good, "%d processes at once all get the right data", K);
    is_int(built, 1, "one of them decodes and builds, %d map its file", hit);
}

/* A builder killed with the lock held and half a file written. */
static void test_killed_builder(void)
{
    char path[600], lock[700], tmp[700];
    cache_file(path, sizeof(path));
    snprintf(lock, sizeof(lock), "%s.lock", path);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    unlink(path);
    int pipefd[2];
    if (pipe(pipefd) != 0)
        BAIL_OUT("pipe");
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(lock, O_RDWR | O_CREAT, 0600);
        flock(fd, LOCK_EX);
        FILE *f = fopen(tmp, "wb");
        fwrite(want_pixels, 1, 5000, f);
        fclose(f);
        if (write(pipefd[1], "x", 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    char c;
    if (read(pipefd[0], &c, 1) != 1)
        BAIL_OUT("child");
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(pipefd[0]);
    close(pipefd[1]);
    load_is(MG_DATA_CACHE_BUILT, NULL, "after a builder was killed midway");
    ok(access(tmp, F_OK) != 0, "its half-written file is gone");
}

static void test_unsafe_dir(void)
{
    chmod(cache, 0777);
    load_is(MG_DATA_CACHE_BYPASSED, "group or world writable", "a directory others can write");
    chmod(cache, 0700);
    char path[600];
    cache_file(path, sizeof(path));
    if (geteuid() == 0 && chown(path, 65534, 65534) == 0)
        load_is(MG_DATA_CACHE_REBUILT, "not a regular file of this user", "another user's file");
    else
        ok(1, "# SKIP chown needs root");
    load_is(MG_DATA_CACHE_HIT, NULL, "back to normal");
    char err[MG_ERRMSG_LEN];
    struct mg_dataset ds;
    char file[600];
    snprintf(file, sizeof(file), "%s/a-file", dir);
    FILE *f = fopen(file, "w");
    fclose(f);
    is_int(mg_dataset_load_cached(&ds, MG_DATA_MNIST, src, 1, 0, file, err), 0,
           "a cache 'directory' that is a file");
    is_int(ds.cache, MG_DATA_CACHE_BYPASSED, "is not used: %s", ds.cache_note);
    mg_dataset_release(&ds);
    /* the sources' own errors are the decoder's */
    is_int(mg_dataset_load_cached(&ds, MG_DATA_MNIST, dir, 1, 0, cache, err), -ENOENT,
           "missing sources");
    ok(strstr(err, "cannot find train-images-idx3-ubyte"), "message: %s", err);
}

static void test_dir_env(void)
{
    char buf[512];
    setenv("MG_DATA_CACHE", "/x/y", 1);
    ok(mg_data_cache_dir(buf, sizeof(buf)) == 0 && !strcmp(buf, "/x/y"), "MG_DATA_CACHE: %s", buf);
    setenv("MG_DATA_CACHE", "off", 1);
    ok(mg_data_cache_dir(buf, sizeof(buf)) == 0 && !*buf, "MG_DATA_CACHE=off: none");
    setenv("MG_DATA_CACHE", "0", 1);
    ok(mg_data_cache_dir(buf, sizeof(buf)) == 0 && !*buf, "MG_DATA_CACHE=0: none");
    unsetenv("MG_DATA_CACHE");
    setenv("XDG_CACHE_HOME", "/xdg", 1);
    ok(mg_data_cache_dir(buf, sizeof(buf)) == 0 && !strcmp(buf, "/xdg/mg/data"), "XDG: %s", buf);
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/u", 1);
    ok(mg_data_cache_dir(buf, sizeof(buf)) == 0 && !strcmp(buf, "/home/u/.cache/mg/data"),
       "HOME: %s", buf);
    unsetenv("HOME");
    setenv("TMPDIR", "/t", 1);
    char want[64];
    snprintf(want, sizeof(want), "/t/mg-data-%u", (unsigned)geteuid());
    ok(mg_data_cache_dir(buf, sizeof(buf)) == 0 && !strcmp(buf, want), "no HOME: %s", buf);
    is_int(mg_data_cache_dir(buf, 5), -ENAMETOOLONG, "too long for the buffer");
}

int main(void)
{
    snprintf(dir, sizeof(dir), "%s/mgcache.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir))
        BAIL_OUT("mkdtemp");
    snprintf(src, sizeof(src), "%s/src", dir);
    snprintf(cache, sizeof(cache), "%s/cache", dir);
    mkdir(src, 0700);
    test_build_and_hit();
    test_corrupt();
    test_stale();
    test_concurrent();
    test_killed_builder();
    test_unsafe_dir();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        diag("could not remove %s", dir);
    test_dir_env();
    return done_testing();
}
