/*
 * markers.c - the marker timeline: a growable array of markers kept in the
 * profile (strobe_profile.markers, under the profile lock), turned into the
 * result's :markers Array; Native.marker_add, by which Ruby code (the
 * middleware's requests, Strobe.mark) adds its own. The C kinds (GC
 * pauses, GVL stretches, threads' starts and ends) hold no Ruby object
 * and are given their type, name and data as the result is made.
 *
 * strobe_markers_add allocates no Ruby object and calls no Ruby method: the
 * GC hooks use it from inside GC. Nothing here runs in a signal handler.
 */
#include "markers.h"
#include "clock.h"
#include "sampler.h"
#include "sampling.h"
#include <stdlib.h>
#include <string.h>

int
strobe_markers_add(strobe_markers_t *markers, const strobe_marker_t *m)
{
    int gc = m->kind == STROBE_MARKER_GC, gvl = m->kind == STROBE_MARKER_GVL;
    if ((gc && markers->gc_len >= STROBE_MAX_GC_MARKERS) || (gvl && markers->gvl_len >= STROBE_MAX_GVL_MARKERS)) {
        markers->dropped++;
        return 0;
    }
    if (markers->len == markers->capa) {
        size_t capa = markers->capa ? markers->capa * 2 : 256;
        if (capa > STROBE_MAX_MARKERS) capa = STROBE_MAX_MARKERS;
        strobe_marker_t *items = markers->len < capa ? realloc(markers->items, capa * sizeof(*items)) : NULL;
        if (!items) {
            markers->dropped++;
            return 0;
        }
        markers->items = items;
        markers->capa = capa;
    }
    markers->items[markers->len++] = *m;
    markers->gc_len += gc;
    markers->gvl_len += gvl;
    return 1;
}

void
strobe_markers_free(strobe_markers_t *markers)
{
    free(markers->items);
    memset(markers, 0, sizeof(*markers));
}

int
strobe_markers_copy(strobe_markers_t *dst, const strobe_markers_t *src)
{
    *dst = *src;
    dst->items = NULL;
    dst->capa = dst->len;
    if (!src->len) return 0;
    dst->items = malloc(src->len * sizeof(*dst->items));
    if (!dst->items) {
        dst->len = dst->capa = 0;
        return -1;
    }
    memcpy(dst->items, src->items, src->len * sizeof(*dst->items));
    return 0;
}

void
strobe_markers_mark(const strobe_markers_t *markers)
{
    for (size_t i = 0; i < markers->len; i++) {
        const strobe_marker_t *m = &markers->items[i];
        rb_gc_mark(m->type);
        rb_gc_mark(m->name);
        rb_gc_mark(m->data);
    }
}

size_t
strobe_markers_memsize(const strobe_markers_t *markers)
{
    return markers->capa * sizeof(strobe_marker_t);
}

static const char *
gc_phase_name(int bit)
{
    return bit == STROBE_GC_MARKING ? "marking" : "sweeping";
}

static VALUE
name_of(VALUE sym)
{
    return SYMBOL_P(sym) ? rb_sym2str(sym) : Qnil;
}

/* The data of a GC pause: its phases, and why the GC ran (GC.latest_gc_info's
 * gc_by and major_by), as Strings, as a profile file gives them back. */
static VALUE
gc_data(const strobe_marker_t *m)
{
    VALUE data = rb_hash_new(), phases = rb_ary_new();
    for (int bit = STROBE_GC_MARKING; bit <= STROBE_GC_SWEEPING; bit <<= 1)
        if (m->gc_phases & bit) rb_ary_push(phases, rb_str_new_cstr(gc_phase_name(bit)));
    rb_hash_aset(data, strobe_sym("phases"), phases);
    rb_hash_aset(data, strobe_sym("gc_by"), name_of(m->type));
    rb_hash_aset(data, strobe_sym("major_by"), name_of(m->name));
    return data;
}

/* A marker's type, name and data as the result has them: the C kinds'
 * made here, a Ruby marker's as given. */
static VALUE
type_of(const strobe_marker_t *m)
{
    switch (m->kind) {
    case STROBE_MARKER_GC: return strobe_sym("gc");
    case STROBE_MARKER_GVL: return strobe_sym("gvl");
    case STROBE_MARKER_THREAD: return strobe_sym("thread");
    default: return m->type;
    }
}

static VALUE
name_of_marker(const strobe_marker_t *m)
{
    switch (m->kind) {
    case STROBE_MARKER_GC: return rb_str_new_cstr("GC");
    case STROBE_MARKER_GVL: return rb_str_new_cstr(m->state == STROBE_STATE_WAITING ? STROBE_GVL_WAIT_NAME : "Blocked");
    case STROBE_MARKER_THREAD: return rb_str_new_cstr(m->state ? "Thread start" : "Thread end");
    default: return m->name;
    }
}

/* A GVL stretch's data: its state, as samples name states. */
static VALUE
gvl_data(const strobe_marker_t *m)
{
    VALUE data = rb_hash_new();
    rb_hash_aset(data, strobe_sym("state"), rb_str_new_cstr(m->state == STROBE_STATE_WAITING ? "waiting" : "blocked"));
    return data;
}

static VALUE
data_of(const strobe_marker_t *m)
{
    switch (m->kind) {
    case STROBE_MARKER_GC: return gc_data(m);
    case STROBE_MARKER_GVL: return gvl_data(m);
    case STROBE_MARKER_THREAD: return Qnil;
    default: return m->data;
    }
}

static int
by_start(const void *a, const void *b)
{
    const strobe_marker_t *x = *(const strobe_marker_t *const *)a, *y = *(const strobe_marker_t *const *)b;
    if (x->start_us != y->start_us) return x->start_us < y->start_us ? -1 : 1;
    return x < y ? -1 : x > y; /* stable: in the order they were added */
}

VALUE
strobe_markers_results(const strobe_markers_t *markers, VALUE thread_ids)
{
    /* Markers go in as they end: a request that enclosed a GC comes after it. */
    const strobe_marker_t **order = malloc((markers->len ? markers->len : 1) * sizeof(*order));
    if (!order) rb_memerror();
    for (size_t i = 0; i < markers->len; i++) order[i] = &markers->items[i];
    qsort(order, markers->len, sizeof(*order), by_start);
    VALUE list = rb_ary_new_capa((long)markers->len);
    VALUE sym_type = strobe_sym("type"), sym_name = strobe_sym("name"), sym_thread = strobe_sym("thread"),
          sym_start = strobe_sym("start"), sym_end = strobe_sym("end"), sym_data = strobe_sym("data");
    for (size_t i = 0; i < markers->len; i++) {
        const strobe_marker_t *m = order[i];
        VALUE h = rb_hash_new();
        rb_hash_aset(h, sym_type, type_of(m));
        rb_hash_aset(h, sym_name, name_of_marker(m));
        VALUE thread = Qnil;
        if (m->thread >= 0 && m->thread < RARRAY_LEN(thread_ids)) thread = RARRAY_AREF(thread_ids, m->thread);
        rb_hash_aset(h, sym_thread, thread);
        rb_hash_aset(h, sym_start, LL2NUM(m->start_us));
        rb_hash_aset(h, sym_end, m->end_us < 0 ? Qnil : LL2NUM(m->end_us));
        rb_hash_aset(h, sym_data, data_of(m));
        rb_ary_push(list, h);
    }
    free(order);
    return list;
}

/* ---- Ruby ---------------------------------------------------------------- */

/* Strobe::Native.now_us: the clock of sample and marker times
 * (CLOCK_MONOTONIC microseconds). */
static VALUE
native_now_us(VALUE self)
{
    (void)self;
    return LL2NUM(strobe_now_us());
}

/* Strobe::Native.sampling_current_thread?: whether the calling thread is
 * sampled now, so that a marker it adds is kept. */
static VALUE
native_sampling_current_thread(VALUE self)
{
    (void)self;
    return strobe_sampler_current_sampled() ? Qtrue : Qfalse;
}

/* Strobe::Native.marker_add(type, name, start_us, end_us, data): a marker
 * on the calling thread, if it is being sampled now; end_us nil for an
 * instant. type a Symbol, name a String, data a Hash or nil. Returns
 * whether it was kept. */
static VALUE
native_marker_add(VALUE self, VALUE type, VALUE name, VALUE start_us, VALUE end_us, VALUE data)
{
    (void)self;
    Check_Type(type, T_SYMBOL);
    StringValue(name);
    if (!NIL_P(data)) Check_Type(data, T_HASH);
    strobe_marker_t m = {
        .start_us = NUM2LL(start_us),
        .end_us = NIL_P(end_us) ? -1 : NUM2LL(end_us),
        .kind = STROBE_MARKER_RUBY,
        .type = type,
        .name = rb_str_new_frozen(name),
        .data = NIL_P(data) ? Qnil : rb_obj_freeze(rb_hash_dup(data)),
    };
    if (m.start_us < 0) rb_raise(rb_eArgError, "a marker's start is a time from Strobe::Native.now_us");
    if (m.end_us >= 0 && m.end_us < m.start_us) rb_raise(rb_eArgError, "a marker cannot end before it starts");
    int kept = strobe_sampler_add_marker(&m);
    RB_GC_GUARD(m.name);
    RB_GC_GUARD(m.data);
    return kept ? Qtrue : Qfalse;
}

void
strobe_markers_define(VALUE mNative)
{
    rb_define_singleton_method(mNative, "now_us", native_now_us, 0);
    rb_define_singleton_method(mNative, "marker_add", native_marker_add, 5);
    rb_define_singleton_method(mNative, "sampling_current_thread?", native_sampling_current_thread, 0);
}
