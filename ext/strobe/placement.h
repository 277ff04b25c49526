/*
 * placement.h - where a profiled Ruby thread runs, and its CPU time
 * (placement.c). The readers (strobe_placement_cpu_ns, strobe_placement_tid,
 * strobe_placement_find, strobe_placement_self_tid) are async-signal-safe.
 */
#ifndef STROBE_PLACEMENT_H
#define STROBE_PLACEMENT_H 1

#include "threads.h"
#include <time.h>

/* The CPU-time clock of a native thread of this process, by kernel tid. */
clockid_t strobe_thread_cpu_clock(pid_t tid);
/* The calling native thread's kernel tid (cached; async-signal-safe). */
pid_t strobe_placement_self_tid(void);
/* fork child: the cached tid is the parent's. */
void strobe_placement_forget_tid(void);
/* Registration (entry CLAIMED): placed on tid (0: not on a native thread);
 * mobile: Ruby schedules it M:N; running_here: it is the calling thread. */
void strobe_placement_init(strobe_thread_t *t, pid_t tid, int mobile, int running_here);
/* Set at start: :cpu mode keeps mobile threads' CPU time. */
extern atomic_int strobe_placement_counts_cpu;
/* At Init: whether Ruby runs the main Ractor's threads M:N (RUBY_MN_THREADS). */
void strobe_placement_init_process(void);
extern int strobe_mn_threads;
/* Async-signal-safe: the LIVE thread placed on native thread tid and
 * running there (if M:N may move it), or NULL. */
strobe_thread_t *strobe_placement_find(pid_t tid);
/* Async-signal-safe: t's CPU time in ns, -1 if it cannot be read now (a
 * write in progress after tries attempts, or its native thread gone). */
int64_t strobe_placement_cpu_ns(const strobe_thread_t *t, int tries);
/* Async-signal-safe: the tid t runs on, 0 if it is not running there (or
 * a write was in progress after tries attempts). */
pid_t strobe_placement_tid(const strobe_thread_t *t, int tries);
/* GVL RESUMED hook, on the native thread about to run t: t is here now. */
void strobe_placement_resumed(strobe_thread_t *t);
/* GVL SUSPENDED hook, on t's native thread: a mobile t leaves it (its CPU
 * time frozen until it resumes). */
void strobe_placement_suspended(strobe_thread_t *t);

#endif
