/*
 * native.h - native frames (native: true; native.c): captured in the
 * handler (strobe_native_capture, async-signal-safe), woven under the Ruby
 * frames at the drain, named at results.
 */
#ifndef STROBE_NATIVE_H
#define STROBE_NATIVE_H 1

#include "threads.h"

/* Whether Strobe was built with libunwind. */
int strobe_native_available(void);
/* Async-signal-safe: the interrupted native stack of the calling thread
 * (t's) from the handler's ucontext into out (STROBE_NATIVE_CAPA return
 * addresses, innermost first); returns how many. */
int strobe_native_capture(const strobe_thread_t *t, const void *ucontext, uintptr_t *out);
/* On t's own thread, never in a signal handler: set up what lets its
 * handler use libunwind's fast path. */
void strobe_native_warm(strobe_thread_t *t);
/* GVL held, before sampling starts, on the starting thread (self: its
 * entry, or NULL when it is not profiled): set it up as strobe_native_warm
 * does, and read the symbol tables of the objects on its stack (libruby,
 * libc, ...), so that the first recording does not stall the timer thread
 * reading them. One walk does both. */
void strobe_native_prepare(strobe_thread_t *self);
/* fork handlers: wait for the handlers' native walks under way and hold
 * new ones off / let them go again (libunwind's lock must not be copied
 * held into the child). */
void strobe_native_fork_prepare(void);
void strobe_native_fork_done(int in_child);
/* Under the profile lock: the native frames (STROBE_NATIVE_VALUEs,
 * innermost first) of a captured native stack that go under its innermost
 * Ruby frame, into out (STROBE_NATIVE_CAPA); how many, or -1 when the
 * stack did not reach the interpreter (it is then left out). */
int strobe_native_weave(const uintptr_t *ips, int n, VALUE *out);
/* Under the profile lock, nothing sampling: forget cached resolutions. */
void strobe_native_reset(void);
/* GVL held: name, file and native: true of a native frame into details. */
void strobe_native_details(VALUE value, VALUE details);

#endif
