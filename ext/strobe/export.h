/*
 * export.h - the exports (export.c runs them as Strobe::Native.export_pprof,
 * export_firefox and export_speedscope): each exporter's body writes a
 * report's samples (samples.h) in its format.
 *
 * GVL held; nothing here is signal-safe.
 */
#ifndef STROBE_EXPORT_H
#define STROBE_EXPORT_H 1
#include "samples.h"

/* The exporters' bodies (pprof.c, firefox.c, speedscope.c), run on a
 * report of the result loaded with details, its raw samples read
 * (r->samples_read), its output going to r->out. */
VALUE strobe_pprof_body(report_t *r);
VALUE strobe_firefox_body(report_t *r);
VALUE strobe_speedscope_body(report_t *r);

/* Defines the Native.export_<name>(result, keep, sink) methods. */
void strobe_export_define(VALUE mNative);

#endif
