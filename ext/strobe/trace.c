/*
 * trace.c - exact tracing (mode: :trace): every method call and return,
 * counted and timed, in C, from Ruby's event hooks (call, return, c_call,
 * c_return, and fiber switches).
 *
 * A method is its (defined class, method id) pair, interned on first sight
 * into a method table (open addressing), where its name, file and line are
 * made once, in C (the hook runs no Ruby code: a thread switch or an
 * exception there would reach the traced program), and whether exclude:
 * drops it. Each thread keeps, for each of
 * its fibers, a stack of open calls (method, start, time spent in callees),
 * and per method its calls, total time (recursion counted once: only the
 * outermost call of a method adds it) and self time, and per caller ->
 * callee edge its calls and time (again only the callee's outermost calls). Times are a clock read per event: the
 * thread's own CPU clock (clock: :cpu), or for :wall the CPU's time-stamp
 * counter where the kernel itself keeps time with it (its clocksource is
 * "tsc": constant rate, synchronised across CPUs), converted to nanoseconds
 * against CLOCK_MONOTONIC read at start and stop (reading CLOCK_MONOTONIC
 * at each event took a third of the tracer's time), else CLOCK_MONOTONIC. A
 * fiber's time stops while it is switched out, so its open calls are not
 * charged with the time of others. An excluded method is not pushed: its
 * time stays in its caller's self time, and its callees are its caller's.
 * A return without its call on the stack (tracing began below it) is
 * ignored; a return that skips open calls (an exception unwinding C code)
 * closes them on the way.
 *
 * Every hook runs with the GVL held, so the tables need no lock; one
 * thread's state is found through a thread-local pointer. Nothing here is
 * signal-safe. The holder object marks (and pins) the classes, symbols,
 * Threads and fibers the tables hold.
 */
#include "trace.h"
#include "clock.h"
#include "sampler.h"
#include "threads.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define HAVE_TSC 1
#endif

typedef struct {
    VALUE klass, mid;        /* identity: defined class (for a singleton method of
                              * an object that is no Module: the object's class,
                              * so the object is not kept), method id (Symbol) */
    int singleton;           /* klass stands for the singleton classes of its instances */
    VALUE name, file;        /* Strings, made on first sight without running Ruby code */
    int line;
    int excluded;
} tmethod_t;

typedef struct {
    uint32_t method;
    int64_t start, child;    /* the fiber's clock at the call; time in callees */
} tcall_t;

typedef struct {
    VALUE fiber;
    tcall_t *calls;
    uint32_t len, capa;
    int64_t paused;          /* time switched out, taken off the fiber's clock */
    int64_t out_at;          /* when it was switched out (0: running) */
} tstack_t;

typedef struct {
    uint64_t calls;
    int64_t total, self;
    uint32_t active;         /* open calls of the method on this thread (recursion) */
} tstat_t;

typedef struct {
    uint64_t key;            /* caller << 32 | callee, + 1; 0 empty */
    uint64_t calls;
    int64_t time;
} tedge_t;

typedef struct tthread {
    VALUE thread;
    pid_t tid;
    int ignored;             /* not profiled (threads:, Strobe's own) */
    clockid_t clock;
    /* One stack per fiber with calls open, found by the fiber VALUE through
     * an open-addressing index (fibers are not kept alive: a stack that
     * empties is dropped as its fiber switches out). */
    tstack_t **stacks;       /* by index slot, NULL empty, TOMB deleted */
    uint32_t stacks_used, stacks_capa;
    tstack_t *cur;
    tstat_t *stats;          /* by method */
    uint32_t stats_capa;
    tedge_t *edges;          /* open addressing */
    uint32_t edges_len, edges_capa;
} tthread_t;

static struct {
    int running, active;     /* hooks on; something traced since the last results */
    int cpu;                 /* clock: :cpu */
    int tsc;                 /* :wall times are time-stamp counter ticks */
    int64_t tsc_start, tsc_stop; /* the counter, and CLOCK_MONOTONIC, at start and stop */
    VALUE exclude_names, exclude_paths, exclude_patterns; /* exclude:, as Arrays, or Qnil */
    uint64_t generation;     /* per start from clean: thread states of older ones are stale */
    tmethod_t *methods;
    uint32_t methods_len, methods_capa;
    uint32_t *slots;         /* (klass, mid) -> method + 1 */
    uint32_t slots_capa;
    tthread_t **threads;
    uint32_t threads_len, threads_capa;
    int64_t start_wall, stop_wall, started_at_us;
    VALUE holder;
} T;

/* The calling thread's state, valid while self_generation is the trace's
 * (a state of an earlier trace is freed: never read through). */
static __thread tthread_t *self_state __attribute__((tls_model("initial-exec")));
static __thread uint64_t self_generation __attribute__((tls_model("initial-exec")));
static VALUE mStrobe, sym_name, sym_file, sym_line, sym_calls, sym_total_time, sym_self_time, sym_total_samples,
    sym_samples, sym_edges, sym_call_times;

/* The thread's clock: CPU nanoseconds, monotonic nanoseconds, or counter
 * ticks (T.tsc; converted in results). */
static inline int64_t
now_ns(const tthread_t *t)
{
#ifdef HAVE_TSC
    if (T.tsc && t->clock == CLOCK_MONOTONIC) return (int64_t)__rdtsc();
#endif
    return strobe_clock_ns(t->clock);
}

/* Whether the kernel keeps time with the time-stamp counter. */
static int
tsc_usable(void)
{
#ifdef HAVE_TSC
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    if (!f) return 0;
    char name[32] = { 0 };
    int ok = fgets(name, sizeof(name), f) && strcmp(name, "tsc\n") == 0;
    fclose(f);
    return ok;
#else
    return 0;
#endif
}

/* Nanoseconds per unit of a :wall time. */
static double
time_scale(void)
{
#ifdef HAVE_TSC
    if (T.tsc && !T.cpu && T.tsc_stop > T.tsc_start)
        return (double)(T.stop_wall - T.start_wall) / (double)(T.tsc_stop - T.tsc_start);
#endif
    return 1.0;
}

/* ---- methods ---------------------------------------------------------------- */

static inline uint64_t
method_hash(VALUE klass, VALUE mid, int singleton)
{
    uint64_t x = ((uint64_t)klass + (uint64_t)singleton) * 0x9e3779b97f4a7c15ULL ^ (uint64_t)mid;
    x ^= x >> 29;
    return x * 0xbf58476d1ce4e5b9ULL;
}

static void
rehash_methods(void)
{
    uint32_t capa = T.slots_capa ? T.slots_capa * 2 : 1024;
    uint32_t *slots = calloc(capa, sizeof(uint32_t));
    if (!slots) rb_memerror();
    for (uint32_t m = 0; m < T.methods_len; m++) {
        uint64_t i = method_hash(T.methods[m].klass, T.methods[m].mid, T.methods[m].singleton) & (capa - 1);
        while (slots[i]) i = (i + 1) & (capa - 1);
        slots[i] = m + 1;
    }
    free(T.slots);
    T.slots = slots;
    T.slots_capa = capa;
}

/* A module's name, or for an anonymous one "#<Class:0x...>" (never its
 * own inspect: no Ruby code runs in the hook). */
static VALUE
module_name(VALUE mod)
{
    if (!RB_TYPE_P(mod, T_CLASS) && !RB_TYPE_P(mod, T_MODULE)) return rb_str_new_cstr("?");
    VALUE name = rb_mod_name(mod);
    return NIL_P(name) ? rb_any_to_s(mod) : rb_str_dup(name);
}

/* The (class, singleton) a call's defined class stands for: a singleton
 * class of a Module is itself (Klass.name); one of any other object stands
 * for that object's class, so the object is not kept by the table and its
 * methods share one entry per class. */
static VALUE
identity_class(VALUE klass, int *singleton)
{
    *singleton = 0;
    if (!RB_TYPE_P(klass, T_CLASS) || !FL_TEST(klass, FL_SINGLETON)) return klass;
#ifdef HAVE_RB_CLASS_ATTACHED_OBJECT
    VALUE owner = rb_class_attached_object(klass);
#else
    VALUE owner = rb_ivar_get(klass, rb_intern("__attached__"));
#endif
    if (RB_TYPE_P(owner, T_CLASS) || RB_TYPE_P(owner, T_MODULE)) return klass;
    *singleton = 1;
    return rb_obj_class(owner);
}

/* "Klass#name"; "Klass.name" for a singleton method of a Module (as Ruby's
 * own frame labels read); "Klass#name (singleton)" for one of an object
 * (klass: its class). Made in C only: nothing here runs Ruby code. */
static VALUE
method_name(VALUE klass, VALUE defined, VALUE mid, int singleton)
{
    VALUE name, sep = rb_str_new_cstr("#");
    if (singleton) {
        name = module_name(klass);
    } else if (RB_TYPE_P(defined, T_CLASS) && FL_TEST(defined, FL_SINGLETON)) {
#ifdef HAVE_RB_CLASS_ATTACHED_OBJECT
        name = module_name(rb_class_attached_object(defined));
#else
        name = module_name(rb_ivar_get(defined, rb_intern("__attached__")));
#endif
        sep = rb_str_new_cstr(".");
    } else if (RB_TYPE_P(defined, T_CLASS) || RB_TYPE_P(defined, T_MODULE)) {
        name = module_name(defined);
    } else {
        name = rb_str_new_cstr("?");
    }
    rb_str_append(name, sep);
    rb_str_append(name, rb_sym2str(mid));
    if (singleton) rb_str_cat_cstr(name, " (singleton)");
    return name;
}

static VALUE
expand_path(VALUE file)
{
    return rb_file_expand_path(file, Qnil);
}

static VALUE
match_pattern(VALUE args)
{
    VALUE *a = (VALUE *)args;
    return rb_reg_match(a[0], a[1]);
}

/* Whether exclude: drops the method (name, file): exact names, path
 * prefixes (ending at a directory boundary; C methods have no path), and
 * Regexps, matched in C (a Regexp that raises on a name excludes nothing). */
static int
excluded(VALUE name, VALUE file, int c_method)
{
    if (NIL_P(T.exclude_names)) return 0;
    for (long i = 0; i < RARRAY_LEN(T.exclude_names); i++)
        if (rb_str_equal(RARRAY_AREF(T.exclude_names, i), name) == Qtrue) return 1;
    if (!c_method && RB_TYPE_P(file, T_STRING) && RARRAY_LEN(T.exclude_paths) && RSTRING_LEN(file) &&
        RSTRING_PTR(file)[0] != '/' && RSTRING_PTR(file)[0] != '<' && RSTRING_PTR(file)[0] != '(') {
        /* A file loaded by a relative path: as the prefixes are, expanded. */
        int state = 0;
        VALUE full = rb_protect(expand_path, file, &state);
        if (state) rb_set_errinfo(Qnil);
        else file = full;
    }
    if (!c_method && RB_TYPE_P(file, T_STRING)) {
        const char *f = RSTRING_PTR(file);
        long flen = RSTRING_LEN(file);
        for (long i = 0; i < RARRAY_LEN(T.exclude_paths); i++) {
            VALUE prefix = RARRAY_AREF(T.exclude_paths, i);
            long plen = RSTRING_LEN(prefix);
            if (flen >= plen && memcmp(f, RSTRING_PTR(prefix), (size_t)plen) == 0 &&
                (flen == plen || f[plen] == '/' || (plen && RSTRING_PTR(prefix)[plen - 1] == '/')))
                return 1;
        }
    }
    for (long i = 0; i < RARRAY_LEN(T.exclude_patterns); i++) {
        VALUE args[2] = { RARRAY_AREF(T.exclude_patterns, i), name };
        int state = 0;
        VALUE m = rb_protect(match_pattern, (VALUE)args, &state);
        if (state) {
            rb_set_errinfo(Qnil);
            continue;
        }
        if (!NIL_P(m)) return 1;
    }
    return 0;
}

/* The method of a call or return event, interned on first sight. */
static uint32_t
method_of(rb_trace_arg_t *arg, int c_method)
{
    int singleton;
    VALUE klass = identity_class(rb_tracearg_defined_class(arg), &singleton), mid = rb_tracearg_method_id(arg);
    uint64_t i = method_hash(klass, mid, singleton) & (T.slots_capa - 1);
    for (uint32_t s; (s = T.slots[i]) != 0; i = (i + 1) & (T.slots_capa - 1)) {
        const tmethod_t *m = &T.methods[s - 1];
        if (m->klass == klass && m->mid == mid && m->singleton == singleton) return s - 1;
    }
    if (T.methods_len == T.methods_capa) {
        T.methods_capa = T.methods_capa ? T.methods_capa * 2 : 256;
        T.methods = strobe_grow(T.methods, T.methods_capa, sizeof(tmethod_t));
    }
    uint32_t id = T.methods_len;
    T.methods[id] = (tmethod_t){ klass, mid, singleton, Qnil, Qnil, 0, 0 };
    T.methods_len++; /* marked from here on */
    T.slots[i] = id + 1;
    T.methods[id].name = method_name(klass, rb_tracearg_defined_class(arg), mid, singleton);
    if (c_method) {
        T.methods[id].file = rb_str_new_cstr("<cfunc>");
    } else {
        VALUE path = rb_tracearg_path(arg), line = rb_tracearg_lineno(arg);
        T.methods[id].file = RB_TYPE_P(path, T_STRING) ? path : rb_str_new_cstr("");
        T.methods[id].line = FIXNUM_P(line) ? (int)FIX2LONG(line) : 0;
    }
    T.methods[id].excluded = excluded(T.methods[id].name, T.methods[id].file, c_method);
    if ((uint64_t)T.methods_len * 2 > T.slots_capa) rehash_methods();
    return id;
}

/* ---- threads and fibers --------------------------------------------------------- */

#define TOMB ((tstack_t *)1)

static inline uint64_t
fiber_hash(VALUE fiber)
{
    return ((uint64_t)fiber >> 3) * 0x9e3779b97f4a7c15ULL;
}

static void
index_stack(tthread_t *t, tstack_t *s)
{
    uint32_t mask = t->stacks_capa - 1;
    uint64_t i = fiber_hash(s->fiber) >> 32 & mask;
    while (t->stacks[i] && t->stacks[i] != TOMB) i = (i + 1) & mask;
    t->stacks[i] = s;
}

/* The stack of fiber, made when it has none. */
static tstack_t *
stack_of(tthread_t *t, VALUE fiber)
{
    if (t->stacks_capa) {
        uint32_t mask = t->stacks_capa - 1;
        for (uint64_t i = fiber_hash(fiber) >> 32 & mask; t->stacks[i]; i = (i + 1) & mask)
            if (t->stacks[i] != TOMB && t->stacks[i]->fiber == fiber) return t->stacks[i];
    }
    if ((uint64_t)(t->stacks_used + 1) * 2 > t->stacks_capa) {
        uint32_t old = t->stacks_capa, capa = old ? old * 2 : 8;
        tstack_t **slots = t->stacks;
        t->stacks = calloc(capa, sizeof(tstack_t *));
        if (!t->stacks) { t->stacks = slots; rb_memerror(); }
        t->stacks_capa = capa;
        t->stacks_used = 0;
        for (uint32_t k = 0; k < old; k++)
            if (slots[k] && slots[k] != TOMB) { index_stack(t, slots[k]); t->stacks_used++; }
        free(slots);
    }
    tstack_t *s = calloc(1, sizeof(*s));
    if (!s) rb_memerror();
    s->fiber = fiber;
    index_stack(t, s);
    t->stacks_used++;
    return s;
}

/* A stack whose fiber switched out with no call open is dropped: the fiber
 * may be gone for good, and is not kept alive to tell. */
static void
drop_if_empty(tthread_t *t, tstack_t *s)
{
    if (s->len) return;
    uint32_t mask = t->stacks_capa - 1;
    for (uint64_t i = fiber_hash(s->fiber) >> 32 & mask; t->stacks[i]; i = (i + 1) & mask)
        if (t->stacks[i] == s) {
            t->stacks[i] = TOMB;
            break;
        }
    free(s->calls);
    free(s);
}

/* The calling thread's state, made on its first event of this trace (a
 * thread that begins forgets the state of its native thread's previous
 * Thread: Ruby 3.1 reuses native threads). */
static tthread_t *
thread_state(void)
{
    if (self_state && self_generation == T.generation) return self_state;
    tthread_t *t;
    if (T.threads_len == T.threads_capa) {
        T.threads_capa = T.threads_capa ? T.threads_capa * 2 : 16;
        T.threads = strobe_grow(T.threads, T.threads_capa, sizeof(tthread_t *));
    }
    t = calloc(1, sizeof(*t));
    if (!t) rb_memerror();
    t->thread = rb_thread_current();
    t->tid = strobe_gettid();
    t->ignored = !strobe_sampler_profiled(t->thread);
    t->clock = CLOCK_MONOTONIC;
    if (T.cpu && pthread_getcpuclockid(pthread_self(), &t->clock) != 0) t->clock = CLOCK_THREAD_CPUTIME_ID;
    T.threads[T.threads_len++] = t;
    t->cur = stack_of(t, rb_fiber_current());
    self_state = t;
    self_generation = T.generation;
    return t;
}

static tstat_t *
stat_of(tthread_t *t, uint32_t m)
{
    if (m >= t->stats_capa) {
        uint32_t capa = t->stats_capa ? t->stats_capa : 256;
        while (capa <= m) capa *= 2;
        t->stats = strobe_grow(t->stats, capa, sizeof(tstat_t));
        memset(t->stats + t->stats_capa, 0, (capa - t->stats_capa) * sizeof(tstat_t));
        t->stats_capa = capa;
    }
    return &t->stats[m];
}

static void
edge_add(tthread_t *t, uint32_t caller, uint32_t callee, int64_t time)
{
    if ((uint64_t)(t->edges_len + 1) * 2 > t->edges_capa) {
        uint32_t capa = t->edges_capa ? t->edges_capa * 2 : 256;
        tedge_t *edges = calloc(capa, sizeof(tedge_t));
        if (!edges) rb_memerror();
        for (uint32_t k = 0; k < t->edges_capa; k++) {
            if (!t->edges[k].key) continue;
            uint64_t i = (t->edges[k].key * 0x9e3779b97f4a7c15ULL) >> 32 & (capa - 1);
            while (edges[i].key) i = (i + 1) & (capa - 1);
            edges[i] = t->edges[k];
        }
        free(t->edges);
        t->edges = edges;
        t->edges_capa = capa;
    }
    uint64_t key = ((uint64_t)caller << 32 | callee) + 1;
    uint64_t i = (key * 0x9e3779b97f4a7c15ULL) >> 32 & (t->edges_capa - 1);
    while (t->edges[i].key && t->edges[i].key != key) i = (i + 1) & (t->edges_capa - 1);
    if (!t->edges[i].key) {
        t->edges[i].key = key;
        t->edges_len++;
    }
    t->edges[i].calls++;
    t->edges[i].time += time;
}

/* ---- the hook ------------------------------------------------------------------- */

static void
push_call(tthread_t *t, uint32_t m, int64_t now)
{
    tstack_t *s = t->cur;
    if (s->len == s->capa) {
        s->capa = s->capa ? s->capa * 2 : 64;
        s->calls = strobe_grow(s->calls, s->capa, sizeof(tcall_t));
    }
    s->calls[s->len++] = (tcall_t){ m, now - s->paused, 0 };
    tstat_t *st = stat_of(t, m);
    st->calls++;
    st->active++;
}

/* Closes the innermost open call at the fiber's time now. */
static void
pop_call(tthread_t *t, tstack_t *s, int64_t now)
{
    tcall_t c = s->calls[--s->len];
    int64_t elapsed = now - c.start;
    if (elapsed < 0) elapsed = 0;
    tstat_t *st = stat_of(t, c.method);
    st->self += elapsed - c.child;
    /* The outermost call of a recursion adds the time to the method's
     * total and to its caller edge's: inner ones are inside it already. */
    int outermost = --st->active == 0;
    if (outermost) st->total += elapsed;
    if (s->len) {
        s->calls[s->len - 1].child += elapsed;
        edge_add(t, s->calls[s->len - 1].method, c.method, outermost ? elapsed : 0);
    }
}

static void
trace_hook(VALUE data, rb_trace_arg_t *arg)
{
    (void)data;
    rb_event_flag_t event = rb_tracearg_event_flag(arg);
    if (event == RUBY_EVENT_THREAD_BEGIN) {
        self_state = NULL;
        return;
    }
    tthread_t *t = thread_state();
    if (t->ignored) return;
    int64_t now = now_ns(t);
    if (event == RUBY_EVENT_FIBER_SWITCH) {
        /* The thread's open-call counts (for recursion) are the running
         * fiber's: the calls open in the one leaving come off them. */
        tstack_t *out = t->cur;
        for (uint32_t k = 0; k < out->len; k++) stat_of(t, out->calls[k].method)->active--;
        out->out_at = now;
        tstack_t *s = stack_of(t, rb_fiber_current());
        if (s != out) drop_if_empty(t, out);
        if (s->out_at) s->paused += now - s->out_at;
        s->out_at = 0;
        for (uint32_t k = 0; k < s->len; k++) stat_of(t, s->calls[k].method)->active++;
        t->cur = s;
        return;
    }
    int c_method = event & (RUBY_EVENT_C_CALL | RUBY_EVENT_C_RETURN);
    uint32_t m = method_of(arg, c_method);
    if (T.methods[m].excluded) return;
    if (event & (RUBY_EVENT_CALL | RUBY_EVENT_C_CALL)) {
        push_call(t, m, now);
        return;
    }
    tstack_t *s = t->cur;
    uint32_t at = s->len;
    while (at > 0 && s->calls[at - 1].method != m) at--;
    if (at == 0) return; /* its call was before tracing began */
    int64_t local = now - s->paused;
    while (s->len >= at) pop_call(t, s, local);
}

/* ---- start, stop, results -------------------------------------------------------- */

static void
trace_clear(void)
{
    for (uint32_t i = 0; i < T.threads_len; i++) {
        tthread_t *t = T.threads[i];
        for (uint32_t k = 0; k < t->stacks_capa; k++)
            if (t->stacks[k] && t->stacks[k] != TOMB) {
                free(t->stacks[k]->calls);
                free(t->stacks[k]);
            }
        free(t->stacks);
        free(t->stats);
        free(t->edges);
        free(t);
    }
    free(T.threads);
    free(T.methods);
    free(T.slots);
    T.threads = NULL;
    T.methods = NULL;
    T.slots = NULL;
    T.exclude_names = T.exclude_paths = T.exclude_patterns = Qnil;
    T.threads_len = T.threads_capa = T.methods_len = T.methods_capa = T.slots_capa = 0;
    T.active = 0;
}

int
strobe_trace_running(void)
{
    return T.running;
}

int
strobe_trace_active(void)
{
    return T.active;
}

/* GVL held. cpu: each thread's own CPU clock; names, paths, patterns:
 * exclude:'s Arrays of Strings, path prefixes and Regexps (or nil). Rounds
 * accumulate until results, as sampling's do; a later round keeps the
 * first one's settings (lib/strobe.rb refuses different ones). */
void
strobe_trace_start(int cpu, VALUE names, VALUE paths, VALUE patterns)
{
    if (!T.active) {
        trace_clear();
        T.generation++;
        T.active = 1;
        T.tsc = tsc_usable();
        T.start_wall = strobe_clock_ns(CLOCK_MONOTONIC);
#ifdef HAVE_TSC
        T.tsc_start = (int64_t)__rdtsc();
#endif
        T.started_at_us = strobe_clock_ns(CLOCK_REALTIME) / 1000;
        rehash_methods();
        T.cpu = cpu;
        T.exclude_names = names;
        T.exclude_paths = paths;
        T.exclude_patterns = patterns;
    }
    T.running = 1;
    rb_add_event_hook2((rb_event_hook_func_t)(void (*)(void))trace_hook,
                       RUBY_EVENT_CALL | RUBY_EVENT_RETURN | RUBY_EVENT_C_CALL | RUBY_EVENT_C_RETURN |
                           RUBY_EVENT_FIBER_SWITCH | RUBY_EVENT_THREAD_BEGIN,
                       Qnil, RUBY_EVENT_HOOK_FLAG_SAFE | RUBY_EVENT_HOOK_FLAG_RAW_ARG);
}

/* Stops: calls still open are closed at this moment, so the code that
 * started tracing (a block's callers) has its time up to now. */
void
strobe_trace_stop(void)
{
    if (!T.running) return;
    rb_remove_event_hook((rb_event_hook_func_t)(void (*)(void))trace_hook);
    T.running = 0;
    T.stop_wall = strobe_clock_ns(CLOCK_MONOTONIC);
#ifdef HAVE_TSC
    T.tsc_stop = (int64_t)__rdtsc();
#endif
    for (uint32_t i = 0; i < T.threads_len; i++) {
        tthread_t *t = T.threads[i];
        int64_t now = t->tid == strobe_gettid() || !T.cpu ? now_ns(t) : -1;
        /* A CPU clock of another thread: read, or if it is gone, close at
         * the last call's start (nothing more is known). */
        if (now < 0) now = strobe_clock_ns(t->clock);
        /* The running fiber's calls are counted open (active); those of
         * suspended fibers are added in to be closed the same way. */
        for (uint32_t k = 0; k < t->stacks_capa; k++) {
            tstack_t *s = t->stacks[k];
            if (!s || s == TOMB || s == t->cur) continue;
            for (uint32_t c = 0; c < s->len; c++) stat_of(t, s->calls[c].method)->active++;
        }
        for (uint32_t k = 0; k < t->stacks_capa; k++) {
            tstack_t *s = t->stacks[k];
            if (!s || s == TOMB) continue;
            int64_t at = now >= 0 ? now : s->len ? s->calls[s->len - 1].start + s->paused : 0;
            int64_t local = (s->out_at ? s->out_at : at) - s->paused;
            while (s->len) pop_call(t, s, local);
        }
    }
}

static double scale; /* set by trace_results: nanoseconds per time unit */

static VALUE
seconds(int64_t t)
{
    return DBL2NUM((double)t * scale / 1e9);
}

static VALUE
frame_hash(uint32_t m, const tstat_t *st)
{
    const tmethod_t *meth = &T.methods[m];
    VALUE f = rb_hash_new();
    rb_hash_aset(f, sym_name, meth->name);
    rb_hash_aset(f, sym_file, meth->file);
    if (meth->line > 0) rb_hash_aset(f, sym_line, INT2NUM(meth->line));
    rb_hash_aset(f, sym_calls, ULL2NUM(st->calls));
    rb_hash_aset(f, sym_total_time, seconds(st->total));
    rb_hash_aset(f, sym_self_time, seconds(st->self));
    /* For the sample-count reports: microseconds. */
    rb_hash_aset(f, sym_total_samples, LL2NUM((int64_t)((double)st->total * scale / 1000)));
    rb_hash_aset(f, sym_samples, LL2NUM((int64_t)((double)st->self * scale / 1000)));
    return f;
}

/* Strobe::Native.trace_results -> the trace's result Hash (nil when
 * nothing was traced); forgets it. */
static VALUE
trace_results(VALUE self)
{
    if (T.running || !T.active) return Qnil;
    scale = time_scale();
    tstat_t *sum = calloc(T.methods_len ? T.methods_len : 1, sizeof(tstat_t));
    if (!sum) rb_memerror();
    VALUE result = rb_hash_new(), frames = rb_hash_new(), threads = rb_hash_new();
    uint64_t calls = 0;
    for (uint32_t i = 0; i < T.threads_len; i++) {
        tthread_t *t = T.threads[i];
        if (t->ignored) continue;
        /* Threads that ran on one kernel thread in turn (Ruby 3.1 reuses
         * them) share its id: their counts add up under it. */
        VALUE id = INT2NUM(t->tid);
        VALUE info = rb_hash_lookup2(threads, id, Qnil), tframes;
        if (NIL_P(info)) {
            info = rb_hash_new();
            tframes = rb_hash_new();
            rb_hash_aset(info, strobe_sym("frames"), tframes);
            rb_hash_aset(threads, id, info);
        } else {
            tframes = rb_hash_lookup2(info, strobe_sym("frames"), Qnil);
        }
        uint64_t tcalls = 0;
        for (uint32_t m = 0; m < t->stats_capa && m < T.methods_len; m++) {
            const tstat_t *st = &t->stats[m];
            if (!st->calls) continue;
            sum[m].calls += st->calls;
            sum[m].total += st->total;
            sum[m].self += st->self;
            tcalls += st->calls;
            VALUE tf = rb_hash_lookup2(tframes, UINT2NUM(m), Qnil);
            uint64_t c = st->calls;
            int64_t total = st->total, self_time = st->self;
            if (!NIL_P(tf)) { /* another Thread on the same kernel thread */
                c += NUM2ULL(rb_hash_aref(tf, sym_calls));
                total += (int64_t)(NUM2DBL(rb_hash_aref(tf, sym_total_time)) * 1e9 / scale);
                self_time += (int64_t)(NUM2DBL(rb_hash_aref(tf, sym_self_time)) * 1e9 / scale);
            }
            tf = rb_hash_new();
            rb_hash_aset(tf, sym_calls, ULL2NUM(c));
            rb_hash_aset(tf, sym_total_time, seconds(total));
            rb_hash_aset(tf, sym_self_time, seconds(self_time));
            rb_hash_aset(tframes, UINT2NUM(m), tf);
        }
        calls += tcalls;
        VALUE before = rb_hash_lookup2(info, sym_calls, INT2FIX(0));
        tcalls += NUM2ULL(before);
        VALUE name = rb_funcall(t->thread, rb_intern("name"), 0);
        if (!NIL_P(name) || NIL_P(rb_hash_lookup2(info, sym_name, Qnil)))
            rb_hash_aset(info, sym_name, NIL_P(name) ? Qnil : rb_str_dup(name));
        if (t->thread == rb_thread_main()) rb_hash_aset(info, strobe_sym("main"), Qtrue);
        rb_hash_aset(info, sym_samples, ULL2NUM(tcalls)); /* as the result's samples: its calls */
        rb_hash_aset(info, sym_calls, ULL2NUM(tcalls));
    }
    for (uint32_t m = 0; m < T.methods_len; m++)
        if (sum[m].calls) rb_hash_aset(frames, UINT2NUM(m), frame_hash(m, &sum[m]));
    free(sum);
    /* Edges, summed over threads. */
    for (uint32_t i = 0; i < T.threads_len; i++) {
        tthread_t *t = T.threads[i];
        if (t->ignored) continue;
        for (uint32_t k = 0; k < t->edges_capa; k++) {
            const tedge_t *e = &t->edges[k];
            if (!e->key) continue;
            uint64_t key = e->key - 1;
            VALUE caller = UINT2NUM((uint32_t)(key >> 32)), callee = UINT2NUM((uint32_t)key);
            VALUE f = rb_hash_lookup2(frames, caller, Qnil);
            if (NIL_P(f)) continue;
            VALUE edges = rb_hash_lookup2(f, sym_edges, Qnil), times = rb_hash_lookup2(f, sym_call_times, Qnil);
            if (NIL_P(edges)) {
                rb_hash_aset(f, sym_edges, edges = rb_hash_new());
                rb_hash_aset(f, sym_call_times, times = rb_hash_new());
            }
            VALUE n = rb_hash_lookup2(edges, callee, INT2FIX(0)), tm = rb_hash_lookup2(times, callee, DBL2NUM(0));
            rb_hash_aset(edges, callee, rb_funcall(n, '+', 1, ULL2NUM(e->calls)));
            rb_hash_aset(times, callee, DBL2NUM(NUM2DBL(tm) + (double)e->time * scale / 1e9));
        }
    }
    rb_hash_aset(result, strobe_sym("version"), DBL2NUM(1.2));
    rb_hash_aset(result, strobe_sym("mode"), strobe_sym("trace"));
    rb_hash_aset(result, strobe_sym("clock"), strobe_sym(T.cpu ? "cpu" : "wall"));
    rb_hash_aset(result, strobe_sym("interval"), Qnil);
    rb_hash_aset(result, strobe_sym("samples"), ULL2NUM(calls));
    rb_hash_aset(result, strobe_sym("calls"), ULL2NUM(calls));
    rb_hash_aset(result, strobe_sym("gc_samples"), INT2FIX(0));
    rb_hash_aset(result, strobe_sym("missed_samples"), INT2FIX(0));
    rb_hash_aset(result, strobe_sym("metadata"), rb_hash_new());
    rb_hash_aset(result, strobe_sym("frames"), frames);
    rb_hash_aset(result, strobe_sym("threads"), threads);
    rb_hash_aset(result, strobe_sym("started_at"), LL2NUM(T.started_at_us));
    rb_hash_aset(result, strobe_sym("duration"), LL2NUM((T.stop_wall - T.start_wall) / 1000));
    rb_hash_aset(result, strobe_sym("pid"), INT2NUM(getpid()));
    trace_clear();
    return result;
}

static void
holder_mark(void *unused)
{
    (void)unused;
    for (uint32_t m = 0; m < T.methods_len; m++) {
        rb_gc_mark(T.methods[m].klass);
        rb_gc_mark(T.methods[m].mid);
        rb_gc_mark(T.methods[m].name);
        rb_gc_mark(T.methods[m].file);
    }
    for (uint32_t i = 0; i < T.threads_len; i++) rb_gc_mark(T.threads[i]->thread);
    rb_gc_mark(T.exclude_names);
    rb_gc_mark(T.exclude_paths);
    rb_gc_mark(T.exclude_patterns);
}

static const rb_data_type_t holder_type = {
    .wrap_struct_name = "Strobe::Native::Trace",
    .function = { .dmark = holder_mark },
};

void
strobe_trace_define(VALUE mNative)
{
    mStrobe = rb_define_module("Strobe");
    sym_name = ID2SYM(rb_intern("name"));
    sym_file = ID2SYM(rb_intern("file"));
    sym_line = ID2SYM(rb_intern("line"));
    sym_calls = ID2SYM(rb_intern("calls"));
    sym_total_time = ID2SYM(rb_intern("total_time"));
    sym_self_time = ID2SYM(rb_intern("self_time"));
    sym_total_samples = ID2SYM(rb_intern("total_samples"));
    sym_samples = ID2SYM(rb_intern("samples"));
    sym_edges = ID2SYM(rb_intern("edges"));
    sym_call_times = ID2SYM(rb_intern("call_times"));
    /* Ruby skips dmark for a NULL data pointer: point at the state. */
    T.exclude_names = T.exclude_paths = T.exclude_patterns = Qnil;
    T.holder = TypedData_Wrap_Struct(rb_cObject, &holder_type, &T);
    rb_gc_register_mark_object(T.holder);
    rb_define_singleton_method(mNative, "trace_results", trace_results, 0);
}
