/*
 * report.c - the report engine: the per-frame and per-sample work of every
 * report, in C, on a result Hash (stackprof's shape). This file loads a
 * result and keeps a report alive; the reports are beside it: the text
 * rows here, the stack tree (tree.c), folded stacks (folded.c), Graphviz
 * and callgrind (callgraph.c), per-file totals (filetotals.c), a method's
 * callers (method.c); the exports build on it (samples.c, export.c).
 *
 * A report loads the result's frames into a flat array (report_load),
 * keeping only the frames a filter lets through (a Hash of kept frame ids,
 * or nil for all), with a frame id -> position table, and runs in
 * strobe_report_run, which frees its buffers however it ends while a
 * hidden object marks its VALUEs. Text rows are sorted by self (or total)
 * samples and formatted in one buffer. Output goes into Ruby Strings;
 * numbers written per line are formatted by hand.
 *
 * Every id and count read from the result is checked: malformed data raises
 * Strobe::ProfileError. GVL held; not signal-safe.
 */
#include "report.h"
#include "samples.h"
#include <stdlib.h>
#include <stdio.h>

static VALUE sym_native, sym_name, sym_file, sym_line, sym_total_samples, sym_samples, sym_edges, sym_lines,
    sym_frames;

/* ---- loading ---------------------------------------------------------------- */

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
    if (r->samples_read) {
        rb_gc_mark(r->samples_read->thread_ids);
        rb_gc_mark(r->samples_read->stacks);
    }
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
    xfree(r->child_slots);
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
int
strobe_format_percent(char *buf, uint64_t count, uint64_t samples)
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
    p += strobe_format_percent(p, count, samples);
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
    rb_define_singleton_method(mNative, "report_text", native_report_text, 4);
    strobe_report_tree_define(mNative);
    strobe_report_folded_define(mNative);
    strobe_report_callgraph_define(mNative);
    strobe_report_files_define(mNative);
    strobe_report_method_define(mNative);
}
