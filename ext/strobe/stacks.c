/*
 * stacks.c - a result's samples in compact form: Strobe::Stacks.
 *
 * Results (results.c), profile files as loaded (compact.c) and parts of
 * profiles (subset.c) keep their samples as a Strobe::Stacks under
 * result[:stacks]: the stack nodes (parent, frame, line) once, then per
 * sample its leaf node, time, thread and GVL state, as columns, 15 bytes a
 * sample. It is immutable once built. stackprof's raw arrays (raw,
 * raw_lines, raw_sample_timestamps, ...), which repeat every frame of every
 * stack, are built from it only when a program reads one of them:
 * strobe_stacks_attach gives the result the default proc
 * Strobe::Stacks::RAW (lib/strobe/stacks.rb), which calls #raw_arrays on
 * the first read and stores them. A file is written from the columns
 * (#to_file), without the raw arrays ever being made.
 *
 * GVL held; not signal-safe.
 */
#include "stacks.h"
#include "results.h"
#include "sampling.h"
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static VALUE cStacks;

static void
stacks_mark(void *ptr)
{
    strobe_stacks_t *s = ptr;
    rb_gc_mark(s->frame_ids);
    rb_gc_mark(s->thread_ids);
    rb_gc_mark(s->raw_refusal);
    rb_gc_mark(s->raw_limit_why);
}

static void
stacks_free(void *ptr)
{
    strobe_stacks_t *s = ptr;
    free(s->nodes);
    free(s->node);
    free(s->time);
    free(s->thread);
    free(s->state);
    xfree(s);
}

/* The columns' bytes: the compact size a report's memory is held against. */
static size_t
stacks_bytes(const strobe_stacks_t *s)
{
    size_t per_sample = sizeof(uint32_t) + (s->time ? sizeof(int64_t) : 0) + (s->thread ? sizeof(uint16_t) : 0) +
                        (s->state ? 1 : 0);
    return sizeof(strobe_node_t) * s->nodes_len + per_sample * s->n;
}

static size_t
stacks_memsize(const void *ptr)
{
    return sizeof(strobe_stacks_t) + stacks_bytes(ptr);
}

static const rb_data_type_t stacks_type = {
    .wrap_struct_name = "Strobe::Stacks",
    .function = { .dmark = stacks_mark, .dfree = stacks_free, .dsize = stacks_memsize },
    .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

const strobe_stacks_t *
strobe_stacks_get(VALUE obj)
{
    return rb_typeddata_is_kind_of(obj, &stacks_type) ? RTYPEDDATA_DATA(obj) : NULL;
}

static const strobe_stacks_t *
stacks_of(VALUE obj)
{
    return rb_check_typeddata(obj, &stacks_type);
}

/* A malloc'd copy of n elements of size bytes at src (NULL for NULL). */
static void *
copy_of(const void *src, size_t n, size_t size)
{
    if (!src) return NULL;
    void *p = strobe_advise_huge(malloc(n ? n * size : 1), n * size);
    if (!p) rb_memerror();
    if (n) memcpy(p, src, n * size);
    return p;
}

/* Every index in bounds, so nothing reading the columns can go astray. */
static void
check(const strobe_node_t *nodes, uint32_t nodes_len, long frames, size_t n, const uint32_t *sample_nodes,
      long threads_len, const uint16_t *threads, const uint8_t *states)
{
    if (!nodes_len) rb_raise(strobe_eProfileError, "stacks without a root node");
    for (uint32_t i = 1; i < nodes_len; i++)
        if (nodes[i].parent >= i || (long)nodes[i].frame >= frames)
            rb_raise(strobe_eProfileError, "stack node %u is malformed", i);
    for (size_t k = 0; k < n; k++) {
        if (sample_nodes[k] >= nodes_len) rb_raise(strobe_eProfileError, "sample %zu is on no stack node", k);
        if (threads && threads[k] >= threads_len) rb_raise(strobe_eProfileError, "sample %zu is on no thread", k);
        if (states && states[k] >= STROBE_STATES) rb_raise(strobe_eProfileError, "sample %zu has no state", k);
    }
}

/* A new, empty Strobe::Stacks (the GC frees whatever columns it is then
 * given, should a later step raise). */
static VALUE
stacks_make(VALUE frame_ids, VALUE thread_ids, uint32_t nodes_len, size_t n, int64_t start_us, strobe_stacks_t **out)
{
    strobe_stacks_t *s;
    VALUE obj = TypedData_Make_Struct(cStacks, strobe_stacks_t, &stacks_type, s);
    s->raw_refusal = s->raw_limit_why = Qnil;
    s->frame_ids = s->thread_ids = Qnil;
    s->frame_ids = rb_ary_dup(frame_ids);
    s->thread_ids = rb_ary_dup(thread_ids);
    s->start_us = start_us;
    s->nodes_len = nodes_len;
    s->n = n;
    *out = s;
    return obj;
}

VALUE
strobe_stacks_new(const strobe_node_t *nodes, uint32_t nodes_len, VALUE frame_ids, size_t n,
                  const uint32_t *sample_nodes, const int64_t *times, VALUE thread_ids,
                  const uint16_t *threads, const uint8_t *states, int64_t start_us)
{
    static const strobe_node_t root = { 0, 0, 0 };
    if (!nodes_len) { nodes = &root; nodes_len = 1; }
    check(nodes, nodes_len, RARRAY_LEN(frame_ids), n, sample_nodes, RARRAY_LEN(thread_ids), threads, states);
    strobe_stacks_t *s;
    VALUE obj = stacks_make(frame_ids, thread_ids, nodes_len, n, start_us, &s);
    s->nodes = copy_of(nodes, nodes_len, sizeof(strobe_node_t));
    s->node = copy_of(sample_nodes ? sample_nodes : (const uint32_t *)"", n, sizeof(uint32_t));
    s->time = copy_of(times, n, sizeof(int64_t));
    s->thread = copy_of(threads, n, sizeof(uint16_t));
    s->state = copy_of(states, n, 1);
    RB_OBJ_FREEZE(obj);
    return obj;
}

VALUE
strobe_stacks_adopt(strobe_node_t **nodes, uint32_t nodes_len, VALUE frame_ids, size_t n, uint32_t **sample_nodes,
                    int64_t **times, VALUE thread_ids, uint16_t **threads, uint8_t **states, int64_t start_us)
{
    if (!nodes_len) rb_raise(strobe_eProfileError, "stacks without a root node");
    check(*nodes, nodes_len, RARRAY_LEN(frame_ids), n, *sample_nodes, RARRAY_LEN(thread_ids),
          threads ? *threads : NULL, states ? *states : NULL);
    strobe_stacks_t *s;
    VALUE obj = stacks_make(frame_ids, thread_ids, nodes_len, n, start_us, &s);
    /* Nothing raises from here: the buffers change hands whole. */
    s->nodes = *nodes;
    *nodes = NULL;
    s->node = *sample_nodes;
    *sample_nodes = NULL;
    if (times) { s->time = *times; *times = NULL; }
    if (threads) { s->thread = *threads; *threads = NULL; }
    if (states) { s->state = *states; *states = NULL; }
    RB_OBJ_FREEZE(obj);
    return obj;
}

uint32_t *
strobe_stacks_map_new(const strobe_stacks_t *st, VALUE *buffer, uint32_t root)
{
    /* (On the heap, whatever its size: ALLOCV may take small ones from this
     * frame's stack.) */
    uint32_t *map = rb_alloc_tmp_buffer(buffer, (long)(sizeof(uint32_t) * 2 * (size_t)st->nodes_len));
    for (uint32_t i = 0; i < st->nodes_len; i++) map[i] = UINT32_MAX;
    map[0] = root;
    return map;
}

void
strobe_stacks_refuse_raw(VALUE stacks, VALUE why)
{
    strobe_stacks_t *s = RTYPEDDATA_DATA(stacks);
    RB_OBJ_WRITE(stacks, &s->raw_refusal, rb_str_freeze(why));
}

void
strobe_stacks_limit_raw(VALUE stacks, uint64_t limit, VALUE why)
{
    strobe_stacks_t *s = RTYPEDDATA_DATA(stacks);
    s->raw_limit = limit;
    RB_OBJ_WRITE(stacks, &s->raw_limit_why, rb_str_freeze(why));
}

/* What the raw arrays would hold: per run of samples on one node (as
 * strobe_results_raw writes them), the node's depth + 2 entries;
 * UINT64_MAX past that. */
static uint64_t
raw_entries(const strobe_stacks_t *s)
{
    uint32_t *depth = malloc(sizeof(uint32_t) * s->nodes_len);
    if (!depth) rb_memerror();
    depth[0] = 0;
    for (uint32_t i = 1; i < s->nodes_len; i++) depth[i] = depth[s->nodes[i].parent] + 1; /* parents first */
    uint64_t entries = 0;
    for (size_t k = 0; k < s->n; k++) {
        if (k && s->node[k] == s->node[k - 1]) continue;
        if (__builtin_add_overflow(entries, (uint64_t)depth[s->node[k]] + 2, &entries)) {
            entries = UINT64_MAX;
            break;
        }
    }
    free(depth);
    return entries;
}

VALUE
strobe_stacks_refusal(VALUE stacks)
{
    strobe_stacks_t *s = strobe_stacks_get(stacks) ? RTYPEDDATA_DATA(stacks) : NULL;
    if (!s) return Qnil;
    if (NIL_P(s->raw_refusal) && s->raw_limit) {
        uint64_t entries = raw_entries(s);
        if (entries > s->raw_limit)
            RB_OBJ_WRITE(stacks, &s->raw_refusal,
                         rb_str_freeze(rb_sprintf("its %zu samples' stacks would expand to %"PRIu64" raw entries, over %"PRIsVALUE,
                                                  s->n, entries, s->raw_limit_why)));
        s->raw_limit = 0;
        RB_OBJ_WRITE(stacks, &s->raw_limit_why, Qnil);
    }
    return s->raw_refusal;
}

void
strobe_stacks_attach(VALUE result, VALUE stacks)
{
    rb_hash_aset(result, strobe_sym("stacks"), stacks);
    if (rb_const_defined_at(cStacks, rb_intern("RAW")))
        rb_funcall(result, rb_intern("default_proc="), 1, rb_const_get_at(cStacks, rb_intern("RAW")));
}

/* Strobe::Stacks#size -> the number of samples. */
static VALUE
stacks_size(VALUE self)
{
    return SIZET2NUM(stacks_of(self)->n);
}

/* Strobe::Stacks#bytesize -> the bytes of its nodes and columns. */
static VALUE
stacks_bytesize(VALUE self)
{
    return SIZET2NUM(stacks_bytes(stacks_of(self)));
}

/* Strobe::Stacks#raw_arrays -> {raw:, raw_lines:, raw_sample_timestamps:,
 * raw_timestamp_deltas:, raw_sample_threads:, raw_sample_states:}, as
 * stackprof and earlier Strobe results have them (keys without a column
 * left out). Every frame of every run of samples on one stack is written:
 * this is what the compact form avoids, so it is built only when asked. */
static VALUE
stacks_raw_arrays(VALUE self)
{
    const strobe_stacks_t *s = stacks_of(self);
    VALUE refusal = strobe_stacks_refusal(self);
    if (!NIL_P(refusal)) rb_raise(strobe_eProfileError, "%"PRIsVALUE, refusal);
    if (s->n > UINT32_MAX) rb_raise(strobe_eProfileError, "too many samples for raw arrays");
    VALUE h = rb_hash_new();
    strobe_results_raw(h, s->nodes, (uint32_t)s->n, s->node, s->time, s->thread_ids, s->thread, s->state, s->start_us,
                       s->frame_ids);
    return h;
}

/* Whether node i of a and node j of b are the same stack: the same frame
 * ids and lines from the root. same[i] == j + 1 caches a match found (a
 * file's node table may hold a stack twice, so i may also match another
 * node of b: then it is walked again). Iterative: a stack may be deep. */
static int
same_stack(const strobe_stacks_t *a, uint32_t i, const strobe_stacks_t *b, uint32_t j, uint32_t *same)
{
    uint32_t top_i = i, top_j = j;
    while (i && j && same[i] != j + 1) {
        const strobe_node_t *x = &a->nodes[i], *y = &b->nodes[j];
        if (x->line != y->line || !rb_eql(RARRAY_AREF(a->frame_ids, x->frame), RARRAY_AREF(b->frame_ids, y->frame)))
            return 0;
        i = x->parent;
        j = y->parent;
    }
    if ((i == 0) != (j == 0)) return 0;
    for (i = top_i, j = top_j; i && same[i] != j + 1; i = a->nodes[i].parent, j = b->nodes[j].parent) same[i] = j + 1;
    return 1;
}

/* Strobe::Stacks#==(other): the same samples, in order, each with the same
 * stack (frame ids and lines from the root), time, thread id and state,
 * however the nodes and frames are numbered (a loaded file's are not the
 * profile's). */
static VALUE
stacks_equal(VALUE self, VALUE other)
{
    const strobe_stacks_t *a = stacks_of(self), *b = strobe_stacks_get(other);
    if (!b) return Qfalse;
    if (a == b) return Qtrue;
    if (a->n != b->n || a->start_us != b->start_us || !a->time != !b->time || !a->thread != !b->thread ||
        !a->state != !b->state)
        return Qfalse;
    VALUE buffer;
    uint32_t *same = ALLOCV_N(uint32_t, buffer, a->nodes_len);
    memset(same, 0, sizeof(uint32_t) * a->nodes_len);
    int equal = 1;
    for (size_t k = 0; k < a->n && equal; k++) {
        equal = (!a->time || a->time[k] == b->time[k]) && (!a->state || a->state[k] == b->state[k]) &&
                (!a->thread || rb_eql(RARRAY_AREF(a->thread_ids, a->thread[k]), RARRAY_AREF(b->thread_ids, b->thread[k]))) &&
                same_stack(a, a->node[k], b, b->node[k], same);
    }
    ALLOCV_END(buffer);
    return equal ? Qtrue : Qfalse;
}

/* The position value has in the Hash positions, or a ProfileError. */
static long
position_in(VALUE positions, VALUE value, const char *what)
{
    VALUE pos = rb_hash_lookup2(positions, value, Qundef);
    if (!FIXNUM_P(pos)) rb_raise(strobe_eProfileError, "%s %+"PRIsVALUE" is not in the profile", what, value);
    return FIX2LONG(pos);
}

/* Strobe::Stacks#to_file(frame_pos, thread_pos) -> [nodes, samples, deltas,
 * threads, states, start_time]: the columns of a file's stacks section
 * (profile_file.rb). Only the nodes some sample stands on, and their
 * ancestors, are written, numbered from 1 in order (the root is 0); a
 * node's frame is written as its id's position in frame_pos, a sample's
 * thread as its id's position in thread_pos; times as deltas from
 * start_time. A column the stacks lack is empty. */
static VALUE
stacks_to_file(VALUE self, VALUE frame_pos, VALUE thread_pos)
{
    const strobe_stacks_t *s = stacks_of(self);
    Check_Type(frame_pos, T_HASH);
    Check_Type(thread_pos, T_HASH);
    /* A buffer the GC frees should a lookup below raise. */
    VALUE buffer;
    uint32_t *number = ALLOCV_N(uint32_t, buffer, s->nodes_len ? s->nodes_len : 1);
    memset(number, 0, sizeof(uint32_t) * (s->nodes_len ? s->nodes_len : 1));
    VALUE nodes = rb_ary_new(), samples = rb_ary_new_capa((long)s->n), deltas = rb_ary_new(), threads = rb_ary_new(),
          states = rb_ary_new();
    /* Used nodes and their ancestors (a parent before its children, so
     * one pass from the deepest ids marks every ancestor). */
    for (size_t k = 0; k < s->n; k++) number[s->node[k]] = 1;
    for (uint32_t i = s->nodes_len; i-- > 1;)
        if (number[i]) number[s->nodes[i].parent] = 1;
    uint32_t next = 1;
    for (uint32_t i = 1; i < s->nodes_len; i++) {
        if (!number[i]) continue;
        number[i] = next++;
        const strobe_node_t *node = &s->nodes[i];
        rb_ary_push(nodes, UINT2NUM(node->parent ? number[node->parent] : 0));
        rb_ary_push(nodes, LONG2NUM(position_in(frame_pos, RARRAY_AREF(s->frame_ids, node->frame), "frame")));
        rb_ary_push(nodes, INT2NUM(node->line));
    }
    for (size_t k = 0; k < s->n; k++) rb_ary_push(samples, UINT2NUM(number[s->node[k]]));
    ALLOCV_END(buffer);
    int64_t prev = s->start_us;
    /* Each thread's position, looked up as a sample first names it. */
    VALUE thread_of = s->thread ? rb_ary_new_from_values(0, NULL) : Qnil;
    if (s->thread) rb_ary_resize(thread_of, RARRAY_LEN(s->thread_ids));
    for (size_t k = 0; k < s->n; k++) {
        if (s->time) {
            rb_ary_push(deltas, LL2NUM(s->time[k] - prev));
            prev = s->time[k];
        }
        if (s->thread) {
            VALUE pos = RARRAY_AREF(thread_of, s->thread[k]);
            if (NIL_P(pos)) {
                pos = LONG2NUM(position_in(thread_pos, RARRAY_AREF(s->thread_ids, s->thread[k]), "thread"));
                rb_ary_store(thread_of, s->thread[k], pos);
            }
            rb_ary_push(threads, pos);
        }
        if (s->state) rb_ary_push(states, INT2FIX(s->state[k]));
    }
    return rb_ary_new_from_args(6, nodes, samples, deltas, threads, states, LL2NUM(s->start_us));
}

/* Strobe::Stacks#frame_ids -> the result frame id of each of its frames
 * (a node's frame indexes it), frozen. */
static VALUE
stacks_frame_ids(VALUE self)
{
    return rb_ary_freeze(rb_ary_dup(stacks_of(self)->frame_ids));
}

/* Strobe::Stacks#thread_ids -> the thread id of each of its threads (a
 * sample's thread indexes it), frozen. */
static VALUE
stacks_thread_ids(VALUE self)
{
    return rb_ary_freeze(rb_ary_dup(stacks_of(self)->thread_ids));
}

/* Strobe::Stacks#sampled_thread_ids -> the ids of the threads some sample
 * is of, in the order of thread_ids. */
static VALUE
stacks_sampled_thread_ids(VALUE self)
{
    const strobe_stacks_t *s = stacks_of(self);
    VALUE out = rb_ary_new();
    if (!s->thread) return out;
    long count = RARRAY_LEN(s->thread_ids);
    VALUE buffer;
    uint8_t *seen = ALLOCV_N(uint8_t, buffer, (size_t)(count ? count : 1));
    memset(seen, 0, (size_t)(count ? count : 1));
    for (size_t k = 0; k < s->n; k++) seen[s->thread[k]] = 1;
    for (long t = 0; t < count; t++)
        if (seen[t]) rb_ary_push(out, RARRAY_AREF(s->thread_ids, t));
    ALLOCV_END(buffer);
    return out;
}

/* Strobe::Stacks#nodes -> [parents, frame_ids, lines, samples]: per node
 * (0 the root, a parent before its children) its parent, its frame's id,
 * its line and the samples whose stack ends there: the distinct stacks of
 * the profile, each with its weight, for a report written in Ruby. */
static VALUE
stacks_nodes(VALUE self)
{
    const strobe_stacks_t *s = stacks_of(self);
    VALUE buffer;
    uint64_t *count = ALLOCV_N(uint64_t, buffer, s->nodes_len);
    memset(count, 0, sizeof(uint64_t) * s->nodes_len);
    for (size_t k = 0; k < s->n; k++) count[s->node[k]]++;
    VALUE parents = rb_ary_new_capa(s->nodes_len), frames = rb_ary_new_capa(s->nodes_len),
          lines = rb_ary_new_capa(s->nodes_len), samples = rb_ary_new_capa(s->nodes_len);
    for (uint32_t i = 0; i < s->nodes_len; i++) {
        rb_ary_push(parents, i ? UINT2NUM(s->nodes[i].parent) : Qnil);
        rb_ary_push(frames, i ? RARRAY_AREF(s->frame_ids, s->nodes[i].frame) : Qnil);
        rb_ary_push(lines, INT2NUM(s->nodes[i].line));
        rb_ary_push(samples, ULL2NUM(count[i]));
    }
    ALLOCV_END(buffer);
    return rb_ary_new_from_args(4, parents, frames, lines, samples);
}

/* Strobe::Stacks#time_span -> [first, last] sample times (nil without
 * times or samples). */
static VALUE
stacks_time_span(VALUE self)
{
    const strobe_stacks_t *s = stacks_of(self);
    if (!s->time || !s->n) return Qnil;
    return rb_assoc_new(LL2NUM(s->time[0]), LL2NUM(s->time[s->n - 1]));
}

/* Strobe::Stacks#times?, #threads?, #states?: whether its samples have
 * that column. */
static VALUE
stacks_times_p(VALUE self)
{
    return stacks_of(self)->time ? Qtrue : Qfalse;
}

static VALUE
stacks_threads_p(VALUE self)
{
    return stacks_of(self)->thread ? Qtrue : Qfalse;
}

static VALUE
stacks_states_p(VALUE self)
{
    return stacks_of(self)->state ? Qtrue : Qfalse;
}

void
strobe_stacks_define(VALUE mStrobe)
{
    cStacks = rb_define_class_under(mStrobe, "Stacks", rb_cObject);
    rb_undef_alloc_func(cStacks);
    rb_define_method(cStacks, "size", stacks_size, 0);
    rb_define_method(cStacks, "bytesize", stacks_bytesize, 0);
    rb_define_method(cStacks, "raw_arrays", stacks_raw_arrays, 0);
    rb_define_method(cStacks, "to_file", stacks_to_file, 2);
    rb_define_method(cStacks, "==", stacks_equal, 1);
    rb_define_method(cStacks, "frame_ids", stacks_frame_ids, 0);
    rb_define_method(cStacks, "thread_ids", stacks_thread_ids, 0);
    rb_define_method(cStacks, "sampled_thread_ids", stacks_sampled_thread_ids, 0);
    rb_define_method(cStacks, "nodes", stacks_nodes, 0);
    rb_define_method(cStacks, "time_span", stacks_time_span, 0);
    rb_define_method(cStacks, "times?", stacks_times_p, 0);
    rb_define_method(cStacks, "threads?", stacks_threads_p, 0);
    rb_define_method(cStacks, "states?", stacks_states_p, 0);
    strobe_stacks_merge_define(cStacks);
}
