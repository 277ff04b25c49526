/*
 * symbols.h - names of native code (symbols.c). Not signal-safe.
 */
#ifndef STROBE_SYMBOLS_H
#define STROBE_SYMBOLS_H 1

#include "strobe.h"

typedef struct {
    uintptr_t start;         /* the function's first address, 0 when unnamed */
    const char *name;        /* its symbol, NULL when unnamed */
    const char *path;        /* the object it is in */
    const char *object_name; /* the object's file name without directories */
    uintptr_t base;          /* the object's load bias */
    int object;              /* the object's index */
} strobe_symbol_t;

/* The object and function at addr; 0 (out zeroed) when in no object.
 * Strings stay valid for the life of the process. Not signal-safe. */
int strobe_symbols_find(uintptr_t addr, strobe_symbol_t *out);

#endif
