/*
 * export.c - running an export: a report of the result loaded with
 * details (report.c), its raw samples read once (samples.c), and the
 * exporter's body (pprof.c, firefox.c, speedscope.c) writing to the
 * report's output, streamed to a sink in chunks or returned as a String.
 * Strobe::Native.export_pprof, export_firefox and export_speedscope.
 *
 * GVL held; not signal-safe.
 */
#include "export.h"

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

/* Runs an exporter: body(r) on a report of result loaded with details,
 * filtered by keep, its raw samples read (r->samples_read; what names the
 * export in errors), its output going to sink (an IO) in chunks, or, with a
 * nil sink, into the String returned. */
static VALUE
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

void
strobe_export_define(VALUE mNative)
{
    rb_define_singleton_method(mNative, "export_pprof", native_export_pprof, 3);
    rb_define_singleton_method(mNative, "export_firefox", native_export_firefox, 3);
    rb_define_singleton_method(mNative, "export_speedscope", native_export_speedscope, 3);
}
