/*
 * capture.h - the hand-off ring between the signal handler and the drain
 * (capture.c): a slot's layout, the capture (async-signal-safe) and the
 * drain (under the profile lock); and reading the calling thread's frames.
 */
#ifndef STROBE_CAPTURE_H
#define STROBE_CAPTURE_H 1

#include "threads.h"
#include <ruby/debug.h>

/* Slots in the hand-off ring between the handler and the GVL-side drain. */
#define STROBE_RING_SLOTS 64
/* Timestamps one slot can hold for consecutive identical stacks. */
#define STROBE_SLOT_TIMES 64

/* rb_profile_frames into a STROBE_STACK_CAPA buffer, the outermost entry
 * replaced by the "(truncated)" placeholder when the stack filled it.
 * Async-signal-safe as rb_profile_frames is, for thread Qfalse (the calling
 * thread); another Thread's frames (Ruby 3.2+) only with the GVL held. */
static inline int
strobe_read_frames(VALUE thread, VALUE *frames, int *lines)
{
#ifdef HAVE_RB_PROFILE_THREAD_FRAMES
    /* Another thread's (GVL held; never from a signal handler). */
    int depth = RTEST(thread) ? rb_profile_thread_frames(thread, 0, STROBE_STACK_CAPA, frames, lines)
                              : rb_profile_frames(0, STROBE_STACK_CAPA, frames, lines);
#else
    (void)thread;
    int depth = rb_profile_frames(0, STROBE_STACK_CAPA, frames, lines);
#endif
    if (depth == STROBE_STACK_CAPA) {
        frames[depth - 1] = STROBE_TRUNCATED_VALUE;
        lines[depth - 1] = 0;
    }
    return depth;
}

enum { STROBE_SLOT_EMPTY = 0, STROBE_SLOT_WRITING, STROBE_SLOT_READY, STROBE_SLOT_DRAINING };

typedef struct {
    atomic_int state;
    uint64_t seq;            /* ring sequence number this slot holds */
    int depth;               /* frames captured (0 for a GC sample) */
    uint8_t gc_kind;         /* strobe_frame_kind_t: RUBY, or the GC phase */
    uint16_t thread;         /* index into the thread registry */
    uint32_t n_times;        /* samples of this same stack, one time each */
    size_t gc_epoch;         /* see capture.c: the GC count its frames are
                              * known valid through */
    int64_t times[STROBE_SLOT_TIMES]; /* CLOCK_MONOTONIC microseconds */
    uint8_t states[STROBE_SLOT_TIMES]; /* the thread's state at each */
    VALUE frames[STROBE_STACK_CAPA];  /* innermost first, as rb_profile_frames */
    int lines[STROBE_STACK_CAPA];
    int native_depth;        /* native return addresses (native: true), else 0 */
    uintptr_t native[STROBE_NATIVE_CAPA]; /* innermost first, from the interrupted instruction */
} strobe_slot_t;

void strobe_capture_reset(void);
/* Async-signal-safe: capture the current thread's stack (or a GC sample)
 * into the ring. gc_epoch is rb_gc_count() read before rb_during_gc() was
 * found false. Returns 1 when the sample was taken, 0 when missed. With
 * unchanged non-NULL, sets it to whether this Ruby stack equals the thread's
 * previous capture. */
/* thread: Qfalse to read the calling thread's frames (signal-safe), or the
 * Ruby Thread of t (GVL held, Ruby 3.2+: the safepoint scheduler). */
/* ucontext: the handler's signal context when native frames are to be
 * captured too (native: true), else NULL. */
/* now_us STROBE_CAPTURE_NOTE: not a sample, a note of the thread's stack
 * (recorded as its latest, counted nowhere). */
#define STROBE_CAPTURE_NOTE INT64_MIN
int strobe_capture(strobe_thread_t *t, VALUE thread, int gc_kind, size_t gc_epoch, int64_t now_us, int *unchanged,
                   const void *ucontext);
/* Whether the slot of sequence seq has been drained (any thread). */
int strobe_capture_drained(int64_t seq);
/* GVL held: hand every completed slot to fn, oldest first. */
typedef void (*strobe_slot_fn)(const strobe_slot_t *slot);
void strobe_capture_drain(strobe_slot_fn fn);
/* The drain ran out of memory on the slot it holds: drop it, count it missed. */
void strobe_capture_abandon(void);
/* Under the profile lock, during GC marking: pin frames of slots not yet
 * drained. */
void strobe_capture_mark(void);

#endif
