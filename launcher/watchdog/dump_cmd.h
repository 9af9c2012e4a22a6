/* `mglaunch dump [LOG_DIR] [--run ID]`: what every local rank of a running
 * job is doing, without stopping it: its progress record and flight
 * recorder (read through /proc from the memory mglaunch lends it), and the
 * stack of every thread (stacks.h), saved in the attempt's directory
 * (<local_rank>/dump-<time>.txt) and printed. */
#ifndef MG_DUMP_CMD_H
#define MG_DUMP_CMD_H

#include <stddef.h>
#include <stdio.h>

/* argv[0] is "dump". Returns 0, 1 when the run is not running, or a
 * negative code with err set (-EINVAL: bad usage). */
int mg_dump_main(int argc, char **argv, FILE *out, char *err, size_t errcap);

#endif
