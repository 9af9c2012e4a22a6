/* The TensorBoard sink: an event file that TensorBoard reads as it grows.
 *
 * File: <dir>/events.out.tfevents.<unix time>.<host>.<pid>.<n>, created with
 * O_EXCL (n counts up on a clash), so no attempt overwrites another's file and
 * TensorBoard, which reads a directory's files in name order, reads them in
 * the order they were started.
 *
 * Framing (TFRecord): uint64 length, uint32 masked CRC32C of those 8 bytes,
 * the payload, uint32 masked CRC32C of the payload; all little-endian. One
 * write() per record, so a reader sees whole records or a short tail that
 * TensorBoard treats as "not yet written".
 *
 * Payloads are tensorflow.Event messages, encoded here by hand (the four
 * messages involved do not justify a protobuf library):
 *   Event    { double wall_time = 1; int64 step = 2; string file_version = 3;
 *              Summary summary = 5; SessionLog session_log = 7; }
 *   Summary  { repeated Value value = 1; }
 *   Value    { string tag = 1; float simple_value = 2; TensorProto tensor = 8;
 *              SummaryMetadata metadata = 9; }
 *   SessionLog { SessionStatus status = 1; }   (START = 1)
 *   SummaryMetadata { PluginData plugin_data = 1; }  PluginData { string plugin_name = 1; }
 *   TensorProto { DataType dtype = 1; TensorShapeProto tensor_shape = 2;
 *                 repeated bytes string_val = 8; }   (DT_STRING = 7)
 *   TensorShapeProto { repeated Dim dim = 2; }  Dim { int64 size = 1; }
 * (field numbers from tensorboard/compat/proto/{event,summary,tensor,
 * tensor_shape,types}.proto). */
#include "metrics_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crc32c.h"
#include "fs.h"

/* The largest payload: the hparams table, MG_METRICS_MAX_FIELDS rows of a key
 * and a text with every byte escaped. */
#define PAYLOAD_MAX                                                                                \
    (MG_METRICS_MAX_FIELDS * (2 * MG_METRICS_KEY_MAX + 2 * MG_METRICS_TEXT_MAX + 16) + 8192)
#define FRAME_MAX (PAYLOAD_MAX + 16)

enum {
    WIRE_VARINT = 0,
    WIRE_FIXED64 = 1,
    WIRE_BYTES = 2,
    WIRE_FIXED32 = 5
};

/* A protobuf message being encoded into a fixed buffer; over is set (and
 * nothing more is written) when it does not fit. */
struct pb {
    uint8_t *p;
    size_t len, cap;
    int over;
};

struct tb {
    struct mg_metrics_sink head;
    int fd;
    char *path;
    uint8_t frame[FRAME_MAX];
    uint8_t summary[PAYLOAD_MAX];
    uint8_t value[PAYLOAD_MAX];
    uint8_t tensor[PAYLOAD_MAX];
    uint8_t scratch[PAYLOAD_MAX];
    char text[PAYLOAD_MAX];
};

static void pb_init(struct pb *b, void *buf, size_t cap)
{
    b->p = buf;
    b->len = 0;
    b->cap = cap;
    b->over = 0;
}

static void pb_raw(struct pb *b, const void *d, size_t n)
{
    if (b->over || n > b->cap - b->len) {
        b->over = 1;
        return;
    }
    memcpy(b->p + b->len, d, n);
    b->len += n;
}

static void pb_varint(struct pb *b, uint64_t v)
{
    uint8_t t[10];
    size_t n = 0;
    do {
        t[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    pb_raw(b, t, n);
}

static void pb_key(struct pb *b, unsigned field, unsigned wire)
{
    pb_varint(b, (uint64_t)field << 3 | wire);
}

static void pb_le(struct pb *b, uint64_t v, int bytes)
{
    uint8_t t[8];
    for (int i = 0; i < bytes; i++)
        t[i] = (uint8_t)(v >> (8 * i));
    pb_raw(b, t, (size_t)bytes);
}

static void pb_double(struct pb *b, unsigned field, double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof(u));
    pb_key(b, field, WIRE_FIXED64);
    pb_le(b, u, 8);
}

static void pb_float(struct pb *b, unsigned field, float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof(u));
    pb_key(b, field, WIRE_FIXED32);
    pb_le(b, u, 4);
}

static void pb_int(struct pb *b, unsigned field, int64_t v)
{
    pb_key(b, field, WIRE_VARINT);
    pb_varint(b, (uint64_t)v);
}

static void pb_bytes(struct pb *b, unsigned field, const void *d, size_t n)
{
    pb_key(b, field, WIRE_BYTES);
    pb_varint(b, n);
    pb_raw(b, d, n);
}

static void pb_msg(struct pb *b, unsigned field, const struct pb *inner)
{
    if (inner->over)
        b->over = 1;
    pb_bytes(b, field, inner->p, inner->len);
}

static uint32_t masked_crc(const void *d, size_t n)
{
    uint32_t c = mg_crc32c(0, d, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* Frames the Event in ev and writes it: one record, one write(). */
static int put_event(struct mg_metrics *m, struct tb *t, const struct pb *ev)
{
    if (ev->over || ev->len > PAYLOAD_MAX)
        return mg_metrics_fail(m, &t->head, -MG_ETOOBIG,
                               "TensorBoard file '%s': a record is over %d bytes", t->path,
                               PAYLOAD_MAX);
    struct pb f;
    pb_init(&f, t->frame, sizeof(t->frame));
    pb_le(&f, ev->len, 8);
    pb_le(&f, masked_crc(f.p, 8), 4);
    pb_raw(&f, ev->p, ev->len);
    pb_le(&f, masked_crc(ev->p, ev->len), 4);
    int rc = mg_metrics_write_all(t->fd, f.p, f.len);
    if (rc < 0)
        return mg_metrics_fail(m, &t->head, rc, "cannot write TensorBoard file '%s': %s", t->path,
                               mg_strerror(rc));
    return 0;
}

/* An Event's head: wall_time, and step when it is not 0 (proto3 leaves
 * defaults out, as every TensorBoard writer does). */
static void event_head(struct pb *ev, void *buf, double wall_time, long step)
{
    pb_init(ev, buf, PAYLOAD_MAX);
    pb_double(ev, 1, wall_time);
    if (step)
        pb_int(ev, 2, step);
}

static int tb_record(struct mg_metrics *m, struct mg_metrics_sink *s,
                     const struct mg_metrics_rec *r)
{
    struct tb *t = (struct tb *)s;
    struct pb sum, val, ev;
    char tag[2 * MG_METRICS_KEY_MAX + 2];
    uint8_t vbuf[sizeof(tag) + 16];

    pb_init(&sum, t->summary, sizeof(t->summary));
    for (int i = 0; i < r->n; i++) {
        const struct mg_metric *f = &r->fields[i];
        if (f->type == MG_METRIC_TEXT)
            continue;
        mg_metrics_tag(tag, sizeof(tag), r, f);
        pb_init(&val, vbuf, sizeof(vbuf));
        pb_bytes(&val, 1, tag, strlen(tag));
        pb_float(&val, 2, f->type == MG_METRIC_REAL ? (float)f->real : (float)f->i);
        pb_msg(&sum, 1, &val);
    }
    if (sum.len == 0)
        return 0; /* only text: TensorBoard has no scalar to show */
    event_head(&ev, t->scratch, r->wall_time, r->step);
    pb_msg(&ev, 5, &sum);
    return put_event(m, t, &ev);
}

static int tb_start(struct mg_metrics *m, struct mg_metrics_sink *s, long step, double wall_time)
{
    struct tb *t = (struct tb *)s;
    struct pb ev, log;
    uint8_t lbuf[8];
    pb_init(&log, lbuf, sizeof(lbuf));
    pb_int(&log, 1, 1); /* status: START */
    event_head(&ev, t->scratch, wall_time, step);
    pb_msg(&ev, 7, &log);
    return put_event(m, t, &ev);
}

/* Appends s to out[0..len) within cap bytes, NUL-terminated; with escape,
 * the characters that would break a Markdown table cell are escaped and line
 * breaks become spaces. */
static size_t md_put(char *out, size_t len, size_t cap, const char *s, int escape)
{
    for (; *s && len + 3 < cap; s++) {
        if (escape && strchr("|\\`*_", *s))
            out[len++] = '\\';
        out[len++] = (escape && (*s == '\n' || *s == '\r')) ? ' ' : *s;
    }
    out[len] = '\0';
    return len;
}

/* The settings as a Markdown table in a text summary, which TensorBoard's
 * Text tab renders (the HParams tab needs a session-group protocol that a
 * single run gains nothing from). */
static int tb_hparams(struct mg_metrics *m, struct mg_metrics_sink *s,
                      const struct mg_metrics_rec *r)
{
    struct tb *t = (struct tb *)s;
    size_t cap = sizeof(t->text);
    size_t len = md_put(t->text, 0, cap, "| setting | value |\n|---|---|\n", 0);
    for (int i = 0; i < r->n; i++) {
        const struct mg_metric *f = &r->fields[i];
        char num[48];
        const char *v = num;
        if (f->type == MG_METRIC_REAL)
            mg_metrics_fmt_real(num, sizeof(num), f->real, f->digits);
        else if (f->type == MG_METRIC_INT)
            snprintf(num, sizeof(num), "%lld", f->i);
        else
            v = f->text;
        len = md_put(t->text, len, cap, "| ", 0);
        len = md_put(t->text, len, cap, f->key, 1);
        len = md_put(t->text, len, cap, " | ", 0);
        len = md_put(t->text, len, cap, v, 1);
        len = md_put(t->text, len, cap, " |\n", 0);
    }

    struct pb plugin, meta, dim, shape, tensor, val, sum, ev;
    uint8_t pbuf[16], mbuf[24], dbuf[8], sbuf[16];
    pb_init(&plugin, pbuf, sizeof(pbuf));
    pb_bytes(&plugin, 1, "text", 4);
    pb_init(&meta, mbuf, sizeof(mbuf));
    pb_msg(&meta, 1, &plugin);
    pb_init(&dim, dbuf, sizeof(dbuf));
    pb_int(&dim, 1, 1);
    pb_init(&shape, sbuf, sizeof(sbuf));
    pb_msg(&shape, 2, &dim);
    pb_init(&tensor, t->tensor, sizeof(t->tensor));
    pb_int(&tensor, 1, 7); /* DT_STRING */
    pb_msg(&tensor, 2, &shape);
    pb_bytes(&tensor, 8, t->text, len);
    pb_init(&val, t->value, sizeof(t->value));
    pb_bytes(&val, 1, "hparams", 7);
    pb_msg(&val, 8, &tensor);
    pb_msg(&val, 9, &meta);
    pb_init(&sum, t->summary, sizeof(t->summary));
    pb_msg(&sum, 1, &val);
    event_head(&ev, t->scratch, r->wall_time, 0);
    pb_msg(&ev, 5, &sum);
    return put_event(m, t, &ev);
}

static int tb_flush(struct mg_metrics *m, struct mg_metrics_sink *s)
{
    struct tb *t = (struct tb *)s;
    int rc = mg_metrics_sync(t->fd);
    if (rc < 0)
        return mg_metrics_fail(m, s, rc, "cannot write TensorBoard file '%s': %s", t->path,
                               mg_strerror(rc));
    return 0;
}

static int tb_close(struct mg_metrics *m, struct mg_metrics_sink *s)
{
    struct tb *t = (struct tb *)s;
    if (!s->broken)
        tb_flush(m, s);
    if (close(t->fd) < 0 && errno != EINTR && !s->broken)
        mg_metrics_fail(m, s, -errno, "cannot write TensorBoard file '%s': %s", t->path,
                        strerror(errno));
    free(t->path);
    free(t);
    return m->err;
}

static const struct mg_metrics_sink_ops tb_ops = {
    .record = tb_record,
    .start = tb_start,
    .hparams = tb_hparams,
    .flush = tb_flush,
    .close = tb_close,
};

/* The host as a file-name component: '/' and other odd bytes become '_'. */
static void host_part(char *out, size_t cap, const char *host)
{
    size_t n = 0;
    for (; *host && n + 1 < cap; host++) {
        char c = *host;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '-' || c == '.' || c == '_';
        out[n++] = ok ? c : '_';
    }
    out[n] = '\0';
}

int mg_metrics_tb_open(struct mg_metrics *m, const char *dir, struct mg_metrics_sink **out,
                       char *err, size_t errlen)
{
    char host[MG_METRICS_ID_MAX];
    int rc = mg_mkdir_p(dir, 0755);
    if (rc < 0)
        return mg_seterr(err, errlen, rc, "cannot create TensorBoard directory '%s': %s", dir,
                         mg_strerror(rc));
    struct tb *t = calloc(1, sizeof(*t));
    if (!t)
        return mg_seterr(err, errlen, -ENOMEM, "out of memory");
    t->head.ops = &tb_ops;
    host_part(host, sizeof(host), m->host);
    double now = m->now();
    size_t plen = strlen(dir) + strlen(host) + 80;
    t->path = malloc(plen);
    if (!t->path) {
        free(t);
        return mg_seterr(err, errlen, -ENOMEM, "out of memory");
    }
    t->fd = -1;
    for (int n = 0; t->fd < 0 && n < 1000; n++) {
        snprintf(t->path, plen, "%s/events.out.tfevents.%010lld.%s.%d.%d", dir, (long long)now,
                 host, (int)m->pid, n);
        t->fd = open(t->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (t->fd < 0 && errno != EEXIST)
            break;
    }
    if (t->fd < 0) {
        rc = errno == EEXIST ? -EEXIST : -errno;
        mg_seterr(err, errlen, rc, "cannot create TensorBoard file '%s': %s", t->path,
                  strerror(-rc));
        free(t->path);
        free(t);
        return rc;
    }
    /* The first record says which format follows. */
    struct pb ev;
    event_head(&ev, t->scratch, now, 0);
    pb_bytes(&ev, 3, "brain.Event:2", 13);
    rc = put_event(m, t, &ev);
    if (rc < 0) {
        mg_seterr(err, errlen, rc, "%s", mg_metrics_errmsg(m));
        close(t->fd);
        free(t->path);
        free(t);
        return rc;
    }
    t->head.files[0] = t->path;
    *out = &t->head;
    return 0;
}
