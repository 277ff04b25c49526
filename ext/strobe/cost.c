/*
 * cost.c - Strobe::Native.cost: what sampling has cost the program so far,
 * for the continuous profiler's overhead governor (cost.h says what is
 * counted where).
 *
 * Only strobe_cost_ns is touched from signal handlers (cost.h); the method
 * runs with the GVL held.
 */
#include "cost.h"
#include "sampler.h"

_Atomic int64_t strobe_cost_ns;

/* Strobe::Native.cost -> [handler_ns, timer_cpu_ns]: nanoseconds spent in
 * the signal handler and postponed jobs on the program's threads, and CPU
 * time of the timer thread, both since the extension was loaded (take
 * differences). */
static VALUE
native_cost(VALUE self)
{
    (void)self;
    int64_t handler = atomic_load_explicit(&strobe_cost_ns, memory_order_relaxed);
    return rb_ary_new_from_args(2, LL2NUM(handler), LL2NUM(strobe_sampler_timer_cpu_ns()));
}

void
strobe_cost_init(VALUE native)
{
    rb_define_singleton_method(native, "cost", native_cost, 0);
}
