/*
 * placement.c - which native thread a profiled Ruby thread runs on, and
 * how much CPU time the Ruby thread has used.
 *
 * A Ruby thread is not always a kernel thread. Under Ruby 3.3+'s M:N
 * scheduler (RUBY_MN_THREADS=1 for the main Ractor; other Ractors always)
 * Ruby threads take turns on shared native threads and move between them,
 * so a native thread's CPU clock is not a Ruby thread's, and the tid to
 * signal changes. Each registry entry therefore keeps its placement:
 *   - tid: the native thread it runs on (or last ran on; 0 never seen);
 *   - attached: nobody else has run there since, so that native thread's
 *     CPU clock is still advancing for this Ruby thread;
 *   - cpu_base_ns: CPU time it used before it got there;
 *   - cpu_attach_ns: that native thread's CPU clock when it got there.
 * Its CPU time is cpu_base_ns, plus (clock now - cpu_attach_ns) while
 * attached. A thread that keeps its native thread (every thread without
 * M:N) never moves, and this is just its kernel CPU clock.
 *
 * Ruby reports every move: the GVL RESUMED event runs on the native thread
 * that is about to run the Ruby thread (strobe_placement_resumed). There a
 * thread found elsewhere is moved here, and any other thread still attached
 * here is detached (its CPU time frozen): both are then marked shared (M:N),
 * which the result reports. A thread resuming where it already is costs two
 * loads: the 1:1 case pays nothing more per GVL event.
 *
 * Concurrency: placements are written from GVL hooks (on any native
 * thread, about any thread) and at registration (GVL held). Writers take a
 * per-entry spin lock and bump a sequence count around their stores; they
 * never hold two entries' locks at once. Readers (the timer thread, and the
 * signal handler) take no lock: they read between two equal even sequence
 * counts, retrying a bounded number of times. strobe_placement_cpu_ns and
 * strobe_placement_tid are async-signal-safe: a handler that interrupted a
 * writer on its own thread gets -1 / 0 rather than waiting.
 */
#include "strobe.h"
#include <sched.h>
#include <stdlib.h>

static __thread pid_t self_tid __attribute__((tls_model("initial-exec")));

pid_t
strobe_placement_self_tid(void)
{
    if (!self_tid) self_tid = strobe_gettid();
    return self_tid;
}

void
strobe_placement_forget_tid(void)
{
    self_tid = 0;
}

/* The CPU-time clock of any thread of this process, from its kernel tid:
 * the Linux clock id encoding (include/linux/posix-timers.h) that
 * pthread_getcpuclockid() also returns: ~tid << 3 | CPUCLOCK_PERTHREAD |
 * CPUCLOCK_SCHED. Computed unsigned to avoid shifting a negative value. */
clockid_t
strobe_thread_cpu_clock(pid_t tid)
{
    return (clockid_t)((~(uint32_t)tid << 3) | 6u);
}

static void
write_begin(strobe_thread_t *t)
{
    while (atomic_exchange_explicit(&t->place_lock, 1, memory_order_acquire)) sched_yield();
    atomic_fetch_add_explicit(&t->place_seq, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
}

static void
write_end(strobe_thread_t *t)
{
    atomic_fetch_add_explicit(&t->place_seq, 1, memory_order_release);
    atomic_store_explicit(&t->place_lock, 0, memory_order_release);
}

typedef struct {
    pid_t tid;
    int attached;
    int64_t base, attach;
} place_t;

/* A consistent copy of t's placement; 0 when a write kept overlapping. */
static int
read_place(const strobe_thread_t *t, place_t *p, int tries)
{
    while (tries-- > 0) {
        unsigned before = atomic_load_explicit(&t->place_seq, memory_order_acquire);
        if (before & 1) continue;
        p->tid = atomic_load_explicit(&t->tid, memory_order_relaxed);
        p->attached = atomic_load_explicit(&t->attached, memory_order_relaxed);
        p->base = atomic_load_explicit(&t->cpu_base_ns, memory_order_relaxed);
        p->attach = atomic_load_explicit(&t->cpu_attach_ns, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&t->place_seq, memory_order_relaxed) == before) return 1;
    }
    return 0;
}

/* Writer held: t's CPU time now, read from where it is attached (its
 * frozen time if detached, or if that native thread is gone). */
static int64_t
cpu_now_locked(const strobe_thread_t *t)
{
    int64_t base = atomic_load_explicit(&t->cpu_base_ns, memory_order_relaxed);
    if (!atomic_load_explicit(&t->attached, memory_order_relaxed)) return base;
    int64_t now = strobe_clock_ns(strobe_thread_cpu_clock(atomic_load_explicit(&t->tid, memory_order_relaxed)));
    return now < 0 ? base : base + (now - atomic_load_explicit(&t->cpu_attach_ns, memory_order_relaxed));
}

void
strobe_placement_init(strobe_thread_t *t, pid_t tid, int mobile)
{
    /* CLAIMED: nobody else reads or writes it yet. */
    atomic_store_explicit(&t->mobile, mobile, memory_order_relaxed);
    atomic_store_explicit(&t->tid, tid, memory_order_relaxed);
    atomic_store_explicit(&t->attached, tid != 0, memory_order_relaxed);
    atomic_store_explicit(&t->cpu_base_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&t->cpu_attach_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&t->shared, 0, memory_order_relaxed);
    atomic_store_explicit(&t->place_lock, 0, memory_order_relaxed);
}

int64_t
strobe_placement_cpu_ns(const strobe_thread_t *t, int tries)
{
    place_t p;
    if (!read_place(t, &p, tries)) return -1;
    if (!p.attached) return p.base;
    int64_t now = strobe_clock_ns(strobe_thread_cpu_clock(p.tid));
    return now < 0 ? -1 : p.base + (now - p.attach);
}

pid_t
strobe_placement_tid(const strobe_thread_t *t, int tries)
{
    place_t p;
    return read_place(t, &p, tries) && p.attached ? p.tid : 0;
}

void
strobe_placement_detach_others(strobe_thread_t *t, pid_t tid)
{
    if (tid == 0) return;
    for (int i = 0, n = strobe_threads_len(); i < n; i++) {
        strobe_thread_t *e = strobe_threads_at(i);
        if (e == t || atomic_load_explicit(&e->state, memory_order_acquire) != STROBE_THREAD_LIVE ||
            !atomic_load_explicit(&e->attached, memory_order_relaxed) ||
            atomic_load_explicit(&e->tid, memory_order_relaxed) != tid)
            continue;
        write_begin(e);
        if (atomic_load_explicit(&e->attached, memory_order_relaxed) &&
            atomic_load_explicit(&e->tid, memory_order_relaxed) == tid) {
            atomic_store_explicit(&e->cpu_base_ns, cpu_now_locked(e), memory_order_relaxed);
            atomic_store_explicit(&e->attached, 0, memory_order_relaxed);
        }
        write_end(e);
        atomic_store(&e->shared, 1);
        atomic_store(&t->shared, 1);
    }
}

void
strobe_placement_resumed(strobe_thread_t *t)
{
    pid_t me = strobe_placement_self_tid();
    if (atomic_load_explicit(&t->attached, memory_order_relaxed) &&
        atomic_load_explicit(&t->tid, memory_order_relaxed) == me)
        return;
    /* It moved here, or another Ruby thread ran here since it last did. */
    strobe_placement_detach_others(t, me);
    write_begin(t);
    atomic_store_explicit(&t->cpu_base_ns, cpu_now_locked(t), memory_order_relaxed);
    atomic_store_explicit(&t->cpu_attach_ns, strobe_clock_ns(CLOCK_THREAD_CPUTIME_ID), memory_order_relaxed);
    atomic_store_explicit(&t->tid, me, memory_order_relaxed);
    atomic_store_explicit(&t->attached, 1, memory_order_relaxed);
    write_end(t);
}

strobe_thread_t *
strobe_placement_find(pid_t tid)
{
    for (int i = 0, n = strobe_threads_len(); i < n; i++) {
        strobe_thread_t *t = strobe_threads_at(i);
        if (atomic_load_explicit(&t->state, memory_order_acquire) == STROBE_THREAD_LIVE &&
            atomic_load_explicit(&t->attached, memory_order_relaxed) &&
            atomic_load_explicit(&t->tid, memory_order_relaxed) == tid &&
            (!atomic_load_explicit(&t->mobile, memory_order_relaxed) ||
             atomic_load_explicit(&t->gvl_state, memory_order_relaxed) == STROBE_STATE_RUNNING))
            return t;
    }
    return NULL;
}

int strobe_mn_threads;

void
strobe_placement_init_process(void)
{
    /* As Ruby decides at boot (thread_pthread.c): RUBY_MN_THREADS > 0
     * schedules the main Ractor's threads, all but the main thread, M:N. */
    const char *mn = getenv("RUBY_MN_THREADS");
    strobe_mn_threads = mn && atoi(mn) > 0;
}
