/*
 * firefox.c - a result as a Firefox Profiler profile (the "processed"
 * format, preprocessedProfileVersion 48, which the profiler upgrades on
 * load; later versions move tables to a shared section and are too new for
 * some deployed builds).
 *
 * One thread entry (one track) per profiled Ruby thread, each with its own
 * string array and tables, built from the raw samples (samples.c):
 *   funcTable   a function per frame (name, file, first line);
 *   frameTable  a frame per (function, line) pair the thread ran;
 *   stackTable  a stack per prefix-tree node the thread reached, parents
 *               first, so prefix < index always holds;
 *   samples     the thread's samples, time-ordered, with times in
 *               milliseconds from the start of profiling.
 * Categories: Ruby methods, C functions, GC (marking and sweeping as
 * subcategories), Native (native frames, native: true; their file is the
 * object they are in), and, where samples carry GVL states, "Idle" for a blocked
 * thread and "GVL wait" for one waiting for the GVL (its leaf frame copied
 * with that category, as the profiler colours a sample by its leaf).
 * The profile info panel shows the mode, interval, counts and metadata;
 * each track, its thread's markers (firefox_markers.c).
 *
 * Written as JSON into out.h's out_t (streamed to a sink in chunks).
 * GVL held; not signal-safe.
 */
#include "firefox_markers.h"
#include "export.h"
#include "sampling.h"
#include <stdlib.h>

enum { GC_SUB_OTHER, GC_SUB_MARKING, GC_SUB_SWEEPING };

static const char categories_json[] =
    "[{\"name\":\"Other\",\"color\":\"grey\",\"subcategories\":[\"Other\"]},"
    "{\"name\":\"Ruby\",\"color\":\"red\",\"subcategories\":[\"Other\"]},"
    "{\"name\":\"C function\",\"color\":\"yellow\",\"subcategories\":[\"Other\"]},"
    "{\"name\":\"GC\",\"color\":\"orange\",\"subcategories\":[\"Other\",\"Marking\",\"Sweeping\"]},"
    "{\"name\":\"Idle\",\"color\":\"transparent\",\"subcategories\":[\"Other\"]},"
    "{\"name\":\"GVL wait\",\"color\":\"lightred\",\"subcategories\":[\"Other\"]},"
    "{\"name\":\"Native\",\"color\":\"blue\",\"subcategories\":[\"Other\"]}]";

/* A growable array of 32-bit values (int32 where a column holds -1/null). */
typedef struct {
    int32_t *v;
    size_t len, capa;
} col_t;

static void
col_push(col_t *c, int32_t x)
{
    if (c->len == c->capa) {
        c->capa = c->capa ? c->capa * 2 : 256;
        REALLOC_N(c->v, int32_t, c->capa);
    }
    c->v[c->len++] = x;
}

/* Per-thread tables, reused from thread to thread. */
enum {
    FUNC_NAME, FUNC_FILE, FUNC_LINE, FUNC_IS_RUBY,
    FRAME_FUNC, FRAME_LINE, FRAME_CAT, FRAME_SUB,
    STACK_FRAME, STACK_PREFIX, STACK_CAT, STACK_SUB,
    COLUMNS
};

typedef struct {
    report_t *r;
    strobe_samples_t *s;
    col_t col[COLUMNS];
    col_t stacks;            /* the thread's samples' stacks */
    col_t path;              /* local_stack's nodes to add */
    uint8_t *frame_cat, *frame_sub; /* per table frame: its category */
    /* per table frame / node, for the thread being written: stamp == the
     * thread's number + 1 when func / stack holds its local index */
    uint32_t *func_stamp, *func_of;
    uint32_t *stack_stamp, *stack_of;
    st_table *frames;        /* (table frame, line) -> local frame */
    st_table *recolored;     /* (node, category) -> local stack */
    VALUE strings;           /* String -> local index */
    VALUE string_list;
    uint32_t *order;         /* sample indexes grouped by thread */
    size_t *thread_start;    /* per thread: its first entry in order (threads + 1) */
    strobe_ff_markers_t *markers;
} ff_t;

static int32_t
intern(ff_t *f, VALUE str)
{
    if (!RB_TYPE_P(str, T_STRING)) str = NIL_P(str) ? rb_str_new(0, 0) : rb_obj_as_string(str);
    VALUE at = rb_hash_lookup2(f->strings, str, Qundef);
    if (at != Qundef) return (int32_t)FIX2LONG(at);
    long n = RARRAY_LEN(f->string_list);
    rb_hash_aset(f->strings, str, LONG2FIX(n));
    rb_ary_push(f->string_list, str);
    return (int32_t)n;
}

/* intern for the marker tables (firefox_markers.c). */
static int32_t
intern_marker_name(void *f, VALUE str)
{
    return intern(f, str);
}

static void
classify_frames(ff_t *f)
{
    strobe_samples_t *s = f->s;
    for (uint32_t t = 0; t < s->frames_len; t++) {
        const rframe_t *fr = &f->r->frames[s->frame_pos[t]];
        const char *name = RSTRING_PTR(fr->name), *file = RSTRING_PTR(fr->file);
        long name_len = RSTRING_LEN(fr->name), file_len = RSTRING_LEN(fr->file);
        uint8_t cat = STROBE_FF_CAT_RUBY, sub = 0;
        if (file_len == 0 && name_len > 2 && name[0] == '(') {
            if (!strcmp(name, "(garbage collection)")) cat = STROBE_FF_CAT_GC;
            else if (!strcmp(name, "(marking)")) { cat = STROBE_FF_CAT_GC; sub = GC_SUB_MARKING; }
            else if (!strcmp(name, "(sweeping)")) { cat = STROBE_FF_CAT_GC; sub = GC_SUB_SWEEPING; }
            else cat = STROBE_FF_CAT_OTHER;
        } else if (file_len == 7 && !memcmp(file, "<cfunc>", 7)) {
            cat = STROBE_FF_CAT_CFUNC;
        } else if (fr->native) {
            cat = STROBE_FF_CAT_NATIVE;
        }
        f->frame_cat[t] = cat;
        f->frame_sub[t] = sub;
    }
}

static int32_t
local_func(ff_t *f, uint32_t stamp, uint32_t frame)
{
    if (f->func_stamp[frame] == stamp) return (int32_t)f->func_of[frame];
    const rframe_t *fr = &f->r->frames[f->s->frame_pos[frame]];
    int32_t idx = (int32_t)f->col[FUNC_NAME].len;
    col_push(&f->col[FUNC_NAME], intern(f, fr->name));
    /* C functions' file is "<cfunc>", no file at all */
    col_push(&f->col[FUNC_FILE], RSTRING_LEN(fr->file) && f->frame_cat[frame] != STROBE_FF_CAT_CFUNC ? intern(f, fr->file) : -1);
    col_push(&f->col[FUNC_LINE], fr->line > 0 && fr->line <= INT32_MAX ? (int32_t)fr->line : -1);
    col_push(&f->col[FUNC_IS_RUBY], f->frame_cat[frame] == STROBE_FF_CAT_RUBY);
    f->func_stamp[frame] = stamp;
    f->func_of[frame] = (uint32_t)idx;
    return idx;
}

static int32_t
local_frame(ff_t *f, uint32_t stamp, uint32_t frame, int32_t line, int cat, int sub)
{
    st_data_t key = (st_data_t)((uint64_t)frame << 32 | (uint32_t)line) ^ ((st_data_t)cat << 61), at;
    if (st_lookup(f->frames, key, &at)) return (int32_t)at;
    int32_t func = local_func(f, stamp, frame);
    int32_t idx = (int32_t)f->col[FRAME_FUNC].len;
    col_push(&f->col[FRAME_FUNC], func);
    col_push(&f->col[FRAME_LINE], line > 0 ? line : -1);
    col_push(&f->col[FRAME_CAT], cat);
    col_push(&f->col[FRAME_SUB], sub);
    st_insert(f->frames, key, (st_data_t)idx);
    return idx;
}

static int32_t
push_stack(ff_t *f, int32_t frame, int32_t prefix, int cat, int sub)
{
    int32_t idx = (int32_t)f->col[STACK_FRAME].len;
    col_push(&f->col[STACK_FRAME], frame);
    col_push(&f->col[STACK_PREFIX], prefix);
    col_push(&f->col[STACK_CAT], cat);
    col_push(&f->col[STACK_SUB], sub);
    return idx;
}

/* The thread's stack for node, adding it and any missing ancestors (the
 * ancestors first, so every prefix is below its stack's index). */
static int32_t
local_stack(ff_t *f, uint32_t stamp, uint32_t node)
{
    if (f->stack_stamp[node] == stamp) return (int32_t)f->stack_of[node];
    const strobe_node_t *nodes = f->s->nodes;
    f->path.len = 0;
    uint32_t n = node;
    while (n && f->stack_stamp[n] != stamp) {
        col_push(&f->path, (int32_t)n);
        n = nodes[n].parent;
    }
    int32_t prefix = n ? (int32_t)f->stack_of[n] : -1;
    while (f->path.len) {
        uint32_t m = (uint32_t)f->path.v[--f->path.len];
        const strobe_node_t *nd = &nodes[m];
        int cat = f->frame_cat[nd->frame], sub = f->frame_sub[nd->frame];
        int32_t fr = local_frame(f, stamp, nd->frame, nd->line, cat, sub);
        /* An uncategorised frame ("(truncated)") takes its caller's. */
        if (cat == STROBE_FF_CAT_OTHER && prefix >= 0) { cat = f->col[STACK_CAT].v[prefix]; sub = f->col[STACK_SUB].v[prefix]; }
        prefix = push_stack(f, fr, prefix, cat, sub);
        f->stack_stamp[m] = stamp;
        f->stack_of[m] = (uint32_t)prefix;
    }
    return prefix;
}

/* node's stack with its leaf frame in category cat (a blocked or waiting
 * sample). */
static int32_t
recolored_stack(ff_t *f, uint32_t stamp, uint32_t node, int cat)
{
    st_data_t key = (st_data_t)node << 3 | (st_data_t)cat, at;
    if (st_lookup(f->recolored, key, &at)) return (int32_t)at;
    int32_t plain = local_stack(f, stamp, node);
    if (!node) return plain; /* an empty stack: nothing to recolour */
    const strobe_node_t *nd = &f->s->nodes[node];
    int32_t fr = local_frame(f, stamp, nd->frame, nd->line, cat, 0);
    int32_t idx = push_stack(f, fr, f->col[STACK_PREFIX].v[plain], cat, 0);
    st_insert(f->recolored, key, (st_data_t)idx);
    return idx;
}

/* ---- JSON ----------------------------------------------------------------- */

static void
out_key(out_t *o, const char *key)
{
    out_mem(o, "\"", 1);
    out_mem(o, key, strlen(key));
    out_mem(o, "\":", 2);
}

/* A column of n values: negative ones as null (or as is, when keep_negative). */
static void
out_col(out_t *o, const char *key, const int32_t *v, size_t n)
{
    out_key(o, key);
    OUT_LIT(o, "[");
    for (size_t i = 0; i < n; i++) {
        if (i) OUT_LIT(o, ",");
        if (v[i] < 0) OUT_LIT(o, "null");
        else out_u64(o, (uint64_t)v[i], 0);
    }
    OUT_LIT(o, "],");
}

/* A column of n copies of a literal. */
static void
out_same(out_t *o, const char *key, const char *lit, size_t n)
{
    size_t len = strlen(lit);
    out_key(o, key);
    OUT_LIT(o, "[");
    for (size_t i = 0; i < n; i++) {
        if (i) OUT_LIT(o, ",");
        out_mem(o, lit, len);
    }
    OUT_LIT(o, "],");
}

static void
out_length(out_t *o, size_t n)
{
    OUT_LIT(o, "\"length\":");
    out_u64(o, n, 0);
}

static void
write_tables(ff_t *f, out_t *o)
{
    size_t funcs = f->col[FUNC_NAME].len, frames = f->col[FRAME_FUNC].len, stacks = f->col[STACK_FRAME].len;
    OUT_LIT(o, "\"funcTable\":{");
    out_col(o, "name", f->col[FUNC_NAME].v, funcs);
    out_key(o, "isJS");
    OUT_LIT(o, "[");
    for (size_t i = 0; i < funcs; i++) {
        if (i) OUT_LIT(o, ",");
        if (f->col[FUNC_IS_RUBY].v[i]) OUT_LIT(o, "true");
        else OUT_LIT(o, "false");
    }
    OUT_LIT(o, "],");
    out_same(o, "relevantForJS", "false", funcs);
    out_same(o, "resource", "-1", funcs);
    out_col(o, "fileName", f->col[FUNC_FILE].v, funcs);
    out_col(o, "lineNumber", f->col[FUNC_LINE].v, funcs);
    out_same(o, "columnNumber", "null", funcs);
    out_length(o, funcs);
    OUT_LIT(o, "},\"frameTable\":{");
    out_same(o, "address", "-1", frames);
    out_same(o, "inlineDepth", "0", frames);
    out_col(o, "category", f->col[FRAME_CAT].v, frames);
    out_col(o, "subcategory", f->col[FRAME_SUB].v, frames);
    out_col(o, "func", f->col[FRAME_FUNC].v, frames);
    out_same(o, "nativeSymbol", "null", frames);
    out_same(o, "innerWindowID", "null", frames);
    out_same(o, "implementation", "null", frames);
    out_col(o, "line", f->col[FRAME_LINE].v, frames);
    out_same(o, "column", "null", frames);
    out_length(o, frames);
    OUT_LIT(o, "},\"stackTable\":{");
    out_col(o, "frame", f->col[STACK_FRAME].v, stacks);
    out_col(o, "prefix", f->col[STACK_PREFIX].v, stacks);
    out_col(o, "category", f->col[STACK_CAT].v, stacks);
    out_col(o, "subcategory", f->col[STACK_SUB].v, stacks);
    out_length(o, stacks);
    OUT_LIT(o, "},");
}

static void
write_thread(ff_t *f, out_t *o, long t, int is_main, int64_t interval_us)
{
    strobe_samples_t *s = f->s;
    uint32_t stamp = (uint32_t)t + 1;
    for (int c = 0; c < COLUMNS; c++) f->col[c].len = 0;
    st_clear(f->frames);
    st_clear(f->recolored);
    rb_hash_clear(f->strings);
    rb_ary_clear(f->string_list);

    size_t from = f->thread_start[t], to = f->thread_start[t + 1];
    col_t *stacks = &f->stacks;
    stacks->len = 0;
    for (size_t i = from; i < to; i++) {
        size_t k = f->order[i];
        int state = s->state ? s->state[k] : STROBE_STATE_UNKNOWN;
        int32_t st = state == STROBE_STATE_BLOCKED ? recolored_stack(f, stamp, s->node[k], STROBE_FF_CAT_IDLE)
                   : state == STROBE_STATE_WAITING ? recolored_stack(f, stamp, s->node[k], STROBE_FF_CAT_GVL_WAIT)
                                                   : local_stack(f, stamp, s->node[k]);
        col_push(stacks, st);
    }

    VALUE result = f->r->result, id = RARRAY_AREF(s->thread_ids, t);
    OUT_LIT(o, "{\"name\":");
    strobe_out_json_str(o, strobe_samples_thread_name(s, result, t, NULL));
    OUT_LIT(o, ",\"processType\":\"default\",\"processName\":\"ruby\",\"pid\":\"");
    VALUE pid = rb_hash_lookup2(result, strobe_sym("pid"), Qnil);
    out_u64(o, FIXNUM_P(pid) && FIX2LONG(pid) > 0 ? (uint64_t)FIX2LONG(pid) : 0, 0);
    OUT_LIT(o, "\",\"tid\":");
    out_i64(o, FIXNUM_P(id) ? FIX2LONG(id) : 0);
    OUT_LIT(o, ",\"isMainThread\":");
    if (is_main) OUT_LIT(o, "true");
    else OUT_LIT(o, "false");
    OUT_LIT(o, ",\"processStartupTime\":0,\"processShutdownTime\":null,\"registerTime\":");
    out_ms(o, s->time && to > from ? s->time[f->order[from]] - s->start_us : 0);
    OUT_LIT(o, ",\"unregisterTime\":null,\"pausedRanges\":[],");
    write_tables(f, o);
    OUT_LIT(o, "\"samples\":{");
    out_col(o, "stack", stacks->v, stacks->len);
    out_key(o, "time");
    OUT_LIT(o, "[");
    for (size_t i = from; i < to; i++) {
        if (i > from) OUT_LIT(o, ",");
        out_ms(o, s->time ? s->time[f->order[i]] - s->start_us : (int64_t)(i - from) * interval_us);
    }
    OUT_LIT(o, "],\"weight\":null,\"weightType\":\"samples\",");
    out_length(o, to - from);
    OUT_LIT(o, "},");
    if (strobe_ff_markers_write_thread(o, f->markers, t, intern_marker_name, f)) OUT_LIT(o, ",\"showMarkersInTimeline\":true");
    OUT_LIT(o, ",\"resourceTable\":{\"lib\":[],\"name\":[],\"host\":[],\"type\":[],\"length\":0},"
               "\"nativeSymbols\":{\"libIndex\":[],\"address\":[],\"name\":[],\"functionSize\":[],\"length\":0},"
               "\"stringArray\":[");
    for (long i = 0; i < RARRAY_LEN(f->string_list); i++) {
        if (i) OUT_LIT(o, ",");
        strobe_out_json_str(o, RARRAY_AREF(f->string_list, i));
    }
    OUT_LIT(o, "]}");
}

/* ---- meta ------------------------------------------------------------------ */

static void
extra_entry(out_t *o, int *first, VALUE label, VALUE value)
{
    if (!*first) OUT_LIT(o, ",");
    *first = 0;
    OUT_LIT(o, "{\"label\":");
    strobe_out_json_str(o, label);
    if (FIXNUM_P(value)) {
        OUT_LIT(o, ",\"format\":\"integer\",\"value\":");
        out_i64(o, FIX2LONG(value));
    } else {
        OUT_LIT(o, ",\"format\":\"string\",\"value\":");
        strobe_out_json_str(o, NIL_P(value) ? rb_str_new_cstr("") : rb_obj_as_string(value));
    }
    OUT_LIT(o, "}");
}

static int
metadata_entry(VALUE k, VALUE v, VALUE arg)
{
    void **a = (void **)arg;
    extra_entry(a[0], a[1], rb_obj_as_string(k), v);
    return ST_CONTINUE;
}

static void
write_meta(ff_t *f, out_t *o, int64_t interval_us, int64_t end_us, long main_thread)
{
    VALUE result = f->r->result;
    OUT_LIT(o, "\"meta\":{\"interval\":");
    out_ms(o, interval_us);
    OUT_LIT(o, ",\"startTime\":");
    out_ms(o, f->s->started_at_us);
    OUT_LIT(o, ",\"profilingStartTime\":0,\"profilingEndTime\":");
    out_ms(o, end_us);
    OUT_LIT(o, ",\"processType\":0,\"product\":\"Ruby (Strobe)\",\"stackwalk\":0,\"version\":28,"
               "\"preprocessedProfileVersion\":48,\"symbolicated\":true,\"sourceCodeIsNotOnSearchfox\":true,"
               "\"keepProfileThreadOrder\":true,\"markerSchema\":[");
    strobe_ff_markers_write_schema(o, f->markers);
    OUT_LIT(o, "],\"categories\":");
    out_mem(o, categories_json, sizeof(categories_json) - 1);
    long threads = RARRAY_LEN(f->s->thread_ids);
    OUT_LIT(o, ",\"initialVisibleThreads\":[");
    for (long t = 0; t < threads; t++) {
        if (t) OUT_LIT(o, ",");
        out_u64(o, (uint64_t)t, 0);
    }
    OUT_LIT(o, "],\"initialSelectedThreads\":[");
    out_u64(o, (uint64_t)main_thread, 0);
    OUT_LIT(o, "],\"extra\":[{\"label\":\"Strobe\",\"entries\":[");
    int first = 1;
    static const char *const keys[] = { "mode", "interval", "samples", "gc_samples", "missed_samples", "timer" };
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        VALUE v = rb_hash_lookup2(result, strobe_sym(keys[i]), Qundef);
        if (v != Qundef) extra_entry(o, &first, rb_str_new_cstr(keys[i]), v);
    }
    OUT_LIT(o, "]}");
    VALUE metadata = rb_hash_lookup2(result, strobe_sym("metadata"), Qnil);
    if (RB_TYPE_P(metadata, T_HASH) && RHASH_SIZE(metadata)) {
        OUT_LIT(o, ",{\"label\":\"Metadata\",\"entries\":[");
        first = 1;
        void *ctx[2] = { o, &first };
        rb_hash_foreach(metadata, metadata_entry, (VALUE)ctx);
        OUT_LIT(o, "]}");
    }
    OUT_LIT(o, "]}");
}

/* Frees what firefox_body allocated, however it ends (report_free). */
static void
ff_cleanup(void *arg)
{
    ff_t *f = arg;
    for (int c = 0; c < COLUMNS; c++) xfree(f->col[c].v);
    xfree(f->stacks.v);
    xfree(f->path.v);
    strobe_ff_markers_free(f->markers);
    if (f->frames) st_free_table(f->frames);
    if (f->recolored) st_free_table(f->recolored);
    xfree(f);
}

VALUE
strobe_firefox_body(report_t *r)
{
    VALUE result = r->result;
    /* On the heap: freed by ff_cleanup as the report is, after this
     * function's frame is gone. */
    ff_t *f = ZALLOC(ff_t);
    r->cleanup = ff_cleanup;
    r->cleanup_arg = f;
    f->r = r;
    f->s = r->samples_read;
    strobe_samples_t *s = f->s;
    /* Held in C memory: marked, and so pinned, by the report, from before
     * anything else is allocated. */
    r->pinned[0] = f->strings = rb_hash_new();
    r->pinned[1] = f->string_list = rb_ary_new();
    long threads = RARRAY_LEN(s->thread_ids);

    /* Buffers, freed with the report. */
    uint32_t frames_len = s->frames_len, nodes_len = s->nodes_len;
    uint8_t *cats = r->scratch[0] = ZALLOC_N(uint8_t, 2 * (size_t)(frames_len ? frames_len : 1));
    f->frame_cat = cats;
    f->frame_sub = cats + frames_len;
    uint32_t *func = r->scratch[1] = ZALLOC_N(uint32_t, 2 * (size_t)(frames_len ? frames_len : 1));
    f->func_stamp = func;
    f->func_of = func + frames_len;
    uint32_t *stack = r->scratch[2] = ZALLOC_N(uint32_t, 2 * (size_t)nodes_len);
    f->stack_stamp = stack;
    f->stack_of = stack + nodes_len;
    f->order = strobe_samples_by_thread(r, s, &f->thread_start);
    classify_frames(f);

    VALUE mode = rb_hash_lookup2(result, strobe_sym("mode"), Qnil);
    int timed = mode == strobe_sym("cpu") || mode == strobe_sym("wall");
    int64_t interval_us = timed && s->interval > 0 ? s->interval : 1000;
    int64_t end_us = s->duration_us;
    for (size_t k = 0; k < s->n; k++) {
        /* times below 2**53, an interval below 2**31: no overflow; without
         * times, k intervals might */
        int64_t at = s->time ? s->time[k] - s->start_us : strobe_checked_mul((int64_t)k, interval_us, "interval");
        at += interval_us;
        if (at > end_us) end_us = at;
    }
    long main_thread = -1;
    int *is_main = r->scratch[6] = ALLOC_N(int, threads);
    for (long t = 0; t < threads; t++) {
        strobe_samples_thread_name(s, result, t, &is_main[t]);
        if (is_main[t] && main_thread < 0) main_thread = t;
        else is_main[t] = 0;
    }
    if (main_thread < 0) main_thread = 0, is_main[0] = 1; /* a process track needs one */
    f->markers = strobe_ff_markers_new();
    strobe_ff_markers_read(f->markers, r, s, main_thread);
    if (strobe_ff_markers_end_us(f->markers) > end_us) end_us = strobe_ff_markers_end_us(f->markers);

    out_t *o = &r->out;
    OUT_LIT(o, "{");
    write_meta(f, o, interval_us, end_us, main_thread);
    OUT_LIT(o, ",\"libs\":[],\"pages\":[],\"counters\":[],\"threads\":[");
    f->frames = st_init_numtable();
    f->recolored = st_init_numtable();
    for (long t = 0; t < threads; t++) {
        if (t) OUT_LIT(o, ",");
        write_thread(f, o, t, is_main[t], interval_us);
    }
    OUT_LIT(o, "]}\n");
    return out_finish(o);
}
