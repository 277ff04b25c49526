/*
 * gvlhook.c - GVL states (Ruby 3.2+, where extconf.rb finds
 * rb_internal_thread_add_event_hook): a hook on the GVL events (READY:
 * waiting for it, RESUMED: holding it, SUSPENDED: released it to block)
 * keeps each registered thread's state, which every time-mode sample
 * records, hands each change to gvlspan.c (its long stretches become
 * markers), and follows M:N threads from native thread to native thread
 * (placement.c), noting the stack of one that leaves the GVL for the timer
 * to repeat. The hook runs mostly without the GVL, finds the entry of the
 * thread the event is about (3.3+ names it; 3.2 runs the hook on the
 * thread itself) and only stores into it. Without the hook samples carry
 * no state and the result has no state keys.
 *
 * Nothing here runs in a signal handler. The hook runs on any thread,
 * mostly without the GVL; the rest is called with the GVL held, and from
 * fork's handlers (fork.c).
 */
#include "sampler_internal.h"
#include "gvlspan.h"
#include "native.h"
#include "placement.h"
#include "clock.h"
#include "sigstack.h"
#include <ruby/thread.h>

#ifdef HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK
static rb_internal_thread_event_hook_t *gvl_hook;

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
    /* On the native thread the hook runs on: its own handler, left by a
     * longjmp, keeps the signal blocked there (sigstack.c). */
    strobe_sigstack_recover();
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
        if (atomic_load(&strobe_sampler.running) &&
            (strobe_sampler.mode == STROBE_MODE_WALL ||
             (strobe_sampler.mode == STROBE_MODE_CPU &&
              strobe_placement_cpu_ns(t, 4) - atomic_load_explicit(&t->cpu_last_ns, memory_order_relaxed) >=
                  (int64_t)strobe_sampler.interval * 1000)))
            strobe_sampler_note_stack(t, Qfalse);
    }
    /* A thread that was running when profiling started, resuming on its
     * own thread: the first chance to set up its fast native unwinding. */
    if (state == STROBE_STATE_RUNNING && strobe_sampler.native &&
        !atomic_load_explicit(&t->native_warm, memory_order_relaxed) && t == strobe_threads_self())
        strobe_native_warm(t);
}
#endif

/* Without GVL events (Ruby 3.1) there is no hook: both do nothing. */
static void
gvl_hook_add(void)
{
#ifdef HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK
    gvl_hook = rb_internal_thread_add_event_hook(
        gvl_event,
        RUBY_INTERNAL_THREAD_EVENT_READY | RUBY_INTERNAL_THREAD_EVENT_RESUMED | RUBY_INTERNAL_THREAD_EVENT_SUSPENDED,
        NULL);
#endif
}

void
strobe_sampler_gvl_hook_remove(void)
{
#ifdef HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK
    if (gvl_hook) rb_internal_thread_remove_event_hook(gvl_hook);
    gvl_hook = NULL;
#endif
}

/* As profiling stops (the hook removed): each thread's stretch of waiting
 * or blocked under way ends now (gvlspan.c). */
void
strobe_sampler_gvl_close_stretches(void)
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
void
strobe_sampler_gvl_start(void)
{
#ifdef HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK
    strobe_sampler.track_states = 1;
    strobe_profile.track_states = 1;
    gvl_hook_add();
#endif
}

void
strobe_sampler_gvl_stop(void)
{
    strobe_sampler_gvl_hook_remove();
    strobe_sampler.track_states = 0;
}

/* Ruby runs GVL hooks under a process-wide rwlock that fork does not reset:
 * a fork while another thread is inside a hook leaves it read-locked in the
 * child, and the child's next rb_internal_thread_add_event_hook() waits
 * forever (seen on 3.3.8). So the hook is taken out around fork (removing
 * waits for running hooks to finish; see atfork_prepare, fork.c) and put back in
 * the parent; events during the fork itself are not seen, so a state may
 * lag until the thread's next GVL event. Profiling stops in the child. */
void
strobe_sampler_gvl_after_fork(int in_child)
{
    if (in_child) strobe_sampler.track_states = 0;
    else if (strobe_sampler.track_states) gvl_hook_add();
}
