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
 * Signal safety: only strobe_profile_add_missed() (an atomic add). The rest
 * runs with the GVL held.
 */
#include "strobe.h"
#include <stdlib.h>
#include <string.h>

strobe_profile_t strobe_profile;
static _Atomic uint64_t missed_samples;


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
        p->samples = p->gc_samples = 0;
        atomic_store(&missed_samples, 0);
        p->start_us = strobe_now_us();
        p->threads_len = 0;
        p->prev_depth = 0;
        p->raw = 0;
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
    p->active = 0;
    atomic_store(&missed_samples, 0);
}

int
strobe_profile_thread_index(pid_t tid, VALUE thread)
{
    strobe_profile_t *p = &strobe_profile;
    for (int i = 0; i < p->threads_len; i++)
        if (p->threads[i].tid == tid && p->threads[i].thread == thread) return i;
    if (p->threads_len == STROBE_MAX_THREADS) return STROBE_MAX_THREADS - 1;
    p->threads[p->threads_len] = (strobe_profile_thread_t){ tid, thread, 0 };
    return p->threads_len++;
}

static void
ensure_node_counts(strobe_profile_t *p)
{
    uint32_t need = p->table.nodes_len;
    if (need <= p->node_self_capa) return;
    uint32_t capa = p->node_self_capa ? p->node_self_capa : 1024;
    while (capa < need) capa *= 2;
    uint64_t *counts = realloc(p->node_self, capa * sizeof(uint64_t));
    if (!counts) rb_memerror();
    memset(counts + p->node_self_capa, 0, (capa - p->node_self_capa) * sizeof(uint64_t));
    p->node_self = counts;
    p->node_self_capa = capa;
}

static void
log_sample(strobe_profile_t *p, uint32_t node, int64_t time_us, uint16_t thread)
{
    strobe_chunk_t *c = p->last_chunk;
    /* Unsigned: a time before the chunk's base wraps and also starts a chunk. */
    if (!c || c->len == STROBE_CHUNK_SAMPLES || (uint64_t)(time_us - c->base_us) > UINT32_MAX) {
        strobe_chunk_t *fresh = malloc(sizeof(strobe_chunk_t));
        if (!fresh) rb_memerror();
        fresh->next = NULL;
        fresh->base_us = time_us;
        fresh->len = 0;
        if (c) c->next = fresh; else p->first_chunk = fresh;
        p->last_chunk = c = fresh;
    }
    c->samples[c->len++] = (strobe_sample_t){ node, (uint32_t)(time_us - c->base_us), thread, 0 };
}

/* Interns a Ruby stack (innermost first, as captured) and returns its leaf
 * node, reusing the previous stack's path up to the first difference. */
static uint32_t
intern_stack(strobe_profile_t *p, const VALUE *frames, const int *lines, int depth)
{
    /* Both stacks are innermost first; the previous one is stored against
     * the end of its arrays, so the k-th frame from the root of either is
     * at [-k] from its end and the common root part is found with one index. */
    const VALUE *f = frames + depth, *pf = p->prev_frames + STROBE_MAX_DEPTH;
    const int *l = lines + depth, *pl = p->prev_lines + STROBE_MAX_DEPTH;
    uint32_t *path = p->prev_path + STROBE_MAX_DEPTH;
    int limit = depth < p->prev_depth ? depth : p->prev_depth;
    int k = 1;
    while (k <= limit && pf[-k] == f[-k] && pl[-k] == l[-k])
        k++;

    uint32_t node = k > 1 ? path[1 - k] : 0;
    for (; k <= depth; k++) {
        node = strobe_stack_table_child(&p->table, node, f[-k], l[-k]);
        path[-k] = node;
        p->prev_frames[STROBE_MAX_DEPTH - k] = f[-k];
        p->prev_lines[STROBE_MAX_DEPTH - k] = l[-k];
    }
    p->prev_depth = depth;
    return node;
}

static uint32_t
intern_gc(strobe_profile_t *p, int kind)
{
    uint32_t gc = strobe_stack_table_frame(&p->table, (VALUE)STROBE_FRAME_GC, STROBE_FRAME_GC);
    uint32_t node = strobe_stack_table_node(&p->table, 0, gc, 0);
    if (kind != STROBE_FRAME_GC) {
        uint32_t phase = strobe_stack_table_frame(&p->table, (VALUE)kind, kind);
        node = strobe_stack_table_node(&p->table, node, phase, 0);
    }
    return node;
}

void
strobe_profile_record(strobe_thread_t *t, int gc_kind, const VALUE *frames, const int *lines,
                      int depth, const int64_t *times, uint32_t n)
{
    strobe_profile_t *p = &strobe_profile;
    if (!p->active) return;

    uint32_t node = gc_kind == STROBE_FRAME_RUBY ? intern_stack(p, frames, lines, depth)
                                                 : intern_gc(p, gc_kind);
    if (node >= p->node_self_capa) ensure_node_counts(p);

    int thread = 0;
    if (t) {
        if (t->profile_index < 0) t->profile_index = strobe_profile_thread_index(t->tid, t->thread);
        thread = t->profile_index;
    }
    p->node_self[node] += n;
    p->samples += n;
    if (gc_kind != STROBE_FRAME_RUBY) p->gc_samples += n;
    p->threads[thread].samples += n;
    if (p->raw)
        for (uint32_t i = 0; i < n; i++) log_sample(p, node, times[i], (uint16_t)thread);
}

void
strobe_profile_record_slot(const strobe_slot_t *slot)
{
    strobe_profile_record(strobe_sampler_thread_at(slot->thread), slot->gc_kind, slot->frames,
                          slot->lines, slot->depth, slot->times, slot->n_times);
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
    for (int i = 0; i < p->threads_len; i++) rb_gc_mark(p->threads[i].thread);
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
    for (const strobe_chunk_t *c = p->first_chunk; c; c = c->next) size += sizeof(*c);
    return size;
}
