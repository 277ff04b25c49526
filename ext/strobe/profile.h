/*
 * profile.h - what was sampled (profile.c): strobe_profile, with its stack
 * table, node counts, sample log and threads, and the profile lock every
 * writer takes. Only strobe_profile_add_missed is async-signal-safe.
 */
#ifndef STROBE_PROFILE_H
#define STROBE_PROFILE_H 1

#include "capture.h"
#include "stack_table.h"
#include "markers.h"

typedef struct {
    uint32_t node;
    uint32_t time_offset;    /* microseconds after the chunk's base time */
    uint16_t thread;         /* index into profile threads */
    uint16_t flags;          /* the thread's STROBE_STATE_* */
} strobe_sample_t;

#define STROBE_CHUNK_SAMPLES 8192
typedef struct strobe_chunk {
    struct strobe_chunk *next;
    int64_t base_us;
    uint32_t len;
    strobe_sample_t samples[STROBE_CHUNK_SAMPLES];
} strobe_chunk_t;

enum { STROBE_JIT_NONE = 0, STROBE_JIT_YJIT, STROBE_JIT_ZJIT };

/* Result ids of threads without a native thread of their own (M:N, or a
 * native thread an earlier thread of the profile used) start here: above
 * Linux's largest possible tid (PID_MAX_LIMIT, 2^22), so never a tid. */
#define STROBE_SHARED_THREAD_ID_BASE 4194304

typedef struct {
    pid_t tid;               /* kernel thread it was first sampled on */
    int mn;                  /* Ruby scheduled it M:N: tid is not its own */
    VALUE thread;            /* Ruby Thread while it runs (marked), else Qnil */
    VALUE name;              /* its name, taken when it ended (marked) */
    uint64_t samples;
    uint32_t last_node;      /* leaf of its latest sample (0 none): repeats reuse it */
    int last_truncated;      /* that sample's stack was cut to STROBE_MAX_DEPTH */
    uint64_t states[STROBE_STATES]; /* its samples by state */
} strobe_profile_thread_t;

/* Sample log thread indexes are 16-bit; later threads share the last one. */
#define STROBE_MAX_PROFILE_THREADS 65535

typedef struct {
    int active;              /* something was started since the last results */
    int inherited;           /* a forked child's copy of its parent's profile:
                              * the parent's to report, dropped here when this
                              * process starts or asks for results */
    strobe_mode_t mode;
    long interval;           /* microseconds or allocations; 0 for custom */
    int raw, aggregate, ignore_gc;
    int process_timer;       /* some round sampled by the process-wide timer */
    int safepoint_timer;     /* some round sampled at safe points, without signals */
    int track_states;        /* samples carry GVL states (Ruby 3.2+, time modes) */
    strobe_stack_table_t table;
    uint64_t *node_self;     /* samples whose leaf is this node */
    uint32_t node_self_capa;
    strobe_chunk_t *first_chunk, *last_chunk;
    uint64_t samples, gc_samples;
    uint64_t truncated_samples; /* samples whose stack was cut to STROBE_MAX_DEPTH */
    int64_t start_us;        /* first start, CLOCK_MONOTONIC microseconds */
    int64_t started_at_us;   /* the same moment, CLOCK_REALTIME (Unix time) microseconds */
    int64_t stop_us;         /* latest stop, CLOCK_MONOTONIC microseconds (0: none yet) */
    strobe_profile_thread_t *threads;
    int threads_len, threads_capa;
    /* The previous stack recorded (innermost first, ending at the arrays'
     * ends) and its nodes, so a new one only interns what differs. */
    uint32_t prev_path[STROBE_PATH_CAPA];
    VALUE prev_frames[STROBE_PATH_CAPA];
    int prev_lines[STROBE_PATH_CAPA];
    int prev_depth;
    int native;              /* some round captured native frames */
    int jit;                 /* STROBE_JIT_*: the JIT on when a round started */
    uint64_t native_incomplete; /* native stacks that did not reach the interpreter */
    int cut;                 /* emptied while running (strobe_profile_cut): the stack
                              * table holds frames of earlier periods too */
    strobe_markers_t markers; /* the marker timeline (markers.c) */
} strobe_profile_t;

extern strobe_profile_t strobe_profile;

/* Runs fn(arg) under the profile lock; -1 if an allocation failed in it. */
int strobe_profile_locked(void (*fn)(void *), void *arg);
void strobe_profile_lock(void);
void strobe_profile_unlock(void);
void strobe_profile_begin(strobe_mode_t mode, long interval, int raw, int aggregate, int ignore_gc);
void strobe_profile_clear(void);
/* GVL held: drops the profile a forked child inherited (see inherited). */
void strobe_profile_drop_inherited(void);
/* Under the profile lock, sampling going on, its results just copied: the
 * profile starts afresh at now_us (counts, sample log and missed count
 * emptied; interned stacks kept, for the samples to come). Returns the
 * missed count it took. */
uint64_t strobe_profile_cut(int64_t now_us);
/* GVL held, on a finishing thread: keep its name, let go of the Thread. */
void strobe_profile_thread_ended(strobe_thread_t *t);

/* GVL held: record n samples of one stack (frames innermost first, or a
 * GC pseudo-stack when gc_kind is not STROBE_FRAME_RUBY) taken on thread t,
 * each with its time and state. */
void strobe_profile_record(strobe_thread_t *t, int gc_kind, const VALUE *frames, const int *lines,
                           int depth, const int64_t *times, const uint8_t *states, uint32_t n);
void strobe_profile_record_slot(const strobe_slot_t *slot);
/* Under the profile lock: one more sample of t's latest recorded Ruby stack,
 * at time_us. Returns 0 (recording nothing) when t has none. */
int strobe_profile_record_repeat(strobe_thread_t *t, int64_t time_us, int state);
/* Under the profile lock: t's latest stack is not to be repeated (it
 * resumes after a pause, its stack unknown). */
void strobe_profile_forget_stack(strobe_thread_t *t);
/* Adds marker m (markers.c) on thread t (NULL: on no thread), taking the
 * profile lock; no Ruby call (safe in GC hooks). Returns 0 if dropped. */
int strobe_profile_add_marker(strobe_thread_t *t, strobe_marker_t *m);
void strobe_profile_add_missed(uint64_t n);
uint64_t strobe_profile_missed(void);
void strobe_profile_mark(void);
size_t strobe_profile_memsize(void);

#endif
