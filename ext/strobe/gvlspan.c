/*
 * gvlspan.c - GVL state stretches as markers (Ruby 3.2+, time modes).
 *
 * The GVL hook (gvlhook.c) reports each registered thread's changes of
 * state: holding the GVL, ready and waiting for it, or blocked without it
 * (IO, sleep, a lock, C code that released it). A stretch of waiting or
 * blocked (not in :cpu, which profiles what threads run) that lasted
 * STROBE_GVL_MARKER_MIN_US or more and ends while the
 * thread is sampled becomes a marker on its timeline (markers.c: type
 * :gvl, "GVL wait" or "Blocked"), from the moment the state began. Shorter
 * ones are left to the samples' states (result[:threads][id][:states]):
 * threads that trade the GVL around IO make them by the ten thousand a
 * second. The stretch under way as profiling stops is closed there; a
 * snapshot leaves it out (it is in a later part).
 *
 * strobe_gvlspan_change runs in the GVL hook, mostly without the GVL: a
 * clock read and two atomic exchanges per event, and for a stretch long
 * enough the profile lock (no Ruby call, no Ruby allocation). Nothing
 * here runs in a signal handler.
 */
#include "gvlspan.h"
#include "clock.h"
#include "profile.h"
#include "sampler.h"

void
strobe_gvlspan_begin(strobe_thread_t *t, int64_t now_us)
{
    atomic_store_explicit(&t->gvl_since_us, now_us, memory_order_relaxed);
}

static void
add(strobe_thread_t *t, uint8_t state, int64_t since_us, int64_t now_us)
{
    /* :cpu profiles what threads run: waiting for the GVL is wanting to,
     * but a blocked thread's time is not in it (else every idle thread
     * would join the profile with a marker and no sample). */
    if (state != STROBE_STATE_WAITING && (state != STROBE_STATE_BLOCKED || strobe_profile.mode == STROBE_MODE_CPU)) return;
    if (since_us <= 0 || now_us - since_us < STROBE_GVL_MARKER_MIN_US) return;
    if (!strobe_sampler_sampled(t)) return; /* paused between scopes */
    strobe_marker_t m = {
        .start_us = since_us, .end_us = now_us, .kind = STROBE_MARKER_GVL, .state = state,
        .type = Qnil, .name = Qnil, .data = Qnil,
    };
    strobe_profile_add_marker(t, &m);
}

void
strobe_gvlspan_change(strobe_thread_t *t, uint8_t state)
{
    uint8_t was = atomic_exchange_explicit(&t->gvl_state, state, memory_order_relaxed);
    if (was == state) return;
    int64_t now = strobe_now_us();
    int64_t since = atomic_exchange_explicit(&t->gvl_since_us, now, memory_order_relaxed);
    add(t, was, since, now);
}

void
strobe_gvlspan_close(strobe_thread_t *t, int64_t now_us)
{
    int64_t since = atomic_exchange_explicit(&t->gvl_since_us, 0, memory_order_relaxed);
    add(t, atomic_load_explicit(&t->gvl_state, memory_order_relaxed), since, now_us);
}
