/*
 * timer.c - what triggers time-mode samples: the timer thread, or the
 * process-wide timer.
 *
 * Time modes run a timer thread (a plain pthread with every signal blocked,
 * never calling Ruby). Each interval it wakes on an absolute CLOCK_MONOTONIC
 * deadline. It first drains the ring into the profile under the profile
 * lock, without the GVL (so samples are recorded even while every Ruby thread
 * is blocked), then sends STROBE_SIGNAL (rt_tgsigqueueinfo, naming the
 * entry it is for) to each registered thread that needs one:
 *   - :wall: every thread, so threads blocked in IO, sleep, join or waiting
 *     for the GVL are sampled too (their stack as of blocking); except a
 *     thread that captured the same stack twice and whose CPU clock has not
 *     moved since: it has not run, so its stack cannot have changed, and the
 *     timer records that stack again (strobe_profile_record_repeat) without
 *     interrupting it;
 *   - :cpu: a thread whose own CPU clock advanced by an interval since its
 *     last signal, so a thread that waits gets no CPU samples and the rate is
 *     not capped by the kernel tick the way setitimer(ITIMER_PROF) is.
 * A dead thread is never signalled (a probe with tgkill(tid, 0) reports
 * ESRCH, a dead thread's CPU clock reads EINVAL). Without signals (scheduler: :thread) it owes
 * the threads samples instead, taken at safe points by a postponed job
 * (handler.c).
 *
 * Process-wide timer (timer: :process, or when the timer thread cannot be
 * started): one POSIX timer on the process CPU clock (:cpu) or the monotonic
 * clock (:wall) sends STROBE_SIGNAL to the process, the kernel picks the
 * thread (the one running, for CPU time), and the handler triggers a
 * postponed job that drains the ring with the GVL. This is how stackprof
 * samples; the result says :process under :timer so it is never silent.
 *
 * Nothing here runs in a signal handler. timer_main runs on the timer
 * thread, without the GVL, calling no Ruby; starting and stopping the
 * timers is done with the GVL held (and at VM exit).
 */
#include "sampler_internal.h"
#include "capture.h"
#include "gcspan.h"
#include "placement.h"
#include "profile.h"
#include "clock.h"
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>

static struct {
    /* timer thread */
    pthread_t timer;
    int timer_started;
    pthread_mutex_t timer_lock;
    pthread_cond_t timer_cond;
    int timer_stop;

    /* process-wide timer */
    timer_t ptimer;
    int ptimer_started;

    /* CPU time of the timer threads that have ended, and whether the
     * current one has added its own (under timer_lock). */
    int64_t cpu_done_ns;
    int cpu_added;
} T;

/* ---- timer thread ------------------------------------------------------------ */

/* Ticks a signal (or a :wall sample owed at a safe point) may wait to be handled before it is taken as
 * lost and sent again (the ticks meanwhile count as missed). */
#define STROBE_PENDING_TICKS 100

struct repeats {
    strobe_thread_t **threads;
    int len;                 /* idle threads */
    int done;                /* of which handled so far */
    int unrepeated;          /* with nothing to repeat, moved to the front */
    int64_t time_us;
};

/* Under the profile lock: a repeat sample for each idle thread. Progress is
 * kept in r, so an allocation failure part way leaves it exact. */
static void
record_repeats(void *arg)
{
    struct repeats *r = arg;
    for (; r->done < r->len; r->done++) {
        strobe_thread_t *t = r->threads[r->done];
        int state = atomic_load_explicit(&t->gvl_state, memory_order_relaxed);
        if (!strobe_profile_record_repeat(t, r->time_us, state)) r->threads[r->unrepeated++] = t;
    }
}

/* Signals native thread tid for entry t, naming t in the signal's value
 * (rt_tgsigqueueinfo): under M:N the Ruby thread on tid may have changed
 * by the time the handler runs, which it can then tell (signal_target, handler.c). */
static void
send_signal(const strobe_thread_t *t, pid_t tid)
{
    atomic_fetch_add_explicit(&strobe_sampler.signals_sent, 1, memory_order_relaxed);
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    si.si_signo = STROBE_SIGNAL;
    si.si_code = SI_QUEUE;
    si.si_pid = strobe_sampler.pid;
    si.si_uid = strobe_sampler.uid;
    si.si_value.sival_int = (int)(t->index | (strobe_threads_generation() & 0x7fff) << 16);
    syscall(SYS_rt_tgsigqueueinfo, (long)strobe_sampler.pid, (long)tid, (long)STROBE_SIGNAL, &si);
}

/* Timer thread: native threads an M:N thread was signalled on this tick.
 * SIGURG is no queued signal: a second one sent to a native thread before
 * the first is handled is dropped, and the thread it was for would wait
 * for a handler that never comes. Under M:N two Ruby threads can be found
 * attached to one native thread within a tick (one leaving, one arriving):
 * the second is not signalled. */
static pid_t tick_tids[STROBE_MAX_THREADS];
static int tick_tids_len;

static int
signalled_this_tick(pid_t tid)
{
    for (int i = 0; i < tick_tids_len; i++)
        if (tick_tids[i] == tid) return 1;
    if (tick_tids_len < STROBE_MAX_THREADS) tick_tids[tick_tids_len++] = tid;
    return 0;
}

/* The timer thread's request for a sample of thread t: a signal, or
 * without signals (safepoint_timer) a sample owed at the next safe point,
 * for the postponed job the tick triggers. Returns whether a job is
 * needed. A sample still owed from the tick before is lost (missed), and
 * so is one for a thread attached to no native thread (M:N, parked with
 * nothing to repeat yet): no signal goes out for it. A signal that went
 * out (or in :wall mode an owed sample) is counted sent, so the next tick
 * can tell it is still pending. */
static int
ask_for_sample(strobe_thread_t *t)
{
    pid_t tid = strobe_sampler.safepoint_timer ? 0 : strobe_placement_tid(t, 100);
    if (!strobe_sampler.safepoint_timer && (!tid || (atomic_load(&t->mobile) && signalled_this_tick(tid)))) {
        strobe_profile_add_missed(1);
        return 0;
    }
    /* Counted before it goes out: the handler may count it handled at once. */
    if (strobe_sampler.mode == STROBE_MODE_WALL || !strobe_sampler.safepoint_timer) {
        t->sent = atomic_load_explicit(&t->handled, memory_order_acquire) + 1;
        t->pending_ticks = 0;
    }
    if (!strobe_sampler.safepoint_timer) {
        send_signal(t, tid);
        return 0;
    }
    if (atomic_exchange(&t->deferred, 1)) strobe_profile_add_missed(1);
    return 1;
}

/* Timer thread: whether t is attached to no native thread (an M:N thread
 * not holding the GVL), so that no signal can read its stack; the stack
 * noted as it left the GVL is still its stack. */
static int
parked(const strobe_thread_t *t)
{
    return strobe_placement_tid(t, 100) == 0;
}

/* Timer thread: whether t's last signal (or, without signals in :wall mode,
 * its last owed sample) is still to be handled, for fewer than
 * STROBE_PENDING_TICKS ticks so far. Then it is taken as lost, and *lost
 * set: a signal goes unanswered that long only while the thread blocks
 * it, which a handler left by a longjmp does (sigstack.c) until code of
 * that thread outside any handler unblocks it; a thread that only computes
 * runs none but the postponed job the caller then triggers (it runs on
 * the thread holding the GVL). An M:N thread that left the GVL since is
 * not waited for: its stack is noted (as parked). */
static int
pending(strobe_thread_t *t, int *lost)
{
    uint32_t handled = atomic_load_explicit(&t->handled, memory_order_acquire);
    if ((int32_t)(t->sent - handled) > 0 && atomic_load(&t->mobile) && parked(t)) t->sent = handled;
    if ((int32_t)(t->sent - handled) <= 0) return 0;
    if (++t->pending_ticks < STROBE_PENDING_TICKS) return 1;
    *lost = 1;
    return 0;
}

static void *
timer_main(void *arg)
{
    (void)arg;
    const int64_t interval_ns = (int64_t)strobe_sampler.interval * 1000;
    /* CPU a blocked thread may use after its handler read its clock (the
     * rest of the handler, sigreturn, re-entering the wait) and still count
     * as not having run. */
    const int64_t idle_ns = interval_ns / 4 < STROBE_IDLE_CPU_NS ? interval_ns / 4 : STROBE_IDLE_CPU_NS;
    static strobe_thread_t *idle_threads[STROBE_MAX_THREADS];
    int64_t next = strobe_clock_ns(CLOCK_MONOTONIC);
    /* Ended threads' entries are checked every 10 ms or so: a probe
     * syscall each, not worth making every tick. */
    const uint64_t reclaim_every = strobe_sampler.interval >= 10000 ? 1 : (uint64_t)(10000 / strobe_sampler.interval);
    uint64_t ticks = 0;

    pthread_mutex_lock(&T.timer_lock);
    while (!T.timer_stop) {
        next += interval_ns;
        struct timespec deadline = { (time_t)(next / 1000000000), (long)(next % 1000000000) };
        while (!T.timer_stop) {
            int rc = pthread_cond_timedwait(&T.timer_cond, &T.timer_lock, &deadline);
            if (rc == ETIMEDOUT) break;
        }
        if (T.timer_stop) break;

        /* No entry changes owner during the tick. */
        strobe_threads_lock();
        /* Record what the handlers captured since the last tick. Off the
         * GVL, so it goes on whether or not any Ruby thread is running. */
        strobe_profile_locked(strobe_sampler_drain, NULL);
        if (++ticks % reclaim_every == 0) strobe_threads_reclaim();

        int n = strobe_threads_len(), live = 0, idle_len = 0, job = 0, lost = 0;
        int gc_elsewhere = strobe_gcspan_under_way();
        tick_tids_len = 0;
        int64_t now_us = strobe_now_us();
        for (int i = 0; i < n; i++) {
            strobe_thread_t *t = strobe_threads_at(i);
            if (atomic_load_explicit(&t->state, memory_order_acquire) != STROBE_THREAD_LIVE) continue;
            if (atomic_load_explicit(&t->not_ruby, memory_order_relaxed)) continue;
            if (!strobe_sampler_sampled(t)) continue; /* between scopes */
            if (strobe_gcspan_counts(t)) continue; /* in GC: the GC hooks count its time */
            live++;
            /* Its CPU time, wherever it runs (placement.c). */
            int64_t cpu = strobe_placement_cpu_ns(t, 100);
            if (cpu < 0) continue; /* thread is gone */
            if (strobe_sampler.mode == STROBE_MODE_CPU) {
                if (cpu - t->cpu_last_ns < interval_ns) continue;
                /* An M:N thread that used the CPU but has released the GVL
                 * since (it is parked now, no signal can read it): its
                 * latest stack is recorded again, as for idle threads. */
                int repeat = parked(t) && strobe_capture_drained(t->last_seq);
                /* Carry the remainder so the rate matches the interval (see
                 * strobe_cpu_owed_at_most). */
                t->cpu_last_ns += interval_ns;
                strobe_cpu_owed_at_most(t, cpu, interval_ns, 2);
                if (repeat) {
                    idle_threads[idle_len++] = t;
                    continue;
                }
                /* Its last signal is not handled yet (delivering and
                 * handling one costs the thread CPU time too: at a short
                 * interval on a slow machine, sanitizers, each handler
                 * used an interval). SIGURG does not queue: another would
                 * be dropped, so this one is missed. */
                if (!strobe_sampler.safepoint_timer && pending(t, &lost)) {
                    strobe_profile_add_missed(1);
                    continue;
                }
            } else {
                if (pending(t, &lost)) {
                    strobe_profile_add_missed(1); /* its last signal is not handled yet */
                    /* Without signals, the job may have run on another
                     * thread: ask for it again (harmless if pending). */
                    if (strobe_sampler.safepoint_timer && atomic_load(&t->deferred)) job = 1;
                    continue;
                }
                /* Its stack was the same twice and it has used (almost) no
                 * CPU since: it has not run, so its stack is unchanged. Or
                 * it is an M:N thread not holding the GVL, whose stack was
                 * noted as it left it. Record that stack again instead of
                 * interrupting it. */
                /* Another thread runs a GC the GC hooks count: this one runs
                 * no Ruby code meanwhile, its stack is as last read. */
                if (gc_elsewhere && strobe_capture_drained(t->last_seq)) {
                    idle_threads[idle_len++] = t;
                    continue;
                }
                int64_t idle = atomic_load(&t->idle_cpu_ns);
                /* (An M:N thread's CPU time is not kept in :wall mode.) */
                int still = idle >= 0 && cpu - idle < idle_ns && !atomic_load(&t->mobile);
                if ((parked(t) || still) && strobe_capture_drained(t->last_seq)) {
                    idle_threads[idle_len++] = t;
                    continue;
                }
            }
            job |= ask_for_sample(t);
        }
        if (idle_len) {
            struct repeats r = { idle_threads, idle_len, 0, 0, now_us };
            if (strobe_profile_locked(record_repeats, &r) < 0) {
                /* Out of memory at threads[done]: it and the rest are lost. */
                strobe_profile_add_missed((uint64_t)(r.len - r.done));
            }
            for (int i = 0; i < r.unrepeated; i++) /* nothing to repeat yet */
                job |= ask_for_sample(r.threads[i]);
        }
        strobe_threads_unlock();
        /* From this thread, which is no Ruby thread: Ruby delivers the job
         * to the thread that holds (or last held) the GVL. */
        if (job || lost) strobe_sampler_trigger_sample_job();
        /* Late by more than an interval (machine busy): do not burst, but
         * in wall mode every tick skipped is a sample owed, so count it as
         * missed rather than let the rate drop silently. (In CPU mode the
         * next check sees the CPU time used and counts what it cannot
         * sample, above.) */
        int64_t now = strobe_clock_ns(CLOCK_MONOTONIC);
        if (now - next > interval_ns) {
            if (strobe_sampler.mode == STROBE_MODE_WALL)
                strobe_profile_add_missed((uint64_t)((now - next) / interval_ns) * (uint64_t)live);
            next = now;
        }
    }
    int64_t cpu = strobe_clock_ns(CLOCK_THREAD_CPUTIME_ID);
    if (cpu > 0) T.cpu_done_ns += cpu;
    T.cpu_added = 1;
    pthread_mutex_unlock(&T.timer_lock);
    return NULL;
}

/* GVL held (as start and stop are): the CPU time every timer thread has
 * used, the running one's included. */
int64_t
strobe_sampler_timer_cpu_ns(void)
{
    if (!T.timer_started) return T.cpu_done_ns;
    pthread_mutex_lock(&T.timer_lock);
    int64_t total = T.cpu_done_ns;
    clockid_t clock;
    if (!T.cpu_added && pthread_getcpuclockid(T.timer, &clock) == 0) {
        int64_t running = strobe_clock_ns(clock);
        if (running > 0) total += running;
    }
    pthread_mutex_unlock(&T.timer_lock);
    return total;
}

int
strobe_sampler_timer_start(void)
{
    /* One timer thread at a time: initialising its lock and condition
     * again under a running one corrupts both. */
    if (T.timer_started) return 0;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&T.timer_cond, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&T.timer_lock, NULL);
    T.timer_stop = 0;
    T.cpu_added = 0;

    /* The timer thread inherits a mask blocking every signal, so no signal
     * meant for Ruby's threads is ever delivered to it. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&T.timer, NULL, timer_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) return rc;
    T.timer_started = 1;
    return 0;
}

void
strobe_sampler_timer_stop(void)
{
    if (!T.timer_started) return;
    pthread_mutex_lock(&T.timer_lock);
    T.timer_stop = 1;
    pthread_cond_signal(&T.timer_cond);
    pthread_mutex_unlock(&T.timer_lock);
    pthread_join(T.timer, NULL);
    T.timer_started = 0;
    pthread_cond_destroy(&T.timer_cond);
    pthread_mutex_destroy(&T.timer_lock);
}

/* ---- process-wide timer ---------------------------------------------------------- */

int
strobe_sampler_process_timer_start(void)
{
    struct sigevent sev;
    memset(&sev, 0, sizeof(sev));
    sev.sigev_notify = SIGEV_SIGNAL;
    sev.sigev_signo = STROBE_SIGNAL;
    clockid_t clock = strobe_sampler.mode == STROBE_MODE_CPU ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC;
    if (timer_create(clock, &sev, &T.ptimer) != 0) return -1;
    long interval = strobe_sampler.interval;
    struct timespec every = { (time_t)(interval / 1000000), (long)(interval % 1000000) * 1000 };
    struct itimerspec spec = { every, every };
    if (timer_settime(T.ptimer, 0, &spec, NULL) != 0) {
        timer_delete(T.ptimer);
        return -1;
    }
    T.ptimer_started = 1;
    return 0;
}

void
strobe_sampler_process_timer_stop(void)
{
    if (!T.ptimer_started) return;
    timer_delete(T.ptimer);
    T.ptimer_started = 0;
}

/* In a forked child: neither timer is there (POSIX timers are not
 * inherited, and only the forking thread is). */
void
strobe_sampler_timers_after_fork(void)
{
    T.timer_started = 0;
    T.ptimer_started = 0;
}
