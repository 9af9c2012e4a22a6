/* mg_strerror covers errno values and every project code. */
#include "mg_err.h"
#include "tap.h"

#include <errno.h>

int main(void)
{
    is_str(mg_strerror(-ENOENT), "No such file or directory", "errno passes through");
    is_str(mg_strerror(-MG_ECRC), "checksum mismatch", "project code, negative");
    is_str(mg_strerror(MG_EAUTH), "authentication failed", "project code, positive");
    for (int e = MG_ERR_BASE + 1; e < MG_ERR_MAX; e++)
        ok(mg_strerror(-e) != NULL && mg_strerror(-e)[0], "code %d has a message", e);
    return done_testing();
}
