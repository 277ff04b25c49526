/*
 * stacks_merge.c - merging results' compact forms: Strobe::Stacks::Builder.
 *
 * Merge.results (merge.rb) renumbers each result's frames and adds each
 * result's samples to a builder in turn, so that merging N profiles holds
 * the merged stacks and columns, not the N inputs (the CLI loads a file,
 * adds it and drops it). A builder interns the stack nodes of the samples
 * it is given into one stack table, keyed by (parent, merged frame id,
 * line), and appends each sample's node, time, thread and state; thread
 * ids are matched by value. A column (times, threads, states) is kept only
 * if every result added had it. #finish makes the merged Strobe::Stacks.
 *
 * GVL held; not signal-safe. Linear in the samples added, plus the nodes
 * they reach.
 */
#include "stacks.h"
#include "sampling.h"
#include <stdlib.h>
#include <string.h>

typedef struct {
    strobe_stack_table_t table;
    uint32_t *node;
    int64_t *time;
    uint16_t *thread;
    uint8_t *state;
    size_t n, capa;
    int added, finished, all_times, all_threads, all_states;
    int64_t start_us;
    VALUE thread_ids;        /* Array */
    VALUE thread_index;      /* Hash: thread id -> position in thread_ids */
    VALUE raw_refusal;       /* an input's, if its raw arrays are refused: the merge's too */
} builder_t;

static void
builder_mark(void *ptr)
{
    builder_t *b = ptr;
    strobe_stack_table_mark(&b->table);
    rb_gc_mark(b->thread_ids);
    rb_gc_mark(b->thread_index);
    rb_gc_mark(b->raw_refusal);
}

static void
builder_free(void *ptr)
{
    builder_t *b = ptr;
    strobe_stack_table_free(&b->table);
    free(b->node);
    free(b->time);
    free(b->thread);
    free(b->state);
    xfree(b);
}

static size_t
builder_memsize(const void *ptr)
{
    const builder_t *b = ptr;
    return sizeof(*b) + b->capa * (sizeof(uint32_t) + sizeof(int64_t) + sizeof(uint16_t) + 1) +
           (size_t)b->table.nodes_capa * sizeof(strobe_node_t);
}

static const rb_data_type_t builder_type = {
    .wrap_struct_name = "Strobe::Stacks::Builder",
    .function = { .dmark = builder_mark, .dfree = builder_free, .dsize = builder_memsize },
    .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

static VALUE
builder_alloc(VALUE klass)
{
    builder_t *b;
    VALUE obj = TypedData_Make_Struct(klass, builder_t, &builder_type, b);
    strobe_stack_table_init(&b->table);
    b->thread_ids = rb_ary_new();
    b->thread_index = rb_hash_new();
    b->raw_refusal = Qnil;
    b->all_times = b->all_threads = b->all_states = 1;
    return obj;
}

static builder_t *
builder_of(VALUE self)
{
    return rb_check_typeddata(self, &builder_type);
}

static void
reserve(builder_t *b, size_t more)
{
    if (b->n + more <= b->capa) return;
    size_t capa = b->capa ? b->capa : 4096;
    while (capa < b->n + more) capa *= 2;
    b->node = strobe_grow(b->node, capa, sizeof(uint32_t));
    b->time = strobe_grow(b->time, capa, sizeof(int64_t));
    b->thread = strobe_grow(b->thread, capa, sizeof(uint16_t));
    b->state = strobe_grow(b->state, capa, 1);
    b->capa = capa;
}

/* The merged position of thread id, added on first sight. */
static uint16_t
thread_position(builder_t *b, VALUE id)
{
    VALUE at = rb_hash_lookup2(b->thread_index, id, Qundef);
    if (FIXNUM_P(at)) return (uint16_t)FIX2LONG(at);
    long pos = RARRAY_LEN(b->thread_ids);
    if (pos > UINT16_MAX) rb_raise(strobe_eProfileError, "more than %d threads in the merged profiles", UINT16_MAX + 1);
    rb_ary_push(b->thread_ids, id);
    rb_hash_aset(b->thread_index, id, LONG2FIX(pos));
    return (uint16_t)pos;
}

/* A node of the merged table: the node's frame renamed through the map. */
typedef struct {
    builder_t *b;
    const strobe_stacks_t *st;
    VALUE frame_map;
} into_merge_t;

static uint32_t
merged_node(void *arg, uint32_t parent, uint32_t node)
{
    into_merge_t *c = arg;
    const strobe_node_t *n = &c->st->nodes[node];
    VALUE old = RARRAY_AREF(c->st->frame_ids, n->frame);
    VALUE id = rb_hash_lookup2(c->frame_map, old, Qundef);
    if (id == Qundef) rb_raise(strobe_eProfileError, "a stack refers to frame %+"PRIsVALUE" that is not in frames", old);
    uint32_t f = strobe_stack_table_frame(&c->b->table, id, STROBE_FRAME_RUBY);
    return strobe_stack_table_node(&c->b->table, parent, f, n->line);
}

/* Strobe::Stacks::Builder#add(stacks, frame_map) -> self: appends stacks'
 * samples, each stack's frame ids renamed through frame_map (old id => new
 * id, a Hash; every frame a sample reaches must be in it). */
static VALUE
builder_add(VALUE self, VALUE stacks, VALUE frame_map)
{
    builder_t *b = builder_of(self);
    const strobe_stacks_t *st = strobe_stacks_get(stacks);
    if (!st) rb_raise(rb_eTypeError, "not a Strobe::Stacks: %+"PRIsVALUE, stacks);
    Check_Type(frame_map, T_HASH);
    if (b->finished) rb_raise(rb_eRuntimeError, "the merge is finished");
    if (!b->added) b->start_us = st->start_us;
    VALUE refusal = strobe_stacks_refusal(stacks);
    if (!NIL_P(refusal)) RB_OBJ_WRITE(self, &b->raw_refusal, refusal);
    b->added = 1;
    b->all_times &= st->time != NULL;
    b->all_threads &= st->thread != NULL;
    b->all_states &= st->state != NULL;

    VALUE buffer, threads_buffer;
    uint32_t *map = strobe_stacks_map_new(st, &buffer, 0);
    long threads = RARRAY_LEN(st->thread_ids);
    uint16_t *thread_of = ALLOCV_N(uint16_t, threads_buffer, (size_t)(threads ? threads : 1));
    for (long t = 0; t < threads; t++) thread_of[t] = thread_position(b, RARRAY_AREF(st->thread_ids, t));

    reserve(b, st->n);
    into_merge_t c = { b, st, frame_map };
    for (size_t k = 0; k < st->n; k++) {
        size_t at = b->n++;
        b->node[at] = strobe_stacks_resolve(st, st->node[k], map, map + st->nodes_len, merged_node, &c);
        b->time[at] = st->time ? st->time[k] : 0;
        b->thread[at] = st->thread ? thread_of[st->thread[k]] : 0;
        b->state[at] = st->state ? st->state[k] : STROBE_STATE_UNKNOWN;
    }
    ALLOCV_END(buffer);
    ALLOCV_END(threads_buffer);
    return self;
}

/* Strobe::Stacks::Builder#finish -> the merged Strobe::Stacks (nil when
 * nothing was added). */
/* ptr cut down to count entries of size bytes (or left as it is). */
static void *
shrunk(void *ptr, size_t count, size_t size)
{
    void *p = count ? realloc(ptr, count * size) : NULL;
    return p ? p : ptr;
}

static VALUE
builder_finish(VALUE self)
{
    builder_t *b = builder_of(self);
    if (b->finished) rb_raise(rb_eRuntimeError, "the merge is finished");
    if (!b->added) return Qnil;
    VALUE frame_ids = rb_ary_new_capa(b->table.frames_len);
    for (uint32_t f = 0; f < b->table.frames_len; f++) rb_ary_push(frame_ids, b->table.frames[f].value);
    /* The merged table and columns become the result's as they are (no
     * copy), and the rest of the builder goes at once. */
    b->table.nodes = shrunk(b->table.nodes, b->table.nodes_len, sizeof(strobe_node_t));
    b->node = shrunk(b->node, b->n, sizeof(uint32_t));
    b->time = shrunk(b->time, b->n, sizeof(int64_t));
    b->thread = shrunk(b->thread, b->n, sizeof(uint16_t));
    b->state = shrunk(b->state, b->n, 1);
    VALUE stacks = strobe_stacks_adopt(&b->table.nodes, b->table.nodes_len, frame_ids, b->n, &b->node,
                                       b->all_times ? &b->time : NULL, b->thread_ids,
                                       b->all_threads ? &b->thread : NULL, b->all_states ? &b->state : NULL,
                                       b->start_us);
    b->finished = 1;
    strobe_stack_table_free(&b->table); /* (its nodes are the result's now) */
    free(b->node); free(b->time); free(b->thread); free(b->state);
    b->node = NULL; b->time = NULL; b->thread = NULL; b->state = NULL;
    b->capa = b->n = 0;
    if (!NIL_P(b->raw_refusal)) strobe_stacks_refuse_raw(stacks, b->raw_refusal);
    return stacks;
}

void
strobe_stacks_merge_define(VALUE cStacks)
{
    VALUE cBuilder = rb_define_class_under(cStacks, "Builder", rb_cObject);
    rb_define_alloc_func(cBuilder, builder_alloc);
    rb_define_method(cBuilder, "add", builder_add, 2);
    rb_define_method(cBuilder, "finish", builder_finish, 0);
}
