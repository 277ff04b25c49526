/*
 * profile.c - what was sampled: node counts, the sample log, threads.
 *
 * Owns strobe_profile: the stack table, a self-sample count per node (from
 * which every aggregate is derived at results time, never stored twice), and
 * with raw: true a log of samples in chunks of 12-byte records
 * (node, time offset, thread, flags). Each chunk has a 64-bit base time and
 * samples store 32-bit microsecond offsets from it.
 *
 * Recording interns only the part of a stack that differs from the previous
 * stack recorded (kept with its node path), so a repeated stack costs one
 * comparison per frame and a new leaf one child-cache probe per new frame.
 * strobe_profile_record() is the one entry: the ring drain calls it per
 * slot, custom and object modes call it directly (they hold the GVL).
 *
 * Locking: in :wall and :cpu modes the timer thread drains the ring into the
 * profile without the GVL, so every reader and writer that can run at the
 * same time (the drain, GC marking, Strobe.sample, a thread ending) goes
 * through the profile lock; strobe_profile_locked() also turns an
 * allocation failure into an early, consistent return instead of a Ruby
 * exception on a thread that cannot raise one. Custom and object modes have
 * no timer thread and record directly with the GVL. Nothing Ruby is called
 * under the lock (GC marking takes it too).
 *
 * Signal safety: only strobe_profile_add_missed() (an atomic add).
 */
#include "profile.h"
#include "clock.h"
#include "native.h"
#include "sampler.h"
#include <pthread.h>
#include <setjmp.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

strobe_profile_t strobe_profile;
static _Atomic uint64_t missed_samples;
static pthread_mutex_t profile_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread jmp_buf *oom_jump; /* set inside strobe_profile_locked() */

_Noreturn void
strobe_out_of_memory(void)
{
    if (oom_jump) longjmp(*oom_jump, 1);
    rb_memerror();
}

int
strobe_profile_locked(void (*fn)(void *), void *arg)
{
    jmp_buf jump;
    jmp_buf *saved = oom_jump;
    pthread_mutex_lock(&profile_lock);
    int failed = setjmp(jump);
    if (!failed) {
        oom_jump = &jump;
        fn(arg);
    } else {
        strobe_capture_abandon(); /* the slot being drained, if any */
    }
    oom_jump = saved;
    pthread_mutex_unlock(&profile_lock);
    return failed ? -1 : 0;
}

void
strobe_profile_lock(void)
{
    pthread_mutex_lock(&profile_lock);
}

void
strobe_profile_unlock(void)
{
    pthread_mutex_unlock(&profile_lock);
}

void
strobe_profile_add_missed(uint64_t n)
{
    atomic_fetch_add_explicit(&missed_samples, n, memory_order_relaxed);
}

void
strobe_profile_begin(strobe_mode_t mode, long interval, int raw, int aggregate, int ignore_gc)
{
    strobe_profile_t *p = &strobe_profile;
    if (!p->active) {
        strobe_stack_table_init(&p->table);
        p->samples = p->gc_samples = p->truncated_samples = 0;
        atomic_store(&missed_samples, 0);
        p->start_us = strobe_now_us();
        p->started_at_us = strobe_clock_ns(CLOCK_REALTIME) / 1000;
        p->stop_us = 0;
        p->threads_len = 0;
        p->prev_depth = 0;
        p->raw = 0;
        p->process_timer = 0;
        p->safepoint_timer = 0;
        p->track_states = 0;
        p->native = 0;
        p->jit = STROBE_JIT_NONE;
        p->native_incomplete = 0;
        p->cut = 0;
        strobe_native_reset();
        p->active = 1;
    }
    /* Rounds of start/stop accumulate; the latest settings describe them. */
    p->mode = mode;
    p->interval = interval;
    p->raw |= raw;
    p->aggregate = aggregate;
    p->ignore_gc = ignore_gc;
}

void
strobe_profile_clear(void)
{
    strobe_profile_t *p = &strobe_profile;
    if (p->active) strobe_stack_table_free(&p->table);
    free(p->node_self);
    p->node_self = NULL;
    p->node_self_capa = 0;
    for (strobe_chunk_t *c = p->first_chunk, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    p->first_chunk = p->last_chunk = NULL;
    p->threads_len = 0;
    p->prev_depth = 0;
    strobe_markers_free(&p->markers);
    p->active = 0;
    atomic_store(&missed_samples, 0);
}

void
strobe_profile_drop_inherited(void)
{
    if (!strobe_profile.inherited) return;
    strobe_profile_clear();
    strobe_sampler_forget_unsampled();
    strobe_profile.inherited = 0;
}

uint64_t
strobe_profile_cut(int64_t now_us)
{
    strobe_profile_t *p = &strobe_profile;
    p->samples = p->gc_samples = p->truncated_samples = 0;
    p->native_incomplete = 0;
    if (p->node_self) memset(p->node_self, 0, sizeof(uint64_t) * p->node_self_capa);
    for (strobe_chunk_t *c = p->first_chunk, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    p->first_chunk = p->last_chunk = NULL;
    for (int i = 0; i < p->threads_len; i++) {
        p->threads[i].samples = 0;
        memset(p->threads[i].states, 0, sizeof(p->threads[i].states));
    }
    strobe_markers_free(&p->markers); /* the copy just taken has them */
    p->start_us = now_us;
    p->started_at_us = strobe_clock_ns(CLOCK_REALTIME) / 1000;
    p->cut = 1;
    return atomic_exchange(&missed_samples, 0);
}

static int
strobe_profile_thread_index(pid_t tid, VALUE thread)
{
    strobe_profile_t *p = &strobe_profile;
    for (int i = 0; i < p->threads_len; i++)
        if (p->threads[i].thread == thread && (p->threads[i].tid == tid || (p->threads[i].mn && thread != Qnil)))
            return i;
    if (p->threads_len == STROBE_MAX_PROFILE_THREADS) return STROBE_MAX_PROFILE_THREADS - 1;
    if (p->threads_len == p->threads_capa) {
        int capa = p->threads_capa ? p->threads_capa * 2 : 16;
        strobe_profile_thread_t *threads = realloc(p->threads, (size_t)capa * sizeof(*threads));
        if (!threads) strobe_out_of_memory();
        p->threads = threads;
        p->threads_capa = capa;
    }
    p->threads[p->threads_len] = (strobe_profile_thread_t){ .tid = tid, .thread = thread, .name = Qnil };
    return p->threads_len++;
}

static int
profile_thread(strobe_profile_t *p, strobe_thread_t *t)
{
    if (!t) return strobe_profile_thread_index(0, Qnil);
    if (t->profile_index < 0) {
        t->profile_index = strobe_profile_thread_index(t->tid, t->thread);
        /* An M:N thread keeps one record, whatever native thread it is on. */
        if (atomic_load_explicit(&t->mobile, memory_order_relaxed)) p->threads[t->profile_index].mn = 1;
    }
    return t->profile_index;
}

struct add_marker {
    strobe_thread_t *t;
    strobe_marker_t *m;
    int kept;
};

/* Under the profile lock. */
static void
add_marker(void *arg)
{
    struct add_marker *a = arg;
    strobe_profile_t *p = &strobe_profile;
    if (!p->active) return;
    a->m->thread = a->t ? profile_thread(p, a->t) : -1;
    a->kept = strobe_markers_add(&p->markers, a->m);
}

int
strobe_profile_add_marker(strobe_thread_t *t, strobe_marker_t *m)
{
    struct add_marker a = { t, m, 0 };
    if (strobe_profile_locked(add_marker, &a) < 0) {
        strobe_profile_lock();
        strobe_profile.markers.dropped++;
        strobe_profile_unlock();
    }
    return a.kept;
}

void
strobe_profile_thread_ended(strobe_thread_t *t)
{
    strobe_profile_t *p = &strobe_profile;
    VALUE name = rb_funcall(t->thread, rb_intern("name"), 0); /* Ruby: not under the lock */
    strobe_profile_lock();
    if (p->active && t->profile_index >= 0 && t->profile_index < p->threads_len) {
        strobe_profile_thread_t *pt = &p->threads[t->profile_index];
        pt->name = name;
        pt->thread = Qnil;
    }
    t->thread = Qnil; /* read by the drain for the thread's first sample */
    strobe_profile_unlock();
    RB_GC_GUARD(name);
}

static void
ensure_node_counts(strobe_profile_t *p)
{
    uint32_t need = p->table.nodes_len;
    if (need <= p->node_self_capa) return;
    uint32_t capa = p->node_self_capa ? p->node_self_capa : 1024;
    while (capa < need) capa *= 2;
    uint64_t *counts = realloc(p->node_self, capa * sizeof(uint64_t));
    if (!counts) strobe_out_of_memory();
    memset(counts + p->node_self_capa, 0, (capa - p->node_self_capa) * sizeof(uint64_t));
    p->node_self = counts;
    p->node_self_capa = capa;
}

static void
log_new_chunk(strobe_profile_t *p, int64_t base_us)
{
    strobe_chunk_t *fresh = malloc(sizeof(strobe_chunk_t));
    if (!fresh) strobe_out_of_memory();
    fresh->next = NULL;
    fresh->base_us = base_us;
    fresh->len = 0;
    if (p->last_chunk) p->last_chunk->next = fresh; else p->first_chunk = fresh;
    p->last_chunk = fresh;
}

/* Makes room in the log for n samples timed first_us..last_us (in that
 * order) before anything is counted, so running out of memory leaves the
 * counts and the log in agreement. Inline: the common case is a check. */
static inline void
log_reserve(strobe_profile_t *p, int64_t first_us, int64_t last_us, uint32_t n)
{
    const strobe_chunk_t *c = p->last_chunk;
    /* Unsigned: a time before the chunk's base wraps and also starts a chunk. */
    if (c && c->len + n <= STROBE_CHUNK_SAMPLES &&
        (uint64_t)(first_us - c->base_us) <= UINT32_MAX && (uint64_t)(last_us - c->base_us) <= UINT32_MAX)
        return;
    log_new_chunk(p, first_us);
}

/* After log_reserve(): one store. */
static inline void
log_store(strobe_profile_t *p, uint32_t node, int64_t time_us, uint16_t thread, uint16_t state)
{
    strobe_chunk_t *c = p->last_chunk;
    c->samples[c->len++] = (strobe_sample_t){ node, (uint32_t)(time_us - c->base_us), thread, state };
}

/* 1 + the number of levels, counted from the root, at which two stacks
 * hold the same frame at the same line. f/pf and l/pl point just past the
 * root ends (the k-th level from the root is [-k]); limit is the shorter
 * depth. The common part is usually almost all of the stack, so with SSE2
 * (every x86-64) four levels are compared per step. */
static inline int
common_root(const VALUE *f, const VALUE *pf, const int *l, const int *pl, int limit)
{
    int k = 1;
#if defined(__SSE2__) && SIZEOF_VALUE == 8
    while (k + 3 <= limit) {
        __m128i frames_hi = _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(f - k - 1)),
                                            _mm_loadu_si128((const __m128i *)(pf - k - 1)));
        __m128i frames_lo = _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(f - k - 3)),
                                            _mm_loadu_si128((const __m128i *)(pf - k - 3)));
        __m128i lines = _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(l - k - 3)),
                                        _mm_loadu_si128((const __m128i *)(pl - k - 3)));
        if (_mm_movemask_epi8(_mm_and_si128(_mm_and_si128(frames_hi, frames_lo), lines)) != 0xFFFF) break;
        k += 4;
    }
#endif
    while (k <= limit && pf[-k] == f[-k] && pl[-k] == l[-k])
        k++;
    return k;
}

/* Interns a Ruby stack (innermost first, as captured) and returns its leaf
 * node, reusing the previous stack's path up to the first difference. */
static uint32_t
intern_stack(strobe_profile_t *p, const VALUE *frames, const int *lines, int depth)
{
    /* Both stacks are innermost first; the previous one is stored against
     * the end of its arrays, so the k-th frame from the root of either is
     * at [-k] from its end and the common root part is found with one index. */
    const VALUE *f = frames + depth, *pf = p->prev_frames + STROBE_PATH_CAPA;
    const int *l = lines + depth, *pl = p->prev_lines + STROBE_PATH_CAPA;
    uint32_t *path = p->prev_path + STROBE_PATH_CAPA;
    int limit = depth < p->prev_depth ? depth : p->prev_depth;
    int k = common_root(f, pf, l, pl, limit);
    p->table.batch++;
    /* Only the common part stays valid if interning runs out of memory. */
    p->prev_depth = k - 1;

    uint32_t node = k > 1 ? path[1 - k] : 0;
    for (; k <= depth; k++) {
        p->table.level = (uint16_t)k;
        node = strobe_stack_table_child(&p->table, node, f[-k], l[-k]);
        path[-k] = node;
        p->prev_frames[STROBE_PATH_CAPA - k] = f[-k];
        p->prev_lines[STROBE_PATH_CAPA - k] = l[-k];
    }
    p->prev_depth = depth;
    return node;
}

static uint32_t
intern_gc(strobe_profile_t *p, int kind)
{
    p->table.batch++;
    p->table.level = 1;
    uint32_t gc = strobe_stack_table_frame(&p->table, (VALUE)STROBE_FRAME_GC, STROBE_FRAME_GC);
    uint32_t node = strobe_stack_table_node(&p->table, 0, gc, 0);
    p->table.level = 2;
    if (kind != STROBE_FRAME_GC) {
        uint32_t phase = strobe_stack_table_frame(&p->table, (VALUE)kind, kind);
        node = strobe_stack_table_node(&p->table, node, phase, 0);
    }
    return node;
}

void
strobe_profile_record(strobe_thread_t *t, int gc_kind, const VALUE *frames, const int *lines,
                      int depth, const int64_t *times, const uint8_t *states, uint32_t n)
{
    strobe_profile_t *p = &strobe_profile;
    if (!p->active) return;

    /* Everything that can run out of memory comes before anything is
     * counted (an interned node or a thread with no samples is harmless). */
    uint32_t node = gc_kind == STROBE_FRAME_RUBY ? intern_stack(p, frames, lines, depth)
                                                 : intern_gc(p, gc_kind);
    if (node >= p->node_self_capa) ensure_node_counts(p);
    int thread = profile_thread(p, t);
    if (p->raw && n == 1) { /* the common case, one check the compiler folds */
        log_reserve(p, times[0], times[0], 1);
        log_store(p, node, times[0], (uint16_t)thread, states[0]);
    } else if (p->raw && n > 0) { /* n == 0: a note of the thread's stack, no sample */
        log_reserve(p, times[0], times[n - 1], n);
        for (uint32_t i = 0; i < n; i++) log_store(p, node, times[i], (uint16_t)thread, states[i]);
    }

    int truncated = gc_kind == STROBE_FRAME_RUBY && depth > 0 && frames[depth - 1] == STROBE_TRUNCATED_VALUE;
    p->threads[thread].last_node = gc_kind == STROBE_FRAME_RUBY ? node : 0;
    p->threads[thread].last_truncated = truncated;
    if (truncated) p->truncated_samples += n;
    p->node_self[node] += n;
    p->samples += n;
    if (gc_kind != STROBE_FRAME_RUBY) p->gc_samples += n;
    p->threads[thread].samples += n;
    if (p->track_states)
        for (uint32_t i = 0; i < n; i++) p->threads[thread].states[states[i] & (STROBE_STATES - 1)]++;
}

/* A slot with native frames: they go under its Ruby frames, in one stack
 * (only ever built by the drain, under the profile lock). */
static VALUE woven_frames[STROBE_PATH_CAPA];
static int woven_lines[STROBE_PATH_CAPA];

void
strobe_profile_record_slot(const strobe_slot_t *slot)
{
    const VALUE *frames = slot->frames;
    const int *lines = slot->lines;
    int depth = slot->depth;
    if (slot->native_depth > 0 && depth > 0) {
        int n = strobe_native_weave(slot->native, slot->native_depth, woven_frames);
        if (n < 0) strobe_profile.native_incomplete += slot->n_times;
        if (n > 0) {
            memset(woven_lines, 0, sizeof(int) * (size_t)n);
            memcpy(woven_frames + n, frames, sizeof(VALUE) * (size_t)depth);
            memcpy(woven_lines + n, lines, sizeof(int) * (size_t)depth);
            frames = woven_frames;
            lines = woven_lines;
            depth += n;
        }
    }
    strobe_profile_record(strobe_threads_at(slot->thread), slot->gc_kind, frames, lines, depth, slot->times,
                          slot->states, slot->n_times);
}

void
strobe_profile_forget_stack(strobe_thread_t *t)
{
    strobe_profile_t *p = &strobe_profile;
    if (p->active && t->profile_index >= 0 && t->profile_index < p->threads_len) p->threads[t->profile_index].last_node = 0;
}

int
strobe_profile_record_repeat(strobe_thread_t *t, int64_t time_us, int state)
{
    strobe_profile_t *p = &strobe_profile;
    if (!p->active || t->profile_index < 0 || t->profile_index >= p->threads_len) return 0;
    int thread = t->profile_index;
    uint32_t node = p->threads[thread].last_node;
    if (!node) return 0;
    if (p->raw) {
        log_reserve(p, time_us, time_us, 1);
        log_store(p, node, time_us, (uint16_t)thread, (uint16_t)state);
    }
    p->node_self[node]++;
    p->samples++;
    if (p->threads[thread].last_truncated) p->truncated_samples++;
    p->threads[thread].samples++;
    p->threads[thread].states[state & (STROBE_STATES - 1)]++;
    return 1;
}

uint64_t
strobe_profile_missed(void)
{
    return atomic_load(&missed_samples);
}

void
strobe_profile_mark(void)
{
    strobe_profile_t *p = &strobe_profile;
    if (!p->active) return;
    strobe_stack_table_mark(&p->table);
    for (int i = 0; i < p->threads_len; i++) {
        rb_gc_mark(p->threads[i].thread);
        rb_gc_mark(p->threads[i].name);
    }
    strobe_markers_mark(&p->markers);
}

size_t
strobe_profile_memsize(void)
{
    const strobe_profile_t *p = &strobe_profile;
    size_t size = sizeof(*p);
    if (!p->active) return size;
    size += p->table.frames_capa * sizeof(strobe_frame_t) + p->table.frame_slots_capa * sizeof(uint32_t);
    size += p->table.nodes_capa * sizeof(strobe_node_t) + p->table.node_slots_capa * sizeof(uint32_t);
    size += p->node_self_capa * sizeof(uint64_t);
    size += (size_t)p->threads_capa * sizeof(strobe_profile_thread_t);
    for (const strobe_chunk_t *c = p->first_chunk; c; c = c->next) size += sizeof(*c);
    size += strobe_markers_memsize(&p->markers);
    return size;
}
