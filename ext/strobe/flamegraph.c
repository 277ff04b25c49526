/*
 * flamegraph.c - the data of the HTML flamegraph (lib/strobe/flamegraph.rb
 * and .html), from a result's raw samples (the stack tree of tree.c, the
 * samples' times and threads as samples.c reads them):
 *   - the stack tree of frames (lines merged), with self and total samples:
 *     the aggregated view of all threads;
 *   - per thread a lane: its samples in time order as runs of tree nodes,
 *     each run with its sample count and its span on a time axis shared by
 *     every lane (the timeline view), and its own self samples per node
 *     (the aggregated view of that thread alone).
 *
 * The time axis: microseconds from the first sample. A sample stands for
 * the time up to the next one of its thread, unless that is more than a
 * few steps away (a step: the interval in the time modes, the thread's
 * mean gap in :object and :custom): a thread not sampled for a while (idle
 * in :cpu) leaves a gap. A stretch of
 * over STROBE_FLAME_GAP_US without a sample of any thread (profiles merged
 * from runs far apart) is drawn as a short break: the axis is made of
 * segments, each placed after the last. Without sample times the axis
 * counts samples, in the order recorded.
 *
 * Strobe::Native.flamegraph_data(result, keep). GVL held; not signal-safe.
 * Linear in the samples, plus sorting each thread's samples and the runs by
 * time.
 */
#include "flamegraph.h"
#include "samples.h"
#include <stdlib.h>
#include <string.h>

/* Longer stretches without samples are drawn as a break (1 minute). */
#define STROBE_FLAME_GAP_US ((int64_t)60 * 1000 * 1000)
/* The timeline's runs, all lanes together, are at most this many: a lane
 * with more is downsampled (see sink_run), so the page's size and
 * drawing are bounded by the tree and this, not by the samples. */
#define STROBE_FLAME_MAX_RUNS 200000
/* ... and a lane keeps at least this many (some thousand pixels, zoomed). */
#define STROBE_FLAME_MIN_LANE_RUNS 4000

typedef struct {
    uint32_t node, count;
    int64_t start, end;      /* on the samples' clock, then on the axis */
} flame_run_t;

typedef struct {
    flame_run_t *runs;
    size_t runs_len, runs_capa;
    uint64_t *counts;        /* per tree node: the lane being counted */
    uint32_t *touched;       /* the nodes counts holds, to clear it */
    int64_t *spans;          /* the runs' (start, end), sorted by start */
    int64_t *seg_from, *seg_to, *seg_at;
    size_t segs;
} flame_t;

static void
flame_free(void *arg)
{
    flame_t *f = arg;
    free(f->runs);
    free(f->counts);
    free(f->touched);
    free(f->spans);
    free(f->seg_from);
    free(f->seg_to);
    free(f->seg_at);
    free(f);
}

static void *
flame_alloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) rb_memerror();
    return strobe_advise_huge(p, n * size);
}

static flame_run_t *
push_run(flame_t *f)
{
    if (f->runs_len == f->runs_capa) {
        size_t capa = f->runs_capa ? f->runs_capa * 2 : 1024;
        f->runs = strobe_grow(f->runs, capa, sizeof(flame_run_t));
        f->runs_capa = capa;
    }
    return &f->runs[f->runs_len++];
}

static int
by_start(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The axis segments: the runs' spans merged where they overlap or lie
 * less than STROBE_FLAME_GAP_US apart; each segment placed after the
 * previous one and a break of a 200th of the time covered (at least a
 * microsecond). Returns the axis's width. */
static int64_t
make_segments(flame_t *f, int gaps)
{
    size_t n = f->runs_len;
    f->spans = flame_alloc(2 * n, sizeof(int64_t));
    for (size_t i = 0; i < n; i++) {
        f->spans[2 * i] = f->runs[i].start;
        f->spans[2 * i + 1] = f->runs[i].end;
    }
    qsort(f->spans, n, 2 * sizeof(int64_t), by_start);
    /* How many segments: then as many of each. */
    size_t segs = n ? 1 : 0;
    int64_t reach = n ? f->spans[1] : 0;
    for (size_t i = 1; i < n; i++) {
        int64_t start = f->spans[2 * i], end = f->spans[2 * i + 1];
        if (gaps && start - reach > STROBE_FLAME_GAP_US) {
            segs++;
            reach = end;
        } else if (end > reach) {
            reach = end;
        }
    }
    f->seg_from = flame_alloc(segs, sizeof(int64_t));
    f->seg_to = flame_alloc(segs, sizeof(int64_t));
    f->seg_at = flame_alloc(segs, sizeof(int64_t));
    if (!n) return 0;
    int64_t cover = f->spans[1], covered = 0;
    f->seg_from[0] = f->spans[0];
    f->segs = 1;
    for (size_t i = 1; i < n; i++) {
        int64_t start = f->spans[2 * i], end = f->spans[2 * i + 1];
        if (gaps && start - cover > STROBE_FLAME_GAP_US) {
            f->seg_to[f->segs - 1] = cover;
            covered += cover - f->seg_from[f->segs - 1];
            f->seg_from[f->segs++] = start;
            cover = end;
        } else if (end > cover) {
            cover = end;
        }
    }
    f->seg_to[f->segs - 1] = cover;
    covered += cover - f->seg_from[f->segs - 1];
    int64_t brk = covered / 200 > 1 ? covered / 200 : 1;
    f->seg_at[0] = 0;
    for (size_t i = 1; i < f->segs; i++) f->seg_at[i] = f->seg_at[i - 1] + (f->seg_to[i - 1] - f->seg_from[i - 1]) + brk;
    return f->seg_at[f->segs - 1] + (f->seg_to[f->segs - 1] - f->seg_from[f->segs - 1]);
}

/* Where time t falls on the axis: in the last segment starting at or
 * before it, never past the next segment's start. */
static int64_t
on_axis(const flame_t *f, int64_t t)
{
    size_t lo = 0, hi = f->segs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (f->seg_from[mid] <= t) lo = mid + 1; else hi = mid;
    }
    if (lo == 0) return 0;
    size_t i = lo - 1;
    int64_t at = f->seg_at[i] + (t - f->seg_from[i]);
    return i + 1 < f->segs && at > f->seg_at[i + 1] ? f->seg_at[i + 1] : at;
}

static VALUE
i64_array(const int64_t *v, size_t n)
{
    VALUE a = rb_ary_new_capa((long)n);
    for (size_t i = 0; i < n; i++) rb_ary_push(a, LL2NUM(v[i]));
    return a;
}

/* Where a lane's runs go, each once it is complete: counted (the first
 * pass: how many, and the span they cover), or kept in f->runs, as they
 * are or, where width > 0, downsampled: the lane's span (from the first
 * run's start) cut into buckets width wide, each keeping the run with the
 * most samples in it (its node drawn over the whole bucket, the bucket's
 * samples counted on it), as a screen shows one stack per pixel. A run
 * belongs to the bucket its start falls in; runs apart stay apart (a
 * bucket starts at its first run and ends at its last's end). */
typedef struct {
    flame_t *f;
    int keep;                /* 0: only count */
    size_t runs;             /* complete runs seen */
    int64_t from, to;        /* the first run's start, the last one's end */
    double width;            /* > 0: downsample into buckets this wide */
    size_t bucket;           /* the open bucket (f->runs' last), if any */
    uint32_t most;           /* the most samples of one run in it */
    uint64_t total;          /* its samples */
} run_sink_t;

static void
sink_run(run_sink_t *k, flame_run_t run)
{
    if (k->runs++ == 0) k->from = run.start;
    k->to = run.end;
    if (!k->keep) return;
    if (k->width > 0) {
        size_t bucket = (size_t)((double)(run.start - k->from) / k->width);
        if (k->runs > 1 && bucket == k->bucket) {
            flame_run_t *open = &k->f->runs[k->f->runs_len - 1];
            k->total += run.count;
            if (run.count > k->most) { k->most = run.count; open->node = run.node; }
            if (run.end > open->end) open->end = run.end;
            open->count = k->total > UINT32_MAX ? UINT32_MAX : (uint32_t)k->total;
            return;
        }
        k->bucket = bucket;
        k->most = run.count;
        k->total = run.count;
    }
    *push_run(k->f) = run;
}

/* One lane's samples (order[first, last), time-ordered) as runs, into k.
 * A sample stands for the time up to the thread's next one when that
 * comes within STROBE_FLAME_JOIN steps (a thread that shares a core,
 * sampled in :cpu less often than the interval, stays drawn), else for
 * one step; a run goes on while the node stays the same and its samples
 * join. Where k keeps the runs, the lane's self counts go into counts,
 * then self_node and self_count. */
#define STROBE_FLAME_JOIN 4
static void
lane_runs(run_sink_t *k, const strobe_samples_t *s, const uint32_t *node_of, const uint32_t *order, size_t first,
          size_t last, int64_t step, VALUE self_node, VALUE self_count)
{
    flame_t *f = k->f;
    flame_run_t cur = { 0, 0, 0, 0 };
    int64_t prev = 0;
    size_t touched = 0;
    if (step <= 0) { /* :object, :custom: the thread's mean gap */
        int64_t span = s->time ? s->time[order[last - 1]] - s->time[order[first]] : (int64_t)(last - first);
        step = last - first > 1 ? span / (int64_t)(last - first - 1) : 1;
        if (step <= 0) step = 1;
    }
    for (size_t i = first; i < last; i++) {
        size_t at = order[i];
        uint32_t node = node_of[at];
        int64_t t = s->time ? s->time[at] : (int64_t)at;
        if (k->keep && !f->counts[node]++) f->touched[touched++] = node;
        int joined = cur.count && t - prev <= STROBE_FLAME_JOIN * step; /* t >= prev: in time order */
        prev = t;
        if (joined && cur.node == node && cur.count < UINT32_MAX) {
            cur.end = t + step;
            cur.count++;
            continue;
        }
        if (joined) cur.end = t;
        if (cur.count) sink_run(k, cur);
        cur = (flame_run_t){ node, 1, t, t + step };
    }
    if (cur.count) sink_run(k, cur);
    for (size_t j = 0; j < touched; j++) {
        uint32_t n = f->touched[j];
        rb_ary_push(self_node, UINT2NUM(n));
        rb_ary_push(self_count, ULL2NUM(f->counts[n]));
        f->counts[n] = 0;
    }
}

static int
time_mode(VALUE result)
{
    VALUE mode = rb_hash_lookup2(result, strobe_sym("mode"), Qnil);
    if (RB_TYPE_P(mode, T_SYMBOL)) mode = rb_sym2str(mode);
    if (!RB_TYPE_P(mode, T_STRING)) return 0;
    return rb_str_equal(mode, rb_str_new_cstr("wall")) == Qtrue || rb_str_equal(mode, rb_str_new_cstr("cpu")) == Qtrue;
}

/* Strobe::Native.flamegraph_data(result, keep) -> {frame_ids:, parent:,
 * frame:, self:, total:, lanes: {thread:, samples:, runs:, self:},
 * axis: {unit:, width:, seg_from:, seg_to:, seg_at:}}. Per thread i:
 * runs[i] is {node:, count:, start:, end:} (start and end on the axis,
 * whose segments map the samples' clock onto it: seg_from..seg_to placed
 * at seg_at), self[i] is [nodes, counts]. */
static VALUE
flamegraph_data(report_t *r)
{
    uint32_t *node;
    strobe_samples_t *s = strobe_samples_columns(r, "a flamegraph", &node);
    flame_t *f = flame_alloc(1, sizeof(flame_t));
    r->cleanup = flame_free;
    r->cleanup_arg = f;
    /* The tree, and each sample's leaf node in it. */
    r->sample_node = node;
    r->sample_nodes = s->n;
    strobe_report_tree(r);
    VALUE h = strobe_report_tree_hash(r);

    /* The lanes, in the order of the result's threads: their runs counted
     * first, then kept. Past STROBE_FLAME_MAX_RUNS in all, each lane gets
     * an equal share of them (at least STROBE_FLAME_MIN_LANE_RUNS), its
     * runs downsampled to fit as they are made: no more are ever held. */
    size_t *starts;
    const uint32_t *order = strobe_samples_by_thread(r, s, &starts);
    long threads = RARRAY_LEN(s->thread_ids);
    int64_t step = time_mode(r->result) && s->time ? s->interval : 0;
    f->counts = flame_alloc(r->nodes, sizeof(uint64_t));
    f->touched = flame_alloc(r->nodes, sizeof(uint32_t));
    size_t *lane_first = r->scratch[0] = ALLOC_N(size_t, (size_t)threads + 1);
    run_sink_t *sinks = r->scratch[1] = ZALLOC_N(run_sink_t, (size_t)(threads ? threads : 1));
    size_t total = 0;
    for (long t = 0; t < threads; t++) {
        sinks[t].f = f;
        if (starts[t + 1] > starts[t]) lane_runs(&sinks[t], s, node, order, starts[t], starts[t + 1], step, Qnil, Qnil);
        total += sinks[t].runs;
    }
    size_t share = STROBE_FLAME_MAX_RUNS / (size_t)(threads ? threads : 1);
    if (share < STROBE_FLAME_MIN_LANE_RUNS) share = STROBE_FLAME_MIN_LANE_RUNS;
    VALUE samples = rb_ary_new(), self_list = rb_ary_new();
    for (long t = 0; t < threads; t++) {
        run_sink_t *k = &sinks[t];
        lane_first[t] = f->runs_len;
        VALUE self_node = rb_ary_new(), self_count = rb_ary_new();
        rb_ary_push(self_list, rb_assoc_new(self_node, self_count));
        rb_ary_push(samples, SIZET2NUM(starts[t + 1] - starts[t]));
        if (starts[t + 1] == starts[t]) continue;
        if (total > STROBE_FLAME_MAX_RUNS && k->runs > share) {
            k->width = (double)(k->to - k->from) / (double)share;
            if (!(k->width > 0)) k->width = 1;
        }
        k->keep = 1;
        k->runs = 0;
        lane_runs(k, s, node, order, starts[t], starts[t + 1], step, self_node, self_count);
    }
    lane_first[threads] = f->runs_len;
    /* What made the lanes goes before their Ruby arrays are made. */
    xfree(r->scratch[3]); r->scratch[3] = NULL; /* order */
    xfree(r->scratch[7]); r->scratch[7] = NULL; /* its sort's */
    free(f->counts); f->counts = NULL;
    free(f->touched); f->touched = NULL;

    /* Each lane's runs, on the axis. */
    int64_t width = make_segments(f, s->time != NULL);
    free(f->spans); f->spans = NULL;
    VALUE runs_list = rb_ary_new_capa(threads);
    for (long t = 0; t < threads; t++) {
        long len = (long)(lane_first[t + 1] - lane_first[t]);
        VALUE run_node = rb_ary_new_capa(len), run_count = rb_ary_new_capa(len), run_start = rb_ary_new_capa(len),
              run_end = rb_ary_new_capa(len);
        for (size_t i = lane_first[t]; i < lane_first[t + 1]; i++) {
            const flame_run_t *run = &f->runs[i];
            rb_ary_push(run_node, UINT2NUM(run->node));
            rb_ary_push(run_count, UINT2NUM(run->count));
            rb_ary_push(run_start, LL2NUM(on_axis(f, run->start)));
            rb_ary_push(run_end, LL2NUM(on_axis(f, run->end)));
        }
        VALUE lane = rb_hash_new();
        rb_hash_aset(lane, strobe_sym("node"), run_node);
        rb_hash_aset(lane, strobe_sym("count"), run_count);
        rb_hash_aset(lane, strobe_sym("start"), run_start);
        rb_hash_aset(lane, strobe_sym("end"), run_end);
        rb_ary_push(runs_list, lane);
    }

    VALUE lanes = rb_hash_new();
    rb_hash_aset(lanes, strobe_sym("thread"), s->thread_ids);
    rb_hash_aset(lanes, strobe_sym("samples"), samples);
    rb_hash_aset(lanes, strobe_sym("runs"), runs_list);
    rb_hash_aset(lanes, strobe_sym("self"), self_list);
    rb_hash_aset(h, strobe_sym("lanes"), lanes);

    VALUE axis = rb_hash_new();
    rb_hash_aset(axis, strobe_sym("unit"), strobe_sym(s->time ? "us" : "samples"));
    rb_hash_aset(axis, strobe_sym("width"), LL2NUM(width));
    rb_hash_aset(axis, strobe_sym("seg_from"), i64_array(f->seg_from, f->segs));
    rb_hash_aset(axis, strobe_sym("seg_to"), i64_array(f->seg_to, f->segs));
    rb_hash_aset(axis, strobe_sym("seg_at"), i64_array(f->seg_at, f->segs));
    rb_hash_aset(h, strobe_sym("axis"), axis);
    return h;
}

static VALUE
flamegraph_body(VALUE arg)
{
    report_args_t *a = (report_args_t *)arg;
    strobe_report_load(a->r, a->result, a->keep, 1);
    return flamegraph_data(a->r);
}

/* Strobe::Native.flamegraph_data(result, keep): see flamegraph_data. */
REPORT_METHOD(flamegraph)

void
strobe_flamegraph_define(VALUE mNative)
{
    rb_define_singleton_method(mNative, "flamegraph_data", native_report_flamegraph, 2);
}
