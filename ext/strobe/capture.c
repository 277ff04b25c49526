/*
 * capture.c - what a signal handler may do: fill a ring slot with a stack.
 *
 * Owns the hand-off ring between sampled threads (producers, in a signal
 * handler or hook) and the GVL-holding drain (the one consumer).
 *
 * Signal safety: strobe_capture() is async-signal-safe:
 * no malloc, no locks, no Ruby objects; only atomics, memcmp/memcpy,
 * clock_gettime and rb_profile_frames (which reads the VM stack of the
 * current thread, as every Ruby sampling profiler does), and with native
 * frames native.c's libunwind walk. The drain (one
 * consumer at a time) runs under the profile lock: on the timer thread while
 * it runs, else with the GVL held.
 *
 * A capture may be a note instead of a sample (now_us STROBE_CAPTURE_NOTE):
 * a slot with no times, whose stack the drain records as its thread's
 * latest without counting it, for the timer to repeat (an M:N thread's
 * stack as it leaves the GVL, see gvlhook.c).
 *
 * Protocol: a producer captures into its thread's scratch buffer. If the
 * stack equals the one in its thread's newest undrained slot, it only
 * appends a timestamp there (so a thread stuck in one place costs one slot
 * for STROBE_SLOT_TIMES samples). Otherwise it reserves the next slot with a
 * CAS on write_seq, or counts a miss when the ring is full: work is never
 * queued without bound. Slot states (EMPTY -> WRITING -> READY -> DRAINING
 * -> EMPTY) are changed with CAS so an append and a drain never overlap.
 *
 * GC: a handler can run on a thread without the GVL (:wall mode samples
 * blocked threads) while the GVL holder runs GC. Frames read while GC
 * compacts or frees may be stale, and a slot only becomes visible to GC
 * marking once READY. So each slot carries the GC count it was captured
 * under (read before rb_during_gc() was found false; Ruby raises that flag
 * before it counts a GC, so any GC overlapping the capture counts past it),
 * and marking moves that epoch forward for every slot it pins. The drain
 * keeps a slot only if every GC since its capture pinned it, or the one GC
 * under way has not reached Strobe's mark function yet (it will then mark
 * the interned frames instead); any other slot is counted missed.
 */
#include "capture.h"
#include "native.h"
#include "profile.h"
#include <string.h>
#include <time.h>

static strobe_slot_t ring[STROBE_RING_SLOTS];
static _Atomic uint64_t write_seq; /* next sequence a producer reserves */
static _Atomic uint64_t read_seq;  /* next sequence the drain consumes */
static size_t marked_epoch;        /* GC count at the latest strobe_capture_mark */

/* GVL held, nothing sampling: forget everything in the ring. */
void
strobe_capture_reset(void)
{
    for (int i = 0; i < STROBE_RING_SLOTS; i++)
        atomic_store(&ring[i].state, STROBE_SLOT_EMPTY);
    atomic_store(&write_seq, 0);
    atomic_store(&read_seq, 0);
    marked_epoch = 0;
}

static int
same_stack(const strobe_slot_t *slot, const strobe_thread_t *t)
{
    return slot->depth == t->scratch_depth &&
           slot->gc_kind == t->scratch_gc_kind &&
           slot->native_depth == t->scratch_native_depth &&
           memcmp(slot->frames, t->scratch_frames, sizeof(VALUE) * (size_t)t->scratch_depth) == 0 &&
           memcmp(slot->lines, t->scratch_lines, sizeof(int) * (size_t)t->scratch_depth) == 0 &&
           memcmp(slot->native, t->scratch_native, sizeof(uintptr_t) * (size_t)t->scratch_native_depth) == 0;
}

/* Appends now_us to the thread's newest slot if it holds the same stack and
 * has not been taken by the drain. */
static int
try_append(strobe_thread_t *t, int64_t now_us)
{
    if (t->last_seq < 0) return 0;
    strobe_slot_t *slot = &ring[(uint64_t)t->last_seq % STROBE_RING_SLOTS];
    int expected = STROBE_SLOT_READY;
    if (!atomic_compare_exchange_strong(&slot->state, &expected, STROBE_SLOT_WRITING))
        return 0;
    int ok = slot->seq == (uint64_t)t->last_seq &&
             slot->n_times < STROBE_SLOT_TIMES && same_stack(slot, t);
    if (ok) {
        slot->states[slot->n_times] = atomic_load_explicit(&t->gvl_state, memory_order_relaxed);
        slot->times[slot->n_times++] = now_us;
    }
    atomic_store_explicit(&slot->state, STROBE_SLOT_READY, memory_order_release);
    return ok;
}

/* A cheap digest of the scratch stack, to tell whether the thread's stack
 * changed since its previous capture, drained or not. */
static uint64_t
fingerprint(const strobe_thread_t *t)
{
    uint64_t h = 0xcbf29ce484222325ULL ^ (uint64_t)t->scratch_depth;
    for (int i = 0; i < t->scratch_depth; i++)
        h = (h ^ (uint64_t)t->scratch_frames[i] ^ ((uint64_t)(uint32_t)t->scratch_lines[i] << 32)) *
            0x100000001b3ULL;
    for (int i = 0; i < t->scratch_native_depth; i++)
        h = (h ^ (uint64_t)t->scratch_native[i]) * 0x100000001b3ULL;
    return h;
}

int
strobe_capture_drained(int64_t seq)
{
    return seq < 0 || (uint64_t)seq < atomic_load_explicit(&read_seq, memory_order_acquire);
}

int
strobe_capture(strobe_thread_t *t, VALUE thread, int gc_kind, size_t gc_epoch, int64_t now_us, int *unchanged,
               const void *ucontext)
{
    if (gc_kind == STROBE_FRAME_RUBY) {
        int depth = strobe_read_frames(thread, t->scratch_frames, t->scratch_lines);
        t->scratch_depth = depth < 0 ? 0 : depth;
    } else {
        t->scratch_depth = 0;
    }
    t->scratch_gc_kind = (uint8_t)gc_kind;
    if (t->scratch_depth == 0 && gc_kind == STROBE_FRAME_RUBY)
        return 0; /* no Ruby frame to attribute the sample to */
    /* Native frames go under Ruby ones; a GC sample has none. */
    t->scratch_native_depth = ucontext && gc_kind == STROBE_FRAME_RUBY
                                  ? strobe_native_capture(t, ucontext, t->scratch_native) : 0;
    if (unchanged) {
        uint64_t fp = gc_kind == STROBE_FRAME_RUBY ? fingerprint(t) : 0;
        *unchanged = fp != 0 && fp == t->last_fingerprint;
        t->last_fingerprint = fp;
    }
    if (now_us == STROBE_CAPTURE_NOTE) {
        /* The stack is already the newest undrained one: nothing to add. */
        if (t->last_seq >= 0 && !strobe_capture_drained(t->last_seq)) {
            strobe_slot_t *last = &ring[(uint64_t)t->last_seq % STROBE_RING_SLOTS];
            int expected = STROBE_SLOT_READY, same = 0;
            if (atomic_compare_exchange_strong(&last->state, &expected, STROBE_SLOT_WRITING)) {
                same = last->seq == (uint64_t)t->last_seq && same_stack(last, t);
                atomic_store_explicit(&last->state, STROBE_SLOT_READY, memory_order_release);
            }
            if (same) return 1;
        }
    } else if (try_append(t, now_us)) {
        return 1;
    }

    uint64_t seq = atomic_load(&write_seq);
    for (;;) {
        if (seq - atomic_load_explicit(&read_seq, memory_order_acquire) >= STROBE_RING_SLOTS)
            return 0; /* ring full: the drain is behind, drop */
        if (atomic_compare_exchange_weak(&write_seq, &seq, seq + 1))
            break;
    }
    strobe_slot_t *slot = &ring[seq % STROBE_RING_SLOTS];
    atomic_store_explicit(&slot->state, STROBE_SLOT_WRITING, memory_order_relaxed);
    slot->seq = seq;
    slot->depth = t->scratch_depth;
    slot->gc_kind = t->scratch_gc_kind;
    slot->thread = t->index;
    slot->n_times = now_us == STROBE_CAPTURE_NOTE ? 0 : 1;
    slot->times[0] = now_us;
    slot->states[0] = atomic_load_explicit(&t->gvl_state, memory_order_relaxed);
    slot->gc_epoch = gc_epoch;
    memcpy(slot->frames, t->scratch_frames, sizeof(VALUE) * (size_t)slot->depth);
    memcpy(slot->lines, t->scratch_lines, sizeof(int) * (size_t)slot->depth);
    slot->native_depth = t->scratch_native_depth;
    memcpy(slot->native, t->scratch_native, sizeof(uintptr_t) * (size_t)slot->native_depth);
    t->last_seq = (int64_t)seq;
    atomic_store_explicit(&slot->state, STROBE_SLOT_READY, memory_order_release);
    return 1;
}

void
strobe_capture_drain(strobe_slot_fn fn)
{
    for (;;) {
        uint64_t seq = atomic_load(&read_seq);
        if (seq == atomic_load_explicit(&write_seq, memory_order_acquire)) return;
        strobe_slot_t *slot = &ring[seq % STROBE_RING_SLOTS];
        int expected = STROBE_SLOT_READY;
        /* A producer is still writing or appending (possibly a handler that
         * interrupted us): leave it for the next drain. Its seq is only
         * stable once the slot is READY, so it is read after the CAS. */
        if (!atomic_compare_exchange_strong(&slot->state, &expected, STROBE_SLOT_DRAINING))
            return;
        if (slot->seq != seq) {
            atomic_store_explicit(&slot->state, STROBE_SLOT_READY, memory_order_release);
            return;
        }
        size_t now = rb_gc_count();
        if (slot->depth == 0 || slot->gc_epoch == now ||
            (slot->gc_epoch + 1 == now && marked_epoch != now))
            fn(slot);
        else
            strobe_profile_add_missed(slot->n_times); /* a GC may have moved its frames */
        atomic_store_explicit(&slot->state, STROBE_SLOT_EMPTY, memory_order_release);
        atomic_store_explicit(&read_seq, seq + 1, memory_order_release);
    }
}

void
strobe_capture_abandon(void)
{
    uint64_t seq = atomic_load(&read_seq);
    strobe_slot_t *slot = &ring[seq % STROBE_RING_SLOTS];
    if (slot->seq != seq || atomic_load(&slot->state) != STROBE_SLOT_DRAINING) return;
    strobe_profile_add_missed(slot->n_times);
    atomic_store_explicit(&slot->state, STROBE_SLOT_EMPTY, memory_order_release);
    atomic_store_explicit(&read_seq, seq + 1, memory_order_release);
}

/* Slots captured but not yet drained hold the only reference to frames that
 * may have returned since: pin them (rb_gc_mark) so GC neither frees nor
 * moves them before the drain interns them. */
void
strobe_capture_mark(void)
{
    size_t now = rb_gc_count();
    uint64_t end = atomic_load(&write_seq);
    for (uint64_t seq = atomic_load(&read_seq); seq < end; seq++) {
        strobe_slot_t *slot = &ring[seq % STROBE_RING_SLOTS];
        if (atomic_load_explicit(&slot->state, memory_order_acquire) != STROBE_SLOT_READY ||
            slot->seq != seq)
            continue;
        /* A slot an earlier GC did not pin is dropped by the drain anyway. */
        if (slot->gc_epoch != now && slot->gc_epoch + 1 != now) continue;
        for (int i = 0; i < slot->depth; i++)
            rb_gc_mark(slot->frames[i]);
        slot->gc_epoch = now;
    }
    marked_epoch = now;
}
