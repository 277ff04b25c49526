/*
 * strobe.h - types and entry points shared by the Strobe C files.
 *
 * A sample travels: threads.c (which threads) -> sampler.c (timer thread,
 * signal, handler) -> capture.c (fills a ring slot; async-signal-safe) ->
 * profile.c, which the timer thread drains the ring into under the profile
 * lock, interning stacks in stack_table.c and logging samples -> results.c
 * builds the stackprof-shaped Hash. compact.c converts raw arrays to and from
 * the compact node-table form used in files. strobe.c binds it to Ruby.
 *
 * Global state lives in one struct per file; the whole profiler is a
 * process-wide singleton, like the signal it uses.
 */
#ifndef STROBE_H
#define STROBE_H 1

#include <ruby/ruby.h>
#include <ruby/debug.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stddef.h>
#include <pthread.h>
#include <sys/types.h>
#include <time.h>
#include <signal.h>

#include "markers.h"

/* A build that proves the old postponed-job API is not used (extconf.rb,
 * STROBE_MODERN_API_ONLY): Ruby 4.1 removes it. */
#ifdef STROBE_POISON_LEGACY_POSTPONED_JOB
#pragma GCC poison rb_postponed_job_register rb_postponed_job_register_one
#endif

/* Deepest stack recorded; deeper stacks keep their innermost frames. */
#define STROBE_MAX_DEPTH 1024
/* Stack buffers hold one more: a capture that fills them was deeper than
 * STROBE_MAX_DEPTH, and its outermost entry becomes "(truncated)". */
#define STROBE_STACK_CAPA (STROBE_MAX_DEPTH + 1)
/* Slots in the hand-off ring between the handler and the GVL-side drain. */
#define STROBE_RING_SLOTS 64
/* Timestamps one slot can hold for consecutive identical stacks. */
#define STROBE_SLOT_TIMES 64
/* The sampling signal: default action "ignore", so exec and late delivery
 * are harmless (see sampler.c). */
#define STROBE_SIGNAL SIGURG
#define STROBE_SIGNAL_NAME "SIGURG"
#define STROBE_SIGNAL_TRAP "URG"

/* Threads the sampler can target at once (entries are reused after a
 * thread ends). */
#define STROBE_MAX_THREADS 256

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
 * see sampler.c); UNKNOWN where they are not available. */
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

_Static_assert((STROBE_STATES & (STROBE_STATES - 1)) == 0, "state masks need a power of two");

/* ---- capture.c: the handler-to-GVL ring -------------------------------- */

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

/* A thread the sampler targets (threads.c), with its scratch capture buffer. */
enum { STROBE_THREAD_FREE = 0, STROBE_THREAD_CLAIMED, STROBE_THREAD_LIVE, STROBE_THREAD_DEAD };

typedef struct {
    atomic_int state;        /* FREE / CLAIMED / LIVE / DEAD, see threads.c */
    /* From here to scratch_frames is zeroed when an entry is (re)used. */
    /* Placement (placement.c): where the Ruby thread runs, its CPU time. */
    _Atomic pid_t tid;       /* native thread it runs on or last ran on, 0 none yet */
    atomic_int attached;     /* that native thread's CPU clock still counts for it */
    _Atomic int64_t cpu_base_ns;   /* CPU used before it got there */
    _Atomic int64_t cpu_attach_ns; /* that native thread's CPU clock when it got there */
    atomic_uint place_seq;   /* odd while a placement is being written */
    atomic_int place_lock;   /* orders placement writers */
    atomic_int mobile;       /* Ruby schedules it M:N: attached only while it holds the GVL */
    uint16_t index;          /* position in the registry */
    VALUE thread;            /* the Ruby Thread while it runs (marked), else Qnil */
    atomic_int guard_tid;    /* re-entry guard (sigstack.c): native thread holding it, 0 none */
    atomic_uintptr_t guard_frame; /* the holding handler's frame, 0 for code outside a handler */
    atomic_int nested_tick;  /* a signal came during its handler, which samples once more */
    atomic_int in_gc;        /* it runs a GC the GC hooks count (gcspan.c) */
    atomic_int deferred;     /* a sample is owed at the next safe point (JIT, see sampler.c) */
    atomic_int not_ruby;     /* its kernel thread runs no Ruby thread (ended, parked in Ruby's thread cache) */
    atomic_int paused;       /* not sampled now: a scope's thread between its scopes (sampler.c) */
    _Atomic long scope;      /* the scope it samples for (Native.scope_enter), 0 none */
    int scope_depth;         /* scopes it entered itself and has not left (registry lock) */
    int64_t cpu_carry_ns;    /* :cpu: CPU it had used towards its next sample as it paused */
    int64_t handler_cpu_ns;  /* handler (JIT deferral): its CPU time as it last returned, 0 none */
    _Atomic uint8_t gvl_state; /* STROBE_STATE_*, set by the GVL hook */
    _Atomic int64_t gvl_since_us; /* when gvl_state began (gvlspan.c), 0 unknown */
    _Atomic int64_t last_seq; /* ring seq of this thread's newest slot, -1 none */
    int profile_index;       /* its entry in strobe_profile.threads, -1 unknown */
    _Atomic int64_t cpu_last_ns; /* CPU mode (timer thread; the GVL hook reads it): CPU time at the last signal */
    /* Signals (:wall, :cpu) and :wall's owed samples in flight; :wall
     * signals only threads whose stack can have changed. */
    uint32_t sent;           /* timer: signals sent */
    uint32_t pending_ticks;  /* timer: ticks the newest signal has waited */
    atomic_uint handled;     /* handler: signals handled */
    uint64_t last_fingerprint;   /* handler: digest of its previous capture */
    _Atomic int64_t idle_cpu_ns; /* handler: its CPU time right after a capture
                                  * equal to the previous one, else -1 */
    atomic_int native_warm;  /* libunwind's per-thread state is set up (native.c) */
    int scratch_depth;
    int scratch_native_depth;
    uintptr_t scratch_native[STROBE_NATIVE_CAPA];
    uint8_t scratch_gc_kind;
    int64_t scratch_time;
    VALUE scratch_frames[STROBE_STACK_CAPA];
    int scratch_lines[STROBE_STACK_CAPA];
} strobe_thread_t;

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

/* ---- placement.c: where a Ruby thread runs, its CPU time --------------- */

/* The CPU-time clock of a native thread of this process, by kernel tid. */
clockid_t strobe_thread_cpu_clock(pid_t tid);
/* The calling native thread's kernel tid (cached; async-signal-safe). */
pid_t strobe_placement_self_tid(void);
/* fork child: the cached tid is the parent's. */
void strobe_placement_forget_tid(void);
/* Registration (entry CLAIMED): placed on tid (0: not on a native thread);
 * mobile: Ruby schedules it M:N; running_here: it is the calling thread. */
void strobe_placement_init(strobe_thread_t *t, pid_t tid, int mobile, int running_here);
/* Set at start: :cpu mode keeps mobile threads' CPU time. */
extern atomic_int strobe_placement_counts_cpu;
/* At Init: whether Ruby runs the main Ractor's threads M:N (RUBY_MN_THREADS). */
void strobe_placement_init_process(void);
extern int strobe_mn_threads;
/* Async-signal-safe: the LIVE thread placed on native thread tid and
 * running there (if M:N may move it), or NULL. */
strobe_thread_t *strobe_placement_find(pid_t tid);
/* Async-signal-safe: t's CPU time in ns, -1 if it cannot be read now (a
 * write in progress after tries attempts, or its native thread gone). */
int64_t strobe_placement_cpu_ns(const strobe_thread_t *t, int tries);
/* Async-signal-safe: the tid t runs on, 0 if it is not running there (or
 * a write was in progress after tries attempts). */
pid_t strobe_placement_tid(const strobe_thread_t *t, int tries);
/* GVL RESUMED hook, on the native thread about to run t: t is here now. */
void strobe_placement_resumed(strobe_thread_t *t);
/* GVL SUSPENDED hook, on t's native thread: a mobile t leaves it (its CPU
 * time frozen until it resumes). */
void strobe_placement_suspended(strobe_thread_t *t);

/* ---- threads.c: the registry ------------------------------------------- */

/* Ruby 3.3+: threads are found by the Ruby Thread, through the data Ruby
 * keeps per thread for profilers, not by the native thread they run on. */
#ifdef HAVE_RB_INTERNAL_THREAD_SPECIFIC_GET
#define STROBE_FOLLOWS_RUBY_THREADS 1
#endif
/* At Init: the thread-specific key, where Ruby has them. */
void strobe_threads_init(void);
void strobe_threads_reset(void);
pid_t strobe_gettid(void);
/* GVL held: the LIVE entry for tid, adding one in the given state;
 * NULL when the registry is full. */
strobe_thread_t *strobe_threads_add(pid_t tid, VALUE thread, int state);
strobe_thread_t *strobe_threads_find(pid_t tid);
/* Lock-free (no GVL needed): the LIVE entry of the Ruby Thread, or NULL. */
strobe_thread_t *strobe_threads_of(VALUE thread);
/* The calling thread's LIVE entry, or NULL. Async-signal-safe before Ruby
 * 3.3; with STROBE_FOLLOWS_RUBY_THREADS it asks Ruby for the current thread
 * and must not be called from the handler. */
strobe_thread_t *strobe_threads_self(void);
void strobe_threads_end(strobe_thread_t *t);
/* Registry lock held: free DEAD entries whose kernel thread is gone and
 * whose samples are drained. */
void strobe_threads_reclaim(void);
/* Held by the timer thread for a tick, and by strobe_threads_add(). */
void strobe_threads_lock(void);
void strobe_threads_unlock(void);
/* Async-signal-safe: bumped by every reset (a new round's entries). */
unsigned strobe_threads_generation(void);
int strobe_threads_len(void);
strobe_thread_t *strobe_threads_at(int index);
int strobe_threads_live(void);
void strobe_threads_mark(void);

/* ---- native.c: native frames (native: true) ------------------------------ */

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

/* ---- symbols.c: names of native code ----------------------------------- */

typedef struct {
    uintptr_t start;         /* the function's first address, 0 when unnamed */
    const char *name;        /* its symbol, NULL when unnamed */
    const char *path;        /* the object it is in */
    const char *object_name; /* the object's file name without directories */
    uintptr_t base;          /* the object's load bias */
    int object;              /* the object's index */
} strobe_symbol_t;

/* The object and function at addr; 0 (out zeroed) when in no object.
 * Strings stay valid for the life of the process. Not signal-safe. */
int strobe_symbols_find(uintptr_t addr, strobe_symbol_t *out);

/* ---- stack_table.c: interned frames and the prefix tree ---------------- */

typedef struct {
    VALUE value;             /* iseq / method entry, or a number for GC kinds */
    uint8_t kind;
    uint16_t level;          /* its innermost level (from the root) in that batch */
    uint32_t batch;          /* the table's batch when it was interned */
} strobe_frame_t;

typedef struct {
    uint32_t parent;         /* node id; 0 is the root */
    uint32_t frame;          /* frame id */
    int32_t line;
} strobe_node_t;

/* Direct-mapped cache of recent (parent, frame VALUE, line) -> node lookups,
 * so a stack seen before interns each new frame with one probe. */
#define STROBE_CHILD_CACHE_BITS 9
typedef struct {
    VALUE value;
    uint32_t parent;
    int32_t line;
    uint32_t node;           /* 0 = empty (the root is never a child) */
} strobe_child_cache_t;

typedef struct {
    strobe_frame_t *frames;
    uint32_t frames_len, frames_capa;
    uint32_t *frame_slots;   /* open addressing: frame id + 1, 0 = empty */
    uint32_t frame_slots_capa;
    strobe_node_t *nodes;    /* nodes[0] is the root */
    uint32_t nodes_len, nodes_capa;
    uint32_t *node_slots;    /* open addressing: node id, 0 = empty */
    uint32_t node_slots_capa;
    /* The stack being interned (profile.c): its number and the level
     * (from the root) being interned, so frames first seen in the same
     * stack can be listed innermost first, as stackprof lists them. */
    uint32_t batch;
    uint16_t level;
    strobe_child_cache_t child_cache[1 << STROBE_CHILD_CACHE_BITS];
} strobe_stack_table_t;

void strobe_stack_table_init(strobe_stack_table_t *st);
void strobe_stack_table_free(strobe_stack_table_t *st);
uint32_t strobe_stack_table_frame(strobe_stack_table_t *st, VALUE value, int kind);
uint32_t strobe_stack_table_node(strobe_stack_table_t *st, uint32_t parent, uint32_t frame, int32_t line);
uint32_t strobe_stack_table_child_slow(strobe_stack_table_t *st, uint32_t parent, VALUE value, int32_t line);

static inline strobe_child_cache_t *
strobe_child_cache_entry(strobe_stack_table_t *st, uint32_t parent, VALUE value, int32_t line)
{
    uint64_t key = ((uint64_t)parent << 32 | (uint32_t)line) ^ (uint64_t)value;
    return &st->child_cache[(key * 0x9e3779b97f4a7c15ULL) >> (64 - STROBE_CHILD_CACHE_BITS)];
}

/* The node for a Ruby frame VALUE at line under parent (interning both).
 * Inline for the cache hit, the common case on every sample. */
static inline uint32_t
strobe_stack_table_child(strobe_stack_table_t *st, uint32_t parent, VALUE value, int32_t line)
{
    const strobe_child_cache_t *c = strobe_child_cache_entry(st, parent, value, line);
    if (c->node && c->value == value && c->parent == parent && c->line == line) return c->node;
    return strobe_stack_table_child_slow(st, parent, value, line);
}
void strobe_stack_table_mark(const strobe_stack_table_t *st);

/* ---- profile.c: what was sampled ---------------------------------------- */

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

/* Allocation failed: inside strobe_profile_locked() it unwinds to there;
 * elsewhere (GVL held) it raises NoMemoryError. */
_Noreturn void strobe_out_of_memory(void);
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
int strobe_profile_thread_index(pid_t tid, VALUE thread);
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

/* ---- sampler.c: timers, signal, handler, fork --------------------------- */

void strobe_sampler_init(void);
/* Returns NULL on success, or a message for ArgumentError/RuntimeError. */
/* Who triggers time-mode samples: the timer thread signalling each thread;
 * one process-wide POSIX timer (also the fallback when the timer thread
 * cannot start); or the timer thread asking for samples at safe points,
 * with no signal at all (scheduler: :thread). */
typedef enum { STROBE_TIMER_THREADS, STROBE_TIMER_PROCESS, STROBE_TIMER_SAFEPOINTS } strobe_timer_t;
/* only: an Array of the Threads to profile, or Qnil for every thread. */
/* native: also capture native frames (mode :wall or :cpu, with signals). */
const char *strobe_sampler_start(strobe_mode_t mode, long interval, VALUE only, strobe_timer_t timer, int native);
void strobe_sampler_stop(void);
int strobe_sampler_running(void);
/* Profiled threads not sampled because STROBE_MAX_THREADS were running. */
uint64_t strobe_sampler_unsampled_threads(void);
/* Signals the timer thread sent since the last start. */
uint64_t strobe_sampler_signals_sent(void);
void strobe_sampler_forget_unsampled(void);
/* Custom mode / object mode: sample the current thread now (GVL held). */
int strobe_sampler_sample_now(void);
/* GVL held: record everything the handler captured so far. */
void strobe_sampler_flush(void);
/* GVL held: the calling thread (one of Strobe's own, such as strobe
 * serve's HTTP server) is never profiled from now on. */
void strobe_sampler_exclude_current(void);
/* GVL held: whether thread is to be profiled (the threads: option, and not
 * one of Strobe's own); for the sampler and the tracer alike. */
int strobe_sampler_profiled(VALUE thread);
/* The threads to profile: an Array of Threads, or nil for all (tracing;
 * sampling sets it as it starts). */
void strobe_sampler_only(VALUE threads);
/* GVL held: the calling thread is sampled in a new scope from now on,
 * registered if it was not, and so is every thread it starts meanwhile
 * (Ruby 3.2+, by Fiber storage under the scope's number). Returns that
 * number (> 0), or 0 when it is not sampled (not profiling, or
 * STROBE_MAX_THREADS running). */
long strobe_sampler_scope_enter(void);
/* GVL held: the threads scope id started are no longer sampled (paused,
 * their samples kept), nor the calling thread once its last scope ends. */
void strobe_sampler_scope_leave(long id);
/* GVL held: the ids (kernel tids) of up to max threads that open scope id's
 * code started, into out; returns how many. */
int strobe_sampler_scope_threads(long id, pid_t *out, int max);
/* The Fiber storage key (a Symbol) a scope is inherited by. */
VALUE strobe_sampler_scope_key(void);
/* GVL held: marker m on the calling thread if it is sampled now (see
 * strobe_profile_add_marker); 0 when it is not kept. */
int strobe_sampler_add_marker(strobe_marker_t *m);
/* GVL held: whether the calling thread is being sampled now (a marker it
 * added would be kept). */
int strobe_sampler_current_sampled(void);
/* Whether thread t is sampled now (not paused between scopes). Async-signal-safe. */
int strobe_sampler_sampled(const strobe_thread_t *t);
/* A forked child puts /dev/null in place of descriptor fd (strobe serve's
 * listening socket), in the atfork child handler. */
void strobe_sampler_close_in_children(int fd);
/* Registered thread whose tid matches the caller (signal handler). */
void strobe_sampler_mark(void);

/* ---- results.c ----------------------------------------------------------- */

/* The result of the profile (nil when nothing was started), which is
 * cleared: built from a copy taken under the profile lock. */
VALUE strobe_results_take(void);
/* The result so far, while profiling goes on (or nil), the same way; the
 * profile is kept. */
VALUE strobe_results_snapshot(int cut);
void strobe_results_aggregate(const strobe_node_t *nodes, uint32_t nodes_len, const uint64_t *self,
                              VALUE details_by_frame, VALUE frame_ids, uint32_t frames_len, int aggregate);
void strobe_results_raw(VALUE result, const strobe_node_t *nodes, uint32_t count,
                        const uint32_t *sample_nodes, const int64_t *times, VALUE thread_ids,
                        const uint16_t *sample_threads, const uint8_t *sample_states,
                        int64_t start_us, VALUE frame_ids);
VALUE strobe_results_states(const uint64_t *counts);
/* :running, :waiting or :blocked for a STROBE_STATE_*, nil for UNKNOWN. */
VALUE strobe_state_sym(int state);
/* The STROBE_STATE_* of such a Symbol, or -1. */
int strobe_state_of(VALUE sym);

/* ---- trace.c: mode :trace ----------------------------------------------------- */

void strobe_trace_define(VALUE mNative);
void strobe_trace_start(int cpu, VALUE names, VALUE paths, VALUE patterns);
void strobe_trace_stop(void);
int strobe_trace_running(void);
/* Something was traced since the last results. */
int strobe_trace_active(void);

/* ---- compact.c ------------------------------------------------------------ */

/* How far loading may expand a file's samples (see compact.c): at most
 * STROBE_EXPAND_PER_NUMBER entries per number the file gives for them and
 * STROBE_EXPAND_PER_BYTE per byte of the file as stored, or
 * STROBE_EXPAND_FLOOR whatever the file; more is refused. */
#define STROBE_EXPAND_FLOOR ((uint64_t)1 << 24)
#define STROBE_EXPAND_PER_NUMBER 128
#define STROBE_EXPAND_PER_BYTE 1024
/* That limit for numbers numbers in a file of stored bytes (0: not known,
 * no limit per byte); overflow-checked. */
uint64_t strobe_expand_limit(uint64_t numbers, uint64_t stored);
void strobe_compact_define(VALUE mNative);

/* ---- subset.c --------------------------------------------------------------- */

void strobe_subset_define(VALUE mNative);

/* ---- report.c --------------------------------------------------------------- */

/* Also the exports (pprof.c, firefox.c, speedscope.c, through report.h). */
void strobe_report_define(VALUE mNative);

/* ---- strobe.c ------------------------------------------------------------- */

extern VALUE strobe_eProfileError;

/* ary[i] (i in range) as a long, for arrays read from a result or a file:
 * anything but a Fixnum (another type, or an integer too big for a long)
 * raises Strobe::ProfileError naming what[i]. GVL held. */
static inline long
strobe_fixnum_at(VALUE ary, long i, const char *what)
{
    VALUE v = RARRAY_AREF(ary, i);
    if (!FIXNUM_P(v)) rb_raise(strobe_eProfileError, "%s[%ld] is not an integer in range", what, i);
    return FIX2LONG(v);
}
VALUE strobe_sym(const char *name);

#endif
