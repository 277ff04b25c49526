/*
 * threads.c - the registry of threads the sampler targets.
 *
 * A fixed array of STROBE_MAX_THREADS entries that never moves, so a handler
 * can hold a pointer to its entry. Each entry is FREE, CLAIMED, LIVE or DEAD:
 *   - strobe_threads_add() (GVL held) claims an entry, fills it and
 *     publishes it LIVE with a release store;
 *   - strobe_threads_end_here() (GVL held, on the thread that is
 *     finishing) makes it DEAD: the timer stops signalling it, and its own
 *     handler, which can only run between that thread's instructions, no
 *     longer finds it; every signal sent to it before has been handled
 *     when it returns (the thread's alternate stack is about to be freed);
 *   - an entry is reused only once every sample it captured has been
 *     drained (so no sample is charged to the next owner), and either by the
 *     same kernel thread (Ruby 3.1 keeps native threads cached and runs the
 *     next Thread on them) or after that kernel thread is gone (so no stale
 *     thread-local pointer can still name it): strobe_threads_reclaim()
 *     (timer thread, now and then) frees those. Short-lived threads
 *     therefore cost entries only while they run.
 * strobe_threads_reset() (GVL held, nothing sampling) frees everything and
 * bumps a generation number.
 *
 * Locking: the registry lock orders the timer thread's scan (it holds it
 * for a whole tick) against strobe_threads_add(), which rewrites an entry's
 * fields; lock order is registry, then profile. Handlers take no lock.
 *
 * Identity: before Ruby 3.3 a thread is its kernel thread: an entry is
 * found by tid, and strobe_threads_self() (async-signal-safe) reads an
 * initial-exec thread-local pointer checked against the generation, and on
 * a miss scans the array for the caller's kernel tid. Ruby 3.3+ may run a
 * Ruby thread on any native thread (M:N), so there an entry is found by its
 * Ruby Thread, through the pointer Ruby keeps per thread for profilers
 * (rb_internal_thread_specific_*); strobe_threads_self() then asks Ruby for
 * the current thread and needs the GVL (the handler finds its entry from
 * the signal instead, see handler.c). Where a thread runs and its CPU time
 * are its placement (placement.c).
 */
#include "threads.h"
#include "capture.h"
#include "clock.h"
#include "gvlspan.h"
#include "placement.h"
#include <pthread.h>
#include <errno.h>
#include <signal.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <stdlib.h>
#include <string.h>
#include <ruby/thread.h>

static strobe_thread_t entries[STROBE_MAX_THREADS];
static atomic_int entries_len;      /* entries[0, len) have ever been used */
static atomic_uint generation;
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

static atomic_uint version;
#ifndef STROBE_FOLLOWS_RUBY_THREADS
static __thread strobe_thread_t *self_entry __attribute__((tls_model("initial-exec")));
static __thread unsigned self_generation __attribute__((tls_model("initial-exec")));
/* A thread that is not registered (not profiled, or not yet) remembers the
 * registry version it found itself missing from, so the GVL hook and the
 * handler do not rescan on every call until something is added. */
static __thread unsigned self_missed_version __attribute__((tls_model("initial-exec")));
#endif

pid_t
strobe_gettid(void)
{
    return (pid_t)syscall(SYS_gettid);
}

void
strobe_threads_lock(void)
{
    pthread_mutex_lock(&registry_lock);
}

void
strobe_threads_unlock(void)
{
    pthread_mutex_unlock(&registry_lock);
}

void
strobe_threads_reset(void)
{
    int n = atomic_load(&entries_len);
    for (int i = 0; i < n; i++) {
        entries[i].thread = Qnil;
        entries[i].alive_lock = 0;
        atomic_store(&entries[i].state, STROBE_THREAD_FREE);
    }
    atomic_store(&entries_len, 0);
    atomic_fetch_add(&generation, 1);
    atomic_fetch_add(&version, 1);
}

/* The LIVE entry whose kernel thread is tid, or (thread not Qundef) whose
 * Ruby Thread is thread. Lock-free, async-signal-safe. */
static inline strobe_thread_t *
find_live(pid_t tid, VALUE thread)
{
    int n = atomic_load_explicit(&entries_len, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (atomic_load_explicit(&entries[i].state, memory_order_acquire) == STROBE_THREAD_LIVE &&
            (thread == Qundef ? entries[i].tid == tid : entries[i].thread == thread))
            return &entries[i];
    return NULL;
}

strobe_thread_t *
strobe_threads_find(pid_t tid)
{
    return find_live(tid, Qundef);
}

#ifdef STROBE_FOLLOWS_RUBY_THREADS
/* Ruby 3.3+: each Ruby Thread carries a pointer to its entry in the slot
 * Ruby keeps for profilers (rb_internal_thread_specific_*, async-signal-
 * safe), so a thread is found by what it is, wherever it runs (M:N). The
 * pointer is checked against the entry, which may have been reused. */
static rb_internal_thread_specific_key_t entry_key = -1;

void
strobe_threads_init(void)
{
    entry_key = rb_internal_thread_specific_key_create();
    strobe_placement_init_process();
}

strobe_thread_t *
strobe_threads_of(VALUE thread)
{
    strobe_thread_t *t = rb_internal_thread_specific_get(thread, entry_key);
    if (t && atomic_load_explicit(&t->state, memory_order_acquire) == STROBE_THREAD_LIVE && t->thread == thread) return t;
    return NULL;
}

strobe_thread_t *
strobe_threads_self(void)
{
    /* The Ruby thread this native thread runs now, if it runs one. */
    if (!ruby_native_thread_p()) return NULL;
    return strobe_threads_of(rb_thread_current());
}
#else
void
strobe_threads_init(void)
{
}

strobe_thread_t *
strobe_threads_of(VALUE thread)
{
    return find_live(0, thread);
}

strobe_thread_t *
strobe_threads_self(void)
{
    unsigned gen = atomic_load(&generation);
    strobe_thread_t *t = self_entry;
    if (t && self_generation == gen && atomic_load(&t->state) == STROBE_THREAD_LIVE) return t;
    /* Stored plus one, so the zero a new thread starts with never matches. */
    unsigned v = atomic_load(&version) + 1;
    if (self_missed_version == v) return NULL;
    t = strobe_threads_find(strobe_gettid());
    if (t) {
        self_entry = t;
        self_generation = gen;
    } else {
        self_missed_version = v;
    }
    return t;
}
#endif

/* A DEAD entry may be reused: all it captured has been drained, and its
 * kernel thread is tid (the same native thread running a new Thread) or
 * gone. */
static int
reusable(strobe_thread_t *t, pid_t tid)
{
    if (atomic_load(&t->state) != STROBE_THREAD_DEAD || !strobe_capture_drained(t->last_seq)) return 0;
#ifdef STROBE_FOLLOWS_RUBY_THREADS
    return 1; /* no thread-local pointer names it (strobe_threads_of checks) */
#endif
    if (t->tid == tid || t->tid == 0) return 1;
    return syscall(SYS_tgkill, (long)getpid(), (long)t->tid, 0L) != 0 && errno == ESRCH;
}

static strobe_thread_t *
claim(pid_t tid)
{
    int n = atomic_load(&entries_len);
    strobe_thread_t *t = NULL;
    /* The same kernel thread's old entry first, then one the timer freed,
     * then a new entry, and once the array is full a DEAD entry whose
     * thread is gone (with no timer thread, nothing else frees them). */
    for (int i = 0; i < n && !t; i++)
        if (entries[i].tid == tid && reusable(&entries[i], tid)) t = &entries[i];
    for (int i = 0; i < n && !t; i++)
        if (atomic_load(&entries[i].state) == STROBE_THREAD_FREE) t = &entries[i];
    if (!t && n < STROBE_MAX_THREADS) t = &entries[n];
    for (int i = 0; i < n && !t; i++)
        if (reusable(&entries[i], tid)) t = &entries[i];
    if (t) atomic_store(&t->state, STROBE_THREAD_CLAIMED);
    return t;
}

strobe_thread_t *
strobe_threads_add(pid_t tid, VALUE thread, int state)
{
    strobe_thread_t *t = strobe_threads_of(thread);
    if (t) {
        atomic_store(&t->not_ruby, 0);
        return t;
    }
    /* Other Threads registered on the same kernel thread: one that has
     * ended did so without THREAD_END (Ruby 3.1 fires it only for a normal
     * return, not for a thread that raised or was killed) and Ruby's thread
     * cache runs this one on its native thread; it is retired. One still
     * alive takes turns with this one on it (M:N, Ruby 3.3+). */
    int n = atomic_load(&entries_len);
    ID alive = rb_intern("alive?");
    for (int i = 0; i < n && tid != 0; i++)
        if (atomic_load(&entries[i].state) == STROBE_THREAD_LIVE && entries[i].tid == tid &&
            !RTEST(rb_funcall(entries[i].thread, alive, 0)))
            strobe_threads_end(&entries[i]);
    pthread_mutex_lock(&registry_lock);
    t = claim(tid);
    if (!t) {
        pthread_mutex_unlock(&registry_lock);
        return NULL;
    }
    /* CLAIMED: no handler uses it (they look for LIVE), the timer is kept
     * off by the lock, and only the GVL holder adds. */
    memset((char *)t + offsetof(strobe_thread_t, tid), 0,
           offsetof(strobe_thread_t, scratch_frames) - offsetof(strobe_thread_t, tid));
    /* M:N (Ruby 3.3+, RUBY_MN_THREADS at boot): every thread. */
    strobe_placement_init(t, tid, strobe_mn_threads, thread == rb_thread_current());
    t->index = (uint16_t)(t - entries);
    t->thread = thread;
    t->last_seq = -1;
    t->profile_index = -1;
    atomic_store(&t->idle_cpu_ns, -1);
    atomic_store(&t->gvl_state, (uint8_t)state);
    strobe_gvlspan_begin(t, strobe_now_us());
    int64_t cpu = strobe_placement_cpu_ns(t, 1);
    if (cpu >= 0) t->cpu_last_ns = cpu;
    atomic_store_explicit(&t->state, STROBE_THREAD_LIVE, memory_order_release);
    if (t->index == atomic_load(&entries_len))
        atomic_store_explicit(&entries_len, t->index + 1, memory_order_release);
    atomic_fetch_add(&version, 1);
    pthread_mutex_unlock(&registry_lock);
#ifdef STROBE_FOLLOWS_RUBY_THREADS
    rb_internal_thread_specific_set(thread, entry_key, t);
#endif
    return t;
}

void
strobe_threads_reclaim(void)
{
    int n = atomic_load(&entries_len);
    for (int i = 0; i < n; i++) {
        strobe_thread_t *t = &entries[i];
        /* A thread that ended without THREAD_END (see strobe_threads_add),
         * once its native thread has left Ruby's cache too. */
        if (atomic_load(&t->state) == STROBE_THREAD_LIVE && atomic_load(&t->not_ruby) && t->tid != 0 &&
            syscall(SYS_tgkill, (long)getpid(), (long)t->tid, 0L) != 0 && errno == ESRCH)
            strobe_threads_end(t);
        if (atomic_load(&t->state) == STROBE_THREAD_DEAD && reusable(t, 0))
            atomic_store(&t->state, STROBE_THREAD_FREE);
    }
}

/* Ruby 3.1 and 3.2 fire no THREAD_END for a thread that raised or was
 * killed: after its Ruby code has ended the thread clears its VM stack
 * (rb_ec_clear_vm_stack, three stores) and a handler reading its frames
 * halfway through walked past the stack's end ([BUG] in rb_profile_frames:
 * 3 runs of 24 of a program whose threads raise, under the process timer at
 * 100 us). What Ruby does do for a dying thread, before that: it releases
 * every Mutex the thread holds (rb_threadptr_unlock_all_locking_mutexes),
 * right after marking it killed. So a thread registering on such a Ruby
 * locks a Mutex of its own, and its handler reads its frames only while
 * it is locked. 3.3+ fires THREAD_END for every thread (registered threads
 * end there), and threads are found otherwise (STROBE_FOLLOWS_RUBY_THREADS). */
void
strobe_threads_watch_end(strobe_thread_t *t)
{
#ifndef STROBE_FOLLOWS_RUBY_THREADS
    if (t->alive_lock) return;
    VALUE lock = rb_mutex_new();
    if (rb_mutex_trylock(lock) == Qtrue) t->alive_lock = lock; /* a new Mutex: never held */
#else
    (void)t;
#endif
}

int
strobe_threads_ended(const strobe_thread_t *t)
{
#ifndef STROBE_FOLLOWS_RUBY_THREADS
    /* rb_mutex_locked_p reads the Mutex's owner: one load, nothing more. */
    return t->alive_lock && !RTEST(rb_mutex_locked_p(t->alive_lock));
#else
    (void)t;
    return 0;
#endif
}

void
strobe_threads_end(strobe_thread_t *t)
{
    int expected = STROBE_THREAD_LIVE;
    atomic_compare_exchange_strong(&t->state, &expected, STROBE_THREAD_DEAD);
}

void
strobe_threads_end_here(strobe_thread_t *t)
{
    /* Under the lock the timer holds for a whole tick: once this returns,
     * no tick sends t another signal; one sent before it is already queued
     * for this thread (the send returned before the tick let go of the
     * lock), and is delivered as the syscall below returns. After that
     * Ruby frees this thread's alternate signal stack (on every Ruby, as
     * the native thread leaves; 3.1's thread cache seconds later) without
     * taking it away from the kernel first: a signal delivered then would
     * be written into freed memory. */
    pthread_mutex_lock(&registry_lock);
    strobe_threads_end(t);
    pthread_mutex_unlock(&registry_lock);
    syscall(SYS_gettid);
}

unsigned
strobe_threads_generation(void)
{
    return atomic_load(&generation);
}

int
strobe_threads_len(void)
{
    return atomic_load_explicit(&entries_len, memory_order_acquire);
}

strobe_thread_t *
strobe_threads_at(int index)
{
    return index >= 0 && index < strobe_threads_len() ? &entries[index] : NULL;
}

int
strobe_threads_live(void)
{
    int live = 0, n = strobe_threads_len();
    for (int i = 0; i < n; i++) live += atomic_load(&entries[i].state) == STROBE_THREAD_LIVE;
    return live;
}

void
strobe_threads_mark(void)
{
    int n = strobe_threads_len();
    for (int i = 0; i < n; i++) {
        rb_gc_mark(entries[i].thread);
        rb_gc_mark(entries[i].alive_lock);
    }
}
