/*
 * firefox_markers.h - a result's marker timeline (result[:markers]) in the
 * Firefox Profiler export (firefox.c): each thread's markers table and the
 * profile's marker schemas, one per marker type.
 *
 * GVL held; nothing here is signal-safe.
 */
#ifndef STROBE_FIREFOX_MARKERS_H
#define STROBE_FIREFOX_MARKERS_H 1
#include "samples.h"

/* The export's categories, in the order of meta.categories (firefox.c). */
enum {
    STROBE_FF_CAT_OTHER, STROBE_FF_CAT_RUBY, STROBE_FF_CAT_CFUNC, STROBE_FF_CAT_GC,
    STROBE_FF_CAT_IDLE, STROBE_FF_CAT_GVL_WAIT, STROBE_FF_CAT_NATIVE, STROBE_FF_CATEGORIES
};

typedef struct strobe_ff_markers strobe_ff_markers_t;

/* A thread's string table: the index of str in it (added if new). */
typedef int32_t (*strobe_ff_intern_t)(void *arg, VALUE str);

/* An empty set, to be filled by strobe_ff_markers_read and freed by
 * strobe_ff_markers_free (however the export ends). */
strobe_ff_markers_t *strobe_ff_markers_new(void);
void strobe_ff_markers_free(strobe_ff_markers_t *m);

/* Reads the markers of r's result for the threads of s (s->thread_ids),
 * each to the track of the thread it names, or to main_thread's for one
 * that names none of them. ProfileError for a malformed marker. Their
 * times are written in milliseconds from the samples' start (s->start_us),
 * or without sample times from the first marker's start. */
void strobe_ff_markers_read(strobe_ff_markers_t *m, report_t *r, const strobe_samples_t *s, long main_thread);

/* The latest time a marker reaches (its end, or an instant's start), in
 * microseconds from the samples' start; 0 without markers. */
int64_t strobe_ff_markers_end_us(const strobe_ff_markers_t *m);

/* The entries of meta.markerSchema (without the brackets): one per marker
 * type, with a field per data key its markers carry. */
void strobe_ff_markers_write_schema(out_t *o, const strobe_ff_markers_t *m);

/* Thread t's "markers" table (key and object), each name added to its
 * string table with intern(arg, name). Returns how many markers it holds. */
size_t strobe_ff_markers_write_thread(out_t *o, const strobe_ff_markers_t *m, long t, strobe_ff_intern_t intern,
                                      void *arg);

#endif
