/*
 * markers.h - the marker timeline kept beside the samples: what happened
 * on a thread and when (a GC pause, a wait for the GVL, a thread's start,
 * a request, a user's block), each with a start, an end (or none: an
 * instant) and data.
 */
#ifndef STROBE_MARKERS_H
#define STROBE_MARKERS_H 1

#include <ruby/ruby.h>
#include <stdint.h>
#include <stddef.h>

/* Markers one profile keeps; later ones are counted dropped. GC pauses
 * (a lazy sweep is many: thousands a second in an allocating program) get
 * at most half, so they never crowd out requests and Strobe.mark. */
#define STROBE_MAX_MARKERS 200000
#define STROBE_MAX_GC_MARKERS (STROBE_MAX_MARKERS / 2)
/* GVL stretches likewise, at most a quarter. */
#define STROBE_MAX_GVL_MARKERS (STROBE_MAX_MARKERS / 4)

typedef enum {
    STROBE_MARKER_GC = 1,    /* a GC pause (gcspan.c) */
    STROBE_MARKER_RUBY,      /* from Ruby: type, name and data given */
    STROBE_MARKER_GVL,       /* waiting for the GVL or blocked without it (gvlspan.c) */
    STROBE_MARKER_THREAD     /* a thread's start or end, an instant (scopes.c) */
} strobe_marker_kind_t;

/* The name of a GVL marker of a thread waiting for the GVL (the Firefox
 * export puts those in its GVL wait category). */
#define STROBE_GVL_WAIT_NAME "GVL wait"

/* GC phases a pause ran (bits). */
enum { STROBE_GC_MARKING = 1, STROBE_GC_SWEEPING = 2 };

typedef struct {
    int64_t start_us;        /* CLOCK_MONOTONIC microseconds, as sample times */
    int64_t end_us;          /* the same clock; -1 for an instant */
    int thread;              /* profile thread index, -1 none */
    uint8_t kind;            /* strobe_marker_kind_t */
    uint8_t gc_phases;       /* GC: STROBE_GC_* */
    uint8_t state;           /* GVL: STROBE_STATE_WAITING or _BLOCKED; THREAD: 1 start, 0 end */
    /* GC: gc_by and major_by (static Symbols or nil, immediates). RUBY:
     * type (a Symbol), name (a String) and data (a Hash or nil). */
    VALUE type, name, data;
} strobe_marker_t;

typedef struct {
    strobe_marker_t *items;
    size_t len, capa;
    size_t gc_len;           /* of which GC pauses */
    size_t gvl_len;          /* and GVL stretches */
    uint64_t dropped;        /* not kept: STROBE_MAX_MARKERS reached, or no memory */
} strobe_markers_t;

/* Appends m (no Ruby call, no Ruby allocation: safe inside GC hooks);
 * under the lock that guards markers. Returns 0 when it was dropped. */
int strobe_markers_add(strobe_markers_t *markers, const strobe_marker_t *m);
/* Empties markers, keeping nothing; frees its memory. */
void strobe_markers_free(strobe_markers_t *markers);
/* A copy of src's items in dst (dst->items NULL and 0 len when out of
 * memory: returns -1). */
int strobe_markers_copy(strobe_markers_t *dst, const strobe_markers_t *src);
/* GC marking: the Ruby objects markers hold. */
void strobe_markers_mark(const strobe_markers_t *markers);
size_t strobe_markers_memsize(const strobe_markers_t *markers);
/* GVL held: the markers as the result's Array of Hashes, in time order
 * ({type:, name:, thread:, start:, end:, data:}), thread indexes given as
 * the ids in thread_ids (nil for none). */
VALUE strobe_markers_results(const strobe_markers_t *markers, VALUE thread_ids);
/* Native.marker_add and Native.now_us. */
void strobe_markers_define(VALUE mNative);

#endif
