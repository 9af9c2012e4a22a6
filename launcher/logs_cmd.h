/* `mglaunch logs [LOG_DIR] [selectors]`: per-rank log inspection from the
 * event log plus the log files (docs/logs.md). Works while the run is going
 * and after its launcher was killed: it trusts only what is on disk, and
 * checks whether the launcher that wrote the event log is still alive. */
#ifndef MG_LOGS_CMD_H
#define MG_LOGS_CMD_H

#include <stddef.h>
#include <stdio.h>

/* argv[0] is "logs". Writes to out. Returns the exit status (0, or 1 when
 * nothing matched the selectors), or a negative code with err set
 * (-EINVAL: bad usage). */
int mg_logs_main(int argc, char **argv, FILE *out, char *err, size_t errcap);

#endif
