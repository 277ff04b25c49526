/*
 * json_columns.c - a Strobe profile file's samples read from its JSON text
 * without Ruby objects in between.
 *
 * A file's "stacks" section is nearly all of it: per sample a node, a time
 * delta, a thread and maybe a state. Parsed by JSON.parse, every number
 * becomes an Array slot (8 bytes, and most of loading's time) before
 * compact.c copies it into the compact form. Instead,
 * Strobe::Native.stacks_range finds the section in the text (so that Ruby
 * parses the rest, the small part), and strobe_json_stacks_read gives
 * compact.c each column as a cursor over the text itself, whose every
 * number was checked to be an integer when the cursor was made.
 *
 * The text path must read a file exactly as JSON.parse would, so it takes
 * only what it can read without doubt: stacks_range answers nil for
 * anything but strict JSON in what it scans (no comments, no bare words, no
 * control characters in strings), a top-level key written with escapes or
 * given twice, or a stacks section other than Strobe writes (another key,
 * a key twice or escaped, a column not a list of integers or null). The
 * caller then parses the whole text with JSON.parse as before, whose
 * results and errors are the reference.
 *
 * GVL held; not signal-safe.
 */
#include "json_columns.h"
#include <string.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

/* Nesting deeper than this in a value the scanner skips: give up. */
#define STROBE_JSON_MAX_DEPTH 512
/* A column's integers are Fixnums, as JSON.parse gives them: from -2**62
 * to 2**62 - 1, so at most 19 digits. */
#define STROBE_JSON_MAX_DIGITS 19
#define STROBE_JSON_FIXNUM_LIMIT ((uint64_t)1 << 62)

static const char *
skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

/* p at a '"': the position after the string's closing quote, or NULL.
 * *escaped (if given) says whether it held a backslash. */
static const char *
skip_string(const char *p, const char *end, int *escaped)
{
    if (escaped) *escaped = 0;
    for (p++; p < end; p++) {
        if (*p == '"') return p + 1;
        if ((unsigned char)*p < 0x20) return NULL; /* not in a JSON string */
        if (*p == '\\') {
            if (escaped) *escaped = 1;
            if (++p == end) return NULL;
        }
    }
    return NULL;
}

/* p at an integer as JSON writes it (a sign, digits, no leading zero):
 * the position after it, or NULL. */
static const char *
skip_integer(const char *p, const char *end)
{
    if (p < end && *p == '-') p++;
    const char *digits = p;
    while (p < end && *p >= '0' && *p <= '9') p++;
    return p == digits || (p - digits > 1 && *digits == '0') ? NULL : p;
}

/* p at a number, true, false or null, as JSON writes them: the position
 * after it, or NULL (for anything else: a comment, NaN, a bare word). */
static const char *
skip_scalar(const char *p, const char *end)
{
    static const char *const words[] = { "true", "false", "null" };
    for (int w = 0; w < 3; w++) {
        size_t len = strlen(words[w]);
        if ((size_t)(end - p) >= len && memcmp(p, words[w], len) == 0) return p + len;
    }
    if (!(p = skip_integer(p, end))) return NULL;
    if (p < end && *p == '.') {
        const char *fraction = ++p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        if (p == fraction) return NULL;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        const char *exponent = p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        if (p == exponent) return NULL;
    }
    return p;
}

/* p just after a '[': the position after the array if it is a list of
 * integers (most of a file: its columns), else NULL. */
static const char *
skip_integer_list(const char *p, const char *end)
{
    p = skip_ws(p, end);
    if (p < end && *p == ']') return p + 1;
    for (;;) {
        if (!(p = skip_integer(p, end))) return NULL;
        p = skip_ws(p, end);
        if (p >= end) return NULL;
        if (*p == ']') return p + 1;
        if (*p != ',') return NULL;
        p = skip_ws(p + 1, end);
    }
}

/* p at the start of a value: the position after it, or NULL. */
static const char *
skip_value(const char *p, const char *end, int depth)
{
    if (p >= end || depth > STROBE_JSON_MAX_DEPTH) return NULL;
    if (*p == '"') return skip_string(p, end, NULL);
    if (*p == '[') {
        /* Anything but integers: walked value by value below. */
        const char *after = skip_integer_list(p + 1, end);
        if (after) return after;
    }
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        p = skip_ws(p + 1, end);
        if (p < end && *p == close) return p + 1;
        for (;;) {
            if (close == '}') {
                if (p >= end || *p != '"' || !(p = skip_string(p, end, NULL))) return NULL;
                p = skip_ws(p, end);
                if (p >= end || *p != ':') return NULL;
                p = skip_ws(p + 1, end);
            }
            if (!(p = skip_value(p, end, depth + 1))) return NULL;
            p = skip_ws(p, end);
            if (p >= end) return NULL;
            if (*p == close) return p + 1;
            if (*p != ',') return NULL;
            p = skip_ws(p + 1, end);
        }
    }
    return skip_scalar(p, end);
}

static int
key_is(const char *key, long len, const char *name)
{
    return (size_t)len == strlen(name) && memcmp(key, name, (size_t)len) == 0;
}

/* The keys of a stacks section as Strobe writes it: five columns, and the
 * start time. */
static const char *const stacks_keys[] = { "nodes", "samples", "deltas", "threads", "states", "start_time" };
#define STROBE_STACKS_KEYS 6

/* p at a '{': the position after it if it is a stacks section the text
 * path reads exactly as JSON.parse would (each key once, unescaped, one of
 * stacks_keys; a column a list of integers or null, the start time an
 * integer or null), else NULL. */
static const char *
stacks_object(const char *p, const char *end)
{
    int seen[STROBE_STACKS_KEYS] = { 0 };
    p = skip_ws(p + 1, end);
    if (p < end && *p == '}') return p + 1;
    for (;;) {
        int escaped, k = 0;
        const char *key = p + 1;
        if (p >= end || *p != '"' || !(p = skip_string(p, end, &escaped)) || escaped) return NULL;
        long key_len = (long)(p - 1 - key);
        while (k < STROBE_STACKS_KEYS && !key_is(key, key_len, stacks_keys[k])) k++;
        if (k == STROBE_STACKS_KEYS || seen[k]++) return NULL;
        p = skip_ws(p, end);
        if (p >= end || *p != ':') return NULL;
        p = skip_ws(p + 1, end);
        if (end - p >= 4 && memcmp(p, "null", 4) == 0) {
            p += 4;
        } else if (k < 5) {
            if (p >= end || *p != '[' || !(p = skip_integer_list(p + 1, end))) return NULL;
        } else {
            if (!(p = skip_integer(p, end)) || (p < end && (*p == '.' || *p == 'e' || *p == 'E'))) return NULL;
        }
        p = skip_ws(p, end);
        if (p >= end) return NULL;
        if (*p == '}') return p + 1;
        if (*p != ',') return NULL;
        p = skip_ws(p + 1, end);
    }
}

/* Strobe::Native.stacks_range(text) -> [from, to], the byte range of the
 * value of the top-level key "stacks" of a Strobe profile file's JSON
 * text; nil unless the text is one object holding "strobe_file" and a
 * stacks section as Strobe writes it (stacks_object), each once, no
 * top-level key written with escapes, and what the scan skips strict JSON
 * (no comments, no bare words). */
static VALUE
native_stacks_range(VALUE self, VALUE text)
{
    StringValue(text);
    const char *base = RSTRING_PTR(text), *end = base + RSTRING_LEN(text);
    const char *p = skip_ws(base, end), *from = NULL, *to = NULL;
    int strobe_file = 0;
    if (p >= end || *p != '{') return Qnil;
    p = skip_ws(p + 1, end);
    if (p < end && *p == '}') return Qnil;
    for (;;) {
        int escaped;
        const char *key = p + 1;
        if (p >= end || *p != '"' || !(p = skip_string(p, end, &escaped)) || escaped) return Qnil;
        long key_len = (long)(p - 1 - key);
        p = skip_ws(p, end);
        if (p >= end || *p != ':') return Qnil;
        const char *value = p = skip_ws(p + 1, end);
        if (key_is(key, key_len, "stacks")) {
            if (from || p >= end || *p != '{' || !(p = stacks_object(p, end))) return Qnil;
            from = value;
            to = p;
        } else if (!(p = skip_value(p, end, 1))) {
            return Qnil;
        } else if (key_is(key, key_len, "strobe_file")) {
            if (strobe_file++) return Qnil;
        }
        p = skip_ws(p, end);
        if (p >= end) return Qnil;
        if (*p == '}') break;
        if (*p != ',') return Qnil;
        p = skip_ws(p + 1, end);
    }
    if (skip_ws(p + 1, end) != end || !from || !strobe_file) return Qnil;
    return rb_assoc_new(LONG2NUM(from - base), LONG2NUM(to - base));
}

/* p at an integer of a column (entry i; -1: a single value): the position
 * after it. Anything but an integer raises ProfileError; one beyond the
 * Fixnums (which JSON.parse makes a Bignum) clears *in_range (or raises,
 * without in_range), its digits passed over. */
static const char *
check_integer(const char *p, const char *end, const char *what, long i, int *in_range)
{
    int negative = p < end && *p == '-';
    const char *digits = negative ? p + 1 : p, *q = digits;
    uint64_t v = 0;
    while (q < end && *q >= '0' && *q <= '9' && q - digits < STROBE_JSON_MAX_DIGITS) v = v * 10 + (uint64_t)(*q++ - '0');
    long n = (long)(q - digits);
    int more = q < end && *q >= '0' && *q <= '9'; /* past 19 digits */
    while (q < end && *q >= '0' && *q <= '9') q++;
    int integer = n > 0 && !(n > 1 && *digits == '0') && !(q < end && (*q == '.' || *q == 'e' || *q == 'E'));
    int fixnum = !more && v <= (negative ? STROBE_JSON_FIXNUM_LIMIT : STROBE_JSON_FIXNUM_LIMIT - 1);
    if (in_range && integer) {
        *in_range = fixnum;
    } else if (!integer || !fixnum) {
        if (i < 0) CORRUPT("%s is not an integer in range", what);
        CORRUPT("%s[%ld] is not an integer in range", what, i);
    }
    return q;
}

/* p at a column's value: a JSON array of integers, checked whole, becomes
 * c's text; null an empty column where empty_if_null. The position after
 * the value. */
static const char *
column_of_text(strobe_column_t *c, const char *p, const char *end, const char *what, int empty_if_null)
{
    *c = (strobe_column_t){ Qnil, NULL, NULL, 0, 0, -1, what };
    if (empty_if_null && end - p >= 4 && memcmp(p, "null", 4) == 0) return p + 4;
    if (p >= end || *p != '[') CORRUPT("%s is not an array", what);
    c->p = p + 1;
    p = skip_ws(p + 1, end);
    if (p < end && *p != ']') {
        for (;;) {
            int in_range;
            p = skip_ws(check_integer(p, end, what, c->len, &in_range), end);
            /* Raised when read, as for an Array: a file with several faults
             * names the same one either way. */
            if (!in_range && c->bad_at < 0) c->bad_at = c->len;
            c->len++;
            if (p < end && *p == ']') break;
            if (p >= end || *p != ',') CORRUPT("%s is not an array of integers", what);
            p = skip_ws(p + 1, end);
        }
    }
    if (p >= end) CORRUPT("%s is not an array of integers", what);
    c->end = p;
    return p + 1;
}

void
strobe_column_of_array(strobe_column_t *c, VALUE ary, const char *what, int empty_if_nil)
{
    *c = (strobe_column_t){ ary, NULL, NULL, 0, 0, -1, what };
    if (NIL_P(ary) && empty_if_nil) return; /* empty: never read */
    if (!RB_TYPE_P(ary, T_ARRAY)) CORRUPT("%s is not an array", what);
    c->len = RARRAY_LEN(ary);
}

long
strobe_column_next(strobe_column_t *c)
{
    long i = c->at++;
    if (!NIL_P(c->ary)) return strobe_fixnum_at(c->ary, i, c->what);
    if (i == c->bad_at) CORRUPT("%s[%ld] is not an integer in range", c->what, i);
    /* Checked when the cursor was made: whitespace, commas and integers
     * of at most 19 digits, this one a Fixnum. */
    const char *p = c->p;
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t' || *p == ',') p++;
    int negative = *p == '-';
    p += negative;
    long v = 0;
    while (p < c->end && *p >= '0' && *p <= '9') v = v * 10 + (*p++ - '0');
    c->p = p;
    return negative ? -v : v;
}

void
strobe_json_stacks_read(strobe_json_stacks_t *s, VALUE text, long from, long to)
{
    if (from < 0 || to < from || to > RSTRING_LEN(text)) rb_raise(rb_eArgError, "the stacks range is not in the text");
    const char *p = RSTRING_PTR(text) + from, *end = RSTRING_PTR(text) + to;
    strobe_column_t *columns[] = { &s->nodes, &s->samples, &s->deltas, &s->threads, &s->states };
    static const char *const keys[] = { "nodes", "samples", "deltas", "threads", "states" };
    static const char *const names[] = { "nodes", "samples", "sample_deltas", "sample_threads", "sample_states" };
    for (int k = 0; k < 5; k++) *columns[k] = (strobe_column_t){ Qnil, NULL, NULL, 0, 0, -1, names[k] };
    int given[5] = { 0 };
    s->start_time = 0;
    p = skip_ws(p, end);
    if (p >= end || *p != '{') CORRUPT("stacks is not an object");
    p = skip_ws(p + 1, end);
    if (p < end && *p == '}') p = NULL; /* no keys */
    while (p) {
        const char *key = p + 1;
        if (p >= end || *p != '"' || !(p = skip_string(p, end, NULL))) CORRUPT("stacks is malformed");
        long key_len = (long)(p - 1 - key);
        p = skip_ws(p, end);
        if (p >= end || *p != ':') CORRUPT("stacks is malformed");
        p = skip_ws(p + 1, end);
        int k = 0;
        while (k < 5 && !key_is(key, key_len, keys[k])) k++;
        if (k < 5) {
            /* nodes and samples must be arrays; the others may be null. */
            p = column_of_text(columns[k], p, end, names[k], k >= 2);
            given[k] = 1;
        } else if (key_is(key, key_len, "start_time")) {
            if (end - p >= 4 && memcmp(p, "null", 4) == 0) {
                s->start_time = 0;
                p += 4;
            } else {
                const char *q = p;
                if (p >= end || (*p != '-' && (*p < '0' || *p > '9'))) CORRUPT("start_time is not an integer in range");
                p = check_integer(p, end, "start_time", -1, NULL);
                strobe_column_t one = { Qnil, q, p, 1, 0, -1, "start_time" };
                s->start_time = strobe_column_next(&one);
            }
        } else if (!(p = skip_value(p, end, 2))) {
            CORRUPT("stacks is malformed");
        }
        p = skip_ws(p, end);
        if (p < end && *p == '}') break;
        if (p >= end || *p != ',') CORRUPT("stacks is malformed");
        p = skip_ws(p + 1, end);
    }
    /* As stacks[:nodes] and stacks[:samples] read from a parsed file. */
    if (!given[0]) CORRUPT("nodes is not an array");
    if (!given[1]) CORRUPT("samples is not an array");
}

/* Strobe::Native.advise_huge(string) -> string: the untouched room of a
 * String made with a capacity (String.new(capacity:)) advised to huge
 * pages (strobe_advise_huge), before a large file is read into it. */
static VALUE
native_advise_huge(VALUE self, VALUE str)
{
    StringValue(str);
    strobe_advise_huge(RSTRING_PTR(str), rb_str_capacity(str));
    return str;
}

/* Strobe::Native.allow_huge_pages -> whether the process may now have
 * transparent huge pages. Ruby turns them off for its whole process at
 * start (PR_SET_THP_DISABLE: its heap bloated with them), and then no
 * madvise gets any. `strobe report` (a process of its own, short, its
 * memory mostly Strobe's large buffers) turns them back on: loading the
 * 10M-sample profile took 1.7 to 2.2 s instead of 2.7 to 3.7 s. A library
 * inside someone's program never does. */
static VALUE
native_allow_huge_pages(VALUE self)
{
#if defined(__linux__) && defined(PR_SET_THP_DISABLE)
    return prctl(PR_SET_THP_DISABLE, 0, 0, 0, 0) == 0 ? Qtrue : Qfalse;
#else
    return Qfalse;
#endif
}

void
strobe_json_columns_define(VALUE mNative)
{
    rb_define_singleton_method(mNative, "stacks_range", native_stacks_range, 1);
    rb_define_singleton_method(mNative, "advise_huge", native_advise_huge, 1);
    rb_define_singleton_method(mNative, "allow_huge_pages", native_allow_huge_pages, 0);
}
