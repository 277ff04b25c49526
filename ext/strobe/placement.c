/*
 * placement.c - which native thread a profiled Ruby thread runs on, and
 * how much CPU time the Ruby thread has used.
 *
 * A Ruby thread is not always a kernel thread. Under Ruby 3.3+'s M:N
 * scheduler (RUBY_MN_THREADS=1) Ruby threads take turns on shared native
 * threads and move between them, so a native thread's CPU clock is not a
 * Ruby thread's, and the tid to signal changes. Each registry entry keeps
 * its placement:
 *   - tid: the native thread it runs on (or last ran on; 0 never seen);
 *   - attached: that native thread's CPU clock counts for it now;
 *   - cpu_base_ns: CPU time it used before it got there;
 *   - cpu_attach_ns: that native thread's CPU clock when it got there.
 * Its CPU time is cpu_base_ns, plus (clock now - cpu_attach_ns) while
 * attached.
 *
 * A thread Ruby schedules 1:1 keeps its native thread: it is attached from
 * registration on and its CPU time is its kernel CPU clock, also in C code
 * without the GVL. A *mobile* thread (Ruby schedules it M:N: every thread,
 * the main one included, when RUBY_MN_THREADS was set as the process
 * started; Ruby reads it at boot, so it is read from /proc/self/environ,
 * not from ENV) is attached only while it holds the GVL: the GVL RESUMED
 * hook, which runs on the native thread about to run it after its
 * execution context is current, attaches it there
 * (strobe_placement_resumed); SUSPENDED, on the same native thread before
 * it switches away, detaches it and freezes its CPU time
 * (strobe_placement_suspended). So whatever else runs on that native
 * thread afterwards (another Ruby thread, an unprofiled one, another
 * Ractor, Ruby's scheduler) is never charged to it, and "attached here"
 * means "its frames are the ones current on this native thread". A mobile
 * thread's CPU in C code without the GVL is not counted, and its clock is
 * read at its GVL events only in :cpu mode (strobe_placement_counts_cpu).
 *
 * Concurrency: only a thread's own hooks (on the native thread it is on)
 * and its registration (GVL held) write its placement. A per-entry spin
 * lock orders writers anyway, and a sequence count lets readers (the timer
 * thread, the signal handler) read without a lock: they read between two
 * equal even counts, retrying a bounded number of times.
 * strobe_placement_cpu_ns, strobe_placement_tid and strobe_placement_find
 * are async-signal-safe: a handler that interrupted a writer on its own
 * thread gets -1 / 0 rather than waiting.
 */
#include "placement.h"
#include "clock.h"
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
strobe_placement_init(strobe_thread_t *t, pid_t tid, int mobile, int running_here)
{
    /* CLAIMED: nobody else reads or writes it yet. A mobile thread is
     * attached only while it runs here (it registers itself, holding the
     * GVL); its CPU time counts from then. */
    int attached = tid != 0 && (!mobile || running_here);
    atomic_store_explicit(&t->mobile, mobile, memory_order_relaxed);
    atomic_store_explicit(&t->tid, tid, memory_order_relaxed);
    atomic_store_explicit(&t->attached, attached, memory_order_relaxed);
    atomic_store_explicit(&t->cpu_base_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&t->cpu_attach_ns, mobile && attached ? strobe_clock_ns(CLOCK_THREAD_CPUTIME_ID) : 0,
                          memory_order_relaxed);
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

/* Whether mobile threads' CPU time is kept (their clocks read at every GVL
 * event): only :cpu mode needs it (sampler.c sets it at start). */
atomic_int strobe_placement_counts_cpu;

void
strobe_placement_resumed(strobe_thread_t *t)
{
    pid_t me = strobe_placement_self_tid();
    if (atomic_load_explicit(&t->attached, memory_order_relaxed) &&
        atomic_load_explicit(&t->tid, memory_order_relaxed) == me)
        return; /* a 1:1 thread, always */
    /* A mobile thread taking the GVL here, or a thread registered before
     * Ruby placed it. */
    int clocks = !atomic_load_explicit(&t->mobile, memory_order_relaxed) ||
                 atomic_load_explicit(&strobe_placement_counts_cpu, memory_order_relaxed);
    write_begin(t);
    if (clocks) {
        atomic_store_explicit(&t->cpu_base_ns, cpu_now_locked(t), memory_order_relaxed);
        atomic_store_explicit(&t->cpu_attach_ns, strobe_clock_ns(CLOCK_THREAD_CPUTIME_ID), memory_order_relaxed);
    }
    atomic_store_explicit(&t->tid, me, memory_order_relaxed);
    atomic_store_explicit(&t->attached, 1, memory_order_relaxed);
    write_end(t);
}

void
strobe_placement_suspended(strobe_thread_t *t)
{
    if (!atomic_load_explicit(&t->mobile, memory_order_relaxed) ||
        !atomic_load_explicit(&t->attached, memory_order_relaxed))
        return;
    write_begin(t);
    if (atomic_load_explicit(&strobe_placement_counts_cpu, memory_order_relaxed))
        atomic_store_explicit(&t->cpu_base_ns, cpu_now_locked(t), memory_order_relaxed);
    atomic_store_explicit(&t->attached, 0, memory_order_relaxed);
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

/* RUBY_MN_THREADS as the process started (Ruby reads it at boot; ENV may
 * have changed since): from /proc/self/environ (NUL-separated entries, read
 * whole, up to 1 MB; the first one, as getenv), or from ENV now. */
static int
boot_mn_threads(void)
{
    static const char name[] = "RUBY_MN_THREADS=";
    const char *value = NULL;
    size_t capa = 1 << 20, len = 0;
    char *env = malloc(capa + 1);
    int fd = env ? open("/proc/self/environ", O_RDONLY | O_CLOEXEC) : -1;
    if (fd >= 0) {
        ssize_t n;
        while (len < capa && (n = read(fd, env + len, capa - len)) > 0) len += (size_t)n;
        close(fd);
        env[len] = '\0';
        for (size_t at = 0; at < len && !value; at += strlen(env + at) + 1)
            if (strncmp(env + at, name, sizeof(name) - 1) == 0) value = env + at + sizeof(name) - 1;
    }
    int on = value && atoi(value) > 0;
    free(env);
    /* A long $0 overwrites the first environment: ENV as it is now too. */
    value = getenv("RUBY_MN_THREADS");
    return on || (value && atoi(value) > 0);
}

void
strobe_placement_init_process(void)
{
    /* As Ruby decides at boot (thread_pthread.c): RUBY_MN_THREADS > 0
     * schedules the main Ractor's threads M:N. The main thread starts on a
     * native thread of its own, but in a child forked from another thread
     * others run on it too: every thread counts as mobile. */
    strobe_mn_threads = boot_mn_threads();
}
