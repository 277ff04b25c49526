/*
 * timer_floor.c - a null profiler: timer signals with an EMPTY handler.
 *
 * bench/overhead.rb compiles this into a shared library, loads it with
 * Fiddle and runs the same Ruby workload under it, to show what the machine
 * charges for the signals alone, before any profiler does any work. It
 * drives the signal the two ways the profilers do:
 *   way 0, "itimer": setitimer(ITIMER_REAL) + SIGALRM (stackprof's wall mode)
 *   way 1, "thread": a timer thread sleeping to absolute CLOCK_MONOTONIC
 *                    deadlines, sending SIGURG with tgkill to the thread
 *                    that started it (Strobe's wall mode)
 *
 *   int  floor_start(int way, int interval_us)  0 on success
 *   long floor_stop(void)                       signals handled since start
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile long signals;
static volatile int stop_thread;
static int way;
static long interval_ns;
static pid_t target_tid;
static pthread_t timer;
static struct sigaction old_action;

static int signal_for(int w) { return w ? SIGURG : SIGALRM; }

static void handler(int sig) { (void)sig; signals++; }

static void *timer_main(void *arg)
{
    (void)arg;
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    while (!stop_thread) {
        next.tv_nsec += interval_ns;
        while (next.tv_nsec >= 1000000000) { next.tv_nsec -= 1000000000; next.tv_sec++; }
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
        syscall(SYS_tgkill, (long)getpid(), (long)target_tid, (long)SIGURG);
    }
    return NULL;
}

int floor_start(int w, int interval_us)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);

    way = w;
    interval_ns = (long)interval_us * 1000;
    signals = 0;
    sigaction(signal_for(way), &sa, &old_action);
    if (way) {
        sigset_t all, old;
        target_tid = (pid_t)syscall(SYS_gettid);
        stop_thread = 0;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old); /* the timer thread takes no signals */
        int rc = pthread_create(&timer, NULL, timer_main, NULL);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        return rc;
    }
    struct itimerval it = { { 0, interval_us }, { 0, interval_us } };
    return setitimer(ITIMER_REAL, &it, NULL);
}

long floor_stop(void)
{
    if (way) {
        stop_thread = 1;
        pthread_join(timer, NULL);
    } else {
        struct itimerval off = { { 0, 0 }, { 0, 0 } };
        setitimer(ITIMER_REAL, &off, NULL);
    }
    /* Any signal still pending was delivered on the way out of the calls
     * above; the disposition found at start is safe to put back. */
    sigaction(signal_for(way), &old_action, NULL);
    return signals;
}
