/* Fuzz harness: the IDX reader (runtime/data.c), which reads the MNIST
 * files from disk. The first byte picks the dimensions asked for (1: labels,
 * 3: images); the rest is the file. */
#include "data.h"
#include "fuzz.h"

#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64], err[MG_ERRMSG_LEN];
    struct mg_idx idx;
    if (size < 1)
        return 0;
    int fd = fuzz_file(data + 1, size - 1, path, sizeof(path));
    if (fd < 0)
        return 0;
    if (mg_idx_read(path, data[0] & 1 ? 1 : 3, &idx, err) == 0) {
        size_t want = 1;
        for (int i = 0; i < idx.ndim; i++)
            want *= (size_t)idx.dims[i];
        if (want != idx.size)
            fuzz_fail("IDX: dims make %zu bytes, size says %zu", want, idx.size);
        volatile uint8_t sink = idx.size ? idx.data[idx.size - 1] : 0;
        (void)sink;
        mg_idx_release(&idx);
    }
    close(fd);
    return 0;
}
