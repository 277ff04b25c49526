/*
 * threads.c - the registry of threads the sampler targets.
 *
 * A fixed array of STROBE_MAX_THREADS entries that never moves, so a handler
 * can hold a pointer to its entry. Each entry is FREE, LIVE or DEAD:
 *   - strobe_threads_add() (GVL held) claims a FREE entry, fills it and
 *     publishes it LIVE with a release store;
 *   - strobe_threads_end() (GVL held, on a thread that is finishing) makes it
 *     DEAD: the timer stops signalling it;
 *   - strobe_threads_reclaim() (timer thread) frees a DEAD entry once its
 *     kernel thread is gone, so no handler can still be running on it, and a
 *     later thread can reuse the entry; a DEAD entry whose kernel thread now
 *     runs a new Ruby Thread (Ruby caches native threads) goes straight to
 *     that Thread. Short-lived threads therefore cost entries only while
 *     they run.
 * strobe_threads_reset() (GVL held, nothing sampling) frees everything and
 * bumps a generation number.
 *
 * Signal safety: strobe_threads_self() is async-signal-safe. It reads an
 * initial-exec thread-local pointer (a fixed offset from the thread pointer)
 * checked against the generation, and on a miss scans the array for the
 * caller's kernel tid. Everything else runs with the GVL held, except
 * strobe_threads_reclaim() and the reads the timer thread makes of LIVE
 * entries.
 */
#include "strobe.h"
#include <errno.h>
#include <signal.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <stdlib.h>
#include <string.h>

static strobe_thread_t entries[STROBE_MAX_THREADS];
static atomic_int entries_len;      /* entries[0, len) have ever been used */
static atomic_uint generation;

static __thread strobe_thread_t *self_entry __attribute__((tls_model("initial-exec")));
static __thread unsigned self_generation __attribute__((tls_model("initial-exec")));

pid_t
strobe_gettid(void)
{
    return (pid_t)syscall(SYS_gettid);
}

/* The CPU-time clock of any thread of this process, from its kernel tid:
 * the Linux clock id encoding (include/linux/posix-timers.h) that
 * pthread_getcpuclockid() also returns: ~tid << 3 | CPUCLOCK_PERTHREAD |
 * CPUCLOCK_SCHED. Computed unsigned to avoid shifting a negative value. */
static clockid_t
thread_cpu_clock(pid_t tid)
{
    return (clockid_t)((~(uint32_t)tid << 3) | 6u);
}

void
strobe_threads_reset(void)
{
    int n = atomic_load(&entries_len);
    for (int i = 0; i < n; i++) {
        entries[i].thread = Qnil;
        atomic_store(&entries[i].state, STROBE_THREAD_FREE);
    }
    atomic_store(&entries_len, 0);
    atomic_fetch_add(&generation, 1);
}

strobe_thread_t *
strobe_threads_find(pid_t tid)
{
    int n = atomic_load_explicit(&entries_len, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (atomic_load_explicit(&entries[i].state, memory_order_acquire) == STROBE_THREAD_LIVE &&
            entries[i].tid == tid)
            return &entries[i];
    return NULL;
}

strobe_thread_t *
strobe_threads_self(void)
{
    unsigned gen = atomic_load(&generation);
    strobe_thread_t *t = self_entry;
    if (t && self_generation == gen && atomic_load(&t->state) == STROBE_THREAD_LIVE) return t;
    t = strobe_threads_find(strobe_gettid());
    if (t) {
        self_entry = t;
        self_generation = gen;
    }
    return t;
}

strobe_thread_t *
strobe_threads_add(pid_t tid, VALUE thread)
{
    strobe_thread_t *t = strobe_threads_find(tid);
    if (t) return t;
    int n = atomic_load(&entries_len);
    /* A kernel thread that ran a Thread which ended now runs another (Ruby
     * keeps native threads cached): its old entry is free for it. */
    for (int i = 0; i < n && !t; i++) {
        int expected = STROBE_THREAD_DEAD;
        if (entries[i].tid == tid &&
            atomic_compare_exchange_strong(&entries[i].state, &expected, STROBE_THREAD_CLAIMED))
            t = &entries[i];
    }
    for (int i = 0; i < n && !t; i++) {
        int expected = STROBE_THREAD_FREE;
        if (atomic_compare_exchange_strong(&entries[i].state, &expected, STROBE_THREAD_CLAIMED))
            t = &entries[i];
    }
    if (!t) {
        if (n == STROBE_MAX_THREADS) return NULL;
        t = &entries[n];
        atomic_store(&t->state, STROBE_THREAD_CLAIMED);
    }
    /* Only the GVL holder adds, so the fields are ours until published. */
    memset((char *)t + offsetof(strobe_thread_t, tid), 0,
           offsetof(strobe_thread_t, scratch_frames) - offsetof(strobe_thread_t, tid));
    t->tid = tid;
    t->cpu_clock = thread_cpu_clock(tid);
    t->index = (uint16_t)(t - entries);
    t->thread = thread;
    t->last_seq = -1;
    t->profile_index = -1;
    atomic_store(&t->idle_cpu_ns, -1);
    struct timespec ts;
    if (clock_gettime(t->cpu_clock, &ts) == 0)
        t->cpu_last_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    atomic_store_explicit(&t->state, STROBE_THREAD_LIVE, memory_order_release);
    if (t == &entries[n]) atomic_store_explicit(&entries_len, n + 1, memory_order_release);
    return t;
}

void
strobe_threads_end(strobe_thread_t *t)
{
    int expected = STROBE_THREAD_LIVE;
    atomic_compare_exchange_strong(&t->state, &expected, STROBE_THREAD_DEAD);
}

void
strobe_threads_reclaim(strobe_thread_t *t)
{
    if (atomic_load(&t->state) != STROBE_THREAD_DEAD) return;
    if (syscall(SYS_tgkill, (long)getpid(), (long)t->tid, 0L) == 0 || errno != ESRCH) return;
    int expected = STROBE_THREAD_DEAD;
    atomic_compare_exchange_strong(&t->state, &expected, STROBE_THREAD_FREE);
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
    for (int i = 0; i < n; i++) rb_gc_mark(entries[i].thread);
}
