/* Telling an out-of-memory kill from any other SIGKILL. A worker the
 * kernel's OOM killer took dies by SIGKILL like one killed by hand; users
 * reading "killed by SIGKILL" (torchrun prints "-9") do not know to look at
 * memory. The kernel says so in two places: the oom_kill counter of the
 * worker's memory cgroup (cgroup v2 memory.events, v1 memory.oom_control),
 * and its log ("Out of memory: Killed process PID", "Memory cgroup out of
 * memory: Killed process PID"), which /dev/kmsg gives to root. The counter
 * is read when the worker starts and again when it dies. */
#ifndef MG_OOM_H
#define MG_OOM_H

#include <stddef.h>

struct mg_oom_watch {
    char path[512]; /* the counter's file, "" when none was found */
    int v1;         /* memory.oom_control (v1) rather than memory.events (v2) */
    long long base; /* oom_kill when the worker started */
};

/* Finds pid's memory cgroup under root (NULL: "/": /proc/<pid>/cgroup,
 * /sys/fs/cgroup) and reads its oom_kill counter. Never fails: without a
 * counter, path is "". */
void mg_oom_watch_start(struct mg_oom_watch *w, const char *root, int pid);

/* After pid died by SIGKILL: 1 when the kernel's OOM killer did it, with
 * what says so in why ("memory cgroup /x: oom_kill 0 -> 1", "kernel log:
 * Out of memory: Killed process ..."); 0 otherwise. kmsg: the kernel log
 * device to search when the counter says nothing (NULL: /dev/kmsg). */
int mg_oom_check(const struct mg_oom_watch *w, int pid, const char *kmsg, char *why, size_t cap);

/* The oom_kill counter in the text of memory.events or memory.oom_control,
 * or -1. */
long long mg_oom_count(const char *text);

/* Whether a kernel log line says the OOM killer killed pid. */
int mg_oom_kmsg_line(const char *line, int pid);

#endif
