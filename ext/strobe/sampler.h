/*
 * sampler.h - when samples are taken (sampler.c and the files beside it:
 * scopes.c, gvlhook.c, handler.c, timer.c, fork.c): starting and stopping
 * a sampled profile, which threads it samples, the sampling signal.
 *
 * GVL held, except strobe_sampler_sampled (async-signal-safe).
 */
#ifndef STROBE_SAMPLER_H
#define STROBE_SAMPLER_H 1

#include "threads.h"
#include "markers.h"
#include <signal.h>

/* The sampling signal: default action "ignore", so exec and late delivery
 * are harmless (see handler.c). */
#define STROBE_SIGNAL SIGURG
#define STROBE_SIGNAL_NAME "SIGURG"
#define STROBE_SIGNAL_TRAP "URG"

void strobe_sampler_init(void);
/* Who triggers time-mode samples: the timer thread signalling each thread;
 * one process-wide POSIX timer (also the fallback when the timer thread
 * cannot start); or the timer thread asking for samples at safe points,
 * with no signal at all (scheduler: :thread). */
typedef enum { STROBE_TIMER_THREADS, STROBE_TIMER_PROCESS, STROBE_TIMER_SAFEPOINTS } strobe_timer_t;
/* Returns NULL on success, or a message for ArgumentError/RuntimeError. */
/* only: an Array of the Threads to profile, or Qnil for every thread. */
/* native: also capture native frames (mode :wall or :cpu, with signals). */
const char *strobe_sampler_start(strobe_mode_t mode, long interval, VALUE only, strobe_timer_t timer, int native);
/* GVL held: a running :wall or :cpu profile samples every interval
 * microseconds from now on (the timer thread starts again with it; the
 * profile's and GC's interval follow). NULL, or why it cannot. */
const char *strobe_sampler_retime(long interval);
void strobe_sampler_stop(void);
int strobe_sampler_running(void);
/* Profiled threads not sampled because STROBE_MAX_THREADS were running. */
uint64_t strobe_sampler_unsampled_threads(void);
/* Signals the timer thread sent since the last start. */
uint64_t strobe_sampler_signals_sent(void);
/* CPU time (ns) the timer threads have used since the extension loaded. */
int64_t strobe_sampler_timer_cpu_ns(void);
void strobe_sampler_forget_unsampled(void);
/* Custom mode / object mode: sample the current thread now (GVL held). */
int strobe_sampler_sample_now(void);
/* GVL held: record everything the handler captured so far. */
void strobe_sampler_flush(void);
/* GVL held: the calling thread (one of Strobe's own, such as strobe
 * serve's HTTP server) is never profiled from now on. */
void strobe_sampler_exclude_current(void);
/* GVL held: whether thread is to be profiled (the threads: option, and not
 * one of Strobe's own); for the sampler and the tracer alike. */
int strobe_sampler_profiled(VALUE thread);
/* The threads to profile: an Array of Threads, or nil for all (tracing;
 * sampling sets it as it starts). */
void strobe_sampler_only(VALUE threads);
/* GVL held: the calling thread is sampled in a new scope from now on,
 * registered if it was not, and so is every thread it starts meanwhile
 * (Ruby 3.2+, by Fiber storage under the scope's number). Returns that
 * number (> 0), or 0 when it is not sampled (not profiling, or
 * STROBE_MAX_THREADS running). */
long strobe_sampler_scope_enter(void);
/* GVL held: the threads scope id started are no longer sampled (paused,
 * their samples kept), nor the calling thread once its last scope ends. */
void strobe_sampler_scope_leave(long id);
/* GVL held: the ids (kernel tids) of up to max threads that open scope id's
 * code started, into out; returns how many. */
int strobe_sampler_scope_threads(long id, pid_t *out, int max);
/* The Fiber storage key (a Symbol) a scope is inherited by. */
VALUE strobe_sampler_scope_key(void);
/* GVL held: marker m on the calling thread if it is sampled now (see
 * strobe_profile_add_marker); 0 when it is not kept. */
int strobe_sampler_add_marker(strobe_marker_t *m);
/* GVL held: whether the calling thread is being sampled now (a marker it
 * added would be kept). */
int strobe_sampler_current_sampled(void);
/* Whether thread t is sampled now (not paused between scopes). Async-signal-safe. */
int strobe_sampler_sampled(const strobe_thread_t *t);
/* A forked child puts /dev/null in place of descriptor fd (strobe serve's
 * listening socket), in the atfork child handler. */
void strobe_sampler_close_in_children(int fd);
/* Registered thread whose tid matches the caller (signal handler). */
/* GC marking: the Threads and hooks the sampler holds. */
void strobe_sampler_mark(void);

#endif
