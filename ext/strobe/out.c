/*
 * out.c - the output buffer's out-of-line parts (out.h has the inline
 * ones): handing a full chunk to the sink, and JSON string literals.
 *
 * GVL held (a sink's #write is Ruby code); nothing here is signal-safe.
 */
#include "out.h"

void
strobe_out_flush(out_t *o)
{
    if (!o->str || !o->len) return;
    VALUE chunk = o->str;
    rb_str_set_len(chunk, (long)o->len);
    /* A fresh buffer for what follows: the sink may keep the String. */
    o->str = 0;
    o->buf = NULL;
    o->len = o->capa = 0;
    rb_funcall(o->sink, rb_intern("write"), 1, chunk);
    RB_GC_GUARD(chunk);
}

VALUE
strobe_utf8_of(VALUE str)
{
    rb_encoding *utf8 = rb_utf8_encoding();
    int cr = rb_enc_str_coderange(str);
    if (cr == ENC_CODERANGE_7BIT) return str;
    rb_encoding *enc = rb_enc_get(str);
    if (enc == utf8 && cr == ENC_CODERANGE_VALID) return str;
    VALUE copy;
    if (enc == rb_ascii8bit_encoding() || enc == utf8 || enc == rb_usascii_encoding()) {
        copy = rb_enc_associate(rb_str_dup(str), utf8); /* bytes taken for UTF-8 */
    } else {
        copy = rb_str_conv_enc(str, enc, utf8);
        if (rb_enc_get(copy) != utf8) copy = rb_enc_associate(rb_str_dup(str), utf8);
    }
    VALUE scrubbed = rb_str_scrub(copy, Qnil);
    return NIL_P(scrubbed) ? copy : scrubbed;
}

void
strobe_out_json_str(out_t *o, VALUE str)
{
    static const char hex[] = "0123456789abcdef";
    if (!RB_TYPE_P(str, T_STRING)) str = NIL_P(str) ? rb_str_new(0, 0) : rb_obj_as_string(str);
    /* A frozen copy (sharing the bytes): writing may flush to the sink,
     * whose #write (Ruby) may change or clear the String meanwhile. */
    str = rb_str_new_frozen(strobe_utf8_of(str));
    const unsigned char *p = (const unsigned char *)RSTRING_PTR(str);
    long len = RSTRING_LEN(str), run = 0;
    out_mem(o, "\"", 1);
    for (long i = 0; i < len; i++) {
        unsigned char c = p[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        out_mem(o, (const char *)p + run, (size_t)(i - run));
        run = i + 1;
        char esc[6] = { '\\', (char)c, 0, 0, 0, 0 };
        size_t n = 2;
        switch (c) {
          case '"': case '\\': break;
          case '\n': esc[1] = 'n'; break;
          case '\t': esc[1] = 't'; break;
          case '\r': esc[1] = 'r'; break;
          default:
            esc[1] = 'u'; esc[2] = '0'; esc[3] = '0';
            esc[4] = hex[c >> 4]; esc[5] = hex[c & 15];
            n = 6;
        }
        out_mem(o, esc, n);
    }
    out_mem(o, (const char *)p + run, (size_t)(len - run));
    out_mem(o, "\"", 1);
    RB_GC_GUARD(str);
}

/* ---- names shown on a terminal (see strobe_show_t in out.h) ---------------- */

/* str's text as UTF-8 bytes: str itself in UTF-8, US-ASCII or binary (its
 * bytes taken for UTF-8, as Strobe::Report.printable does) or when it is
 * ASCII only; else str converted to UTF-8, or str itself when it cannot be
 * (its bytes are shown then, escaped where they are not UTF-8). */
VALUE
strobe_shown_utf8(VALUE str)
{
    if (!RB_TYPE_P(str, T_STRING)) str = NIL_P(str) ? rb_str_new(0, 0) : rb_obj_as_string(str);
    rb_encoding *enc = rb_enc_get(str), *utf8 = rb_utf8_encoding();
    if (enc == utf8 || enc == rb_usascii_encoding() || enc == rb_ascii8bit_encoding()) return str;
    if (rb_enc_asciicompat(enc) && rb_enc_str_coderange(str) == ENC_CODERANGE_7BIT) return str;
    return rb_str_conv_enc(str, enc, utf8);
}

/* Scans len bytes at p as strobe_out_shown writes them: into o, or with o
 * NULL, only to tell whether any would change (returns 1 at the first). */
static int
shown_scan(out_t *o, const char *p, long len, strobe_show_t how)
{
    static const char hex[] = "0123456789ABCDEF";
    rb_encoding *utf8 = rb_utf8_encoding();
    long i = 0, run = 0;
    while (i < len) {
        unsigned char c = (unsigned char)p[i];
        long n = 1;
        char esc[8];
        size_t k = 0;
        if (c >= 0x20 && c < 0x7f) {
            if (c == ';' && how == STROBE_SHOW_FOLDED) {
                esc[k++] = ':';
            } else if ((c == '"' || c == '\\') && how == STROBE_SHOW_DOT) {
                esc[k++] = '\\';
                esc[k++] = (char)c;
            } else {
                i++;
                continue;
            }
        } else {
            int c1 = 0; /* a C1 control in UTF-8: U+0080..U+009F, 0xC2 then the code */
            if (c >= 0x80) {
                int r = rb_enc_precise_mbclen(p + i, p + len, utf8);
                if (MBCLEN_CHARFOUND_P(r)) {
                    n = MBCLEN_CHARFOUND_LEN(r);
                    c1 = n == 2 && c == 0xC2 && (unsigned char)p[i + 1] < 0xA0;
                    if (!c1) {
                        i += n;
                        continue;
                    }
                    c = (unsigned char)p[i + 1];
                }
            }
            if (how == STROBE_SHOW_DOT) esc[k++] = '\\';
            esc[k++] = '\\';
            if (c1) {
                esc[k++] = 'u';
                esc[k++] = '0';
                esc[k++] = '0';
                esc[k++] = hex[c >> 4];
                esc[k++] = hex[c & 15];
            } else if (c == 0x1b || c == '\n' || c == '\r' || c == '\t') {
                esc[k++] = c == 0x1b ? 'e' : c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
            } else { /* another C0 control, DEL, or a byte that is not UTF-8 */
                esc[k++] = 'x';
                esc[k++] = hex[c >> 4];
                esc[k++] = hex[c & 15];
            }
        }
        if (!o) return 1;
        out_mem(o, p + run, (size_t)(i - run));
        out_mem(o, esc, k);
        i += n;
        run = i;
    }
    if (o) out_mem(o, p + run, (size_t)(len - run));
    return 0;
}

void
strobe_out_shown_bytes(out_t *o, const char *p, long len, strobe_show_t how)
{
    shown_scan(o, p, len, how);
}

void
strobe_out_shown(out_t *o, VALUE str, strobe_show_t how)
{
    str = strobe_shown_utf8(str);
    shown_scan(o, RSTRING_PTR(str), RSTRING_LEN(str), how);
    RB_GC_GUARD(str);
}

int
strobe_shown_as_is(VALUE str, strobe_show_t how)
{
    if (!RB_TYPE_P(str, T_STRING)) return 0;
    VALUE utf8 = strobe_shown_utf8(str);
    int as_is = utf8 == str && !shown_scan(NULL, RSTRING_PTR(str), RSTRING_LEN(str), how);
    RB_GC_GUARD(utf8);
    return as_is;
}
