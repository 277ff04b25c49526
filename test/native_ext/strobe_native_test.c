/*
 * strobe_native_test.c - a C extension for test_native.rb: C functions
 * with known names and a known call structure, so that the native frames
 * Strobe weaves under the Ruby frames can be checked exactly. Built by the
 * test (mkmf, not stripped: its static functions are named by .symtab).
 *
 *   StrobeNativeTest.spin(n)        spin -> spin_middle -> spin_leaf (n rounds)
 *   StrobeNativeTest.call_back(n) { }  call_back -> yield_after_work ->
 *                                     own_work (n rounds), then yields
 *   StrobeNativeTest.call_method(obj, name, n)  call_method -> call_after_work
 *                                     -> own_work, then obj.name via rb_funcall
 */
#include <ruby.h>

static volatile unsigned long sink;

__attribute__((noinline)) static void
spin_leaf(long n)
{
    for (long i = 0; i < n; i++) sink += (unsigned long)i * 2654435761u;
}

__attribute__((noinline)) static void
spin_middle(long n)
{
    spin_leaf(n);
    sink++; /* no tail call: spin_middle stays on the stack */
}

static VALUE
spin(VALUE self, VALUE n)
{
    spin_middle(NUM2LONG(n));
    sink++;
    return Qnil;
}

__attribute__((noinline)) static void
own_work(long n)
{
    for (long i = 0; i < n; i++) sink ^= (unsigned long)i * 40503u;
}

__attribute__((noinline)) static VALUE
yield_after_work(long n)
{
    own_work(n);
    VALUE r = rb_yield(Qnil);
    sink++;
    return r;
}

static VALUE
call_back(VALUE self, VALUE n)
{
    VALUE r = yield_after_work(NUM2LONG(n));
    sink++;
    return r;
}

__attribute__((noinline)) static VALUE
call_after_work(VALUE obj, ID name, long n)
{
    own_work(n);
    VALUE r = rb_funcall(obj, name, 0);
    sink++;
    return r;
}

static VALUE
call_method(VALUE self, VALUE obj, VALUE name, VALUE n)
{
    VALUE r = call_after_work(obj, rb_to_id(name), NUM2LONG(n));
    sink++;
    return r;
}

void
Init_strobe_native_test(void)
{
    VALUE m = rb_define_module("StrobeNativeTest");
    rb_define_singleton_method(m, "spin", spin, 1);
    rb_define_singleton_method(m, "call_back", call_back, 1);
    rb_define_singleton_method(m, "call_method", call_method, 3);
}
