/*
 * cost.h - what sampling costs the program it samples, for the continuous
 * profiler's overhead governor (lib/strobe/continuous/governor.rb): the
 * time spent in the signal handler taking samples (from the moment it
 * knows it samples: a signal landing on a thread leaving Ruby calls
 * nothing) and in the postponed jobs, on the program's threads; and the
 * timer thread's CPU time.
 *
 * strobe_cost_since() and strobe_cost_now() are async-signal-safe (an
 * atomic add and clock_gettime on CLOCK_MONOTONIC, which the vDSO answers
 * without a system call); the rest runs with the GVL held.
 */
#ifndef STROBE_COST_H
#define STROBE_COST_H 1

#include "clock.h"
#include <stdatomic.h>

/* Nanoseconds spent in the handler and the jobs since the extension was
 * loaded (never reset: readers take differences). */
extern _Atomic int64_t strobe_cost_ns;

/* Async-signal-safe: the clock a cost is measured on. A handler's
 * elapsed time is its CPU time: it never blocks. */
static inline int64_t
strobe_cost_now(void)
{
    return strobe_clock_ns(CLOCK_MONOTONIC);
}

/* Async-signal-safe: adds the time since start (a strobe_cost_now()). */
static inline void
strobe_cost_since(int64_t start)
{
    int64_t end = strobe_cost_now();
    if (start >= 0 && end > start) atomic_fetch_add_explicit(&strobe_cost_ns, end - start, memory_order_relaxed);
}

/* Defines Strobe::Native.cost. */
void strobe_cost_init(VALUE native);

#endif
