/*
 * strobe.h - what every Strobe C file needs: Ruby's headers, the integer
 * types, Strobe::ProfileError (and CORRUPT, which raises it), the cached
 * Symbols and the allocation-failure exit. Nothing else: each module has a
 * header of its own, declaring what it exports, and each C file includes
 * the headers of the modules it uses.
 *
 * The headers follow the pipeline; each includes only headers below it:
 *   sampling.h, clock.h    what a sample is made of; the clocks
 *   threads.h              the registry of the threads sampled
 *     beside the capture, on the registry: placement.h, sigstack.h,
 *     native.h, gcspan.h, gvlspan.h, sampler.h
 *   capture.h              the ring between the handler and the drain
 *   stack_table.h          interned frames and stacks
 *   profile.h              what was sampled (sampler_internal.h, the
 *                          sampler's own files' header, is on it)
 *   results.h              the result Hash
 *   out.h, report.h        the report engine
 *   samples.h              a result's raw samples read for the exports
 *   export.h, flamegraph.h, endpoints.h, firefox_markers.h
 * markers.h (the marker timeline's types), symbols.h, compact.h, subset.h
 * and trace.h stand on Ruby's header or this one alone.
 *
 * Global state lives in one struct per file; the whole profiler is a
 * process-wide singleton, like the signal it uses.
 */
#ifndef STROBE_H
#define STROBE_H 1

#include <ruby/ruby.h>
#include <ruby/debug.h>
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/mman.h>

/* A build that proves the old postponed-job API is not used (extconf.rb,
 * STROBE_MODERN_API_ONLY): Ruby 4.1 removes it. */
#ifdef STROBE_POISON_LEGACY_POSTPONED_JOB
#pragma GCC poison rb_postponed_job_register rb_postponed_job_register_one
#endif

/* Strobe::ProfileError (strobe.c): a result or file Strobe cannot read. */
extern VALUE strobe_eProfileError;
#define CORRUPT(...) rb_raise(strobe_eProfileError, __VA_ARGS__)

/* ary[i] (i in range) as a long, for arrays read from a result or a file:
 * anything but a Fixnum (another type, or an integer too big for a long)
 * raises Strobe::ProfileError naming what[i]. GVL held. */
static inline long
strobe_fixnum_at(VALUE ary, long i, const char *what)
{
    VALUE v = RARRAY_AREF(ary, i);
    if (!FIXNUM_P(v)) rb_raise(strobe_eProfileError, "%s[%ld] is not an integer in range", what, i);
    return FIX2LONG(v);
}

/* A large buffer just allocated (or grown), p of bytes: the kernel is asked
 * to back its untouched 2 MiB-aligned part with transparent huge pages,
 * which it does on request under the common "madvise" setting. Touching it
 * then faults once per 2 MiB instead of once per 4 KiB, and random access
 * into it misses the TLB less: writing 148 MB took 0.76 s in 4 KiB pages
 * and 0.02 to 0.5 s so on the CI's VM, where each fault is costly. Buffers
 * under 4 MiB are left alone. Returns p. Any thread; not in a handler. */
#define STROBE_HUGE_PAGE ((uintptr_t)2 << 20)
static inline void *
strobe_advise_huge(void *p, size_t bytes)
{
#ifdef MADV_HUGEPAGE
    if (p && bytes >= 2 * STROBE_HUGE_PAGE) {
        uintptr_t from = ((uintptr_t)p + STROBE_HUGE_PAGE - 1) & ~(STROBE_HUGE_PAGE - 1);
        uintptr_t to = ((uintptr_t)p + bytes) & ~(STROBE_HUGE_PAGE - 1);
        if (to > from) madvise((void *)from, to - from, MADV_HUGEPAGE);
    }
#endif
    return p;
}

/* ptr (malloc'd, or NULL) grown to count entries of size bytes, malloc's
 * memory (free() it); NoMemoryError if that fails or overflows. GVL held. */
static inline void *
strobe_grow(void *ptr, size_t count, size_t size)
{
    size_t bytes;
    void *p = __builtin_mul_overflow(count, size, &bytes) ? NULL : realloc(ptr, bytes ? bytes : 1);
    if (!p) rb_memerror();
    return strobe_advise_huge(p, bytes);
}

/* The Symbol for a C string literal, cached by its address (strobe.c).
 * GVL held. */
VALUE strobe_sym(const char *name);

/* Allocation failed (profile.c): inside strobe_profile_locked() it unwinds
 * to there; elsewhere (GVL held) it raises NoMemoryError. The C tables
 * filled under the profile lock (stack_table.c, native.c, symbols.c) call
 * it with everything still consistent. */
_Noreturn void strobe_out_of_memory(void);

#endif
