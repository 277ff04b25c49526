/*
 * subset.h - parts of a result by thread and time (subset.c):
 * Native.windows_subset, Native.thread_subset. GVL held; not signal-safe.
 */
#ifndef STROBE_SUBSET_H
#define STROBE_SUBSET_H 1

#include "strobe.h"

void strobe_subset_define(VALUE mNative);

#endif
