/*
 * out.h - the reports' and exports' output buffer: written straight into
 * a Ruby String, or streamed to a sink in chunks. The writers are inline
 * here; out.c has the out-of-line parts (the flush to the sink, JSON string
 * literals, names as text shows them).
 *
 * GVL held; nothing here is signal-safe.
 */
#ifndef STROBE_OUT_H
#define STROBE_OUT_H 1
#include "strobe.h"
#include <ruby/encoding.h>
#include <limits.h>
#include <string.h>

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
