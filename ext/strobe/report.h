/*
 * report.h - the report engine (report.c, and beside it tree.c, folded.c,
 * callgraph.c, filetotals.c and method.c, one report each), shared with
 * what is built on it (samples.c, the exporters, flamegraph.c): a result's
 * frames loaded into a flat array, a report's lifetime (strobe_report_run
 * frees its buffers however the body ends, and a hidden object marks its
 * VALUEs), the stack tree, and the checked arithmetic of counts.
 *
 * GVL held; nothing here is signal-safe.
 */
#ifndef STROBE_REPORT_H
#define STROBE_REPORT_H 1
#include "out.h"
#include <ruby/st.h>

/* A result's raw samples read into C (samples.h). */
struct strobe_samples;

typedef struct {
    VALUE id, name, file;
    long line;               /* -1 when absent */
    int native;              /* a native (C) frame (native: true) */
    uint64_t total, self;
    VALUE edges, lines;      /* Hashes or nil */
} rframe_t;

typedef struct {
    VALUE result, keep;
    int details;             /* load file, line, edges and lines too */
    rframe_t *frames;
    long len, capa;
    st_table *index;         /* Fixnum frame id -> position in frames */
    uint64_t samples;
    /* the stack tree (report_tree) */
    uint32_t *parent, *frame;
    uint64_t *self, *total;
    uint32_t nodes, nodes_capa;
    uint32_t *child_slots;   /* open addressing over the nodes by (parent, frame): node id, 0 empty */
    uint32_t child_slots_capa; /* a power of 2, over twice the nodes */
    uint32_t *runs_node;
    uint64_t *runs_count;
    size_t runs, runs_capa;
    int runs_wanted;         /* report_tree keeps the runs only when set (Native.report_tree) */
    uint32_t *sample_node;   /* if set: report_tree writes each sample's leaf node here */
    size_t sample_nodes;     /* its length: the samples raw describes */
    VALUE *prev_ids;         /* the previous raw stack's frame ids */
    uint32_t *path;          /* path[k]: its node after level k (path[0]: root) */
    long path_capa;
    out_t out;               /* the output being written */
    void *scratch[8];        /* a report's own buffers (xmalloc), freed with it */
    struct strobe_samples *samples_read; /* an export's samples (samples.c), freed with it */
    void (*cleanup)(void *);  /* an export's own cleanup, run as the report is freed */
    void *cleanup_arg;
    VALUE pinned[3];         /* an export's own objects held in C memory: marked
                              * (and so pinned) while it runs (0: none);
                              * pinned[2] an Array whose elements are pinned too */
    VALUE holder;            /* GC-visible object marking the VALUEs above */
} report_t;

/* Loads result's frames (only those keep lets through, a Hash of ids, or
 * nil for all); with details, also file, line, edges and lines, and the id
 * -> position index. */
void strobe_report_load(report_t *r, VALUE result, VALUE keep, int details);
/* Runs body(args) with a fresh report (*slot), freeing it however body ends. */
VALUE strobe_report_run(VALUE (*body)(VALUE), void *args, report_t **slot);
/* Position of a kept frame; -1 for a frame the filter dropped, or for one
 * not in frames when unknown_ok (otherwise ProfileError). */
long strobe_report_frame_pos(const report_t *r, VALUE id, int unknown_ok);
/* The stack tree of frames (tree.c): interns every raw stack of r's result
 * into the tree (r loaded first), with self and total counts and the
 * samples' leaf nodes as runs; with r->sample_node set, also each sample's
 * leaf node there. */
void strobe_report_tree(report_t *r);
/* The tree as {frame_ids:, parent:, frame:, self:, total:} for Ruby. */
VALUE strobe_report_tree_hash(report_t *r);

/* The arguments of most reports' bodies: r set by strobe_report_run. */
typedef struct {
    report_t *r;
    VALUE result, keep;
    double node_fraction;
} report_args_t;

/* Strobe::Native.report_<name>(result, keep): runs <name>_body on a report
 * of result filtered by keep. */
#define REPORT_METHOD(name)                                          \
    static VALUE                                                     \
    native_report_##name(VALUE self, VALUE result, VALUE keep)       \
    {                                                                \
        report_args_t a = { NULL, result, keep, 0 };                 \
        return strobe_report_run(name##_body, &a, &a.r);                    \
    }

/* Each report's Strobe::Native methods, defined by strobe_report_define
 * (report.c: report_text): report_tree (tree.c), report_folded (folded.c),
 * report_graphviz and report_callgrind (callgraph.c), report_files
 * (filetotals.c), report_method (method.c). */
void strobe_report_define(VALUE mNative);
void strobe_report_tree_define(VALUE mNative);
void strobe_report_folded_define(VALUE mNative);
void strobe_report_callgraph_define(VALUE mNative);
void strobe_report_files_define(VALUE mNative);
void strobe_report_method_define(VALUE mNative);

/* 100 * count / samples with one decimal, into buf (at least 32 bytes),
 * exactly as Ruby's format("%.1f", 100.0 * count / samples) writes it;
 * returns the length (report.c). */
int strobe_format_percent(char *buf, uint64_t count, uint64_t samples);

/* a * b and a + b, or ProfileError naming what overflowed. */
static inline int64_t
strobe_checked_mul(int64_t a, int64_t b, const char *what)
{
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r)) CORRUPT("%s is too large", what);
    return r;
}

static inline int64_t
strobe_checked_add(int64_t a, int64_t b, const char *what)
{
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) CORRUPT("%s is too large", what);
    return r;
}

/* A count read from a result: a non-negative Integer below 2**64, 0 for nil. */
uint64_t strobe_count_of(VALUE v, const char *what);

/* *sum += n, or ProfileError when counts that large cannot be right. */
static inline void
strobe_add_count(uint64_t *sum, uint64_t n)
{
    if (__builtin_add_overflow(*sum, n, sum)) CORRUPT("sample counts add up to more than 2**64");
}

#endif
