/*
 * compact.h - raw samples to and from the file's compact form (compact.c):
 * Native.compact, Native.expand, Native.expand_limit.
 * GVL held; not signal-safe.
 */
#ifndef STROBE_COMPACT_H
#define STROBE_COMPACT_H 1

#include "strobe.h"

void strobe_compact_define(VALUE mNative);

#endif
