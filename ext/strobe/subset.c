/*
 * subset.c - part of a result with raw data: the samples some threads took
 * in some windows of time, as a result of their own.
 *
 * Strobe::Native.thread_subset(result, thread_id, from = nil, to = nil) and
 * Strobe::Native.windows_subset(result, [[thread_id, from, to], ...]) walk
 * the result's raw stacks (runs of identical stacks with a repeat count)
 * alongside raw_sample_threads, keep the samples of each window's thread
 * taken from `from` to `to` (CLOCK_MONOTONIC microseconds as
 * raw_sample_timestamps has them; nil: unbounded), and build a new result
 * from them the same way live results are built: the stacks are interned
 * into a stack table, the kept samples become per-node self counts,
 * strobe_results_aggregate() derives samples/total_samples/edges/lines, and
 * the kept samples are the part's Strobe::Stacks (stacks.c). Frame ids are the original
 * result's, so the two results can be compared frame by frame. The markers
 * kept are those of the windows' threads that overlap a window.
 *
 * Windows are sorted per thread with a running maximum of their ends, so a
 * sample finds whether a window holds it by a binary search and a short
 * walk back, however many windows there are (an endpoint's requests).
 *
 * Every index is checked: a malformed result raises Strobe::ProfileError.
 * GVL held; not signal-safe. Linear in the samples, in C.
 */
#include "subset.h"
#include "results.h"
#include "stacks.h"
#include "sampling.h"
#include "stack_table.h"
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint32_t thread;         /* position in thread_ids */
    int64_t from, to;
    int64_t reach;           /* the latest `to` of its thread's windows up to it */
} window_t;

typedef struct {
    strobe_stack_table_t table;
    int table_ready;
    uint64_t *self;          /* per node, grown with the table */
    uint32_t self_capa;
    uint32_t *sample_nodes;  /* kept samples */
    int64_t *times;
    uint16_t *threads;       /* kept samples' positions in thread_ids */
    uint8_t *states;         /* kept samples' GVL states */
    size_t kept, kept_capa;
    VALUE result;
    VALUE thread_ids;        /* the windows' threads, in order of first mention */
    VALUE position;          /* thread id -> position in thread_ids */
    window_t *windows;       /* by thread, then start */
    size_t *first;           /* per thread: its first window (threads + 1) */
    size_t windows_len;
    int timed;               /* a window is bounded: the samples need times */
} subset_t;

static VALUE
key(VALUE hash, const char *name)
{
    return rb_hash_aref(hash, strobe_sym(name));
}

static VALUE
array_key(VALUE hash, const char *name)
{
    VALUE v = key(hash, name);
    if (!RB_TYPE_P(v, T_ARRAY)) CORRUPT("the result has no %s array (profile with raw: true)", name);
    return v;
}


static void
keep(subset_t *s, uint32_t node, int64_t time, uint16_t thread, uint8_t state)
{
    if (s->kept == s->kept_capa) {
        s->kept_capa = s->kept_capa ? s->kept_capa * 2 : 1024;
        s->sample_nodes = strobe_grow(s->sample_nodes, s->kept_capa, sizeof(uint32_t));
        s->times = strobe_grow(s->times, s->kept_capa, sizeof(int64_t));
        s->threads = strobe_grow(s->threads, s->kept_capa, sizeof(uint16_t));
        s->states = strobe_grow(s->states, s->kept_capa, 1);
    }
    s->sample_nodes[s->kept] = node;
    s->times[s->kept] = time;
    s->threads[s->kept] = thread;
    s->states[s->kept] = state;
    s->kept++;
    if (node >= s->self_capa) {
        uint32_t capa = s->self_capa ? s->self_capa : 1024;
        while (capa <= node) capa *= 2;
        s->self = strobe_grow(s->self, capa, sizeof(uint64_t));
        memset(s->self + s->self_capa, 0, (capa - s->self_capa) * sizeof(uint64_t));
        s->self_capa = capa;
    }
    s->self[node]++;
}

/* Whether a window of thread position t holds time x. */
static int
in_window(const subset_t *s, uint32_t t, int64_t x)
{
    size_t lo = s->first[t], hi = s->first[t + 1];
    while (lo < hi) { /* the first window that starts after x */
        size_t mid = lo + (hi - lo) / 2;
        if (s->windows[mid].from <= x) lo = mid + 1;
        else hi = mid;
    }
    for (size_t i = lo; i > s->first[t] && s->windows[i - 1].reach >= x; i--)
        if (s->windows[i - 1].to >= x) return 1;
    return 0;
}

/* The markers of result on the windows' threads that overlap one of their
 * windows into out; other threads' are left out, as their samples are. */
static void
subset_markers(const subset_t *s, VALUE result, VALUE out)
{
    VALUE markers = key(result, "markers");
    rb_hash_delete(out, strobe_sym("markers"));
    if (!RB_TYPE_P(markers, T_ARRAY)) return;
    VALUE kept = rb_ary_new();
    for (long i = 0; i < RARRAY_LEN(markers); i++) {
        VALUE m = RARRAY_AREF(markers, i);
        if (!RB_TYPE_P(m, T_HASH)) continue;
        VALUE thread = key(m, "thread");
        VALUE at = FIXNUM_P(thread) ? rb_hash_lookup2(s->position, thread, Qnil) : Qnil;
        if (NIL_P(at)) continue;
        VALUE b = key(m, "start"), e = key(m, "end");
        if (!FIXNUM_P(b)) continue;
        long start = FIX2LONG(b), end = FIXNUM_P(e) ? FIX2LONG(e) : start;
        /* Overlapping a window: the latest window to start by its end
         * (binary search) or one before it still running at its start
         * (reach bounds the walk back). */
        uint32_t t = (uint32_t)FIX2LONG(at);
        size_t lo = s->first[t], hi = s->first[t + 1];
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (s->windows[mid].from <= end) lo = mid + 1;
            else hi = mid;
        }
        int overlaps = 0;
        for (size_t w = lo; w > s->first[t] && !overlaps && s->windows[w - 1].reach >= start; w--)
            overlaps = s->windows[w - 1].to >= start;
        if (overlaps) rb_ary_push(kept, m);
    }
    if (RARRAY_LEN(kept)) rb_hash_aset(out, strobe_sym("markers"), kept);
}

/* A part cut by time spans its windows, not the whole profile: its start
 * (started_at, and the start the raw times are counted from) and its
 * duration become those of the windows' union within the profile, so an
 * export's timeline shows a request as long as it was. Returns the new
 * start on the clock of the sample times. */
static int64_t
narrow_to_windows(const subset_t *s, VALUE result, VALUE out, int64_t start)
{
    VALUE duration = key(result, "duration"), started_at = key(result, "started_at");
    if (!FIXNUM_P(duration) || FIX2LONG(duration) < 0) return start;
    int64_t end = start + FIX2LONG(duration), from = INT64_MAX, to = INT64_MIN;
    for (size_t i = 0; i < s->windows_len; i++) {
        int64_t a = s->windows[i].from < start ? start : s->windows[i].from;
        int64_t b = s->windows[i].to > end ? end : s->windows[i].to;
        if (b < a) continue; /* outside the profile */
        if (a < from) from = a;
        if (b > to) to = b;
    }
    if (from > to) return start;
    rb_hash_aset(out, strobe_sym("duration"), LL2NUM(to - from));
    if (FIXNUM_P(started_at)) rb_hash_aset(out, strobe_sym("started_at"), LL2NUM(FIX2LONG(started_at) + (from - start)));
    return from;
}

/* The samples of the windows, from the raw arrays: sets *has_times,
 * *has_states and *start (the profile's start on the clock of the times,
 * 0 when unknown). */
static void
walk_raw(subset_t *s, VALUE frames, int *has_times_out, int *has_states_out, int64_t *start)
{
    VALUE result = s->result;
    VALUE raw = array_key(result, "raw"), raw_lines = array_key(result, "raw_lines");
    VALUE sample_threads = array_key(result, "raw_sample_threads");
    VALUE stamps = key(result, "raw_sample_timestamps");
    long raw_len = RARRAY_LEN(raw), n = RARRAY_LEN(sample_threads);
    if (RARRAY_LEN(raw_lines) != raw_len) CORRUPT("raw_lines does not match raw");
    int has_times = RB_TYPE_P(stamps, T_ARRAY);
    if (has_times && RARRAY_LEN(stamps) != n) CORRUPT("raw_sample_timestamps does not match raw_sample_threads");
    VALUE states = key(result, "raw_sample_states");
    int has_states = RB_TYPE_P(states, T_ARRAY);
    if (has_states && RARRAY_LEN(states) != n) CORRUPT("raw_sample_states does not match raw_sample_threads");
    if (s->timed && !has_times) rb_raise(rb_eArgError, "a time window needs raw_sample_timestamps");

    long sample = 0, thread = -1;
    VALUE last_tid = Qundef;
    for (long i = 0; i < raw_len;) {
        long depth = strobe_fixnum_at(raw, i, "raw");
        /* Written so that no huge value can overflow the checks. */
        if (depth < 0 || depth > raw_len - i - 2) CORRUPT("raw is truncated at index %ld", i);
        long count = strobe_fixnum_at(raw, i + depth + 1, "raw");
        if (count < 0 || count > n - sample) CORRUPT("raw has more samples than raw_sample_threads");
        uint32_t node = 0;
        int interned = 0;
        for (long k = sample; k < sample + count; k++) {
            VALUE tid = RARRAY_AREF(sample_threads, k);
            if (tid != last_tid) {
                /* (Integer ids only: another's #hash would be Ruby code here.) */
                VALUE at = FIXNUM_P(tid) ? rb_hash_lookup2(s->position, tid, Qnil) : Qnil;
                thread = NIL_P(at) ? -1 : FIX2LONG(at);
                last_tid = tid;
            }
            if (thread < 0) continue;
            if (!in_window(s, (uint32_t)thread, has_times ? strobe_fixnum_at(stamps, k, "raw_sample_timestamps") : 0))
                continue;
            if (!interned) { /* root first, as raw lists it */
                for (long d = 1; d <= depth; d++) {
                    VALUE id = RARRAY_AREF(raw, i + d);
                    if (!FIXNUM_P(id)) CORRUPT("raw[%ld] is not a frame id", i + d);
                    if (rb_hash_lookup2(frames, id, Qundef) == Qundef)
                        CORRUPT("raw refers to frame %+"PRIsVALUE" that is not in frames", id);
                    uint32_t f = strobe_stack_table_frame(&s->table, id, STROBE_FRAME_RUBY);
                    long line = strobe_fixnum_at(raw_lines, i + d, "raw_lines");
                    if (line < INT32_MIN || line > INT32_MAX) CORRUPT("raw_lines[%ld] is out of range", i + d);
                    node = strobe_stack_table_node(&s->table, node, f, (int32_t)line);
                }
                interned = 1;
            }
            int state = STROBE_STATE_UNKNOWN;
            if (has_states && !NIL_P(RARRAY_AREF(states, k)) && (state = strobe_state_of(RARRAY_AREF(states, k))) < 0)
                CORRUPT("raw_sample_states[%ld] is not a thread state", k);
            if (node)
                keep(s, node, has_times ? strobe_fixnum_at(stamps, k, "raw_sample_timestamps") : 0, (uint16_t)thread,
                     (uint8_t)state);
        }
        sample += count;
        i += depth + 2;
    }
    if (sample != n) CORRUPT("raw_sample_threads has more samples than raw");

    *start = 0;
    VALUE deltas = key(result, "raw_timestamp_deltas");
    if (has_times && n && RB_TYPE_P(deltas, T_ARRAY) && RARRAY_LEN(deltas) == n)
        if (__builtin_sub_overflow(strobe_fixnum_at(stamps, 0, "raw_sample_timestamps"),
                                   strobe_fixnum_at(deltas, 0, "raw_timestamp_deltas"), start))
            CORRUPT("raw_timestamp_deltas[0] is out of range");
    *has_times_out = has_times;
    *has_states_out = has_states;
}

/* The same from the compact form: each stack node a kept sample reaches is
 * interned once (ancestors first), each sample then a lookup. */
typedef struct {
    subset_t *s;
    const strobe_stacks_t *st;
    VALUE frames;
} into_subset_t;

static uint32_t
subset_node(void *arg, uint32_t parent, uint32_t node)
{
    into_subset_t *c = arg;
    VALUE id = RARRAY_AREF(c->st->frame_ids, c->st->nodes[node].frame);
    if (rb_hash_lookup2(c->frames, id, Qundef) == Qundef)
        CORRUPT("a stack refers to frame %+"PRIsVALUE" that is not in frames", id);
    uint32_t f = strobe_stack_table_frame(&c->s->table, id, STROBE_FRAME_RUBY);
    return strobe_stack_table_node(&c->s->table, parent, f, c->st->nodes[node].line);
}

static void
walk_stacks(subset_t *s, const strobe_stacks_t *st, VALUE frames, int *has_times, int *has_states, int64_t *start)
{
    if (!st->thread) rb_raise(rb_eArgError, "a part by thread needs the samples' threads");
    if (s->timed && !st->time) rb_raise(rb_eArgError, "a time window needs the samples' times");
    VALUE buffer, threads_buffer;
    uint32_t *map = strobe_stacks_map_new(st, &buffer, 0);
    /* Each of the compact form's threads: its position among the windows'
     * threads, -1 for one without a window. */
    long count = RARRAY_LEN(st->thread_ids);
    long *window_thread = ALLOCV_N(long, threads_buffer, (size_t)(count ? count : 1));
    for (long t = 0; t < count; t++) {
        VALUE tid = RARRAY_AREF(st->thread_ids, t);
        VALUE at = FIXNUM_P(tid) ? rb_hash_lookup2(s->position, tid, Qnil) : Qnil;
        window_thread[t] = NIL_P(at) ? -1 : FIX2LONG(at);
    }
    into_subset_t c = { s, st, frames };
    for (size_t k = 0; k < st->n; k++) {
        long thread = window_thread[st->thread[k]];
        if (thread < 0 || !in_window(s, (uint32_t)thread, st->time ? st->time[k] : 0)) continue;
        uint32_t node = strobe_stacks_resolve(st, st->node[k], map, map + st->nodes_len, subset_node, &c);
        if (node)
            keep(s, node, st->time ? st->time[k] : 0, (uint16_t)thread,
                 (uint8_t)(st->state ? st->state[k] : STROBE_STATE_UNKNOWN));
    }
    ALLOCV_END(buffer);
    ALLOCV_END(threads_buffer);
    *has_times = st->time != NULL;
    *has_states = st->state != NULL;
    *start = st->n && st->time ? st->start_us : 0;
}

static VALUE
subset_body(VALUE arg)
{
    subset_t *s = (subset_t *)arg;
    VALUE result = s->result;
    VALUE frames = key(result, "frames");
    if (!RB_TYPE_P(frames, T_HASH)) CORRUPT("the result has no frames Hash");
    strobe_stack_table_init(&s->table);
    s->table_ready = 1;
    int has_times, has_states;
    int64_t start;
    const strobe_stacks_t *compact = strobe_stacks_get(rb_hash_lookup2(result, strobe_sym("stacks"), Qnil));
    if (compact)
        walk_stacks(s, compact, frames, &has_times, &has_states, &start);
    else
        walk_raw(s, frames, &has_times, &has_states, &start);

    /* The new result: the same keys, counts of these threads only. */
    VALUE out = rb_hash_dup(result);
    const strobe_stack_table_t *st = &s->table;
    VALUE details = rb_ary_new_capa(st->frames_len), frame_ids = rb_ary_new_capa(st->frames_len);
    VALUE out_frames = rb_hash_new();
    uint64_t gc = 0;
    for (uint32_t f = 0; f < st->frames_len; f++) {
        VALUE id = st->frames[f].value;
        VALUE src = rb_hash_aref(frames, id);
        VALUE d = rb_hash_new();
        if (RB_TYPE_P(src, T_HASH)) {
            VALUE v;
            if (!NIL_P(v = key(src, "name"))) rb_hash_aset(d, strobe_sym("name"), v);
            if (!NIL_P(v = key(src, "file"))) rb_hash_aset(d, strobe_sym("file"), v);
            if (!NIL_P(v = key(src, "line"))) rb_hash_aset(d, strobe_sym("line"), v);
            if (RTEST(v = key(src, "native"))) rb_hash_aset(d, strobe_sym("native"), Qtrue);
        }
        rb_ary_push(details, d);
        rb_ary_push(frame_ids, id);
        rb_hash_aset(out_frames, id, d);
    }
    uint64_t *self = calloc(st->nodes_len, sizeof(uint64_t));
    if (!self) rb_memerror();
    if (s->self) memcpy(self, s->self, sizeof(uint64_t) * (s->self_capa < st->nodes_len ? s->self_capa : st->nodes_len));
    VALUE gc_name = rb_str_new_cstr("(garbage collection)");
    for (uint32_t node = 1; node < st->nodes_len; node++) {
        uint32_t root = node;
        while (st->nodes[root].parent) root = st->nodes[root].parent;
        VALUE name = key(RARRAY_AREF(details, st->nodes[root].frame), "name");
        if (RB_TYPE_P(name, T_STRING) && rb_str_equal(name, gc_name)) gc += self[node];
    }
    strobe_results_aggregate(st->nodes, st->nodes_len, self, details, frame_ids, st->frames_len, 1);
    free(self);
    rb_hash_aset(out, strobe_sym("frames"), out_frames);
    rb_hash_aset(out, strobe_sym("samples"), ULL2NUM(s->kept));
    rb_hash_aset(out, strobe_sym("gc_samples"), ULL2NUM(gc));
    rb_hash_aset(out, strobe_sym("missed_samples"), INT2FIX(0)); /* not attributable to a thread */
    rb_hash_delete(out, strobe_sym("thread"));
    if (RARRAY_LEN(s->thread_ids) == 1) rb_hash_aset(out, strobe_sym("thread"), RARRAY_AREF(s->thread_ids, 0));

    VALUE threads = key(result, "threads");
    VALUE out_threads = rb_hash_new();
    for (long t = 0; t < RARRAY_LEN(s->thread_ids); t++) {
        VALUE tid = RARRAY_AREF(s->thread_ids, t), info = RB_TYPE_P(threads, T_HASH) ? rb_hash_aref(threads, tid) : Qnil;
        rb_hash_aset(out_threads, tid, NIL_P(info) ? rb_hash_new() : info);
    }
    rb_hash_aset(out, strobe_sym("threads"), out_threads);
    subset_markers(s, result, out);

    if (s->timed && has_times && start) start = narrow_to_windows(s, result, out, start);
    /* (With no sample kept the arrays were never made: the columns are
     * still written, empty, not left as the whole profile's.) */
    static const uint16_t no_threads[1];
    static const int64_t no_times[1];
    /* The whole profile's raw arrays, if they were read, are not the part's. */
    static const char *const raw_keys[] = { "raw", "raw_lines", "raw_sample_timestamps", "raw_timestamp_deltas",
                                            "raw_sample_threads", "raw_sample_states" };
    for (size_t k = 0; k < sizeof(raw_keys) / sizeof(raw_keys[0]); k++) rb_hash_delete(out, strobe_sym(raw_keys[k]));
    VALUE part = strobe_stacks_new(st->nodes, st->nodes_len, frame_ids, s->kept, s->sample_nodes,
                                   has_times ? (s->times ? s->times : no_times) : NULL, s->thread_ids,
                                   s->threads ? s->threads : no_threads,
                                   has_states ? (s->states ? s->states : (const uint8_t *)"") : NULL, start);
    /* A part of a profile whose raw arrays are refused: its own too. */
    VALUE refusal = strobe_stacks_refusal(rb_hash_lookup2(result, strobe_sym("stacks"), Qnil));
    if (!NIL_P(refusal)) strobe_stacks_refuse_raw(part, refusal);
    strobe_stacks_attach(out, part);
    return out;
}

static VALUE
subset_free(VALUE arg)
{
    subset_t *s = (subset_t *)arg;
    if (s->table_ready) strobe_stack_table_free(&s->table);
    free(s->self);
    free(s->sample_nodes);
    free(s->times);
    free(s->threads);
    free(s->states);
    free(s->windows);
    free(s->first);
    return Qnil;
}

static int
by_thread_then_start(const void *a, const void *b)
{
    const window_t *x = a, *y = b;
    if (x->thread != y->thread) return x->thread < y->thread ? -1 : 1;
    return (x->from > y->from) - (x->from < y->from);
}

/* A bound of a window: an Integer (a time, below 2**62), or nil for none
 * (unbounded). Checked here, so that what raises is rb_raise (which the
 * sanitizers know leaves the frame), not a conversion deep in Ruby. */
static int64_t
bound(VALUE v, int64_t none, int *timed)
{
    if (NIL_P(v)) return none;
    if (!FIXNUM_P(v)) rb_raise(rb_eTypeError, "a window's bound is an Integer time or nil, got %+"PRIsVALUE, v);
    *timed = 1;
    return FIX2LONG(v);
}

/* s's windows from an Array of [thread_id, from, to]; sorted per thread,
 * with each one's reach. */
static void
read_windows(subset_t *s, VALUE windows)
{
    Check_Type(windows, T_ARRAY);
    windows = rb_ary_dup(windows); /* read to the length allocated for */
    long n = RARRAY_LEN(windows);
    s->thread_ids = rb_ary_new();
    s->position = rb_hash_new();
    s->windows = malloc((n ? (size_t)n : 1) * sizeof(window_t));
    if (!s->windows) rb_memerror();
    for (long i = 0; i < n; i++) {
        VALUE w = RARRAY_AREF(windows, i);
        if (!RB_TYPE_P(w, T_ARRAY) || RARRAY_LEN(w) != 3)
            rb_raise(rb_eArgError, "a window is [thread_id, from, to], got %+"PRIsVALUE, w);
        VALUE tid = RARRAY_AREF(w, 0), from = RARRAY_AREF(w, 1), to = RARRAY_AREF(w, 2);
        if (!FIXNUM_P(tid)) continue; /* no thread of a result */
        VALUE at = rb_hash_lookup2(s->position, tid, Qnil);
        if (NIL_P(at)) {
            if (RARRAY_LEN(s->thread_ids) > UINT16_MAX) rb_raise(rb_eArgError, "too many threads");
            at = LONG2FIX(RARRAY_LEN(s->thread_ids));
            rb_hash_aset(s->position, tid, at);
            rb_ary_push(s->thread_ids, tid);
        }
        window_t *win = &s->windows[s->windows_len];
        win->thread = (uint32_t)FIX2LONG(at);
        win->from = bound(from, INT64_MIN, &s->timed);
        win->to = bound(to, INT64_MAX, &s->timed);
        if (win->to >= win->from) s->windows_len++; /* (an empty one holds nothing) */
    }
    qsort(s->windows, s->windows_len, sizeof(window_t), by_thread_then_start);
    long threads = RARRAY_LEN(s->thread_ids);
    s->first = calloc((size_t)threads + 1, sizeof(size_t));
    if (!s->first) rb_memerror();
    for (size_t i = 0; i < s->windows_len; i++) {
        window_t *win = &s->windows[i];
        s->first[win->thread + 1]++;
        win->reach = i && s->windows[i - 1].thread == win->thread && s->windows[i - 1].reach > win->to
                         ? s->windows[i - 1].reach : win->to;
    }
    for (long t = 0; t < threads; t++) s->first[t + 1] += s->first[t];
    RB_GC_GUARD(windows);
}

static VALUE
windows_body(VALUE arg)
{
    subset_t *s = (subset_t *)arg;
    read_windows(s, s->thread_ids);
    return subset_body(arg);
}

static VALUE
run_subset(VALUE result, VALUE windows)
{
    Check_Type(result, T_HASH);
    subset_t s;
    memset(&s, 0, sizeof(s));
    s.result = result;
    s.thread_ids = windows; /* (read_windows replaces it) */
    VALUE out = rb_ensure(windows_body, (VALUE)&s, subset_free, (VALUE)&s);
    RB_GC_GUARD(windows);
    return out;
}

/* Strobe::Native.thread_subset(result, thread_id, from = nil, to = nil)
 * -> the result of that thread (from..to: its samples in that time). */
static VALUE
native_thread_subset(int argc, VALUE *argv, VALUE self)
{
    (void)self;
    VALUE result, tid, from, to;
    rb_scan_args(argc, argv, "22", &result, &tid, &from, &to);
    return run_subset(result, rb_ary_new_from_args(1, rb_ary_new_from_args(3, tid, from, to)));
}

/* Strobe::Native.windows_subset(result, [[thread_id, from, to], ...]) ->
 * the samples each window's thread took from..to (nil: unbounded). */
static VALUE
native_windows_subset(VALUE self, VALUE result, VALUE windows)
{
    (void)self;
    return run_subset(result, windows);
}

void
strobe_subset_define(VALUE mNative)
{
    rb_define_singleton_method(mNative, "thread_subset", native_thread_subset, -1);
    rb_define_singleton_method(mNative, "windows_subset", native_windows_subset, 2);
}
