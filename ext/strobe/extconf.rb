# frozen_string_literal: true

# Configures the Strobe C extension. Features are detected, never inferred
# from version numbers: each have_func below defines HAVE_<NAME> for the C code.
require "mkmf"

# Linux only: each thread is signalled with tgkill() and read by its CPU
# clock, derived from its Linux thread id.
unless RUBY_PLATFORM.include?("linux")
  abort "strobe-profiler runs on Linux only (it needs Linux's per-thread timers and signals); " \
        "this Ruby is for #{RUBY_PLATFORM}"
end

$CFLAGS << " -std=gnu11 -Wall -Wextra -Wno-unused-parameter -fno-strict-aliasing"
$CFLAGS << " -O2 -g"

if ENV["STROBE_SANITIZE"] == "1"
  flags = " -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1"
  $CFLAGS << flags
  $LDFLAGS << " -fsanitize=address,undefined"
end

$LDFLAGS << " -lpthread"
have_library("rt", "clock_gettime")
# Ruby 3.3+: a preregistered postponed job is triggered without the table
# scan of rb_postponed_job_register_one (deprecated there).
have_func("rb_postponed_job_preregister", "ruby/debug.h")
# STROBE_MODERN_API_ONLY=1: build as on a Ruby without the old postponed-job
# functions (Ruby 4.1 removes rb_postponed_job_register and _one): any use
# of them fails to compile (strobe.h poisons the names).
if ENV["STROBE_MODERN_API_ONLY"] == "1"
  abort "STROBE_MODERN_API_ONLY needs rb_postponed_job_preregister (Ruby 3.3+)" unless $defs.include?("-DHAVE_RB_POSTPONED_JOB_PREREGISTER")
  $defs << "-DSTROBE_POISON_LEGACY_POSTPONED_JOB"
end
# Ruby 3.2+: GVL events (waiting for the GVL, holding it, released it), so
# samples can say what their thread was doing.
have_func("rb_internal_thread_add_event_hook", "ruby/thread.h")
# Ruby 3.3+: which thread a GVL event is about (the hook may run on another).
have_struct_member("rb_internal_thread_event_data_t", "thread", "ruby/thread.h")
# Exported by libruby but declared in no public header: whether the calling
# thread holds the GVL. With YJIT before Ruby 3.3 the handler must not read a
# GVL holder's frames (sampler.c); a thread without the GVL is safe to read.
have_func("ruby_thread_has_gvl_p")
# Ruby 3.3+: data per Ruby thread for profilers, readable in a signal
# handler: threads are found by the Ruby Thread, wherever M:N runs them.
have_func("rb_internal_thread_specific_get", "ruby/thread.h")
# Ruby 3.2+: another thread's frames, read with the GVL held; the signal-free
# scheduler (scheduler: :thread) then samples every profiled thread, not just
# the one holding the GVL.
have_func("rb_profile_thread_frames", "ruby/debug.h")
# Ruby 3.2+: the object a singleton class belongs to (trace mode's method
# names; 3.1 reads the class's __attached__).
have_func("rb_class_attached_object", "ruby.h")

# native: true: libunwind's local unwinder (Debian: libunwind-dev) walks the
# native stack in the signal handler. Without it, native: true is refused
# with an error saying so. STROBE_WITHOUT_LIBUNWIND=1 builds without it
# even where it is installed (to test that refusal).
# UNW_LOCAL_ONLY selects the local unwinder's entry points (libunwind.so).
# x86-64 Linux only: there libunwind walks with .eh_frame tables in memory;
# on aarch64 it may also open and decompress .debug_frame files during a
# walk, which a signal handler must not do.
if ENV["STROBE_WITHOUT_LIBUNWIND"] != "1" && RUBY_PLATFORM.match?(/x86_64-linux/)
  saved = $CPPFLAGS.dup
  $CPPFLAGS << " -DUNW_LOCAL_ONLY"
  found = have_header("libunwind.h") && have_library("unwind", "unw_backtrace", "libunwind.h") &&
          have_func("unw_init_local2", "libunwind.h")
  $CPPFLAGS = saved
  $defs << "-DHAVE_LIBUNWIND" if found
end

create_makefile("strobe/strobe")
