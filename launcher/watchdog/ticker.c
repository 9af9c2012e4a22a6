/* Progress lines of a node's own ranks (see ticker.h). */
#include "ticker.h"
#include "mg_err.h"
#include "proc.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

int mg_ticker_init(struct mg_ticker *t, char *const *env)
{
    const char *v = mg_env_get(env, "MG_NODE_PROGRESS_EVERY");
    t->every_ms = MG_TICKER_EVERY_S * 1000;
    mg_ticker_reset(t);
    if (!v)
        return 0;
    char *end;
    double s = strtod(v, &end);
    if (end == v || *end || !isfinite(s) || s < 0 || s > 86400)
        return -EINVAL;
    t->every_ms = (int64_t)(s * 1000.0);
    return 0;
}

void mg_ticker_reset(struct mg_ticker *t)
{
    t->next_ms = 0;
    t->last_step = -1;
    t->last_ms = 0;
}

int mg_ticker_due(struct mg_ticker *t, int64_t step, int64_t now_ms, const char *who, char *buf,
                  size_t cap)
{
    if (t->every_ms <= 0 || step < 1)
        return 0;
    if (t->next_ms == 0) {
        mg_fmt(buf, cap,
               "%s took their first step; a line here every %g s (the job's progress lines are "
               "on node rank 0's console)",
               who, t->every_ms / 1000.0);
    } else if (now_ms >= t->next_ms) {
        double dt = (now_ms - t->last_ms) / 1000.0;
        mg_fmt(buf, cap, "%s: step %lld, %.1f steps/s", who, (long long)step,
               dt > 0 && step >= t->last_step ? (double)(step - t->last_step) / dt : 0.0);
    } else {
        return 0;
    }
    t->next_ms = now_ms + t->every_ms;
    t->last_step = step;
    t->last_ms = now_ms;
    return 1;
}
