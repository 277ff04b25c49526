/*
 * out.c - the output buffer's out-of-line parts (report.h has the inline
 * ones): handing a full chunk to the sink, and JSON string literals.
 *
 * GVL held (a sink's #write is Ruby code); nothing here is signal-safe.
 */
#include "report.h"

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
    str = strobe_utf8_of(str);
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
