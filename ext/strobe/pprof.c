/*
 * pprof.c - a result as pprof's profile.proto (uncompressed; the caller
 * gzips it), with a protobuf encoder of its own.
 *
 * From the raw samples (samples.c): a Function per frame (name, file, first
 * line), a Location per (frame, line) pair, and a Sample per distinct
 * (stack, thread, GVL state, endpoint), leaf first, with the samples' count
 * and their time (interval x count, in nanoseconds: cpu or wall) or
 * allocated objects, and labels naming the thread (and its state, and the
 * endpoint of the request it was serving: endpoints.c). Period, start time,
 * duration and the profile's settings and metadata (as comments) go in the
 * header. Strings are interned in a string table written last (protobuf
 * fields may come in any order).
 *
 * Top-level fields stream into the output (out.h's out_t, flushed to a
 * sink in chunks); each nested message is built in a scratch buffer first,
 * since its length prefix comes before it.
 *
 * GVL held; not signal-safe.
 */
#include "endpoints.h"
#include "export.h"
#include "results.h"
#include "sampling.h"
#include <stdlib.h>
#include <inttypes.h>

/* profile.proto field numbers */
enum {
    PROFILE_SAMPLE_TYPE = 1, PROFILE_SAMPLE = 2, PROFILE_LOCATION = 4, PROFILE_FUNCTION = 5,
    PROFILE_STRING_TABLE = 6, PROFILE_TIME_NANOS = 9, PROFILE_DURATION_NANOS = 10,
    PROFILE_PERIOD_TYPE = 11, PROFILE_PERIOD = 12, PROFILE_COMMENT = 13, PROFILE_DEFAULT_SAMPLE_TYPE = 14,
    VALUE_TYPE_TYPE = 1, VALUE_TYPE_UNIT = 2,
    SAMPLE_LOCATION_ID = 1, SAMPLE_VALUE = 2, SAMPLE_LABEL = 3,
    LABEL_KEY = 1, LABEL_STR = 2, LABEL_NUM = 3,
    LOCATION_ID = 1, LOCATION_LINE = 4,
    LINE_FUNCTION_ID = 1, LINE_LINE = 2,
    FUNCTION_ID = 1, FUNCTION_NAME = 2, FUNCTION_FILENAME = 4, FUNCTION_START_LINE = 5,
};
enum { WIRE_VARINT = 0, WIRE_LEN = 2 };

/* A message being built, in a buffer the report frees (*slot). */
typedef struct {
    uint8_t *buf;
    size_t len, capa;
    void **slot;
} pb_t;

static void
pb_reserve(pb_t *m, size_t more)
{
    if (m->len + more <= m->capa) return;
    size_t capa = m->capa ? m->capa : 256;
    while (capa < m->len + more) capa *= 2;
    uint8_t *p = xrealloc(m->buf, capa);
    m->buf = p;
    *m->slot = p;
    m->capa = capa;
}

/* v as a varint into p (10 bytes at most); returns its length. */
static inline size_t
varint_to(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

static inline void
pb_varint(pb_t *m, uint64_t v)
{
    pb_reserve(m, 10);
    m->len += varint_to(m->buf + m->len, v);
}

static inline void
pb_key(pb_t *m, int field, int wire)
{
    pb_varint(m, (uint64_t)field << 3 | (uint64_t)wire);
}

/* An integer field; zero is the default and is left out. */
static inline void
pb_int(pb_t *m, int field, int64_t v)
{
    if (!v) return;
    pb_key(m, field, WIRE_VARINT);
    pb_varint(m, (uint64_t)v);
}

static void
pb_bytes(pb_t *m, int field, const void *bytes, size_t n)
{
    pb_key(m, field, WIRE_LEN);
    pb_varint(m, n);
    pb_reserve(m, n);
    if (n) memcpy(m->buf + m->len, bytes, n);
    m->len += n;
}

/* m as field of the enclosing message (or the profile, in out); m empties. */
static void
pb_nested(pb_t *outer, int field, pb_t *m)
{
    pb_bytes(outer, field, m->buf, m->len);
    m->len = 0;
}

static void
out_field(out_t *o, int field, int wire, const void *bytes, size_t n)
{
    uint8_t head[20];
    size_t h = varint_to(head, (uint64_t)field << 3 | (uint64_t)wire);
    if (wire == WIRE_LEN) h += varint_to(head + h, n);
    out_mem(o, (const char *)head, h);
    out_mem(o, bytes, n);
}

static void
out_message(out_t *o, int field, pb_t *m)
{
    out_field(o, field, WIRE_LEN, m->buf, m->len);
    m->len = 0;
}

static void
out_int(out_t *o, int field, int64_t v)
{
    if (!v) return;
    uint8_t b[10];
    out_field(o, field, WIRE_VARINT, b, varint_to(b, (uint64_t)v));
}

/* Tables that outlive pprof_body's frame until the report is freed. */
typedef struct {
    strobe_stack_table_t pairs;  /* (frame, line) -> Location id */
    strobe_stack_table_t keys;   /* (node, thread, state) -> Sample number */
} pprof_tables_t;

static void
tables_free(void *arg)
{
    pprof_tables_t *t = arg;
    strobe_stack_table_free(&t->pairs);
    strobe_stack_table_free(&t->keys);
    xfree(t);
}

typedef struct {
    report_t *r;
    strobe_samples_t *s;
    pprof_tables_t *tables;
    VALUE strings;           /* String -> index */
    VALUE string_list;       /* Array, in index order */
    pb_t msg, inner, packed; /* scratch */
} pprof_t;

/* str's index in the string table, adding it (as UTF-8: proto3 strings
 * must be) when new. */
static int64_t
intern(pprof_t *p, VALUE str)
{
    if (!RB_TYPE_P(str, T_STRING)) str = NIL_P(str) ? rb_str_new(0, 0) : rb_obj_as_string(str);
    str = strobe_utf8_of(str);
    VALUE at = rb_hash_lookup2(p->strings, str, Qundef);
    if (at != Qundef) return FIX2LONG(at);
    long n = RARRAY_LEN(p->string_list);
    rb_hash_aset(p->strings, str, LONG2FIX(n));
    rb_ary_push(p->string_list, str);
    return n;
}

/* A label's value: at most STROBE_PPROF_LABEL_MAX bytes of it, cut at a
 * character's start (Pyroscope refuses a push holding a value over 2048
 * bytes: one long thread name or request path would lose a whole window). */
#define STROBE_PPROF_LABEL_MAX 1024
static int64_t
intern_label(pprof_t *p, VALUE str)
{
    if (RB_TYPE_P(str, T_STRING) && RSTRING_LEN(str) > STROBE_PPROF_LABEL_MAX) {
        str = strobe_utf8_of(str);
        const unsigned char *b = (const unsigned char *)RSTRING_PTR(str);
        long end = STROBE_PPROF_LABEL_MAX;
        while (end > 0 && (b[end] & 0xc0) == 0x80) end--;
        str = rb_utf8_str_new((const char *)b, end);
    }
    return intern(p, str);
}

static int64_t
intern_c(pprof_t *p, const char *s)
{
    return intern(p, rb_str_new_cstr(s));
}

static void
value_type(pprof_t *p, out_t *o, int field, const char *type, const char *unit)
{
    int64_t t = intern_c(p, type), u = intern_c(p, unit);
    pb_int(&p->msg, VALUE_TYPE_TYPE, t);
    pb_int(&p->msg, VALUE_TYPE_UNIT, u);
    out_message(o, field, &p->msg);
}

static void
label(pprof_t *p, int64_t key, int64_t str, int64_t num)
{
    pb_int(&p->inner, LABEL_KEY, key);
    pb_int(&p->inner, LABEL_STR, str);
    pb_int(&p->inner, LABEL_NUM, num);
    pb_nested(&p->msg, SAMPLE_LABEL, &p->inner);
}

/* Functions for the stacks' frames; a Location per (frame, line) pair, its
 * id kept per node in loc (ids from 1). */
static uint32_t *
write_locations(pprof_t *p, out_t *o)
{
    strobe_samples_t *s = p->s;
    for (uint32_t f = 0; f < s->frames_len; f++) {
        const rframe_t *fr = &p->r->frames[s->frame_pos[f]];
        int64_t name = intern(p, fr->name);
        pb_int(&p->msg, FUNCTION_ID, f + 1);
        pb_int(&p->msg, FUNCTION_NAME, name);
        /* No system_name: pprof takes a Function whose system_name
         * equals its name for undemangled C++ and strips "<...>" from it
         * ("block in <main>" would read "block in "). */
        pb_int(&p->msg, FUNCTION_FILENAME, intern(p, fr->file));
        pb_int(&p->msg, FUNCTION_START_LINE, fr->line > 0 ? fr->line : 0);
        out_message(o, PROFILE_FUNCTION, &p->msg);
    }
    uint32_t *loc = ZALLOC_N(uint32_t, s->nodes_len);
    p->r->scratch[0] = loc;
    /* (frame, line) pairs interned as the nodes of a table of their own:
     * a pair's node id is its Location id. */
    strobe_stack_table_t *pairs = &p->tables->pairs;
    for (uint32_t n = 1; n < s->nodes_len; n++) {
        const strobe_node_t *node = &s->nodes[n];
        uint32_t before = pairs->nodes_len;
        loc[n] = strobe_stack_table_node(pairs, 0, node->frame, node->line);
        if (pairs->nodes_len == before) continue;
        pb_int(&p->inner, LINE_FUNCTION_ID, node->frame + 1);
        pb_int(&p->inner, LINE_LINE, node->line);
        pb_int(&p->msg, LOCATION_ID, loc[n]);
        pb_nested(&p->msg, LOCATION_LINE, &p->inner);
        out_message(o, PROFILE_LOCATION, &p->msg);
    }
    return loc;
}

/* One Sample per distinct (node, thread, state, endpoint), in order of
 * first sight. */
static void
write_samples(pprof_t *p, out_t *o, const uint32_t *loc, int values, int64_t per_sample)
{
    strobe_samples_t *s = p->s;
    VALUE endpoints = rb_ary_new();
    const int32_t *endpoint_of = strobe_endpoints_of_samples(p->r, 7, s, endpoints);
    /* (node, thread, state and endpoint) triples interned as the nodes of a
     * table of their own: node k + 1 is the k-th distinct one. The line
     * holds the state in its low 8 bits, the endpoint + 1 above them. */
    strobe_stack_table_t *keys = &p->tables->keys;
    uint64_t *counts = ZALLOC_N(uint64_t, s->n + 1);
    p->r->scratch[2] = counts;
    uint32_t last_node = UINT32_MAX, last_thread = 0, at = 0;
    int last_state = -1;
    for (size_t i = 0; i < s->n; i++) {
        uint32_t node = s->node[i], thread = s->thread ? s->thread[i] : 0;
        int state = (s->state ? s->state[i] : 0) | (endpoint_of ? (endpoint_of[i] + 1) << 8 : 0);
        if (node != last_node || thread != last_thread || state != last_state) {
            at = strobe_stack_table_node(keys, node, thread, state);
            last_node = node, last_thread = thread, last_state = state;
        }
        counts[at]++;
    }

    long threads = RARRAY_LEN(s->thread_ids);
    int64_t *thread_label = ALLOC_N(int64_t, threads);
    p->r->scratch[3] = thread_label;
    for (long t = 0; t < threads; t++) thread_label[t] = intern_label(p, strobe_samples_thread_name(s, p->r->result, t, NULL));
    int64_t key_thread = intern_c(p, "thread"), key_thread_id = intern_c(p, "thread_id"), key_state = intern_c(p, "state");
    int64_t state_str[STROBE_STATES] = { 0 };
    for (int st = 1; st < STROBE_STATES; st++) state_str[st] = intern(p, rb_sym2str(strobe_state_sym(st)));
    int64_t key_endpoint = RARRAY_LEN(endpoints) ? intern_c(p, "endpoint") : 0;
    int64_t *endpoint_str = p->r->scratch[1] = ALLOC_N(int64_t, RARRAY_LEN(endpoints) + 1);
    for (long e = 0; e < RARRAY_LEN(endpoints); e++) endpoint_str[e] = intern_label(p, RARRAY_AREF(endpoints, e));

    for (uint32_t d = 1; d < keys->nodes_len; d++) {
        uint32_t node = keys->nodes[d].parent, thread = keys->nodes[d].frame;
        int state = keys->nodes[d].line & 0xff, endpoint = (keys->nodes[d].line >> 8) - 1;
        for (uint32_t n = node; n; n = s->nodes[n].parent) pb_varint(&p->packed, loc[n]);
        pb_nested(&p->msg, SAMPLE_LOCATION_ID, &p->packed);
        pb_varint(&p->packed, counts[d]);
        if (values > 1) {
            uint64_t total;
            if (__builtin_mul_overflow(counts[d], (uint64_t)per_sample, &total)) CORRUPT("interval x samples is too large");
            pb_varint(&p->packed, total);
        }
        pb_nested(&p->msg, SAMPLE_VALUE, &p->packed);
        VALUE id = RARRAY_AREF(s->thread_ids, thread);
        label(p, key_thread, thread_label[thread], 0);
        if (FIXNUM_P(id)) label(p, key_thread_id, 0, FIX2LONG(id));
        if (state) label(p, key_state, state_str[state], 0);
        if (endpoint >= 0) label(p, key_endpoint, endpoint_str[endpoint], 0);
        out_message(o, PROFILE_SAMPLE, &p->msg);
    }
    RB_GC_GUARD(endpoints);
}

static void
comment(pprof_t *p, out_t *o, VALUE text)
{
    out_int(o, PROFILE_COMMENT, intern(p, text));
}

static int
metadata_comment(VALUE k, VALUE v, VALUE arg)
{
    void **a = (void **)arg;
    /* Not rb_sprintf: its %s of a VALUE refuses a String holding NUL. */
    VALUE text = rb_str_dup(rb_obj_as_string(k));
    rb_str_cat_cstr(text, ": ");
    rb_str_append(text, rb_obj_as_string(v));
    comment(a[0], a[1], text);
    return ST_CONTINUE;
}

VALUE
strobe_pprof_body(report_t *r)
{
    VALUE result = r->result;
    pprof_t p = { .r = r, .msg.slot = &r->scratch[4], .inner.slot = &r->scratch[5], .packed.slot = &r->scratch[6] };
    p.s = r->samples_read;
    p.tables = ZALLOC(pprof_tables_t);
    r->cleanup_arg = p.tables; /* freeing a table not (fully) made is safe */
    r->cleanup = tables_free;
    strobe_stack_table_init(&p.tables->pairs);
    strobe_stack_table_init(&p.tables->keys);
    p.strings = rb_hash_new();
    p.string_list = rb_ary_new();
    intern_c(&p, ""); /* string 0 */
    out_t *o = &r->out;

    VALUE mode = rb_hash_lookup2(result, strobe_sym("mode"), Qnil);
    const char *kind = mode == strobe_sym("cpu") ? "cpu" : mode == strobe_sym("wall") ? "wall"
                     : mode == strobe_sym("object") ? "objects" : NULL;
    int64_t interval = p.s->interval;
    int timed = kind && kind[0] != 'o';
    int64_t per_sample = timed ? interval * 1000 : interval; /* ns, or objects: interval < 2**31 */
    int values = kind && interval > 0 ? 2 : 1;

    value_type(&p, o, PROFILE_SAMPLE_TYPE, "samples", "count");
    if (values > 1) {
        value_type(&p, o, PROFILE_SAMPLE_TYPE, kind, timed ? "nanoseconds" : "count");
        value_type(&p, o, PROFILE_PERIOD_TYPE, kind, timed ? "nanoseconds" : "count");
        out_int(o, PROFILE_PERIOD, per_sample);
    }
    uint32_t *loc = write_locations(&p, o);
    write_samples(&p, o, loc, values, per_sample);

    int64_t duration = p.s->duration_us;
    if (!duration && p.s->time && p.s->n) duration = p.s->time[p.s->n - 1] - p.s->start_us;
    /* Microseconds below 2**53: in nanoseconds they still fit. */
    out_int(o, PROFILE_TIME_NANOS, p.s->started_at_us * 1000);
    out_int(o, PROFILE_DURATION_NANOS, duration * 1000);
    comment(&p, o, rb_sprintf("strobe: mode %"PRIsVALUE", interval %"PRId64", %"PRIsVALUE" samples, %"PRIsVALUE" gc, %"PRIsVALUE" missed",
                              mode, interval, rb_hash_lookup2(result, strobe_sym("samples"), Qnil),
                              rb_hash_lookup2(result, strobe_sym("gc_samples"), Qnil),
                              rb_hash_lookup2(result, strobe_sym("missed_samples"), Qnil)));
    VALUE metadata = rb_hash_lookup2(result, strobe_sym("metadata"), Qnil);
    if (RB_TYPE_P(metadata, T_HASH)) {
        void *ctx[2] = { &p, o };
        rb_hash_foreach(metadata, metadata_comment, (VALUE)ctx);
    }
    if (values > 1) out_int(o, PROFILE_DEFAULT_SAMPLE_TYPE, intern_c(&p, kind));

    for (long i = 0; i < RARRAY_LEN(p.string_list); i++) {
        VALUE str = RARRAY_AREF(p.string_list, i);
        out_field(o, PROFILE_STRING_TABLE, WIRE_LEN, RSTRING_PTR(str), (size_t)RSTRING_LEN(str));
        /* Held on the stack, so pinned: writing can flush to the sink and
         * run a GC that would move it from under the pointer above. */
        RB_GC_GUARD(str);
    }
    RB_GC_GUARD(p.strings);
    RB_GC_GUARD(p.string_list);
    VALUE done = out_finish(o);
    if (RB_TYPE_P(done, T_STRING)) rb_enc_associate(done, rb_ascii8bit_encoding());
    return done;
}
