/*
 * report.h - what the report engine (report.c) shares with the exporters
 * (pprof.c, firefox.c, speedscope.c): the output buffer, a result's frames
 * loaded into a flat array, and a report's lifetime (report_run frees its
 * buffers however the body ends, and a hidden object marks its VALUEs).
 *
 * GVL held; nothing here is signal-safe.
 */
#ifndef STROBE_REPORT_H
#define STROBE_REPORT_H 1
#include "strobe.h"
#include <ruby/st.h>
#include <ruby/encoding.h>
#include <limits.h>
#include <string.h>

#define CORRUPT(...) rb_raise(strobe_eProfileError, __VA_ARGS__)

/* Sample times are microseconds below this (2**53: centuries since the
 * epoch), so differences and sums of a few of them never overflow. */
#define STROBE_MAX_TIME_US ((int64_t)1 << 53)

/* A result's raw samples in C (samples.c), for the exporters: every stack
 * interned as a node of (parent node, frame, line), where a table frame is a
 * result frame id, and per sample its leaf node, time, thread and state. */
typedef struct {
    strobe_stack_table_t table;
    int table_ready;
    long *frame_pos;         /* per table frame: its position in the report's frames */
    size_t n;                /* samples */
    uint32_t *node;          /* per sample: its leaf node */
    int64_t *time;           /* per sample: microseconds (CLOCK_MONOTONIC); NULL without times */
    uint32_t *thread;        /* per sample: position in thread_ids; NULL: all thread 0 */
    uint8_t *state;          /* per sample: STROBE_STATE_*; NULL where the result has none */
    int64_t start_us;        /* when profiling started, on the clock of time (or the first time) */
    /* From the result, checked: interval (0 when absent), and started_at /
     * duration in microseconds (0 when absent), all in [0, 2**53]. */
    int64_t interval, started_at_us, duration_us;
    VALUE thread_ids;        /* Array: the result's thread ids, in its order (at least one entry) */
    /* while reading: the previous raw entry (see strobe_samples_read) */
    VALUE *prev_ids;
    int32_t *prev_lines;
    uint32_t *path;
} strobe_samples_t;

/* Output written straight into a Ruby String's buffer (str, created on
 * the first write; its length is set when it is finished). With a sink (an
 * IO, or anything with #write), full chunks of STROBE_OUT_CHUNK bytes are
 * handed to it as they fill, so an export of any size streams. */
#define STROBE_OUT_CHUNK (1 << 20)
typedef struct {
    VALUE str;               /* 0 until written to */
    char *buf;
    size_t len, capa;
    VALUE sink;              /* 0: keep everything in str */
} out_t;

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
    st_table *children;      /* (parent << 32 | frame) -> node */
    uint32_t *runs_node;
    uint64_t *runs_count;
    size_t runs, runs_capa;
    uint32_t *sample_node;   /* if set: report_tree writes each sample's leaf node here */
    size_t sample_nodes;     /* its length: the samples raw describes */
    VALUE *prev_ids;         /* the previous raw stack's frame ids */
    uint32_t *path;          /* path[k]: its node after level k (path[0]: root) */
    long path_capa;
    out_t out;               /* the output being written */
    void *scratch[8];        /* a report's own buffers (xmalloc), freed with it */
    strobe_samples_t *samples_read; /* an export's samples (samples.c), freed with it */
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
/* The stack tree of frames (report.c): tree_init makes the root, an empty
 * tree; tree_child the node for frame (a position in frames) under parent,
 * made on first use; tree_totals each node's total from the self counts;
 * tree_hash {frame_ids:, parent:, frame:, self:, total:} for Ruby. */
void strobe_report_tree_init(report_t *r);
/* Interns every raw stack of r's result into the tree (r loaded first),
 * with self and total counts and the samples' leaf nodes as runs; with
 * r->sample_node set, also each sample's leaf node there. */
void strobe_report_tree(report_t *r);
uint32_t strobe_report_tree_child(report_t *r, uint32_t parent, uint32_t frame);
void strobe_report_tree_totals(report_t *r);
VALUE strobe_report_tree_hash(report_t *r);
/* Arrays of Integers; with root_as_minus_one, UINT32_MAX is written -1. */
VALUE strobe_u32_array(const uint32_t *v, size_t n, int root_as_minus_one);
VALUE strobe_u64_array(const uint64_t *v, size_t n);
/* Reads r's result's raw samples into a new strobe_samples_t owned by r
 * (freed with it); r must be loaded with details. ProfileError for a result
 * without raw samples (what names the export) or with malformed ones. */
strobe_samples_t *strobe_samples_read(report_t *r, const char *what);
/* The same without the stacks: the samples' times, threads and states,
 * and *node, an array of a node per sample (s->n) for the caller to fill. */
strobe_samples_t *strobe_samples_columns(report_t *r, const char *what, uint32_t **node);
void strobe_samples_free(strobe_samples_t *s);
/* The samples' indexes grouped by thread (in the order of thread_ids),
 * time-ordered within each; *starts gets each thread's first position
 * (threads + 1 entries). Both in r's scratch[3..5] (and 7). */
size_t *strobe_samples_by_thread(report_t *r, const strobe_samples_t *s, size_t **starts);
/* Thread t's name for display: Thread#name, else "main" for the main
 * thread, else "thread ID"; *is_main (if given) says whether it is main. */
VALUE strobe_samples_thread_name(const strobe_samples_t *s, VALUE result, long t, int *is_main);
/* Runs an exporter: body(r) on a report of result loaded with details,
 * filtered by keep, its raw samples read (r->samples_read; what names the
 * export in errors), its output going to sink (an IO) in chunks, or, with a
 * nil sink, into the String returned. */
VALUE strobe_export(VALUE (*body)(report_t *r), const char *what, VALUE result, VALUE keep, VALUE sink);
/* The exporters' bodies (pprof.c, firefox.c, speedscope.c), run by
 * strobe_export as Strobe::Native.export_<name>(result, keep, sink). */
VALUE strobe_pprof_body(report_t *r);
VALUE strobe_firefox_body(report_t *r);
VALUE strobe_speedscope_body(report_t *r);
/* The HTML flamegraph's data (flamegraph.c), as Native.flamegraph_data. */
VALUE strobe_flamegraph_body(report_t *r);
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

/* ---- output ------------------------------------------------------------------ */

void strobe_out_flush(out_t *o);

static inline void
out_reserve(out_t *o, size_t more)
{
    if (o->len + more <= o->capa) return;
    if (o->sink && o->len >= STROBE_OUT_CHUNK / 2) {
        strobe_out_flush(o);
        if (o->len + more <= o->capa) return;
    }
    size_t capa = o->capa ? o->capa : o->sink ? STROBE_OUT_CHUNK : 4096;
    while (capa < o->len + more) capa *= 2;
    if (capa > LONG_MAX) rb_raise(rb_eNoMemError, "report output too large");
    if (!o->str) {
        o->str = rb_str_buf_new((long)capa);
    } else {
        rb_str_set_len(o->str, (long)o->len);
        rb_str_modify_expand(o->str, (long)(capa - o->len));
    }
    o->buf = RSTRING_PTR(o->str);
    o->capa = rb_str_capacity(o->str);
}

static inline void
out_mem(out_t *o, const char *s, size_t n)
{
    if (!n) return; /* nothing to copy, and buf may still be NULL */
    out_reserve(o, n);
    memcpy(o->buf + o->len, s, n);
    o->len += n;
}

static inline void
out_str(out_t *o, VALUE str)
{
    out_mem(o, RSTRING_PTR(str), (size_t)RSTRING_LEN(str));
}

#define OUT_LIT(o, lit) out_mem((o), (lit), sizeof(lit) - 1)

/* n right-aligned in width columns (wider numbers take what they need),
 * its digits written in place, two at a time (most numbers are small). */
static inline void
out_u64(out_t *o, uint64_t n, int width)
{
    static const char pairs[201] =
        "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
        "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
        "8081828384858687888990919293949596979899";
    int digits = 1;
    for (uint64_t v = n; v >= 10; v /= 10) digits++;
    size_t len = (size_t)(digits > width ? digits : width);
    out_reserve(o, len);
    char *start = o->buf + o->len, *p = start + len;
    while (n >= 100) {
        unsigned d = (unsigned)(n % 100);
        n /= 100;
        *--p = pairs[2 * d + 1];
        *--p = pairs[2 * d];
    }
    if (n >= 10) {
        *--p = pairs[2 * n + 1];
        *--p = pairs[2 * n];
    } else {
        *--p = (char)('0' + n);
    }
    while (p > start) *--p = ' ';
    o->len += len;
}

/* The String written: UTF-8 (names are), and the out_t empty again. With
 * a sink, what is left goes to it, and the sink is returned. */
static inline VALUE
out_finish(out_t *o)
{
    if (o->sink) {
        VALUE sink = o->sink;
        strobe_out_flush(o);
        memset(o, 0, sizeof(*o));
        return sink;
    }
    if (!o->str) return rb_utf8_str_new(0, 0);
    VALUE s = o->str;
    rb_str_set_len(s, (long)o->len);
    rb_enc_associate(s, rb_utf8_encoding());
    memset(o, 0, sizeof(*o));
    return s;
}

/* A Ruby string as a JSON string literal (quoted, escaped; invalid UTF-8
 * replaced). */
void strobe_out_json_str(out_t *o, VALUE str);
/* str as valid UTF-8 (itself when it already is; else converted, with what
 * cannot be replaced by U+FFFD). */
VALUE strobe_utf8_of(VALUE str);

/* How strobe_out_shown writes a name (a frame's, a file's) into text that
 * a terminal may show. Always: in UTF-8 (another encoding converted), ESC,
 * newline, carriage return and tab as \e \n \r \t, other C0 controls and
 * DEL as \xNN, C1 controls (U+0080..U+009F) as \uNNNN, bytes that are not
 * UTF-8 as \xNN; backslashes left alone. Strobe::Report.printable (Ruby)
 * follows the same rules. */
typedef enum {
    STROBE_SHOW_TEXT,        /* a text report's line */
    STROBE_SHOW_FOLDED,      /* also ';' as ':' (folded stacks, callgrind) */
    STROBE_SHOW_DOT          /* inside a DOT string: '"' and '\\' escaped, so
                              * the escapes above get a second backslash */
} strobe_show_t;
void strobe_out_shown(out_t *o, VALUE str, strobe_show_t how);
/* The same for len bytes at p, taken as UTF-8 (see strobe_shown_utf8); p
 * must stay put while o grows (a marked String's bytes do). */
void strobe_out_shown_bytes(out_t *o, const char *p, long len, strobe_show_t how);
/* str (a String, or what is made one) whose bytes are its text in UTF-8:
 * itself, or a converted copy (itself when it cannot be converted). */
VALUE strobe_shown_utf8(VALUE str);
/* Whether strobe_out_shown would write str's bytes unchanged. */
int strobe_shown_as_is(VALUE str, strobe_show_t how);

static inline void
out_i64(out_t *o, int64_t n)
{
    if (n < 0) {
        out_mem(o, "-", 1);
        out_u64(o, (uint64_t)0 - (uint64_t)n, 0);
    } else {
        out_u64(o, (uint64_t)n, 0);
    }
}

/* Microseconds as milliseconds with three decimals. */
static inline void
out_ms(out_t *o, int64_t us)
{
    if (us < 0) { OUT_LIT(o, "-"); us = -us; }
    out_u64(o, (uint64_t)us / 1000, 0);
    char frac[4] = { '.', (char)('0' + us / 100 % 10), (char)('0' + us / 10 % 10), (char)('0' + us % 10) };
    out_mem(o, frac, 4);
}

#endif
