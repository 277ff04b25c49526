/*
 * compact.c - the compact form of raw samples used in profile files.
 *
 * stackprof's raw arrays repeat every frame of a stack for every run of
 * samples; a file instead stores a node table (parent, frame position,
 * line) once, then per sample one node, one thread position, one time
 * delta and, where samples carry GVL states, one state number.
 * Strobe::Native.compact turns a result's raw arrays into that form (a
 * result of Strobe's own is written from its Strobe::Stacks instead:
 * stacks.c). Strobe::Native.expand reads it into a result's Strobe::Stacks
 * (whose raw arrays are built only if read), validating every index so a
 * corrupt file raises Strobe::ProfileError instead of crashing.
 *
 * GVL held; not signal-safe. Work is linear in the samples, in C.
 *
 * What expanding may cost (reading the raw arrays of a loaded profile,
 * which stackprof's layout, --json and Marshal dumps do). The node table
 * lets a few kilobytes describe stacks that expand to gigabytes: a 24 KB .json.gz holding a chain of
 * 10,000 nodes and 10,000 samples alternating between two leaves under it
 * made raw and raw_lines 100 million entries, 1.6 GB. So expand gives the
 * profile's compact form strobe_expand_limit, and what raw would hold
 * (per run of samples on one node, as strobe_results_raw writes it: the
 * node's depth + 2 entries) is added up when the raw arrays are first
 * asked for (stacks.c): past the limit they are refused (the profile
 * itself loads, and its reports read the compact form):
 *   max(FLOOR, min(PER_NUMBER x the numbers of the stacks section,
 *                  PER_BYTE x the bytes of the file as stored)).
 * An entry costs 16 bytes (a slot in raw and one in raw_lines).
 *   - FLOOR, 2**24 entries (256 MB of slots), holds any profile of ordinary
 *     size, e.g. 64,000 samples 256 frames deep, every one on another stack
 *     than the one before.
 *   - PER_NUMBER, 128: a number costs at least 8 bytes once parsed, so
 *     expanding takes at most 256 times that memory. A profile as Strobe
 *     writes it (a node, a delta and a thread a sample) passes while its
 *     samples average up to about 380 frames deep with every one on a new
 *     stack, deeper where runs repeat a stack. Strobe records up to 1,024
 *     (STROBE_MAX_DEPTH): only long profiles of stacks mostly deeper than
 *     that are refused.
 *   - PER_BYTE, 1,024: gzip makes numbers nearly free (a column of zeros,
 *     samples alternating between two nodes), so a small .json.gz could
 *     give millions; per byte of the file, expanding takes at most 16 KB.
 *     Strobe's own :wall and :cpu files 1,000 frames deep took 155 to 296
 *     entries a gzipped byte (about 60% of samples on a new stack), 406
 *     with every sample on a new one. Samples microseconds apart (:custom,
 *     :object) compress far better: 2,995 a byte, 1,000 deep, every sample
 *     on a new stack; such a file past the floor loads once gunzipped.
 */
#include "compact.h"
#include "stacks.h"
#include "results.h"
#include "sampling.h"
#include "stack_table.h"
#include "json_columns.h"
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* How far loading may expand a file's samples (see above): at most
 * STROBE_EXPAND_PER_NUMBER entries per number the file gives for them and
 * STROBE_EXPAND_PER_BYTE per byte of the file as stored, or
 * STROBE_EXPAND_FLOOR whatever the file; more is refused. */
#define STROBE_EXPAND_FLOOR ((uint64_t)1 << 24)
#define STROBE_EXPAND_PER_NUMBER 128
#define STROBE_EXPAND_PER_BYTE 1024

/* That limit for numbers numbers in a file of stored bytes (0: not known,
 * no limit per byte); overflow-checked. */
static uint64_t
strobe_expand_limit(uint64_t numbers, uint64_t stored)
{
    uint64_t limit, per_byte;
    if (__builtin_mul_overflow(numbers, (uint64_t)STROBE_EXPAND_PER_NUMBER, &limit)) limit = UINT64_MAX;
    if (stored && !__builtin_mul_overflow(stored, (uint64_t)STROBE_EXPAND_PER_BYTE, &per_byte) && per_byte < limit)
        limit = per_byte;
    return limit > STROBE_EXPAND_FLOOR ? limit : STROBE_EXPAND_FLOOR;
}

/* A size given from Ruby: nil (0) or a non-negative Integer, at most
 * UINT64_MAX (larger ones count as that). */
static uint64_t
size_arg(VALUE v, const char *what)
{
    if (NIL_P(v)) return 0;
    if (!RB_INTEGER_TYPE_P(v) || RTEST(rb_funcall(v, rb_intern("negative?"), 0)))
        rb_raise(rb_eArgError, "%s must be nil or a non-negative Integer", what);
    return rb_absint_size(v, NULL) <= sizeof(uint64_t) ? NUM2ULL(v) : UINT64_MAX;
}

static long
array_len(VALUE ary, const char *what)
{
    if (!RB_TYPE_P(ary, T_ARRAY)) CORRUPT("%s is not an array", what);
    return RARRAY_LEN(ary);
}

/* start_time: a Fixnum, for the same reason. */
static long
start_time_of(VALUE v)
{
    if (!FIXNUM_P(v)) CORRUPT("start_time is not an integer in range");
    return FIX2LONG(v);
}

typedef struct {
    strobe_stack_table_t table;
    VALUE raw, raw_lines, timestamps, sample_threads, sample_states, frame_pos, thread_pos, start_time;
} compact_args_t;

static VALUE
compact_body(VALUE arg)
{
    compact_args_t *a = (compact_args_t *)arg;
    VALUE raw = a->raw, raw_lines = a->raw_lines;
    long raw_len = array_len(raw, "raw");
    if (!NIL_P(raw_lines) && array_len(raw_lines, "raw_lines") != raw_len)
        CORRUPT("raw_lines does not match raw");
    if (!RB_TYPE_P(a->frame_pos, T_HASH)) CORRUPT("frame positions are not a Hash");

    VALUE nodes_out = rb_ary_new(), sample_nodes = rb_ary_new();
    VALUE deltas = rb_ary_new(), threads = rb_ary_new();
    /* Samples raw may claim: as many as the per-sample arrays hold. */
    long sample_limit = UINT32_MAX;
    if (!NIL_P(a->timestamps)) sample_limit = array_len(a->timestamps, "raw_sample_timestamps");
    else if (!NIL_P(a->sample_threads)) sample_limit = array_len(a->sample_threads, "raw_sample_threads");
    for (long i = 0; i < raw_len;) {
        long depth = strobe_fixnum_at(raw, i, "raw");
        /* Written so that no huge value can overflow the check. */
        if (depth < 0 || depth > raw_len - i - 2) CORRUPT("raw is truncated at index %ld", i);
        uint32_t node = 0;
        for (long k = 1; k <= depth; k++) {
            VALUE pos = rb_hash_lookup2(a->frame_pos, RARRAY_AREF(raw, i + k), Qundef);
            if (pos == Qundef)
                CORRUPT("raw refers to frame %+"PRIsVALUE" that is not in frames", RARRAY_AREF(raw, i + k));
            long line_at = NIL_P(raw_lines) ? 0 : strobe_fixnum_at(raw_lines, i + k, "raw_lines");
            if (line_at < INT32_MIN || line_at > INT32_MAX) CORRUPT("raw_lines[%ld] is out of range", i + k);
            int32_t line = (int32_t)line_at;
            uint32_t before = a->table.nodes_len;
            node = strobe_stack_table_node(&a->table, node, NUM2UINT(pos), line);
            if (a->table.nodes_len != before) {
                rb_ary_push(nodes_out, UINT2NUM(a->table.nodes[node].parent));
                rb_ary_push(nodes_out, pos);
                rb_ary_push(nodes_out, INT2NUM(line));
            }
        }
        long count = strobe_fixnum_at(raw, i + depth + 1, "raw");
        if (count < 0 || count > sample_limit - RARRAY_LEN(sample_nodes))
            CORRUPT("raw has %ld samples at index %ld, more than its per-sample arrays hold", count, i);
        for (long c = 0; c < count; c++) rb_ary_push(sample_nodes, UINT2NUM(node));
        i += depth + 2;
    }

    long n = RARRAY_LEN(sample_nodes);
    if (!NIL_P(a->timestamps)) {
        if (array_len(a->timestamps, "raw_sample_timestamps") != n)
            CORRUPT("raw_sample_timestamps has %ld entries for %ld samples", RARRAY_LEN(a->timestamps), n);
        long prev = start_time_of(a->start_time);
        for (long k = 0; k < n; k++) {
            long t = strobe_fixnum_at(a->timestamps, k, "raw_sample_timestamps"), delta;
            if (__builtin_sub_overflow(t, prev, &delta)) CORRUPT("raw_sample_timestamps[%ld] is out of range", k);
            rb_ary_push(deltas, LONG2NUM(delta));
            prev = t;
        }
    }
    if (!NIL_P(a->sample_threads)) {
        if (array_len(a->sample_threads, "raw_sample_threads") != n)
            CORRUPT("raw_sample_threads has %ld entries for %ld samples", RARRAY_LEN(a->sample_threads), n);
        if (!RB_TYPE_P(a->thread_pos, T_HASH)) CORRUPT("thread positions are not a Hash");
        for (long k = 0; k < n; k++) {
            VALUE pos = rb_hash_lookup2(a->thread_pos, RARRAY_AREF(a->sample_threads, k), Qundef);
            if (pos == Qundef) CORRUPT("raw_sample_threads[%ld] is not a known thread", k);
            rb_ary_push(threads, pos);
        }
    }
    VALUE states = rb_ary_new();
    if (!NIL_P(a->sample_states)) {
        if (array_len(a->sample_states, "raw_sample_states") != n)
            CORRUPT("raw_sample_states has %ld entries for %ld samples", RARRAY_LEN(a->sample_states), n);
        for (long k = 0; k < n; k++) {
            VALUE sym = RARRAY_AREF(a->sample_states, k);
            int state = NIL_P(sym) ? STROBE_STATE_UNKNOWN : strobe_state_of(sym);
            if (state < 0) CORRUPT("raw_sample_states[%ld] is not a thread state", k);
            rb_ary_push(states, INT2FIX(state));
        }
    }
    return rb_ary_new_from_args(5, nodes_out, sample_nodes, deltas, threads, states);
}

static VALUE
compact_free(VALUE arg)
{
    strobe_stack_table_free(&((compact_args_t *)arg)->table);
    return Qnil;
}

/* Strobe::Native.compact(raw, raw_lines, timestamps, sample_threads,
 *                        sample_states, frame_pos, thread_pos, start_time)
 * -> [nodes (flat parent, frame, line triples), sample_nodes, deltas,
 *     threads, states]
 * frame_pos / thread_pos map a frame id / thread id to its position in the
 * file's frames / threads list; raw_lines, timestamps, sample_threads and
 * sample_states may be nil (their column is then empty). */
static VALUE
native_compact(VALUE self, VALUE raw, VALUE raw_lines, VALUE timestamps, VALUE sample_threads,
               VALUE sample_states, VALUE frame_pos, VALUE thread_pos, VALUE start_time)
{
    compact_args_t a = { .raw = raw, .raw_lines = raw_lines, .timestamps = timestamps,
                         .sample_threads = sample_threads, .sample_states = sample_states,
                         .frame_pos = frame_pos, .thread_pos = thread_pos, .start_time = start_time };
    strobe_stack_table_init(&a.table);
    return rb_ensure(compact_body, (VALUE)&a, compact_free, (VALUE)&a);
}

typedef struct {
    strobe_node_t *nodes;
    uint32_t *sample_nodes;
    int64_t *times;
    uint16_t *threads;
    uint8_t *states;
} expand_buffers_t;

static VALUE
free_buffers(VALUE arg)
{
    expand_buffers_t *b = (expand_buffers_t *)arg;
    free(b->nodes); free(b->sample_nodes); free(b->times); free(b->threads); free(b->states);
    return Qnil;
}

typedef struct {
    expand_buffers_t *b;
    VALUE result, frame_ids, thread_ids;
    strobe_column_t nodes, samples, deltas, threads, states; /* from Arrays or from a file's text */
    long start_time;
    uint64_t stored;         /* the file's size as stored, 0 if not known */
} expand_args_t;

static VALUE
expand_body(VALUE arg)
{
    expand_args_t *a = (expand_args_t *)arg;
    expand_buffers_t *b = a->b;
    long nodes_flat = a->nodes.len;
    if (nodes_flat % 3) CORRUPT("nodes is not a list of (parent, frame, line) triples");
    long nodes_len = nodes_flat / 3 + 1; /* plus the root */
    long frames_len = array_len(a->frame_ids, "frames");
    if (nodes_len > (long)UINT32_MAX) CORRUPT("too many nodes");

    b->nodes = strobe_advise_huge(calloc((size_t)nodes_len, sizeof(strobe_node_t)),
                                  (size_t)nodes_len * sizeof(strobe_node_t));
    if (!b->nodes) rb_memerror();
    for (long k = 1; k < nodes_len; k++) {
        long parent = strobe_column_next(&a->nodes);
        long frame = strobe_column_next(&a->nodes);
        long line = strobe_column_next(&a->nodes);
        if (parent < 0 || parent >= k) CORRUPT("node %ld has parent %ld, not an earlier node", k, parent);
        if (frame < 0 || frame >= frames_len) CORRUPT("node %ld refers to frame %ld of %ld", k, frame, frames_len);
        if (line < INT32_MIN || line > INT32_MAX) CORRUPT("node %ld has line %ld", k, line);
        b->nodes[k] = (strobe_node_t){ (uint32_t)parent, (uint32_t)frame, (int32_t)line };
    }

    long n = a->samples.len;
    long deltas_len = a->deltas.len;
    if (deltas_len != n && deltas_len != 0) CORRUPT("sample_deltas has %ld entries for %ld samples", deltas_len, n);
    long threads_len = a->threads.len;
    if (threads_len != n && threads_len != 0) CORRUPT("sample_threads has %ld entries for %ld samples", threads_len, n);
    long thread_count = array_len(a->thread_ids, "threads");
    long states_len = a->states.len;
    if (states_len != n && states_len != 0) CORRUPT("sample_states has %ld entries for %ld samples", states_len, n);
    if (n > (long)UINT32_MAX) CORRUPT("too many samples");

    b->sample_nodes = malloc(sizeof(uint32_t) * (size_t)(n ? n : 1));
    b->times = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    b->threads = calloc((size_t)(n ? n : 1), sizeof(uint16_t));
    b->states = calloc((size_t)(n ? n : 1), 1);
    if (!b->sample_nodes || !b->times || !b->threads || !b->states) rb_memerror();
    strobe_advise_huge(b->sample_nodes, sizeof(uint32_t) * (size_t)n);
    strobe_advise_huge(b->times, sizeof(int64_t) * (size_t)n);
    strobe_advise_huge(b->threads, sizeof(uint16_t) * (size_t)n);
    strobe_advise_huge(b->states, (size_t)n);
    int64_t start = a->start_time, t = start;
    for (long k = 0; k < n; k++) {
        long node = strobe_column_next(&a->samples);
        if (node <= 0 || node >= nodes_len) CORRUPT("sample %ld refers to node %ld of %ld", k, node, nodes_len - 1);
        b->sample_nodes[k] = (uint32_t)node;
        if (deltas_len) {
            if (__builtin_add_overflow(t, (int64_t)strobe_column_next(&a->deltas), &t))
                CORRUPT("sample_deltas[%ld] is out of range", k);
            b->times[k] = t;
        }
        if (threads_len) {
            long th = strobe_column_next(&a->threads);
            if (th < 0 || th >= thread_count || th > UINT16_MAX) CORRUPT("sample %ld refers to thread %ld of %ld", k, th, thread_count);
            b->threads[k] = (uint16_t)th;
        }
        if (states_len) {
            long state = strobe_column_next(&a->states);
            if (state < 0 || state >= STROBE_STATES) CORRUPT("sample %ld has state %ld", k, state);
            b->states[k] = (uint8_t)state;
        }
    }
    /* Array lengths are below 2**60 (LONG_MAX / 8): no overflow. */
    uint64_t numbers = (uint64_t)nodes_flat + (uint64_t)n + (uint64_t)deltas_len + (uint64_t)threads_len +
                       (uint64_t)states_len;
    uint64_t limit = strobe_expand_limit(numbers, a->stored);
    /* The columns become the profile's as they are: no copy. */
    VALUE stacks = strobe_stacks_adopt(&b->nodes, (uint32_t)nodes_len, a->frame_ids, (size_t)n, &b->sample_nodes,
                                       deltas_len ? &b->times : NULL, a->thread_ids, threads_len ? &b->threads : NULL,
                                       states_len ? &b->states : NULL, start);
    /* Reports and exports read the compact form as it is; only the raw
     * arrays, if asked for, would expand past the limit (what they would
     * hold is added up then: stacks.c). */
    strobe_stacks_limit_raw(stacks, limit, rb_sprintf("this file's limit of %"PRIu64" (%d per number of its stacks section "
                                                      "and %d per byte of the file, at least %"PRIu64")",
                                                      limit, STROBE_EXPAND_PER_NUMBER, STROBE_EXPAND_PER_BYTE,
                                                      STROBE_EXPAND_FLOOR));
    strobe_stacks_attach(a->result, stacks);
    return a->result;
}

static VALUE
expand(expand_args_t *a, VALUE result, VALUE frame_ids, VALUE thread_ids, VALUE stored)
{
    Check_Type(result, T_HASH);
    expand_buffers_t b = { NULL, NULL, NULL, NULL, NULL };
    a->b = &b;
    a->result = result;
    a->frame_ids = frame_ids;
    a->thread_ids = thread_ids;
    a->stored = size_arg(stored, "the file's size");
    return rb_ensure(expand_body, (VALUE)a, free_buffers, (VALUE)&b);
}

/* Strobe::Native.expand(result, nodes, frame_ids, samples, deltas,
 *                       start_time, sample_threads, thread_ids, sample_states,
 *                       stored)
 * Gives result these samples as its Strobe::Stacks (result[:stacks]), the
 * raw arrays (raw, raw_lines, raw_sample_timestamps, raw_timestamp_deltas,
 * raw_sample_threads, raw_sample_states) to be built from it if read
 * (each per-sample column may be empty: its key is then left out).
 * stored: the file's size as stored (gzipped or not), or nil; it bounds
 * how far the raw arrays may expand (see the top of this file). */
static VALUE
native_expand(VALUE self, VALUE result, VALUE nodes, VALUE frame_ids, VALUE samples, VALUE deltas,
              VALUE start_time, VALUE threads, VALUE thread_ids, VALUE states, VALUE stored)
{
    expand_args_t a;
    a.start_time = start_time_of(start_time);
    strobe_column_of_array(&a.nodes, nodes, "nodes", 0);
    strobe_column_of_array(&a.samples, samples, "samples", 0);
    strobe_column_of_array(&a.deltas, deltas, "sample_deltas", 0);
    strobe_column_of_array(&a.threads, threads, "sample_threads", 0);
    strobe_column_of_array(&a.states, states, "sample_states", 0);
    return expand(&a, result, frame_ids, thread_ids, stored);
}

/* Strobe::Native.expand_text(result, text, from, to, frame_ids,
 *                            thread_ids, stored)
 * The same, the stacks section read from text[from, to), a Strobe file's
 * JSON text (Native.stacks_range found it): no Ruby object per number. */
static VALUE
native_expand_text(VALUE self, VALUE result, VALUE text, VALUE from, VALUE to, VALUE frame_ids, VALUE thread_ids,
                   VALUE stored)
{
    StringValue(text);
    strobe_json_stacks_t s;
    strobe_json_stacks_read(&s, text, NUM2LONG(from), NUM2LONG(to));
    expand_args_t a = { .nodes = s.nodes, .samples = s.samples, .deltas = s.deltas, .threads = s.threads,
                        .states = s.states, .start_time = s.start_time };
    VALUE out = expand(&a, result, frame_ids, thread_ids, stored);
    RB_GC_GUARD(text);
    return out;
}

/* Strobe::Native.expand_limit(numbers, stored) -> the most entries a file
 * of stored bytes (nil: not known) giving numbers numbers may expand to;
 * what expand allows, for loaders that expand other data (stackprof's raw
 * counts). */
static VALUE
native_expand_limit(VALUE self, VALUE numbers, VALUE stored)
{
    return ULL2NUM(strobe_expand_limit(size_arg(numbers, "numbers"), size_arg(stored, "the file's size")));
}

void
strobe_compact_define(VALUE mNative)
{
    rb_define_singleton_method(mNative, "compact", native_compact, 8);
    rb_define_singleton_method(mNative, "expand", native_expand, 10);
    rb_define_singleton_method(mNative, "expand_text", native_expand_text, 7);
    rb_define_singleton_method(mNative, "expand_limit", native_expand_limit, 2);
    /* The limit on expanding a file's samples, for the docs and tests. */
    rb_define_const(mNative, "EXPAND_FLOOR", ULL2NUM(STROBE_EXPAND_FLOOR));
    rb_define_const(mNative, "EXPAND_PER_NUMBER", INT2FIX(STROBE_EXPAND_PER_NUMBER));
    rb_define_const(mNative, "EXPAND_PER_BYTE", INT2FIX(STROBE_EXPAND_PER_BYTE));
}
