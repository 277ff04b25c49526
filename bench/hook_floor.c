/*
 * hook_floor.c - the floor under any tracer built on Ruby's event hooks:
 * a C extension (compiled on the fly by bench/trace.rb) whose hooks see the
 * same events Strobe's tracer does (call, return, c_call, c_return, fiber
 * switch) and do nothing (HookFloor.empty), or only read a clock the way
 * Strobe's :wall trace does (HookFloor.clock: the time-stamp counter where
 * the kernel's clocksource is tsc, else CLOCK_MONOTONIC). Nothing is
 * recorded. GVL held; not signal-safe.
 */
#include <ruby/ruby.h>
#include <ruby/debug.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#define EVENTS (RUBY_EVENT_CALL | RUBY_EVENT_RETURN | RUBY_EVENT_C_CALL | RUBY_EVENT_C_RETURN | RUBY_EVENT_FIBER_SWITCH)

static volatile long long sink;
static int tsc;

static void
empty_hook(VALUE data, rb_trace_arg_t *arg)
{
    (void)data;
    (void)arg;
}

static void
clock_hook(VALUE data, rb_trace_arg_t *arg)
{
    (void)data;
    (void)arg;
#if defined(__x86_64__) || defined(__i386__)
    if (tsc) {
        sink += (long long)__rdtsc();
        return;
    }
#endif
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    sink += ts.tv_nsec;
}

static void (*current)(VALUE, rb_trace_arg_t *);

static VALUE
hook_on(void (*fn)(VALUE, rb_trace_arg_t *))
{
    current = fn;
    rb_add_event_hook2((rb_event_hook_func_t)(void (*)(void))fn, EVENTS, Qnil,
                       RUBY_EVENT_HOOK_FLAG_SAFE | RUBY_EVENT_HOOK_FLAG_RAW_ARG);
    return Qnil;
}

static VALUE
empty_on(VALUE self) { return hook_on(empty_hook); }

static VALUE
clock_on(VALUE self) { return hook_on(clock_hook); }

static VALUE
hook_off(VALUE self)
{
    if (current) rb_remove_event_hook((rb_event_hook_func_t)(void (*)(void))current);
    current = NULL;
    return Qnil;
}

void
Init_hook_floor(void)
{
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    char name[32] = { 0 };
    if (f) {
        tsc = fgets(name, sizeof(name), f) && strcmp(name, "tsc\n") == 0;
        fclose(f);
    }
    VALUE m = rb_define_module("HookFloor");
    rb_define_singleton_method(m, "empty_on", empty_on, 0);
    rb_define_singleton_method(m, "clock_on", clock_on, 0);
    rb_define_singleton_method(m, "off", hook_off, 0);
}
