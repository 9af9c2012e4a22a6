/* The helpers of fuzz.h, linked into every harness (libFuzzer's and replay's). */
#include "fuzz.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int fuzz_file(const uint8_t *data, size_t size, char *path, size_t cap)
{
    int fd = memfd_create("mgfuzz", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t off = 0;
    while (off < size) {
        ssize_t n = write(fd, data + off, size - off);
        if (n <= 0) {
            close(fd);
            return -1;
        }
        off += (size_t)n;
    }
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

int fuzz_split(const uint8_t *data, size_t size, char *buf, char **out, int max)
{
    int n = 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    for (size_t i = 0; i <= size && n < max;) {
        out[n++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    return n;
}

void fuzz_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fuzz: invariant broken: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}
