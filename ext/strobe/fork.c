/*
 * fork.c - fork handling: the child of a profiled process stops profiling
 * (it inherits no timer thread, and the registered threads are the
 * parent's); the parent carries on. pthread_atfork handlers take the
 * registry and profile locks around fork, so the child never copies a
 * half-done tick or drain, and take the GVL hook out (gvlhook.c). The child
 * marks what was recorded before the fork inherited (the parent's to
 * report) and can start a profile of its own. Also strobe serve's
 * listening socket, which children do not keep.
 *
 * Nothing here runs in a signal handler: the atfork handlers run in the
 * forking thread (with the GVL, as Ruby forks), the rest with the GVL held.
 */
#include "sampler_internal.h"
#include "capture.h"
#include "gcspan.h"
#include "native.h"
#include "placement.h"
#include "profile.h"
#include "sigstack.h"
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>
#include <sys/stat.h>

/* A descriptor forked children close (strobe serve's socket), -1 none,
 * and the file it was then (the program may close it and open another
 * file under its number). */
static struct {
    int child_fd, null_fd;
    dev_t child_dev;
    ino_t child_ino;
} F;

/* fork() copies memory as it is at that instant. Taking the registry and
 * profile locks first means the timer thread is not half way through a tick
 * or a drain, so the child's profile is consistent. */
static void
atfork_prepare(void)
{
    strobe_sampler_gvl_hook_remove(); /* see strobe_sampler_gvl_after_fork */
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
    strobe_sampler_gvl_after_fork(0);
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
    strobe_sampler_gvl_after_fork(1);
    strobe_threads_reset();
    strobe_sampler_scopes_after_fork();
    if (strobe_profile.active) strobe_profile.inherited = 1;
    atomic_store(&strobe_sampler.running, 0);
    strobe_sampler_timers_after_fork(); /* POSIX timers are not inherited */
    strobe_sampler.process_timer = 0;
    strobe_sampler.safepoint_timer = 0;
    strobe_capture_reset();
    /* strobe serve's listening socket: put /dev/null in its place, so
     * the child does not hold the port (its IO object, left with
     * /dev/null, closes that instead). Only if that number still holds the
     * socket: a program that closed it (daemons close every descriptor)
     * may have opened a file of its own under it. */
    struct stat now;
    if (F.child_fd >= 0 && F.null_fd >= 0 && fstat(F.child_fd, &now) == 0 && now.st_dev == F.child_dev &&
        now.st_ino == F.child_ino)
        dup2(F.null_fd, F.child_fd);
}

void
strobe_sampler_close_in_children(int fd)
{
    if (fd < 0) { /* unregistered: the socket closed, its number free for any file */
        F.child_fd = -1;
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) rb_sys_fail("close_in_children");
    if (F.null_fd < 0) F.null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (F.null_fd < 0) rb_sys_fail("/dev/null");
    F.child_dev = st.st_dev;
    F.child_ino = st.st_ino;
    F.child_fd = fd;
}

void
strobe_sampler_fork_init(void)
{
    F.child_fd = F.null_fd = -1;
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}
