/* Progress reports to Kubeflow Trainer's status server (Trainer v2.2, the
 * TrainJobStatus feature: kubeflow/trainer #2779, #2905, #3227). The
 * controller gives each trainer pod the server's URL, a file with a bearer
 * token (a projected service account token that rotates: read again for
 * every request) and a file with the CA of the server's certificate, and
 * fills TrainJob.status.trainerStatus from what the job POSTs:
 *
 *   {"trainerStatus": {"progressPercentage": 45, "estimatedRemainingSeconds": 120,
 *                      "metrics": [{"name": "loss", "value": "0.15"}],
 *                      "lastUpdatedTime": "2026-06-12T03:00:00Z"}}
 *
 * Reports go out from a thread of their own, the newest one replacing any
 * that has not gone yet, at most one every MG_TSTATUS_INTERVAL_MS (the
 * interval Kubeflow's SDK keeps): training never waits for the server, and a
 * server that is slow, down or refusing changes nothing but the report. */
#ifndef MG_TRAINER_STATUS_H
#define MG_TRAINER_STATUS_H

#include <stddef.h>

#define MG_TSTATUS_INTERVAL_MS 5000
#define MG_TSTATUS_METRICS_MAX 8
#define MG_TSTATUS_TIMEOUT_MS  5000 /* one request */

struct mg_tstatus;

struct mg_tstatus_config {
    const char *url;        /* the status server's endpoint (https://...) */
    const char *token_file; /* the bearer token; NULL or "": none */
    const char *ca_file;    /* PEM; NULL or "": the system's CAs */
    const char *libcurl;    /* NULL: the default */
    int interval_ms;        /* <= 0: MG_TSTATUS_INTERVAL_MS */
};

/* The configuration the controller injected: KUBEFLOW_TRAINER_SERVER_URL,
 * _TOKEN and _CA_CERT (Trainer v2.2), or the KUBEFLOW_TRAINER_STATUS_*
 * names of its first version. Returns 1 when a URL is set, else 0; the
 * strings point into the environment. */
int mg_tstatus_config_from_env(struct mg_tstatus_config *c);

struct mg_tstatus_report {
    int percent;     /* 0..100 */
    long long eta_s; /* estimated seconds left; < 0: unknown */
    int nmetrics;    /* at most MG_TSTATUS_METRICS_MAX */
    struct {
        char name[32];
        double value;
    } metrics[MG_TSTATUS_METRICS_MAX];
};

/* Loads libcurl and starts the sender; sends nothing yet. 0, or a negative
 * code with the reason in err (no libcurl, a URL that is not http(s)). */
int mg_tstatus_open(struct mg_tstatus **out, const struct mg_tstatus_config *c, char *err,
                    size_t errlen);

/* Hands over a report: it goes out when the interval allows, unless a newer
 * one replaces it first. Never blocks on the network. */
void mg_tstatus_update(struct mg_tstatus *s, const struct mg_tstatus_report *r);

/* A failure to report, or a recovery after one, since the last call: 1 with
 * a one-line message in msg (what failed and why; never the token). */
int mg_tstatus_news(struct mg_tstatus *s, char *msg, size_t cap);

/* Sends the report that waits, if one does, whatever the interval, and
 * waits at most wait_ms for the sender to be done (mg_tstatus_news then
 * says how it went). */
void mg_tstatus_flush(struct mg_tstatus *s, int wait_ms);

/* Stops the sender, giving up a request under way; what waits is dropped.
 * Returns the number of reports the server accepted (a 2xx answer). */
int mg_tstatus_close(struct mg_tstatus *s);

#endif
