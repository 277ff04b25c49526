/*
 * json_columns.h - a profile file's integer columns read straight from its
 * JSON text (json_columns.c), or from Ruby Arrays, through one cursor; and
 * the place of the file's "stacks" section in its text.
 *
 * GVL held; not signal-safe. Nothing here allocates Ruby objects, except
 * the ProfileError a malformed column raises.
 */
#ifndef STROBE_JSON_COLUMNS_H
#define STROBE_JSON_COLUMNS_H 1

#include "strobe.h"

/* A column of integers read in order: a Ruby Array of Fixnums, or a JSON
 * array in a String's bytes (checked whole when the cursor is made, so
 * reading it on cannot fail). */
typedef struct {
    VALUE ary;               /* the Array, or Qnil: read from text */
    const char *p, *end;     /* text: what is left of the array's contents */
    long len;                /* entries */
    long at;                 /* the next entry's index */
    long bad_at;             /* text: the first entry beyond the Fixnums, raised when read; -1 none */
    const char *what;        /* its name in error messages */
} strobe_column_t;

/* An Array column; anything but an Array raises ProfileError ("what is not
 * an array"). nil is an empty column where empty_if_nil. */
void strobe_column_of_array(strobe_column_t *c, VALUE ary, const char *what, int empty_if_nil);
/* The next entry (at < len): ProfileError for an Array entry that is not
 * a Fixnum. */
long strobe_column_next(strobe_column_t *c);

/* The stacks section of a Strobe profile file's JSON text: its columns and
 * start time, each checked to be integers of the Fixnum range (else
 * ProfileError); a column the section does not hold (or holds as null) is
 * empty, and so is a missing start time (0). */
typedef struct {
    strobe_column_t nodes, samples, deltas, threads, states;
    long start_time;
} strobe_json_stacks_t;

/* Reads the stacks object at text[from, to) (as Native.stacks_range gave). */
void strobe_json_stacks_read(strobe_json_stacks_t *s, VALUE text, long from, long to);

void strobe_json_columns_define(VALUE mNative);

#endif
