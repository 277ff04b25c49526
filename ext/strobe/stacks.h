/*
 * stacks.h - a result's samples in compact form (stacks.c), the
 * Strobe::Stacks object results, files and parts of profiles carry under
 * :stacks. GVL held; not signal-safe.
 */
#ifndef STROBE_STACKS_H
#define STROBE_STACKS_H 1

#include "stack_table.h"

typedef struct {
    strobe_node_t *nodes;    /* nodes[0] the root; a parent before its children */
    uint32_t nodes_len;
    VALUE frame_ids;         /* Array: a node's frame -> the result's frame id */
    size_t n;                /* samples */
    uint32_t *node;          /* per sample: its leaf node */
    int64_t *time;           /* per sample: microseconds; NULL without times */
    uint16_t *thread;        /* per sample: a position in thread_ids; NULL without threads */
    uint8_t *state;          /* per sample: a STROBE_STATE_*; NULL without states */
    VALUE thread_ids;        /* Array: the result's thread ids */
    int64_t start_us;        /* when sampling started, on the clock of time */
    VALUE raw_refusal;       /* a String: why the raw arrays are not built; nil: they may be */
    uint64_t raw_limit;      /* if not 0: the most raw entries they may have, checked when first asked */
    VALUE raw_limit_why;     /* that limit, named for the refusal */
} strobe_stacks_t;

/* A new Strobe::Stacks holding copies of the columns given (times, threads
 * and states may be NULL). */
VALUE strobe_stacks_new(const strobe_node_t *nodes, uint32_t nodes_len, VALUE frame_ids, size_t n,
                        const uint32_t *sample_nodes, const int64_t *times, VALUE thread_ids,
                        const uint16_t *threads, const uint8_t *states, int64_t start_us);
/* The same, taking the malloc'd buffers given instead of copying them:
 * each pointer given is set to NULL once its buffer is the new object's
 * (times, threads and states may be NULL, or point to NULL). On an error
 * (a malformed index, no memory) nothing has changed hands. */
VALUE strobe_stacks_adopt(strobe_node_t **nodes, uint32_t nodes_len, VALUE frame_ids, size_t n, uint32_t **sample_nodes,
                          int64_t **times, VALUE thread_ids, uint16_t **threads, uint8_t **states, int64_t start_us);
/* Sets result[:stacks] = stacks, and has the stackprof raw arrays built
 * from it when one is first read (Strobe::Stacks::RAW, a default proc). */
void strobe_stacks_attach(VALUE result, VALUE stacks);
/* Readers that give each stack node its own node (a tree's, a table's)
 * resolve a node when a sample first reaches it: map holds each node's
 * value (UINT32_MAX: not yet; map[0], the root's, given), chain is scratch
 * (both nodes_len long: strobe_stacks_map_new). intern(ctx, parent's
 * value, node) gives a node's value; it is called for the unknown
 * ancestors root first, so values come in the order samples reach them. */
typedef uint32_t (*strobe_stacks_intern_t)(void *ctx, uint32_t parent, uint32_t node);

static inline uint32_t
strobe_stacks_resolve(const strobe_stacks_t *st, uint32_t m, uint32_t *map, uint32_t *chain,
                      strobe_stacks_intern_t intern, void *ctx)
{
    if (map[m] != UINT32_MAX) return map[m];
    uint32_t len = 0;
    for (; map[m] == UINT32_MAX; m = st->nodes[m].parent) chain[len++] = m;
    uint32_t value = map[m];
    while (len) {
        uint32_t at = chain[--len];
        value = intern(ctx, value, at);
        map[at] = value;
    }
    return value;
}

/* A map and its scratch for strobe_stacks_resolve (2 x nodes_len, in a
 * buffer the GC frees should anything raise: release with ALLOCV_END),
 * every node unknown but the root, whose value is root. */
uint32_t *strobe_stacks_map_new(const strobe_stacks_t *st, VALUE *buffer, uint32_t root);

/* From now on, stacks' raw arrays are refused with ProfileError(why): a
 * file whose raw arrays would expand past its limit (compact.c). */
void strobe_stacks_refuse_raw(VALUE stacks, VALUE why);
/* Limits the raw arrays to limit entries (why names the limit in the
 * refusal), without adding up what they would hold yet: that is done
 * (once) when they are built or the refusal is asked for, since it reads
 * a node's depth per run of samples. */
void strobe_stacks_limit_raw(VALUE stacks, uint64_t limit, VALUE why);
/* Why stacks' raw arrays are refused (a String), or nil: its refusal, or
 * the limit's, checked now if it was not. */
VALUE strobe_stacks_refusal(VALUE stacks);
/* The compact form inside obj, or NULL when obj is no Strobe::Stacks. */
const strobe_stacks_t *strobe_stacks_get(VALUE obj);
void strobe_stacks_define(VALUE mStrobe);
/* Strobe::Stacks::Builder (stacks_merge.c). */
void strobe_stacks_merge_define(VALUE cStacks);

#endif
