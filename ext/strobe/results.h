/*
 * results.h - the result Hash (results.c): taken or snapshotted from the
 * profile, and the aggregation and raw writers compact.c and subset.c
 * share. GVL held; not signal-safe.
 */
#ifndef STROBE_RESULTS_H
#define STROBE_RESULTS_H 1

#include "stack_table.h"

/* The result of the profile (nil when nothing was started), which is
 * cleared: built from a copy taken under the profile lock. */
VALUE strobe_results_take(void);
/* The result so far, while profiling goes on (or nil), the same way; the
 * profile is kept. */
VALUE strobe_results_snapshot(int cut);
void strobe_results_aggregate(const strobe_node_t *nodes, uint32_t nodes_len, const uint64_t *self,
                              VALUE details_by_frame, VALUE frame_ids, uint32_t frames_len, int aggregate);
void strobe_results_raw(VALUE result, const strobe_node_t *nodes, uint32_t count,
                        const uint32_t *sample_nodes, const int64_t *times, VALUE thread_ids,
                        const uint16_t *sample_threads, const uint8_t *sample_states,
                        int64_t start_us, VALUE frame_ids);
/* :running, :waiting or :blocked for a STROBE_STATE_*, nil for UNKNOWN. */
VALUE strobe_state_sym(int state);
/* The STROBE_STATE_* of such a Symbol, or -1. */
int strobe_state_of(VALUE sym);

#endif
