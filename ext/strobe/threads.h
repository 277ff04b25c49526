/*
 * threads.h - the registry of the threads the sampler targets (threads.c):
 * one entry per thread, in a fixed array that never moves, holding what the
 * timer, the handler, the hooks and the placement (placement.c) keep about
 * it, and its scratch capture buffer.
 *
 * Async-signal-safe: what threads.c says is (strobe_threads_self before Ruby
 * 3.3, strobe_threads_find, strobe_threads_at, strobe_threads_generation).
 */
#ifndef STROBE_THREADS_H
#define STROBE_THREADS_H 1

#include "sampling.h"
#include <stdatomic.h>
#include <sys/types.h>

/* Threads the sampler can target at once (entries are reused after a
 * thread ends). */
#define STROBE_MAX_THREADS 256

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
    VALUE alive_lock;        /* before Ruby 3.3: a Mutex it holds while its Ruby code runs (marked), 0 none */
    atomic_int guard_tid;    /* re-entry guard (sigstack.c): native thread holding it, 0 none */
    atomic_uintptr_t guard_frame; /* the holding handler's frame, 0 for code outside a handler */
    atomic_int in_gc;        /* it runs a GC the GC hooks count (gcspan.c) */
    atomic_int deferred;     /* a sample is owed at the next safe point (JIT, see handler.c) */
    atomic_int not_ruby;     /* its kernel thread runs no Ruby thread (ended, parked in Ruby's thread cache) */
    atomic_int paused;       /* not sampled now: a scope's thread between its scopes (scopes.c) */
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
/* Before Ruby 3.3, GVL held, on t's own thread: t holds a Mutex of its
 * own from now until its Ruby code ends, which Ruby releases as the thread
 * dies, however it dies (it fires THREAD_END only for a normal return),
 * before it frees the thread's frames. Nothing on 3.3+. */
void strobe_threads_watch_end(strobe_thread_t *t);
/* Async-signal-safe, in a handler on t's own native thread: whether t's
 * Ruby code has ended (its Mutex released); 0 on 3.3+, whose THREAD_END
 * comes for every thread, and for a thread not watched. */
int strobe_threads_ended(const strobe_thread_t *t);
/* Makes t DEAD: nothing signals it any more (a thread found gone, or
 * retired by strobe_threads_add; the timer calls it under the lock). */
void strobe_threads_end(strobe_thread_t *t);
/* GVL held, on t's own thread as it finishes (not under the registry lock):
 * t DEAD, and every sampling signal sent to it handled by the time this
 * returns, before Ruby frees the thread's alternate signal stack. */
void strobe_threads_end_here(strobe_thread_t *t);
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

#endif
