/*
 * sampler_internal.h - what the sampler's files (sampler.c, scopes.c,
 * gvlhook.c, handler.c, timer.c, fork.c) share, and no other file includes:
 * the state of the sampling round, and the entry points they call in one
 * another. Everything here is hidden: never exported from strobe.so, so the
 * handler reads the shared state with plain PC-relative loads, as when it
 * was one file's static, and these calls go straight to their function.
 *
 * The state is written with the GVL held (start and stop, fork's child
 * handler); the handler (handler.c), the timer thread (timer.c) and the GVL
 * hook (gvlhook.c) only read it, running with atomic loads.
 */
#ifndef STROBE_SAMPLER_INTERNAL_H
#define STROBE_SAMPLER_INTERNAL_H 1

#include "sampler.h"
#include "profile.h"

#define STROBE_SAMPLER_HIDDEN __attribute__((visibility("hidden")))

typedef struct {
    atomic_int running;
    atomic_int vm_alive;
    strobe_mode_t mode;
    long interval;
    VALUE only;              /* Array of the Threads to profile, or Qnil for all */
    VALUE excluded;          /* Array of Strobe's own Threads, never profiled (or Qnil) */
    uint64_t unsampled_threads; /* profiled threads the full registry turned away */
    _Atomic uint64_t signals_sent; /* since the last start */
    int process_timer;       /* this round uses it instead of the timer thread */
    int defer_running;       /* this round: GVL holders sample at safe points (YJIT) */
    int safepoint_timer;     /* this round: no signals; the timer asks for samples at safe points */
    int track_states;        /* this round records GVL states */
    int native;              /* this round captures native frames in the handler */
    pid_t pid;               /* this process, as the timer's signals name it */
    uid_t uid;
} strobe_sampler_t;

/* Defined in sampler.c. */
extern strobe_sampler_t strobe_sampler STROBE_SAMPLER_HIDDEN;

/* CPU a thread may use while parked (handling a signal, returning to its
 * wait) and still count as not having run: see idle_ns in timer_main
 * (timer.c) and may_run_jit_code (handler.c). */
#define STROBE_IDLE_CPU_NS 20000

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
 * would be charged to the next one's stack, so it is counted missed.
 * (The timer thread, timer.c, and a thread pausing, scopes.c.) */
static inline void
strobe_cpu_owed_at_most(strobe_thread_t *t, int64_t cpu, int64_t interval_ns, int64_t most)
{
    int64_t over = (cpu - t->cpu_last_ns) / interval_ns - (most - 1);
    if (over <= 0) return;
    strobe_profile_add_missed((uint64_t)over);
    t->cpu_last_ns += over * interval_ns;
}

/* ---- scopes.c: which threads ------------------------------------------------ */

/* At Init: the scope key. */
void strobe_sampler_scopes_init(void) STROBE_SAMPLER_HIDDEN;
/* fork child: no scope is open (the parent's requests are not served here). */
void strobe_sampler_scopes_after_fork(void) STROBE_SAMPLER_HIDDEN;
/* GVL held: the calling thread's entry, registering it if it is profiled. */
strobe_thread_t *strobe_sampler_current_entry(void) STROBE_SAMPLER_HIDDEN;
/* GVL held, at start: registers every running thread that is profiled. */
void strobe_sampler_register_running_threads(void) STROBE_SAMPLER_HIDDEN;
/* The THREAD_BEGIN / THREAD_END tracepoint's hook (on the thread, GVL held). */
void strobe_sampler_thread_hook(VALUE tpval, void *data) STROBE_SAMPLER_HIDDEN;

/* ---- gvlhook.c: GVL states ------------------------------------------------- */

/* Time modes: follow GVL states where Ruby reports them (before the running
 * threads are registered), and stop following them. */
void strobe_sampler_gvl_start(void) STROBE_SAMPLER_HIDDEN;
void strobe_sampler_gvl_stop(void) STROBE_SAMPLER_HIDDEN;
/* As profiling stops (the hook removed): each thread's stretch under way ends now. */
void strobe_sampler_gvl_close_stretches(void) STROBE_SAMPLER_HIDDEN;
/* fork: the hook out (fork prepare), back in the parent, not in the child. */
void strobe_sampler_gvl_hook_remove(void) STROBE_SAMPLER_HIDDEN;
void strobe_sampler_gvl_after_fork(int in_child) STROBE_SAMPLER_HIDDEN;

/* ---- handler.c: taking a sample ------------------------------------------- */

/* At Init: what the handler reads (Symbols interned beforehand), the
 * postponed jobs. */
void strobe_sampler_handler_init(void) STROBE_SAMPLER_HIDDEN;
/* Under the profile lock (strobe_profile_locked): the ring into the profile. */
void strobe_sampler_drain(void *unused) STROBE_SAMPLER_HIDDEN;
/* Triggers the postponed job that takes owed samples (timer thread). */
void strobe_sampler_trigger_sample_job(void) STROBE_SAMPLER_HIDDEN;
#ifdef HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK
/* A note (not a sample) of thread t's stack, for the timer to repeat (M:N). */
void strobe_sampler_note_stack(strobe_thread_t *t, VALUE thread) STROBE_SAMPLER_HIDDEN;
#endif
/* STROBE_SIGNAL's handler: installed (NULL, or why not), and the
 * disposition found before put back. */
const char *strobe_sampler_install_handler(void) STROBE_SAMPLER_HIDDEN;
/* GVL held, on the calling thread: when this round samples with signals,
 * its alternate signal stack becomes one of Strobe's (sigstack.c). */
void strobe_sampler_footing(void) STROBE_SAMPLER_HIDDEN;
void strobe_sampler_uninstall_handler(void) STROBE_SAMPLER_HIDDEN;

/* ---- timer.c: the timers ---------------------------------------------------- */

/* The timer thread: 0 when started, else pthread_create's error. */
int strobe_sampler_timer_start(void) STROBE_SAMPLER_HIDDEN;
void strobe_sampler_timer_stop(void) STROBE_SAMPLER_HIDDEN;
/* The process-wide POSIX timer: 0 when started, -1 when not. */
int strobe_sampler_process_timer_start(void) STROBE_SAMPLER_HIDDEN;
void strobe_sampler_process_timer_stop(void) STROBE_SAMPLER_HIDDEN;
/* fork child: neither timer runs here. */
void strobe_sampler_timers_after_fork(void) STROBE_SAMPLER_HIDDEN;

/* ---- fork.c ------------------------------------------------------------------- */

/* At Init: the pthread_atfork handlers. */
void strobe_sampler_fork_init(void) STROBE_SAMPLER_HIDDEN;

#endif
