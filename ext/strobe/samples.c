/*
 * samples.c - a result's raw samples read into C for the exporters
 * (pprof.c, firefox.c, speedscope.c).
 *
 * stackprof's raw arrays list each run of identical stacks as
 * [depth, frame ids root first..., count] (raw_lines alongside); the
 * per-sample arrays hold a time, a thread id and a GVL state per sample.
 * strobe_samples_read interns every stack into a stack table (nodes of
 * parent, frame id, line, through its child cache) and keeps per sample the
 * leaf node, its time, its thread's position in the result's threads and
 * its state. Frames the report's filter drops are left out of the stacks
 * (their samples go to the nearest kept caller). Every id, count and length is checked: a malformed result
 * raises Strobe::ProfileError, never reads out of bounds.
 *
 * GVL held; not signal-safe. Linear in the raw arrays.
 */
#include "samples.h"
#include "stacks.h"
#include "results.h"
#include "sampling.h"
#include <stdlib.h>
#include <inttypes.h>
#include <string.h>

/* hash[name], through the result's default proc: the raw arrays of a
 * result holding only its Strobe::Stacks are built as they are read. */
static VALUE
key(VALUE hash, const char *name)
{
    return rb_hash_aref(hash, strobe_sym(name));
}

static VALUE
optional_array(VALUE hash, const char *name)
{
    VALUE v = key(hash, name);
    if (NIL_P(v)) return Qnil;
    if (!RB_TYPE_P(v, T_ARRAY)) CORRUPT("%s is not an Array", name);
    return v;
}

static void *
alloc_n(size_t n, size_t size)
{
    void *p = malloc((n ? n : 1) * size);
    if (!p) rb_memerror();
    return strobe_advise_huge(p, n * size);
}

void
strobe_samples_free(strobe_samples_t *s)
{
    if (s->table_ready) strobe_stack_table_free(&s->table);
    free(s->frame_pos);
    if (!(s->borrowed & STROBE_SAMPLES_BORROWED_NODE)) free(s->node);
    if (!(s->borrowed & STROBE_SAMPLES_BORROWED_TIME)) free(s->time);
    if (!(s->borrowed & STROBE_SAMPLES_BORROWED_THREAD)) free(s->thread);
    if (!(s->borrowed & STROBE_SAMPLES_BORROWED_STATE)) free(s->state);
    xfree(s->prev_ids);
    xfree(s->prev_lines);
    xfree(s->path);
    free(s);
}

/* The samples raw describes, checked against the per-sample arrays' length
 * (limit, or any number when there are none). */
static size_t
count_raw_samples(VALUE raw, long limit)
{
    long len = RARRAY_LEN(raw), total = 0;
    for (long i = 0; i < len;) {
        long depth = strobe_fixnum_at(raw, i, "raw");
        /* Written so that no huge value can overflow the checks. */
        if (depth < 0 || depth > len - i - 2) CORRUPT("raw is truncated at index %ld", i);
        long count = strobe_fixnum_at(raw, i + depth + 1, "raw");
        if (count < 0 || count > limit - total)
            CORRUPT("raw has %ld samples at index %ld, more than the profile's samples and per-sample arrays hold",
                    count, i);
        total += count;
        i += depth + 2;
    }
    return (size_t)total;
}

static int
push_key(VALUE k, VALUE v, VALUE ary)
{
    rb_ary_push(ary, k);
    return ST_CONTINUE;
}

static void
read_threads(strobe_samples_t *s, VALUE result, VALUE sample_threads)
{
    VALUE threads = key(result, "threads");
    if (!NIL_P(threads) && !RB_TYPE_P(threads, T_HASH)) CORRUPT("threads is not a Hash");
    s->thread_ids = rb_ary_new();
    if (!NIL_P(threads)) rb_hash_foreach(threads, push_key, s->thread_ids);
    if (NIL_P(sample_threads)) {
        if (RARRAY_LEN(s->thread_ids) == 0) rb_ary_push(s->thread_ids, Qnil); /* one unnamed thread */
        return;
    }
    if ((size_t)RARRAY_LEN(sample_threads) != s->n)
        CORRUPT("raw_sample_threads has %ld entries for %zu samples", RARRAY_LEN(sample_threads), s->n);
    VALUE pos = rb_hash_new(); /* thread id -> position */
    for (long k = 0; k < RARRAY_LEN(s->thread_ids); k++) {
        VALUE id = RARRAY_AREF(s->thread_ids, k);
        if (!FIXNUM_P(id)) CORRUPT("thread id %+"PRIsVALUE" is not an integer", id);
        rb_hash_aset(pos, id, LONG2FIX(k));
    }
    if (RARRAY_LEN(s->thread_ids) > UINT16_MAX) CORRUPT("more than %d threads", UINT16_MAX);
    s->thread = alloc_n(s->n, sizeof(uint16_t));
    VALUE last = Qundef, at = Qundef;
    for (size_t k = 0; k < s->n; k++) {
        VALUE id = RARRAY_AREF(sample_threads, (long)k);
        if (id != last) {
            at = FIXNUM_P(id) ? rb_hash_lookup2(pos, id, Qundef) : Qundef;
            if (at == Qundef) CORRUPT("raw_sample_threads[%zu] is %+"PRIsVALUE", not a thread of the profile", k, id);
            last = id;
        }
        s->thread[k] = (uint16_t)FIX2LONG(at);
    }
    RB_GC_GUARD(pos);
    if (RARRAY_LEN(s->thread_ids) == 0) rb_ary_push(s->thread_ids, Qnil);
}

/* Times from raw_sample_timestamps; a result that has only
 * raw_timestamp_deltas (older stackprof) gets them added up from 0. */
static void
read_times(strobe_samples_t *s, VALUE stamps, VALUE deltas)
{
    if (!NIL_P(stamps) && (size_t)RARRAY_LEN(stamps) != s->n)
        CORRUPT("raw_sample_timestamps has %ld entries for %zu samples", RARRAY_LEN(stamps), s->n);
    if (!NIL_P(deltas) && (size_t)RARRAY_LEN(deltas) != s->n) {
        if (NIL_P(stamps)) CORRUPT("raw_timestamp_deltas has %ld entries for %zu samples", RARRAY_LEN(deltas), s->n);
        deltas = Qnil; /* only a hint at the start */
    }
    if (NIL_P(stamps) && NIL_P(deltas)) return;
    s->time = alloc_n(s->n, sizeof(int64_t));
    if (NIL_P(stamps)) {
        int64_t t = 0;
        for (size_t k = 0; k < s->n; k++) {
            long d = strobe_fixnum_at(deltas, (long)k, "raw_timestamp_deltas");
            if (d < 0 || d > STROBE_MAX_TIME_US - t) CORRUPT("raw_timestamp_deltas[%zu] is out of range", k);
            t += d;
            s->time[k] = t;
        }
        return;
    }
    /* In the order samples were recorded: per thread, and across threads,
     * nearly but not strictly by time. Microseconds of a monotonic clock
     * or since the epoch: far below 2**53, so no difference overflows. */
    for (size_t k = 0; k < s->n; k++) {
        long t = strobe_fixnum_at(stamps, (long)k, "raw_sample_timestamps");
        if (t < 0 || t > STROBE_MAX_TIME_US) CORRUPT("raw_sample_timestamps[%zu] is out of range", k);
        s->time[k] = t;
    }
    s->start_us = s->n ? s->time[0] : 0;
    if (s->n && !NIL_P(deltas)) {
        long first = strobe_fixnum_at(deltas, 0, "raw_timestamp_deltas");
        if (first >= 0 && first <= s->time[0]) s->start_us = s->time[0] - first;
    }
}

static void
read_states(strobe_samples_t *s, VALUE states)
{
    if (NIL_P(states)) return;
    if ((size_t)RARRAY_LEN(states) != s->n)
        CORRUPT("raw_sample_states has %ld entries for %zu samples", RARRAY_LEN(states), s->n);
    s->state = alloc_n(s->n, 1);
    for (size_t k = 0; k < s->n; k++) {
        VALUE sym = RARRAY_AREF(states, (long)k);
        int state = NIL_P(sym) ? STROBE_STATE_UNKNOWN : strobe_state_of(sym);
        if (state < 0) CORRUPT("raw_sample_states[%zu] is not a thread state", k);
        s->state[k] = (uint8_t)state;
    }
}

/* result[name]: an Integer in [0, max], 0 when absent. */
static int64_t
bounded_key(VALUE result, const char *name, int64_t max)
{
    VALUE v = key(result, name);
    if (NIL_P(v)) return 0;
    if (!FIXNUM_P(v) || FIX2LONG(v) < 0 || FIX2LONG(v) > max) CORRUPT("%s is not an integer from 0 to %"PRId64, name, max);
    return FIX2LONG(v);
}

/* The raw array of r's result (an empty one for a profile without samples)
 * and the number of samples it describes, at most the profile's samples
 * and the per-sample arrays' length: a hostile count cannot make a report
 * expand billions of samples. */
static VALUE
checked_raw(report_t *r, const char *what, size_t *n)
{
    VALUE result = r->result;
    VALUE raw = optional_array(result, "raw");
    if (NIL_P(raw)) {
        /* Like stackprof, Strobe leaves raw out when there were no samples. */
        if (strobe_count_of(key(result, "samples"), "samples") != 0)
            CORRUPT("%s needs raw samples: profile with raw: true (strobe run --raw)", what);
        raw = rb_ary_new();
    }
    VALUE raw_lines = optional_array(result, "raw_lines");
    VALUE stamps = optional_array(result, "raw_sample_timestamps");
    VALUE sample_threads = optional_array(result, "raw_sample_threads");
    if (!NIL_P(raw_lines) && RARRAY_LEN(raw_lines) != RARRAY_LEN(raw)) CORRUPT("raw_lines does not match raw");
    uint64_t samples = strobe_count_of(key(result, "samples"), "samples");
    long limit = !NIL_P(stamps) ? RARRAY_LEN(stamps) : !NIL_P(sample_threads) ? RARRAY_LEN(sample_threads) : LONG_MAX;
    if ((uint64_t)limit > samples) limit = samples > LONG_MAX ? LONG_MAX : (long)samples;
    *n = count_raw_samples(raw, limit);
    if (*n > UINT32_MAX) CORRUPT("too many samples");
    return raw;
}

static strobe_samples_t *
samples_new(report_t *r)
{
    strobe_samples_t *s = calloc(1, sizeof(*s));
    if (!s) rb_memerror();
    s->thread_ids = Qnil;
    s->stacks = Qnil;
    r->samples_read = s; /* freed with the report from here on */
    return s;
}

/* Interval, started_at, duration, times, threads and states: what a
 * sample has beside its stack. */
static void
read_columns(report_t *r, strobe_samples_t *s)
{
    VALUE result = r->result;
    /* Strobe's intervals are up to 2**31 - 1 (allocations); times fit 2**53. */
    s->interval = bounded_key(result, "interval", INT32_MAX);
    s->started_at_us = bounded_key(result, "started_at", STROBE_MAX_TIME_US);
    s->duration_us = bounded_key(result, "duration", STROBE_MAX_TIME_US);
    read_times(s, optional_array(result, "raw_sample_timestamps"), optional_array(result, "raw_timestamp_deltas"));
    read_threads(s, result, optional_array(result, "raw_sample_threads"));
    read_states(s, optional_array(result, "raw_sample_states"));
}

/* The result's compact form (result[:stacks]), or NULL: a result loaded
 * or taken by Strobe has one, and its samples are read from it without
 * the raw arrays ever being built. */
const strobe_stacks_t *
strobe_samples_stacks(VALUE result)
{
    return strobe_stacks_get(rb_hash_lookup2(result, strobe_sym("stacks"), Qnil));
}

/* The columns of a compact form: times and states as they are, threads as
 * positions in the result's threads (s->thread_ids, as read_threads has
 * them). */
static void
columns_from_stacks(report_t *r, strobe_samples_t *s, const strobe_stacks_t *st)
{
    VALUE result = r->result;
    s->interval = bounded_key(result, "interval", INT32_MAX);
    s->started_at_us = bounded_key(result, "started_at", STROBE_MAX_TIME_US);
    s->duration_us = bounded_key(result, "duration", STROBE_MAX_TIME_US);
    /* Times and states as they are: borrowed, not copied. */
    s->stacks = rb_hash_lookup2(result, strobe_sym("stacks"), Qnil);
    if (st->time) {
        s->time = st->time;
        s->borrowed |= STROBE_SAMPLES_BORROWED_TIME;
        s->start_us = st->start_us;
    }
    if (st->state) {
        s->state = st->state;
        s->borrowed |= STROBE_SAMPLES_BORROWED_STATE;
    }
    VALUE threads = key(result, "threads");
    if (!NIL_P(threads) && !RB_TYPE_P(threads, T_HASH)) CORRUPT("threads is not a Hash");
    s->thread_ids = rb_ary_new();
    if (!NIL_P(threads)) rb_hash_foreach(threads, push_key, s->thread_ids);
    if (st->thread) {
        /* Each of the compact form's threads: its position among the
         * result's, -1 for one it does not list (an error only if a sample
         * names it). (A Ruby String holds them, so nothing leaks should
         * the error be raised.) */
        long count = RARRAY_LEN(st->thread_ids);
        VALUE pos = rb_hash_new();
        for (long k = 0; k < RARRAY_LEN(s->thread_ids); k++) {
            VALUE id = RARRAY_AREF(s->thread_ids, k);
            if (!FIXNUM_P(id)) CORRUPT("thread id %+"PRIsVALUE" is not an integer", id);
            rb_hash_aset(pos, id, LONG2FIX(k));
        }
        VALUE buffer;
        long *position = ALLOCV_N(long, buffer, (size_t)(count ? count : 1));
        for (long t = 0; t < count; t++) {
            VALUE at = rb_hash_lookup2(pos, RARRAY_AREF(st->thread_ids, t), Qundef);
            position[t] = FIXNUM_P(at) ? FIX2LONG(at) : -1;
        }
        /* The same threads in the same order (as loaded): borrowed. */
        long same = 0;
        while (same < count && position[same] == same) same++;
        if (same == count) {
            s->thread = st->thread;
            s->borrowed |= STROBE_SAMPLES_BORROWED_THREAD;
        } else {
            if (RARRAY_LEN(s->thread_ids) > UINT16_MAX) CORRUPT("more than %d threads", UINT16_MAX);
            s->thread = alloc_n(s->n, sizeof(uint16_t));
            for (size_t k = 0; k < s->n; k++) {
                long p = position[st->thread[k]];
                if (p < 0)
                    CORRUPT("sample %zu is of thread %+"PRIsVALUE", not a thread of the profile", k,
                            RARRAY_AREF(st->thread_ids, st->thread[k]));
                s->thread[k] = (uint16_t)p;
            }
        }
        ALLOCV_END(buffer);
        RB_GC_GUARD(pos);
    }
    if (RARRAY_LEN(s->thread_ids) == 0) rb_ary_push(s->thread_ids, Qnil);
}

/* The samples of a compact form, their stacks interned into s's table
 * (frames a filter drops left out). */
typedef struct {
    report_t *r;
    strobe_samples_t *s;
    const strobe_stacks_t *st;
} into_table_t;

static uint32_t
table_node(void *arg, uint32_t parent, uint32_t node)
{
    into_table_t *c = arg;
    const strobe_node_t *n = &c->st->nodes[node];
    VALUE id = RARRAY_AREF(c->st->frame_ids, n->frame);
    if (!NIL_P(c->r->keep) && strobe_report_frame_pos(c->r, id, 0) < 0) return parent; /* dropped */
    return strobe_stack_table_child(&c->s->table, parent, id, n->line);
}

static void
stacks_into_table(report_t *r, strobe_samples_t *s, const strobe_stacks_t *st)
{
    VALUE buffer;
    uint32_t *map = strobe_stacks_map_new(st, &buffer, 0);
    into_table_t c = { r, s, st };
    for (size_t k = 0; k < s->n; k++)
        s->node[k] = strobe_stacks_resolve(st, st->node[k], map, map + st->nodes_len, table_node, &c);
    ALLOCV_END(buffer);
}

strobe_samples_t *
strobe_samples_columns(report_t *r, const char *what, uint32_t **node)
{
    const strobe_stacks_t *st = strobe_samples_stacks(r->result);
    if (st) {
        strobe_samples_t *s = samples_new(r);
        s->n = st->n;
        s->node = alloc_n(s->n, sizeof(uint32_t));
        *node = s->node;
        columns_from_stacks(r, s, st);
        return s;
    }
    size_t n;
    checked_raw(r, what, &n);
    strobe_samples_t *s = samples_new(r);
    s->n = n;
    s->node = alloc_n(n, sizeof(uint32_t));
    *node = s->node;
    read_columns(r, s);
    return s;
}

/* The stacks are the table's. */
static void
table_nodes(strobe_samples_t *s)
{
    s->nodes = s->table.nodes;
    s->nodes_len = s->table.nodes_len;
    s->frames_len = s->table.frames_len;
}

/* Unfiltered, the compact form's stacks are read as they are: its nodes
 * and per-sample nodes borrowed, its frames its frame_ids (no table made,
 * nothing copied). Not when one of its frames is not the result's (a
 * result edited by hand): 0 then, and the table is made, which says so if
 * a sample reaches it. */
static int
borrow_stacks(report_t *r, const strobe_stacks_t *st)
{
    long frames = RARRAY_LEN(st->frame_ids);
    long *pos = alloc_n((size_t)frames, sizeof(long));
    for (long f = 0; f < frames; f++) {
        pos[f] = strobe_report_frame_pos(r, RARRAY_AREF(st->frame_ids, f), 1);
        if (pos[f] < 0) {
            free(pos);
            return 0;
        }
    }
    strobe_samples_t *s = samples_new(r);
    s->frame_pos = pos;
    s->n = st->n;
    s->nodes = st->nodes;
    s->nodes_len = st->nodes_len;
    s->frames_len = (uint32_t)frames;
    s->node = st->node;
    s->borrowed |= STROBE_SAMPLES_BORROWED_NODE;
    columns_from_stacks(r, s, st); /* (marks the Stacks that holds all this) */
    return 1;
}

strobe_samples_t *
strobe_samples_read(report_t *r, const char *what)
{
    VALUE result = r->result;
    const strobe_stacks_t *st = strobe_samples_stacks(result);
    if (st && NIL_P(r->keep) && borrow_stacks(r, st)) return r->samples_read;
    if (st) {
        strobe_samples_t *s = samples_new(r);
        s->n = st->n;
        s->table_ready = 1;
        strobe_stack_table_init(&s->table);
        s->node = alloc_n(s->n, sizeof(uint32_t));
        stacks_into_table(r, s, st);
        table_nodes(s);
        s->frame_pos = alloc_n(s->table.frames_len, sizeof(long));
        for (uint32_t f = 0; f < s->table.frames_len; f++)
            s->frame_pos[f] = strobe_report_frame_pos(r, s->table.frames[f].value, 0);
        columns_from_stacks(r, s, st);
        return s;
    }
    size_t n;
    VALUE raw = checked_raw(r, what, &n);
    VALUE raw_lines = optional_array(result, "raw_lines");
    strobe_samples_t *s = samples_new(r);
    s->n = n;

    s->table_ready = 1; /* freeing a table partly made is safe */
    strobe_stack_table_init(&s->table);
    s->node = alloc_n(s->n, sizeof(uint32_t));
    long len = RARRAY_LEN(raw);
    size_t at = 0;
    int filtered = !NIL_P(r->keep);
    /* The previous entry's frames and lines and the node after each level
     * (path[0]: the root): an entry reuses the part it shares with the one
     * before, as runs of stacks mostly change near the leaf. Unfiltered
     * only (a filter's dropped frames are not in the path). */
    long prev_depth = 0, capa = 16;
    s->prev_ids = ALLOC_N(VALUE, capa);
    s->prev_lines = ALLOC_N(int32_t, capa);
    s->path = ALLOC_N(uint32_t, capa + 1);
    s->path[0] = 0; /* the root: where an empty or wholly new stack starts */
    for (long i = 0; i < len;) {
        long depth = FIX2LONG(RARRAY_AREF(raw, i)); /* checked by count_raw_samples */
        if (depth > capa) {
            capa = depth * 2;
            REALLOC_N(s->prev_ids, VALUE, capa);
            REALLOC_N(s->prev_lines, int32_t, capa);
            REALLOC_N(s->path, uint32_t, capa + 1);
        }
        long level = 0;
        if (!filtered) {
            const VALUE *ids = RARRAY_CONST_PTR(raw) + i + 1;
            const VALUE *line_vals = NIL_P(raw_lines) ? NULL : RARRAY_CONST_PTR(raw_lines) + i + 1;
            long same = depth < prev_depth ? depth : prev_depth;
            while (level < same && ids[level] == s->prev_ids[level] &&
                   (!line_vals || line_vals[level] == INT2FIX(s->prev_lines[level])))
                level++;
        }
        uint32_t node = filtered ? 0 : s->path[level];
        for (long k = i + 1 + level; k <= i + depth; k++) {
            VALUE id = RARRAY_AREF(raw, k);
            if (!FIXNUM_P(id)) CORRUPT("raw[%ld] is not a frame id", k);
            long line = NIL_P(raw_lines) ? 0 : strobe_fixnum_at(raw_lines, k, "raw_lines");
            if (line < INT32_MIN || line > INT32_MAX) CORRUPT("raw_lines[%ld] is out of range", k);
            /* A frame the filter drops is left out: its samples go to
             * its nearest kept caller. */
            if (filtered && strobe_report_frame_pos(r, id, 0) < 0) continue;
            node = strobe_stack_table_child(&s->table, node, id, (int32_t)line);
            if (!filtered) {
                long d = k - i - 1;
                s->prev_ids[d] = id;
                s->prev_lines[d] = (int32_t)line;
                s->path[d + 1] = node;
            }
        }
        prev_depth = depth;
        long count = FIX2LONG(RARRAY_AREF(raw, i + depth + 1));
        for (long c = 0; c < count; c++) s->node[at++] = node;
        i += depth + 2;
    }
    table_nodes(s);
    /* Each frame id seen, checked once against the result's frames. */
    s->frame_pos = alloc_n(s->table.frames_len, sizeof(long));
    for (uint32_t f = 0; f < s->table.frames_len; f++)
        s->frame_pos[f] = strobe_report_frame_pos(r, s->table.frames[f].value, 0);

    read_columns(r, s);
    return s;
}

VALUE
strobe_samples_thread_name(const strobe_samples_t *s, VALUE result, long t, int *is_main)
{
    VALUE id = RARRAY_AREF(s->thread_ids, t);
    VALUE threads = rb_hash_lookup2(result, strobe_sym("threads"), Qnil);
    VALUE info = RB_TYPE_P(threads, T_HASH) ? rb_hash_lookup2(threads, id, Qnil) : Qnil;
    VALUE name = RB_TYPE_P(info, T_HASH) ? rb_hash_lookup2(info, strobe_sym("name"), Qnil) : Qnil;
    int main = NIL_P(id) || (RB_TYPE_P(info, T_HASH) && rb_hash_lookup2(info, strobe_sym("main"), Qnil) == Qtrue);
    if (is_main) *is_main = main;
    if (RB_TYPE_P(name, T_STRING) && RSTRING_LEN(name)) return name;
    return main ? rb_str_new_cstr("main") : rb_sprintf("thread %+"PRIsVALUE, id);
}

/* idx[0, n) sorted by time[idx], stably: bottom-up merge sort through tmp,
 * each run merged only when it is out of order with the next. */
static void
sort_by_time(const int64_t *time, uint32_t *idx, uint32_t *tmp, size_t n)
{
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo + width < n; lo += 2 * width) {
            size_t mid = lo + width, hi = mid + width < n ? mid + width : n;
            if (time[idx[mid - 1]] <= time[idx[mid]]) continue; /* already in order */
            size_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi) tmp[k++] = time[idx[b]] < time[idx[a]] ? idx[b++] : idx[a++];
            while (a < mid) tmp[k++] = idx[a++];
            while (b < hi) tmp[k++] = idx[b++];
            memcpy(idx + lo, tmp + lo, (hi - lo) * sizeof(uint32_t));
        }
    }
}

uint32_t *
strobe_samples_by_thread(report_t *r, const strobe_samples_t *s, size_t **starts)
{
    long threads = RARRAY_LEN(s->thread_ids);
    if (s->n > UINT32_MAX) CORRUPT("too many samples");
    uint32_t *order = r->scratch[3] = ALLOC_N(uint32_t, s->n ? s->n : 1);
    size_t *start = r->scratch[4] = ZALLOC_N(size_t, (size_t)threads + 1);
    size_t *fill = r->scratch[5] = ALLOC_N(size_t, (size_t)threads);
    /* A counting sort by thread, keeping each thread's samples in order. */
    for (size_t k = 0; k < s->n; k++) start[(s->thread ? s->thread[k] : 0) + 1]++;
    for (long t = 0; t < threads; t++) start[t + 1] += start[t];
    for (long t = 0; t < threads; t++) fill[t] = start[t];
    for (size_t k = 0; k < s->n; k++) order[fill[s->thread ? s->thread[k] : 0]++] = (uint32_t)k;
    /* Then by time within each thread: a stable merge sort (samples are
     * recorded nearly in order, but merged profiles can come in any). */
    if (s->time) {
        uint32_t *tmp = r->scratch[7] = ALLOC_N(uint32_t, s->n ? s->n : 1);
        for (long t = 0; t < threads; t++) sort_by_time(s->time, order + start[t], tmp, start[t + 1] - start[t]);
    }
    *starts = start;
    return order;
}
