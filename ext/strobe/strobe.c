/*
 * strobe.c - Init_strobe and argument conversion for Strobe::Native.
 *
 * Option validation and the public API are in lib/strobe.rb; this file only
 * converts already-validated arguments and wires the C files to Ruby. It
 * also owns the one GC-visible object through which every VALUE the
 * profiler holds is marked (and pinned, see stack_table.c and capture.c).
 *
 * Nothing here is called from a signal handler.
 */
#include "strobe.h"
#include "capture.h"
#include "compact.h"
#include "cost.h"
#include "json_columns.h"
#include "stacks.h"
#include "export.h"
#include "flamegraph.h"
#include "markers.h"
#include "native.h"
#include "profile.h"
#include "report.h"
#include "results.h"
#include "sampler.h"
#include "sigstack.h"
#include "subset.h"
#include "symbols.h"
#include "threads.h"
#include "trace.h"

VALUE strobe_eProfileError;
static VALUE mStrobe, mNative, eStrobeError, gc_anchor;

/* GVL held: the starts of profiling in this process so far, sampled or
 * traced; the number of the latest names the profile running now, for a
 * caller that must stop only the one it started (Strobe::Middleware,
 * running on between requests). */
static unsigned long rounds;

/* GVL held: set while Strobe.run (or StackProf.run) stops its profile and
 * takes its results. Ruby code runs in between (Strobe.stopped, results),
 * and a start from another thread there (a middleware's next request)
 * would add to that profile and leave the run nothing: starts are refused
 * meanwhile, as while it runs. */
static int run_collecting;

/* The Symbol for a C string literal. Result building asks for the same few
 * names per frame and per line, and rb_intern hashes the string each time,
 * so symbols are cached by the literal's address (GVL held; symbols from
 * rb_intern are static, never collected). */
VALUE
strobe_sym(const char *name)
{
    enum { SLOTS = 128 };
    static struct { const char *name; VALUE sym; } cache[SLOTS];
    size_t h = ((uintptr_t)name >> 3) % SLOTS;
    for (int probes = 0; probes < SLOTS; probes++, h = (h + 1) % SLOTS) {
        if (cache[h].name == name) return cache[h].sym;
        if (!cache[h].name) {
            cache[h].sym = ID2SYM(rb_intern(name));
            cache[h].name = name;
            return cache[h].sym;
        }
    }
    return ID2SYM(rb_intern(name));
}

static void
anchor_mark(void *ptr)
{
    (void)ptr;
    /* The timer thread may be draining slots into the profile right now. */
    strobe_profile_lock();
    strobe_capture_mark();
    strobe_profile_mark();
    strobe_profile_unlock();
    strobe_sampler_mark();
}

static size_t
anchor_memsize(const void *ptr)
{
    (void)ptr;
    return strobe_profile_memsize();
}

static const rb_data_type_t anchor_type = {
    .wrap_struct_name = "Strobe::Native::GCAnchor",
    .function = { .dmark = anchor_mark, .dsize = anchor_memsize },
};

static strobe_mode_t
mode_from_sym(VALUE mode)
{
    if (mode == strobe_sym("wall")) return STROBE_MODE_WALL;
    if (mode == strobe_sym("cpu")) return STROBE_MODE_CPU;
    if (mode == strobe_sym("object")) return STROBE_MODE_OBJECT;
    if (mode == strobe_sym("custom")) return STROBE_MODE_CUSTOM;
    rb_raise(rb_eArgError, "unknown mode: %+"PRIsVALUE, mode);
}

/* Strobe::Native.start(mode, interval, raw, aggregate, ignore_gc, threads, timer, native, round, adds_to)
 * -> bool (false when running, when a start came since round, or when a
 * stopped profile adds_to forbids waits: see may_start)
 * threads: nil for every thread, or an Array of Threads; timer: :threads,
 * :process or :safepoints (see timer.c); native: capture native frames
 * too (native.c). */
/* threads: nil, or an Array of Threads (checked, copied). */
static VALUE
threads_arg(VALUE threads)
{
    if (NIL_P(threads)) return threads;
    Check_Type(threads, T_ARRAY);
    for (long i = 0; i < RARRAY_LEN(threads); i++)
        if (!rb_obj_is_kind_of(RARRAY_AREF(threads, i), rb_cThread))
            rb_raise(rb_eArgError, "threads: must hold Thread objects, got %+"PRIsVALUE, RARRAY_AREF(threads, i));
    return rb_ary_dup(threads);
}

static int
running(void)
{
    return strobe_sampler_running() || strobe_trace_running();
}

/* GVL held: set while a start runs. A start calls Ruby (Thread.list, each
 * thread's status), where Ruby may switch threads: a start from the thread
 * switched to found the sampler not running yet, started a timer thread of
 * its own, and the first then initialised the timer's lock and condition
 * again under it (a later stop hung for good in pthread_cond_destroy, in
 * the suite under ASan). Such a start is refused, as while it runs. */
static int starting;

struct start_args {
    VALUE mode, interval, raw, aggregate, ignore_gc, threads, timer, native;
};

static VALUE
start_sampler(VALUE arg)
{
    const struct start_args *a = (const struct start_args *)arg;
    if (strobe_trace_active()) rb_raise(eStrobeError, "a trace is waiting for its results: call Strobe.results first");
    strobe_mode_t m = mode_from_sym(a->mode);
    long iv = NIL_P(a->interval) ? 0 : NUM2LONG(a->interval);
    if ((m == STROBE_MODE_WALL || m == STROBE_MODE_CPU) && (iv < 1 || iv > 1000000))
        rb_raise(rb_eArgError, "interval is a number of microseconds from 1 to 1000000, got %ld", iv);
    if (m == STROBE_MODE_OBJECT && iv < 1)
        rb_raise(rb_eArgError, "interval for :object mode must be at least 1, got %ld", iv);

    VALUE threads = threads_arg(a->threads);
    strobe_profile_drop_inherited(); /* a forked child starts its own */
    int fresh = !strobe_profile.active;
    strobe_profile_begin(m, iv, RTEST(a->raw), RTEST(a->aggregate), RTEST(a->ignore_gc));
    strobe_timer_t t = a->timer == strobe_sym("process")      ? STROBE_TIMER_PROCESS
                     : a->timer == strobe_sym("safepoints") ? STROBE_TIMER_SAFEPOINTS
                                                            : STROBE_TIMER_THREADS;
    const char *err = strobe_sampler_start(m, iv, threads, t, RTEST(a->native));
    if (err) {
        if (fresh) strobe_profile_clear();
        rb_raise(eStrobeError, "cannot start profiling: %s", err);
    }
    rounds++;
    return Qtrue;
}

static VALUE
end_starting(VALUE unused)
{
    (void)unused;
    starting = 0;
    return Qnil;
}

/* Whether n is the latest start's round (Native.round). */
static int
is_round(VALUE n)
{
    return FIXNUM_P(n) && FIX2LONG(n) >= 0 && (unsigned long)FIX2LONG(n) == rounds;
}

/* Whether a stopped profile (sampled or traced) waits for its results. */
static int
waiting(void)
{
    if (running()) return 0;
    return (strobe_profile.active && !strobe_profile.inherited) || strobe_trace_active();
}

/* Whether a start may begin now, given the round (Native.round) at which
 * its caller found the profiler free (Strobe.take_back): not while a
 * profile runs, a run collects or another start runs, nor once any start
 * came since that round. Ruby code runs between take_back and the start
 * (Ruby may switch threads there), and a middleware's round begun, ended
 * and stopped meanwhile waits for its results: a start now would add to
 * that profile (rounds without results merge), so the run's result held
 * the middleware's requests and the middleware's file was never written.
 * The caller takes the profiler back again instead.
 * And adds_to: nil for Strobe.start, which adds to whatever profile
 * waits for its results (its rounds merge, as stackprof's do); otherwise a
 * start of one of Strobe's own profilers (the middleware, the continuous
 * profiler, the pull endpoint), which takes the results it starts and so
 * must not add to a profile someone else stopped (it would take their
 * samples, and they would find nothing): false, or the round of the
 * caller's own stopped profile (which it may add to). */
static int
may_start(VALUE round, VALUE adds_to)
{
    if (running() || run_collecting || starting) return 0;
    if (!NIL_P(round) && !is_round(round)) return 0;
    return NIL_P(adds_to) || !waiting() || is_round(adds_to);
}

static VALUE
native_start(VALUE self, VALUE mode, VALUE interval, VALUE raw, VALUE aggregate, VALUE ignore_gc, VALUE threads,
             VALUE timer, VALUE native, VALUE round, VALUE adds_to)
{
    if (!may_start(round, adds_to)) return Qfalse;
    struct start_args a = { mode, interval, raw, aggregate, ignore_gc, threads, timer, native };
    starting = 1;
    return rb_ensure(start_sampler, (VALUE)&a, end_starting, Qnil);
}

/* Strobe::Native.trace_start(cpu, threads, names, paths, patterns, round, adds_to)
 * -> bool: mode :trace (trace.c); false when already running, or when a
 * start came since round, or a profile adds_to forbids waits (see may_start). names, paths and patterns:
 * exclude:'s Strings, path prefixes and Regexps (Arrays). */
static VALUE
native_trace_start(VALUE self, VALUE cpu, VALUE threads, VALUE names, VALUE paths, VALUE patterns, VALUE round,
                   VALUE adds_to)
{
    if (!may_start(round, adds_to)) return Qfalse;
    strobe_profile_drop_inherited();
    if (strobe_profile.active) rb_raise(eStrobeError, "a sampled profile is waiting for its results: call Strobe.results first");
    Check_Type(names, T_ARRAY);
    Check_Type(paths, T_ARRAY);
    Check_Type(patterns, T_ARRAY);
    strobe_sampler_only(threads_arg(threads));
    strobe_trace_start(RTEST(cpu), rb_ary_dup(names), rb_ary_dup(paths), rb_ary_dup(patterns));
    rounds++;
    return Qtrue;
}

/* Strobe::Native.trace_active? -> whether a trace waits for its results. */
static VALUE
native_trace_active_p(VALUE self)
{
    return strobe_trace_active() ? Qtrue : Qfalse;
}

/* Stops whichever runs: the sampler or the tracer. */
static void
stop_any(void)
{
    if (strobe_trace_running()) strobe_trace_stop();
    else strobe_sampler_stop();
}

static VALUE
native_stop(VALUE self)
{
    if (!running()) return Qfalse;
    stop_any();
    return Qtrue;
}

/* Strobe::Native.thread_registry -> {live:, slots:, signals:}: threads the
 * sampler targets now, registry entries ever used (reused after threads
 * end), and signals the timer thread sent since the last start. */
static VALUE
native_thread_registry(VALUE self)
{
    VALUE h = rb_hash_new();
    rb_hash_aset(h, strobe_sym("live"), INT2NUM(strobe_threads_live()));
    rb_hash_aset(h, strobe_sym("slots"), INT2NUM(strobe_threads_len()));
    rb_hash_aset(h, strobe_sym("signals"), ULL2NUM(strobe_sampler_signals_sent()));
    return h;
}

/* Strobe::Native.native_symbol(address): what native frames call the code
 * at address, as [function or nil, object file name], or nil outside every
 * loaded object (for tests: the names do not depend on where samples land). */
static VALUE
native_symbol(VALUE self, VALUE address)
{
    strobe_symbol_t sym;
    if (!strobe_symbols_find((uintptr_t)NUM2ULL(address), &sym)) return Qnil;
    return rb_ary_new_from_args(2, sym.name ? rb_str_new_cstr(sym.name) : Qnil, rb_str_new_cstr(sym.object_name));
}

static VALUE
native_running_p(VALUE self)
{
    return running() ? Qtrue : Qfalse;
}

static VALUE
native_sample(VALUE self)
{
    return strobe_sampler_sample_now() ? Qtrue : Qfalse;
}

/* ---- run, stop, running?, sample on Strobe (and StackProf) ---------------
 *
 * In C, so that no Ruby code runs between profiling starting and the block,
 * or between the block and profiling stopping: in :object mode a Ruby
 * wrapper's own allocations (the call caches of its first calls included)
 * would be sampled. start itself is Ruby (option checks), and enables
 * sampling as the last thing it does. */

static VALUE
stop_after_block(VALUE unused)
{
    (void)unused;
    run_collecting = 1;
    if (running()) stop_any();
    return Qnil;
}

/* Strobe.stop: false when not running; once stopped, lib/strobe.rb's
 * Strobe.stopped hands the result to an on_result: proc, if one was given. */
static VALUE
strobe_stop(VALUE self)
{
    if (!running()) return Qfalse;
    stop_any();
    rb_funcall(mStrobe, rb_intern("stopped"), 0);
    return Qtrue;
}

/* Strobe::Native.round -> Integer: the number of the latest start (see
 * rounds), 0 before the first. */
static VALUE
native_round(VALUE self)
{
    return ULONG2NUM(rounds);
}

/* Strobe::Native.stop_round(n) -> bool: Strobe.stop, if the profile running
 * is the one start number n began; false otherwise. In C so that no other
 * thread can stop it and start another between the check and the stop. */
static VALUE
native_stop_round(VALUE self, VALUE n)
{
    if (!FIXNUM_P(n) || !running() || FIX2LONG(n) < 0 || (unsigned long)FIX2LONG(n) != rounds) return Qfalse;
    return strobe_stop(mStrobe);
}

static VALUE
strobe_stop_after_block(VALUE unused)
{
    (void)unused;
    run_collecting = 1;
    strobe_stop(mStrobe);
    return Qnil;
}

static VALUE
yield_block(VALUE unused)
{
    (void)unused;
    return rb_yield(Qundef);
}

/* Yields, stops and returns self.results: the bodies of Strobe.run and
 * StackProf.run once started (nothing allocated: in :object mode it would
 * be sampled). */
static VALUE
strobe_run_block(VALUE self)
{
    rb_ensure(yield_block, Qnil, strobe_stop_after_block, Qnil);
    return rb_funcall(self, rb_intern("results"), 0);
}

static VALUE
stackprof_run_block(VALUE self)
{
    rb_ensure(yield_block, Qnil, stop_after_block, Qnil);
    return rb_funcall(self, rb_intern("results"), 0);
}

static VALUE
end_collecting(VALUE unused)
{
    (void)unused;
    run_collecting = 0;
    return Qnil;
}

/* Strobe.run(**options) { ... } -> result (see lib/strobe.rb). */
static VALUE
strobe_run(int argc, VALUE *argv, VALUE self)
{
    if (!rb_block_given_p()) rb_raise(rb_eArgError, "Strobe.run needs a block");
    if (!RTEST(rb_funcallv_kw(self, rb_intern("start"), argc, argv, rb_keyword_given_p())))
        rb_raise(eStrobeError, "Strobe is already running");
    return rb_ensure(strobe_run_block, self, end_collecting, Qnil);
}

/* StackProf.run(options) { ... }, as stackprof's: starts (or not, when
 * already running), yields, stops, returns results. */
static VALUE
stackprof_run(int argc, VALUE *argv, VALUE self)
{
    rb_need_block();
    rb_funcallv_kw(self, rb_intern("start"), argc, argv, rb_keyword_given_p());
    return rb_ensure(stackprof_run_block, self, end_collecting, Qnil);
}

/* Strobe::Native.define_stackprof(mod): run, stop, running? and sample on
 * mod (StackProf, for the drop-in), as C methods named after it, so that a
 * sample ends in a frame StackProf.sample as with stackprof, and no Ruby
 * wrapper runs inside the profiled window. */
static VALUE
native_define_stackprof(VALUE self, VALUE mod)
{
    Check_Type(mod, T_MODULE);
    rb_define_singleton_method(mod, "run", stackprof_run, -1);
    rb_define_singleton_method(mod, "stop", native_stop, 0);
    rb_define_singleton_method(mod, "running?", native_running_p, 0);
    rb_define_singleton_method(mod, "sample", native_sample, 0);
    return Qnil;
}

/* Strobe::Native.results -> Hash or nil. Forgets what it returns. */
static VALUE
native_results(VALUE self)
{
    if (running()) return Qnil;
    if (strobe_trace_active()) return rb_funcall(mNative, rb_intern("trace_results"), 0);
    return strobe_results_take();
}

/* Strobe::Native.snapshot(cut) -> Hash or nil: the result so far, while
 * profiling goes on; forgets nothing, or with cut, starts the profile
 * afresh from that instant. */
static VALUE
native_snapshot(VALUE self, VALUE cut)
{
    return strobe_results_snapshot(RTEST(cut));
}

/* Strobe::Native.retime(interval) -> nil, or why not (a String): the
 * running :wall or :cpu profile samples every interval microseconds from
 * now on, without stopping (no other start can come between, as it could
 * between a stop and a start). For the continuous profiler's governor. */
static VALUE
native_retime(VALUE self, VALUE interval)
{
    if (!FIXNUM_P(interval) || FIX2LONG(interval) < 1 || FIX2LONG(interval) > 1000000)
        rb_raise(rb_eArgError, "interval must be an Integer from 1 to 1000000 microseconds");
    const char *why = strobe_sampler_retime(FIX2LONG(interval));
    return why ? rb_str_new_cstr(why) : Qnil;
}

/* Strobe::Native.exclude_current_thread: the calling thread is never
 * profiled again (Strobe's own threads, such as strobe serve's server). */
static VALUE
native_exclude_current_thread(VALUE self)
{
    strobe_sampler_exclude_current();
    return Qnil;
}

/* Strobe::Native.scope_enter: the calling thread, and the threads it
 * starts meanwhile, are sampled in a new scope until Native.scope_leave
 * with its number; returns that number, or nil when it is not sampled.
 * Native::SCOPE_KEY is the Fiber storage key the caller sets to the number
 * for those threads to inherit the scope (Ruby 3.2+). */
static VALUE
native_scope_enter(VALUE self)
{
    long id = strobe_sampler_scope_enter();
    return id ? LONG2NUM(id) : Qnil;
}

static VALUE
native_scope_leave(VALUE self, VALUE id)
{
    strobe_sampler_scope_leave(NUM2LONG(id));
    return Qnil;
}

/* Strobe::Native.scope_threads(id) -> the ids of the threads open scope
 * id's code started (Ruby 3.2+; the first 32), as a result names them. */
static VALUE
native_scope_threads(VALUE self, VALUE id)
{
    (void)self;
    if (!FIXNUM_P(id)) rb_raise(rb_eTypeError, "a scope is an Integer, got %+"PRIsVALUE, id);
    pid_t tids[64];
    int n = strobe_sampler_scope_threads(FIX2LONG(id), tids, 64);
    VALUE list = rb_ary_new_capa(n);
    for (int i = 0; i < n; i++) rb_ary_push(list, INT2NUM(tids[i]));
    return list;
}

/* Strobe::Native.close_in_children(fd): forked children replace fd by
 * /dev/null as they start (strobe serve's listening socket); nil: none
 * any more (the socket was closed, and a file may get its number). */
static VALUE
native_close_in_children(VALUE self, VALUE fd)
{
    int n = NIL_P(fd) ? -1 : NUM2INT(fd);
    if (!NIL_P(fd) && n < 0)
        rb_raise(rb_eArgError, "close_in_children: %d is no file descriptor (nil unregisters)", n);
    strobe_sampler_close_in_children(n);
    return Qnil;
}

/* Strobe::Native.memsize -> bytes held by the current profile (tables,
 * counts and sample log); bench/ uses it for bytes per raw sample. */
static VALUE
native_memsize(VALUE self)
{
    return SIZET2NUM(strobe_profile_memsize());
}

void
Init_strobe(void)
{
    mStrobe = rb_define_module("Strobe");
    eStrobeError = rb_define_class_under(mStrobe, "Error", rb_eStandardError);
    strobe_eProfileError = rb_define_class_under(mStrobe, "ProfileError", eStrobeError);
    mNative = rb_define_module_under(mStrobe, "Native");

    /* Ruby skips dmark for a NULL data pointer: point at the profile. */
    gc_anchor = TypedData_Wrap_Struct(rb_cObject, &anchor_type, &strobe_profile);
    rb_gc_register_mark_object(gc_anchor);

    strobe_capture_reset();
    strobe_sampler_init();
    strobe_cost_init(mNative);

    rb_define_singleton_method(mNative, "start", native_start, 10);
    /* Whether native: true can work: Strobe was built with libunwind. */
    rb_define_const(mNative, "NATIVE_FRAMES", strobe_native_available() ? Qtrue : Qfalse);
    rb_define_singleton_method(mNative, "trace_start", native_trace_start, 7);
    rb_define_singleton_method(mNative, "trace_active?", native_trace_active_p, 0);
    rb_define_singleton_method(mNative, "round", native_round, 0);
    rb_define_singleton_method(mNative, "stop_round", native_stop_round, 1);
    rb_define_singleton_method(mNative, "stop", native_stop, 0);
    rb_define_singleton_method(mNative, "running?", native_running_p, 0);
    rb_define_singleton_method(mNative, "thread_registry", native_thread_registry, 0);
    rb_define_singleton_method(mNative, "native_symbol", native_symbol, 1);
    /* On Strobe itself, so the sampled leaf reads "Strobe.sample". */
    rb_define_singleton_method(mStrobe, "sample", native_sample, 0);
    rb_define_singleton_method(mStrobe, "run", strobe_run, -1);
    rb_define_singleton_method(mStrobe, "stop", strobe_stop, 0);
    rb_define_singleton_method(mStrobe, "running?", native_running_p, 0);
    rb_define_singleton_method(mNative, "define_stackprof", native_define_stackprof, 1);
    rb_define_singleton_method(mNative, "results", native_results, 0);
    rb_define_singleton_method(mNative, "memsize", native_memsize, 0);
    rb_define_singleton_method(mNative, "snapshot", native_snapshot, 1);
    rb_define_singleton_method(mNative, "retime", native_retime, 1);
    rb_define_singleton_method(mNative, "exclude_current_thread", native_exclude_current_thread, 0);
    rb_define_singleton_method(mNative, "scope_enter", native_scope_enter, 0);
    rb_define_singleton_method(mNative, "scope_leave", native_scope_leave, 1);
    rb_define_singleton_method(mNative, "scope_threads", native_scope_threads, 1);
    rb_define_const(mNative, "SCOPE_KEY", strobe_sampler_scope_key());
    rb_define_singleton_method(mNative, "close_in_children", native_close_in_children, 1);
    /* Signal name for Signal.trap / Process.kill (tests deliver it). */
    rb_define_const(mNative, "SIGNAL", rb_str_new_cstr(STROBE_SIGNAL_TRAP));
    /* Whether scheduler: :thread can read threads other than the running
     * one (Ruby 3.2+'s rb_profile_thread_frames). */
#ifdef HAVE_RB_PROFILE_THREAD_FRAMES
    rb_define_const(mNative, "THREAD_FRAMES", Qtrue);
#else
    rb_define_const(mNative, "THREAD_FRAMES", Qfalse);
#endif
    /* Whether time-mode samples carry GVL states (Ruby 3.2+'s GVL events). */
#ifdef HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK
    rb_define_const(mNative, "GVL_STATES", Qtrue);
#else
    rb_define_const(mNative, "GVL_STATES", Qfalse);
#endif
    strobe_stacks_define(mStrobe);
    strobe_compact_define(mNative);
    strobe_json_columns_define(mNative);
    strobe_subset_define(mNative);
    strobe_report_define(mNative);
    strobe_export_define(mNative);
    strobe_flamegraph_define(mNative);
    strobe_trace_define(mNative);
    strobe_markers_define(mNative);
    strobe_sigstack_define(mNative);
}
