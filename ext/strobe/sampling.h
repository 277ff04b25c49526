/*
 * sampling.h - what every stage of sampling agrees a sample is made of:
 * the profiling modes, frame kinds and frame values, how deep a stack is
 * kept, and the states a sampled thread can be in. Definitions only (no
 * code): usable anywhere, a signal handler included.
 */
#ifndef STROBE_SAMPLING_H
#define STROBE_SAMPLING_H 1

#include "strobe.h"

/* Deepest stack recorded; deeper stacks keep their innermost frames. */
#define STROBE_MAX_DEPTH 1024
/* Stack buffers hold one more: a capture that fills them was deeper than
 * STROBE_MAX_DEPTH, and its outermost entry becomes "(truncated)". */
#define STROBE_STACK_CAPA (STROBE_MAX_DEPTH + 1)

typedef enum {
    STROBE_MODE_WALL = 0,
    STROBE_MODE_CPU,
    STROBE_MODE_OBJECT,
    STROBE_MODE_CUSTOM
} strobe_mode_t;

/* Frame kinds: a Ruby frame (iseq or method entry) or a GC pseudo-frame. */
typedef enum {
    STROBE_FRAME_RUBY = 0,
    STROBE_FRAME_GC,      /* "(garbage collection)" */
    STROBE_FRAME_MARKING, /* "(marking)" */
    STROBE_FRAME_SWEEPING, /* "(sweeping)" */
    STROBE_FRAME_TRUNCATED, /* "(truncated)": the outermost entry of a stack cut to STROBE_MAX_DEPTH */
    STROBE_FRAME_NATIVE   /* a native (C) function, woven under the Ruby frames (native.c) */
} strobe_frame_kind_t;

/* Native frames captured per sample (native: true), innermost first. */
#define STROBE_NATIVE_CAPA 128
/* A stack as recorded: the Ruby frames and the native ones woven under them. */
#define STROBE_PATH_CAPA (STROBE_STACK_CAPA + STROBE_NATIVE_CAPA)
/* A native frame's function start address as a frame value: odd, so never
 * an object (rb_profile_frames gives aligned pointers) nor a GC kind. */
#define STROBE_NATIVE_VALUE(addr) ((VALUE)(((uintptr_t)(addr) << 1) | 1))
#define STROBE_NATIVE_P(value) (((VALUE)(value) & 1) != 0)
#define STROBE_NATIVE_ADDR(value) ((uintptr_t)(value) >> 1)

/* What a thread was doing when sampled, from Ruby's GVL events (Ruby 3.2+,
 * see gvlhook.c); UNKNOWN where they are not available. */
enum {
    STROBE_STATE_UNKNOWN = 0,
    STROBE_STATE_RUNNING,    /* holding the GVL */
    STROBE_STATE_WAITING,    /* ready to run, waiting for the GVL */
    STROBE_STATE_BLOCKED,    /* released the GVL: IO, sleep, a lock, C code */
    STROBE_STATES
};

/* The placeholder VALUE of the "(truncated)" entry: an immediate that is no
 * object (GC marking skips it), like the GC kinds' values. */
#define STROBE_TRUNCATED_VALUE ((VALUE)STROBE_FRAME_TRUNCATED)

_Static_assert((STROBE_STATES & (STROBE_STATES - 1)) == 0, "state masks need a power of two");

#endif
