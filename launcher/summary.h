/* The failure summary mglaunch prints at the end of a run that did not
 * succeed: one block covering every attempt, then the root cause (the first
 * failure) with its error-file message or the last lines of its stderr.
 * `mglaunch logs` prints the root cause with the same renderer. */
#ifndef MG_SUMMARY_H
#define MG_SUMMARY_H

#include "agent.h"

#include <stdint.h>
#include <stdio.h>

/* A failed worker's stderr as the root cause shows it: the last lines of
 * the last bytes (kept in memory by the agent, read from stderr.log by logs). */
#define MG_STDERR_TAIL_BYTES 4096
#define MG_STDERR_TAIL_LINES 20

/* Writes the summary for a run that did not succeed to f. */
void mg_summary_print(FILE *f, const struct mg_agent_result *r);

/* Takes message, traceback and host (when it names one) from the error file
 * at rc->error_file; without a readable one, error_file becomes "". Returns 0
 * when the file was read. */
int mg_root_cause_errfile(struct mg_root_cause *rc);

/* Writes the root cause block: heading ("Root cause (first failure):"), then
 * rank, host, pid, attempt, time, exit, error file, message and traceback,
 * or else the last lines of stderr, and where the logs are. */
void mg_root_cause_print(FILE *f, const char *heading, const struct mg_root_cause *rc);

/* The job's root cause on another node (a worker there, or the node
 * itself, lost), under its heading; this node's first failure, if any,
 * follows it with the heading MG_FOLLOWED_HEADING. */
#define MG_FOLLOWED_HEADING "This node's first failure (it followed the root cause):"
void mg_remote_cause_print(FILE *f, const struct mg_remote_cause *rc);

/* "exited with code 3", "killed by SIGSEGV", "could not be executed (...)". */
void mg_failure_describe(const struct mg_failure *fl, char *buf, size_t cap);

/* "2024-05-01 12:00:00.123" in local time. */
void mg_format_time_ms(int64_t wall_ms, char *buf, size_t cap);

/* "850 ms", "12.3 s", "1h02m" */
void mg_format_duration_ms(int64_t ms, char *buf, size_t cap);

#endif
