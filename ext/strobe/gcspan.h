/*
 * gcspan.h - GC time in the time modes, counted from GC hooks (gcspan.c).
 */
#ifndef STROBE_GCSPAN_H
#define STROBE_GCSPAN_H

#include "threads.h"

/* GVL held. From start to stop, each GC of a profiled thread is recorded
 * as samples of its phases at the sampling rate: interval_us of the
 * thread's wall time (:wall) or CPU time (:cpu) per sample. */
void strobe_gcspan_start(strobe_mode_t mode, long interval_us);
void strobe_gcspan_stop(void);
/* GVL held: GC's samples are counted in intervals of interval_us from now. */
void strobe_gcspan_retime(long interval_us);
/* In a forked child: no GC is under way, none is counted. */
void strobe_gcspan_after_fork(void);
/* Async-signal-safe: whether thread t's time now is GC the hooks count
 * (the handler and the timer leave it alone). */
int strobe_gcspan_counts(const strobe_thread_t *t);
/* Async-signal-safe: whether a GC the hooks count runs now (on any thread). */
int strobe_gcspan_under_way(void);

#endif
