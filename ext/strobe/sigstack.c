/*
 * sigstack.c - the sampling handler's footing: which stack it runs on, and
 * the per-thread guard that keeps one capture at a time in a thread's
 * scratch buffers, which a handler left by a longjmp must not keep.
 *
 * The stack. A thread deep in recursion has little of its own stack left:
 * Ruby raises SystemStackError near the end, and a handler that ran there
 * (rb_profile_frames, libunwind) went past the end. Ruby's SIGSEGV handler
 * then took the fault for the program's overflow and longjmp'd out of the
 * sampling handler, or the process died. So the handler runs on the
 * thread's alternate signal stack (SA_ONSTACK). What the handler needs
 * there is measured by the test hooks below (test_signal_stack.rb, with
 * native frames, which need the most): paint the stack, sample, see how
 * deep the paint was overwritten.
 *
 * Whose stack. Ruby gives every thread one (16 KiB), and frees it as the
 * native thread leaves (Ruby 3.1: when its thread cache lets it go, 3 s
 * after its last Ruby thread) without taking it from the kernel first: a
 * signal delivered then has its frame written into freed memory. The
 * process-wide timer's signal goes to any thread the kernel picks, a
 * leaving one among them (a program whose threads end while it was sampled
 * that way died of SIGSEGV in 5 runs of 8; ASan named the freed stack), and
 * under :cpu a thread that raised on 3.1 (no THREAD_END) was signalled as
 * it left the cache. So every thread Strobe runs code on while sampling
 * with signals gets a 64 KiB alternate stack of Strobe's own, with a guard
 * page below it (strobe_sigstack_ensure, on the thread itself, outside any
 * handler): as it registers (a thread's THREAD_BEGIN, the thread that
 * starts), as it sets up native frames, and again at THREAD_END. Ruby then
 * frees a stack the kernel no longer uses. Strobe's are never taken back
 * from a live thread: one is unmapped once its thread is gone (found by a
 * probe, when the list has doubled since the last look) or no longer uses
 * it (seen from that thread). What is left: a thread Strobe never ran on
 * (started before sampling, or not a Ruby thread) that leaves while a
 * process-wide timer's signal lands on it, or, on 3.1, one that raised or
 * was killed and leaves Ruby's cache 3 s later while sampled.
 *
 * One handler frame per thread. The kernel blocks the signal on a thread
 * while its handler runs there (not SA_NODEFER), so a handler never nests
 * inside another: a signal arriving meanwhile waits, pending, and is
 * delivered as the handler returns. With the signal not blocked, the
 * process-wide timer nested handlers on one thread at 100 us, each frame
 * about 3.3 KB with AVX-512 state, until they overflowed Ruby's 16 KiB
 * alternate stack of a thread still starting ("overflowed sigaltstack",
 * SIGSEGV: 4 runs of 4 on Ruby 4.0.5, 12 of 20 on 3.3.11, two at once).
 *
 * A handler left by a longjmp. Ruby's SIGSEGV handler takes a fault whose
 * address is near the faulting code's stack pointer (or between it and its
 * rbp) for a stack overflow and longjmps to the thread's last Ruby tag,
 * unblocking SIGSEGV only (signal.c, reset_sigmask): a fault inside the
 * sampling handler that looks so (its own stack is bounded now, but a
 * fault at an address between its rsp and rbp looks the same) leaves it,
 * with its signal still blocked on that thread. So the handler marks its
 * thread (strobe_in_handler, a thread-local) while it runs, and code of that thread
 * outside any handler that finds the mark knows its handler was left, and
 * unblocks the signal (strobe_sigstack_recover): the GVL hooks, the thread
 * hooks, the postponed jobs, start and Strobe.sample. A thread on which
 * none of them runs (a single thread computing) is found by the timer
 * thread, whose signal to it stays unanswered: it then triggers the
 * postponed job, which runs on the thread holding the GVL (timer.c).
 *
 * The guard. guard_tid is the native thread holding it (0 free);
 * guard_frame, for a holder that is a signal handler, an address in that
 * handler's frame (0 for code outside a handler). Handlers never nest, so a
 * handler that finds the guard held by a handler of its own thread knows
 * that holder was left, and takes the guard over (a compare-and-swap on
 * the frame). Code outside any handler (postponed jobs, GVL hooks) finds no
 * handler of its own thread running under it, so one holding the guard
 * was left too.
 *
 * Native frames (libunwind) need more than Ruby's 16 KiB: measured here,
 * up to 12.5 KiB of it, kernel signal frame included, which leaves too
 * little margin (a wider FPU state grows the kernel's frame): Strobe's
 * 64 KiB fit them. A handler on a stack too small (a thread not set up yet)
 * skips the native frames of that sample rather than overflow it
 * (strobe_sigstack_room).
 *
 * Everything here is async-signal-safe except strobe_sigstack_ensure,
 * strobe_sigstack_after_fork, strobe_sigstack_unblock_left and the Ruby
 * test hooks, which run outside handlers.
 */
#include "sigstack.h"
#include "placement.h"
#include "sampler.h"
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static atomic_ulong reclaimed, recovered;

/* Set while a sampling handler runs on this thread (strobe_sigstack_enter,
 * _leave): still set outside any handler, it was left by a longjmp. */
__thread int strobe_in_handler __attribute__((tls_model("initial-exec")));

/* ---- Strobe's own alternate stacks ----------------------------------------- */

typedef struct {
    pid_t tid;        /* the thread it was made for */
    char *map;        /* guard page, then the stack */
    size_t map_len;
} own_stack_t;

static pthread_mutex_t own_lock = PTHREAD_MUTEX_INITIALIZER;
static own_stack_t *own;
static size_t own_len, own_capa;
static size_t sweep_at = 16; /* list length at which other threads' stacks are looked at next */

static size_t
page_size(void)
{
    long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? (size_t)page : 4096;
}

static int
is_current(const own_stack_t *o, const stack_t *ss)
{
    return !(ss->ss_flags & SS_DISABLE) && (char *)ss->ss_sp == o->map + page_size();
}

static void
drop(size_t i)
{
    munmap(own[i].map, own[i].map_len);
    own[i] = own[--own_len];
}

/* Under own_lock: unmaps the stacks no thread can be on any more: made for
 * this thread and no longer its stack, or (once the list has doubled since
 * they were last looked at: a probe syscall each) for a thread that is
 * gone. Returns the index of this thread's current stack, or -1. */
static long
sweep(pid_t me, const stack_t *mine)
{
    int others = own_len >= sweep_at;
    long current = -1;
    for (size_t i = 0; i < own_len;) {
        const own_stack_t *o = &own[i];
        int gone = o->tid == me ? !is_current(o, mine)
                 : others && syscall(SYS_tgkill, getpid(), o->tid, 0) < 0 && errno == ESRCH;
        if (gone) {
            drop(i);
            continue;
        }
        if (o->tid == me) current = (long)i;
        i++;
    }
    if (others) sweep_at = own_len * 2 > 16 ? own_len * 2 : 16;
    return current;
}

void
strobe_sigstack_ensure(void)
{
    stack_t ss;
    if (sigaltstack(NULL, &ss) != 0 || (ss.ss_flags & SS_ONSTACK)) return;
    pid_t me = strobe_placement_self_tid();
    pthread_mutex_lock(&own_lock);
    int saved_errno = errno;
    long current = sweep(me, &ss);
    errno = saved_errno;
    if (current >= 0) goto out; /* ours already */
    if (own_len == own_capa) {
        size_t capa = own_capa ? own_capa * 2 : 16;
        own_stack_t *grown = realloc(own, capa * sizeof(*own));
        if (!grown) goto out;
        own = grown;
        own_capa = capa;
    }
    size_t page = page_size(), len = page + STROBE_SIGSTACK_BYTES;
    char *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (map == MAP_FAILED) goto out;
    mprotect(map, page, PROT_NONE); /* an overflow faults instead of writing below */
    stack_t ours = { .ss_sp = map + page, .ss_size = STROBE_SIGSTACK_BYTES, .ss_flags = 0 };
    if (sigaltstack(&ours, NULL) != 0) {
        munmap(map, len);
        goto out;
    }
    own[own_len++] = (own_stack_t){ me, map, len };
out:
    pthread_mutex_unlock(&own_lock);
}

void
strobe_sigstack_after_fork(void)
{
    /* Only the forking thread is left: the other threads' stacks go; its
     * own (inherited with the thread's alternate stack) is its new tid's. */
    stack_t ss;
    int have = sigaltstack(NULL, &ss) == 0;
    pthread_mutex_init(&own_lock, NULL);
    for (size_t i = 0; i < own_len;) {
        if (have && is_current(&own[i], &ss)) {
            own[i++].tid = strobe_placement_self_tid();
        } else {
            drop(i);
        }
    }
}

int
strobe_sigstack_room(const void *frame, size_t need)
{
    stack_t ss;
    if (sigaltstack(NULL, &ss) != 0 || !(ss.ss_flags & SS_ONSTACK)) return 1; /* on the thread's own stack */
    uintptr_t low = (uintptr_t)ss.ss_sp, at = (uintptr_t)frame;
    return at > low && at - low >= need;
}

int
strobe_sigstack_handler_flags(void)
{
    return SA_SIGINFO | SA_RESTART | SA_ONSTACK;
}

int
strobe_sigstack_unblock_left(void)
{
    strobe_in_handler = 0;
    sigset_t ours;
    sigemptyset(&ours);
    sigaddset(&ours, STROBE_SIGNAL);
    /* A signal pending meanwhile is delivered here: its handler takes over
     * a guard the left one still holds (strobe_guard_take_in_handler). */
    pthread_sigmask(SIG_UNBLOCK, &ours, NULL);
    atomic_fetch_add(&recovered, 1);
    return 1;
}

int
strobe_guard_take_in_handler(strobe_thread_t *t, const void *frame)
{
    pid_t me = strobe_placement_self_tid();
    int holder = 0;
    if (atomic_compare_exchange_strong(&t->guard_tid, &holder, me)) {
        /* (Nothing else of this thread runs before this store.) */
        atomic_store(&t->guard_frame, (uintptr_t)frame);
        return 1;
    }
    if (holder != me) return 0;
    uintptr_t held = atomic_load(&t->guard_frame);
    if (held == 0) return 0; /* code outside a handler holds it */
    /* A handler of this thread, which cannot be running under this one. */
    if (!atomic_compare_exchange_strong(&t->guard_frame, &held, (uintptr_t)frame)) return 0;
    atomic_fetch_add(&reclaimed, 1);
    return 1;
}

int
strobe_guard_take(strobe_thread_t *t)
{
    pid_t me = strobe_placement_self_tid();
    int holder = 0;
    if (atomic_compare_exchange_strong(&t->guard_tid, &holder, me)) return 1;
    if (holder != me) return 0;
    uintptr_t held = atomic_load(&t->guard_frame);
    if (held == 0 || !atomic_compare_exchange_strong(&t->guard_frame, &held, 0)) return 0;
    atomic_fetch_add(&reclaimed, 1);
    return 1;
}

void
strobe_guard_release(strobe_thread_t *t)
{
    atomic_store(&t->guard_frame, 0);
    atomic_store(&t->guard_tid, 0);
}

void
strobe_guard_reclaim(strobe_thread_t *t)
{
    if (atomic_load_explicit(&t->guard_tid, memory_order_relaxed) != strobe_placement_self_tid()) return;
    if (strobe_guard_take(t)) strobe_guard_release(t);
}

/* Guards found left by a longjmp and taken back since the process began
 * (tests read it). */
static unsigned long
strobe_guard_reclaimed(void)
{
    return atomic_load(&reclaimed);
}

/* ---- test hooks ------------------------------------------------------------ */

#define PAINT 0xA5

/* The calling thread's alternate stack, every signal blocked meanwhile so
 * that no handler is on it while it is painted or read. */
static int
with_stack(stack_t *ss, sigset_t *saved)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, saved);
    if (sigaltstack(NULL, ss) == 0 && !(ss->ss_flags & (SS_DISABLE | SS_ONSTACK)) && ss->ss_sp) return 1;
    pthread_sigmask(SIG_SETMASK, saved, NULL);
    return 0;
}

/* Outside any handler, on the calling thread: paint fills its alternate
 * signal stack with a pattern; used then tells how many bytes of it
 * handlers have used since (the deepest point), with its size. Both return
 * 0 when the thread has no alternate stack. */
static size_t
strobe_sigstack_paint(size_t *size)
{
    stack_t ss;
    sigset_t saved;
    *size = 0;
    if (!with_stack(&ss, &saved)) return 0;
    memset(ss.ss_sp, PAINT, ss.ss_size);
    pthread_sigmask(SIG_SETMASK, &saved, NULL);
    *size = ss.ss_size;
    return ss.ss_size;
}

static size_t
strobe_sigstack_used(size_t *size)
{
    stack_t ss;
    sigset_t saved;
    *size = 0;
    if (!with_stack(&ss, &saved)) return 0;
    const unsigned char *low = ss.ss_sp;
    size_t untouched = 0;
    while (untouched < ss.ss_size && low[untouched] == PAINT) untouched++;
    pthread_sigmask(SIG_SETMASK, &saved, NULL);
    *size = ss.ss_size;
    return ss.ss_size - untouched;
}

/* Strobe::Native.signal_stack_paint / signal_stack_used -> [used, size]
 * or nil (no alternate stack on this thread). */
static VALUE
native_signal_stack_paint(VALUE self)
{
    size_t size;
    return strobe_sigstack_paint(&size) ? SIZET2NUM(size) : Qnil;
}

static VALUE
native_signal_stack_used(VALUE self)
{
    size_t size;
    size_t used = strobe_sigstack_used(&size);
    return size ? rb_ary_new_from_args(2, SIZET2NUM(used), SIZET2NUM(size)) : Qnil;
}

/* Strobe::Native.guards_reclaimed: guards taken back from handlers left
 * by a longjmp; Strobe::Native.handlers_recovered: threads whose signal a
 * left handler had kept blocked, unblocked since. */
static VALUE
native_guards_reclaimed(VALUE self)
{
    return ULONG2NUM(strobe_guard_reclaimed());
}

static VALUE
native_handlers_recovered(VALUE self)
{
    return ULONG2NUM(atomic_load(&recovered));
}

/* Strobe::Native.leave_a_handler: while profiling, signals the calling
 * thread and makes its handler longjmp out once it holds the guard, as
 * Ruby's stack-overflow recovery does from a fault inside it (_longjmp:
 * the signal mask is left as the handler had it, the signal blocked).
 * Returns whether a handler was left. */
static jmp_buf *leave_to;
static _Atomic pid_t leave_tid;

void
strobe_sigstack_leave_if_asked(void)
{
    if (atomic_load_explicit(&leave_tid, memory_order_relaxed) != strobe_placement_self_tid()) return;
    atomic_store(&leave_tid, 0);
    _longjmp(*leave_to, 1);
}

static VALUE
native_leave_a_handler(VALUE self)
{
    static jmp_buf buf;
    pid_t me = strobe_placement_self_tid();
    if (_setjmp(buf) != 0) return Qtrue;
    leave_to = &buf;
    atomic_store(&leave_tid, me);
    syscall(SYS_tgkill, getpid(), me, STROBE_SIGNAL);
    /* Delivered before tgkill returns, unless blocked or not ours to take. */
    atomic_store(&leave_tid, 0);
    return Qfalse;
}

void
strobe_sigstack_define(VALUE mNative)
{
    rb_define_singleton_method(mNative, "signal_stack_paint", native_signal_stack_paint, 0);
    rb_define_singleton_method(mNative, "signal_stack_used", native_signal_stack_used, 0);
    rb_define_singleton_method(mNative, "guards_reclaimed", native_guards_reclaimed, 0);
    rb_define_singleton_method(mNative, "handlers_recovered", native_handlers_recovered, 0);
    rb_define_singleton_method(mNative, "leave_a_handler", native_leave_a_handler, 0);
}
