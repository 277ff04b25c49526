/*
 * report.c - the report engine: the per-frame and per-sample work of every
 * report, in C, on a result Hash (stackprof's shape).
 *
 * A report loads the result's frames into a flat array (report_load),
 * keeping only the frames a filter lets through (a Hash of kept frame ids,
 * or nil for all), with a frame id -> position table. On it:
 *   - text rows: sorted by self (or total) samples, formatted in one buffer;
 *   - Graphviz and callgrind output from the frames' edges and lines, and a
 *     method's frames with their callers;
 *   - a stack tree from the raw samples: each raw stack is interned into a
 *     prefix tree of frames (lines ignored), reusing the previous stack's
 *     common part, with per-node self and total counts and the time-ordered
 *     leaf nodes, run-length encoded. Frames a filter drops are left out of
 *     the stacks (their samples go to the nearest kept caller). Folded
 *     stacks and the flamegraph data come from it.
 * Output goes into Ruby Strings; numbers written per line are formatted by
 * hand.
 *
 * Every id and count read from the result is checked: malformed data raises
 * Strobe::ProfileError. GVL held; not signal-safe.
 */
#include "report.h"
#include <stdlib.h>
#include <stdio.h>

static VALUE sym_native, sym_name, sym_file, sym_line, sym_total_samples, sym_samples, sym_edges, sym_lines,
    sym_frames, sym_raw;

/* ---- loading ---------------------------------------------------------------- */

/* *sum += n, or ProfileError when counts that large cannot be right. */
static inline void
add_count(uint64_t *sum, uint64_t n)
{
    if (__builtin_add_overflow(*sum, n, sum)) CORRUPT("sample counts add up to more than 2**64");
}

uint64_t
strobe_count_of(VALUE v, const char *what)
{
    if (NIL_P(v)) return 0;
    if (FIXNUM_P(v) && FIX2LONG(v) >= 0) return (uint64_t)FIX2LONG(v);
    if (RB_TYPE_P(v, T_BIGNUM) && RTEST(rb_funcall(v, rb_intern(">="), 1, INT2FIX(0))) &&
        rb_absint_size(v, NULL) <= sizeof(uint64_t))
        return NUM2ULL(v);
    CORRUPT("%s is not a non-negative integer: %+"PRIsVALUE, what, v);
}

static int
load_frame(VALUE id, VALUE frame, VALUE arg)
{
    report_t *r = (report_t *)arg;
    if (!FIXNUM_P(id)) CORRUPT("frame id %+"PRIsVALUE" is not an integer", id);
    if (!NIL_P(r->keep) && !RTEST(rb_hash_lookup2(r->keep, id, Qfalse))) {
        if (r->index) st_insert(r->index, (st_data_t)id, 0); /* known, dropped by the filter */
        return ST_CONTINUE;
    }
    if (!RB_TYPE_P(frame, T_HASH)) CORRUPT("frame %+"PRIsVALUE" is not a Hash", id);
    if (r->len == r->capa) {
        r->capa = r->capa ? r->capa * 2 : 256;
        REALLOC_N(r->frames, rframe_t, r->capa);
    }
    rframe_t *f = &r->frames[r->len];
    /* Visible to report_mark before anything below allocates. */
    f->id = id;
    f->name = f->file = f->edges = f->lines = Qnil;
    r->len++;
    f->name = rb_hash_lookup2(frame, sym_name, Qnil);
    if (!RB_TYPE_P(f->name, T_STRING)) f->name = rb_obj_as_string(f->name);
    f->total = strobe_count_of(rb_hash_lookup2(frame, sym_total_samples, Qnil), "total_samples");
    f->self = strobe_count_of(rb_hash_lookup2(frame, sym_samples, Qnil), "samples");
    f->line = -1;
    f->native = 0;
    if (r->details) {
        f->native = RTEST(rb_hash_lookup2(frame, sym_native, Qfalse));
        f->file = rb_hash_lookup2(frame, sym_file, Qnil);
        if (!RB_TYPE_P(f->file, T_STRING)) f->file = NIL_P(f->file) ? rb_str_new(0, 0) : rb_obj_as_string(f->file);
        VALUE line = rb_hash_lookup2(frame, sym_line, Qnil);
        f->line = FIXNUM_P(line) ? FIX2LONG(line) : -1;
        f->edges = rb_hash_lookup2(frame, sym_edges, Qnil);
        f->lines = rb_hash_lookup2(frame, sym_lines, Qnil);
        if (!NIL_P(f->edges) && !RB_TYPE_P(f->edges, T_HASH)) CORRUPT("edges of frame %+"PRIsVALUE" is not a Hash", id);
        if (!NIL_P(f->lines) && !RB_TYPE_P(f->lines, T_HASH)) CORRUPT("lines of frame %+"PRIsVALUE" is not a Hash", id);
    }
    if (r->index) st_insert(r->index, (st_data_t)id, (st_data_t)r->len); /* position + 1 */
    return ST_CONTINUE;
}

void
strobe_report_load(report_t *r, VALUE result, VALUE keep, int details)
{
    if (!RB_TYPE_P(result, T_HASH)) CORRUPT("not a result Hash");
    if (!NIL_P(keep)) Check_Type(keep, T_HASH);
    VALUE frames = rb_hash_lookup2(result, sym_frames, Qnil);
    if (!RB_TYPE_P(frames, T_HASH)) CORRUPT("the result has no frames Hash");
    r->result = result;
    r->keep = keep;
    r->details = details;
    if (details) r->index = st_init_numtable(); /* text needs no lookups by id */
    r->samples = strobe_count_of(rb_hash_lookup2(result, sym_samples, Qnil), "samples");
    r->capa = (long)RHASH_SIZE(frames) + 1; /* sized once: no copies as it fills */
    r->frames = ALLOC_N(rframe_t, r->capa);
    rb_hash_foreach(frames, load_frame, (VALUE)r);
}

/* The report's VALUEs live in C memory (frames' names, files, edges and
 * lines, some of them Strings made here): a hidden object marks them while
 * the report runs, with rb_gc_mark, which also pins them against
 * compaction, since their addresses are held. */
static void
report_mark(void *ptr)
{
    const report_t *r = ptr;
    if (!r) return;
    rb_gc_mark(r->result);
    rb_gc_mark(r->keep);
    if (r->out.str) rb_gc_mark(r->out.str);
    if (r->out.sink) rb_gc_mark(r->out.sink);
    for (size_t i = 0; i < sizeof(r->pinned) / sizeof(r->pinned[0]); i++)
        if (r->pinned[i]) rb_gc_mark(r->pinned[i]);
    /* pinned[2] is an Array whose elements C memory holds too (the Firefox
     * export's marker types and keys): each one pinned, not just the Array. */
    if (r->pinned[2] && RB_TYPE_P(r->pinned[2], T_ARRAY))
        for (long i = 0; i < RARRAY_LEN(r->pinned[2]); i++) rb_gc_mark(RARRAY_AREF(r->pinned[2], i));
    if (r->samples_read) rb_gc_mark(r->samples_read->thread_ids);
    for (long i = 0; i < r->len; i++) {
        rb_gc_mark(r->frames[i].name);
        rb_gc_mark(r->frames[i].file);
        rb_gc_mark(r->frames[i].edges);
        rb_gc_mark(r->frames[i].lines);
    }
}

static const rb_data_type_t holder_type = {
    .wrap_struct_name = "Strobe::Native::ReportHolder",
    .function = { .dmark = report_mark },
};

static VALUE
report_free(VALUE arg)
{
    report_t *r = (report_t *)arg;
    DATA_PTR(r->holder) = NULL; /* the holder may outlive this C frame */
    xfree(r->frames);
    if (r->index) st_free_table(r->index);
    if (r->children) st_free_table(r->children);
    xfree(r->parent); xfree(r->frame); xfree(r->self); xfree(r->total);
    xfree(r->runs_node); xfree(r->runs_count);
    xfree(r->prev_ids); xfree(r->path);
    for (int i = 0; i < 8; i++) xfree(r->scratch[i]);
    if (r->samples_read) strobe_samples_free(r->samples_read);
    if (r->cleanup) r->cleanup(r->cleanup_arg);
    return Qnil;
}

/* Position of a kept frame; -1 for a frame the filter dropped, or for one
 * not in frames when unknown_ok (edges to nowhere are skipped; raw samples
 * must name real frames). */
long
strobe_report_frame_pos(const report_t *r, VALUE id, int unknown_ok)
{
    st_data_t pos;
    if (FIXNUM_P(id) && st_lookup(r->index, (st_data_t)id, &pos)) return (long)pos - 1;
    if (!unknown_ok) CORRUPT("raw refers to frame %+"PRIsVALUE" that is not in frames", id);
    return -1;
}

/* ---- formatting --------------------------------------------------------------- */

/* 100 * count / samples with one decimal, into buf (at least 32 bytes),
 * exactly as Ruby's format("%.1f", 100.0 * count / samples) writes it;
 * returns the length. The tenths are count * 1000 / samples rounded in
 * integers, which is what printf makes of the double unless the exact
 * value is a tie (there the double's own rounding error decides, so printf
 * is asked). */
static int
format_percent(char *buf, uint64_t count, uint64_t samples)
{
    uint64_t tenths = 0, rem = 0;
    if (samples && count <= UINT64_MAX / 1000) {
        tenths = count * 1000 / samples;
        rem = count * 1000 % samples;
    }
    if (!samples || count > UINT64_MAX / 1000 || rem > UINT64_MAX / 2 || rem * 2 == samples)
        return snprintf(buf, 32, "%.1f", samples ? 100.0 * (double)count / (double)samples : 0.0);
    if (rem * 2 > samples) tenths++;
    uint64_t whole = tenths / 10;
    int digits = 1;
    for (uint64_t w = whole; w >= 10; w /= 10) digits++;
    char *p = buf + digits;
    p[0] = '.';
    p[1] = (char)('0' + tenths % 10);
    do { *--p = (char)('0' + whole % 10); whole /= 10; } while (whole);
    return digits + 2;
}

/* "(12.3%)" right-aligned in 8 columns, as Ruby's
 * format("%8s", format("(%2.1f%%)", 100.0 * count / samples)). */
static void
out_pct(out_t *o, uint64_t count, uint64_t samples)
{
    char tmp[48];
    memset(tmp, ' ', 8);
    char *p = tmp + 8;
    *p++ = '(';
    p += format_percent(p, count, samples);
    *p++ = '%';
    *p++ = ')';
    size_t len = (size_t)(p - (tmp + 8));
    out_reserve(o, 8 + len);
    if (len <= 8) {
        memcpy(o->buf + o->len, p - 8, 8); /* padded on the left: one fixed-size copy */
        o->len += 8;
    } else {
        memcpy(o->buf + o->len, tmp + 8, len);
        o->len += len;
    }
}

/* Runs body(args) with a fresh report (*slot), freeing it however body ends. */
VALUE
strobe_report_run(VALUE (*body)(VALUE), void *args, report_t **slot)
{
    report_t r;
    memset(&r, 0, sizeof(r));
    r.result = r.keep = Qnil;
    r.holder = TypedData_Wrap_Struct(0, &holder_type, &r);
    *slot = &r;
    VALUE out = rb_ensure(body, (VALUE)args, report_free, (VALUE)&r);
    RB_GC_GUARD(r.holder);
    return out;
}

typedef struct {
    report_t *r;
    VALUE (*body)(report_t *r);
    const char *what;
    VALUE result, keep, sink;
} export_args_t;

static VALUE
export_body(VALUE arg)
{
    export_args_t *a = (export_args_t *)arg;
    strobe_report_load(a->r, a->result, a->keep, 1);
    strobe_samples_read(a->r, a->what);
    a->r->out.sink = NIL_P(a->sink) ? 0 : a->sink;
    return a->body(a->r);
}

VALUE
strobe_export(VALUE (*body)(report_t *r), const char *what, VALUE result, VALUE keep, VALUE sink)
{
    export_args_t a = { NULL, body, what, result, keep, sink };
    return strobe_report_run(export_body, &a, &a.r);
}

/* Strobe::Native.export_<name>(result, keep, sink) -> the export (a String,
 * binary for pprof), or sink after writing it there in chunks. */
#define EXPORT_METHOD(name, what)                                            \
    static VALUE                                                             \
    native_export_##name(VALUE self, VALUE result, VALUE keep, VALUE sink)   \
    {                                                                        \
        return strobe_export(strobe_##name##_body, what, result, keep, sink); \
    }
EXPORT_METHOD(pprof, "pprof output")
EXPORT_METHOD(firefox, "Firefox Profiler output")
EXPORT_METHOD(speedscope, "speedscope output")



/* Strobe::Native.report_<name>(result, keep): runs <name>_body on a report
 * of result filtered by keep. */
#define REPORT_METHOD(name)                                          \
    static VALUE                                                     \
    native_report_##name(VALUE self, VALUE result, VALUE keep)       \
    {                                                                \
        report_args_t a = { NULL, result, keep, 0 };                 \
        return strobe_report_run(name##_body, &a, &a.r);                    \
    }

/* ---- text ------------------------------------------------------------------------ */

/* A row of the text table: what it sorts by and everything it prints,
 * flat, so neither sorting nor writing goes back to the frames. */
typedef struct {
    uint64_t count;          /* the column sorted by */
    uint64_t other;          /* the other column */
    const char *name;
    long name_len;
    long id;                 /* the frame id (a Fixnum), last tie-break */
    uint64_t head;           /* while sorting ties: 8 name bytes after the shared prefix */
} row_key_t;

/* Big-endian load of up to 8 bytes (zero-padded): compares like memcmp. */
static inline uint64_t
load_be(const char *p, size_t n)
{
    uint64_t v = 0;
    if (n >= 8) {
        memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        v = __builtin_bswap64(v);
#endif
        return v;
    }
    for (size_t i = 0; i < 8; i++) v = v << 8 | (i < n ? (unsigned char)p[i] : 0);
    return v;
}

/* Within equal counts: by name, then frame id, so output is stable. Names
 * are compared from skip on (a prefix all rows of the group share): first
 * the 8 bytes kept in head, then eight bytes at a time. */
static inline int
row_cmp(const row_key_t *a, const row_key_t *b, size_t skip)
{
    if (a->head != b->head) return a->head < b->head ? -1 : 1;
    size_t n = (size_t)(a->name_len < b->name_len ? a->name_len : b->name_len);
    for (size_t i = skip + 8; i < n; i += 8) {
        uint64_t x = load_be(a->name + i, n - i), y = load_be(b->name + i, n - i);
        if (x != y) return x < y ? -1 : 1;
    }
    if (a->name_len != b->name_len) return a->name_len < b->name_len ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* Length of the name prefix all n keys share; sets each key's head to the
 * 8 bytes after it (zero-padded: a name that ends there sorts first, and
 * one continuing with zero bytes is told apart by row_cmp's length check). */
static size_t
common_prefix(row_key_t *keys, size_t n)
{
    size_t lcp = (size_t)keys[0].name_len;
    for (size_t i = 1; i < n && lcp; i++) {
        size_t j = 0, m = (size_t)keys[i].name_len < lcp ? (size_t)keys[i].name_len : lcp;
        while (j < m && keys[i].name[j] == keys[0].name[j]) j++;
        lcp = j;
    }
    for (size_t i = 0; i < n; i++) keys[i].head = load_be(keys[i].name + lcp, (size_t)keys[i].name_len - lcp);
    return lcp;
}

/* Sorts keys[0..n) by row_cmp: insertion sort for short runs, merging
 * through tmp above. */
static void
sort_ties(row_key_t *keys, row_key_t *tmp, size_t n, size_t skip)
{
    if (n <= 12) {
        for (size_t i = 1; i < n; i++) {
            row_key_t k = keys[i];
            size_t j = i;
            while (j > 0 && row_cmp(&k, &keys[j - 1], skip) < 0) { keys[j] = keys[j - 1]; j--; }
            keys[j] = k;
        }
        return;
    }
    size_t half = n / 2;
    sort_ties(keys, tmp, half, skip);
    sort_ties(keys + half, tmp, n - half, skip);
    if (row_cmp(&keys[half - 1], &keys[half], skip) <= 0) return; /* already in order */
    memcpy(tmp, keys, half * sizeof(row_key_t));
    size_t i = 0, j = half, k = 0;
    while (i < half && j < n) keys[k++] = row_cmp(&keys[j], &tmp[i], skip) < 0 ? keys[j++] : tmp[i++];
    while (i < half) keys[k++] = tmp[i++];
}

/* Most samples first, then row_cmp; returns the sorted array, keys or tmp.
 * Counts are sorted without comparisons (a stable radix sort, 8 bits a
 * pass, as many passes as the largest count needs, between the two
 * arrays); only rows of equal count are compared. */
static row_key_t *
sort_rows(row_key_t *keys, row_key_t *tmp, size_t n)
{
    uint64_t max = 0;
    for (size_t i = 0; i < n; i++) if (keys[i].count > max) max = keys[i].count;
    size_t bucket[256];
    for (int shift = 0; shift < 64 && (max >> shift); shift += 8) {
        memset(bucket, 0, sizeof(bucket));
        for (size_t i = 0; i < n; i++) bucket[0xff - ((keys[i].count >> shift) & 0xff)]++; /* descending */
        size_t sum = 0;
        for (size_t d = 0; d < 256; d++) { size_t c = bucket[d]; bucket[d] = sum; sum += c; }
        for (size_t i = 0; i < n; i++) tmp[bucket[0xff - ((keys[i].count >> shift) & 0xff)]++] = keys[i];
        row_key_t *t = keys; keys = tmp; tmp = t;
    }
    for (size_t start = 0; start < n;) {
        size_t end = start + 1;
        while (end < n && keys[end].count == keys[start].count) end++;
        if (end - start > 1) sort_ties(keys + start, tmp, end - start, common_prefix(keys + start, end - start));
        start = end;
    }
    return keys;
}

typedef struct {
    report_t *r;
    VALUE result, keep;
    int sort_by_total;
    long limit;
} text_args_t;

static VALUE
text_body(VALUE arg)
{
    text_args_t *a = (text_args_t *)arg;
    report_t *r = a->r;
    strobe_report_load(r, a->result, a->keep, 0);
    row_key_t *keys = r->scratch[0] = ALLOC_N(row_key_t, r->len ? r->len : 1);
    for (long i = 0; i < r->len; i++) {
        rframe_t *f = &r->frames[i];
        /* A name in another encoding than UTF-8 is written converted (rows
         * are written from the bytes sorted on); r marks the copy. */
        f->name = strobe_shown_utf8(f->name);
        keys[i] = (row_key_t){ a->sort_by_total ? f->total : f->self, a->sort_by_total ? f->self : f->total,
                               RSTRING_PTR(f->name), RSTRING_LEN(f->name), FIX2LONG(f->id), 0 };
    }
    keys = sort_rows(keys, r->scratch[1] = ALLOC_N(row_key_t, r->len ? r->len : 1), (size_t)r->len);
    long n = a->limit >= 0 && a->limit < r->len ? a->limit : r->len;
    out_t *o = &r->out;
    size_t size = 0; /* each row is 43 bytes and its name, unless counts are huge */
    for (long i = 0; i < n; i++) size += 43 + (size_t)keys[i].name_len;
    out_reserve(o, size);
    for (long i = 0; i < n; i++) {
        const row_key_t *k = &keys[i];
        uint64_t total = a->sort_by_total ? k->count : k->other, self = a->sort_by_total ? k->other : k->count;
        out_u64(o, total, 10);
        OUT_LIT(o, " ");
        out_pct(o, total, r->samples);
        OUT_LIT(o, "  ");
        out_u64(o, self, 10);
        OUT_LIT(o, " ");
        out_pct(o, self, r->samples);
        OUT_LIT(o, "     ");
        strobe_out_shown_bytes(o, k->name, k->name_len, STROBE_SHOW_TEXT);
        OUT_LIT(o, "\n");
    }
    return out_finish(o);
}

/* Strobe::Native.report_text(result, keep, sort_by_total, limit) -> String:
 * the frame rows of the text report ("%10d %8s  %10d %8s     %s\n"). */
static VALUE
native_report_text(VALUE self, VALUE result, VALUE keep, VALUE sort_by_total, VALUE limit)
{
    text_args_t a = { NULL, result, keep, RTEST(sort_by_total), NIL_P(limit) ? -1 : NUM2LONG(limit) };
    return strobe_report_run(text_body, &a, &a.r);
}

/* ---- the stack tree ------------------------------------------------------------ */

void
strobe_report_tree_init(report_t *r)
{
    r->children = st_init_numtable();
    r->nodes_capa = 1024;
    r->parent = ALLOC_N(uint32_t, r->nodes_capa);
    r->frame = ALLOC_N(uint32_t, r->nodes_capa);
    r->self = ALLOC_N(uint64_t, r->nodes_capa);
    r->parent[0] = UINT32_MAX;
    r->frame[0] = UINT32_MAX;
    r->self[0] = 0;
    r->nodes = 1;
}

void
strobe_report_tree_totals(report_t *r)
{
    r->total = ALLOC_N(uint64_t, r->nodes);
    memcpy(r->total, r->self, sizeof(uint64_t) * r->nodes);
    for (uint32_t n = r->nodes; n-- > 1;) add_count(&r->total[r->parent[n]], r->total[n]);
}

uint32_t
strobe_report_tree_child(report_t *r, uint32_t parent, uint32_t frame)
{
    st_data_t key = ((st_data_t)parent << 32) | frame, node;
    if (st_lookup(r->children, key, &node)) return (uint32_t)node;
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
    st_insert(r->children, key, n);
    return n;
}

static void
tree_run(report_t *r, uint32_t node, uint64_t count)
{
    if (r->runs && r->runs_node[r->runs - 1] == node) {
        add_count(&r->runs_count[r->runs - 1], count);
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

/* Interns every raw stack (root first, [depth, ids..., count] each) into
 * the tree. A stack shares the previous one's path up to the first level
 * whose frame id differs, so only the rest is looked up. */
void
strobe_report_tree(report_t *r)
{
    VALUE raw = rb_hash_lookup2(r->result, sym_raw, Qnil);
    if (!RB_TYPE_P(raw, T_ARRAY))
        CORRUPT("this report needs per-sample data: profile with raw: true (strobe run --raw)");
    strobe_report_tree_init(r);

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
            if (pos >= 0) node = strobe_report_tree_child(r, node, (uint32_t)pos);
            r->prev_ids[k] = id;
            r->path[k + 1] = node;
        }
        prev_depth = depth;
        add_count(&r->self[node], (uint64_t)count);
        if (count) tree_run(r, node, (uint64_t)count);
        if (r->sample_node) {
            if ((uint64_t)count > r->sample_nodes - sampled) CORRUPT("raw has more samples than it had");
            for (long c = 0; c < count; c++) r->sample_node[sampled++] = node;
        }
        i += depth + 2;
    }
    if (r->sample_node && sampled != r->sample_nodes) CORRUPT("raw has fewer samples than it had");

    strobe_report_tree_totals(r);
}

typedef struct {
    report_t *r;
    VALUE result, keep;
    double node_fraction;
} report_args_t;

VALUE
strobe_u32_array(const uint32_t *v, size_t n, int root_as_minus_one)
{
    VALUE a = rb_ary_new_capa((long)n);
    for (size_t i = 0; i < n; i++)
        rb_ary_push(a, root_as_minus_one && v[i] == UINT32_MAX ? INT2FIX(-1) : UINT2NUM(v[i]));
    return a;
}

VALUE
strobe_u64_array(const uint64_t *v, size_t n)
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
    rb_hash_aset(h, ID2SYM(rb_intern("parent")), strobe_u32_array(r->parent, r->nodes, 1));
    rb_hash_aset(h, ID2SYM(rb_intern("frame")), strobe_u32_array(r->frame, r->nodes, 1));
    rb_hash_aset(h, ID2SYM(rb_intern("self")), strobe_u64_array(r->self, r->nodes));
    rb_hash_aset(h, ID2SYM(rb_intern("total")), strobe_u64_array(r->total, r->nodes));
    return h;
}

static VALUE
tree_body(VALUE arg)
{
    report_args_t *a = (report_args_t *)arg;
    report_t *r = a->r;
    strobe_report_load(r, a->result, a->keep, 1);
    strobe_report_tree(r);
    VALUE h = strobe_report_tree_hash(r);
    rb_hash_aset(h, ID2SYM(rb_intern("run_nodes")), strobe_u32_array(r->runs_node, r->runs, 0));
    rb_hash_aset(h, ID2SYM(rb_intern("run_counts")), strobe_u64_array(r->runs_count, r->runs));
    return h;
}

static VALUE
flamegraph_body(VALUE arg)
{
    report_args_t *a = (report_args_t *)arg;
    strobe_report_load(a->r, a->result, a->keep, 1);
    return strobe_flamegraph_body(a->r);
}

/* Strobe::Native.flamegraph_data(result, keep): see flamegraph.c. */
REPORT_METHOD(flamegraph)

/* Strobe::Native.report_tree(result, keep) -> {frame_ids:, parent:, frame:,
 * self:, total:, run_nodes:, run_counts:}: the stack tree of the raw
 * samples (node 0 the root, parent -1; frame indexes frame_ids) and the
 * samples in time order as runs of leaf nodes. */
REPORT_METHOD(tree)

/* ---- folded stacks --------------------------------------------------------------- */

static VALUE
folded_body(VALUE arg)
{
    report_args_t *a = (report_args_t *)arg;
    report_t *r = a->r;
    strobe_report_load(r, a->result, a->keep, 1);
    strobe_report_tree(r);
    out_t *o = &r->out;
    /* Each frame's name as written, fixed up once (rarely needed): ';'
     * separates frames, so it is written ':'; a newline would end the line,
     * so it is escaped, with every other control character. */
    VALUE names = rb_ary_new_capa(r->len);
    for (long i = 0; i < r->len; i++) {
        VALUE name = r->frames[i].name;
        if (!strobe_shown_as_is(name, STROBE_SHOW_FOLDED)) {
            out_t fixed = { 0 };
            strobe_out_shown(&fixed, name, STROBE_SHOW_FOLDED);
            name = out_finish(&fixed);
        }
        rb_ary_push(names, name);
    }
    uint32_t stack_capa = 64;
    uint32_t *stack = r->scratch[0] = ALLOC_N(uint32_t, stack_capa); /* each node's path */
    for (uint32_t n = 1; n < r->nodes; n++) {
        if (!r->self[n]) continue;
        uint32_t depth = 0;
        for (uint32_t m = n; m; m = r->parent[m]) {
            if (depth == stack_capa) {
                REALLOC_N(stack, uint32_t, stack_capa *= 2);
                r->scratch[0] = stack;
            }
            stack[depth++] = r->frame[m];
        }
        while (depth--) {
            out_str(o, RARRAY_AREF(names, stack[depth]));
            if (depth) OUT_LIT(o, ";");
        }
        OUT_LIT(o, " ");
        out_u64(o, r->self[n], 0);
        OUT_LIT(o, "\n");
    }
    RB_GC_GUARD(names);
    return out_finish(o);
}

/* folded_body with its lines going to a sink (0: none). */
typedef struct {
    report_args_t base;      /* first: folded_body reads it as its arguments */
    VALUE sink;
} folded_args_t;

static VALUE
folded_to_sink(VALUE arg)
{
    folded_args_t *f = (folded_args_t *)arg;
    f->base.r->out.sink = f->sink;
    return folded_body((VALUE)&f->base);
}

/* Strobe::Native.report_folded(result, keep, sink = nil) -> one line per
 * distinct stack, "root;...;leaf count", as flamegraph.pl, inferno and
 * speedscope read them: a String, or sink after handing it the lines in
 * chunks. A line names every frame of its stack, so the lines of deep
 * stacks with long names can be far larger than the profile (a 27 KB file,
 * within the loader's limit, made 16 GB of them): a sink never holds them
 * in memory whole. */
static VALUE
native_report_folded(int argc, VALUE *argv, VALUE self)
{
    VALUE result, keep, sink;
    rb_scan_args(argc, argv, "21", &result, &keep, &sink);
    folded_args_t f = { { NULL, result, keep, 0 }, NIL_P(sink) ? 0 : sink };
    VALUE out = strobe_report_run(folded_to_sink, &f, &f.base.r);
    RB_GC_GUARD(sink);
    return out;
}

/* ---- Graphviz ------------------------------------------------------------------- */

/* "12.3%" */
static void
out_percent(out_t *o, uint64_t count, uint64_t samples)
{
    char tmp[40];
    int len = format_percent(tmp, count, samples);
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

/* ---- files --------------------------------------------------------------------------- */

static VALUE
files_body(VALUE arg)
{
    report_args_t *a = (report_args_t *)arg;
    report_t *r = a->r;
    strobe_report_load(r, a->result, a->keep, 1);
    strobe_report_tree(r);
    /* One number per distinct file, in order of first appearance. */
    VALUE ids = rb_hash_new(), names = rb_ary_new();
    long *file_of_frame = r->scratch[0] = ALLOC_N(long, r->len ? r->len : 1);
    for (long i = 0; i < r->len; i++) {
        VALUE id = rb_hash_lookup2(ids, r->frames[i].file, Qundef);
        if (id == Qundef) {
            id = LONG2FIX(RARRAY_LEN(names));
            rb_hash_aset(ids, r->frames[i].file, id);
            rb_ary_push(names, r->frames[i].file);
        }
        file_of_frame[i] = FIX2LONG(id);
    }
    long nfiles = RARRAY_LEN(names);
    uint64_t *totals = r->scratch[1] = ALLOC_N(uint64_t, 2 * (nfiles ? nfiles : 1));
    memset(totals, 0, sizeof(uint64_t) * 2 * (size_t)(nfiles ? nfiles : 1));
    /* A sample counts once per file: at the file's outermost frame on its
     * stack. Depth first over the tree with, per file, how many of its
     * frames are on the current path: O(nodes) whatever the depth. Children
     * in CSR form: first[n]..first[n + 1] in kids. parent < child always. */
    uint32_t nn = r->nodes;
    uint32_t *work = r->scratch[2] = ALLOC_N(uint32_t, 4 * (size_t)nn + 2);
    uint32_t *first = work, *kids = work + nn + 1, *stack = kids + nn, *next = stack + nn;
    memset(first, 0, sizeof(uint32_t) * (nn + 1));
    for (uint32_t n = 1; n < nn; n++) first[r->parent[n] + 1]++;
    for (uint32_t n = 0; n < nn; n++) first[n + 1] += first[n];
    memcpy(next, first, sizeof(uint32_t) * nn);
    for (uint32_t n = 1; n < nn; n++) kids[next[r->parent[n]]++] = n;
    long *on_path = r->scratch[3] = ALLOC_N(long, nfiles ? nfiles : 1);
    memset(on_path, 0, sizeof(long) * (size_t)(nfiles ? nfiles : 1));
    /* next[] now walks each node's children; a node is on the stack while
     * its subtree is visited. */
    memcpy(next, first, sizeof(uint32_t) * nn);
    uint32_t sp = 0;
    stack[sp++] = 0;
    while (sp) {
        uint32_t n = stack[sp - 1];
        if (next[n] < first[n + 1]) {
            uint32_t c = kids[next[n]++];
            long file = file_of_frame[r->frame[c]];
            add_count(&totals[2 * file + 1], r->self[c]);
            if (on_path[file]++ == 0) add_count(&totals[2 * file], r->total[c]);
            stack[sp++] = c;
        } else {
            if (n) on_path[file_of_frame[r->frame[n]]]--;
            sp--;
        }
    }
    VALUE out = rb_ary_new_capa(nfiles);
    for (long f = 0; f < nfiles; f++)
        rb_ary_push(out, rb_ary_new_from_args(3, RARRAY_AREF(names, f), ULL2NUM(totals[2 * f]), ULL2NUM(totals[2 * f + 1])));
    RB_GC_GUARD(ids);
    return out;
}

/* Strobe::Native.report_files(result, keep) -> [[file, total, self], ...]:
 * per source file, the samples with one of its frames anywhere on the
 * stack (once per sample) and with one on top. Needs raw data. */
REPORT_METHOD(files)

/* ---- a method's frames and callers ------------------------------------------------- */

typedef struct {
    VALUE keep, pattern;     /* String (exact name) or Regexp */
    VALUE matches;           /* [[id, {caller id => count}], ...] */
} method_ctx_t;

static int
kept(VALUE keep, VALUE id)
{
    return NIL_P(keep) || RTEST(rb_hash_lookup2(keep, id, Qfalse));
}

static int
method_match(VALUE id, VALUE frame, VALUE arg)
{
    method_ctx_t *m = (method_ctx_t *)arg;
    if (!RB_TYPE_P(frame, T_HASH) || !kept(m->keep, id)) return ST_CONTINUE;
    VALUE name = rb_hash_lookup2(frame, sym_name, Qnil);
    if (!RB_TYPE_P(name, T_STRING)) return ST_CONTINUE;
    int hit = RB_TYPE_P(m->pattern, T_REGEXP) ? !NIL_P(rb_reg_match(m->pattern, name))
                                               : rb_str_equal(name, m->pattern) == Qtrue;
    if (hit) rb_ary_push(m->matches, rb_ary_new_from_args(2, id, rb_hash_new()));
    return ST_CONTINUE;
}

static int
method_callers(VALUE id, VALUE frame, VALUE arg)
{
    method_ctx_t *m = (method_ctx_t *)arg;
    if (!RB_TYPE_P(frame, T_HASH) || !kept(m->keep, id)) return ST_CONTINUE;
    VALUE edges = rb_hash_lookup2(frame, sym_edges, Qnil);
    if (!RB_TYPE_P(edges, T_HASH)) return ST_CONTINUE;
    for (long k = 0; k < RARRAY_LEN(m->matches); k++) {
        VALUE match = RARRAY_AREF(m->matches, k);
        VALUE count = rb_hash_lookup2(edges, RARRAY_AREF(match, 0), Qundef);
        if (count != Qundef) rb_hash_aset(RARRAY_AREF(match, 1), id, count);
    }
    return ST_CONTINUE;
}

/* Strobe::Native.report_method(result, keep, pattern) -> [[id, {caller id
 * => count}], ...]: the kept frames whose name equals pattern (a String) or
 * matches it (a Regexp), each with its kept callers. Two passes over the
 * frames, reading only names and then edges. */
static VALUE
native_report_method(VALUE self, VALUE result, VALUE keep, VALUE pattern)
{
    if (!RB_TYPE_P(pattern, T_REGEXP)) StringValue(pattern);
    if (!NIL_P(keep)) Check_Type(keep, T_HASH);
    if (!RB_TYPE_P(result, T_HASH)) CORRUPT("not a result Hash");
    VALUE frames = rb_hash_lookup2(result, sym_frames, Qnil);
    if (!RB_TYPE_P(frames, T_HASH)) CORRUPT("the result has no frames Hash");
    method_ctx_t m = { keep, pattern, rb_ary_new() };
    rb_hash_foreach(frames, method_match, (VALUE)&m);
    if (RARRAY_LEN(m.matches)) rb_hash_foreach(frames, method_callers, (VALUE)&m);
    return m.matches;
}

void
strobe_report_define(VALUE mNative)
{
    sym_name = ID2SYM(rb_intern("name"));
    sym_file = ID2SYM(rb_intern("file"));
    sym_native = ID2SYM(rb_intern("native"));
    sym_line = ID2SYM(rb_intern("line"));
    sym_total_samples = ID2SYM(rb_intern("total_samples"));
    sym_samples = ID2SYM(rb_intern("samples"));
    sym_edges = ID2SYM(rb_intern("edges"));
    sym_lines = ID2SYM(rb_intern("lines"));
    sym_frames = ID2SYM(rb_intern("frames"));
    sym_raw = ID2SYM(rb_intern("raw"));
    rb_define_singleton_method(mNative, "report_text", native_report_text, 4);
    rb_define_singleton_method(mNative, "report_tree", native_report_tree, 2);
    rb_define_singleton_method(mNative, "report_folded", native_report_folded, -1);
    rb_define_singleton_method(mNative, "report_graphviz", native_report_graphviz, 3);
    rb_define_singleton_method(mNative, "report_callgrind", native_report_callgrind, 2);
    rb_define_singleton_method(mNative, "report_files", native_report_files, 2);
    rb_define_singleton_method(mNative, "report_method", native_report_method, 3);
    rb_define_singleton_method(mNative, "export_pprof", native_export_pprof, 3);
    rb_define_singleton_method(mNative, "export_firefox", native_export_firefox, 3);
    rb_define_singleton_method(mNative, "export_speedscope", native_export_speedscope, 3);
    rb_define_singleton_method(mNative, "flamegraph_data", native_report_flamegraph, 2);
}
