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

typedef struct {
    uint32_t thread;
    int32_t endpoint;
    int64_t start, end;
} request_t;

static int
by_thread_then_start(const void *a, const void *b)
{
    const request_t *x = a, *y = b;
    if (x->thread != y->thread) return x->thread < y->thread ? -1 : 1;
    return (x->start > y->start) - (x->start < y->start);
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
    long n = RARRAY_LEN(markers);
    request_t *req = r->scratch[slot] = ALLOC_N(request_t, n ? (size_t)n : 1);
    VALUE track = rb_hash_new(), index = rb_hash_new(); /* thread id -> position; endpoint -> position */
    for (long t = 0; t < RARRAY_LEN(s->thread_ids); t++) rb_hash_aset(track, RARRAY_AREF(s->thread_ids, t), LONG2FIX(t));
    VALUE sym_request = strobe_sym("request");
    size_t k = 0;
    for (long i = 0; i < RARRAY_LEN(markers); i++) {
        VALUE m = RARRAY_AREF(markers, i);
        if (!RB_TYPE_P(m, T_HASH) || key_of(m, "type") != sym_request) continue;
        VALUE start = key_of(m, "start"), end = key_of(m, "end"), data = key_of(m, "data");
        VALUE at = rb_hash_lookup2(track, key_of(m, "thread"), Qnil);
        VALUE endpoint = RB_TYPE_P(data, T_HASH) ? key_of(data, "endpoint") : Qnil;
        if (!RB_TYPE_P(endpoint, T_STRING)) endpoint = key_of(m, "name");
        if (!FIXNUM_P(start) || !FIXNUM_P(end) || FIX2LONG(end) < FIX2LONG(start) || NIL_P(at) ||
            !RB_TYPE_P(endpoint, T_STRING))
            continue;
        VALUE e = rb_hash_lookup2(index, endpoint, Qnil);
        if (NIL_P(e)) {
            e = LONG2FIX(RARRAY_LEN(names));
            endpoint = rb_str_new_frozen(endpoint);
            rb_hash_aset(index, endpoint, e);
            rb_ary_push(names, endpoint);
        }
        req[k++] = (request_t){ (uint32_t)FIX2LONG(at), (int32_t)FIX2LONG(e), FIX2LONG(start), FIX2LONG(end) };
    }
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
    /* Per request, the latest end among its thread's requests so far: a
     * search backwards stops where no earlier one reaches the time. */
    int64_t *reach = ALLOC_N(int64_t, len);
    for (size_t i = 0; i < len; i++)
        reach[i] = i && req[i - 1].thread == req[i].thread && reach[i - 1] > req[i].end ? reach[i - 1] : req[i].end;
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
        for (size_t i = lo; i > from[t] && reach[i - 1] >= x; i--) {
            if (req[i - 1].end >= x) {
                of[k] = req[i - 1].endpoint;
                any = 1;
                break;
            }
        }
    }
    xfree(reach);
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
