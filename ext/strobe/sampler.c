/*
 * sampler.c - when samples are taken: timer thread, signal, handler, fork.
 *
 * Time modes run a timer thread (a plain pthread with every signal blocked,
 * never touching Ruby). Each interval it wakes on an absolute CLOCK_MONOTONIC
 * deadline and sends STROBE_SIGNAL with tgkill() to each registered thread: always
 * in :wall mode, and in :cpu mode only when that thread's own CPU clock
 * advanced by an interval since its last signal. This is not capped by the
 * kernel tick the way setitimer(ITIMER_PROF) is, and it never signals a dead
 * thread (tgkill reports ESRCH, a dead thread's CPU clock reads EINVAL).
 *
 * The handler runs on the sampled thread. It only does what
 * strobe_capture() allows (async-signal-safe), then triggers a postponed
 * job that drains the ring with the GVL held. It preserves errno, guards
 * re-entry, and does nothing after the VM has begun shutting down or on a
 * thread it does not know.
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
 * Everything here except the handler and the timer thread's loop is called
 * with the GVL held.
 */
#include "strobe.h"
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <ruby/vm.h>

static struct {
    atomic_int running;
    atomic_int vm_alive;
    strobe_mode_t mode;
    long interval;
    strobe_thread_t threads[STROBE_MAX_THREADS];
    atomic_int threads_len;
    atomic_uint generation;  /* bumped whenever threads[] is reset */

    /* timer thread */
    pthread_t timer;
    int timer_started;
    pthread_mutex_t timer_lock;
    pthread_cond_t timer_cond;
    int timer_stop;

    /* STROBE_SIGNAL disposition before our first start */
    struct sigaction old_action;
    int handler_installed;

    /* object mode */
    VALUE newobj_hook;
    uint64_t allocations;

#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
    rb_postponed_job_handle_t job;
#endif
} S;

static VALUE sym_state, sym_marking, sym_sweeping;

/* ---- thread registry ------------------------------------------------------ */

static pid_t
current_tid(void)
{
    return (pid_t)syscall(SYS_gettid);
}

/* The calling thread's registry entry, remembered per thread: valid while
 * its generation matches S.generation. Initial-exec TLS is a fixed offset
 * from the thread pointer, so reading it is async-signal-safe. */
static __thread strobe_thread_t *self_entry __attribute__((tls_model("initial-exec")));
static __thread unsigned self_generation __attribute__((tls_model("initial-exec")));

/* Forget every registered thread (GVL held, nothing sampling). */
static void
reset_threads(void)
{
    atomic_store(&S.threads_len, 0);
    atomic_fetch_add(&S.generation, 1);
}

/* Signal-safe. The calling thread's entry, or NULL if it is not registered. */
strobe_thread_t *
strobe_sampler_thread_for_self(void)
{
    unsigned generation = atomic_load(&S.generation);
    if (self_entry && self_generation == generation) return self_entry;
    pthread_t self = pthread_self();
    int n = atomic_load(&S.threads_len);
    for (int i = 0; i < n; i++) {
        if (pthread_equal(S.threads[i].pthread, self)) {
            self_entry = &S.threads[i];
            self_generation = generation;
            return self_entry;
        }
    }
    return NULL;
}

/* GVL held. Registers the calling thread; returns its entry or NULL. */
static strobe_thread_t *
register_current_thread(void)
{
    strobe_thread_t *t = strobe_sampler_thread_for_self();
    if (t) return t;
    int n = atomic_load(&S.threads_len);
    if (n >= STROBE_MAX_THREADS) return NULL;

    t = &S.threads[n];
    t->pthread = pthread_self();
    t->tid = current_tid();
    t->index = (uint16_t)n;
    t->thread = rb_thread_current();
    t->last_seq = -1;
    t->profile_index = -1;
    t->cpu_last_ns = 0;
    atomic_store(&t->in_handler, 0);
    if (pthread_getcpuclockid(t->pthread, &t->cpu_clock) != 0)
        t->cpu_clock = CLOCK_THREAD_CPUTIME_ID;
    atomic_store(&S.threads_len, n + 1); /* publish to handlers */
    return t;
}

strobe_thread_t *
strobe_sampler_thread_at(int index)
{
    return index < atomic_load(&S.threads_len) ? &S.threads[index] : NULL;
}

/* ---- hand-off -------------------------------------------------------------- */

static void
drain_job(void *data)
{
    (void)data;
    strobe_capture_drain(strobe_profile_record_slot);
}

void
strobe_sampler_flush(void)
{
    strobe_capture_drain(strobe_profile_record_slot);
}

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

/* Takes one sample on the calling thread. Returns 1 if captured. */
static int
sample_thread(strobe_thread_t *t)
{
    int gc_kind = STROBE_FRAME_RUBY;
    if (rb_during_gc()) {
        /* Frames cannot be read safely while GC moves objects. */
        if (strobe_profile.ignore_gc) return -1;
        gc_kind = gc_kind_now();
    }
    return strobe_capture(t, gc_kind, strobe_now_us());
}

static void
signal_handler(int sig, siginfo_t *info, void *ucontext)
{
    (void)sig; (void)info; (void)ucontext;
    int saved_errno = errno;

    if (!atomic_load(&S.running) || !atomic_load(&S.vm_alive)) goto out;
    strobe_thread_t *t = strobe_sampler_thread_for_self();
    if (!t) goto out; /* not a thread we sample */
    if (atomic_exchange(&t->in_handler, 1)) { strobe_profile_add_missed(1); goto out; }

    int r = sample_thread(t);
    if (r == 1) trigger_drain();
    else if (r == 0) strobe_profile_add_missed(1);
    atomic_store(&t->in_handler, 0);
out:
    errno = saved_errno;
}

/* ---- timer thread ------------------------------------------------------------ */

static int64_t
clock_ns(clockid_t clock)
{
    struct timespec ts;
    if (clock_gettime(clock, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void
send_signal(const strobe_thread_t *t)
{
    syscall(SYS_tgkill, (long)getpid(), (long)t->tid, (long)STROBE_SIGNAL);
}

static void *
timer_main(void *arg)
{
    (void)arg;
    const int64_t interval_ns = (int64_t)S.interval * 1000;
    int64_t next = clock_ns(CLOCK_MONOTONIC);

    pthread_mutex_lock(&S.timer_lock);
    while (!S.timer_stop) {
        next += interval_ns;
        struct timespec deadline = { (time_t)(next / 1000000000), (long)(next % 1000000000) };
        while (!S.timer_stop) {
            int rc = pthread_cond_timedwait(&S.timer_cond, &S.timer_lock, &deadline);
            if (rc == ETIMEDOUT) break;
        }
        if (S.timer_stop) break;

        int n = atomic_load(&S.threads_len);
        for (int i = 0; i < n; i++) {
            strobe_thread_t *t = &S.threads[i];
            if (S.mode == STROBE_MODE_CPU) {
                int64_t cpu = clock_ns(t->cpu_clock);
                if (cpu < 0) continue; /* thread is gone */
                if (cpu - t->cpu_last_ns < interval_ns) continue;
                /* Carry the remainder so the rate matches the interval, but
                 * never owe more than one sample after an idle spell. */
                t->cpu_last_ns += interval_ns;
                if (cpu - t->cpu_last_ns > interval_ns) t->cpu_last_ns = cpu - interval_ns;
            }
            send_signal(t);
        }
        /* Late by more than an interval (machine busy): do not burst, but
         * in wall mode every tick skipped is a sample owed, so count it as
         * missed rather than let the rate drop silently. (In CPU mode the
         * next check still sees all CPU time used, so nothing is lost.) */
        int64_t now = clock_ns(CLOCK_MONOTONIC);
        if (now - next > interval_ns) {
            if (S.mode == STROBE_MODE_WALL)
                strobe_profile_add_missed((uint64_t)((now - next) / interval_ns) * (uint64_t)n);
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
    ours.sa_flags = SA_SIGINFO | SA_RESTART;
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

const char *
strobe_sampler_start(strobe_mode_t mode, long interval)
{
    if (atomic_load(&S.running)) return "already running";

    S.mode = mode;
    S.interval = interval;
    reset_threads();
    strobe_thread_t *t = register_current_thread();
    if (!t) return "cannot register the current thread";

    if (mode == STROBE_MODE_WALL || mode == STROBE_MODE_CPU) {
        const char *err = install_handler();
        if (err) return err;
        t->cpu_last_ns = clock_ns(t->cpu_clock);
        atomic_store(&S.running, 1);
        if (timer_start() != 0) {
            atomic_store(&S.running, 0);
            uninstall_handler();
            return "cannot start the timer thread";
        }
    } else if (mode == STROBE_MODE_OBJECT) {
        S.allocations = 0;
        if (NIL_P(S.newobj_hook))
            S.newobj_hook = rb_tracepoint_new(Qnil, RUBY_INTERNAL_EVENT_NEWOBJ, newobj_hook, NULL);
        atomic_store(&S.running, 1);
        rb_tracepoint_enable(S.newobj_hook);
    } else {
        atomic_store(&S.running, 1);
    }
    return NULL;
}

void
strobe_sampler_stop(void)
{
    if (!atomic_exchange(&S.running, 0)) return;
    if (S.mode == STROBE_MODE_WALL || S.mode == STROBE_MODE_CPU) {
        timer_stop();
        uninstall_handler();
    } else if (S.mode == STROBE_MODE_OBJECT) {
        rb_tracepoint_disable(S.newobj_hook);
    }
    strobe_sampler_flush();
}

int
strobe_sampler_running(void)
{
    return atomic_load(&S.running);
}

int
strobe_sampler_sample_now(void)
{
    if (!atomic_load(&S.running)) return 0;
    strobe_thread_t *t = register_current_thread();
    if (!t || atomic_exchange(&t->in_handler, 1)) {
        strobe_profile_add_missed(1);
        return 0;
    }
    /* The GVL is held, so the stack goes straight into the profile: no
     * ring slot, no copy. Whatever a handler captured before comes first. */
    if (S.mode == STROBE_MODE_WALL || S.mode == STROBE_MODE_CPU) strobe_sampler_flush();
    int taken = 1;
    int gc_kind = STROBE_FRAME_RUBY;
    int depth = 0;
    if (rb_during_gc()) {
        if (strobe_profile.ignore_gc) taken = -1;
        gc_kind = gc_kind_now();
    } else {
        depth = rb_profile_frames(0, STROBE_MAX_DEPTH, t->scratch_frames, t->scratch_lines);
        if (depth <= 0) taken = 0; /* no Ruby frame to attribute it to */
    }
    if (taken == 1) {
        int64_t now = strobe_now_us();
        strobe_profile_record(t, gc_kind, t->scratch_frames, t->scratch_lines, depth, &now, 1);
    } else if (taken == 0) {
        strobe_profile_add_missed(1);
    }
    atomic_store(&t->in_handler, 0);
    return taken == 1;
}

void
strobe_sampler_mark(void)
{
    int n = atomic_load(&S.threads_len);
    for (int i = 0; i < n; i++) rb_gc_mark(S.threads[i].thread);
    rb_gc_mark(S.newobj_hook);
}

/* In a forked child only the forking thread exists: no timer thread, and
 * the registered threads are the parent's. Profiling stops here; the parent
 * carries on untouched. */
static void
atfork_child(void)
{
    atomic_store(&S.running, 0);
    S.timer_started = 0;
    reset_threads();
}

/* The VM is going away: no handler may touch it any more. */
static void
vm_at_exit(ruby_vm_t *vm)
{
    (void)vm;
    atomic_store(&S.vm_alive, 0);
    atomic_store(&S.running, 0);
    timer_stop();
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
    atomic_store(&S.vm_alive, 1);
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
    S.job = rb_postponed_job_preregister(0, drain_job, NULL);
#endif
    ruby_vm_at_exit(vm_at_exit);
    pthread_atfork(NULL, NULL, atfork_child);
}
