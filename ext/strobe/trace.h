/*
 * trace.h - mode :trace (trace.c). GVL held; not signal-safe.
 */
#ifndef STROBE_TRACE_H
#define STROBE_TRACE_H 1

#include "strobe.h"

void strobe_trace_define(VALUE mNative);
void strobe_trace_start(int cpu, VALUE names, VALUE paths, VALUE patterns);
void strobe_trace_stop(void);
int strobe_trace_running(void);
/* Something was traced since the last results. */
int strobe_trace_active(void);

#endif
