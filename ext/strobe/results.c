/*
 * results.c - builds the result Hash from the stack table and the profile.
 *
 * Aggregates are derived here from per-node self counts, in one pass over
 * the nodes (whose ids are topologically ordered: parent < child):
 *   node total  = self + the totals of its children;
 *   frame samples       = sum of self over the frame's nodes;
 *   frame total_samples = sum of node totals over the frame's nodes that have
 *                         no ancestor of the same frame (recursion once);
 *   edges[caller][callee] and lines[line] = [total, self], per occurrence,
 * which are exactly stackprof's definitions. With raw: true the stackprof
 * arrays (raw, raw_lines, raw_sample_timestamps, raw_timestamp_deltas) and
 * Strobe's raw_sample_threads are written from the sample log; consecutive
 * samples of the same stack share one raw entry with a repeat count.
 *
 * Helpers strobe_results_frames()/strobe_results_raw() are shared with
 * compact.c, which rebuilds the same keys from a file's node table.
 *
 * GVL held; not signal-safe.
 */
#include "results.h"
#include "stacks.h"
#include "clock.h"
#include "native.h"
#include "profile.h"
#include "sampler.h"
#include <unistd.h>
#include <stdlib.h>
#include <string.h>


static const char *const pseudo_frame_names[] = {
    [STROBE_FRAME_GC] = "(garbage collection)",
    [STROBE_FRAME_MARKING] = "(marking)",
    [STROBE_FRAME_SWEEPING] = "(sweeping)",
    [STROBE_FRAME_TRUNCATED] = "(truncated)",
};

static const char *const mode_names[] = {
    [STROBE_MODE_WALL] = "wall",
    [STROBE_MODE_CPU] = "cpu",
    [STROBE_MODE_OBJECT] = "object",
    [STROBE_MODE_CUSTOM] = "custom",
};

static const char *const state_names[STROBE_STATES] = {
    [STROBE_STATE_RUNNING] = "running",
    [STROBE_STATE_WAITING] = "waiting",
    [STROBE_STATE_BLOCKED] = "blocked",
};

VALUE
strobe_state_sym(int state)
{
    return state > 0 && state < STROBE_STATES ? strobe_sym(state_names[state]) : Qnil;
}

int
strobe_state_of(VALUE sym)
{
    for (int s = 1; s < STROBE_STATES; s++)
        if (sym == strobe_sym(state_names[s])) return s;
    return -1;
}

/* Adds n to hash[key], an Integer. */
static void
hash_add(VALUE hash, VALUE key, uint64_t n)
{
    VALUE cur = rb_hash_lookup2(hash, key, Qundef);
    uint64_t sum = n + (cur == Qundef ? 0 : NUM2ULL(cur));
    rb_hash_aset(hash, key, ULL2NUM(sum));
}

static VALUE
child_hash(VALUE details, VALUE key)
{
    VALUE h = rb_hash_lookup2(details, key, Qundef);
    if (h == Qundef) {
        h = rb_hash_new();
        rb_hash_aset(details, key, h);
    }
    return h;
}

/* Aggregates (see the file comment) into frames_hash[frame_ids[f]]. The
 * details Hashes must already hold name/file/line; this adds the counts. */
void
strobe_results_aggregate(const strobe_node_t *nodes, uint32_t nodes_len, const uint64_t *self,
                         VALUE details_by_frame, VALUE frame_ids, uint32_t frames_len, int aggregate)
{
    uint64_t *total = calloc(nodes_len ? nodes_len : 1, sizeof(uint64_t));
    uint64_t *frame_self = calloc(frames_len ? frames_len : 1, sizeof(uint64_t));
    uint64_t *frame_total = calloc(frames_len ? frames_len : 1, sizeof(uint64_t));
    if (!total || !frame_self || !frame_total) {
        free(total); free(frame_self); free(frame_total);
        rb_memerror();
    }
    for (uint32_t n = 1; n < nodes_len; n++) total[n] = self[n];
    for (uint32_t n = nodes_len; n-- > 1;)
        if (nodes[n].parent) total[nodes[n].parent] += total[n];

    VALUE sym_edges = strobe_sym("edges"), sym_lines = strobe_sym("lines");
    for (uint32_t n = 1; n < nodes_len; n++) {
        if (!total[n]) continue;
        uint32_t f = nodes[n].frame;
        frame_self[f] += self[n];
        int recursive = 0;
        for (uint32_t a = nodes[n].parent; a; a = nodes[a].parent)
            if (nodes[a].frame == f) { recursive = 1; break; }
        if (!recursive) frame_total[f] += total[n];
        if (!aggregate) continue;

        uint32_t parent = nodes[n].parent;
        if (parent) {
            VALUE caller = RARRAY_AREF(details_by_frame, nodes[parent].frame);
            hash_add(child_hash(caller, sym_edges), RARRAY_AREF(frame_ids, f), total[n]);
        }
        if (nodes[n].line > 0) {
            VALUE lines = child_hash(RARRAY_AREF(details_by_frame, f), sym_lines);
            VALUE key = INT2FIX(nodes[n].line);
            VALUE pair = rb_hash_lookup2(lines, key, Qundef);
            if (pair == Qundef) {
                pair = rb_ary_new_from_args(2, INT2FIX(0), INT2FIX(0));
                rb_hash_aset(lines, key, pair);
            }
            rb_ary_store(pair, 0, ULL2NUM(NUM2ULL(RARRAY_AREF(pair, 0)) + total[n]));
            rb_ary_store(pair, 1, ULL2NUM(NUM2ULL(RARRAY_AREF(pair, 1)) + self[n]));
        }
    }
    VALUE sym_total = strobe_sym("total_samples"), sym_samples = strobe_sym("samples");
    for (uint32_t f = 0; f < frames_len; f++) {
        VALUE d = RARRAY_AREF(details_by_frame, f);
        /* keep stackprof's key order: counts before edges and lines */
        VALUE edges = rb_hash_delete(d, sym_edges), lines = rb_hash_delete(d, sym_lines);
        rb_hash_aset(d, sym_total, ULL2NUM(frame_total[f]));
        rb_hash_aset(d, sym_samples, ULL2NUM(frame_self[f]));
        if (!NIL_P(edges)) rb_hash_aset(d, sym_edges, edges);
        if (!NIL_P(lines)) rb_hash_aset(d, sym_lines, lines);
    }
    free(total);
    free(frame_self);
    free(frame_total);
}

/* Writes one stack, root first, to raw and raw_lines as stackprof does:
 * its length, then the frames (or lines), then the repeat count. */
typedef struct {
    VALUE raw, raw_lines;
    uint32_t *path;
    uint32_t path_capa;
} strobe_raw_writer_t;

static void
raw_emit(strobe_raw_writer_t *w, const strobe_node_t *nodes, uint32_t node, uint64_t count, VALUE frame_ids)
{
    uint32_t depth = 0;
    for (uint32_t n = node; n; n = nodes[n].parent) {
        if (depth == w->path_capa) {
            w->path_capa = w->path_capa ? w->path_capa * 2 : 256;
            uint32_t *path = realloc(w->path, w->path_capa * sizeof(uint32_t));
            if (!path) rb_memerror();
            w->path = path;
        }
        w->path[depth++] = n;
    }
    rb_ary_push(w->raw, UINT2NUM(depth));
    rb_ary_push(w->raw_lines, UINT2NUM(depth));
    for (uint32_t i = depth; i-- > 0;) {
        const strobe_node_t *n = &nodes[w->path[i]];
        rb_ary_push(w->raw, RARRAY_AREF(frame_ids, n->frame));
        rb_ary_push(w->raw_lines, INT2NUM(n->line));
    }
    rb_ary_push(w->raw, ULL2NUM(count));
    rb_ary_push(w->raw_lines, ULL2NUM(count));
}

/* Sets the raw keys on result from parallel per-sample arrays; times,
 * sample_threads and sample_states may be NULL (a profile without them gets
 * no such keys). */
void
strobe_results_raw(VALUE result, const strobe_node_t *nodes, uint32_t count,
                   const uint32_t *sample_nodes, const int64_t *times, VALUE thread_ids,
                   const uint16_t *sample_threads, const uint8_t *sample_states,
                   int64_t start_us, VALUE frame_ids)
{
    strobe_raw_writer_t w = { rb_ary_new(), rb_ary_new(), NULL, 0 };
    VALUE stamps = rb_ary_new_capa(count), deltas = rb_ary_new_capa(count);
    VALUE threads = rb_ary_new_capa(count);
    VALUE states = sample_states ? rb_ary_new_capa(count) : Qnil;
    VALUE state_syms[STROBE_STATES];
    for (int s = 0; s < STROBE_STATES; s++) state_syms[s] = strobe_state_sym(s);
    int64_t prev = start_us;
    uint32_t run_node = 0;
    uint64_t run = 0;
    for (uint32_t i = 0; i < count; i++) {
        if (run && sample_nodes[i] != run_node) {
            raw_emit(&w, nodes, run_node, run, frame_ids);
            run = 0;
        }
        run_node = sample_nodes[i];
        run++;
        if (times) {
            rb_ary_push(stamps, LL2NUM(times[i]));
            rb_ary_push(deltas, LL2NUM(times[i] - prev));
            prev = times[i];
        }
        if (sample_threads) rb_ary_push(threads, RARRAY_AREF(thread_ids, sample_threads[i]));
        if (sample_states) rb_ary_push(states, state_syms[sample_states[i] & (STROBE_STATES - 1)]);
    }
    if (run) raw_emit(&w, nodes, run_node, run, frame_ids);
    free(w.path);
    rb_hash_aset(result, strobe_sym("raw"), w.raw);
    rb_hash_aset(result, strobe_sym("raw_lines"), w.raw_lines);
    if (times) {
        rb_hash_aset(result, strobe_sym("raw_sample_timestamps"), stamps);
        rb_hash_aset(result, strobe_sym("raw_timestamp_deltas"), deltas);
    }
    if (sample_threads) rb_hash_aset(result, strobe_sym("raw_sample_threads"), threads);
    if (sample_states) rb_hash_aset(result, strobe_sym("raw_sample_states"), states);
}

/* {running: n, waiting: n, blocked: n} (samples of unknown state left out). */
static VALUE
strobe_results_states(const uint64_t *counts)
{
    VALUE h = rb_hash_new();
    for (int s = 1; s < STROBE_STATES; s++) rb_hash_aset(h, strobe_state_sym(s), ULL2NUM(counts[s]));
    return h;
}

static VALUE
frame_details(const strobe_frame_t *f)
{
    VALUE d = rb_hash_new();
    if (f->kind == STROBE_FRAME_NATIVE) {
        strobe_native_details(f->value, d);
        return d;
    }
    if (f->kind != STROBE_FRAME_RUBY) {
        rb_hash_aset(d, strobe_sym("name"), rb_str_new_cstr(pseudo_frame_names[f->kind]));
        rb_hash_aset(d, strobe_sym("file"), rb_str_new_cstr(""));
        return d;
    }
    VALUE file = rb_profile_frame_absolute_path(f->value);
    if (NIL_P(file)) file = rb_profile_frame_path(f->value);
    VALUE line = rb_profile_frame_first_lineno(f->value);
    rb_hash_aset(d, strobe_sym("name"), rb_profile_frame_full_label(f->value));
    rb_hash_aset(d, strobe_sym("file"), file);
    if (line != INT2FIX(0)) rb_hash_aset(d, strobe_sym("line"), line);
    return d;
}

/* A running thread's name now, an ended one's as it was when it ended. */
static VALUE
thread_name(const strobe_profile_thread_t *pt)
{
    VALUE name = NIL_P(pt->thread) ? pt->name : rb_funcall(pt->thread, rb_intern("name"), 0);
    return NIL_P(name) ? name : rb_str_dup(name);
}

/* The sample log flattened: per sample its node, time, thread and state. */
typedef struct {
    size_t count;
    uint32_t *nodes;
    int64_t *times;
    uint16_t *threads;
    uint8_t *states;
} sample_log_t;

static void
log_free(sample_log_t *log)
{
    free(log->nodes); free(log->times); free(log->threads); free(log->states);
    memset(log, 0, sizeof(*log));
}

/* Flattens p's sample log into log (malloc); -1 if memory ran out (log
 * then holds nothing). Plain C: callable under the profile lock. */
static int
log_flatten(const strobe_profile_t *p, sample_log_t *log)
{
    size_t count = 0;
    for (const strobe_chunk_t *c = p->first_chunk; c; c = c->next) count += c->len;
    log->count = count;
    log->nodes = malloc((count ? count : 1) * sizeof(uint32_t));
    log->times = malloc((count ? count : 1) * sizeof(int64_t));
    log->threads = malloc((count ? count : 1) * sizeof(uint16_t));
    log->states = malloc(count ? count : 1);
    if (!log->nodes || !log->times || !log->threads || !log->states) {
        log_free(log);
        return -1;
    }
    size_t i = 0;
    for (const strobe_chunk_t *c = p->first_chunk; c; c = c->next)
        for (uint32_t k = 0; k < c->len; k++, i++) {
            log->nodes[i] = c->samples[k].node;
            log->times[i] = c->base_us + c->samples[k].time_offset;
            log->threads[i] = c->samples[k].thread;
            log->states[i] = (uint8_t)c->samples[k].flags;
        }
    return 0;
}

/* What results read besides the profile, taken with it. */
typedef struct {
    uint64_t missed, unsampled;
    int64_t end_us;          /* the latest stop, or when the copy was taken while running */
} counters_t;

/* The result Hash of p, a copy of the profile, its sample log flattened
 * into log when p kept raw samples. */
static VALUE
results_of(const strobe_profile_t *p, const sample_log_t *log, const counters_t *c)
{
    const strobe_stack_table_t *st = &p->table;
    VALUE result = rb_hash_new();
    rb_hash_aset(result, strobe_sym("version"), DBL2NUM(1.2));
    rb_hash_aset(result, strobe_sym("mode"), strobe_sym(mode_names[p->mode]));
    rb_hash_aset(result, strobe_sym("interval"), p->mode == STROBE_MODE_CUSTOM ? Qnil : LONG2NUM(p->interval));
    rb_hash_aset(result, strobe_sym("samples"), ULL2NUM(p->samples));
    rb_hash_aset(result, strobe_sym("gc_samples"), ULL2NUM(p->gc_samples));
    rb_hash_aset(result, strobe_sym("missed_samples"), ULL2NUM(c->missed));
    /* Strobe's: samples whose stack was deeper than STROBE_MAX_DEPTH frames;
     * they keep the innermost ones under a "(truncated)" root frame. */
    rb_hash_aset(result, strobe_sym("truncated_samples"), ULL2NUM(p->truncated_samples));
    /* Strobe's, with native: true: native frames were woven in, and how many
     * samples' native stacks did not reach the interpreter (libunwind could
     * not walk them) and were left with their Ruby frames only. */
    /* Strobe's: the JIT compiler that was on (absent for the interpreter). */
    if (p->jit) rb_hash_aset(result, strobe_sym("jit"), strobe_sym(p->jit == STROBE_JIT_YJIT ? "yjit" : "zjit"));
    if (p->native) {
        rb_hash_aset(result, strobe_sym("native"), Qtrue);
        rb_hash_aset(result, strobe_sym("native_incomplete_samples"), ULL2NUM(p->native_incomplete));
    }
    rb_hash_aset(result, strobe_sym("metadata"), rb_hash_new());
    /* Strobe's: when profiling first started (Unix time, microseconds) and
     * for how long (microseconds from the first start to the latest stop,
     * or to now while running). */
    rb_hash_aset(result, strobe_sym("started_at"), LL2NUM(p->started_at_us));
    rb_hash_aset(result, strobe_sym("duration"), LL2NUM(c->end_us - p->start_us));
    rb_hash_aset(result, strobe_sym("pid"), INT2NUM(getpid()));

    VALUE frames = rb_hash_new(), details = rb_ary_new_capa(st->frames_len);
    VALUE frame_ids = rb_ary_new_capa(st->frames_len);
    for (uint32_t f = 0; f < st->frames_len; f++) {
        rb_ary_push(details, frame_details(&st->frames[f]));
        rb_ary_push(frame_ids, UINT2NUM(f));
    }
    /* Listed in stackprof's order: by the first sample that saw each frame,
     * and within that sample innermost first, by the deepest level it was
     * seen at (frames are interned outermost first, and a sample's new
     * frames are few, so an insertion sort). */
    uint32_t *order = malloc(sizeof(uint32_t) * (st->frames_len ? st->frames_len : 1));
    if (!order) rb_memerror();
    for (uint32_t start = 0; start < st->frames_len;) {
        uint32_t end = start + 1;
        while (end < st->frames_len && st->frames[end].batch == st->frames[start].batch) end++;
        for (uint32_t i = start; i < end; i++) {
            uint32_t j = i;
            while (j > start && st->frames[order[j - 1]].level < st->frames[i].level) { order[j] = order[j - 1]; j--; }
            order[j] = i;
        }
        start = end;
    }
    for (uint32_t i = 0; i < st->frames_len; i++) rb_hash_aset(frames, UINT2NUM(order[i]), RARRAY_AREF(details, order[i]));
    free(order);
    rb_hash_aset(result, strobe_sym("frames"), frames);

    uint64_t *self = calloc(st->nodes_len, sizeof(uint64_t));
    if (!self) rb_memerror();
    if (p->node_self) memcpy(self, p->node_self, sizeof(uint64_t) * (p->node_self_capa < st->nodes_len ? p->node_self_capa : st->nodes_len));
    strobe_results_aggregate(st->nodes, st->nodes_len, self, details, frame_ids, st->frames_len, p->aggregate);
    free(self);
    /* After a cut, frames only earlier periods had. */
    if (p->cut) {
        VALUE sym_total = strobe_sym("total_samples");
        for (uint32_t f = 0; f < st->frames_len; f++) {
            VALUE total = rb_hash_aref(RARRAY_AREF(details, f), sym_total);
            if (NIL_P(total) || total == INT2FIX(0)) rb_hash_delete(frames, UINT2NUM(f));
        }
    }

    /* Keyed by kernel tid. A thread with no tid of its own gets an id from
     * STROBE_SHARED_THREAD_ID_BASE up (never a tid): one Ruby scheduled M:N
     * (it also says mn: true), or one on a native thread an earlier thread
     * of the profile ran on (Ruby 3.1's thread cache). */
    VALUE threads = rb_hash_new(), thread_ids = rb_ary_new_capa(p->threads_len);
    VALUE sym_name = strobe_sym("name"), sym_samples = strobe_sym("samples");
    /* After a cut, threads with markers in this period are listed too. */
    /* (A String's buffer: freed by GC however the building ends; held on
     * the stack below, so pinned.) */
    VALUE marked = p->cut ? rb_str_new(NULL, (long)p->threads_len + 1) : Qnil;
    uint8_t *has_markers = NIL_P(marked) ? NULL : (uint8_t *)RSTRING_PTR(marked);
    if (has_markers) memset(has_markers, 0, (size_t)p->threads_len + 1);
    for (size_t m = 0; has_markers && m < p->markers.len; m++) {
        int i = p->markers.items[m].thread;
        if (i >= 0 && i < p->threads_len) has_markers[i] = 1;
    }
    for (int i = 0; i < p->threads_len; i++) {
        int mn = p->threads[i].mn;
        VALUE id = INT2NUM(p->threads[i].tid);
        if (mn || rb_hash_lookup2(threads, id, Qundef) != Qundef) id = INT2NUM(STROBE_SHARED_THREAD_ID_BASE + i);
        rb_ary_push(thread_ids, id);
        if (p->cut && p->threads[i].samples == 0 && !has_markers[i]) continue; /* only in earlier periods */
        VALUE info = rb_hash_lookup2(threads, id, Qundef);
        if (info == Qundef) {
            info = rb_hash_new();
            rb_hash_aset(info, sym_name, thread_name(&p->threads[i]));
            rb_hash_aset(info, sym_samples, INT2FIX(0));
            if (p->threads[i].thread == rb_thread_main()) rb_hash_aset(info, strobe_sym("main"), Qtrue);
            if (mn) rb_hash_aset(info, strobe_sym("mn"), Qtrue);
            rb_hash_aset(threads, id, info);
        }
        hash_add(info, sym_samples, p->threads[i].samples);
        if (p->track_states) {
            VALUE states = rb_hash_lookup2(info, strobe_sym("states"), Qundef);
            if (states == Qundef) rb_hash_aset(info, strobe_sym("states"), strobe_results_states(p->threads[i].states));
            else
                for (int s = 1; s < STROBE_STATES; s++) hash_add(states, strobe_state_sym(s), p->threads[i].states[s]);
        }
    }
    RB_GC_GUARD(marked);
    rb_hash_aset(result, strobe_sym("threads"), threads);
    if (p->mode == STROBE_MODE_WALL || p->mode == STROBE_MODE_CPU) {
        rb_hash_aset(result, strobe_sym("timer"),
                     strobe_sym(p->safepoint_timer ? "safepoints" : p->process_timer ? "process" : "threads"));
        /* What the signal-free scheduler could sample: every profiled
         * thread where Ruby reads other threads' frames (3.2+), else only
         * threads holding the GVL when a sample was due, and ones whose
         * stack stayed the same (repeated by the timer). */
#ifdef HAVE_RB_PROFILE_THREAD_FRAMES
        if (p->safepoint_timer) rb_hash_aset(result, strobe_sym("safepoint_reach"), strobe_sym("all_threads"));
#else
        if (p->safepoint_timer) rb_hash_aset(result, strobe_sym("safepoint_reach"), strobe_sym("running_thread"));
#endif
    }
    uint64_t unsampled = c->unsampled;
    if (unsampled) rb_hash_aset(result, strobe_sym("unsampled_threads"), ULL2NUM(unsampled));

    if (p->markers.len) rb_hash_aset(result, strobe_sym("markers"), strobe_markers_results(&p->markers, thread_ids));
    if (p->markers.dropped) rb_hash_aset(result, strobe_sym("dropped_markers"), ULL2NUM(p->markers.dropped));
    if (p->raw && log->count)
        strobe_stacks_attach(result, strobe_stacks_new(st->nodes, st->nodes_len, frame_ids, log->count, log->nodes,
                                                       log->times, thread_ids, log->threads,
                                                       p->track_states ? log->states : NULL, p->start_us));
    return result;
}

/* ---- building from a copy ---------------------------------------------------
 *
 * Results, and snapshots taken while sampling goes on, are built from a copy
 * of the parts of the profile they read, taken under the profile lock
 * (plain memory copies: nothing Ruby runs under it); the timer thread goes
 * on draining meanwhile. Results then clear the profile at once, before any
 * Ruby code runs: building calls Ruby (Thread#name, allocations), where
 * another thread may switch in and call results or start, and must find the
 * profile already taken. A hidden object marks (and pins) the copy's frames
 * and Threads while the result is built. */

typedef struct {
    strobe_profile_t copy;   /* table.frames/nodes, node_self, threads: own copies */
    sample_log_t log;
    counters_t counters;
    int failed;
} snapshot_t;

static void
snapshot_mark(void *ptr)
{
    const snapshot_t *s = ptr;
    if (!s) return;
    strobe_stack_table_mark(&s->copy.table);
    for (int i = 0; i < s->copy.threads_len; i++) {
        rb_gc_mark(s->copy.threads[i].thread);
        rb_gc_mark(s->copy.threads[i].name);
    }
    strobe_markers_mark(&s->copy.markers);
}

static const rb_data_type_t snapshot_type = {
    .wrap_struct_name = "Strobe::Native::Snapshot",
    .function = { .dmark = snapshot_mark },
};

static void *
copy_of(const void *src, size_t n, size_t size, int *failed)
{
    void *p = malloc((n ? n : 1) * size);
    if (!p) { *failed = 1; return NULL; }
    if (n) memcpy(p, src, n * size);
    return p;
}

/* Under the profile lock. */
static void
snapshot_copy(void *arg)
{
    snapshot_t *s = arg;
    const strobe_profile_t *p = &strobe_profile;
    strobe_profile_t *c = &s->copy;
    *c = *p;
    c->first_chunk = c->last_chunk = NULL;
    memset(&c->table, 0, sizeof(c->table));
    c->node_self = NULL;
    c->threads = NULL;
    c->threads_len = 0;
    c->table.frames_len = p->table.frames_len;
    c->table.nodes_len = p->table.nodes_len;
    c->table.frames = copy_of(p->table.frames, p->table.frames_len, sizeof(strobe_frame_t), &s->failed);
    c->table.nodes = copy_of(p->table.nodes, p->table.nodes_len, sizeof(strobe_node_t), &s->failed);
    uint32_t self_len = p->node_self_capa < p->table.nodes_len ? p->node_self_capa : p->table.nodes_len;
    c->node_self = calloc(p->table.nodes_len ? p->table.nodes_len : 1, sizeof(uint64_t));
    if (!c->node_self) s->failed = 1;
    else if (p->node_self && self_len) memcpy(c->node_self, p->node_self, self_len * sizeof(uint64_t));
    c->node_self_capa = p->table.nodes_len;
    if (!c->table.frames) c->table.frames_len = 0; /* what snapshot_mark walks */
    if (!c->table.nodes) c->table.nodes_len = 0;
    c->threads = copy_of(p->threads, (size_t)p->threads_len, sizeof(strobe_profile_thread_t), &s->failed);
    if (c->threads) c->threads_len = p->threads_len;
    if (strobe_markers_copy(&c->markers, &p->markers) < 0) s->failed = 1;
    if (!s->failed && p->raw && log_flatten(p, &s->log) < 0) s->failed = 1;
    s->counters.missed = strobe_profile_missed();
    s->counters.unsampled = strobe_sampler_unsampled_threads();
    s->counters.end_us = strobe_sampler_running() || !p->stop_us ? strobe_now_us() : p->stop_us;
}

static VALUE
snapshot_free(VALUE holder)
{
    snapshot_t *s = DATA_PTR(holder);
    DATA_PTR(holder) = NULL;
    free(s->copy.table.frames);
    free(s->copy.table.nodes);
    free(s->copy.node_self);
    free(s->copy.threads);
    strobe_markers_free(&s->copy.markers);
    log_free(&s->log);
    free(s);
    return Qnil;
}

static VALUE
snapshot_body(VALUE holder)
{
    snapshot_t *s = DATA_PTR(holder);
    if (s->failed) rb_memerror();
    return results_of(&s->copy, &s->log, &s->counters);
}

/* The result built from a copy of the profile; with take, the profile is
 * cleared as soon as it is copied; with cut, sampling goes on into an
 * emptied profile, from the instant the copy ends (nothing is lost or
 * counted twice between the two). */
enum { COPY_KEEP, COPY_TAKE, COPY_CUT };

static VALUE
results_from_copy(int how)
{
    strobe_sampler_flush();
    strobe_profile_drop_inherited(); /* a forked child's copy: its parent's to report */
    if (!strobe_profile.active) return Qnil;
    /* The holder first: making it may run a GC, which must not find a
     * half-made copy (an empty one marks nothing). */
    VALUE holder = TypedData_Wrap_Struct(0, &snapshot_type, NULL);
    snapshot_t *s = calloc(1, sizeof(*s));
    if (!s) rb_memerror();
    DATA_PTR(holder) = s;
    strobe_profile_lock();
    snapshot_copy(s);
    if (how == COPY_CUT && !s->failed) s->counters.missed = strobe_profile_cut(s->counters.end_us);
    strobe_profile_unlock();
    if (how == COPY_TAKE) {
        strobe_profile_clear();
        strobe_capture_reset();
        strobe_sampler_forget_unsampled();
    }
    VALUE result = rb_ensure(snapshot_body, holder, snapshot_free, holder);
    RB_GC_GUARD(holder);
    return result;
}

VALUE
strobe_results_take(void)
{
    return results_from_copy(COPY_TAKE);
}

VALUE
strobe_results_snapshot(int cut)
{
    return results_from_copy(cut ? COPY_CUT : COPY_KEEP);
}
