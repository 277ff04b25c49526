/*
 * tree.c - the stack tree of a result's raw samples: each raw stack is
 * interned into a prefix tree of frames (lines ignored), reusing the
 * previous stack's common part, with per-node self and total counts and the
 * time-ordered leaf nodes, run-length encoded. Frames a filter drops are
 * left out of the stacks (their samples go to the nearest kept caller).
 * Folded stacks, per-file totals and the flamegraph data come from it;
 * Native.report_tree hands it to Ruby.
 *
 * Every id and count read from the result is checked: malformed data raises
 * Strobe::ProfileError. GVL held; not signal-safe.
 */
#include "report.h"
#include "samples.h"

static VALUE sym_raw;

/* The root, an empty tree. */
static void
tree_init(report_t *r)
{
    r->child_slots_capa = 2048;
    r->child_slots = ZALLOC_N(uint32_t, r->child_slots_capa);
    r->nodes_capa = 1024;
    r->parent = ALLOC_N(uint32_t, r->nodes_capa);
    r->frame = ALLOC_N(uint32_t, r->nodes_capa);
    r->self = ALLOC_N(uint64_t, r->nodes_capa);
    r->parent[0] = UINT32_MAX;
    r->frame[0] = UINT32_MAX;
    r->self[0] = 0;
    r->nodes = 1;
}

/* Each node's total from the self counts (a parent's id is below its
 * children's). */
static void
tree_totals(report_t *r)
{
    r->total = ALLOC_N(uint64_t, r->nodes);
    memcpy(r->total, r->self, sizeof(uint64_t) * r->nodes);
    for (uint32_t n = r->nodes; n-- > 1;) strobe_add_count(&r->total[r->parent[n]], r->total[n]);
}

static inline uint32_t
child_hash(uint32_t parent, uint32_t frame)
{
    uint64_t x = ((uint64_t)parent << 32 | frame) * 0x9e3779b97f4a7c15ULL;
    return (uint32_t)(x >> 32) ^ (uint32_t)x;
}

/* The children's slots doubled (nodes 1.. placed again). */
static void
grow_child_slots(report_t *r)
{
    if (r->child_slots_capa >= (uint32_t)1 << 31) CORRUPT("too many distinct stacks");
    uint32_t capa = r->child_slots_capa * 2, mask = capa - 1;
    uint32_t *slots = ZALLOC_N(uint32_t, capa);
    for (uint32_t n = 1; n < r->nodes; n++) {
        uint32_t i = child_hash(r->parent[n], r->frame[n]) & mask;
        while (slots[i]) i = (i + 1) & mask;
        slots[i] = n;
    }
    xfree(r->child_slots);
    r->child_slots = slots;
    r->child_slots_capa = capa;
}

/* The node for frame (a position in frames) under parent, made on first use. */
static uint32_t
tree_child(report_t *r, uint32_t parent, uint32_t frame)
{
    uint32_t mask = r->child_slots_capa - 1, i = child_hash(parent, frame) & mask;
    for (uint32_t n; (n = r->child_slots[i]) != 0; i = (i + 1) & mask)
        if (r->parent[n] == parent && r->frame[n] == frame) return n;
    if (r->nodes == r->nodes_capa) {
        if (r->nodes_capa >= UINT32_MAX / 2) CORRUPT("too many distinct stacks");
        r->nodes_capa *= 2;
        REALLOC_N(r->parent, uint32_t, r->nodes_capa);
        REALLOC_N(r->frame, uint32_t, r->nodes_capa);
        REALLOC_N(r->self, uint64_t, r->nodes_capa);
    }
    uint32_t n = r->nodes++;
    r->parent[n] = parent;
    r->frame[n] = frame;
    r->self[n] = 0;
    r->child_slots[i] = n;
    if ((uint64_t)r->nodes * 2 > r->child_slots_capa) grow_child_slots(r);
    return n;
}

static void
tree_run(report_t *r, uint32_t node, uint64_t count)
{
    if (!r->runs_wanted) return;
    if (r->runs && r->runs_node[r->runs - 1] == node) {
        strobe_add_count(&r->runs_count[r->runs - 1], count);
        return;
    }
    if (r->runs == r->runs_capa) {
        r->runs_capa = r->runs_capa ? r->runs_capa * 2 : 1024;
        REALLOC_N(r->runs_node, uint32_t, r->runs_capa);
        REALLOC_N(r->runs_count, uint64_t, r->runs_capa);
    }
    r->runs_node[r->runs] = node;
    r->runs_count[r->runs++] = count;
}

/* The tree of a compact form's samples: each stack node a sample reaches
 * is given its tree node once, ancestors first, in the order samples first
 * reach it (so the tree is the one the raw arrays give); each sample then
 * costs a lookup. */
typedef struct {
    report_t *r;
    const strobe_stacks_t *st;
    long *pos_of;            /* per frame: its position in r's frames, -1 dropped, -2 not looked up */
} into_tree_t;

static uint32_t
tree_node(void *arg, uint32_t parent, uint32_t node)
{
    into_tree_t *c = arg;
    uint32_t f = c->st->nodes[node].frame;
    if (c->pos_of[f] == -2) c->pos_of[f] = strobe_report_frame_pos(c->r, RARRAY_AREF(c->st->frame_ids, f), 0);
    return c->pos_of[f] >= 0 ? tree_child(c->r, parent, (uint32_t)c->pos_of[f]) : parent;
}

static void
tree_from_stacks(report_t *r, const strobe_stacks_t *st)
{
    if (r->sample_node && r->sample_nodes != st->n) CORRUPT("the stacks have %zu samples, not %zu", st->n, r->sample_nodes);
    tree_init(r);
    long frames = RARRAY_LEN(st->frame_ids);
    VALUE buffer, frames_buffer; /* freed by the GC should anything raise */
    uint32_t *map = strobe_stacks_map_new(st, &buffer, 0);
    into_tree_t c = { r, st, ALLOCV_N(long, frames_buffer, (size_t)(frames ? frames : 1)) };
    for (long f = 0; f < frames; f++) c.pos_of[f] = -2;
    for (size_t k = 0; k < st->n; k++) {
        uint32_t node = strobe_stacks_resolve(st, st->node[k], map, map + st->nodes_len, tree_node, &c);
        strobe_add_count(&r->self[node], 1);
        tree_run(r, node, 1);
        if (r->sample_node) r->sample_node[k] = node;
    }
    ALLOCV_END(buffer);
    ALLOCV_END(frames_buffer);
    tree_totals(r);
}

/* Interns every raw stack (root first, [depth, ids..., count] each) into
 * the tree. A stack shares the previous one's path up to the first level
 * whose frame id differs, so only the rest is looked up. A result with a
 * compact form is read from that instead. */
void
strobe_report_tree(report_t *r)
{
    const strobe_stacks_t *st = strobe_samples_stacks(r->result);
    if (st) {
        tree_from_stacks(r, st);
        return;
    }
    VALUE raw = rb_hash_aref(r->result, sym_raw); /* (built from :stacks as read: stacks.c) */
    if (!RB_TYPE_P(raw, T_ARRAY))
        CORRUPT("this report needs per-sample data: profile with raw: true (strobe run --raw)");
    tree_init(r);

    long len = RARRAY_LEN(raw), prev_depth = 0;
    size_t sampled = 0;
    for (long i = 0; i < len;) {
        long depth = strobe_fixnum_at(raw, i, "raw");
        /* Written so that no huge value can overflow the check. */
        if (depth < 0 || depth > len - i - 2) CORRUPT("raw is truncated at index %ld", i);
        long count = strobe_fixnum_at(raw, i + depth + 1, "raw");
        if (count < 0) CORRUPT("raw has a negative count at index %ld", i + depth + 1);
        if (depth + 1 > r->path_capa) {
            r->path_capa = (depth + 1) * 2;
            REALLOC_N(r->prev_ids, VALUE, r->path_capa);
            REALLOC_N(r->path, uint32_t, r->path_capa);
            r->path[0] = 0;
        }
        long k = 0, limit = depth < prev_depth ? depth : prev_depth;
        while (k < limit && RARRAY_AREF(raw, i + 1 + k) == r->prev_ids[k]) k++;
        uint32_t node = r->path[k];
        for (; k < depth; k++) {
            VALUE id = RARRAY_AREF(raw, i + 1 + k);
            long pos = strobe_report_frame_pos(r, id, 0);
            if (pos >= 0) node = tree_child(r, node, (uint32_t)pos);
            r->prev_ids[k] = id;
            r->path[k + 1] = node;
        }
        prev_depth = depth;
        strobe_add_count(&r->self[node], (uint64_t)count);
        if (count) tree_run(r, node, (uint64_t)count);
        if (r->sample_node) {
            if ((uint64_t)count > r->sample_nodes - sampled) CORRUPT("raw has more samples than it had");
            for (long c = 0; c < count; c++) r->sample_node[sampled++] = node;
        }
        i += depth + 2;
    }
    if (r->sample_node && sampled != r->sample_nodes) CORRUPT("raw has fewer samples than it had");

    tree_totals(r);
}

/* Arrays of Integers; with root_as_minus_one, UINT32_MAX is written -1. */
static VALUE
u32_array(const uint32_t *v, size_t n, int root_as_minus_one)
{
    VALUE a = rb_ary_new_capa((long)n);
    for (size_t i = 0; i < n; i++)
        rb_ary_push(a, root_as_minus_one && v[i] == UINT32_MAX ? INT2FIX(-1) : UINT2NUM(v[i]));
    return a;
}

static VALUE
u64_array(const uint64_t *v, size_t n)
{
    VALUE a = rb_ary_new_capa((long)n);
    for (size_t i = 0; i < n; i++) rb_ary_push(a, ULL2NUM(v[i]));
    return a;
}

VALUE
strobe_report_tree_hash(report_t *r)
{
    VALUE ids = rb_ary_new_capa(r->len);
    for (long i = 0; i < r->len; i++) rb_ary_push(ids, r->frames[i].id);
    VALUE h = rb_hash_new();
    rb_hash_aset(h, ID2SYM(rb_intern("frame_ids")), ids);
    rb_hash_aset(h, ID2SYM(rb_intern("parent")), u32_array(r->parent, r->nodes, 1));
    rb_hash_aset(h, ID2SYM(rb_intern("frame")), u32_array(r->frame, r->nodes, 1));
    rb_hash_aset(h, ID2SYM(rb_intern("self")), u64_array(r->self, r->nodes));
    rb_hash_aset(h, ID2SYM(rb_intern("total")), u64_array(r->total, r->nodes));
    return h;
}

static VALUE
tree_body(VALUE arg)
{
    report_args_t *a = (report_args_t *)arg;
    report_t *r = a->r;
    strobe_report_load(r, a->result, a->keep, 1);
    r->runs_wanted = 1;
    strobe_report_tree(r);
    VALUE h = strobe_report_tree_hash(r);
    rb_hash_aset(h, ID2SYM(rb_intern("run_nodes")), u32_array(r->runs_node, r->runs, 0));
    rb_hash_aset(h, ID2SYM(rb_intern("run_counts")), u64_array(r->runs_count, r->runs));
    return h;
}

/* Strobe::Native.report_tree(result, keep) -> {frame_ids:, parent:, frame:,
 * self:, total:, run_nodes:, run_counts:}: the stack tree of the raw
 * samples (node 0 the root, parent -1; frame indexes frame_ids) and the
 * samples in time order as runs of leaf nodes. */
REPORT_METHOD(tree)

void
strobe_report_tree_define(VALUE mNative)
{
    sym_raw = ID2SYM(rb_intern("raw"));
    rb_define_singleton_method(mNative, "report_tree", native_report_tree, 2);
}
