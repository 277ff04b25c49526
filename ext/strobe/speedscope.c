/*
 * speedscope.c - a result in speedscope's file format
 * (https://www.speedscope.app/file-format-schema.json).
 *
 * shared.frames lists each frame (method) the raw samples reach, with its
 * file and first line; then one "sampled" profile per thread, its samples
 * (frame indexes, root first) in time order, consecutive identical stacks
 * merged into one with their weights added up. Weights:
 *   :wall   microseconds from each sample to the thread's next (the last
 *           one: an interval), so the time-order view is a timeline;
 *   :cpu    the interval per sample (microseconds of the thread's CPU);
 *   :object the interval per sample (allocations; unit "none");
 *   :custom 1 per sample (unit "none").
 * A profile's startValue is its first sample's time from the start of
 * profiling, so the threads line up.
 *
 * Written as JSON into out.h's out_t (streamed to a sink in chunks).
 * GVL held; not signal-safe.
 */
#include "export.h"

/* The table frames of node's stack, root first, as JSON numbers. */
static void
out_stack(out_t *o, const strobe_samples_t *t, uint32_t node, uint32_t *path, size_t capa)
{
    size_t depth = 0;
    for (uint32_t n = node; n && depth < capa; n = t->nodes[n].parent) path[depth++] = t->nodes[n].frame;
    OUT_LIT(o, "[");
    for (size_t i = depth; i > 0; i--) {
        out_u64(o, path[i - 1], 0);
        if (i > 1) OUT_LIT(o, ",");
    }
    OUT_LIT(o, "]");
}

VALUE
strobe_speedscope_body(report_t *r)
{
    VALUE result = r->result;
    strobe_samples_t *s = r->samples_read;
    size_t *starts;
    uint32_t *order = strobe_samples_by_thread(r, s, &starts);
    const strobe_samples_t *t = s;

    /* Every node's depth bounds the path buffer: the deepest node. */
    uint32_t *depth = r->scratch[0] = ZALLOC_N(uint32_t, t->nodes_len);
    uint32_t max_depth = 0;
    for (uint32_t n = 1; n < t->nodes_len; n++) {
        depth[n] = depth[t->nodes[n].parent] + 1;
        if (depth[n] > max_depth) max_depth = depth[n];
    }
    uint32_t *path = r->scratch[1] = ALLOC_N(uint32_t, max_depth + 1);
    /* Per sample of a run: its weight. */
    int64_t *weights = r->scratch[2] = ALLOC_N(int64_t, s->n ? s->n : 1);

    VALUE mode = rb_hash_lookup2(result, strobe_sym("mode"), Qnil);
    int64_t interval = s->interval > 0 ? s->interval : 1;
    int wall = mode == strobe_sym("wall"), cpu = mode == strobe_sym("cpu"), object = mode == strobe_sym("object");
    int timed = (wall || cpu) && s->time;
    if (!(wall || cpu || object)) interval = 1;

    out_t *o = &r->out;
    OUT_LIT(o, "{\"$schema\":\"https://www.speedscope.app/file-format-schema.json\",\"exporter\":\"strobe ");
    VALUE version = rb_const_get(rb_const_get(rb_cObject, rb_intern("Strobe")), rb_intern("VERSION"));
    out_str(o, version);
    OUT_LIT(o, "\",\"name\":");
    strobe_out_json_str(o, rb_sprintf("Strobe %"PRIsVALUE" profile", mode));
    OUT_LIT(o, ",\"activeProfileIndex\":0,\"shared\":{\"frames\":[");
    for (uint32_t f = 0; f < t->frames_len; f++) {
        const rframe_t *fr = &r->frames[s->frame_pos[f]];
        if (f) OUT_LIT(o, ",");
        OUT_LIT(o, "{\"name\":");
        strobe_out_json_str(o, fr->name);
        if (RSTRING_LEN(fr->file) && strcmp(RSTRING_PTR(fr->file), "<cfunc>") != 0) {
            OUT_LIT(o, ",\"file\":");
            strobe_out_json_str(o, fr->file);
        }
        if (fr->line > 0) {
            OUT_LIT(o, ",\"line\":");
            out_i64(o, fr->line);
        }
        OUT_LIT(o, "}");
    }
    OUT_LIT(o, "]},\"profiles\":[");
    long threads = RARRAY_LEN(s->thread_ids);
    int first_profile = 1;
    for (long th = 0; th < threads; th++) {
        size_t from = starts[th], to = starts[th + 1];
        if (from == to) continue; /* speedscope wants samples in a profile */
        for (size_t i = from; i < to; i++) {
            if (!timed) weights[i] = interval;
            else if (cpu || i + 1 == to) weights[i] = interval;
            else weights[i] = s->time[order[i + 1]] - s->time[order[i]];
        }
        int64_t start = timed ? s->time[order[from]] - s->start_us : 0, end = start;
        for (size_t i = from; i < to; i++) end = strobe_checked_add(end, weights[i], "the samples' total weight");
        if (!first_profile) OUT_LIT(o, ",");
        first_profile = 0;
        OUT_LIT(o, "{\"type\":\"sampled\",\"name\":");
        strobe_out_json_str(o, strobe_samples_thread_name(s, result, th, NULL));
        if (wall || cpu) OUT_LIT(o, ",\"unit\":\"microseconds\",\"startValue\":");
        else OUT_LIT(o, ",\"unit\":\"none\",\"startValue\":");
        out_i64(o, start);
        OUT_LIT(o, ",\"endValue\":");
        out_i64(o, end);
        OUT_LIT(o, ",\"samples\":[");
        for (size_t i = from; i < to;) {
            size_t j = i + 1;
            while (j < to && s->node[order[j]] == s->node[order[i]]) j++;
            if (i > from) OUT_LIT(o, ",");
            out_stack(o, t, s->node[order[i]], path, max_depth + 1);
            i = j;
        }
        OUT_LIT(o, "],\"weights\":[");
        for (size_t i = from; i < to;) {
            size_t j = i + 1;
            int64_t w = weights[i];
            while (j < to && s->node[order[j]] == s->node[order[i]]) w += weights[j++]; /* a part of end: no overflow */
            if (i > from) OUT_LIT(o, ",");
            out_i64(o, w);
            i = j;
        }
        OUT_LIT(o, "]}");
    }
    if (first_profile) {
        /* No samples at all: one empty profile (speedscope refuses a file
         * with none). */
        OUT_LIT(o, "{\"type\":\"sampled\",\"name\":");
        strobe_out_json_str(o, strobe_samples_thread_name(s, result, 0, NULL));
        OUT_LIT(o, ",\"unit\":\"none\",\"startValue\":0,\"endValue\":0,\"samples\":[],\"weights\":[]}");
    }
    OUT_LIT(o, "]}\n");
    return out_finish(o);
}
