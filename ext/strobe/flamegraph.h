/*
 * flamegraph.h - the HTML flamegraph's data (flamegraph.c), as
 * Strobe::Native.flamegraph_data(result, keep).
 *
 * GVL held; nothing here is signal-safe.
 */
#ifndef STROBE_FLAMEGRAPH_H
#define STROBE_FLAMEGRAPH_H 1
#include "strobe.h"

void strobe_flamegraph_define(VALUE mNative);

#endif
