/* Small facts about processes that several launcher files need: a variable
 * of an environment array, signal names and numbers, the shell-style exit
 * code of a wait status, and a process's start time (which, with its pid,
 * tells a live launcher from a later process that reused the pid). */
#ifndef MG_PROC_H
#define MG_PROC_H

#include <stddef.h>

/* Value of name in an envp array, or NULL. */
const char *mg_env_get(char *const *env, const char *name);
/* The same, from the process environment when env is NULL. */
const char *mg_env_lookup(char *const *env, const char *name);

/* When process pid started, in clock ticks after boot (/proc/<pid>/stat field
 * 22). -1 when it cannot be read. */
long long mg_proc_start_time(int pid);

/* "SIGSEGV" (or "SIG62"); buf is used for unnamed ones. */
const char *mg_signame(int sig, char *buf, size_t cap);
/* Parses "SIGTERM", "TERM" or "15". Returns the number or -EINVAL. */
int mg_signum(const char *name);
/* Shell-style code for a wait status: the exit code, or 128+signal. */
int mg_status_code(int wstatus);

#endif
