/*
 * stack_table.c - interned frames and the prefix tree of stacks.
 *
 * A frame (an iseq or method entry VALUE, or a GC pseudo-frame) becomes a
 * small frame id; a stack becomes one node id in a tree of
 * (parent node, frame, line), so a sample is a single integer. Node ids grow
 * in creation order, so a parent's id is always below its children's.
 *
 * Both maps are open-addressing hash tables of 32-bit ids, grown at 50% load.
 * In front of them, a direct-mapped child cache (parent, frame VALUE, line)
 * -> node answers repeated lookups in one probe; its hit path is inline in
 * stack_table.h, its miss path (strobe_stack_table_child_slow) is here. Its
 * keys are interned, hence pinned, frames; it is cleared with the table.
 * GC: interned frames are pinned with rb_gc_mark (they are hash keys by
 * address; pinning keeps them valid under GC.compact and auto_compact).
 *
 * Not signal-safe: it allocates. Called under the profile lock (by the timer
 * thread or with the GVL held), or on tables no other thread can see. An
 * allocation failure goes to strobe_out_of_memory() with every table still
 * consistent.
 */
#include "stack_table.h"
#include "sampling.h"
#include <stdlib.h>
#include <string.h>

static void *
xgrow(void *ptr, size_t count, size_t size)
{
    void *p = realloc(ptr, count * size);
    if (!p) strobe_out_of_memory();
    return strobe_advise_huge(p, count * size);
}

static uint32_t *
xslots(uint32_t capa)
{
    uint32_t *p = calloc(capa, sizeof(uint32_t));
    if (!p) strobe_out_of_memory();
    return strobe_advise_huge(p, capa * sizeof(uint32_t));
}

static inline uint64_t
mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static inline uint64_t
frame_hash(VALUE value, int kind)
{
    return mix64((uint64_t)value * 4 + (uint64_t)kind);
}

static inline uint64_t
node_hash(uint32_t parent, uint32_t frame, int32_t line)
{
    return mix64(((uint64_t)parent << 32 | frame) ^ mix64((uint64_t)(uint32_t)line + 0x9e3779b97f4a7c15ULL));
}

void
strobe_stack_table_init(strobe_stack_table_t *st)
{
    memset(st, 0, sizeof(*st));
    st->nodes_capa = 1024;
    st->nodes = xgrow(NULL, st->nodes_capa, sizeof(strobe_node_t));
    st->nodes[0] = (strobe_node_t){ 0, UINT32_MAX, 0 }; /* the root */
    st->nodes_len = 1;
    st->node_slots_capa = 2048;
    st->node_slots = xslots(st->node_slots_capa);
    st->frames_capa = 256;
    st->frames = xgrow(NULL, st->frames_capa, sizeof(strobe_frame_t));
    st->frame_slots_capa = 512;
    st->frame_slots = xslots(st->frame_slots_capa);
}

void
strobe_stack_table_free(strobe_stack_table_t *st)
{
    free(st->frames);
    free(st->frame_slots);
    free(st->nodes);
    free(st->node_slots);
    memset(st, 0, sizeof(*st));
}

static void
rehash_frames(strobe_stack_table_t *st)
{
    uint32_t capa = st->frame_slots_capa * 2;
    uint32_t *slots = xslots(capa);
    for (uint32_t id = 0; id < st->frames_len; id++) {
        uint64_t i = frame_hash(st->frames[id].value, st->frames[id].kind) & (capa - 1);
        while (slots[i]) i = (i + 1) & (capa - 1);
        slots[i] = id + 1;
    }
    free(st->frame_slots);
    st->frame_slots = slots;
    st->frame_slots_capa = capa;
}

uint32_t
strobe_stack_table_frame(strobe_stack_table_t *st, VALUE value, int kind)
{
    uint32_t mask = st->frame_slots_capa - 1;
    uint64_t i = frame_hash(value, kind) & mask;
    for (uint32_t s; (s = st->frame_slots[i]) != 0; i = (i + 1) & mask) {
        strobe_frame_t *f = &st->frames[s - 1];
        if (f->value == value && f->kind == kind) {
            if (f->batch == st->batch) f->level = st->level; /* deeper in its first stack */
            return s - 1;
        }
    }
    if (st->frames_len == st->frames_capa) {
        st->frames = xgrow(st->frames, st->frames_capa * 2, sizeof(strobe_frame_t));
        st->frames_capa *= 2;
    }
    uint32_t id = st->frames_len++;
    st->frames[id] = (strobe_frame_t){ value, (uint8_t)kind, st->level, st->batch };
    st->frame_slots[i] = id + 1;
    if ((uint64_t)st->frames_len * 2 > st->frame_slots_capa) rehash_frames(st);
    return id;
}

static void
rehash_nodes(strobe_stack_table_t *st)
{
    uint32_t capa = st->node_slots_capa * 2;
    uint32_t *slots = xslots(capa);
    for (uint32_t id = 1; id < st->nodes_len; id++) {
        const strobe_node_t *n = &st->nodes[id];
        uint64_t i = node_hash(n->parent, n->frame, n->line) & (capa - 1);
        while (slots[i]) i = (i + 1) & (capa - 1);
        slots[i] = id;
    }
    free(st->node_slots);
    st->node_slots = slots;
    st->node_slots_capa = capa;
}

uint32_t
strobe_stack_table_node(strobe_stack_table_t *st, uint32_t parent, uint32_t frame, int32_t line)
{
    uint32_t mask = st->node_slots_capa - 1;
    uint64_t i = node_hash(parent, frame, line) & mask;
    for (uint32_t s; (s = st->node_slots[i]) != 0; i = (i + 1) & mask) {
        const strobe_node_t *n = &st->nodes[s];
        if (n->parent == parent && n->frame == frame && n->line == line) return s;
    }
    if (st->nodes_len == st->nodes_capa) {
        st->nodes = xgrow(st->nodes, st->nodes_capa * 2, sizeof(strobe_node_t));
        st->nodes_capa *= 2;
    }
    uint32_t id = st->nodes_len++;
    st->nodes[id] = (strobe_node_t){ parent, frame, line };
    st->node_slots[i] = id;
    if ((uint64_t)st->nodes_len * 2 > st->node_slots_capa) rehash_nodes(st);
    return id;
}

uint32_t
strobe_stack_table_child_slow(strobe_stack_table_t *st, uint32_t parent, VALUE value, int32_t line)
{
    int kind = value == STROBE_TRUNCATED_VALUE ? STROBE_FRAME_TRUNCATED
             : STROBE_NATIVE_P(value)         ? STROBE_FRAME_NATIVE
                                              : STROBE_FRAME_RUBY;
    uint32_t frame = strobe_stack_table_frame(st, value, kind);
    uint32_t node = strobe_stack_table_node(st, parent, frame, line);
    *strobe_child_cache_entry(st, parent, value, line) = (strobe_child_cache_t){ value, parent, line, node };
    return node;
}

void
strobe_stack_table_mark(const strobe_stack_table_t *st)
{
    for (uint32_t id = 0; id < st->frames_len; id++)
        if (st->frames[id].kind == STROBE_FRAME_RUBY) rb_gc_mark(st->frames[id].value);
}
