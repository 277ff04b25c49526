/*
 * sampler.c - when samples are taken: starting and stopping a sampled
 * profile, :object mode's allocation hook, and the state of the round the
 * other sampler files share (sampler_internal.h):
 *   - scopes.c: which threads are sampled (registration, the thread hook,
 *     scopes);
 *   - gvlhook.c: the GVL event hook and the threads' GVL states;
 *   - handler.c: the signal handler, taking a sample, the postponed jobs,
 *     the signal's disposition;
 *   - timer.c: the timer thread and the process-wide timer;
 *   - fork.c: fork handling.
 *
 * Time modes (:wall, :cpu) are sampled from a timer thread that signals
 * each thread (timer.c, handler.c), or the process-wide timer, or, with
 * scheduler: :thread, at safe points without signals. Custom and object
 * modes sample the calling thread and record at once (the GVL is held;
 * there is no timer thread).
 *
 * Everything here is called with the GVL held, except vm_at_exit (as the
 * VM goes away); nothing runs in a signal handler. The handler reads the
 * shared state (running, mode, ...) with plain or atomic loads.
 */
#include "sampler_internal.h"
#include "gcspan.h"
#include "native.h"
#include "placement.h"
#include "profile.h"
#include "clock.h"
#include "sigstack.h"
#include <unistd.h>
#include <ruby/vm.h>
#include <ruby/version.h>

strobe_sampler_t strobe_sampler;

static struct {
    /* thread begin/end (every mode) and object mode */
    VALUE thread_hook;
    VALUE newobj_hook;
    uint64_t allocations;
} H;

/* ---- object mode ------------------------------------------------------------- */

static void
newobj_hook(VALUE tpval, void *data)
{
    (void)tpval; (void)data;
    if (!atomic_load(&strobe_sampler.running)) return;
    if (++H.allocations % (uint64_t)strobe_sampler.interval != 0) return;
    strobe_sampler_sample_now();
}

/* ---- public ------------------------------------------------------------------- */

/* The JIT compiler that is on (RubyVM::YJIT or, Ruby 4.0+, RubyVM::ZJIT),
 * for the result's jit key: STROBE_JIT_*. */
static int
jit_enabled(void)
{
    VALUE vm = rb_const_get(rb_cObject, rb_intern("RubyVM"));
    static const char *const names[] = { "YJIT", "ZJIT" };
    for (int i = 0; i < 2; i++) {
        ID name = rb_intern(names[i]);
        if (rb_const_defined(vm, name) && RTEST(rb_funcall(rb_const_get(vm, name), rb_intern("enabled?"), 0)))
            return i == 0 ? STROBE_JIT_YJIT : STROBE_JIT_ZJIT;
    }
    return STROBE_JIT_NONE;
}

/* Whether YJIT is on in a Ruby whose rb_profile_frames cannot read a thread
 * in JIT code (before 3.3; see the top of handler.c). The one place a Ruby
 * version decides something: this is a property of the VM, not of an API
 * extconf.rb could detect. */
static int
jit_frames_unsafe(void)
{
#if RUBY_API_VERSION_MAJOR > 3 || (RUBY_API_VERSION_MAJOR == 3 && RUBY_API_VERSION_MINOR >= 3)
    return 0;
#else
    VALUE vm = rb_const_get(rb_cObject, rb_intern("RubyVM"));
    if (!rb_const_defined(vm, rb_intern("YJIT"))) return 0;
    return RTEST(rb_funcall(rb_const_get(vm, rb_intern("YJIT")), rb_intern("enabled?"), 0));
#endif
}

const char *
strobe_sampler_start(strobe_mode_t mode, long interval, VALUE only, strobe_timer_t timer, int native)
{
    if (atomic_load(&strobe_sampler.running)) return "already running";
    if (native && !strobe_native_available())
        return "native: true needs libunwind, which Strobe was built without (install libunwind-dev, then reinstall strobe)";
    if (native && (!(mode == STROBE_MODE_WALL || mode == STROBE_MODE_CPU) || timer == STROBE_TIMER_SAFEPOINTS))
        return "native: true takes native stacks in the signal handler: it needs mode :wall or :cpu with timer signals";

    strobe_sampler.mode = mode;
    atomic_store(&strobe_placement_counts_cpu, mode == STROBE_MODE_CPU);
    strobe_sampler.pid = getpid();
    strobe_sampler.uid = getuid();
    strobe_sampler.defer_running = jit_frames_unsafe();
    int jit = jit_enabled();
    if (jit > strobe_profile.jit) strobe_profile.jit = jit; /* rounds: the JIT any of them ran with */
    strobe_sampler.interval = interval;
    strobe_sampler.only = only;
    atomic_store(&strobe_sampler.signals_sent, 0);
    strobe_threads_reset();
    if (NIL_P(H.thread_hook))
        H.thread_hook = rb_tracepoint_new(Qnil, RUBY_EVENT_THREAD_BEGIN | RUBY_EVENT_THREAD_END,
                                          strobe_sampler_thread_hook, NULL);

    strobe_sampler.track_states = 0;
    strobe_sampler.safepoint_timer = 0;
    strobe_sampler.native = 0;
    if ((mode == STROBE_MODE_WALL || mode == STROBE_MODE_CPU) && timer == STROBE_TIMER_SAFEPOINTS) {
        /* No signal handler at all: the timer thread owes samples to the
         * threads and a postponed job takes them at safe points. */
        strobe_sampler_gvl_start();
        strobe_sampler_register_running_threads();
        atomic_store(&strobe_sampler.running, 1);
        strobe_sampler.safepoint_timer = 1; /* before the timer thread reads it */
        if (strobe_sampler_timer_start() != 0) {
            atomic_store(&strobe_sampler.running, 0);
            strobe_sampler.safepoint_timer = 0;
            strobe_sampler_gvl_stop();
            return "cannot start the sampling thread (scheduler: :thread needs one)";
        }
        strobe_profile.safepoint_timer = 1;
    } else if (mode == STROBE_MODE_WALL || mode == STROBE_MODE_CPU) {
        const char *err = strobe_sampler_install_handler();
        if (err) return err;
        strobe_sigstack_recover(); /* a handler of a previous round left by a longjmp */
        strobe_sampler_footing(); /* this thread's alternate stack: Strobe's (sigstack.c) */
        strobe_sampler.native = native; /* before registering: threads registering set up their unwinding */
        strobe_sampler_gvl_start();
        strobe_sampler_register_running_threads();
        if (native) {
            strobe_native_prepare(strobe_threads_self());
            strobe_profile.native = 1;
        }
        atomic_store(&strobe_sampler.running, 1);
        /* No timer thread (out of threads, say): the process-wide timer.
         * Set before any signal can arrive; the handler reads it. */
        int process_timer = timer == STROBE_TIMER_PROCESS;
        strobe_sampler.process_timer = process_timer;
        if (!process_timer && strobe_sampler_timer_start() != 0) strobe_sampler.process_timer = 1;
        if (strobe_sampler.process_timer && strobe_sampler_process_timer_start() != 0) {
            atomic_store(&strobe_sampler.running, 0);
            strobe_sampler.process_timer = 0;
            strobe_sampler_gvl_stop();
            strobe_sampler_uninstall_handler();
            return "cannot start a timer (neither a timer thread nor a process timer)";
        }
        if (strobe_sampler.process_timer) strobe_profile.process_timer = 1;
    } else if (mode == STROBE_MODE_OBJECT) {
        H.allocations = 0;
        if (NIL_P(H.newobj_hook))
            H.newobj_hook = rb_tracepoint_new(Qnil, RUBY_INTERNAL_EVENT_NEWOBJ, newobj_hook, NULL);
        atomic_store(&strobe_sampler.running, 1);
        rb_tracepoint_enable(H.newobj_hook);
    } else {
        atomic_store(&strobe_sampler.running, 1);
    }
    if ((mode == STROBE_MODE_WALL || mode == STROBE_MODE_CPU) && !strobe_profile.ignore_gc)
        strobe_gcspan_start(mode, interval);
    rb_tracepoint_enable(H.thread_hook);
    return NULL;
}

const char *
strobe_sampler_retime(long interval)
{
    if (!atomic_load(&strobe_sampler.running)) return "not running";
    if (!(strobe_sampler.mode == STROBE_MODE_WALL || strobe_sampler.mode == STROBE_MODE_CPU))
        return "only :wall and :cpu sample by time";
    if (strobe_sampler.process_timer) return "the process-wide timer keeps its interval";
    strobe_sampler_timer_stop();
    strobe_sampler.interval = interval;
    strobe_profile_lock();
    strobe_profile.interval = interval;
    strobe_profile_unlock();
    strobe_gcspan_retime(interval);
    if (strobe_sampler_timer_start() == 0) return NULL;
    /* No timer thread now: the process-wide timer, as start falls back. */
    if (strobe_sampler.safepoint_timer || strobe_sampler_process_timer_start() != 0) return "cannot start a timer";
    strobe_sampler.process_timer = 1;
    strobe_profile.process_timer = 1;
    return NULL;
}

void
strobe_sampler_stop(void)
{
    if (!atomic_exchange(&strobe_sampler.running, 0)) return;
    rb_tracepoint_disable(H.thread_hook);
    strobe_gcspan_stop();
    if (strobe_sampler.mode == STROBE_MODE_WALL || strobe_sampler.mode == STROBE_MODE_CPU) {
        strobe_sampler_timer_stop();
        strobe_sampler_process_timer_stop();
        strobe_sampler.process_timer = 0;
        strobe_sampler.safepoint_timer = 0;
        strobe_sampler_gvl_stop();
        strobe_sampler_gvl_close_stretches();
        strobe_sampler_uninstall_handler();
    } else if (strobe_sampler.mode == STROBE_MODE_OBJECT) {
        rb_tracepoint_disable(H.newobj_hook);
    }
    strobe_sampler_flush();
    strobe_profile.stop_us = strobe_now_us();
}

uint64_t
strobe_sampler_signals_sent(void)
{
    return atomic_load(&strobe_sampler.signals_sent);
}

uint64_t
strobe_sampler_unsampled_threads(void)
{
    return strobe_sampler.unsampled_threads;
}

void
strobe_sampler_forget_unsampled(void)
{
    strobe_sampler.unsampled_threads = 0;
}

int
strobe_sampler_running(void)
{
    return atomic_load(&strobe_sampler.running);
}

void
strobe_sampler_mark(void)
{
    strobe_threads_mark();
    rb_gc_mark(strobe_sampler.only);
    rb_gc_mark(strobe_sampler.excluded);
    rb_gc_mark(H.thread_hook);
    rb_gc_mark(H.newobj_hook);
}

/* The VM is going away: no handler may touch it any more. */
static void
vm_at_exit(ruby_vm_t *vm)
{
    (void)vm;
    atomic_store(&strobe_sampler.vm_alive, 0);
    atomic_store(&strobe_sampler.running, 0);
    strobe_sampler_timer_stop();
    strobe_sampler_process_timer_stop();
}

void
strobe_sampler_init(void)
{
    strobe_sampler_handler_init(); /* Symbols the handler reads, the postponed jobs */
    H.newobj_hook = Qnil;
    H.thread_hook = Qnil;
    strobe_sampler.only = Qnil;
    strobe_sampler.excluded = Qnil;
    strobe_sampler_scopes_init();
    atomic_store(&strobe_sampler.vm_alive, 1);
    strobe_threads_init();
    ruby_vm_at_exit(vm_at_exit);
    strobe_sampler_fork_init();
}
