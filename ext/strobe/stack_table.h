/*
 * stack_table.h - interned frames and the prefix tree of stacks
 * (stack_table.c): frame and node ids, and the child cache whose hit path
 * is inline here. Not signal-safe: it allocates.
 */
#ifndef STROBE_STACK_TABLE_H
#define STROBE_STACK_TABLE_H 1

#include "strobe.h"

typedef struct {
    VALUE value;             /* iseq / method entry, or a number for GC kinds */
    uint8_t kind;
    uint16_t level;          /* its innermost level (from the root) in that batch */
    uint32_t batch;          /* the table's batch when it was interned */
} strobe_frame_t;

typedef struct {
    uint32_t parent;         /* node id; 0 is the root */
    uint32_t frame;          /* frame id */
    int32_t line;
} strobe_node_t;

/* Direct-mapped cache of recent (parent, frame VALUE, line) -> node lookups,
 * so a stack seen before interns each new frame with one probe. */
#define STROBE_CHILD_CACHE_BITS 9
typedef struct {
    VALUE value;
    uint32_t parent;
    int32_t line;
    uint32_t node;           /* 0 = empty (the root is never a child) */
} strobe_child_cache_t;

typedef struct {
    strobe_frame_t *frames;
    uint32_t frames_len, frames_capa;
    uint32_t *frame_slots;   /* open addressing: frame id + 1, 0 = empty */
    uint32_t frame_slots_capa;
    strobe_node_t *nodes;    /* nodes[0] is the root */
    uint32_t nodes_len, nodes_capa;
    uint32_t *node_slots;    /* open addressing: node id, 0 = empty */
    uint32_t node_slots_capa;
    /* The stack being interned (profile.c): its number and the level
     * (from the root) being interned, so frames first seen in the same
     * stack can be listed innermost first, as stackprof lists them. */
    uint32_t batch;
    uint16_t level;
    strobe_child_cache_t child_cache[1 << STROBE_CHILD_CACHE_BITS];
} strobe_stack_table_t;

void strobe_stack_table_init(strobe_stack_table_t *st);
void strobe_stack_table_free(strobe_stack_table_t *st);
uint32_t strobe_stack_table_frame(strobe_stack_table_t *st, VALUE value, int kind);
uint32_t strobe_stack_table_node(strobe_stack_table_t *st, uint32_t parent, uint32_t frame, int32_t line);
uint32_t strobe_stack_table_child_slow(strobe_stack_table_t *st, uint32_t parent, VALUE value, int32_t line);

static inline strobe_child_cache_t *
strobe_child_cache_entry(strobe_stack_table_t *st, uint32_t parent, VALUE value, int32_t line)
{
    uint64_t key = ((uint64_t)parent << 32 | (uint32_t)line) ^ (uint64_t)value;
    return &st->child_cache[(key * 0x9e3779b97f4a7c15ULL) >> (64 - STROBE_CHILD_CACHE_BITS)];
}

/* The node for a Ruby frame VALUE at line under parent (interning both).
 * Inline for the cache hit, the common case on every sample. */
static inline uint32_t
strobe_stack_table_child(strobe_stack_table_t *st, uint32_t parent, VALUE value, int32_t line)
{
    const strobe_child_cache_t *c = strobe_child_cache_entry(st, parent, value, line);
    if (c->node && c->value == value && c->parent == parent && c->line == line) return c->node;
    return strobe_stack_table_child_slow(st, parent, value, line);
}
void strobe_stack_table_mark(const strobe_stack_table_t *st);

#endif
