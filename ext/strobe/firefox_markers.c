/*
 * firefox_markers.c - a result's marker timeline (result[:markers]) in the
 * Firefox Profiler export (firefox.c), processed format version 48:
 *
 *   per thread  a markers table: name (an index into the thread's string
 *               array), startTime and endTime in milliseconds on the
 *               samples' time base, phase (0 an instant, 1 an interval),
 *               category (GC for GC pauses, GVL for a GVL wait, Idle
 *               for a thread blocked without the GVL, else Other) and
 *               data, whose
 *               "type" names the marker's schema;
 *   meta        a marker schema per marker type ("strobe:gc",
 *               "strobe:request", "strobe:user", ...), shown in the marker
 *               chart, the marker table and the thread's timeline track,
 *               with a field per data key the type's markers carry. A
 *               key's format follows its values: integer when all are
 *               integers (below 2**53, what JavaScript holds exactly),
 *               decimal when all are numbers, else string (arrays of
 *               strings joined with ", ").
 *
 * Written in the v48 shape the profiler upgrades on load: a schema's fields
 * are "data" (the later "fields" breaks the upgrade from 48), with a static
 * Description entry; types are Strobe's own, never one the profiler treats
 * specially (GCMajor, Network, Text, ...). GC pauses are named "GCMajor" or
 * "GCMinor", which only colours them as GC. Data keys the profiler reads
 * itself (type, category, cause, ...) are written with a "_" after them.
 *
 * GVL held; nothing here is signal-safe.
 */
#include "firefox_markers.h"
#include "markers.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Fields a schema lists at most; a type's other data keys are left out. */
#define STROBE_FF_MAX_FIELDS 32

enum { KIND_INT = 1, KIND_FLOAT = 2, KIND_OTHER = 4 };

typedef struct {
    VALUE type;                       /* a Symbol */
    int fields;
    VALUE key[STROBE_FF_MAX_FIELDS];  /* Symbols */
    uint8_t kind[STROBE_FF_MAX_FIELDS];
} schema_t;

static int
type_is(VALUE type, const char *name)
{
    return type == strobe_sym(name);
}

/* GC pauses in the GC category; a GVL wait in the GVL one, a thread
 * blocked without the GVL as idle; the rest Other. */
static uint8_t
category_of(VALUE type, VALUE name)
{
    if (type_is(type, "gc")) return STROBE_FF_CAT_GC;
    if (!type_is(type, "gvl")) return STROBE_FF_CAT_OTHER;
    static const char wait[] = STROBE_GVL_WAIT_NAME;
    return RSTRING_LEN(name) == (long)sizeof(wait) - 1 && !memcmp(RSTRING_PTR(name), wait, sizeof(wait) - 1)
               ? STROBE_FF_CAT_GVL_WAIT
               : STROBE_FF_CAT_IDLE;
}

typedef struct {
    long at;          /* its position in result[:markers] */
    uint32_t thread;  /* its track */
    uint32_t schema;
    int64_t start_us, end_us; /* end -1: an instant */
    uint8_t category; /* STROBE_FF_CAT_* */
} entry_t;

struct strobe_ff_markers {
    VALUE list;               /* a copy of result[:markers], then the types and keys
                               * of the schemas (held by the report: r->pinned[2]) */
    entry_t *entries;         /* by thread, then start */
    size_t len;
    size_t *thread_start;     /* per track: its first entry (threads + 1) */
    long threads;
    schema_t *schemas;
    size_t schemas_len, schemas_capa;
    st_table *schema_of;      /* type Symbol -> schema index */
    int64_t base_us, end_us;
};

strobe_ff_markers_t *
strobe_ff_markers_new(void)
{
    return ZALLOC(strobe_ff_markers_t);
}

void
strobe_ff_markers_free(strobe_ff_markers_t *m)
{
    if (!m) return;
    xfree(m->entries);
    xfree(m->thread_start);
    xfree(m->schemas);
    if (m->schema_of) st_free_table(m->schema_of);
    xfree(m);
}

int64_t
strobe_ff_markers_end_us(const strobe_ff_markers_t *m)
{
    return m->end_us;
}

/* ---- reading ------------------------------------------------------------- */

static VALUE
key_of(VALUE h, const char *name)
{
    return rb_hash_lookup2(h, strobe_sym(name), Qnil);
}

/* A time in microseconds: an Integer in [0, 2**53]; -1 otherwise. */
static int64_t
time_of(VALUE v)
{
    if (!FIXNUM_P(v)) return -1;
    long t = FIX2LONG(v);
    return t < 0 || t > STROBE_MAX_TIME_US ? -1 : (int64_t)t;
}

/* What a data value is made of (KIND_*); 0 for nil; -1 for a value a
 * marker's data cannot hold. */
static int
kind_of(VALUE v)
{
    if (NIL_P(v)) return 0;
    if (FIXNUM_P(v)) {
        long n = FIX2LONG(v);
        return n > -((long)1 << 53) && n < ((long)1 << 53) ? KIND_INT : KIND_OTHER;
    }
    if (RB_TYPE_P(v, T_BIGNUM)) return KIND_OTHER;
    if (RB_FLOAT_TYPE_P(v)) return isfinite(RFLOAT_VALUE(v)) ? KIND_FLOAT : KIND_OTHER;
    if (RB_TYPE_P(v, T_STRING) || v == Qtrue || v == Qfalse) return KIND_OTHER;
    if (RB_TYPE_P(v, T_ARRAY)) {
        for (long i = 0; i < RARRAY_LEN(v); i++)
            if (!RB_TYPE_P(RARRAY_AREF(v, i), T_STRING)) return -1;
        return KIND_OTHER;
    }
    return -1;
}

/* Keys the profiler reads from a marker's data itself (its schema, a
 * backtrace, window and navigation lines, file I/O threads). */
static int
reserved(VALUE key)
{
    static const char *const names[] = { "type", "category", "cause", "innerWindowID", "stack", "threadId" };
    VALUE str = rb_sym2str(key);
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if ((size_t)RSTRING_LEN(str) == strlen(names[i]) && !memcmp(RSTRING_PTR(str), names[i], strlen(names[i])))
            return 1;
    return 0;
}

/* Whether data also holds key's written name (a reserved key + "_"): then
 * the reserved key is left out, rather than write that name twice. */
static int
shadowed(VALUE data, VALUE key)
{
    if (!reserved(key)) return 0;
    VALUE str = rb_sym2str(key);
    char name[32];
    long len = RSTRING_LEN(str);
    if (len + 1 > (long)sizeof(name)) return 0;
    memcpy(name, RSTRING_PTR(str), (size_t)len);
    name[len] = '_';
    ID id = rb_check_id_cstr(name, len + 1, rb_utf8_encoding());
    return id && rb_hash_lookup2(data, ID2SYM(id), Qundef) != Qundef;
}

struct field_scan {
    schema_t *schema;
    VALUE list, data;
    int bad;
};

static int
scan_field(VALUE key, VALUE value, VALUE arg)
{
    struct field_scan *fs = (struct field_scan *)arg;
    int kind = kind_of(value);
    if (!SYMBOL_P(key) || kind < 0) {
        fs->bad = 1;
        return ST_STOP;
    }
    if (shadowed(fs->data, key)) return ST_CONTINUE;
    schema_t *sc = fs->schema;
    int i = 0;
    while (i < sc->fields && sc->key[i] != key) i++;
    if (i == sc->fields) {
        if (i == STROBE_FF_MAX_FIELDS) return ST_CONTINUE;
        sc->key[sc->fields++] = key;
        rb_ary_push(fs->list, key);
    }
    sc->kind[i] |= (uint8_t)kind;
    return ST_CONTINUE;
}

static uint32_t
schema_for(strobe_ff_markers_t *m, VALUE type)
{
    st_data_t at;
    if (st_lookup(m->schema_of, (st_data_t)type, &at)) return (uint32_t)at;
    if (m->schemas_len == m->schemas_capa) {
        m->schemas_capa = m->schemas_capa ? 2 * m->schemas_capa : 8;
        REALLOC_N(m->schemas, schema_t, m->schemas_capa);
    }
    schema_t *sc = &m->schemas[m->schemas_len];
    memset(sc, 0, sizeof(*sc));
    sc->type = type;
    rb_ary_push(m->list, type); /* (after the markers: held, see read) */
    st_insert(m->schema_of, (st_data_t)type, (st_data_t)m->schemas_len);
    return (uint32_t)m->schemas_len++;
}

static int
by_thread_then_start(const void *a, const void *b)
{
    const entry_t *x = a, *y = b;
    if (x->thread != y->thread) return x->thread < y->thread ? -1 : 1;
    if (x->start_us != y->start_us) return x->start_us < y->start_us ? -1 : 1;
    return (x->at > y->at) - (x->at < y->at);
}

void
strobe_ff_markers_read(strobe_ff_markers_t *m, report_t *r, const strobe_samples_t *s, long main_thread)
{
    m->threads = RARRAY_LEN(s->thread_ids);
    m->thread_start = ZALLOC_N(size_t, (size_t)m->threads + 1);
    VALUE list = key_of(r->result, "markers");
    if (NIL_P(list)) return;
    if (!RB_TYPE_P(list, T_ARRAY)) CORRUPT("markers is not an Array");
    /* The markers, and every type and key a schema names, are held by the
     * report: a sink's #write (Ruby) may change the result meanwhile. */
    r->pinned[2] = m->list = rb_ary_dup(list);
    list = m->list;
    long n = RARRAY_LEN(list);
    if (!n) return;
    m->schema_of = st_init_numtable();
    m->entries = ALLOC_N(entry_t, (size_t)n);

    st_table *track = st_init_numtable(); /* thread id -> its track */
    for (long t = 0; t < m->threads; t++) {
        VALUE id = RARRAY_AREF(s->thread_ids, t);
        if (FIXNUM_P(id)) st_insert(track, (st_data_t)id, (st_data_t)t);
    }
    int64_t first = INT64_MAX;
    for (long i = 0; i < n; i++) {
        VALUE h = RARRAY_AREF(list, i);
        if (!RB_TYPE_P(h, T_HASH)) {
            st_free_table(track);
            CORRUPT("marker %ld is not a Hash", i);
        }
        VALUE type = key_of(h, "type"), name = key_of(h, "name"), data = key_of(h, "data"), end = key_of(h, "end");
        entry_t *e = &m->entries[i];
        e->at = i;
        e->start_us = time_of(key_of(h, "start"));
        e->end_us = NIL_P(end) ? -1 : time_of(end);
        int ok = SYMBOL_P(type) && RB_TYPE_P(name, T_STRING) && e->start_us >= 0 &&
                 (NIL_P(end) || e->end_us >= e->start_us) && (NIL_P(data) || RB_TYPE_P(data, T_HASH));
        if (ok) {
            e->schema = schema_for(m, type);
            struct field_scan fs = { &m->schemas[e->schema], m->list, data, 0 };
            if (!NIL_P(data)) rb_hash_foreach(data, scan_field, (VALUE)&fs);
            ok = !fs.bad;
            e->category = category_of(type, name);
        }
        if (!ok) {
            st_free_table(track);
            CORRUPT("marker %ld is malformed", i);
        }
        st_data_t t;
        VALUE thread = key_of(h, "thread");
        e->thread = FIXNUM_P(thread) && st_lookup(track, (st_data_t)thread, &t) ? (uint32_t)t : (uint32_t)main_thread;
        if (e->start_us < first) first = e->start_us;
    }
    st_free_table(track);
    m->len = (size_t)n;
    qsort(m->entries, m->len, sizeof(entry_t), by_thread_then_start);
    for (size_t i = 0; i < m->len; i++) m->thread_start[m->entries[i].thread + 1]++;
    for (long t = 0; t < m->threads; t++) m->thread_start[t + 1] += m->thread_start[t];

    m->base_us = s->time && s->n ? s->start_us : first;
    for (size_t i = 0; i < m->len; i++) {
        const entry_t *e = &m->entries[i];
        int64_t last = (e->end_us >= 0 ? e->end_us : e->start_us) - m->base_us;
        if (last > m->end_us) m->end_us = last;
    }
}

/* ---- writing --------------------------------------------------------------- */

/* A data key as written: itself, or with "_" after a reserved one. */
static void
out_field_key(out_t *o, VALUE key)
{
    VALUE str = rb_sym2str(key);
    if (!reserved(key)) {
        strobe_out_json_str(o, str);
        return;
    }
    out_mem(o, "\"", 1);
    out_str(o, str);
    OUT_LIT(o, "_\"");
}

static const char *
format_of(uint8_t kind)
{
    return kind == KIND_INT ? "integer" : kind == KIND_FLOAT || kind == (KIND_INT | KIND_FLOAT) ? "decimal" : "string";
}

/* d in the fewest digits that read back as d ("0.1", "1e+20"): a JSON
 * number when d is finite. */
static int
format_double(char *buf, size_t size, double d)
{
    if (isnan(d)) return snprintf(buf, size, "NaN");
    if (isinf(d)) return snprintf(buf, size, d < 0 ? "-Infinity" : "Infinity");
    int n = 0;
    for (int digits = 1; digits <= 17; digits++) {
        n = snprintf(buf, size, "%.*g", digits, d);
        if (strtod(buf, NULL) == d) break;
    }
    return n;
}

/* value as the field of format kind wants it (kind_of said it fits). */
static void
out_value(out_t *o, VALUE v, uint8_t kind)
{
    if (!(kind & KIND_OTHER)) {
        char buf[32];
        if (FIXNUM_P(v)) out_i64(o, FIX2LONG(v));
        else out_mem(o, buf, (size_t)format_double(buf, sizeof(buf), RFLOAT_VALUE(v)));
        return;
    }
    if (RB_TYPE_P(v, T_STRING)) {
        strobe_out_json_str(o, v);
    } else if (RB_TYPE_P(v, T_ARRAY)) {
        VALUE joined = rb_str_new(0, 0);
        for (long i = 0; i < RARRAY_LEN(v); i++) {
            VALUE part = RARRAY_AREF(v, i);
            if (!RB_TYPE_P(part, T_STRING)) continue; /* (checked as read) */
            if (i) rb_str_cat_cstr(joined, ", ");
            rb_str_append(joined, strobe_utf8_of(part));
        }
        strobe_out_json_str(o, joined);
    } else if (RB_FLOAT_TYPE_P(v)) {
        char buf[32];
        strobe_out_json_str(o, rb_str_new(buf, format_double(buf, sizeof(buf), RFLOAT_VALUE(v))));
    } else if (v == Qtrue || v == Qfalse) {
        strobe_out_json_str(o, rb_str_new_cstr(v == Qtrue ? "true" : "false"));
    } else {
        strobe_out_json_str(o, rb_obj_as_string(v)); /* an Integer */
    }
}

struct data_write {
    out_t *o;
    const schema_t *schema;
    VALUE data;
};

static int
write_field(VALUE key, VALUE value, VALUE arg)
{
    const struct data_write *dw = (const struct data_write *)arg;
    if (NIL_P(value)) return ST_CONTINUE; /* shown as missing */
    const schema_t *sc = dw->schema;
    int kind = kind_of(value);
    for (int i = 0; i < sc->fields; i++) {
        if (sc->key[i] != key) continue; /* (a schema's keys are Symbols) */
        /* (As read, unless a sink's #write changed it since.) */
        if (kind < 0 || (kind & ~sc->kind[i]) || shadowed(dw->data, key)) break;
        OUT_LIT(dw->o, ",");
        out_field_key(dw->o, key);
        OUT_LIT(dw->o, ":");
        out_value(dw->o, value, sc->kind[i]);
        break;
    }
    return ST_CONTINUE;
}

static void
out_type(out_t *o, VALUE type)
{
    VALUE name = rb_str_concat(rb_str_new_cstr("strobe:"), rb_sym2str(type));
    strobe_out_json_str(o, name);
}

/* A field's label: its key with spaces for underscores, capitalized
 * ("queue_time" "Queue time"), or the words Strobe's own keys mean. */
static void
out_label(out_t *o, VALUE key)
{
    static const char *const known[][2] = { { "gc_by", "Started by" }, { "major_by", "Major because" } };
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
        if (key == strobe_sym(known[i][0])) {
            strobe_out_json_str(o, rb_str_new_cstr(known[i][1]));
            return;
        }
    }
    VALUE label = rb_str_dup(rb_sym2str(key));
    char *p = RSTRING_PTR(label);
    for (long i = 0; i < RSTRING_LEN(label); i++)
        if (p[i] == '_') p[i] = ' ';
    if (RSTRING_LEN(label) && p[0] >= 'a' && p[0] <= 'z') p[0] = (char)(p[0] - 'a' + 'A');
    strobe_out_json_str(o, label);
}

void
strobe_ff_markers_write_schema(out_t *o, const strobe_ff_markers_t *m)
{
    for (size_t k = 0; k < m->schemas_len; k++) {
        const schema_t *sc = &m->schemas[k];
        if (k) OUT_LIT(o, ",");
        OUT_LIT(o, "{\"name\":");
        out_type(o, sc->type);
        const char *label = "{marker.name}", *chart = "{marker.name}", *description;
        if (type_is(sc->type, "gc")) {
            chart = label = "{marker.name} {marker.data.gc_by}";
            description = "A GC pause of this thread: the phases it ran, what started it (gc_by) and why it was "
                          "major (major_by), as GC.latest_gc_info tells.";
        } else if (type_is(sc->type, "request")) {
            label = "{marker.name} {marker.data.status}";
            chart = "{marker.data.endpoint}";
            description = "A Rack request this thread served (Strobe::Middleware): method, path, status (none "
                          "when the application raised) and endpoint (Rails' Controller#action).";
        } else if (type_is(sc->type, "user")) {
            description = "A span or an instant marked with Strobe.mark.";
        } else if (type_is(sc->type, "gvl")) {
            description = "This thread waiting for the GVL (GVL wait: ready to run, another thread holds it) or "
                          "blocked without it (IO, sleep, a lock, C code that released it), for 100 µs or more.";
        } else if (type_is(sc->type, "thread")) {
            description = "This thread's start or end.";
        } else {
            description = "A marker of this type, with its data.";
        }
        OUT_LIT(o, ",\"display\":[\"marker-chart\",\"marker-table\",\"timeline-overview\"],\"chartLabel\":");
        strobe_out_json_str(o, rb_str_new_cstr(chart));
        OUT_LIT(o, ",\"tooltipLabel\":");
        strobe_out_json_str(o, rb_str_new_cstr(label));
        OUT_LIT(o, ",\"tableLabel\":");
        strobe_out_json_str(o, rb_str_new_cstr(label));
        OUT_LIT(o, ",\"data\":[");
        for (int i = 0; i < sc->fields; i++) {
            OUT_LIT(o, "{\"key\":");
            out_field_key(o, sc->key[i]);
            OUT_LIT(o, ",\"label\":");
            out_label(o, sc->key[i]);
            OUT_LIT(o, ",\"format\":\"");
            const char *format = format_of(sc->kind[i]);
            out_mem(o, format, strlen(format));
            OUT_LIT(o, "\"");
            if (sc->kind[i] & KIND_OTHER) OUT_LIT(o, ",\"searchable\":true");
            OUT_LIT(o, "},");
        }
        OUT_LIT(o, "{\"label\":\"Description\",\"value\":");
        strobe_out_json_str(o, rb_str_new_cstr(description));
        OUT_LIT(o, "}]}");
    }
}

/* A GC pause's name, for the profiler's GC colours: one that marked is a
 * GCMajor or a GCMinor (why it was major is in major_by); one that only
 * swept is a GCSlice, a step of the lazy sweep after the last marking. */
static VALUE
gc_name(VALUE data, VALUE names)
{
    if (!RB_TYPE_P(data, T_HASH)) return RARRAY_AREF(names, 1);
    VALUE phases = key_of(data, "phases");
    int marked = !RB_TYPE_P(phases, T_ARRAY); /* (not Strobe's: taken as a whole GC) */
    for (long i = 0; !marked && i < RARRAY_LEN(phases); i++) {
        VALUE phase = RARRAY_AREF(phases, i);
        marked = RB_TYPE_P(phase, T_STRING) && RSTRING_LEN(phase) == 7 && !memcmp(RSTRING_PTR(phase), "marking", 7);
    }
    if (!marked) return RARRAY_AREF(names, 2);
    return RARRAY_AREF(names, RTEST(key_of(data, "major_by")) ? 0 : 1);
}

size_t
strobe_ff_markers_write_thread(out_t *o, const strobe_ff_markers_t *m, long t, strobe_ff_intern_t intern, void *arg)
{
    size_t from = m->len ? m->thread_start[t] : 0, to = m->len ? m->thread_start[t + 1] : 0;
    OUT_LIT(o, "\"markers\":{\"data\":[");
    VALUE names = rb_ary_new_from_args(3, rb_str_new_cstr("GCMajor"), rb_str_new_cstr("GCMinor"), rb_str_new_cstr("GCSlice"));
    VALUE sym_gc = strobe_sym("gc");
    for (size_t i = from; i < to; i++) {
        const entry_t *e = &m->entries[i];
        const schema_t *sc = &m->schemas[e->schema];
        VALUE h = RARRAY_AREF(m->list, e->at), data = RB_TYPE_P(h, T_HASH) ? key_of(h, "data") : Qnil;
        if (i > from) OUT_LIT(o, ",");
        OUT_LIT(o, "{\"type\":");
        out_type(o, sc->type);
        if (RB_TYPE_P(data, T_HASH)) {
            struct data_write dw = { o, sc, data };
            rb_hash_foreach(data, write_field, (VALUE)&dw);
        }
        OUT_LIT(o, "}");
    }
    OUT_LIT(o, "],\"name\":[");
    for (size_t i = from; i < to; i++) {
        const entry_t *e = &m->entries[i];
        VALUE h = RARRAY_AREF(m->list, e->at), name = RB_TYPE_P(h, T_HASH) ? key_of(h, "name") : Qnil;
        if (m->schemas[e->schema].type == sym_gc) name = gc_name(RB_TYPE_P(h, T_HASH) ? key_of(h, "data") : Qnil, names);
        if (i > from) OUT_LIT(o, ",");
        out_i64(o, intern(arg, name));
    }
    OUT_LIT(o, "],\"startTime\":[");
    for (size_t i = from; i < to; i++) {
        if (i > from) OUT_LIT(o, ",");
        out_ms(o, m->entries[i].start_us - m->base_us);
    }
    OUT_LIT(o, "],\"endTime\":[");
    for (size_t i = from; i < to; i++) {
        if (i > from) OUT_LIT(o, ",");
        if (m->entries[i].end_us < 0) OUT_LIT(o, "null");
        else out_ms(o, m->entries[i].end_us - m->base_us);
    }
    OUT_LIT(o, "],\"phase\":[");
    for (size_t i = from; i < to; i++) {
        if (i > from) OUT_LIT(o, ",");
        if (m->entries[i].end_us < 0) OUT_LIT(o, "0");
        else OUT_LIT(o, "1");
    }
    OUT_LIT(o, "],\"category\":[");
    for (size_t i = from; i < to; i++) {
        if (i > from) OUT_LIT(o, ",");
        out_i64(o, m->entries[i].category);
    }
    OUT_LIT(o, "],\"length\":");
    out_u64(o, to - from, 0);
    OUT_LIT(o, "}");
    RB_GC_GUARD(names);
    return to - from;
}
