/*
 * clock.h - the clocks every part of Strobe reads: sample and marker times
 * (CLOCK_MONOTONIC microseconds) and threads' CPU clocks. Both helpers are
 * async-signal-safe (clock_gettime is).
 */
#ifndef STROBE_CLOCK_H
#define STROBE_CLOCK_H 1

#include "strobe.h"
#include <time.h>

/* Async-signal-safe: a clock in nanoseconds, -1 if it cannot be read (a
 * dead thread's CPU clock). */
static inline int64_t
strobe_clock_ns(clockid_t clock)
{
    struct timespec ts;
    if (clock_gettime(clock, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Async-signal-safe: CLOCK_MONOTONIC in microseconds. */
static inline int64_t
strobe_now_us(void)
{
    return strobe_clock_ns(CLOCK_MONOTONIC) / 1000;
}

#endif
