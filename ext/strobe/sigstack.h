/*
 * sigstack.h - the sampling handler's footing: the stack it runs on and the
 * per-thread guard it takes (sigstack.c).
 */
#ifndef STROBE_SIGSTACK_H
#define STROBE_SIGSTACK_H

#include "threads.h"

/* Flags the handler is installed with: on the thread's alternate signal
 * stack (Strobe's own, or Ruby's on a thread Strobe has not run on yet),
 * its own signal blocked while it runs, so a thread holds one handler
 * frame at most. */
int strobe_sigstack_handler_flags(void);

/* The handler marks its thread while it runs (first and last thing it
 * does): a mark found outside any handler was left by a longjmp. */
extern __thread int strobe_in_handler __attribute__((tls_model("initial-exec")));
static inline void strobe_sigstack_enter(void) { strobe_in_handler = 1; }
static inline void strobe_sigstack_leave(void) { strobe_in_handler = 0; }
/* Outside any handler, on the calling thread: when a handler of this
 * thread was left by a longjmp with the signal blocked, unblocks it (a
 * pending one is handled before this returns) and returns 1; else 0, at
 * the cost of one thread-local load. */
int strobe_sigstack_unblock_left(void);
static inline int
strobe_sigstack_recover(void)
{
    return strobe_in_handler ? strobe_sigstack_unblock_left() : 0;
}

/* The size of the alternate stacks Strobe gives threads that sample native
 * frames, and what a native walk needs on it (sigstack.c says why). */
#define STROBE_SIGSTACK_BYTES (64 * 1024)
#define STROBE_NATIVE_STACK_NEED (12 * 1024)

/* Outside any handler, on the calling thread: makes its alternate signal
 * stack one of Strobe's (STROBE_SIGSTACK_BYTES), kept until the thread is
 * gone, unless it is already. */
void strobe_sigstack_ensure(void);
/* In a forked child: forget the stacks of threads that are not there. */
void strobe_sigstack_after_fork(void);
/* Async-signal-safe, in a handler: whether at least need bytes are left
 * below frame on the alternate stack it runs on (1 when it runs on the
 * thread's own stack: no alternate stack to measure). */
int strobe_sigstack_room(const void *frame, size_t need);

/* The guard: one capture at a time into thread t's scratch buffers.
 * Async-signal-safe. Taking it from a signal handler: frame is an address
 * in the handler's frame (a local's); another handler of the same native
 * thread that holds it was left (longjmp: handlers do not nest), and is
 * taken over. Returns 1 when taken, 0 when held (the caller counts a
 * missed sample). */
int strobe_guard_take_in_handler(strobe_thread_t *t, const void *frame);
/* Taking it outside any handler (a postponed job, a hook, Strobe.sample):
 * one held by a handler of the calling native thread was left, since no
 * handler is running under this code. */
int strobe_guard_take(strobe_thread_t *t);
void strobe_guard_release(strobe_thread_t *t);
/* Outside any handler, on t's own native thread (a GVL or thread hook):
 * lets go of a guard a handler of this thread was left holding. Two
 * atomic loads when there is none. */
void strobe_guard_reclaim(strobe_thread_t *t);
/* Test hook: the handler calls it holding the guard; it longjmps out when
 * Strobe::Native.leave_a_handler asked for it on this thread. */
void strobe_sigstack_leave_if_asked(void);

/* The test hooks (Strobe::Native): painting and measuring the alternate
 * stack, the guards reclaimed and threads recovered, leaving a handler. */
void strobe_sigstack_define(VALUE mNative);

#endif
