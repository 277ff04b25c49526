/*
 * endpoints.c - which endpoint each sample of a result was serving, from
 * the result's request markers (see endpoints.h). A sample of thread t at
 * time x serves the innermost request of t (the latest to start) whose span
 * holds x. Markers that are not well-formed requests are passed over: the
 * exports that check markers (firefox_markers.c) say what is wrong with
 * them.
 *
 * GVL held; nothing here is signal-safe.
 */
#include "endpoints.h"
#include <stdlib.h>

/* Endpoints a profile labels at most (pprof.c packs one with a state in
 * 32 bits): the requests to further ones go unlabelled. */
#define STROBE_MAX_ENDPOINTS (1 << 22)

typedef struct {
    uint32_t thread;
    int32_t endpoint;
    int64_t start, end;
    long at;          /* its position among the markers */
    long jump;        /* the nearest earlier request of its thread that ends
                       * later (-1: none) */
} request_t;

/* By thread, then start; of those that start together the longest (the
 * enclosing one) first, then in the markers' order: the innermost of a
 * nest comes last, where the search backwards meets it first. */
static int
by_thread_then_start(const void *a, const void *b)
{
    const request_t *x = a, *y = b;
    if (x->thread != y->thread) return x->thread < y->thread ? -1 : 1;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    if (x->end != y->end) return x->end > y->end ? -1 : 1;
    return (x->at > y->at) - (x->at < y->at);
}

static VALUE
key_of(VALUE h, const char *name)
{
    return rb_hash_lookup2(h, strobe_sym(name), Qnil);
}

/* The requests among markers, each with its thread's position and its
 * endpoint's in names; *len gets how many. In r->scratch[slot] meanwhile. */
static request_t *
read_requests(report_t *r, int slot, const strobe_samples_t *s, VALUE markers, VALUE names, size_t *len)
{
    /* A copy, read to its length as allocated for: nothing done below (a
     * hash of an odd key is Ruby code) can change what is walked. */
    markers = rb_ary_dup(markers);
    long n = RARRAY_LEN(markers);
    request_t *req = r->scratch[slot] = ALLOC_N(request_t, n ? (size_t)n : 1);
    VALUE track = rb_hash_new(), index = rb_hash_new(); /* thread id -> position; endpoint -> position */
    for (long t = 0; t < RARRAY_LEN(s->thread_ids); t++) {
        VALUE id = RARRAY_AREF(s->thread_ids, t);
        if (FIXNUM_P(id)) rb_hash_aset(track, id, LONG2FIX(t));
    }
    VALUE sym_request = strobe_sym("request");
    size_t k = 0;
    for (long i = 0; i < n; i++) {
        VALUE m = RARRAY_AREF(markers, i);
        if (!RB_TYPE_P(m, T_HASH) || key_of(m, "type") != sym_request) continue;
        VALUE start = key_of(m, "start"), end = key_of(m, "end"), data = key_of(m, "data"), thread = key_of(m, "thread");
        VALUE at = FIXNUM_P(thread) ? rb_hash_lookup2(track, thread, Qnil) : Qnil;
        VALUE endpoint = RB_TYPE_P(data, T_HASH) ? key_of(data, "endpoint") : Qnil;
        if (!RB_TYPE_P(endpoint, T_STRING)) endpoint = key_of(m, "name");
        if (!FIXNUM_P(start) || !FIXNUM_P(end) || FIX2LONG(end) < FIX2LONG(start) || NIL_P(at) ||
            !RB_TYPE_P(endpoint, T_STRING))
            continue;
        endpoint = rb_str_new_frozen(endpoint); /* (a key: its hash is String#hash's) */
        VALUE e = rb_hash_lookup2(index, endpoint, Qnil);
        if (NIL_P(e)) {
            if (RARRAY_LEN(names) >= STROBE_MAX_ENDPOINTS) continue;
            e = LONG2FIX(RARRAY_LEN(names));
            rb_hash_aset(index, endpoint, e);
            rb_ary_push(names, endpoint);
        }
        req[k++] = (request_t){ (uint32_t)FIX2LONG(at), (int32_t)FIX2LONG(e), FIX2LONG(start), FIX2LONG(end), i, -1 };
    }
    RB_GC_GUARD(markers);
    RB_GC_GUARD(track);
    RB_GC_GUARD(index);
    *len = k;
    return req;
}

int32_t *
strobe_endpoints_of_samples(report_t *r, int slot, const strobe_samples_t *s, VALUE names)
{
    VALUE markers = rb_hash_lookup2(r->result, strobe_sym("markers"), Qnil);
    if (!s->time || !s->n || !RB_TYPE_P(markers, T_ARRAY)) return NULL;
    size_t len;
    request_t *req = read_requests(r, slot, s, markers, names, &len);
    if (!len) return NULL;
    qsort(req, len, sizeof(request_t), by_thread_then_start);
    /* Per request, the nearest earlier one of its thread that ends later
     * (a stack of ends, decreasing): when a request ends before a time, so
     * do all between it and that one, so the search backwards jumps there.
     * A request within another is one jump from it, however many came
     * between. */
    long *stack = ALLOC_N(long, len);
    long depth = 0;
    for (size_t i = 0; i < len; i++) {
        if (i && req[i - 1].thread != req[i].thread) depth = 0;
        while (depth && req[stack[depth - 1]].end <= req[i].end) depth--;
        req[i].jump = depth ? stack[depth - 1] : -1;
        stack[depth++] = (long)i;
    }
    xfree(stack);
    /* Per thread position, its requests [from[t], from[t + 1]). */
    long threads = RARRAY_LEN(s->thread_ids);
    size_t *from = ZALLOC_N(size_t, (size_t)threads + 1);
    for (size_t i = 0; i < len; i++) from[req[i].thread + 1]++;
    for (long t = 0; t < threads; t++) from[t + 1] += from[t];

    int32_t *of = ALLOC_N(int32_t, s->n);
    int any = 0;
    for (size_t k = 0; k < s->n; k++) {
        uint32_t t = s->thread ? s->thread[k] : 0;
        int64_t x = s->time[k];
        of[k] = -1;
        if ((long)t >= threads) continue;
        size_t lo = from[t], hi = from[t + 1];
        while (lo < hi) { /* the first that starts after x */
            size_t mid = lo + (hi - lo) / 2;
            if (req[mid].start <= x) lo = mid + 1;
            else hi = mid;
        }
        /* The latest to start by x that still runs at x (all start by x). */
        long j = (long)lo - 1;
        while (j >= (long)from[t] && req[j].end < x) j = req[j].jump;
        if (j >= (long)from[t]) {
            of[k] = req[j].endpoint;
            any = 1;
        }
    }
    xfree(from);
    xfree(req);
    r->scratch[slot] = NULL;
    if (!any) {
        xfree(of);
        rb_ary_clear(names);
        return NULL;
    }
    return r->scratch[slot] = of;
}
