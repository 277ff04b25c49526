/*
 * endpoints.h - which endpoint each sample of a result was serving: the
 * request markers (type :request, Strobe::Middleware's) of its thread that
 * span its time give it their data's endpoint (Rails' Controller#action,
 * else method and path). For the exports' per-sample labels (pprof.c).
 *
 * GVL held; nothing here is signal-safe.
 */
#ifndef STROBE_ENDPOINTS_H
#define STROBE_ENDPOINTS_H 1
#include "samples.h"

/* Per sample of s, the position in names (an Array the caller keeps alive,
 * filled here with the endpoints as Strings) of the endpoint its thread
 * was serving at its time, or -1. NULL (and names left empty) when no
 * sample was serving one, or the samples have no times. The array is
 * r->scratch[slot], freed with the report. */
int32_t *strobe_endpoints_of_samples(report_t *r, int slot, const strobe_samples_t *s, VALUE names);

#endif
