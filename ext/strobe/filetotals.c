/*
 * filetotals.c - the files report: per source file, the samples with one
 * of its frames anywhere on the stack (once per sample, at the file's
 * outermost frame) and with one on top, from the stack tree (tree.c).
 *
 * Every count is checked: sums that would wrap raise Strobe::ProfileError.
 * GVL held; not signal-safe.
 */
#include "report.h"

static VALUE
files_body(VALUE arg)
{
    report_args_t *a = (report_args_t *)arg;
    report_t *r = a->r;
    strobe_report_load(r, a->result, a->keep, 1);
    strobe_report_tree(r);
    /* One number per distinct file, in order of first appearance. */
    VALUE ids = rb_hash_new(), names = rb_ary_new();
    long *file_of_frame = r->scratch[0] = ALLOC_N(long, r->len ? r->len : 1);
    for (long i = 0; i < r->len; i++) {
        VALUE id = rb_hash_lookup2(ids, r->frames[i].file, Qundef);
        if (id == Qundef) {
            id = LONG2FIX(RARRAY_LEN(names));
            rb_hash_aset(ids, r->frames[i].file, id);
            rb_ary_push(names, r->frames[i].file);
        }
        file_of_frame[i] = FIX2LONG(id);
    }
    long nfiles = RARRAY_LEN(names);
    uint64_t *totals = r->scratch[1] = ALLOC_N(uint64_t, 2 * (nfiles ? nfiles : 1));
    memset(totals, 0, sizeof(uint64_t) * 2 * (size_t)(nfiles ? nfiles : 1));
    /* A sample counts once per file: at the file's outermost frame on its
     * stack. Depth first over the tree with, per file, how many of its
     * frames are on the current path: O(nodes) whatever the depth. Children
     * in CSR form: first[n]..first[n + 1] in kids. parent < child always. */
    uint32_t nn = r->nodes;
    uint32_t *work = r->scratch[2] = ALLOC_N(uint32_t, 4 * (size_t)nn + 2);
    uint32_t *first = work, *kids = work + nn + 1, *stack = kids + nn, *next = stack + nn;
    memset(first, 0, sizeof(uint32_t) * (nn + 1));
    for (uint32_t n = 1; n < nn; n++) first[r->parent[n] + 1]++;
    for (uint32_t n = 0; n < nn; n++) first[n + 1] += first[n];
    memcpy(next, first, sizeof(uint32_t) * nn);
    for (uint32_t n = 1; n < nn; n++) kids[next[r->parent[n]]++] = n;
    long *on_path = r->scratch[3] = ALLOC_N(long, nfiles ? nfiles : 1);
    memset(on_path, 0, sizeof(long) * (size_t)(nfiles ? nfiles : 1));
    /* next[] now walks each node's children; a node is on the stack while
     * its subtree is visited. */
    memcpy(next, first, sizeof(uint32_t) * nn);
    uint32_t sp = 0;
    stack[sp++] = 0;
    while (sp) {
        uint32_t n = stack[sp - 1];
        if (next[n] < first[n + 1]) {
            uint32_t c = kids[next[n]++];
            long file = file_of_frame[r->frame[c]];
            strobe_add_count(&totals[2 * file + 1], r->self[c]);
            if (on_path[file]++ == 0) strobe_add_count(&totals[2 * file], r->total[c]);
            stack[sp++] = c;
        } else {
            if (n) on_path[file_of_frame[r->frame[n]]]--;
            sp--;
        }
    }
    VALUE out = rb_ary_new_capa(nfiles);
    for (long f = 0; f < nfiles; f++)
        rb_ary_push(out, rb_ary_new_from_args(3, RARRAY_AREF(names, f), ULL2NUM(totals[2 * f]), ULL2NUM(totals[2 * f + 1])));
    RB_GC_GUARD(ids);
    return out;
}

/* Strobe::Native.report_files(result, keep) -> [[file, total, self], ...]:
 * per source file, the samples with one of its frames anywhere on the
 * stack (once per sample) and with one on top. Needs raw data. */
REPORT_METHOD(files)

void
strobe_report_files_define(VALUE mNative)
{
    rb_define_singleton_method(mNative, "report_files", native_report_files, 2);
}
