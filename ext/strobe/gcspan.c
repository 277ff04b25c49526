/*
 * gcspan.c - GC time in the time modes, counted from GC hooks.
 *
 * A signal sent while a thread runs GC is often handled late or not at
 * all at high rates: with interval: 100, 20 GC.start on a heap of 300,000
 * strings gave 907 samples and 901 missed, where stackprof recorded 3,600
 * of 3,610. GC runs on the thread that holds the GVL, from GC_ENTER to
 * GC_EXIT, and Ruby's internal GC events say where marking and sweeping
 * end. So in :wall and :cpu the hooks measure each GC of a profiled thread
 * and record its samples themselves: one per interval of the thread's wall
 * time (:wall) or CPU time (:cpu) in GC, the remainder carried to the next
 * GC so the rate is exact, each phase as its own pseudo-frame ("(marking)",
 * "(sweeping)", "(garbage collection)" for the rest: compaction, the
 * finishing steps), at evenly spread times within it. Meanwhile the
 * handler takes no sample of that thread and the timer neither signals it
 * nor counts its ticks missed (strobe_gcspan_counts); in :cpu the timer is
 * credited the CPU time GC used. The other threads cannot run Ruby code
 * meanwhile, and their frames cannot be read while GC may move objects:
 * in :wall the timer records their latest stacks again (they were taken
 * as samples of GC before, GC counted once per thread); a handler that
 * interrupts one of them during that GC counts its sample missed.
 *
 * Each pause of a profiled thread (GC_ENTER to GC_EXIT) is also a marker on
 * its timeline (markers.c): its phases and why it ran.
 *
 * The hooks run inside GC, GVL held: they allocate no Ruby object. Each
 * phase's samples go in under the profile lock after the ring is drained,
 * so a thread's samples stay in time order. Nothing here runs in a signal
 * handler except strobe_gcspan_counts (an atomic load).
 */
#include "gcspan.h"
#include "capture.h"
#include "clock.h"
#include "profile.h"
#include "sampler.h"
#include <ruby/debug.h>

#define FILL_BATCH 64

static VALUE hook = Qnil;
static VALUE sym_state, sym_sweeping, sym_gc_by, sym_major_by;

static atomic_int under_way; /* a counted GC runs now */

static struct {
    atomic_int active;
    strobe_mode_t mode;
    int64_t interval_ns;
    int64_t carry_ns;      /* GC time not yet making up a sample */
    strobe_thread_t *t;    /* the thread in GC now, NULL none */
    int kind;              /* the phase under way: STROBE_FRAME_* */
    int64_t at_ns;         /* its start: the mode's clock */
    int64_t at_us;         /* its start: CLOCK_MONOTONIC microseconds */
    int64_t entered_cpu_ns; /* :cpu: the thread's CPU time at GC_ENTER */
    int64_t entered_us;    /* the pause's start: CLOCK_MONOTONIC microseconds */
    int phases;            /* STROBE_GC_* the pause ran so far (its marker's) */
} G;

int
strobe_gcspan_under_way(void)
{
    return atomic_load_explicit(&under_way, memory_order_relaxed);
}

int
strobe_gcspan_counts(const strobe_thread_t *t)
{
    return atomic_load_explicit(&t->in_gc, memory_order_relaxed);
}

static int64_t
clock_now_ns(void)
{
    return strobe_clock_ns(G.mode == STROBE_MODE_CPU ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC);
}

/* The phase GC is in as it enters: a GC that starts from none marks first. */
static int
phase_now(void)
{
    VALUE state = rb_gc_latest_gc_info(sym_state);
    return state == sym_sweeping ? STROBE_FRAME_SWEEPING : STROBE_FRAME_MARKING;
}

struct fill {
    strobe_thread_t *t;
    int kind;
    int64_t from_us, to_us;
    uint64_t n, done;
};

/* Under the profile lock: what the handlers captured first (order), then
 * the phase's samples, evenly spread over it. Progress is kept in f, so
 * running out of memory part way leaves the rest to be counted missed. */
static void
record_fill(void *arg)
{
    struct fill *f = arg;
    strobe_capture_drain(strobe_profile_record_slot);
    int64_t times[FILL_BATCH];
    uint8_t states[FILL_BATCH];
    uint8_t state = atomic_load(&f->t->gvl_state);
    int64_t span = f->to_us - f->from_us;
    while (f->done < f->n) {
        uint32_t batch = f->n - f->done < FILL_BATCH ? (uint32_t)(f->n - f->done) : FILL_BATCH;
        for (uint32_t i = 0; i < batch; i++) {
            uint64_t k = f->done + i;
            times[i] = f->from_us + (int64_t)((double)span * (double)(k + 1) / (double)(f->n + 1));
            states[i] = state;
        }
        strobe_profile_record(f->t, f->kind, NULL, NULL, 0, times, states, batch);
        f->done += batch;
    }
}

/* The phase under way ends now: its samples are recorded. */
static void
end_phase(int next_kind)
{
    int64_t now_ns = clock_now_ns(), now_us = strobe_now_us();
    int64_t spent = now_ns - G.at_ns;
    if (spent < 0) spent = 0;
    int64_t total = G.carry_ns + spent;
    uint64_t n = (uint64_t)(total / G.interval_ns);
    G.carry_ns = total % G.interval_ns;
    if (n) {
        struct fill f = { G.t, G.kind, G.at_us, now_us, n, 0 };
        if (strobe_profile_locked(record_fill, &f) < 0) strobe_profile_add_missed(f.n - f.done);
    }
    G.kind = next_kind;
    G.at_ns = now_ns;
    G.at_us = now_us;
}

static void
gc_hook(VALUE tpval, void *data)
{
    (void)data;
    if (!atomic_load(&G.active)) return;
    rb_event_flag_t event = rb_tracearg_event_flag(rb_tracearg_from_tracepoint(tpval));
    if (event == RUBY_INTERNAL_EVENT_GC_ENTER) {
        strobe_thread_t *t = strobe_threads_self();
        if (!t || atomic_load(&t->state) != STROBE_THREAD_LIVE || !strobe_sampler_sampled(t)) return;
        G.t = t;
        G.kind = phase_now();
        G.at_ns = clock_now_ns();
        G.at_us = strobe_now_us();
        if (G.mode == STROBE_MODE_CPU) G.entered_cpu_ns = G.at_ns;
        G.entered_us = G.at_us;
        G.phases = G.kind == STROBE_FRAME_SWEEPING ? STROBE_GC_SWEEPING : STROBE_GC_MARKING;
        atomic_store(&t->in_gc, 1);
        atomic_store(&under_way, 1);
        return;
    }
    if (!G.t) return; /* a GC of a thread not profiled */
    if (event == RUBY_INTERNAL_EVENT_GC_END_MARK) {
        end_phase(STROBE_FRAME_SWEEPING);
        G.phases |= STROBE_GC_MARKING | STROBE_GC_SWEEPING; /* sweeping starts at once */
    } else if (event == RUBY_INTERNAL_EVENT_GC_END_SWEEP) {
        end_phase(STROBE_FRAME_GC);
    } else if (event == RUBY_INTERNAL_EVENT_GC_EXIT) {
        end_phase(STROBE_FRAME_GC);
        strobe_thread_t *t = G.t;
        G.t = NULL;
        /* :cpu: what GC used is counted here, not owed by the timer. */
        if (G.mode == STROBE_MODE_CPU) t->cpu_last_ns += G.at_ns - G.entered_cpu_ns;
        /* The pause as a marker; why it ran, as Ruby tells it (Symbols, nil). */
        strobe_marker_t m = {
            .start_us = G.entered_us, .end_us = G.at_us, .kind = STROBE_MARKER_GC, .gc_phases = (uint8_t)G.phases,
            .type = rb_gc_latest_gc_info(sym_gc_by), .name = rb_gc_latest_gc_info(sym_major_by), .data = Qnil,
        };
        strobe_profile_add_marker(t, &m);
        atomic_store(&under_way, 0);
        atomic_store(&t->in_gc, 0);
    }
}

void
strobe_gcspan_retime(long interval_us)
{
    G.interval_ns = (int64_t)interval_us * 1000;
}

void
strobe_gcspan_start(strobe_mode_t mode, long interval_us)
{
    if (NIL_P(hook)) {
        sym_state = ID2SYM(rb_intern("state"));
        sym_sweeping = ID2SYM(rb_intern("sweeping"));
        sym_gc_by = ID2SYM(rb_intern("gc_by"));
        sym_major_by = ID2SYM(rb_intern("major_by"));
        hook = rb_tracepoint_new(Qnil,
                                 RUBY_INTERNAL_EVENT_GC_ENTER | RUBY_INTERNAL_EVENT_GC_EXIT |
                                     RUBY_INTERNAL_EVENT_GC_END_MARK | RUBY_INTERNAL_EVENT_GC_END_SWEEP,
                                 gc_hook, NULL);
        rb_gc_register_mark_object(hook);
    }
    G.mode = mode;
    G.interval_ns = (int64_t)interval_us * 1000;
    G.carry_ns = 0;
    G.t = NULL;
    atomic_store(&G.active, 1);
    rb_tracepoint_enable(hook);
}

void
strobe_gcspan_stop(void)
{
    atomic_store(&G.active, 0);
    if (!NIL_P(hook)) rb_tracepoint_disable(hook);
    if (G.t) atomic_store(&G.t->in_gc, 0);
    G.t = NULL;
    atomic_store(&under_way, 0);
}

void
strobe_gcspan_after_fork(void)
{
    atomic_store(&G.active, 0); /* the hook stays enabled until the next stop, idle */
    G.t = NULL;
    atomic_store(&under_way, 0);
}
