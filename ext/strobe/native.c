/*
 * native.c - native (C) frames beside Ruby frames (native: true).
 *
 * Three steps, in three contexts:
 *
 * 1. Capture, in the signal handler (strobe_native_capture): the return
 *    addresses of the interrupted native stack, innermost first, starting
 *    at the interrupted instruction, with libunwind's local unwinder. A
 *    thread whose libunwind thread-local state is set up ("warm", done by
 *    strobe_native_warm outside any handler, on the thread itself) uses
 *    unw_backtrace, libunwind's cached fast path; its first use on a thread
 *    reaches glibc's lazy allocation of a loaded library's thread-local
 *    storage, which calls malloc and so must not happen in a handler. A
 *    cold thread walks with unw_init_local2/unw_step from the signal
 *    context, which touch no thread-local storage (slower, as safe).
 *
 * 2. Weaving, at the drain (strobe_native_weave, under the profile lock):
 *    which of those frames belong under the innermost Ruby frame. From the
 *    interrupted instruction outward, frames are taken up to the first
 *    boundary, where Ruby-level code runs beyond: libruby's bytecode loop
 *    entry (rb_vm_exec) and the C API calls that run Ruby code (rb_funcall,
 *    rb_yield, ...). Frames further out belong to outer Ruby frames (the
 *    interpreter, or a C method that called back into Ruby) and are left
 *    out. Along the way, libruby's pass-through helpers (rb_ensure,
 *    rb_protect, rb_nogvl, ...) are dropped, and at the outer end of what
 *    is taken, libruby's own interpreter frames (the bytecode loop, method
 *    dispatch, and functions without a symbol in a stripped libruby, such
 *    as the C method's own body, which the Ruby frame names already) are
 *    folded away. Each address becomes its function (start address, from
 *    the symbol or from libunwind's unwind tables), interned as a frame of
 *    kind STROBE_FRAME_NATIVE. Resolutions are cached by address.
 *
 * 3. Names, at results (strobe_native_details, GVL held): "function
 *    (object)" from symbols.c, or "object+0xoffset" for a function without
 *    a symbol; the file is the object's path.
 *
 * Without libunwind (extconf.rb did not find it) everything here reports
 * native frames unavailable, and native: true is refused.
 */
#include "native.h"
#include "clock.h"
#include "sigstack.h"
#include "symbols.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_LIBUNWIND
#define UNW_LOCAL_ONLY
#include <libunwind.h>
#include <ucontext.h>
#include <dlfcn.h>
#include <sched.h>

int
strobe_native_available(void)
{
    return 1;
}

/* The interrupted instruction of a signal context. */
static uintptr_t
interrupted_pc(const void *ucontext)
{
    const ucontext_t *uc = ucontext;
#if defined(__x86_64__) /* the only platform extconf.rb enables */
    return (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
#else
    (void)uc;
    return 0;
#endif
}

/* Frames of the handler itself (signal_handler ... this function and the
 * signal trampoline) that unw_backtrace sees before the interrupted one. */
#define HANDLER_FRAMES 16

/* fork() copies libunwind's global mutex as it is: held, if a handler on
 * another thread is inside libunwind at that instant, and the child's
 * first walk would then wait forever with every signal blocked. So fork
 * waits for the walks under way and lets no new one start until it is
 * done (strobe_native_fork_prepare/_done, from fork.c's fork handlers). */
static atomic_int walks_blocked, walks_running;
/* A walk that never ended (its handler left by a longjmp, say) made a fork
 * give up waiting: walks are off for good in this process. */
static atomic_int walks_disabled;

static int
walk(const strobe_thread_t *t, const void *ucontext, uintptr_t *out)
{
    uintptr_t pc = interrupted_pc(ucontext);
    if (!pc) return 0;
    if (atomic_load_explicit(&t->native_warm, memory_order_relaxed)) {
        void *buf[STROBE_NATIVE_CAPA + HANDLER_FRAMES];
        int n = unw_backtrace(buf, STROBE_NATIVE_CAPA + HANDLER_FRAMES);
        for (int k = 0; k < n; k++) {
            if ((uintptr_t)buf[k] != pc) continue;
            int depth = n - k < STROBE_NATIVE_CAPA ? n - k : STROBE_NATIVE_CAPA;
            for (int i = 0; i < depth; i++) out[i] = (uintptr_t)buf[k + i];
            return depth;
        }
        /* The fast walk did not get past the signal frame: walk from it. */
    }
    unw_cursor_t cursor;
    if (unw_init_local2(&cursor, (unw_context_t *)(uintptr_t)ucontext, UNW_INIT_SIGNAL_FRAME) < 0) return 0;
    int depth = 0;
    do {
        unw_word_t ip;
        if (unw_get_reg(&cursor, UNW_REG_IP, &ip) < 0 || ip == 0) break;
        out[depth++] = (uintptr_t)ip;
    } while (depth < STROBE_NATIVE_CAPA && unw_step(&cursor) > 0);
    return depth;
}

int
strobe_native_capture(const strobe_thread_t *t, const void *ucontext, uintptr_t *out)
{
    /* Sequentially consistent: a fork sees this walk, or the walk sees the fork. */
    /* Room for libunwind below here, or no native frames this time. */
    int here = 0;
    if (!strobe_sigstack_room(&here, STROBE_NATIVE_STACK_NEED)) return 0;
    atomic_fetch_add(&walks_running, 1);
    int depth = atomic_load(&walks_blocked) || atomic_load(&walks_disabled) ? 0 : walk(t, ucontext, out);
    atomic_fetch_sub(&walks_running, 1);
    return depth;
}

void
strobe_native_fork_prepare(void)
{
    atomic_store(&walks_blocked, 1);
    if (atomic_load(&walks_disabled)) return;
    /* A walk takes microseconds; after a second, something is wrong with it. */
    int64_t give_up = strobe_clock_ns(CLOCK_MONOTONIC) + 1000000000;
    for (int spins = 0; atomic_load(&walks_running); spins++) {
        if (spins < 1000) {
            sched_yield();
            continue;
        }
        struct timespec pause = { 0, 100000 };
        nanosleep(&pause, NULL);
        if (strobe_clock_ns(CLOCK_MONOTONIC) > give_up) {
            atomic_store(&walks_disabled, 1);
            return;
        }
    }
}

void
strobe_native_fork_done(int in_child)
{
    /* A handler that was turned away may have been counted when the child
     * was copied; only the forking thread lives on there. */
    if (in_child) atomic_store(&walks_running, 0);
    atomic_store(&walks_blocked, 0);
}

/* Walks the calling thread's whole stack: its frames (the interpreter's,
 * mostly) are then in libunwind's caches before the first handler needs
 * them. With read_symbols, also reads the symbol tables of the objects they
 * are in. */
static void
walk_self(int read_symbols)
{
    void *buf[STROBE_NATIVE_CAPA];
    int n = unw_backtrace(buf, STROBE_NATIVE_CAPA);
    strobe_symbol_t s;
    for (int i = 0; read_symbols && i < n; i++) strobe_symbols_find((uintptr_t)buf[i] - 1, &s);
}

/* libunwind's per-thread state belongs to the native thread: a Ruby thread
 * M:N may move (mobile) is never marked warm, so its handler always takes
 * the walk that needs none. */
void
strobe_native_warm(strobe_thread_t *t)
{
    if (atomic_load_explicit(&t->native_warm, memory_order_relaxed) || atomic_load(&t->mobile)) return;
    strobe_sigstack_ensure(); /* room for the walks (sigstack.c) */
    walk_self(0);
    atomic_store_explicit(&t->native_warm, 1, memory_order_relaxed);
}

void
strobe_native_prepare(strobe_thread_t *self)
{
    if (self && !atomic_load(&self->mobile)) strobe_sigstack_ensure();
    walk_self(1);
    if (self && !atomic_load(&self->mobile)) atomic_store_explicit(&self->native_warm, 1, memory_order_relaxed);
}

/* ---- weaving ------------------------------------------------------------------ */

enum {
    NF_KEEP = 0,   /* shown */
    NF_VM,         /* libruby's interpreter: folded at the outer end of what is taken */
    NF_GLUE,       /* libruby helper passing control to C code: dropped */
    NF_BOUNDARY    /* Ruby-level code runs beyond: stop */
};

typedef struct {
    uintptr_t ip;            /* the address looked up; 0: empty */
    uintptr_t start;         /* its function */
    uint8_t cls;
} ip_entry_t;

static ip_entry_t *cache;    /* open addressing by ip; under the profile lock */
static size_t cache_len, cache_capa;
static int ruby_object = -2; /* symbols.c's index of libruby (-2: not looked up) */

static int
has_prefix(const char *s, const char *const *prefixes)
{
    for (; *prefixes; prefixes++)
        if (!strncmp(s, *prefixes, strlen(*prefixes))) return 1;
    return 0;
}

/* Calls that run Ruby-level code (methods, blocks, files). */
static const char *const boundary_prefixes[] = {
    "rb_vm_exec", "vm_exec", "rb_funcall", "rb_call_super", "rb_check_funcall", "rb_yield", "rb_apply",
    "rb_eval_string", "rb_block_call", "rb_iterate", "rb_proc_call", "rb_method_call", "rb_obj_call_init",
    "rb_class_new_instance", "rb_vm_invoke", "rb_iseq_eval", "rb_ec_exec_node", "ruby_run_node",
    "ruby_exec_node", "rb_load", "rb_require", "rb_each", "rb_fiber_start", NULL
};
/* libruby helpers that call a C function of their caller's. */
static const char *const glue_prefixes[] = {
    "rb_ensure", "rb_protect", "rb_rescue", "rb_vrescue", "rb_nogvl", "rb_thread_call_without_gvl",
    "rb_thread_call_with_gvl", "rb_exec_recursive",
    "rb_mutex_synchronize", "rb_thread_io_blocking_region", "rb_str_locktmp_ensure", "rb_uninterruptible", "rb_catch",
    NULL
};
/* libruby's interpreter, where its symbols are there to say so. */
static const char *const vm_prefixes[] = {
    "vm_", "rb_vm_", "rb_ec_", "ec_", "invoke_", "rb_call0", "rb_iseq_", "setup_parameters", "callable_method_entry",
    NULL
};

static uint8_t
classify(const strobe_symbol_t *s)
{
    if (ruby_object == -2) {
        void *anchor = dlsym(RTLD_DEFAULT, "rb_vm_exec");
        strobe_symbol_t ruby;
        ruby_object = strobe_symbols_find(anchor ? (uintptr_t)anchor : (uintptr_t)&rb_funcallv, &ruby) ? ruby.object : -1;
    }
    if (s->object != ruby_object || ruby_object < 0) return NF_KEEP;
    if (!s->name) return NF_VM;
    if (has_prefix(s->name, boundary_prefixes)) return NF_BOUNDARY;
    if (has_prefix(s->name, glue_prefixes)) return NF_GLUE;
    if (has_prefix(s->name, vm_prefixes)) return NF_VM;
    return NF_KEEP;
}

/* Cached by the address looked up (see resolve), not the raw one: a
 * return address can equal the next function's first instruction (after a
 * call that never returns), where an interrupted instruction would belong
 * to that next function. */
static inline size_t
ip_slot(uintptr_t ip, size_t capa)
{
    return (size_t)(((uint64_t)ip * 0x9e3779b97f4a7c15ULL) >> 20) & (capa - 1);
}

static void
cache_grow(void)
{
    size_t capa = cache_capa ? cache_capa * 2 : 4096;
    ip_entry_t *grown = calloc(capa, sizeof(ip_entry_t));
    if (!grown) strobe_out_of_memory(); /* the old cache stays as it was */
    for (size_t i = 0; i < cache_capa; i++) {
        if (!cache[i].ip) continue;
        size_t k = ip_slot(cache[i].ip, capa);
        while (grown[k].ip) k = (k + 1) & (capa - 1);
        grown[k] = cache[i];
    }
    free(cache);
    cache = grown;
    cache_capa = capa;
}

/* The function and class of the frame at ip (exact for the interrupted
 * instruction; a return address otherwise, looked up one byte back, in
 * the call). */
static const ip_entry_t *
resolve(uintptr_t ip, int exact)
{
    if ((cache_len + 1) * 2 > cache_capa) cache_grow();
    uintptr_t at = exact ? ip : ip - 1;
    size_t k = ip_slot(at, cache_capa);
    for (; cache[k].ip; k = (k + 1) & (cache_capa - 1))
        if (cache[k].ip == at) return &cache[k];

    strobe_symbol_t s;
    strobe_symbols_find(at, &s);
    uintptr_t start = s.start;
    if (!start) {
        unw_proc_info_t pi;
        if (unw_get_proc_info_by_ip(unw_local_addr_space, at, &pi, NULL) == 0 && pi.start_ip <= at && at < pi.end_ip)
            start = pi.start_ip;
        else
            start = at;
    }
    cache[k] = (ip_entry_t){ at, start, classify(&s) };
    cache_len++;
    return &cache[k];
}

int
strobe_native_weave(const uintptr_t *ips, int n, VALUE *out)
{
    int taken = 0, bounded = 0;
    uint8_t cls[STROBE_NATIVE_CAPA];
    for (int i = 0; i < n && i < STROBE_NATIVE_CAPA; i++) {
        const ip_entry_t *e = resolve(ips[i], i == 0);
        if (e->cls == NF_BOUNDARY) { bounded = 1; break; }
        if (e->cls == NF_GLUE) continue;
        out[taken] = STROBE_NATIVE_VALUE(e->start);
        cls[taken++] = e->cls;
    }
    if (!bounded) return -1;
    while (taken > 0 && cls[taken - 1] == NF_VM) taken--;
    return taken;
}

void
strobe_native_reset(void)
{
    free(cache);
    cache = NULL;
    cache_len = cache_capa = 0;
}

#else /* no libunwind */

int strobe_native_available(void) { return 0; }
int strobe_native_capture(const strobe_thread_t *t, const void *ucontext, uintptr_t *out)
{
    (void)t; (void)ucontext; (void)out;
    return 0;
}
void strobe_native_warm(strobe_thread_t *t) { (void)t; }
void strobe_native_prepare(strobe_thread_t *self) { (void)self; }
void strobe_native_fork_prepare(void) {}
void strobe_native_fork_done(int in_child) { (void)in_child; }
int strobe_native_weave(const uintptr_t *ips, int n, VALUE *out)
{
    (void)ips; (void)n; (void)out;
    return -1;
}
void strobe_native_reset(void) {}

#endif

/* ---- names ----------------------------------------------------------------------- */

void
strobe_native_details(VALUE value, VALUE details)
{
    uintptr_t start = STROBE_NATIVE_ADDR(value);
    strobe_symbol_t s;
    VALUE name, file;
    if (!strobe_symbols_find(start, &s)) {
        name = rb_sprintf("0x%" PRIxPTR, start);
        file = rb_str_new_cstr("");
    } else {
        if (s.name && s.start == start)
            name = rb_sprintf("%s (%s)", s.name, s.object_name);
        else
            name = rb_sprintf("%s+0x%" PRIxPTR, s.object_name, start - s.base);
        file = rb_str_new_cstr(s.path);
    }
    rb_hash_aset(details, strobe_sym("name"), name);
    rb_hash_aset(details, strobe_sym("file"), file);
    rb_hash_aset(details, strobe_sym("native"), Qtrue);
}
