/*
 * handler.c - taking a sample: the signal handler, the postponed jobs that
 * take owed samples and drain the ring at safe points, Strobe.sample and
 * :object's samples, and the sampling signal's disposition.
 *
 * The handler runs on the sampled thread, on its alternate signal stack,
 * with its own signal blocked, so never nested in another (sigstack.c: a
 * thread near the end of its stack, a thread's one handler frame, a
 * handler left by a longjmp). It only does what strobe_capture() allows
 * (async-signal-safe). It preserves errno, takes the thread's guard
 * (sigstack.c), and does nothing after the VM has begun shutting down, on
 * a thread it does not know, or (Ruby before 3.3) on a thread whose Ruby
 * code has ended (strobe_threads_ended). The timer thread (timer.c) names the entry
 * a signal is for; a signal from the process-wide timer names none, and
 * its handler triggers a postponed job that drains the ring with the GVL.
 *
 * The signal is SIGURG, not SIGPROF: its default action is to ignore it, so
 * a signal still pending when the program calls exec() is discarded by the
 * new program instead of killing it (with SIGPROF it does), and a late signal
 * after stop is harmless whatever the disposition. SIGPROF and SIGALRM stay
 * free for other profilers. Signal ownership: start refuses if someone else
 * has a handler for it; stop restores the disposition found at first start
 * (default or ignore, both harmless).
 *
 * YJIT before Ruby 3.3: while a thread runs JIT code its frames' pc and sp
 * are not kept up to date, and rb_profile_frames from a signal handler
 * crashes on them (it did here, every run, on 3.1 with --yjit). So when
 * YJIT is on there, the handler of a thread holding the GVL (the one that
 * may be in JIT code) does not read frames: it marks the sample owed and
 * triggers a postponed job, which takes it at the thread's next safe point
 * (interrupt check), as stackprof's use_postponed_job! does. Threads without
 * the GVL (blocked, waiting for it) are in C code whose frames are current,
 * and are still read in the handler. A deferred sample lands a little later
 * than its signal, at a safe point; the cost of JIT safety on those Rubies.
 *
 * Signal safety: signal_handler and what it calls here (signal_target,
 * handler_entry, take_sample, sample_thread, sample_kind_now, gc_kind_now,
 * may_run_jit_code, count_handled, trigger_drain, trigger_sample_job, and
 * cost.h's clock) are async-signal-safe. The jobs, strobe_sampler_sample_now, the note of a
 * stack and the disposition run with the GVL held; the drain under the
 * profile lock (the timer thread's too, timer.c).
 */
#include "sampler_internal.h"
#include "capture.h"
#include "gcspan.h"
#include "native.h"
#include "placement.h"
#include "profile.h"
#include "clock.h"
#include "cost.h"
#include "sigstack.h"
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <ruby/debug.h>

static VALUE sym_state, sym_marking, sym_sweeping;

#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
static rb_postponed_job_handle_t drain_job_handle, sample_job_handle;
#endif

/* STROBE_SIGNAL's disposition before our first start. */
static struct sigaction old_action;
static int handler_installed;

/* ---- hand-off -------------------------------------------------------------- */

void
strobe_sampler_drain(void *unused)
{
    (void)unused;
    strobe_capture_drain(strobe_profile_record_slot);
}

void
strobe_sampler_flush(void)
{
    if (strobe_profile_locked(strobe_sampler_drain, NULL) < 0) rb_memerror();
}

/* Postponed job (process-wide timer): GVL held, at a safe point. Running
 * out of memory here only loses the slot (counted missed); raising would
 * land in whatever Ruby code was interrupted. */
/* Postponed jobs (GVL held, on the thread running Ruby code): a thread
 * registered before it ran watched from now (Ruby before 3.3: threads.c). */
static void
watch_self(void)
{
#ifndef STROBE_FOLLOWS_RUBY_THREADS
    strobe_thread_t *self = strobe_threads_self();
    if (self) strobe_threads_watch_end(self);
#endif
}

static void
drain_job(void *unused)
{
    (void)unused;
    strobe_sigstack_recover(); /* its own handler left by a longjmp */
    watch_self();
    int64_t start = strobe_cost_now();
    strobe_profile_locked(strobe_sampler_drain, NULL);
    strobe_cost_since(start);
}

/* Async-signal-safe: Ruby's postponed jobs are made for signal handlers. */
static void
trigger_drain(void)
{
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
    rb_postponed_job_trigger(drain_job_handle);
#else
    rb_postponed_job_register_one(0, drain_job, NULL);
#endif
}

/* GC phase of the running GC, as a frame kind. Signal context: reads VM
 * state only; the symbols were interned at init. */
static int
gc_kind_now(void)
{
    VALUE state = rb_gc_latest_gc_info(sym_state);
    if (state == sym_marking) return STROBE_FRAME_MARKING;
    if (state == sym_sweeping) return STROBE_FRAME_SWEEPING;
    return STROBE_FRAME_GC;
}

/* What a sample taken now records: STROBE_FRAME_RUBY (read the frames),
 * the GC phase while GC runs (frames cannot be read safely while GC moves
 * objects), or -1 when GC samples are ignored. Signal context too. */
static int
sample_kind_now(void)
{
    if (!rb_during_gc()) return STROBE_FRAME_RUBY;
    return strobe_profile.ignore_gc ? -1 : gc_kind_now();
}

/* Takes one sample of thread t: the calling thread (thread Qfalse), or,
 * with the GVL held, another (its Ruby Thread). Returns 1 if captured. */
static int
sample_thread(strobe_thread_t *t, VALUE thread, int *unchanged, const void *ucontext)
{
    /* The GC count before the during-GC flag: Ruby raises the flag before
     * it counts a GC, so with the flag clear afterwards every GC in the
     * count has finished and any GC overlapping the capture counts past it
     * (capture.c relies on this). */
    if (strobe_gcspan_counts(t)) return -1; /* its GC is counted by the GC hooks */
    size_t gc_epoch = rb_gc_count();
    atomic_thread_fence(memory_order_acquire);
    int gc_kind = sample_kind_now();
    if (gc_kind < 0) return -1;
    /* Another thread's GC, counted there: this one's frames cannot be read.
     * A process-wide timer's tick is the process's, which that GC's count
     * covers; a thread's own tick is lost (its signal came as GC began). */
    if (gc_kind != STROBE_FRAME_RUBY && strobe_gcspan_under_way()) return strobe_sampler.process_timer ? -1 : 0;
    /* Its Ruby code has ended (Ruby before 3.3: raised or killed, no
     * THREAD_END): its frames are being freed. Not asked again. Checked
     * with its frames, outside GC: a compacting GC protects pages of the
     * heap, the Mutex's among them (a handler reading it then crashed Ruby
     * 3.1 in GC.compact). */
    if (gc_kind == STROBE_FRAME_RUBY && strobe_threads_ended(t)) {
        atomic_store(&t->not_ruby, 1);
        return -1;
    }
    return strobe_capture(t, thread, gc_kind, gc_epoch, strobe_now_us(), unchanged,
                          strobe_sampler.native ? ucontext : NULL);
}

/* One time-mode sample of thread t, whose guard (sigstack.c) the caller
 * holds: the calling thread (thread Qfalse; from the handler or
 * sample_job), or another thread read with the GVL held (its Ruby Thread;
 * from sample_job, Ruby 3.2+). ucontext: the handler's signal context,
 * for native frames; NULL elsewhere. */
static void
take_sample(strobe_thread_t *t, VALUE thread, const void *ucontext)
{
    if (strobe_sampler.mode == STROBE_MODE_WALL) {
        /* The same stack twice: the thread is likely blocked. Its CPU time
         * now lets the timer see whether it ran since (see timer_main, timer.c). */
        int unchanged = 0;
        int r = sample_thread(t, thread, &unchanged, ucontext);
        if (r == 0) strobe_profile_add_missed(1);
        atomic_store(&t->idle_cpu_ns, r == 1 && unchanged ? strobe_placement_cpu_ns(t, 2) : -1);
    } else if (sample_thread(t, thread, NULL, ucontext) == 0) {
        strobe_profile_add_missed(1);
    }
}

#ifdef HAVE_RUBY_THREAD_HAS_GVL_P
int ruby_thread_has_gvl_p(void); /* libruby exports it; no public header declares it */
#endif

/* Handler (defer_running): whether thread t may have been interrupted in
 * JIT code. Not if it is in a blocking region (ruby_thread_has_gvl_p: 0),
 * nor if it has used no CPU since its previous handler returned (then it
 * is parked in C: sleep and Queue#pop leave no blocking-region mark). In
 * :cpu mode every signalled thread has just run. */
static int
may_run_jit_code(const strobe_thread_t *t)
{
#ifdef HAVE_RUBY_THREAD_HAS_GVL_P
    if (!ruby_thread_has_gvl_p()) return 0;
#endif
    if (strobe_sampler.mode == STROBE_MODE_CPU || t->handler_cpu_ns == 0) return 1;
    return strobe_clock_ns(CLOCK_THREAD_CPUTIME_ID) - t->handler_cpu_ns > STROBE_IDLE_CPU_NS;
}

/* The signal (or owed sample) the timer counted sent to t is dealt with:
 * its next tick may ask again (see pending, timer.c). Async-signal-safe. */
static inline void
count_handled(strobe_thread_t *t)
{
    atomic_fetch_add_explicit(&t->handled, 1, memory_order_release);
}

/* Takes the sample thread t is owed, if it is owed one (sample_job). */
static void
serve_owed(strobe_thread_t *t, VALUE thread)
{
    if (!atomic_exchange(&t->deferred, 0)) return;
    if (!strobe_sampler_sampled(t)) return; /* it paused since */
    if (!strobe_guard_take(t)) { strobe_profile_add_missed(1); return; }
    take_sample(t, thread, NULL);
    if (strobe_sampler.safepoint_timer && strobe_sampler.mode == STROBE_MODE_WALL) count_handled(t);
    strobe_guard_release(t);
}

/* Postponed job: GVL held, at a safe point of the thread running it, where
 * its frames are consistent (even under YJIT). Owed samples come from the
 * handler (defer_running) or, without signals, from the timer thread
 * (safepoint_timer): the running thread's is taken here, and where Ruby
 * can read another thread's frames (3.2+), every other profiled thread's
 * too; they are stopped at a safe point or blocked in C, the GVL being
 * held here. Without it they wait for a job on their own thread. */
static void
sample_job(void *unused)
{
    (void)unused;
    /* Also triggered by the timer for a thread that leaves its signals
     * unanswered: its own handler, left by a longjmp, may keep the signal
     * blocked (sigstack.c). */
    strobe_sigstack_recover();
    if (!atomic_load(&strobe_sampler.running)) return;
    int64_t start = strobe_cost_now();
    watch_self();
    strobe_thread_t *self = strobe_threads_self();
    if (self) {
        if (strobe_sampler.native) strobe_native_warm(self); /* its own thread, no handler */
        serve_owed(self, Qfalse);
    }
#ifdef HAVE_RB_PROFILE_THREAD_FRAMES
    if (strobe_sampler.safepoint_timer) {
        strobe_threads_lock();
        for (int i = 0, n = strobe_threads_len(); i < n; i++) {
            strobe_thread_t *t = strobe_threads_at(i);
            if (t == self || atomic_load_explicit(&t->state, memory_order_acquire) != STROBE_THREAD_LIVE) continue;
            if (RTEST(t->thread)) serve_owed(t, t->thread);
        }
        strobe_threads_unlock();
    }
#endif
    if (strobe_sampler.process_timer) strobe_profile_locked(strobe_sampler_drain, NULL);
    strobe_cost_since(start);
}

static void
trigger_sample_job(void)
{
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
    rb_postponed_job_trigger(sample_job_handle);
#else
    rb_postponed_job_register_one(0, sample_job, NULL);
#endif
}

/* The registry entry a signal was sent for: the timer thread names it in
 * the signal's value (send_signal, timer.c). NULL for a signal from elsewhere (the
 * process-wide timer, another sender of SIGURG). Async-signal-safe. */
static strobe_thread_t *
signal_target(const siginfo_t *info, int *stale)
{
    *stale = 0;
    if (!info || info->si_code != SI_QUEUE || info->si_pid != strobe_sampler.pid) return NULL;
    unsigned value = (unsigned)info->si_value.sival_int;
    strobe_thread_t *t = strobe_threads_at((int)(value & 0xffff));
    if (t && value >> 16 == (strobe_threads_generation() & 0x7fff) &&
        atomic_load_explicit(&t->state, memory_order_acquire) == STROBE_THREAD_LIVE)
        return t;
    *stale = 1; /* ours, for a thread that has ended since (or another round) */
    return NULL;
}

/* Async-signal-safe: whether thread t's frames can be read on the native
 * thread the handler runs on. Ruby 3.3+: the thread the signal names (or,
 * for a signal that names none, the one placed here) if it is attached to
 * this native thread: a 1:1 thread always is, an M:N thread only between
 * its RESUMED and SUSPENDED hooks on it, when its frames are the current
 * ones here (placement.c). Ruby's own idea of the current thread is not
 * asked: on a native thread between M:N threads it points at no thread
 * (it crashed rb_thread_current). */
static strobe_thread_t *
handler_entry(strobe_thread_t *target)
{
#ifdef STROBE_FOLLOWS_RUBY_THREADS
    pid_t me = strobe_placement_self_tid();
    strobe_thread_t *t = target ? target : strobe_placement_find(me);
    return t && strobe_placement_tid(t, 4) == me ? t : NULL;
#else
    (void)target;
    return ruby_native_thread_p() ? strobe_threads_self() : NULL;
#endif
}

static void
signal_handler(int sig, siginfo_t *info, void *ucontext)
{
    (void)sig;
    strobe_sigstack_enter();
    int saved_errno = errno;
    int64_t start = -1; /* (timed once a sample is taken: a signal on a thread leaving Ruby calls nothing) */

    if (!atomic_load(&strobe_sampler.running) || !atomic_load(&strobe_sampler.vm_alive)) goto out;
    int stale;
    strobe_thread_t *target = signal_target(info, &stale);
    if (stale) goto out; /* its thread ended, or the round it was sent in */
    /* A thread registered by its tid that runs no Ruby thread (not started
     * yet, or ended without THREAD_END and parked in Ruby's thread cache):
     * its stack cannot be read. It is not asked again (and its ticks are not
     * counted missed) until it registers as a Ruby thread. (A thread M:N
     * may move is only read while it runs here: handler_entry.) */
    pid_t me = strobe_placement_self_tid();
    strobe_thread_t *idle = target ? target : strobe_threads_find(me);
    if (idle && !atomic_load(&idle->mobile) && strobe_placement_tid(idle, 4) == me && !ruby_native_thread_p()) {
        atomic_store(&idle->not_ruby, 1);
        count_handled(idle);
        goto out;
    }
    strobe_thread_t *t = handler_entry(target);
    if (target && target != t) {
        /* Sent for a Ruby thread that has left this native thread since,
         * or stopped running on it (M:N). The tick is missed for it, unless
         * the timer repeats its stack at the next (see timer_main, timer.c). */
        count_handled(target);
        strobe_profile_add_missed(1);
        goto out;
    }
    if (!t) goto out; /* not a thread we sample */
    if (!strobe_sampler_sampled(t)) {
        /* Sent just before it paused between scopes: no sample, none missed. */
        count_handled(t);
        goto out;
    }
    if (!strobe_guard_take_in_handler(t, &saved_errno)) {
        strobe_profile_add_missed(1);
        count_handled(t);
        goto out;
    }
    strobe_sigstack_leave_if_asked();
    start = strobe_cost_now();

    if (strobe_sampler.defer_running && may_run_jit_code(t)) {
        /* Owe the sample to the next safe point. One still owed from the
         * previous signal is lost. */
        if (atomic_exchange(&t->deferred, 1)) strobe_profile_add_missed(1);
        atomic_store(&t->idle_cpu_ns, -1); /* it is running */
        trigger_sample_job();
    } else {
        take_sample(t, Qfalse, ucontext);
        if (strobe_sampler.process_timer) trigger_drain();
        /* Native frames on a thread not set up for libunwind's fast path:
         * the postponed job sets it up on this thread, at its next safe
         * point (sample_job). */
        if (strobe_sampler.native && !atomic_load_explicit(&t->native_warm, memory_order_relaxed) &&
            !atomic_load(&t->mobile))
            trigger_sample_job();
    }
    count_handled(t);
    if (strobe_sampler.defer_running) t->handler_cpu_ns = strobe_clock_ns(CLOCK_THREAD_CPUTIME_ID);
    strobe_cost_since(start);
    strobe_guard_release(t);
out:
    errno = saved_errno;
    strobe_sigstack_leave();
}

/* Timer thread (timer.c): the postponed job that takes owed samples. */
void
strobe_sampler_trigger_sample_job(void)
{
    trigger_sample_job();
}

/* A note (not a sample) of thread t's stack, for the timer to repeat while
 * t cannot be signalled: an M:N thread as it leaves the GVL (its own hook,
 * thread Qfalse, on its native thread with its frames current), or one
 * parked at start (thread its Ruby Thread, GVL held). Like the handler, it
 * takes t's re-entry guard and reads nothing while GC runs. */
#ifdef HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK /* M:N threads are Ruby 3.3+ */
void
strobe_sampler_note_stack(strobe_thread_t *t, VALUE thread)
{
    if (!strobe_sampler_sampled(t)) return; /* paused between scopes: nothing to repeat */
    if (!strobe_guard_take(t)) return;
    size_t gc_epoch = rb_gc_count();
    atomic_thread_fence(memory_order_acquire);
    if (!rb_during_gc()) strobe_capture(t, thread, STROBE_FRAME_RUBY, gc_epoch, STROBE_CAPTURE_NOTE, NULL, NULL);
    strobe_guard_release(t);
}
#endif

/* ---- signal ownership ---------------------------------------------------------- */

static int
is_default_or_ignore(const struct sigaction *sa)
{
    return !(sa->sa_flags & SA_SIGINFO) && (sa->sa_handler == SIG_DFL || sa->sa_handler == SIG_IGN);
}

const char *
strobe_sampler_install_handler(void)
{
    struct sigaction current, ours;
    sigaction(STROBE_SIGNAL, NULL, &current);
    int is_ours = (current.sa_flags & SA_SIGINFO) && current.sa_sigaction == signal_handler;
    if (!is_ours && !is_default_or_ignore(&current))
        return STROBE_SIGNAL_NAME " already has a handler (trap(\"" STROBE_SIGNAL_TRAP "\") or a library); "
               "Strobe will not take it over";
    if (!handler_installed && !is_ours) old_action = current;

    memset(&ours, 0, sizeof(ours));
    ours.sa_sigaction = signal_handler;
    ours.sa_flags = strobe_sigstack_handler_flags();
    sigemptyset(&ours.sa_mask);
    sigaddset(&ours.sa_mask, STROBE_SIGNAL); /* (the kernel adds it too: no SA_NODEFER) */
    sigaction(STROBE_SIGNAL, &ours, NULL);
    handler_installed = 1;
    return NULL;
}

/* Back to the default or ignoring disposition we found: either discards a
 * late signal, so nothing is left that could kill the process. */
void
strobe_sampler_uninstall_handler(void)
{
    if (!handler_installed) return;
    sigaction(STROBE_SIGNAL, &old_action, NULL);
    handler_installed = 0;
}

/* Under the profile lock: what the handlers captured first, then the stack
 * sample_now left in the thread's scratch buffer. */
static void
drain_then_record_scratch(void *arg)
{
    strobe_thread_t *t = arg;
    strobe_sampler_drain(NULL);
    uint8_t state = atomic_load(&t->gvl_state);
    strobe_profile_record(t, t->scratch_gc_kind, t->scratch_frames, t->scratch_lines,
                          t->scratch_depth, &t->scratch_time, &state, 1);
}

int
strobe_sampler_sample_now(void)
{
    strobe_sigstack_recover();
    if (!atomic_load(&strobe_sampler.running)) return 0;
    strobe_thread_t *t = strobe_sampler_current_entry();
    if (!t || !strobe_sampler_sampled(t)) return 0; /* a thread that is not profiled, or not now */
    if (!strobe_guard_take(t)) {
        strobe_profile_add_missed(1);
        return 0;
    }
    /* The GVL is held, so the stack goes straight into the profile: no ring
     * slot, no copy. In time modes the timer thread drains concurrently, so
     * the ring is drained first (keeping order) and the profile locked. */
    int timed = strobe_sampler.mode == STROBE_MODE_WALL || strobe_sampler.mode == STROBE_MODE_CPU;
    int taken = 1;
    int gc_kind = sample_kind_now();
    int depth = 0;
    if (gc_kind < 0) {
        taken = -1;
    } else if (gc_kind == STROBE_FRAME_RUBY) {
        depth = strobe_read_frames(Qfalse, t->scratch_frames, t->scratch_lines);
        if (depth <= 0) taken = 0; /* no Ruby frame to attribute it to */
    }
    if (taken == 1) {
        int64_t now = strobe_now_us();
        if (!timed) {
            /* Nothing else captures on this thread in these modes; the guard
             * is let go first because running out of memory raises here. */
            strobe_guard_release(t);
            const uint8_t state = STROBE_STATE_UNKNOWN; /* not tracked in these modes */
            strobe_profile_record(t, gc_kind, t->scratch_frames, t->scratch_lines, depth, &now, &state, 1);
            return 1;
        }
        t->scratch_depth = depth;
        t->scratch_gc_kind = (uint8_t)gc_kind;
        t->scratch_time = now;
        int failed = strobe_profile_locked(drain_then_record_scratch, t) < 0;
        strobe_guard_release(t);
        if (failed) rb_memerror();
        return 1;
    }
    if (taken == 0) strobe_profile_add_missed(1);
    strobe_guard_release(t);
    return 0;
}

void
strobe_sampler_handler_init(void)
{
    sym_state = ID2SYM(rb_intern("state"));
    sym_marking = ID2SYM(rb_intern("marking"));
    sym_sweeping = ID2SYM(rb_intern("sweeping"));
    /* Warm the GC-info path so the handler never interns anything. */
    rb_gc_latest_gc_info(sym_state);
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
    drain_job_handle = rb_postponed_job_preregister(0, drain_job, NULL);
    sample_job_handle = rb_postponed_job_preregister(0, sample_job, NULL);
#endif
}
