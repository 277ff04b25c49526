/*
 * scopes.c - which threads are sampled: every running Ruby thread at start
 * (found by the kernel tid Thread#native_thread_id reports) and every
 * thread that begins while profiling (a THREAD_BEGIN hook registers it from
 * the thread itself), or only the Threads of the threads: option, never
 * Strobe's own; and scopes, which sample a request's threads only while it
 * runs (Strobe::Middleware). A THREAD_END hook records the thread's name and
 * retires its registry entry (threads.c).
 *
 * Signal safety: only strobe_sampler_sampled (an atomic load; the handler
 * and the timer thread call it). The rest runs with the GVL held, pausing
 * and resuming threads under the registry lock as the timer thread reads
 * them under it.
 */
#include "sampler_internal.h"
#include "gvlspan.h"
#include "native.h"
#include "placement.h"
#include "profile.h"
#include "clock.h"
#include "sigstack.h"
#include <ruby/debug.h>
#include <errno.h>
#include <unistd.h>
#include <sys/syscall.h>

/* The Fiber storage key threads inherit a scope by (a static Symbol). */
static VALUE scope_key;

/* ---- which threads ---------------------------------------------------------- */

static int
profiled(VALUE thread)
{
    if (!NIL_P(strobe_sampler.excluded) && RTEST(rb_ary_includes(strobe_sampler.excluded, thread))) return 0;
    return NIL_P(strobe_sampler.only) || RTEST(rb_ary_includes(strobe_sampler.only, thread));
}

void
strobe_sampler_only(VALUE threads)
{
    strobe_sampler.only = threads;
}

int
strobe_sampler_profiled(VALUE thread)
{
    return profiled(thread);
}

void
strobe_sampler_exclude_current(void)
{
    if (NIL_P(strobe_sampler.excluded)) strobe_sampler.excluded = rb_ary_new();
    VALUE thread = rb_thread_current();
    if (!RTEST(rb_ary_includes(strobe_sampler.excluded, thread))) rb_ary_push(strobe_sampler.excluded, thread);
    strobe_thread_t *t = strobe_threads_self();
    if (!t) return;
    strobe_sampler_flush(); /* what it captured so far still names it */
    strobe_profile_thread_ended(t);
    strobe_threads_end_here(t);
}

void
strobe_sampler_footing(void)
{
    int signals = (strobe_sampler.mode == STROBE_MODE_WALL || strobe_sampler.mode == STROBE_MODE_CPU) &&
                  !strobe_sampler.safepoint_timer;
    if (signals) strobe_sigstack_ensure();
}

/* GVL held: registers the calling thread (thread), NULL when
 * STROBE_MAX_THREADS are. */
static strobe_thread_t *
register_current(VALUE thread)
{
    strobe_sampler_footing();
    /* It runs Ruby code now: it holds the GVL. */
    strobe_thread_t *t = strobe_threads_add(strobe_gettid(), thread,
                                            strobe_sampler.track_states ? STROBE_STATE_RUNNING : STROBE_STATE_UNKNOWN);
    if (!t) {
        strobe_sampler.unsampled_threads++;
        return NULL;
    }
    strobe_threads_watch_end(t); /* (Ruby before 3.3: see threads.c) */
    if (strobe_sampler.native) strobe_native_warm(t);
    return t;
}

/* GVL held: the calling thread's entry, registering it if it is profiled. */
strobe_thread_t *
strobe_sampler_current_entry(void)
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
    if (!atomic_load(&strobe_sampler.running)) return NULL;
    strobe_thread_t *t = strobe_sampler_current_entry();
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
    return scope_key;
}

int
strobe_sampler_sampled(const strobe_thread_t *t)
{
    return !atomic_load_explicit(&t->paused, memory_order_relaxed);
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
    if (strobe_sampler.mode == STROBE_MODE_CPU) {
        int64_t cpu = strobe_placement_cpu_ns(t, 100);
        if (cpu >= 0) strobe_cpu_owed_at_most(t, cpu, (int64_t)strobe_sampler.interval * 1000, 2);
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
    VALUE id = rb_funcall(rb_path2class("Fiber"), rb_intern("[]"), 1, scope_key);
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
    if (!atomic_load(&strobe_sampler.running)) return 0;
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

/* GVL held: registers every running thread that is profiled, by the kernel
 * tid Thread#native_thread_id reports (threads not started yet register
 * themselves when they begin, see strobe_sampler_thread_hook). */
void
strobe_sampler_register_running_threads(void)
{
    VALUE only = strobe_sampler.only;
    VALUE list = NIL_P(only) ? rb_funcall(rb_cThread, rb_intern("list"), 0) : only;
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
        if (strobe_sampler.track_states)
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
            /* The main thread of a forked child, started from another
             * thread: Ruby 3.1 reports the parent's tid, which is no thread
             * here. The thread that forked is the child's first, its tid
             * the child's pid. */
            if (tid && thread == rb_thread_main() && syscall(SYS_tgkill, (long)getpid(), (long)tid, 0L) != 0 &&
                errno == ESRCH)
                tid = getpid();
        }
        strobe_thread_t *t = strobe_threads_add(tid, thread, state);
        if (!t) strobe_sampler.unsampled_threads++;
        else if (thread == current) strobe_threads_watch_end(t); /* the others as they run a postponed job */
#if defined(HAVE_RB_PROFILE_THREAD_FRAMES) && defined(HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK)
        /* An M:N thread not running now cannot be signalled (see
         * handler_entry, handler.c): its stack, read here with the GVL held, is what
         * the timer repeats until it runs. */
        else if (atomic_load(&t->mobile) && thread != current) strobe_sampler_note_stack(t, thread);
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
void
strobe_sampler_thread_hook(VALUE tpval, void *data)
{
    (void)data;
    if (!atomic_load(&strobe_sampler.running)) return;
    rb_trace_arg_t *arg = rb_tracearg_from_tracepoint(tpval);
    strobe_sigstack_recover(); /* its own handler left by a longjmp */
    /* Any thread, profiled or not: the process-wide timer's signal may
     * land on it, and as it ends Ruby frees its own alternate stack. */
    strobe_sampler_footing();
    if (rb_tracearg_event_flag(arg) == RUBY_EVENT_THREAD_BEGIN) {
        VALUE thread = rb_thread_current();
        if (profiled(thread)) {
            /* The time modes sample it from the start; the others as it
             * samples (strobe_sampler_current_entry). Registered by its
             * Thread, not found by its tid: start may have registered it by
             * its tid before it ran, and a signal then found it no Ruby
             * thread yet (not_ruby, which registering clears); on Ruby 3.1
             * its native thread may still be listed for a Thread that was
             * killed. */
            if (strobe_sampler.mode == STROBE_MODE_WALL || strobe_sampler.mode == STROBE_MODE_CPU)
                register_current(thread);
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
    strobe_threads_end_here(t);
}

void
strobe_sampler_scopes_init(void)
{
    scope_key = ID2SYM(rb_intern("strobe_scope"));
}

void
strobe_sampler_scopes_after_fork(void)
{
    open_scopes_len = 0; /* the parent's requests: not served here */
}
