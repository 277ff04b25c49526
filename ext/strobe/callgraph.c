/*
 * callgraph.c - call graphs from the frames' edges and lines: Graphviz DOT
 * (the frames with a share of the samples, edges labelled with their
 * counts) and the callgrind format (self samples per line, calls with
 * their inclusive samples).
 *
 * Every count read from the result is checked: malformed data raises
 * Strobe::ProfileError. GVL held; not signal-safe.
 */
#include "report.h"
#include <stdio.h>

/* ---- Graphviz ------------------------------------------------------------------- */

/* "12.3%" */
static void
out_percent(out_t *o, uint64_t count, uint64_t samples)
{
    char tmp[40];
    int len = strobe_format_percent(tmp, count, samples);
    tmp[len++] = '%';
    out_mem(o, tmp, (size_t)len);
}

typedef struct {
    report_t *r;
    const char *shown;       /* per frame position: drawn */
    long from;
    char prefix[32];         /* "  f<from> -> f", the same for all its edges */
    size_t prefix_len;
} edges_ctx_t;

static int
dot_edge(VALUE callee, VALUE count, VALUE arg)
{
    edges_ctx_t *c = (edges_ctx_t *)arg;
    report_t *r = c->r;
    long to = strobe_report_frame_pos(r, callee, 1);
    if (to < 0 || !c->shown[to]) return ST_CONTINUE;
    uint64_t n = strobe_count_of(count, "an edge count");
    out_t *o = &r->out;
    out_mem(o, c->prefix, c->prefix_len);
    out_u64(o, (uint64_t)to, 0);
    OUT_LIT(o, " [label=\"");
    out_u64(o, n, 0);
    /* penwidth 1 + 4 * share, in hundredths (100 to 500): "d.dd" */
    double share = r->samples ? (double)n / (double)r->samples : 0.0;
    if (share > 1.0) share = 1.0; /* a malformed count; keeps the conversion defined */
    unsigned hundredths = 100 + (unsigned)(400.0 * share + 0.5);
    char width[4] = { (char)('0' + hundredths / 100), '.', (char)('0' + hundredths / 10 % 10),
                      (char)('0' + hundredths % 10) };
    OUT_LIT(o, "\", penwidth=");
    out_mem(o, width, sizeof(width));
    OUT_LIT(o, "];\n");
    return ST_CONTINUE;
}

static VALUE
graphviz_body(VALUE arg)
{
    report_args_t *a = (report_args_t *)arg;
    report_t *r = a->r;
    strobe_report_load(r, a->result, a->keep, 1);
    out_t *o = &r->out;
    uint64_t max_self = 1;
    for (long i = 0; i < r->len; i++) if (r->frames[i].self > max_self) max_self = r->frames[i].self;
    char *shown = r->scratch[0] = ALLOC_N(char, r->len ? r->len : 1);
    double floor = a->node_fraction * (double)r->samples;
    for (long i = 0; i < r->len; i++) shown[i] = (double)r->frames[i].total >= floor && r->frames[i].total > 0;

    OUT_LIT(o, "digraph profile {\n  node [shape=box, fontname=\"Helvetica\"];\n  edge [fontname=\"Helvetica\"];\n");
    for (long i = 0; i < r->len; i++) {
        const rframe_t *f = &r->frames[i];
        if (!shown[i]) continue;
        char tmp[64];
        OUT_LIT(o, "  f");
        out_u64(o, (uint64_t)i, 0);
        OUT_LIT(o, " [label=\"");
        strobe_out_shown(o, f->name, STROBE_SHOW_DOT);
        OUT_LIT(o, "\\n");
        out_u64(o, f->self, 0);
        OUT_LIT(o, " (");
        out_percent(o, f->self, r->samples);
        OUT_LIT(o, ") self\\n");
        out_u64(o, f->total, 0);
        OUT_LIT(o, " (");
        out_percent(o, f->total, r->samples);
        OUT_LIT(o, ") total\", fontsize=");
        int len = snprintf(tmp, sizeof(tmp), "%.1f", 10.0 + 30.0 * (double)f->self / (double)max_self);
        out_mem(o, tmp, (size_t)len);
        OUT_LIT(o, "];\n");
    }
    for (long i = 0; i < r->len; i++) {
        if (!shown[i] || NIL_P(r->frames[i].edges)) continue;
        edges_ctx_t c = { r, shown, i, "", 0 };
        c.prefix_len = (size_t)snprintf(c.prefix, sizeof(c.prefix), "  f%ld -> f", i);
        rb_hash_foreach(r->frames[i].edges, dot_edge, (VALUE)&c);
    }
    OUT_LIT(o, "}\n");
    return out_finish(o);
}

/* Strobe::Native.report_graphviz(result, keep, node_fraction) -> String:
 * a DOT call graph of the frames with at least node_fraction of all samples
 * in total, font size by self samples, edges labelled with their counts. */
static VALUE
native_report_graphviz(VALUE self, VALUE result, VALUE keep, VALUE node_fraction)
{
    report_args_t a = { NULL, result, keep, NUM2DBL(node_fraction) };
    return strobe_report_run(graphviz_body, &a, &a.r);
}

/* ---- callgrind ---------------------------------------------------------------------- */

/* "a b\n": two numbers on a line, the shape of callgrind's cost lines. */
static void
out_u64_pair(out_t *o, uint64_t a, uint64_t b)
{
    out_u64(o, a, 0);
    OUT_LIT(o, " ");
    out_u64(o, b, 0);
    OUT_LIT(o, "\n");
}

static void
out_callgrind_name(out_t *o, const char *key, size_t key_len, long pos, VALUE str, char *seen)
{
    out_mem(o, key, key_len);
    out_u64(o, (uint64_t)pos + 1, 0);
    OUT_LIT(o, ")");
    if (!seen[pos]) { /* name compression: the string only the first time */
        OUT_LIT(o, " ");
        /* a name ends its line: one with a newline must not end it early */
        if (RSTRING_LEN(str)) strobe_out_shown(o, str, STROBE_SHOW_FOLDED);
        else OUT_LIT(o, "(no file)"); /* GC pseudo-frames */
        seen[pos] = 1;
    }
    OUT_LIT(o, "\n");
}
/* key is a literal such as "cfn": written with its "=(" */
#define OUT_CALLGRIND_NAME(o, key, pos, str, seen) \
    out_callgrind_name((o), key "=(", sizeof(key "=(") - 1, (pos), (str), (seen))

typedef struct {
    report_t *r;
    long from;
    char *fn_seen, *fl_seen;
    long *file_of;           /* per frame position: the position of the first frame with its file */
} callgrind_ctx_t;

static int
callgrind_line(VALUE line, VALUE pair, VALUE arg)
{
    out_t *o = &((callgrind_ctx_t *)arg)->r->out;
    if (!FIXNUM_P(line) || FIX2LONG(line) < 0) return ST_CONTINUE;
    if (!RB_TYPE_P(pair, T_ARRAY) || RARRAY_LEN(pair) < 2) CORRUPT("a lines entry is not [total, self]");
    uint64_t self = strobe_count_of(RARRAY_AREF(pair, 1), "a line's self count");
    if (self) out_u64_pair(o, (uint64_t)FIX2LONG(line), self);
    return ST_CONTINUE;
}

static int
callgrind_call(VALUE callee, VALUE count, VALUE arg)
{
    callgrind_ctx_t *c = (callgrind_ctx_t *)arg;
    report_t *r = c->r;
    long to = strobe_report_frame_pos(r, callee, 1);
    if (to < 0) return ST_CONTINUE;
    uint64_t n = strobe_count_of(count, "an edge count");
    out_t *o = &r->out;
    const rframe_t *caller = &r->frames[c->from], *f = &r->frames[to];
    if (c->file_of[to] != c->file_of[c->from])
        OUT_CALLGRIND_NAME(o, "cfl", c->file_of[to], f->file, c->fl_seen);
    OUT_CALLGRIND_NAME(o, "cfn", to, f->name, c->fn_seen);
    OUT_LIT(o, "calls=");
    out_u64_pair(o, n, f->line > 0 ? (uint64_t)f->line : 0);
    out_u64_pair(o, caller->line > 0 ? (uint64_t)caller->line : 0, n);
    return ST_CONTINUE;
}

static VALUE
callgrind_body(VALUE arg)
{
    report_args_t *a = (report_args_t *)arg;
    report_t *r = a->r;
    strobe_report_load(r, a->result, a->keep, 1);
    out_t *o = &r->out;
    long n = r->len ? r->len : 1;
    callgrind_ctx_t c = { r, 0, r->scratch[0] = ALLOC_N(char, n), r->scratch[1] = ALLOC_N(char, n),
                          r->scratch[2] = ALLOC_N(long, n) };
    memset(c.fn_seen, 0, (size_t)n);
    memset(c.fl_seen, 0, (size_t)n);
    /* One id per file: the position of its first frame. */
    VALUE files = rb_hash_new();
    for (long i = 0; i < r->len; i++) {
        VALUE first = rb_hash_lookup2(files, r->frames[i].file, Qundef);
        if (first == Qundef) {
            first = LONG2FIX(i);
            rb_hash_aset(files, r->frames[i].file, first);
        }
        c.file_of[i] = FIX2LONG(first);
    }
    OUT_LIT(o, "# callgrind format\nversion: 1\ncreator: strobe\npositions: line\nevents: Samples\nsummary: ");
    out_u64(o, r->samples, 0);
    OUT_LIT(o, "\n");
    for (long i = 0; i < r->len; i++) {
        const rframe_t *f = &r->frames[i];
        c.from = i;
        OUT_LIT(o, "\n");
        OUT_CALLGRIND_NAME(o, "fl", c.file_of[i], f->file, c.fl_seen);
        OUT_CALLGRIND_NAME(o, "fn", i, f->name, c.fn_seen);
        if (!NIL_P(f->lines)) rb_hash_foreach(f->lines, callgrind_line, (VALUE)&c);
        else if (f->self) out_u64_pair(o, f->line > 0 ? (uint64_t)f->line : 0, f->self);
        if (!NIL_P(f->edges)) rb_hash_foreach(f->edges, callgrind_call, (VALUE)&c);
    }
    RB_GC_GUARD(files);
    return out_finish(o);
}

/* Strobe::Native.report_callgrind(result, keep) -> String in the callgrind
 * format (KCachegrind, callgrind_annotate): self samples per line, calls
 * with their inclusive samples. */
REPORT_METHOD(callgrind)

void
strobe_report_callgraph_define(VALUE mNative)
{
    rb_define_singleton_method(mNative, "report_graphviz", native_report_graphviz, 3);
    rb_define_singleton_method(mNative, "report_callgrind", native_report_callgrind, 2);
}
