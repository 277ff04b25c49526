/*
 * folded.c - folded stacks ("root;...;leaf count" per distinct stack, as
 * flamegraph.pl, inferno and speedscope read them), from the stack tree
 * (tree.c), streamed to a sink when one is given.
 *
 * GVL held; not signal-safe.
 */
#include "report.h"

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

void
strobe_report_folded_define(VALUE mNative)
{
    rb_define_singleton_method(mNative, "report_folded", native_report_folded, -1);
}
