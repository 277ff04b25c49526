/*
 * method.c - a method's frames and their callers: the kept frames whose
 * name equals a String or matches a Regexp, each with its kept callers and
 * their edge counts. Reads the result's frames Hash directly (names, then
 * edges), without loading a report.
 *
 * GVL held; not signal-safe.
 */
#include "report.h"

static VALUE sym_name, sym_edges, sym_frames;

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
strobe_report_method_define(VALUE mNative)
{
    sym_name = ID2SYM(rb_intern("name"));
    sym_edges = ID2SYM(rb_intern("edges"));
    sym_frames = ID2SYM(rb_intern("frames"));
    rb_define_singleton_method(mNative, "report_method", native_report_method, 3);
}
