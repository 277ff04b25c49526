/*
 * sampler.c - when samples are taken: timer thread, signal, handler, fork.
 *
 * Which threads: every running Ruby thread at start (found by the kernel tid
 * Thread#native_thread_id reports) and every thread that begins while
 * profiling (a THREAD_BEGIN hook registers it from the thread itself), or
 * only the Threads of the threads: option. A THREAD_END hook records the
 * thread's name and retires its registry entry (threads.c).
 *
 * Time modes run a timer thread (a plain pthread with every signal blocked,
 * never calling Ruby). Each interval it wakes on an absolute CLOCK_MONOTONIC
 * deadline. It first drains the ring into the profile under the profile
 * lock, without the GVL (so samples are recorded even while every Ruby thread
 * is blocked), then sends STROBE_SIGNAL with tgkill() to each registered
 * thread that needs one:
 *   - :wall: every thread, so threads blocked in IO, sleep, join or waiting
 *     for the GVL are sampled too (their stack as of blocking); except a
 *     thread that captured the same stack twice and whose CPU clock has not
 *     moved since: it has not run, so its stack cannot have changed, and the
 *     timer records that stack again (strobe_profile_record_repeat) without
 *     interrupting it;
 *   - :cpu: a thread whose own CPU clock advanced by an interval since its
 *     last signal, so a thread that waits gets no CPU samples and the rate is
 *     not capped by the kernel tick the way setitimer(ITIMER_PROF) is.
 * A dead thread is never signalled (tgkill reports ESRCH, a dead thread's
 * CPU clock reads EINVAL).
 *
 * The handler runs on the sampled thread, on its alternate signal stack,
 * with its own signal not blocked (sigstack.c: a thread near the end of its
 * stack, a handler left by a longjmp). It only does what strobe_capture()
 * allows (async-signal-safe). It preserves errno, takes the thread's guard
 * (sigstack.c), and does nothing after the VM has begun shutting down or
 * on a thread it does not know.
 *
 * The signal is SIGURG, not SIGPROF: its default action is to ignore it, so
 * a signal still pending when the program calls exec() is discarded by the
 * new program instead of killing it (with SIGPROF it does), and a late signal
 * after stop is harmless whatever the disposition. SIGPROF and SIGALRM stay
 * free for other profilers. Signal ownership: start refuses if someone else
 * has a handler for it; stop restores the disposition found at first start
 * (default or ignore, both harmless).
 * fork: the child inherits no timer thread; an atfork hook marks it stopped.
 *
 * Process-wide timer (timer: :process, or when the timer thread cannot be
 * started): one POSIX timer on the process CPU clock (:cpu) or the monotonic
 * clock (:wall) sends STROBE_SIGNAL to the process, the kernel picks the
 * thread (the one running, for CPU time), and the handler triggers a
 * postponed job that drains the ring with the GVL. This is how stackprof
 * samples; the result says :process under :timer so it is never silent.
 *
 * GVL states (Ruby 3.2+, where extconf.rb finds rb_internal_thread_add_event_hook):
 * a hook on the GVL events (READY: waiting for it, RESUMED: holding it,
 * SUSPENDED: released it to block) keeps each registered thread's state,
 * which every time-mode sample records. The hook runs mostly without the
 * GVL, finds the entry of the thread the event is about (3.3+ names it; 3.2
 * runs the hook on the thread itself) and only stores a byte into it.
 * Without the hook samples carry no state and the result has no state keys.
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
 * Everything here except the handler, the GVL hook and the timer thread's
 * loop is called with the GVL held. Custom and object modes sample the calling thread and
 * record at once (the GVL is held; there is no timer thread).
 */
#include "strobe.h"
#include "sigstack.h"
#include "gcspan.h"
#include "gvlspan.h"
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <ruby/vm.h>
#include <ruby/thread.h>
#include <ruby/version.h>

static struct {
    atomic_int running;
    atomic_int vm_alive;
    strobe_mode_t mode;
    long interval;
    VALUE only;              /* Array of the Threads to profile, or Qnil for all */
    VALUE excluded;          /* Array of Strobe's own Threads, never profiled (or Qnil) */
    uint64_t unsampled_threads; /* profiled threads the full registry turned away */
    _Atomic uint64_t signals_sent; /* since the last start */

    /* timer thread */
    pthread_t timer;
    int timer_started;
    pthread_mutex_t timer_lock;
    pthread_cond_t timer_cond;
    int timer_stop;

    /* process-wide timer */
    int process_timer;       /* this round uses it instead of the timer thread */
    timer_t ptimer;
    int ptimer_started;
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
    rb_postponed_job_handle_t job;
    rb_postponed_job_handle_t sample_job;
#endif
    int defer_running;       /* this round: GVL holders sample at safe points (YJIT) */
    int safepoint_timer;     /* this round: no signals; the timer asks for samples at safe points */

    /* STROBE_SIGNAL disposition before our first start */
    struct sigaction old_action;
    int handler_installed;

#ifdef HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK
    rb_internal_thread_event_hook_t *gvl_hook;
#endif
    int track_states;        /* this round records GVL states */
    VALUE scope_key;         /* the Fiber storage key threads inherit a scope by (a static Symbol) */
    int native;              /* this round captures native frames in the handler */

    pid_t pid;               /* this process, as the timer's signals name it */
    uid_t uid;

    /* a descriptor forked children close (strobe serve's socket), -1 none,
     * and the file it was then (the program may close it and open another
     * file under its number) */
    int child_fd, null_fd;
    dev_t child_dev;
    ino_t child_ino;

    /* thread begin/end (every mode) and object mode */
    VALUE thread_hook;
    VALUE newobj_hook;
    uint64_t allocations;

} S;

static VALUE sym_state, sym_marking, sym_sweeping;

/* ---- which threads ---------------------------------------------------------- */

static int
profiled(VALUE thread)
{
    if (!NIL_P(S.excluded) && RTEST(rb_ary_includes(S.excluded, thread))) return 0;
    return NIL_P(S.only) || RTEST(rb_ary_includes(S.only, thread));
}

void
strobe_sampler_only(VALUE threads)
{
    S.only = threads;
}

int
strobe_sampler_profiled(VALUE thread)
{
    return profiled(thread);
}

void
strobe_sampler_exclude_current(void)
{
    if (NIL_P(S.excluded)) S.excluded = rb_ary_new();
    VALUE thread = rb_thread_current();
    if (!RTEST(rb_ary_includes(S.excluded, thread))) rb_ary_push(S.excluded, thread);
    strobe_thread_t *t = strobe_threads_self();
    if (!t) return;
    strobe_sampler_flush(); /* what it captured so far still names it */
    strobe_profile_thread_ended(t);
    strobe_threads_end(t);
}

/* GVL held: registers the calling thread (thread), NULL when
 * STROBE_MAX_THREADS are. */
static strobe_thread_t *
register_current(VALUE thread)
{
    /* It runs Ruby code now: it holds the GVL. */
    strobe_thread_t *t = strobe_threads_add(strobe_gettid(), thread, S.track_states ? STROBE_STATE_RUNNING : STROBE_STATE_UNKNOWN);
    if (!t) S.unsampled_threads++;
    else if (S.native) strobe_native_warm(t);
    return t;
}

/* GVL held: the calling thread's entry, registering it if it is profiled. */
static strobe_thread_t *
current_entry(void)
{
    strobe_thread_t *t = strobe_threads_self();
    if (t) return t;
    VALUE thread = rb_thread_current();
    return profiled(thread) ? register_current(thread) : NULL;
}

/* The calling thread's entry if it is sampled now; NULL for a thread that
 * is not profiled, or not now (between scopes). */
static strobe_thread_t *
sampled_entry(void)
{
    if (!atomic_load(&S.running)) return NULL;
    strobe_thread_t *t = current_entry();
    return t && strobe_sampler_sampled(t) ? t : NULL;
}

int
strobe_sampler_current_sampled(void)
{
    return sampled_entry() != NULL;
}

int
strobe_sampler_add_marker(strobe_marker_t *m)
{
    strobe_thread_t *t = sampled_entry();
    return t ? strobe_profile_add_marker(t, m) : 0;
}

/* ---- scopes: threads sampled only while they serve something -------------------
 *
 * Strobe::Middleware profiles a request's own threads, not the server's
 * idle ones: it starts with threads: naming the first request's thread, and
 * each request's thread enters a scope (a process-wide number) as the
 * request begins and leaves it as it ends. Between scopes an entry stays
 * registered, its samples kept, but paused: the timer neither signals it
 * nor counts its ticks missed, and a signal sent just before it paused
 * takes no sample. Scopes nest on a thread (a fiber server's requests, an
 * application calling itself): it pauses when its last one ends. A thread
 * the scope's code starts inherits the scope through Fiber storage (Ruby
 * 3.2+: Thread.new copies it), under Native::SCOPE_KEY, and pauses with it. */

/* GVL held (every scope call runs Ruby's side of a request): the last
 * scope number given out, and the scopes open now, each with the threads
 * its code started (the first STROBE_SCOPE_CHILDREN: their ids in a
 * result, for the request's own profile). */
#define STROBE_OPEN_SCOPES 4096
#define STROBE_SCOPE_CHILDREN 32
typedef struct {
    long id;
    int children;
    pid_t child[STROBE_SCOPE_CHILDREN];
} open_scope_t;
static long scopes_made;
static open_scope_t open_scopes[STROBE_OPEN_SCOPES];
static int open_scopes_len;

static open_scope_t *
scope_open(long id)
{
    for (int i = 0; i < open_scopes_len; i++)
        if (open_scopes[i].id == id) return &open_scopes[i];
    return NULL;
}

static void
scope_close(long id)
{
    open_scope_t *o = scope_open(id);
    if (o) *o = open_scopes[--open_scopes_len];
}

int
strobe_sampler_scope_threads(long id, pid_t *out, int max)
{
    const open_scope_t *o = scope_open(id);
    int n = 0;
    for (int i = 0; o && i < o->children && n < max; i++) out[n++] = o->child[i];
    return n;
}

static int
fiber_storage_available(void)
{
    static int known = -1;
    if (known < 0) known = rb_respond_to(rb_path2class("Fiber"), rb_intern("[]"));
    return known;
}

VALUE
strobe_sampler_scope_key(void)
{
    return S.scope_key;
}

int
strobe_sampler_sampled(const strobe_thread_t *t)
{
    return !atomic_load_explicit(&t->paused, memory_order_relaxed);
}

/* :cpu, under the registry lock: thread t, at CPU time cpu, keeps owing
 * what it used towards its next samples, up to `most` intervals; whole
 * intervals beyond are counted missed: CPU the timer was too late for (a
 * loaded machine), not signalled in a burst. After a tick's sample that is
 * two, not one: the timer sees a threshold crossed only at its next tick,
 * so a thread running flat out is seen about an interval late, and a tick
 * that wakes late finds the next interval used too. Cutting the debt to
 * one interval there lost the excess silently, tick after tick (4% of the
 * samples at 10 ms), and at every pause between requests (a quarter of a
 * short-request app's: its threshold is mostly crossed after a request's
 * last tick). As a thread pauses it keeps two as well, the interval the
 * timer lags by and the rest; more was used by the request that ends and
 * would be charged to the next one's stack, so it is counted missed. */
static void
cpu_owed_at_most(strobe_thread_t *t, int64_t cpu, int64_t interval_ns, int64_t most)
{
    int64_t over = (cpu - t->cpu_last_ns) / interval_ns - (most - 1);
    if (over <= 0) return;
    strobe_profile_add_missed((uint64_t)over);
    t->cpu_last_ns += over * interval_ns;
}

/* Under the registry lock (the timer's counts for t are its own during a
 * tick): t samples for scope id. Resuming, its counts start afresh so its
 * time paused is neither missed nor owed, except the CPU it had used
 * towards its next :cpu sample, kept as it paused (else every request's
 * first interval would go unsampled); and the stack it had before is not
 * repeated for it. */
static void
resume_locked(strobe_thread_t *t, long id)
{
    atomic_store(&t->scope, id);
    if (!atomic_load(&t->paused)) return;
    t->sent = atomic_load(&t->handled);
    t->pending_ticks = 0;
    int64_t cpu = strobe_placement_cpu_ns(t, 100);
    if (cpu >= 0) t->cpu_last_ns = cpu - t->cpu_carry_ns;
    atomic_store(&t->idle_cpu_ns, -1); /* read its stack afresh */
    atomic_store(&t->deferred, 0);
    strobe_gvlspan_begin(t, strobe_now_us()); /* no stretch from before */
    strobe_profile_lock();
    strobe_profile_forget_stack(t);
    strobe_profile_unlock();
    atomic_store(&t->paused, 0);
}

/* Under the registry lock: t stops being sampled, keeping what CPU it used
 * towards its next sample. */
static void
pause_locked(strobe_thread_t *t)
{
    if (S.mode == STROBE_MODE_CPU) {
        int64_t cpu = strobe_placement_cpu_ns(t, 100);
        if (cpu >= 0) cpu_owed_at_most(t, cpu, (int64_t)S.interval * 1000, 2);
        int64_t carry = cpu >= 0 ? cpu - t->cpu_last_ns : 0;
        t->cpu_carry_ns = carry < 0 ? 0 : carry;
    }
    atomic_store(&t->paused, 1);
    atomic_store(&t->scope, 0);
    t->scope_depth = 0;
}

/* A thread starting (THREAD_BEGIN, its own thread): in the scope its
 * creator was in, if that scope is still open when it has registered. */
static void
inherit_scope(VALUE thread)
{
    if (!fiber_storage_available()) return;
    VALUE id = rb_funcall(rb_path2class("Fiber"), rb_intern("[]"), 1, S.scope_key);
    if (!FIXNUM_P(id) || !scope_open(FIX2LONG(id))) return;
    /* Registering can run other threads (threads.c asks Ruby whether an
     * entry on this native thread is alive): the scope may close meanwhile. */
    strobe_thread_t *t = register_current(thread);
    if (!t) return;
    strobe_threads_lock();
    open_scope_t *o = scope_open(FIX2LONG(id));
    if (o) {
        atomic_store(&t->paused, 1); /* a fresh entry: resumed with fresh counts */
        resume_locked(t, FIX2LONG(id));
        if (o->children < STROBE_SCOPE_CHILDREN) o->child[o->children++] = atomic_load(&t->tid);
    } else {
        pause_locked(t);
    }
    strobe_threads_unlock();
}

long
strobe_sampler_scope_enter(void)
{
    if (!atomic_load(&S.running)) return 0;
    strobe_thread_t *t = strobe_threads_self();
    if (!t) t = register_current(rb_thread_current());
    if (!t) return 0;
    long id = ++scopes_made;
    if (open_scopes_len < STROBE_OPEN_SCOPES) /* else its threads' own are not */
        open_scopes[open_scopes_len++] = (open_scope_t){ .id = id, .children = 0 };
    strobe_threads_lock();
    if (t->scope_depth++ == 0) atomic_store(&t->paused, 1); /* (resumed with fresh counts) */
    resume_locked(t, id);
    strobe_threads_unlock();
    return id;
}

void
strobe_sampler_scope_leave(long id)
{
    scope_close(id);
    strobe_thread_t *self = strobe_threads_self();
    strobe_threads_lock();
    for (int i = 0, n = strobe_threads_len(); i < n; i++) {
        strobe_thread_t *t = strobe_threads_at(i);
        if (t != self && atomic_load(&t->scope) == id) pause_locked(t); /* threads the scope started */
    }
    /* The calling thread pauses as the last scope open on it ends. */
    if (self && self->scope_depth > 0 && --self->scope_depth == 0) pause_locked(self);
    strobe_threads_unlock();
}

/* A note (not a sample) of thread t's stack, for the timer to repeat while
 * t cannot be signalled: an M:N thread as it leaves the GVL (its own hook,
 * thread Qfalse, on its native thread with its frames current), or one
 * parked at start (thread its Ruby Thread, GVL held). Like the handler, it
 * takes t's re-entry guard and reads nothing while GC runs. */
#ifdef HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK /* M:N threads are Ruby 3.3+ */
static void
note_stack(strobe_thread_t *t, VALUE thread)
{
    if (!strobe_sampler_sampled(t)) return; /* paused between scopes: nothing to repeat */
    if (!strobe_guard_take(t)) return;
    size_t gc_epoch = rb_gc_count();
    atomic_thread_fence(memory_order_acquire);
    if (!rb_during_gc()) strobe_capture(t, thread, STROBE_FRAME_RUBY, gc_epoch, STROBE_CAPTURE_NOTE, NULL, NULL);
    strobe_guard_release(t);
}
#endif

/* GVL held: registers every running thread that is profiled, by the kernel
 * tid Thread#native_thread_id reports (threads not started yet register
 * themselves when they begin, see thread_hook). */
static void
register_running_threads(void)
{
    VALUE list = NIL_P(S.only) ? rb_funcall(rb_cThread, rb_intern("list"), 0) : S.only;
    VALUE current = rb_thread_current();
    ID native_thread_id = rb_intern("native_thread_id");
    for (long i = 0; i < RARRAY_LEN(list); i++) {
        VALUE thread = RARRAY_AREF(list, i);
        if (!profiled(thread)) continue;
        /* "run", "sleep" or "aborting"; false or nil once it has ended,
         * which it may do during any of these calls (they can switch
         * threads): a thread that just finished is skipped. */
        VALUE status = rb_funcall(thread, rb_intern("status"), 0);
        if (!RB_TYPE_P(status, T_STRING)) continue;
        pid_t tid;
        /* The starting thread holds the GVL; of the others, a sleeping
         * one (sleep, IO, a lock, a queue) has released it, and a
         * runnable one waits for it. */
        int state = STROBE_STATE_UNKNOWN;
        if (S.track_states)
            state = thread == current ? STROBE_STATE_RUNNING
                  : rb_str_equal(status, rb_str_new_cstr("sleep")) == Qtrue ? STROBE_STATE_BLOCKED
                                                                              : STROBE_STATE_WAITING;
        if (thread == current) {
            /* Ruby 3.1 keeps reporting the parent's tid in a forked child. */
            tid = strobe_gettid();
        } else {
            VALUE id = rb_funcall(thread, native_thread_id, 0);
            /* Not started: it registers itself as it begins. An M:N thread
             * on no native thread now is placed when it resumes. */
            if (NIL_P(id) && !strobe_mn_threads) continue;
            tid = NIL_P(id) ? 0 : (pid_t)NUM2INT(id);
        }
        strobe_thread_t *t = strobe_threads_add(tid, thread, state);
        if (!t) S.unsampled_threads++;
#if defined(HAVE_RB_PROFILE_THREAD_FRAMES) && defined(HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK)
        /* An M:N thread not running now cannot be signalled (see
         * handler_entry): its stack, read here with the GVL held, is what
         * the timer repeats until it runs. */
        else if (atomic_load(&t->mobile) && thread != current) note_stack(t, thread);
#endif
    }
}

/* A thread's start (start 1) or end (0) on its timeline, if it is sampled. */
static void
thread_marker(strobe_thread_t *t, int start)
{
    if (!t || !strobe_sampler_sampled(t)) return;
    strobe_marker_t m = {
        .start_us = strobe_now_us(), .end_us = -1, .kind = STROBE_MARKER_THREAD, .state = (uint8_t)start,
        .type = Qnil, .name = Qnil, .data = Qnil,
    };
    strobe_profile_add_marker(t, &m);
}

/* Runs on the thread that begins or ends, with the GVL. */
static void
thread_hook(VALUE tpval, void *data)
{
    (void)data;
    if (!atomic_load(&S.running)) return;
    rb_trace_arg_t *arg = rb_tracearg_from_tracepoint(tpval);
    if (rb_tracearg_event_flag(arg) == RUBY_EVENT_THREAD_BEGIN) {
        VALUE thread = rb_thread_current();
        if (profiled(thread)) {
            /* The time modes sample it from the start; the others as it
             * samples (current_entry). Registered by its Thread, not found
             * by its tid: start may have registered it by its tid before it
             * ran, and a signal then found it no Ruby thread yet (not_ruby,
             * which registering clears); on Ruby 3.1 its native thread may
             * still be listed for a Thread that was killed. */
            if (S.mode == STROBE_MODE_WALL || S.mode == STROBE_MODE_CPU) register_current(thread);
        } else if (open_scopes_len) { /* some scope is open: maybe its creator's */
            inherit_scope(thread);
        }
        thread_marker(strobe_threads_self(), 1);
        return;
    }
    strobe_thread_t *t = strobe_threads_self();
    if (!t) return;
    thread_marker(t, 0);
    strobe_sampler_flush(); /* its captured samples still name it */
    strobe_profile_thread_ended(t);
    strobe_threads_end(t);
    strobe_sigstack_thread_ended();
}

/* ---- GVL states ---------------------------------------------------------------- */

#ifdef HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK
/* Without the GVL except for RESUMED: one lock-free lookup and a store.
 * Ruby 3.3+ says which thread the event is about: not always the one the
 * hook runs on (a thread made ready by another, as a new thread is by the
 * one creating it: taken for the creator's own, it showed the creator
 * computing as "waiting" for up to a 100 ms time slice). Ruby 3.2 does not
 * say, and runs the hook on the thread itself. */
static void
gvl_event(rb_event_flag_t event, const rb_internal_thread_event_data_t *data, void *unused)
{
    (void)data; (void)unused;
#ifdef HAVE_RB_INTERNAL_THREAD_EVENT_DATA_T_THREAD
    strobe_thread_t *t = data ? strobe_threads_of(data->thread) : strobe_threads_self();
#else
    strobe_thread_t *t = strobe_threads_self(); /* NULL unless registered */
#endif
    if (!t) return;
    /* Outside any handler: a guard its own handler was left holding. */
    strobe_guard_reclaim(t);
    uint8_t state = (event & RUBY_INTERNAL_THREAD_EVENT_RESUMED) ? STROBE_STATE_RUNNING
                  : (event & RUBY_INTERNAL_THREAD_EVENT_READY) ? STROBE_STATE_WAITING
                  : STROBE_STATE_BLOCKED;
    /* RESUMED runs on the native thread about to run it, with its frames
     * current; SUSPENDED on the same one before it switches away. Under M:N
     * a thread runs on other native threads in turn (placement.c), and its
     * stack as it leaves the GVL is noted for the timer to repeat while it
     * is parked. */
    if (state == STROBE_STATE_RUNNING) strobe_placement_resumed(t);
    strobe_gvlspan_change(t, state);
    if (event & RUBY_INTERNAL_THREAD_EVENT_SUSPENDED && atomic_load_explicit(&t->mobile, memory_order_relaxed)) {
        /* :wall repeats it at each tick while parked. :cpu needs it only
         * when the thread has used an interval of CPU since its latest
         * sample (owed one, which the timer takes from this stack), so its
         * cost follows the sampling rate, not the rate of GVL switches. */
        strobe_placement_suspended(t);
        if (atomic_load(&S.running) &&
            (S.mode == STROBE_MODE_WALL ||
             (S.mode == STROBE_MODE_CPU && strobe_placement_cpu_ns(t, 4) - atomic_load_explicit(&t->cpu_last_ns, memory_order_relaxed) >=
                 (int64_t)S.interval * 1000)))
            note_stack(t, Qfalse);
    }
    /* A thread that was running when profiling started, resuming on its
     * own thread: the first chance to set up its fast native unwinding. */
    if (state == STROBE_STATE_RUNNING && S.native && !atomic_load_explicit(&t->native_warm, memory_order_relaxed) &&
        t == strobe_threads_self())
        strobe_native_warm(t);
}
#endif

/* Without GVL events (Ruby 3.1) there is no hook: both do nothing. */
static void
gvl_hook_add(void)
{
#ifdef HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK
    S.gvl_hook = rb_internal_thread_add_event_hook(
        gvl_event,
        RUBY_INTERNAL_THREAD_EVENT_READY | RUBY_INTERNAL_THREAD_EVENT_RESUMED | RUBY_INTERNAL_THREAD_EVENT_SUSPENDED,
        NULL);
#endif
}

static void
gvl_hook_remove(void)
{
#ifdef HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK
    if (S.gvl_hook) rb_internal_thread_remove_event_hook(S.gvl_hook);
    S.gvl_hook = NULL;
#endif
}

/* As profiling stops (the hook removed): each thread's stretch of waiting
 * or blocked under way ends now (gvlspan.c). */
static void
close_gvl_stretches(void)
{
    int64_t now = strobe_now_us();
    strobe_threads_lock();
    for (int i = 0, n = strobe_threads_len(); i < n; i++) {
        strobe_thread_t *t = strobe_threads_at(i);
        if (atomic_load_explicit(&t->state, memory_order_acquire) == STROBE_THREAD_LIVE) strobe_gvlspan_close(t, now);
    }
    strobe_threads_unlock();
}

/* Time modes: follow GVL states where Ruby reports them. Before the
 * running threads are registered, so no change after a thread's initial
 * state is read is missed. */
static void
gvl_states_start(void)
{
#ifdef HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK
    S.track_states = 1;
    strobe_profile.track_states = 1;
    gvl_hook_add();
#endif
}

static void
gvl_states_stop(void)
{
    gvl_hook_remove();
    S.track_states = 0;
}

/* Ruby runs GVL hooks under a process-wide rwlock that fork does not reset:
 * a fork while another thread is inside a hook leaves it read-locked in the
 * child, and the child's next rb_internal_thread_add_event_hook() waits
 * forever (seen on 3.3.8). So the hook is taken out around fork (removing
 * waits for running hooks to finish; see atfork_prepare) and put back in
 * the parent; events during the fork itself are not seen, so a state may
 * lag until the thread's next GVL event. Profiling stops in the child. */
static void
gvl_hook_resume_after_fork(int in_child)
{
    if (in_child) S.track_states = 0;
    else if (S.track_states) gvl_hook_add();
}

/* ---- hand-off -------------------------------------------------------------- */

static void
drain(void *unused)
{
    (void)unused;
    strobe_capture_drain(strobe_profile_record_slot);
}

void
strobe_sampler_flush(void)
{
    if (strobe_profile_locked(drain, NULL) < 0) rb_memerror();
}

/* Postponed job (process-wide timer): GVL held, at a safe point. Running
 * out of memory here only loses the slot (counted missed); raising would
 * land in whatever Ruby code was interrupted. */
static void
drain_job(void *unused)
{
    (void)unused;
    strobe_profile_locked(drain, NULL);
}

/* Async-signal-safe: Ruby's postponed jobs are made for signal handlers. */
static void
trigger_drain(void)
{
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
    rb_postponed_job_trigger(S.job);
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
    if (gc_kind != STROBE_FRAME_RUBY && strobe_gcspan_under_way()) return S.process_timer ? -1 : 0;
    return strobe_capture(t, thread, gc_kind, gc_epoch, strobe_now_us(), unchanged, S.native ? ucontext : NULL);
}

/* One time-mode sample of thread t, whose guard (sigstack.c) the caller
 * holds: the calling thread (thread Qfalse; from the handler or
 * sample_job), or another thread read with the GVL held (its Ruby Thread;
 * from sample_job, Ruby 3.2+). ucontext: the handler's signal context,
 * for native frames; NULL elsewhere. */
static void
take_sample(strobe_thread_t *t, VALUE thread, const void *ucontext)
{
    if (S.mode == STROBE_MODE_WALL) {
        /* The same stack twice: the thread is likely blocked. Its CPU time
         * now lets the timer see whether it ran since (see timer_main). */
        int unchanged = 0;
        int r = sample_thread(t, thread, &unchanged, ucontext);
        if (r == 0) strobe_profile_add_missed(1);
        atomic_store(&t->idle_cpu_ns, r == 1 && unchanged ? strobe_placement_cpu_ns(t, 2) : -1);
    } else if (sample_thread(t, thread, NULL, ucontext) == 0) {
        strobe_profile_add_missed(1);
    }
}

/* CPU a thread may use while parked (handling a signal, returning to its
 * wait) and still count as not having run: see idle_ns in timer_main. */
#define STROBE_IDLE_CPU_NS 20000

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
    if (S.mode == STROBE_MODE_CPU || t->handler_cpu_ns == 0) return 1;
    return strobe_clock_ns(CLOCK_THREAD_CPUTIME_ID) - t->handler_cpu_ns > STROBE_IDLE_CPU_NS;
}

/* The signal (or owed sample) the timer counted sent to t is dealt with:
 * its next tick may ask again (see pending). Async-signal-safe. */
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
    if (S.safepoint_timer && S.mode == STROBE_MODE_WALL) count_handled(t);
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
    if (!atomic_load(&S.running)) return;
    strobe_thread_t *self = strobe_threads_self();
    if (self) {
        if (S.native) strobe_native_warm(self); /* its own thread, no handler */
        serve_owed(self, Qfalse);
    }
#ifdef HAVE_RB_PROFILE_THREAD_FRAMES
    if (S.safepoint_timer) {
        strobe_threads_lock();
        for (int i = 0, n = strobe_threads_len(); i < n; i++) {
            strobe_thread_t *t = strobe_threads_at(i);
            if (t == self || atomic_load_explicit(&t->state, memory_order_acquire) != STROBE_THREAD_LIVE) continue;
            if (RTEST(t->thread)) serve_owed(t, t->thread);
        }
        strobe_threads_unlock();
    }
#endif
    if (S.process_timer) strobe_profile_locked(drain, NULL);
}

static void
trigger_sample_job(void)
{
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
    rb_postponed_job_trigger(S.sample_job);
#else
    rb_postponed_job_register_one(0, sample_job, NULL);
#endif
}

/* The registry entry a signal was sent for: the timer thread names it in
 * the signal's value (send_signal). NULL for a signal from elsewhere (the
 * process-wide timer, another sender of SIGURG). Async-signal-safe. */
static strobe_thread_t *
signal_target(const siginfo_t *info, int *stale)
{
    *stale = 0;
    if (!info || info->si_code != SI_QUEUE || info->si_pid != S.pid) return NULL;
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
    int saved_errno = errno;

    if (!atomic_load(&S.running) || !atomic_load(&S.vm_alive)) goto out;
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
         * the timer repeats its stack at the next (see timer_main). */
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
    int taken = strobe_guard_take_in_handler(t, &saved_errno);
    if (taken < 0) {
        /* It interrupted this thread's own handler (its signal is not
         * blocked, see sigstack.c): that one takes one more sample as it
         * ends, as the kernel would have delivered this signal then. */
        atomic_store(&t->nested_tick, 1);
        count_handled(t);
        goto out;
    }
    if (!taken) {
        strobe_profile_add_missed(1);
        count_handled(t);
        goto out;
    }
    strobe_sigstack_leave_if_asked();

    if (S.defer_running && may_run_jit_code(t)) {
        /* Owe the sample to the next safe point. One still owed from the
         * previous signal is lost. */
        if (atomic_exchange(&t->deferred, 1)) strobe_profile_add_missed(1);
        if (atomic_exchange(&t->nested_tick, 0)) strobe_profile_add_missed(1); /* one owed sample for both */
        atomic_store(&t->idle_cpu_ns, -1); /* it is running */
        trigger_sample_job();
    } else {
        take_sample(t, Qfalse, ucontext);
        if (atomic_exchange(&t->nested_tick, 0)) take_sample(t, Qfalse, ucontext);
        if (S.process_timer) trigger_drain();
        /* Native frames on a thread not set up for libunwind's fast path:
         * the postponed job sets it up on this thread, at its next safe
         * point (sample_job). */
        if (S.native && !atomic_load_explicit(&t->native_warm, memory_order_relaxed) && !atomic_load(&t->mobile))
            trigger_sample_job();
    }
    count_handled(t);
    if (S.defer_running) t->handler_cpu_ns = strobe_clock_ns(CLOCK_THREAD_CPUTIME_ID);
    strobe_guard_release(t);
out:
    errno = saved_errno;
}

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
 * by the time the handler runs, which it can then tell (signal_target). */
static void
send_signal(const strobe_thread_t *t, pid_t tid)
{
    atomic_fetch_add_explicit(&S.signals_sent, 1, memory_order_relaxed);
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    si.si_signo = STROBE_SIGNAL;
    si.si_code = SI_QUEUE;
    si.si_pid = S.pid;
    si.si_uid = S.uid;
    si.si_value.sival_int = (int)(t->index | (strobe_threads_generation() & 0x7fff) << 16);
    syscall(SYS_rt_tgsigqueueinfo, (long)S.pid, (long)tid, (long)STROBE_SIGNAL, &si);
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
    pid_t tid = S.safepoint_timer ? 0 : strobe_placement_tid(t, 100);
    if (!S.safepoint_timer && (!tid || (atomic_load(&t->mobile) && signalled_this_tick(tid)))) {
        strobe_profile_add_missed(1);
        return 0;
    }
    /* Counted before it goes out: the handler may count it handled at once. */
    if (S.mode == STROBE_MODE_WALL || !S.safepoint_timer) {
        t->sent = atomic_load_explicit(&t->handled, memory_order_acquire) + 1;
        t->pending_ticks = 0;
    }
    if (!S.safepoint_timer) {
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
 * STROBE_PENDING_TICKS ticks so far (then it is taken as lost). An M:N
 * thread that left the GVL since is not waited for: its stack is noted
 * (as parked). */
static int
pending(strobe_thread_t *t)
{
    uint32_t handled = atomic_load_explicit(&t->handled, memory_order_acquire);
    if ((int32_t)(t->sent - handled) > 0 && atomic_load(&t->mobile) && parked(t)) t->sent = handled;
    return (int32_t)(t->sent - handled) > 0 && ++t->pending_ticks < STROBE_PENDING_TICKS;
}

static void *
timer_main(void *arg)
{
    (void)arg;
    const int64_t interval_ns = (int64_t)S.interval * 1000;
    /* CPU a blocked thread may use after its handler read its clock (the
     * rest of the handler, sigreturn, re-entering the wait) and still count
     * as not having run. */
    const int64_t idle_ns = interval_ns / 4 < STROBE_IDLE_CPU_NS ? interval_ns / 4 : STROBE_IDLE_CPU_NS;
    static strobe_thread_t *idle_threads[STROBE_MAX_THREADS];
    int64_t next = strobe_clock_ns(CLOCK_MONOTONIC);
    /* Ended threads' entries are checked every 10 ms or so: a probe
     * syscall each, not worth making every tick. */
    const uint64_t reclaim_every = S.interval >= 10000 ? 1 : (uint64_t)(10000 / S.interval);
    uint64_t ticks = 0;

    pthread_mutex_lock(&S.timer_lock);
    while (!S.timer_stop) {
        next += interval_ns;
        struct timespec deadline = { (time_t)(next / 1000000000), (long)(next % 1000000000) };
        while (!S.timer_stop) {
            int rc = pthread_cond_timedwait(&S.timer_cond, &S.timer_lock, &deadline);
            if (rc == ETIMEDOUT) break;
        }
        if (S.timer_stop) break;

        /* No entry changes owner during the tick. */
        strobe_threads_lock();
        /* Record what the handlers captured since the last tick. Off the
         * GVL, so it goes on whether or not any Ruby thread is running. */
        strobe_profile_locked(drain, NULL);
        if (++ticks % reclaim_every == 0) strobe_threads_reclaim();

        int n = strobe_threads_len(), live = 0, idle_len = 0, job = 0;
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
            if (S.mode == STROBE_MODE_CPU) {
                if (cpu - t->cpu_last_ns < interval_ns) continue;
                /* An M:N thread that used the CPU but has released the GVL
                 * since (it is parked now, no signal can read it): its
                 * latest stack is recorded again, as for idle threads. */
                int repeat = parked(t) && strobe_capture_drained(t->last_seq);
                /* Carry the remainder so the rate matches the interval (see
                 * cpu_owed_at_most). */
                t->cpu_last_ns += interval_ns;
                cpu_owed_at_most(t, cpu, interval_ns, 2);
                if (repeat) {
                    idle_threads[idle_len++] = t;
                    continue;
                }
                /* Its last signal is not handled yet: its handler may be
                 * running, and with the signal not blocked there (see
                 * sigstack.c) another would nest in it. Delivering and
                 * handling a signal costs the thread CPU time too: at a
                 * short interval on a slow machine (sanitizers) each
                 * handler used an interval, and handlers nested until
                 * they overflowed the alternate stack. This one is missed. */
                if (!S.safepoint_timer && pending(t)) {
                    strobe_profile_add_missed(1);
                    continue;
                }
            } else {
                if (pending(t)) {
                    strobe_profile_add_missed(1); /* its last signal is not handled yet */
                    /* Without signals, the job may have run on another
                     * thread: ask for it again (harmless if pending). */
                    if (S.safepoint_timer && atomic_load(&t->deferred)) job = 1;
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
        if (job) trigger_sample_job();
        /* Late by more than an interval (machine busy): do not burst, but
         * in wall mode every tick skipped is a sample owed, so count it as
         * missed rather than let the rate drop silently. (In CPU mode the
         * next check sees the CPU time used and counts what it cannot
         * sample, above.) */
        int64_t now = strobe_clock_ns(CLOCK_MONOTONIC);
        if (now - next > interval_ns) {
            if (S.mode == STROBE_MODE_WALL)
                strobe_profile_add_missed((uint64_t)((now - next) / interval_ns) * (uint64_t)live);
            next = now;
        }
    }
    pthread_mutex_unlock(&S.timer_lock);
    return NULL;
}

static int
timer_start(void)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&S.timer_cond, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&S.timer_lock, NULL);
    S.timer_stop = 0;

    /* The timer thread inherits a mask blocking every signal, so no signal
     * meant for Ruby's threads is ever delivered to it. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&S.timer, NULL, timer_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) return rc;
    S.timer_started = 1;
    return 0;
}

static void
timer_stop(void)
{
    if (!S.timer_started) return;
    pthread_mutex_lock(&S.timer_lock);
    S.timer_stop = 1;
    pthread_cond_signal(&S.timer_cond);
    pthread_mutex_unlock(&S.timer_lock);
    pthread_join(S.timer, NULL);
    S.timer_started = 0;
    pthread_cond_destroy(&S.timer_cond);
    pthread_mutex_destroy(&S.timer_lock);
}

/* ---- process-wide timer ---------------------------------------------------------- */

static int
process_timer_start(void)
{
    struct sigevent sev;
    memset(&sev, 0, sizeof(sev));
    sev.sigev_notify = SIGEV_SIGNAL;
    sev.sigev_signo = STROBE_SIGNAL;
    clockid_t clock = S.mode == STROBE_MODE_CPU ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC;
    if (timer_create(clock, &sev, &S.ptimer) != 0) return -1;
    struct timespec every = { (time_t)(S.interval / 1000000), (long)(S.interval % 1000000) * 1000 };
    struct itimerspec spec = { every, every };
    if (timer_settime(S.ptimer, 0, &spec, NULL) != 0) {
        timer_delete(S.ptimer);
        return -1;
    }
    S.ptimer_started = 1;
    return 0;
}

static void
process_timer_stop(void)
{
    if (!S.ptimer_started) return;
    timer_delete(S.ptimer);
    S.ptimer_started = 0;
}

/* ---- signal ownership ---------------------------------------------------------- */

static int
is_default_or_ignore(const struct sigaction *sa)
{
    return !(sa->sa_flags & SA_SIGINFO) && (sa->sa_handler == SIG_DFL || sa->sa_handler == SIG_IGN);
}

static const char *
install_handler(void)
{
    struct sigaction current, ours;
    sigaction(STROBE_SIGNAL, NULL, &current);
    int is_ours = (current.sa_flags & SA_SIGINFO) && current.sa_sigaction == signal_handler;
    if (!is_ours && !is_default_or_ignore(&current))
        return STROBE_SIGNAL_NAME " already has a handler (trap(\"" STROBE_SIGNAL_TRAP "\") or a library); "
               "Strobe will not take it over";
    if (!S.handler_installed && !is_ours) S.old_action = current;

    memset(&ours, 0, sizeof(ours));
    ours.sa_sigaction = signal_handler;
    ours.sa_flags = strobe_sigstack_handler_flags();
    sigemptyset(&ours.sa_mask);
    sigaction(STROBE_SIGNAL, &ours, NULL);
    S.handler_installed = 1;
    return NULL;
}

/* Back to the default or ignoring disposition we found: either discards a
 * late signal, so nothing is left that could kill the process. */
static void
uninstall_handler(void)
{
    if (!S.handler_installed) return;
    sigaction(STROBE_SIGNAL, &S.old_action, NULL);
    S.handler_installed = 0;
}

/* ---- object mode ------------------------------------------------------------- */

static void
newobj_hook(VALUE tpval, void *data)
{
    (void)tpval; (void)data;
    if (!atomic_load(&S.running)) return;
    if (++S.allocations % (uint64_t)S.interval != 0) return;
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
 * in JIT code (before 3.3; see the top of this file). The one place a Ruby
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
    if (atomic_load(&S.running)) return "already running";
    if (native && !strobe_native_available())
        return "native: true needs libunwind, which Strobe was built without (install libunwind-dev, then reinstall strobe)";
    if (native && (!(mode == STROBE_MODE_WALL || mode == STROBE_MODE_CPU) || timer == STROBE_TIMER_SAFEPOINTS))
        return "native: true takes native stacks in the signal handler: it needs mode :wall or :cpu with timer signals";

    S.mode = mode;
    atomic_store(&strobe_placement_counts_cpu, mode == STROBE_MODE_CPU);
    S.pid = getpid();
    S.uid = getuid();
    S.defer_running = jit_frames_unsafe();
    int jit = jit_enabled();
    if (jit > strobe_profile.jit) strobe_profile.jit = jit; /* rounds: the JIT any of them ran with */
    S.interval = interval;
    S.only = only;
    atomic_store(&S.signals_sent, 0);
    strobe_threads_reset();
    if (NIL_P(S.thread_hook))
        S.thread_hook = rb_tracepoint_new(Qnil, RUBY_EVENT_THREAD_BEGIN | RUBY_EVENT_THREAD_END, thread_hook, NULL);

    S.track_states = 0;
    S.safepoint_timer = 0;
    S.native = 0;
    if ((mode == STROBE_MODE_WALL || mode == STROBE_MODE_CPU) && timer == STROBE_TIMER_SAFEPOINTS) {
        /* No signal handler at all: the timer thread owes samples to the
         * threads and a postponed job takes them at safe points. */
        gvl_states_start();
        register_running_threads();
        atomic_store(&S.running, 1);
        S.safepoint_timer = 1; /* before the timer thread reads it */
        if (timer_start() != 0) {
            atomic_store(&S.running, 0);
            S.safepoint_timer = 0;
            gvl_states_stop();
            return "cannot start the sampling thread (scheduler: :thread needs one)";
        }
        strobe_profile.safepoint_timer = 1;
    } else if (mode == STROBE_MODE_WALL || mode == STROBE_MODE_CPU) {
        const char *err = install_handler();
        if (err) return err;
        S.native = native; /* before registering: threads registering set up their unwinding */
        gvl_states_start();
        register_running_threads();
        if (native) {
            strobe_native_prepare(strobe_threads_self());
            strobe_profile.native = 1;
        }
        atomic_store(&S.running, 1);
        /* No timer thread (out of threads, say): the process-wide timer.
         * Set before any signal can arrive; the handler reads it. */
        int process_timer = timer == STROBE_TIMER_PROCESS;
        S.process_timer = process_timer;
        if (!process_timer && timer_start() != 0) S.process_timer = 1;
        if (S.process_timer && process_timer_start() != 0) {
            atomic_store(&S.running, 0);
            S.process_timer = 0;
            gvl_states_stop();
            uninstall_handler();
            return "cannot start a timer (neither a timer thread nor a process timer)";
        }
        if (S.process_timer) strobe_profile.process_timer = 1;
    } else if (mode == STROBE_MODE_OBJECT) {
        S.allocations = 0;
        if (NIL_P(S.newobj_hook))
            S.newobj_hook = rb_tracepoint_new(Qnil, RUBY_INTERNAL_EVENT_NEWOBJ, newobj_hook, NULL);
        atomic_store(&S.running, 1);
        rb_tracepoint_enable(S.newobj_hook);
    } else {
        atomic_store(&S.running, 1);
    }
    if ((mode == STROBE_MODE_WALL || mode == STROBE_MODE_CPU) && !strobe_profile.ignore_gc)
        strobe_gcspan_start(mode, interval);
    rb_tracepoint_enable(S.thread_hook);
    return NULL;
}

void
strobe_sampler_stop(void)
{
    if (!atomic_exchange(&S.running, 0)) return;
    rb_tracepoint_disable(S.thread_hook);
    strobe_gcspan_stop();
    if (S.mode == STROBE_MODE_WALL || S.mode == STROBE_MODE_CPU) {
        timer_stop();
        process_timer_stop();
        S.process_timer = 0;
        S.safepoint_timer = 0;
        gvl_states_stop();
        close_gvl_stretches();
        uninstall_handler();
    } else if (S.mode == STROBE_MODE_OBJECT) {
        rb_tracepoint_disable(S.newobj_hook);
    }
    strobe_sampler_flush();
    strobe_profile.stop_us = strobe_now_us();
}

uint64_t
strobe_sampler_signals_sent(void)
{
    return atomic_load(&S.signals_sent);
}

uint64_t
strobe_sampler_unsampled_threads(void)
{
    return S.unsampled_threads;
}

void
strobe_sampler_forget_unsampled(void)
{
    S.unsampled_threads = 0;
}

int
strobe_sampler_running(void)
{
    return atomic_load(&S.running);
}

/* Under the profile lock: what the handlers captured first, then the stack
 * sample_now left in the thread's scratch buffer. */
static void
drain_then_record_scratch(void *arg)
{
    strobe_thread_t *t = arg;
    drain(NULL);
    uint8_t state = atomic_load(&t->gvl_state);
    strobe_profile_record(t, t->scratch_gc_kind, t->scratch_frames, t->scratch_lines,
                          t->scratch_depth, &t->scratch_time, &state, 1);
}

int
strobe_sampler_sample_now(void)
{
    if (!atomic_load(&S.running)) return 0;
    strobe_thread_t *t = current_entry();
    if (!t || !strobe_sampler_sampled(t)) return 0; /* a thread that is not profiled, or not now */
    if (!strobe_guard_take(t)) {
        strobe_profile_add_missed(1);
        return 0;
    }
    /* The GVL is held, so the stack goes straight into the profile: no ring
     * slot, no copy. In time modes the timer thread drains concurrently, so
     * the ring is drained first (keeping order) and the profile locked. */
    int timed = S.mode == STROBE_MODE_WALL || S.mode == STROBE_MODE_CPU;
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
strobe_sampler_mark(void)
{
    strobe_threads_mark();
    rb_gc_mark(S.only);
    rb_gc_mark(S.excluded);
    rb_gc_mark(S.thread_hook);
    rb_gc_mark(S.newobj_hook);
}

/* fork() copies memory as it is at that instant. Taking the registry and
 * profile locks first means the timer thread is not half way through a tick
 * or a drain, so the child's profile is consistent. */
static void
atfork_prepare(void)
{
    gvl_hook_remove(); /* see gvl_hook_resume_after_fork */
    strobe_native_fork_prepare();
    strobe_threads_lock();
    strobe_profile_lock();
}

static void
unlock_after_fork(int in_child)
{
    strobe_profile_unlock();
    strobe_threads_unlock();
    strobe_native_fork_done(in_child);
}

static void
atfork_parent(void)
{
    unlock_after_fork(0);
    gvl_hook_resume_after_fork(0);
}

/* In a forked child only the forking thread exists: no timer thread, the
 * registered threads are the parent's, and ring slots other threads were
 * writing will never complete. Profiling stops here; what was recorded
 * before the fork is the parent's to report (a Puma worker of a preloading
 * master would count it again), so it is marked inherited and dropped when
 * the child starts a profile or asks for results (with the GVL, not here).
 * The parent carries on untouched. */
static void
atfork_child(void)
{
    unlock_after_fork(1); /* this thread took both locks; it is the one left */
    strobe_placement_forget_tid();
    strobe_sigstack_after_fork();
    strobe_gcspan_after_fork();
    gvl_hook_resume_after_fork(1);
    strobe_threads_reset();
    open_scopes_len = 0; /* the parent's requests: not served here */
    if (strobe_profile.active) strobe_profile.inherited = 1;
    atomic_store(&S.running, 0);
    S.timer_started = 0;
    S.ptimer_started = 0; /* POSIX timers are not inherited */
    S.process_timer = 0;
    S.safepoint_timer = 0;
    strobe_capture_reset();
    /* strobe serve's listening socket: put /dev/null in its place, so
     * the child does not hold the port (its IO object, left with
     * /dev/null, closes that instead). Only if that number still holds the
     * socket: a program that closed it (daemons close every descriptor)
     * may have opened a file of its own under it. */
    struct stat now;
    if (S.child_fd >= 0 && S.null_fd >= 0 && fstat(S.child_fd, &now) == 0 && now.st_dev == S.child_dev &&
        now.st_ino == S.child_ino)
        dup2(S.null_fd, S.child_fd);
}

void
strobe_sampler_close_in_children(int fd)
{
    if (fd < 0) { /* unregistered: the socket closed, its number free for any file */
        S.child_fd = -1;
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) rb_sys_fail("close_in_children");
    if (S.null_fd < 0) S.null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (S.null_fd < 0) rb_sys_fail("/dev/null");
    S.child_dev = st.st_dev;
    S.child_ino = st.st_ino;
    S.child_fd = fd;
}

/* The VM is going away: no handler may touch it any more. */
static void
vm_at_exit(ruby_vm_t *vm)
{
    (void)vm;
    atomic_store(&S.vm_alive, 0);
    atomic_store(&S.running, 0);
    timer_stop();
    process_timer_stop();
}

void
strobe_sampler_init(void)
{
    sym_state = ID2SYM(rb_intern("state"));
    sym_marking = ID2SYM(rb_intern("marking"));
    sym_sweeping = ID2SYM(rb_intern("sweeping"));
    /* Warm the GC-info path so the handler never interns anything. */
    rb_gc_latest_gc_info(sym_state);

    S.newobj_hook = Qnil;
    S.thread_hook = Qnil;
    S.only = Qnil;
    S.excluded = Qnil;
    S.scope_key = ID2SYM(rb_intern("strobe_scope"));
    S.child_fd = S.null_fd = -1;
    atomic_store(&S.vm_alive, 1);
    strobe_threads_init();
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
    S.job = rb_postponed_job_preregister(0, drain_job, NULL);
    S.sample_job = rb_postponed_job_preregister(0, sample_job, NULL);
#endif
    ruby_vm_at_exit(vm_at_exit);
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}
