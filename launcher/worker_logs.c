/* What became of each worker's output once its attempt is drained: saved,
 * not saved (no --log_dir), or cut short (a write failed, a full disk),
 * recorded in the event log (worker_logs) with a failed worker's last
 * stderr lines when its stderr.log lacks them, so that `mglaunch logs`
 * later says what it knows instead of "(empty)" (docs/logs.md). */
#include "agent_internal.h"
#include "events.h"
#include "mg_err.h"
#include "redact.h"
#include "summary.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* "saved", "not saved", "cut short: No space left on device" */
static const char *stream_state(const struct stream *s, char *buf, size_t cap)
{
    if (s->file_errno) {
        mg_fmt(buf, cap, "cut short: %s", strerror(s->file_errno));
        return buf;
    }
    return s->file_fd == -2 ? "not saved" : "saved";
}

void mg_worker_logs_note(const struct worker *w, char *buf, size_t cap)
{
    char ob[96], eb[96];
    mg_event_logs_note(stream_state(&w->out, ob, sizeof(ob)), stream_state(&w->err, eb, sizeof(eb)),
                       buf, cap);
}

void mg_workers_report_logs(struct mg_agent *ag)
{
    char tail[MG_STDERR_TAIL_BYTES], ob[96], eb[96];
    for (int i = 0; i < ag->nproc; i++) {
        const struct worker *w = &ag->w[i];
        int failed = w->outcome == W_FAILED;
        if (!failed && !w->out.file_errno && !w->err.file_errno)
            continue;
        struct mg_ev_worker_logs e = {
            .w = {ag->attempt, w->local_rank, w->rank, w->pid},
            .out = stream_state(&w->out, ob, sizeof(ob)),
            .err = stream_state(&w->err, eb, sizeof(eb)),
        };
        /* The tail a failed worker's stderr.log does not hold (not saved,
         * or cut short before its last lines) is what the launcher kept. */
        if (failed && w->tail && strcmp(e.err, "saved") != 0) {
            mg_tail_lines(w->tail, w->tail_len, w->tail_cut, MG_STDERR_TAIL_LINES, tail,
                          sizeof(tail));
            mg_redact_inplace(tail, sizeof(tail)); /* it goes to disk: docs/logs.md#secrets */
            e.stderr_tail = tail;
        }
        mg_event_worker_logs(&ag->rd, &e);
    }
}
