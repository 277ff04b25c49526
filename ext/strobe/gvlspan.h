/*
 * gvlspan.h - GVL state stretches as markers (gvlspan.c).
 */
#ifndef STROBE_GVLSPAN_H
#define STROBE_GVLSPAN_H

#include "threads.h"

/* A stretch of waiting for the GVL or of being blocked without it shorter
 * than this is no marker (the samples' states still count it). */
#define STROBE_GVL_MARKER_MIN_US 100

/* Thread t's current state starts now (as it registers or resumes). */
void strobe_gvlspan_begin(strobe_thread_t *t, int64_t now_us);
/* From the GVL hook (any thread, mostly without the GVL): t's state is
 * state from now; a stretch of waiting or blocked it ends that lasted
 * STROBE_GVL_MARKER_MIN_US or more while t is sampled becomes a marker. */
void strobe_gvlspan_change(strobe_thread_t *t, uint8_t state);
/* GVL held, as profiling stops: t's stretch under way ends at now_us. */
void strobe_gvlspan_close(strobe_thread_t *t, int64_t now_us);

#endif
