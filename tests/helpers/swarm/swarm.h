/* What the two files of the scale swarm share: tests/helpers/rdzv_swarm.c
 * (the simulated nodes, their processes and the run's phases and checks) and
 * swarm_measure.c (what it measures: the nodes' requests by kind, the
 * store's CPU, memory and request count, the probe and flooding clients). */
#ifndef MG_SWARM_H
#define MG_SWARM_H

#include "kv.h"

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

enum phase {
    P_CONNECT,
    P_JOIN,
    P_STEADY,
    P_KILL,
    P_STOP
};

struct node_res {
    int64_t t_join, t_formed, t_reformed;
    int round, rank, nnodes, mport;
    int round2, rank2, nnodes2, mport2;
    int victim, dead, err, leaver, left;
    char msg[200];
};

/* Requests each node made through the rendezvous' key-value backend, by
 * operation and by phase, with the time they took (a wrapper around the
 * backend's ops: count_requests in swarm_measure.c). A list that reads values (the closer's
 * listing of the joins) counts its gets too, as they are requests. */
enum kv_op {
    OP_GET,
    OP_SET,
    OP_CAS,
    OP_ADD,
    OP_DEL,
    OP_LIST,
    OP_WAIT,
    OP_PING,
    OP_N
};
#define NPHASE 5

struct opstat {
    _Atomic uint64_t n, us;
};

struct shared {
    _Atomic int phase;
    struct opstat ops[NPHASE][OP_N];
    _Atomic int connected, formed, reformed, failed, exited, left;
    _Atomic uint64_t host_requests; /* --hosted: the hosted server's count */
    _Atomic int64_t host_rss_kb;
    _Atomic int64_t t_join0; /* when the join phase began */
    int n;
    struct node_res res[];
};

/* The phases, the nodes' results and the counters, in memory shared by the
 * swarm's processes (rdzv_swarm.c maps it before they fork). */
extern struct shared *sh;

/* Puts the counting wrapper in front of kv's backend: every call of its
 * operations is counted in sh->ops under the phase it ran in. */
void count_requests(struct mg_kv *kv);

/* The store's CPU time, memory and request count at one moment. */
struct sample {
    double cpu_s;
    long rss_kb, hwm_kb;
    uint64_t requests;
    int64_t t;
};

/* Whose figures take() reads: the store process's pid (0: none), and its
 * request count from the file storesrv writes its statistics to on SIGUSR1
 * (NULL: none), or, with hosted, the count node 0 keeps in sh, or, with
 * etcd ("host:port"), the gRPC calls etcd's /metrics counts (its JSON
 * gateway makes one of each request). The probe then asks etcd too. */
void measure_target(pid_t server_pid, const char *stats_file, int hosted, const char *etcd);
void take(struct sample *s);

/* "get=N/AVGus ..." for the requests of phase p; returns their total. */
uint64_t ops_line(int p, char *buf, size_t cap);

/* The probe: one more client, a GET every 10 ms until probe_stop; the
 * worst latency it saw. The argument is the store's "host:port" (etcd's
 * with measure_target's etcd: a GET through mg's etcd backend). */
void *probe_main(void *endpoint);
extern _Atomic int probe_stop;
extern _Atomic int64_t probe_max_us, probe_count, probe_errors;

/* A flooder (--flood), until probe_stop; flood_bytes is what it sent. */
void *flood_main(void *endpoint);
extern _Atomic int64_t flood_bytes;

#endif
