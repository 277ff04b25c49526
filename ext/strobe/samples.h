/*
 * samples.h - a result's raw samples read into C once (samples.c), for the
 * exporters and the flamegraph: stacks interned into a stack table, and per
 * sample its leaf node, time, thread and state.
 *
 * GVL held; nothing here is signal-safe.
 */
#ifndef STROBE_SAMPLES_H
#define STROBE_SAMPLES_H 1
#include "report.h"
#include "stack_table.h"
#include "stacks.h"

/* Sample times are microseconds below this (2**53: centuries since the
 * epoch), so differences and sums of a few of them never overflow. */
#define STROBE_MAX_TIME_US ((int64_t)1 << 53)

#define STROBE_SAMPLES_BORROWED_TIME 1
#define STROBE_SAMPLES_BORROWED_THREAD 2
#define STROBE_SAMPLES_BORROWED_STATE 4
#define STROBE_SAMPLES_BORROWED_NODE 8

/* A result's raw samples in C (samples.c), for the exporters: every stack
 * interned as a node of (parent node, frame, line), where a table frame is a
 * result frame id, and per sample its leaf node, time, thread and state. */
typedef struct strobe_samples {
    strobe_stack_table_t table;
    int table_ready;
    /* The stacks' nodes (nodes[0] the root, a parent before its children)
     * and how many frames they number: the table's, or, unfiltered, the
     * compact form's own (borrowed: its frames are its frame_ids). */
    const strobe_node_t *nodes;
    uint32_t nodes_len, frames_len;
    long *frame_pos;         /* per frame: its position in the report's frames */
    size_t n;                /* samples */
    uint32_t *node;          /* per sample: its leaf node */
    int64_t *time;           /* per sample: microseconds (CLOCK_MONOTONIC); NULL without times */
    uint16_t *thread;        /* per sample: position in thread_ids; NULL: all thread 0 */
    uint8_t *state;          /* per sample: STROBE_STATE_*; NULL where the result has none */
    /* node, time, thread and state may be the compact form's own columns,
     * borrowed (not freed here), and so may nodes; stacks (marked by the
     * report) keeps them. */
    unsigned borrowed;       /* STROBE_SAMPLES_BORROWED_* */
    VALUE stacks;
    int64_t start_us;        /* when profiling started, on the clock of time (or the first time) */
    /* From the result, checked: interval (0 when absent), and started_at /
     * duration in microseconds (0 when absent), all in [0, 2**53]. */
    int64_t interval, started_at_us, duration_us;
    VALUE thread_ids;        /* Array: the result's thread ids, in its order (at least one entry) */
    /* while reading: the previous raw entry (see strobe_samples_read) */
    VALUE *prev_ids;
    int32_t *prev_lines;
    uint32_t *path;
} strobe_samples_t;

/* Reads r's result's raw samples into a new strobe_samples_t owned by r
 * (freed with it); r must be loaded with details. ProfileError for a result
 * without raw samples (what names the export) or with malformed ones. */
strobe_samples_t *strobe_samples_read(report_t *r, const char *what);
/* The same without the stacks: the samples' times, threads and states,
 * and *node, an array of a node per sample (s->n) for the caller to fill. */
strobe_samples_t *strobe_samples_columns(report_t *r, const char *what, uint32_t **node);
void strobe_samples_free(strobe_samples_t *s);
/* result[:stacks]'s compact form, or NULL for a result without one (then
 * the raw arrays are read). */
const strobe_stacks_t *strobe_samples_stacks(VALUE result);
/* The samples' indexes grouped by thread (in the order of thread_ids),
 * time-ordered within each; *starts gets each thread's first position
 * (threads + 1 entries). Both in r's scratch[3..5] (and 7). */
uint32_t *strobe_samples_by_thread(report_t *r, const strobe_samples_t *s, size_t **starts);
/* Thread t's name for display: Thread#name, else "main" for the main
 * thread, else "thread ID"; *is_main (if given) says whether it is main. */
VALUE strobe_samples_thread_name(const strobe_samples_t *s, VALUE result, long t, int *is_main);

#endif
